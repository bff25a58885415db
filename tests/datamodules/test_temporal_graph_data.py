"""Temporal-graph datamodule: the JODIE/DyGLib/N-ForGOT real-format loader on fixtures, its one-line errors, the
protocol's splits, and the embedded SocioPatterns / PubMed defaults."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules.temporal_graph import TemporalGraphDataModule, read_jodie
from layers.temporal_graph.continual import TemporalGraph

# 7 nodes (ids 1..6, DyGLib's 0 is padding); classes 0..3; node 6 is unlabelled (label -1)
ROWS = [
    (1, 2, 0.0, 0),
    (3, 4, 1.0, 2),
    (2, 1, 2.0, 1),
    (4, 5, 3.0, 3),
    (1, 5, 3.0, 0),
    (5, 6, 4.0, 3),
    (3, 6, 5.0, 2),
    (2, 4, 6.0, 1),
    (6, 1, 7.0, -1),
]


def write_dyglib(root: Path, rows=ROWS, feat_rows: int = 7, name: str = "toy") -> Path:
    lines = [",u,i,ts,label,idx"] + [f"{k},{u},{i},{t},{c},{k + 1}" for k, (u, i, t, c) in enumerate(rows)]
    (root / f"ml_{name}.csv").write_text("\n".join(lines) + "\n")
    np.save(root / f"ml_{name}_node.npy", np.arange(feat_rows * 3, dtype=np.float32).reshape(feat_rows, 3))
    return root


def test_reads_dyglib_layout(tmp_path):
    g = read_jodie(write_dyglib(tmp_path), "toy", "file", 3, 0)
    assert g.num_nodes == 7 and g.src.tolist() == [r[0] for r in ROWS] and g.t.tolist() == [r[2] for r in ROWS]
    # `label` is the class of u; i-only nodes and label -1 stay unlabelled
    assert g.y.tolist() == [-1, 0, 1, 2, 3, 3, -1]
    assert torch.equal(g.x[2], torch.tensor([6.0, 7.0, 8.0]))


def test_reads_nforgot_layout_with_both_labels(tmp_path):
    text = "u,i,ts,label_u,label_i,idx\n1,2,0,0,1,1\n2,3,1,1,2,2\n3,1,2,2,0,3\n"
    (tmp_path / "yelp.csv").write_text(text)
    np.save(tmp_path / "yelp_node.npy", np.ones((4, 2)))
    g = read_jodie(tmp_path, "yelp", "file", 2, 0)
    assert g.y.tolist() == [-1, 0, 1, 2]


def test_real_datamodule_builds_tasks_and_disjoint_node_splits(tmp_path):
    write_dyglib(tmp_path)
    dm = TemporalGraphDataModule(
        source="real",
        data_dir=str(tmp_path),
        name="toy",
        node_features="file",
        classes_per_task=2,
        batch_size=2,
        train_frac=0.5,
    )
    dm.setup()
    s = dm.stream
    assert s.num_tasks == 2 and s.task_classes == [[0, 1], [2, 3]]
    for k in range(2):
        nodes = {sp: set(s.examples[k][sp].node.tolist()) for sp in ("train", "val", "test")}
        assert not (nodes["train"] & nodes["val"]) and not (nodes["train"] & nodes["test"])
        ex = s.examples[k]["train"]
        assert (ex.y // 2 == k).all() and (ex.t[1:] >= ex.t[:-1]).all()
        for sp in ("train", "val", "test"):  # the unlabelled node 6 is a neighbour, never a query
            assert 6 not in s.examples[k][sp].node.tolist() and (s.examples[k][sp].y >= 0).all()
    assert 6 in s.samplers[1].nbr.tolist()
    # task 0's graph holds the events touching classes 0/1 and not 2/3 (event task = max endpoint task)
    assert s.samplers[0].eid.unique().numel() == 3  # (1,2), (2,1), (1,5): its own event list
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"node", "t", "task", "y"} and batch["t"].dtype == torch.float64


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda rows: rows[:3] + [(4, 5, 1.5, 3)] + rows[4:], r"ml_toy.csv: events out of time order at line 5"),
        (lambda rows: rows + [(1, 3, 9.0, 1)], r"line 11: node 1 has class 1 but class 0 earlier"),
        (
            lambda rows: rows[:2] + [(2, 1, "x", 1)] + rows[3:],
            r"ml_toy.csv: line 4: column ts is empty or not a number",
        ),
        (lambda rows: [(u, i, t, -1) for u, i, t, _ in rows], r"ml_toy.csv: no node has a class label"),
    ],
)
def test_bad_csv_errors_name_file_and_line(tmp_path, mutate, message):
    write_dyglib(tmp_path, mutate(list(ROWS)))
    with pytest.raises(DataFormatError, match=message):
        read_jodie(tmp_path, "toy", "file", 3, 0)


def test_feature_rows_must_cover_every_node_id(tmp_path):
    write_dyglib(tmp_path, feat_rows=6)
    with pytest.raises(DataFormatError, match=r"ml_toy_node.npy: 6 rows but .*line 7 uses node id 6"):
        read_jodie(tmp_path, "toy", "file", 3, 0)
    write_dyglib(tmp_path, feat_rows=9)  # more rows than ids: documented handling, nodes without events
    g = read_jodie(tmp_path, "toy", "file", 3, 0)
    assert g.num_nodes == 9 and g.y[7:].tolist() == [-1, -1]
    np.save(tmp_path / "ml_toy_node.npy", np.ones(9))
    with pytest.raises(DataFormatError, match=r"ml_toy_node.npy: node features must be 2-D"):
        read_jodie(tmp_path, "toy", "file", 3, 0)


def test_missing_file_and_empty_task(tmp_path):
    with pytest.raises(MissingDataError, match="missing data file: .*nope.csv"):
        read_jodie(tmp_path, "nope", "file", 3, 0)
    rows = [(u, i, t, c if c < 2 else c + 2) for u, i, t, c in ROWS]  # classes 0,1,4,5: task 1 is empty
    write_dyglib(tmp_path, rows)
    dm = TemporalGraphDataModule(source="real", data_dir=str(tmp_path), name="toy", node_features="file")
    with pytest.raises(DataFormatError, match=r"task 1 \(classes 2..3\) has no labelled node"):
        dm.setup()


def test_embedded_primary_school_and_pubmed():
    dm = TemporalGraphDataModule(dataset="primary_school", classes_per_task=2, max_train_examples_per_task=50)
    dm.setup()
    g = dm.stream.graph
    assert (g.num_nodes, g.src.numel(), int(g.y.max()) + 1) == (242, 125773, 10)
    assert int((g.y < 0).sum()) == 10  # the teachers are unlabelled
    assert dm.stream.num_tasks == 5 and g.x.shape == (242, 16) and torch.isfinite(g.x).all()
    assert len(dm.stream.examples[0]["train"]) == 50
    pm = TemporalGraphDataModule(dataset="pubmed", classes_per_task=1, max_train_examples_per_task=50)
    pm.setup()
    g = pm.stream.graph
    assert (g.num_nodes, g.src.numel()) == (19717, 44335)
    assert torch.bincount(g.y).tolist() == [4103, 7875, 7739]
    assert (g.t[1:] >= g.t[:-1]).all() and float(g.t.max()) == 2010 - 1967


def test_svd_features_never_see_a_later_task():
    """``feature_fit=first_task``: a node's features depend only on the events of tasks up to its own task, so
    deleting the last task's events leaves every earlier node's features unchanged (the whole-stream fit moves)."""
    from datamodules.temporal_graph import read_primary_school, structural_features

    g = read_primary_school()
    y = g.y
    node_task = torch.where(y >= 0, y // 2, torch.full_like(y, -1))
    event_task = torch.maximum(node_task[g.src], node_task[g.dst])
    keep = event_task < 4  # drop the last task's events (grade 5)
    cut = TemporalGraph(g.src[keep], g.dst[keep], g.t[keep], g.x, g.y)
    earlier = (node_task < 4).nonzero().view(-1)
    full, part = structural_features(g, "svd", 8, 0, 2), structural_features(cut, "svd", 8, 0, 2)
    torch.testing.assert_close(full[earlier], part[earlier], rtol=0, atol=1e-5)
    # the first task's nodes sit where the first task's own spectral map puts them; later nodes are placed too
    assert full[node_task == 4].abs().sum() > 0 and torch.isfinite(full).all()
    whole, whole_cut = structural_features(g, "svd", 8, 0), structural_features(cut, "svd", 8, 0)
    assert (whole[earlier] - whole_cut[earlier]).abs().max() > 1e-2  # the transductive fit sees the future
    dm = TemporalGraphDataModule(max_train_examples_per_task=50, max_eval_examples_per_task=20)
    dm.setup()
    torch.testing.assert_close(dm.stream.graph.x, structural_features(g, "svd", 16, 42, 2))
    with pytest.raises(ConfigError, match="data.feature_fit='all'"):
        TemporalGraphDataModule(feature_fit="all")


def _split_nodes(root: Path, **kw) -> dict[str, set]:
    dm = TemporalGraphDataModule(
        source="real", data_dir=str(root), name="toy", node_features="file", classes_per_task=2, batch_size=8, **kw
    )
    dm.setup()
    return {sp: set(dm.stream.examples[0][sp].node.tolist()) for sp in ("train", "val", "test")}


def test_the_node_split_follows_the_run_seed_unless_split_seed_is_set(tmp_path):
    # 40 labelled nodes, classes 0..3 (node % 4), 400 events: each seed draws its own split of task 0's 20 nodes
    rng = np.random.default_rng(0)
    u, i = rng.integers(1, 41, 400), rng.integers(1, 41, 400)
    rows = [(int(a), int(b), float(t), (int(a) - 1) % 4) for t, (a, b) in enumerate(zip(u, i)) if a != b]
    write_dyglib(tmp_path, rows, feat_rows=41)
    by_seed = [_split_nodes(tmp_path, seed=s) for s in (0, 1, 0)]
    assert by_seed[0] == by_seed[2]  # a seed's split is reproducible
    assert by_seed[0]["test"] != by_seed[1]["test"] and by_seed[0]["train"] != by_seed[1]["train"]
    pinned = [_split_nodes(tmp_path, seed=s, split_seed=42) for s in (0, 1)]
    assert pinned[0] == pinned[1] == _split_nodes(tmp_path, seed=42)  # split_seed fixes it for every seed
