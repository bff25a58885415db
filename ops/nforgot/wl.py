"""Temporal Weisfeiler-Lehman subtree relabelling (the paper's "temporal WL subtree patterns").

Each query ``(u, t)`` (node ``u`` observed at time ``t``) gets a pattern id by ``h`` rounds of

    l_0(u, t) = min(floor(log2(1 + deg_t(u))), max_degree_bucket)            deg_t = events of u strictly before t
    l_h(u, t) = HASH( l_{h-1}(u, t), sorted multiset { (l_{h-1}(v, t_v), bucket(t - t_v)) } )
    bucket(dt) = min(floor(log2(1 + dt / time_scale)), time_buckets - 1)

over the ``k`` most recent neighbours ``(v, t_v)``, ``t_v < t`` (the sampler's leak-free neighbourhood). Two
queries share ``l_h`` iff their depth-``h`` temporal subtrees (degree labels, neighbour labels and time gaps)
are isomorphic as multisets. The initial label is structural (temporal degree), not the class, so the patterns
compare the event structure of two tasks without looking at their (disjoint) classes.

:func:`temporal_wl_labels` hashes with tensor ops (two 31-bit polynomial hashes packed in one int64);
:func:`naive_temporal_wl_labels` builds the exact nested tuples. The sampler is any object with
``sample(nodes, times, k)`` and ``count(nodes, times)`` (``layers.temporal_graph.sampler``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

M1, M2 = 2147483647, 2147483629  # primes < 2^31: products with BASE stay inside int64
BASE1, BASE2 = 1000003, 999983


def hash_rows(seq: Tensor) -> Tensor:
    """``[B, L]`` int64 -> ``[B]`` int64: polynomial hash of each row (order-sensitive)."""
    h1 = torch.zeros(seq.shape[0], dtype=torch.long)
    h2 = torch.zeros_like(h1)
    for j in range(seq.shape[1]):
        e = seq[:, j]
        h1 = (h1 * BASE1 + torch.remainder(e, M1) + 1) % M1
        h2 = (h2 * BASE2 + torch.remainder(e, M2) + 1) % M2
    return h1 * M2 + h2


def degree_label(count: Tensor, max_degree_bucket: int) -> Tensor:
    return torch.floor(torch.log2(1.0 + count.double())).long().clamp_max(max_degree_bucket)


def time_bucket(dt: Tensor, time_scale: float, time_buckets: int) -> Tensor:
    return torch.floor(torch.log2(1.0 + dt.double().clamp_min(0) / time_scale)).long().clamp_max(time_buckets - 1)


def temporal_wl_labels(
    sampler: Any,
    nodes: Tensor,
    times: Tensor,
    k: int,
    iterations: int = 2,
    time_scale: float = 1.0,
    time_buckets: int = 8,
    max_degree_bucket: int = 15,
) -> Tensor:
    """``[B]`` int64 temporal WL pattern ids of ``(nodes, times)`` after ``iterations`` rounds (see module doc)."""
    nodes, times = nodes.long(), times.double()
    if iterations == 0:
        return degree_label(sampler.count(nodes, times), max_degree_bucket)
    nb = sampler.sample(nodes, times, k)
    b = nodes.numel()
    own = temporal_wl_labels(sampler, nodes, times, k, iterations - 1, time_scale, time_buckets, max_degree_bucket)
    nbr = temporal_wl_labels(
        sampler,
        nb.nodes.reshape(-1),
        nb.times.reshape(-1),
        k,
        iterations - 1,
        time_scale,
        time_buckets,
        max_degree_bucket,
    ).view(b, k)
    bucket = time_bucket(times.unsqueeze(1) - nb.times, time_scale, time_buckets)
    pair = hash_rows(torch.stack([nbr.reshape(-1), bucket.reshape(-1)], 1)).view(b, k)
    pair = torch.where(nb.mask, pair, torch.full_like(pair, -1)).sort(1).values  # multiset: order-free
    return hash_rows(torch.cat([own.unsqueeze(1), pair], 1))


def naive_temporal_wl_labels(
    neighbors: Any,
    count: Any,
    nodes: list[int],
    times: list[float],
    k: int,
    iterations: int = 2,
    time_scale: float = 1.0,
    time_buckets: int = 8,
    max_degree_bucket: int = 15,
) -> list[Any]:
    """Exact twin: nested tuples. ``neighbors(u, t, k) -> [(v, t_v), ...]`` and ``count(u, t) -> int``."""
    import math

    def label(u: int, t: float, h: int) -> Any:
        if h == 0:
            return min(int(math.floor(math.log2(1 + count(u, t)))), max_degree_bucket)
        multiset = []
        for v, tv in neighbors(u, t, k):
            bucket = min(int(math.floor(math.log2(1 + max(t - tv, 0.0) / time_scale))), time_buckets - 1)
            multiset.append((label(v, tv, h - 1), bucket))
        return (label(u, t, h - 1), tuple(sorted(multiset, key=repr)))

    return [label(u, t, iterations) for u, t in zip(nodes, times)]
