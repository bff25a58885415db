"""Image-text retrieval metrics of TULIP (Sec. 4): I2T / T2I Recall@K over a gallery, and R@1 by caption length.

Pair ``i`` is image ``i`` with caption ``i``; a query is a hit at K when its own pair ranks in the top K of the
similarity row. Vectorised, one count per query of the items scoring strictly higher (``g``) and exactly as high
(``t``, ties) as its own pair; tested against torchmetrics' ``RetrievalRecall`` on tie-free scores.

**Ties.** A tie has no order, so a query whose pair ties with ``t`` other items gets the *expected* hit of a random
order of the tied block: its rank is uniform over ``g .. g + t``, so the credit at K is
``clip((K - g) / (1 + t), 0, 1)``; at K = 1 that is ``1 / (1 + t)`` when nothing scores higher, and 0 otherwise.
(Two captions identical within a truncating encoder's context embed identically; counting each tie against the
query would score such an encoder 0 by construction.) The pessimistic convention, a tie counted against the query
(rank ``g + t``), is returned beside it under ``<key>_pessimistic``. The official evaluation ranks by
``argsort``, whose order of equal scores is arbitrary (not stable on CPU for rows of 64 or more); it is not copied.
"""

from __future__ import annotations

import torch


def pair_counts(sim: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each query row of ``sim`` ``[N, N]``: the number of other items scoring strictly higher than its pair
    (``[N]``) and the number tied with it (``[N]``)."""
    own = sim.diagonal()[:, None]
    others = sim.clone()
    others.fill_diagonal_(float("-inf"))
    return (others > own).sum(1), (others == own).sum(1)


def pair_ranks(sim: torch.Tensor) -> torch.Tensor:
    """0-based pessimistic rank of the true pair of each query row of ``sim`` ``[N, N]`` (ties counted against it)."""
    higher, ties = pair_counts(sim)
    return higher + ties


def hit_credit(sim: torch.Tensor, k: int) -> torch.Tensor:
    """Expected hit at ``k`` of each query row ``[N]`` in ``[0, 1]``: ``clip((k - g) / (1 + t), 0, 1)`` with ``g``
    items scoring higher and ``t`` tied (see the module docstring)."""
    higher, ties = pair_counts(sim)
    return ((k - higher).float() / (1 + ties).float()).clamp(0.0, 1.0)


def recall_at_k(image_features: torch.Tensor, text_features: torch.Tensor, ks: tuple[int, ...] = (1, 5, 10)) -> dict:
    """``{"i2t_r1": ..., "t2i_r10": ..., "i2t_r1_pessimistic": ...}``: the fraction of queries whose pair ranks in the
    top K (percent), ties given their expected credit; ``*_pessimistic`` counts each tie against the query."""
    sim = image_features @ text_features.T
    out = {}
    for direction, s in (("i2t", sim), ("t2i", sim.T)):
        ranks = pair_ranks(s)
        for k in ks:
            out[f"{direction}_r{k}"] = 100.0 * hit_credit(s, k).mean().item()
            out[f"{direction}_r{k}_pessimistic"] = 100.0 * (ranks < k).float().mean().item()
    return out


def r1_by_length(
    image_features: torch.Tensor, text_features: torch.Tensor, lengths: torch.Tensor, edges: list[int]
) -> dict[str, tuple[float, int]]:
    """Mean of I2T and T2I R@1 (percent, ties at their expected credit) over the pairs whose caption length (tokens)
    falls in each bin ``[edges[j-1], edges[j])``; keys ``lt<e0>``, ``<e0>_<e1>``, ..., ``ge<eK>``; values
    ``(R@1, count)``."""
    sim = image_features @ text_features.T
    hit = (hit_credit(sim, 1) + hit_credit(sim.T, 1)) / 2
    bounds = [0, *edges, 10**9]
    out = {}
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        name = f"lt{hi}" if lo == 0 else (f"ge{lo}" if hi == 10**9 else f"{lo}_{hi}")
        sel = (lengths >= lo) & (lengths < hi)
        if sel.any():
            out[name] = (100.0 * hit[sel].mean().item(), int(sel.sum()))
    return out
