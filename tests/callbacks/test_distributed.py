"""callbacks.distributed without processes: the pooled batch is the one-process batch, in its order."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from callbacks.distributed import gather_batches, sum_over_ranks


def test_pooled_batches_are_the_one_process_batches_in_their_order():
    # The suite's sharding (datamodules/_base.py): rank r holds rows r, r + W, ... of each global batch.
    world = 2
    glob = [torch.arange(8 * k, 8 * k + 8).float()[:, None].expand(8, 3) for k in range(2)]
    labels = [torch.arange(8 * k, 8 * k + 8) for k in range(2)]
    shards = {r: [(x[r::world], y[r::world]) for x, y in zip(glob, labels, strict=True)] for r in range(world)}

    class Module:
        """all_gather as Lightning's: each tensor of the collection stacked over the ranks, [W, B, ...]."""

        def all_gather(self, batch):
            k = next(i for i, (x, _) in enumerate(shards[0]) if torch.equal(x, batch[0]))
            return tuple(torch.stack([shards[r][k][j] for r in range(world)]) for j in range(2))

    pooled = gather_batches(SimpleNamespace(world_size=world), Module(), shards[0])
    for (x, y), gx, gy in zip(pooled, glob, labels, strict=True):
        assert torch.equal(x, gx) and torch.equal(y, gy)
    assert gather_batches(SimpleNamespace(world_size=1), None, shards[0]) is shards[0]


def test_sums_are_left_alone_on_one_process():
    assert sum_over_ranks(SimpleNamespace(world_size=1), [1.0, 2.5], torch.device("cpu")) == [1.0, 2.5]
