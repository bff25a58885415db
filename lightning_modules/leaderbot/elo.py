"""Online Elo, the rating Chatbot Arena first published (the paper's baseline, next to plain Bradley-Terry).

Battles are expanded from the pair counts and replayed one by one in a seeded random order; after each battle
``a`` vs ``b`` with score ``s`` (1 win, 0 loss, 1/2 tie)

    E = 1 / (1 + base^((R_b - R_a) / scale)),   R_a <- R_a + K (s - E),   R_b <- R_b - K (s - E).

An Elo rating is a Bradley-Terry score in other units: ``x = R ln(base) / scale``, which is how the suite scores
it with the same metrics as the likelihood models.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def expand_battles(pairs: torch.Tensor, counts: torch.Tensor, seed: int) -> tuple[list[int], list[int], list[float]]:
    """One record per vote ``(a, b, s)`` in a random order fixed by ``seed``.

    Args:
        pairs: ``[n, 2]``.
        counts: ``[n, 3]`` integer-valued ``[wins_a, wins_b, ties]``.
        seed: Seed of the replay order.
    """
    p = pairs.cpu().numpy()
    c = np.rint(counts.detach().cpu().numpy()).astype(np.int64)
    reps = c.reshape(-1)  # per pair: win, loss, tie blocks
    a = np.repeat(np.repeat(p[:, 0], 3), reps)
    b = np.repeat(np.repeat(p[:, 1], 3), reps)
    s = np.repeat(np.tile(np.array([1.0, 0.0, 0.5]), len(p)), reps)
    order = np.random.default_rng(seed).permutation(len(s))
    return a[order].tolist(), b[order].tolist(), s[order].tolist()


def online_elo(
    ratings: list[float], a: list[int], b: list[int], s: list[float], k: float, base: float, scale: float
) -> list[float]:
    """Replay battles in order, updating ``ratings`` (returned as a new list). Sequential by definition."""
    r = list(ratings)
    for ia, ib, sa in zip(a, b, s):
        e = 1.0 / (1.0 + base ** ((r[ib] - r[ia]) / scale))
        d = k * (sa - e)
        r[ia] += d
        r[ib] -= d
    return r


def elo_to_scores(ratings: torch.Tensor, base: float, scale: float) -> torch.Tensor:
    """Bradley-Terry scores ``x = (R - mean R) ln(base) / scale`` (``[m]``)."""
    return (ratings - ratings.mean()) * (math.log(base) / scale)
