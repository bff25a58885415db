"""ArenaDataModule: the bundled Chatbot Arena counts, the LMSYS battle-log reader, tie modes, the pair split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules.arena import ArenaDataModule, embedded_path, read_votes, split_pairs

# Battles in the LMSYS log format; the expected aggregate is written out by hand below.
BATTLES = [
    {"model_a": "gpt-4", "model_b": "claude", "winner": "model_a", "anony": True},
    {"model_a": "claude", "model_b": "gpt-4", "winner": "model_a", "anony": True},
    {"model_a": "claude", "model_b": "gpt-4", "winner": "tie", "anony": True},
    {"model_a": "gpt-4", "model_b": "claude", "winner": "tie (bothbad)", "anony": True},
    {"model_a": "gpt-4", "model_b": "llama", "winner": "model_b", "anony": True},
    {"model_a": "llama", "model_b": "claude", "winner": "model_b", "anony": False},  # not anonymous: skipped
    {"model_a": "llama", "model_b": "claude", "winner": "model_a", "dedup_tag": {"sampled": False}},  # dedup: skipped
    {"model_a": "llama", "model_b": "claude", "winner": "model_b", "dedup_tag": {"sampled": True}},
]
# models sorted: claude=0, gpt-4=1, llama=2; pairs (i<j) with [wins_i, wins_j, tie, tie_bothbad]
EXPECTED4 = {(0, 1): [1, 1, 1, 1], (1, 2): [0, 1, 0, 0], (0, 2): [1, 0, 0, 0]}


def _expected(tie: str) -> tuple[np.ndarray, np.ndarray]:
    keys = sorted(EXPECTED4)
    y = np.array([EXPECTED4[k] for k in keys])
    y3 = y[:, :3].copy()
    if tie == "both":
        y3[:, 2] += y[:, 3]
    if tie == "none":
        y3[:, 2] = 0
    return np.array(keys), y3


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
@pytest.mark.parametrize("tie", ["tie", "both", "none"])
def test_battle_log_is_aggregated_into_pairs(tmp_path: Path, fmt: str, tie: str):
    path = tmp_path / f"battles.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps(BATTLES))
    else:
        path.write_text("\n".join(json.dumps(b) for b in BATTLES) + "\n")
    votes = read_votes(path, tie=tie)
    assert votes["models"] == ["claude", "gpt-4", "llama"]
    pairs, counts = _expected(tie)
    assert np.array_equal(votes["pairs"], pairs)
    assert np.array_equal(votes["counts"], counts)


def test_battle_log_filters_can_be_switched_off(tmp_path: Path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(BATTLES))
    votes = read_votes(path, anony_only=False, dedup=False)
    i = [tuple(p) for p in votes["pairs"].tolist()].index((0, 2))
    # claude-llama: kept winner=model_b (claude wins) twice more plus llama's win.
    assert votes["counts"][i].tolist() == [2, 1, 0]


def test_real_source_datamodule_reads_data_dir(tmp_path: Path):
    (tmp_path / "arena.jsonl").write_text("\n".join(json.dumps(b) for b in BATTLES))
    dm = ArenaDataModule(source="real", data_dir=str(tmp_path), filename="arena.jsonl", test_ratio=0.0)
    dm.setup("fit")
    assert dm.model_names == ["claude", "gpt-4", "llama"]
    assert dm.total_votes == 5  # claude-gpt-4: 1 + 1 + 1 (the both-bad tie is dropped), + 1 + 1
    batches = list(dm.train_dataloader())
    assert len(batches) == 1 and batches[0]["pairs"].shape == (3, 2) and batches[0]["counts"].dtype == torch.float64


def test_unknown_winner_names_file_and_row(tmp_path: Path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([*BATTLES[:2], {"model_a": "a", "model_b": "b", "winner": "draw"}]))
    with pytest.raises(DataFormatError, match=r"bad\.json: row 2 has unknown winner 'draw'"):
        read_votes(path)


def test_jsonl_errors_name_the_line(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(BATTLES[0]) + "\n" + "{not json\n")
    with pytest.raises(DataFormatError, match=r"bad\.jsonl: line 2 is not valid JSON"):
        read_votes(path)
    path.write_text(json.dumps(BATTLES[0]) + "\n\n" + json.dumps({"model_a": "x", "winner": "tie"}) + "\n")
    with pytest.raises(DataFormatError, match=r"bad\.jsonl: line 3 lacks \['model_b'\]"):
        read_votes(path)


def test_not_json_names_the_file(tmp_path: Path):
    path = tmp_path / "notes.json"
    path.write_text("model_a,model_b,winner\ngpt-4,claude,model_a\n")
    with pytest.raises(DataFormatError, match=r"notes\.json: not valid JSON \(line 1"):
        read_votes(path)


def test_self_battle_is_rejected(tmp_path: Path):
    path = tmp_path / "self.json"
    path.write_text(json.dumps([{"model_a": "a", "model_b": "a", "winner": "tie"}]))
    with pytest.raises(DataFormatError, match=r"self\.json: row 0 must name two different models"):
        read_votes(path)


def test_model_without_games_is_rejected(tmp_path: Path):
    path = tmp_path / "agg.json"
    path.write_text(json.dumps({"models": ["a", "b", "ghost"], "X": [[0, 1]], "Y": [[3, 1, 2, 0]]}))
    with pytest.raises(DataFormatError, match=r"agg\.json: model 'ghost' \(row 2 of 'models'\) has no games"):
        read_votes(path)
    # a model whose only games are ties has no games once ties are dropped
    path.write_text(json.dumps({"models": ["a", "b", "c"], "X": [[0, 1], [1, 2]], "Y": [[3, 1, 0, 0], [0, 0, 4, 0]]}))
    assert read_votes(path, tie="tie")["counts"].sum() == 8
    with pytest.raises(DataFormatError, match="model 'c'"):
        read_votes(path, tie="none")


def test_aggregated_rows_are_validated(tmp_path: Path):
    path = tmp_path / "agg.json"
    path.write_text(json.dumps({"models": ["a", "b"], "X": [[0, 1], [0, 5]], "Y": [[1, 1, 1], [1, 0, 0]]}))
    with pytest.raises(DataFormatError, match=r"agg\.json: row 1 of 'X'"):
        read_votes(path)
    path.write_text(json.dumps({"models": ["a", "b"], "X": [[0, 1]], "Y": [[1, -1, 0]]}))
    with pytest.raises(DataFormatError, match=r"agg\.json: row 0 of 'Y'"):
        read_votes(path)


def test_missing_file(tmp_path: Path):
    with pytest.raises(MissingDataError, match="missing data file"):
        read_votes(tmp_path / "nope.json")


def test_bad_config_fails_at_construction():
    with pytest.raises(ConfigError, match="data.tie='ties'"):
        ArenaDataModule(tie="ties")
    with pytest.raises(ConfigError, match=r"data.test_ratio=1.0 must be in \[0, 1\)"):
        ArenaDataModule(test_ratio=1.0)


def test_embedded_counts_match_the_paper_data():
    raw = json.loads(embedded_path().read_text())
    assert len(raw["models"]) == 129 and len(raw["X"]) == 3460
    votes = read_votes(embedded_path(), tie="tie")
    assert votes["pairs"].shape == (3455, 2)  # 5 pairs hold only both-bad ties
    assert votes["counts"].sum(0).tolist() == [595570, 498305, 281121]
    assert read_votes(embedded_path(), tie="both")["counts"].sum() == 1_670_250
    assert read_votes(embedded_path(), tie="none")["counts"][:, 2].sum() == 0


def test_split_matches_the_package_split():
    lb_data = pytest.importorskip("leaderbot.data")
    data = lb_data.load()
    train, test = lb_data.split(data, test_ratio=0.1, seed=3)
    dm = ArenaDataModule(test_ratio=0.1, seed=3)
    dm.setup("fit")
    assert np.array_equal(dm.datasets["train"].pairs.numpy(), train["X"])
    assert np.array_equal(dm.datasets["test"].counts.numpy(), test["Y"])
    assert dm.datasets["val"] is dm.datasets["train"]
    tr, te = split_pairs(10, 0.3, 0)
    assert sorted([*tr, *te]) == list(range(10)) and len(te) == 3
