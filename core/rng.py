"""Seeded, isolated random draws for evaluation.

A diffusion model's validation loss and samples depend on random draws (timesteps, noise). Drawn from the training
stream, they differ at every validation and between seeds, so a validation curve carries that noise and two runs
are scored on different draws. :func:`fixed_draws` makes them a fixed function of ``(seed, batch_idx)`` (the same at
every epoch and in every run: paired comparisons) and leaves the training stream exactly where it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

EVAL_SEED = 10_000  # evaluation draws, independent of the run's seed (also datamodules.bracket's eval brackets)


@contextmanager
def fixed_draws(offset: int = 0, device: torch.device | None = None, seed: int = EVAL_SEED) -> Iterator[None]:
    """Inside the block, torch's global generators are seeded with ``seed + offset``; on exit they are restored.

    Args:
        offset: Added to ``seed`` (e.g. the batch index, so that batches draw differently).
        device: The module's device; a CUDA device's generator is forked too.
        seed: Base seed.
    """
    cuda = device is not None and device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else [], device_type="cuda"):
        # seed only the generators that are restored (torch.manual_seed would also reseed every other CUDA device)
        torch.default_generator.manual_seed(seed + offset)
        if cuda:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed + offset)
        yield
