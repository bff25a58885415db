"""What the shared callbacks do under DDP (``trainer=ddp``): pool per-rank batches and sums across ranks.

The suite's loaders deal each global batch round-robin to the ranks (:mod:`datamodules._base`), so the ranks' ``k``-th
batches together are the examples of a one-process run's ``k``-th batch, and every rank has the same number of
batches of the same size (the last shard is padded by repeating examples, as ``DistributedSampler`` does). Pooling
the ranks' batches therefore gives every rank the one-process calibration set, and summing per-rank counts gives the
one-process score (up to float rounding and the padded repeats).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.pytorch import LightningModule, Trainer


def gather_batches(trainer: Trainer, pl_module: LightningModule, batches: list[Any]) -> list[Any]:
    """Each batch (a tensor or a collection of tensors, batch dimension first) pooled over the ranks in the order of
    the one-process batch (rank ``r`` holds rows ``r, r + W, ...`` of each global batch, so the rows are interleaved
    back): every rank gets the same list, the one-process list. One process: ``batches`` unchanged.

    The order matters beyond rounding: a calibration that learns with Adam on an untrained model (near-zero
    gradients) takes the sign of each gradient entry, and a sum in another order can flip it."""
    if trainer.world_size <= 1:
        return batches
    out = []
    for batch in batches:
        gathered = pl_module.all_gather(batch)  # each tensor [W, B, ...]
        out.append(apply_to_collection(gathered, torch.Tensor, lambda t: t.transpose(0, 1).reshape(-1, *t.shape[2:])))
    return out


def sum_over_ranks(trainer: Trainer, values: list[float], device: torch.device) -> list[float]:
    """``values`` summed over the ranks (float64); one process: unchanged."""
    if trainer.world_size <= 1:
        return list(values)
    total = trainer.strategy.reduce(torch.tensor(values, dtype=torch.float64, device=device), reduce_op="sum")
    return [float(v) for v in total]
