"""Outlier census: pure functions that find activation, weight and attention outliers in a transformer.

Criteria follow "Systematic Outliers in Large Language Models" (ICLR 2025) and its analysis scripts:

* **Activation outliers** (``pos_activation_outliers_layer.py``): an entry ``h[t, j]`` of a layer output is an
  outlier when ``|h[t, j]| > k * mean|h|`` with ``k = 1000`` in the paper (the mean over the whole layer output of
  one sequence). The census reports where they sit: per dimension ``j`` (systematic outliers concentrate in a few
  fixed channels) and per token position ``t`` (they concentrate on the first / low-information tokens).
* The per-layer **top-k magnitudes and median** (``analyze.py``): ``top1 / median`` is the scale-free headline ratio.
* **Weight outliers**: ``max|W| / median|W|`` of a weight matrix (down / out projections in the paper).
* **Attention outliers** (attention sinks): the share of attention probability that queries put on the first token
  or on a set of low-information tokens.
"""

from __future__ import annotations

import torch

from core.errors import ConfigError


def _check_k(k: float) -> None:
    if not k > 0:
        raise ConfigError(f"outlier threshold k={k!r} must be > 0")


def as_tokens(h: torch.Tensor) -> torch.Tensor:
    """View an activation as ``[B, T, d]`` tokens x channels, the layout the census reads.

    A transformer's ``[B, T, d]`` is returned as it is; a convolution's feature map ``[B, C, H, W]`` becomes ``[B, H*W,
    C]`` (every pixel a token, every feature map a channel: the axis a per-token activation quantizer scales over);
    a flat ``[B, d]`` (a classifier head's input) becomes ``[1, B, d]`` (every example a token).
    """
    if h.dim() == 4:
        return h.flatten(2).transpose(1, 2)
    if h.dim() == 2:
        return h[None]
    if h.dim() != 3:
        raise ValueError(f"as_tokens expects [B, T, d], [B, C, H, W] or [B, d], got shape {tuple(h.shape)}")
    return h


def activation_outlier_mask(h: torch.Tensor, k: float = 1000.0) -> torch.Tensor:
    """Entries of each sequence's layer output above ``k`` times its mean magnitude.

    Args:
        h: Layer output ``[B, T, d]`` (or ``[T, d]``).
        k: Threshold multiple of ``mean|h|`` (paper: 1000).

    Returns:
        Boolean ``[B, T, d]`` (same shape as ``h``): ``|h| > k * mean_{t, j} |h|`` per sequence.
    """
    _check_k(k)
    a = h.detach().abs().float()
    mean = a.mean(dim=(-2, -1), keepdim=True)
    return a > k * mean


def activation_outlier_stats(h: torch.Tensor, k: float = 1000.0, top: int = 3) -> dict[str, torch.Tensor]:
    """Census of one layer output.

    Args:
        h: Layer output ``[B, T, d]``.
        k: Outlier threshold multiple of the mean magnitude.
        top: How many of the largest magnitudes to report.

    Returns:
        ``topk [top]`` largest |h| (over all sequences), ``median`` |h|, ``ratio = top1 / median``,
        ``token_frac`` share of tokens holding at least one outlier, ``per_dim [d]`` outlier count per channel,
        ``per_token [T]`` outlier count per position (summed over the batch), ``count`` total outliers.
    """
    if h.dim() == 2:
        h = h[None]
    if h.dim() != 3:
        raise ValueError(f"activation_outlier_stats expects [B, T, d], got shape {tuple(h.shape)}")
    a = h.detach().abs().float()
    mask = activation_outlier_mask(h, k)
    flat = a.flatten()
    topk = flat.topk(min(top, flat.numel())).values
    median = flat.median()
    return {
        "topk": topk,
        "median": median,
        "ratio": topk[0] / median.clamp_min(torch.finfo(torch.float32).tiny),
        "token_frac": mask.any(-1).float().mean(),
        "per_dim": mask.sum(dim=(0, 1)),
        "per_token": mask.sum(dim=(0, 2)),
        "count": mask.sum(),
    }


def outlier_dimensions(h: torch.Tensor, k: float = 1000.0, min_share: float = 0.0) -> list[int]:
    """Channels that hold activation outliers, most frequent first.

    Args:
        h: ``[B, T, d]``.
        k: Threshold multiple of the mean magnitude.
        min_share: Keep channels holding at least this share of all outliers.
    """
    per_dim = activation_outlier_stats(h, k)["per_dim"]
    total = int(per_dim.sum())
    if total == 0:
        return []
    order = per_dim.argsort(descending=True)
    return [int(j) for j in order if per_dim[j] > 0 and per_dim[j] / total >= min_share]


def weight_outlier_ratio(w: torch.Tensor) -> torch.Tensor:
    """``max|W| / median|W|`` of a weight tensor (scalar)."""
    a = w.detach().abs().float().flatten()
    return a.max() / a.median().clamp_min(torch.finfo(torch.float32).tiny)


def attention_sink_share(attn: torch.Tensor, key_mask: torch.Tensor | None = None, skip_first_query: bool = True):
    """Mean attention probability that queries put on the sink keys.

    Args:
        attn: Attention probabilities ``[B, H, T, S]`` (rows over real keys; rows may sum to < 1 for the
            variants with an extra slot).
        key_mask: Boolean ``[B, S]`` or ``[S]``, True for sink keys (low-information tokens). ``None``: key 0
            (the first token).
        skip_first_query: Leave out query 0, which can only attend to itself under a causal mask.

    Returns:
        ``share [H]``: per-head mean over batch and queries of ``sum_{j in sink} attn[b, h, t, j]``.
    """
    if attn.dim() != 4:
        raise ValueError(f"attention_sink_share expects [B, H, T, S], got shape {tuple(attn.shape)}")
    b, _, t, s = attn.shape
    if key_mask is None:
        key_mask = torch.zeros(s, dtype=torch.bool, device=attn.device)
        key_mask[0] = True
    if key_mask.dim() == 1:
        key_mask = key_mask[None].expand(b, s)
    mass = (attn.detach().float() * key_mask[:, None, None, :].float()).sum(-1)  # [B, H, T]
    if skip_first_query and t > 1:
        mass = mass[:, :, 1:]
    return mass.mean(dim=(0, 2))
