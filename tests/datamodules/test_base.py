"""The DataModule base: per-rank batch split, seeded splits, missing files, resumable rank-sharded loader."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from core.errors import ConfigError, MissingDataError
from datamodules._base import ResumableLoader, ResumableSampler, per_rank_batch_size, require_files, split_indices


def test_per_rank_batch_size():
    assert per_rank_batch_size(64, 4) == 16
    with pytest.raises(ConfigError, match=r"data.batch_size=10 must be divisible by the world size \(4 processes\)"):
        per_rank_batch_size(10, 4)


def test_split_indices_is_seeded_disjoint_and_complete():
    a = split_indices(100, [0.8, 0.1, 0.1], seed=3)
    b = split_indices(100, [0.8, 0.1, 0.1], seed=3)
    assert [len(x) for x in a] == [80, 10, 10]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert sorted(torch.cat(a).tolist()) == list(range(100))
    assert not torch.equal(split_indices(100, [0.8, 0.1, 0.1], seed=4)[0], a[0])


def test_require_files_names_every_missing_file(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(MissingDataError, match=r"b\.txt, .*c\.txt\. Get them from X"):
        require_files(tmp_path, ["a.txt", "b.txt", "c.txt"], "Get them from X")


def test_resumable_loader_skips_consumed_batches():
    ds = TensorDataset(torch.arange(20))
    loader = ResumableLoader(ds, batch_size=4, shuffle=True, seed=7)
    loader.resumable_sampler.set_epoch(2)
    full = [b[0].tolist() for b in loader]
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert state == {"epoch": 2, "batches": 2}
    fresh = ResumableLoader(ds, batch_size=4, shuffle=True, seed=7)
    fresh.load_state_dict(state)
    assert [b[0].tolist() for b in fresh] == full[2:]
    # The next epoch starts from the beginning again.
    assert len([b for b in fresh]) == 5


def test_sampler_shards_like_distributed_sampler(monkeypatch):
    import datamodules._base as base

    orders = []
    for rank in range(3):
        monkeypatch.setattr(base, "world", lambda r=rank: (r, 3))
        s = ResumableSampler(10, shuffle=False, seed=0)
        orders.append(list(s))
        assert len(s) == 4
    assert sorted(sum(orders, [])) == sorted(list(range(10)) + [0, 1])  # padded to 12 like DistributedSampler
    assert orders[0] == [0, 3, 6, 9]
