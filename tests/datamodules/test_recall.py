"""Recall generators (MQAR, key overwrite, needle) and the jsonl real-format loader."""

from __future__ import annotations

import pytest
import torch

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules.recall import RecallDataModule, generate, write_jsonl


def _check_answers(x, y, latest=False):
    """Every labelled position holds a key whose (latest) binding in the prefix is the label."""
    n_checked = 0
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        for p, lab in enumerate(row_y):
            if lab == -100:
                continue
            key = row_x[p]
            bound = [row_x[i + 1] for i in range(0, p - 1) if row_x[i] == key and i % 2 == 0]
            assert bound, "queried key was never bound"
            assert lab == (bound[-1] if latest else bound[0])
            n_checked += 1
    return n_checked


def test_mqar_answers_are_first_bindings():
    ds = generate("mqar", 16, 40, 30, 5, seed=0)
    assert ds.input_ids.shape == (16, 40)
    assert (ds.labels != -100).sum(1).eq(5).all()  # one query per key
    assert _check_answers(ds.input_ids, ds.labels) == 80
    keys = ds.input_ids[:, 0:10:2]
    assert all(len(set(r)) == 5 for r in keys.tolist())  # distinct keys


def test_overwrite_answers_are_latest_bindings():
    ds = generate("overwrite", 32, 48, 30, 8, seed=1, num_keys=3)
    assert _check_answers(ds.input_ids, ds.labels, latest=True) >= 32
    keys = ds.input_ids[:, 0:16:2]
    assert any(len(set(r)) < 8 for r in keys.tolist())  # keys really are re-bound
    # in some rows the latest value differs from the first one (otherwise the task would equal MQAR)
    differs = 0
    for row_x, row_y in zip(ds.input_ids.tolist(), ds.labels.tolist()):
        for p, lab in enumerate(row_y):
            if lab != -100:
                first = next(row_x[i + 1] for i in range(0, 16, 2) if row_x[i] == row_x[p])
                differs += first != lab
    assert differs > 0


def test_niah_needle_and_query():
    ds = generate("niah", 8, 50, 40, 0, seed=2, needle_len=3)
    for row_x, row_y in zip(ds.input_ids.tolist(), ds.labels.tolist()):
        q = 50 - 3 - 2
        assert row_x[q] == 1 and row_y[q + 1 : q + 4] == row_x[row_x.index(1) + 2 : row_x.index(1) + 5]
        assert row_x.index(1) < q and sum(v != -100 for v in row_y) == 3


def test_datamodule_splits_lengths_and_seeds():
    dm = RecallDataModule(
        "mqar", vocab_size=30, seq_len=32, num_kv=4, n_train=20, n_val=5, n_test=6, test_lengths=[32, 64], batch_size=4
    )
    dm.setup()
    assert [d.input_ids.shape for d in dm.datasets["test"]] == [(6, 32), (6, 64)]
    assert not torch.equal(dm.datasets["train"].input_ids[:5], dm.datasets["val"].input_ids)
    dm2 = RecallDataModule("mqar", vocab_size=30, seq_len=32, num_kv=4, n_train=20, n_val=5, n_test=6, batch_size=4)
    dm2.setup()
    assert torch.equal(dm.datasets["train"].input_ids, dm2.datasets["train"].input_ids)


def test_real_jsonl_roundtrip_and_errors(tmp_path):
    ds = generate("mqar", 6, 16, 20, 2, seed=0)
    for split in ("train", "val", "test"):
        write_jsonl(tmp_path / f"{split}.jsonl", ds)
    dm = RecallDataModule(source="real", data_dir=str(tmp_path), vocab_size=20, seq_len=16, num_kv=2, batch_size=2)
    dm.setup()
    assert torch.equal(dm.datasets["train"].labels, ds.labels) and dm.test_lengths == [16]
    (tmp_path / "val.jsonl").write_text('{"input_ids": [1, 2], "labels": [2, -100]}\n{"input_ids": [1]}\n')
    dm = RecallDataModule(source="real", data_dir=str(tmp_path), vocab_size=20, seq_len=16, num_kv=2)
    with pytest.raises(DataFormatError, match=r"val.jsonl: row 2"):
        dm.setup()
    with pytest.raises(MissingDataError, match="train.jsonl"):
        RecallDataModule(source="real", data_dir=str(tmp_path / "none")).setup()


def test_config_errors():
    with pytest.raises(ConfigError, match="num_kv"):
        RecallDataModule("mqar", seq_len=16, num_kv=8)
    with pytest.raises(ConfigError, match="task"):
        RecallDataModule("copy")
    with pytest.raises(ConfigError, match="num_keys"):
        RecallDataModule("overwrite", num_kv=4, num_keys=9)
