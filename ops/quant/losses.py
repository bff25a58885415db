"""OSTQuant's KL-Top loss (``quant/trainer.py::compute_loss``, ``loss_type="kl_top"``, ``post_attn=True``).

``p = softmax(z_fp)``, ``log q = log_softmax(z_quant)``, ``I`` = the top-``k`` logits of the full-precision model per
token: ``L = (1 / N_tokens) sum_tokens sum_{i in I} p_i (log p_i - log q_i)``. Not renormalised over the top-k (the
official ``post_attn=True`` path). ``kl_full`` is the full-vocabulary ablation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core.errors import ConfigError


def kl_top(logits_fp: torch.Tensor, logits_q: torch.Tensor, k: int = 1000) -> torch.Tensor:
    """KL-Top between full-precision and quantized logits ``[..., V]`` (mean over tokens)."""
    if not isinstance(k, int) or k < 1:
        raise ConfigError(f"kl_top k={k!r} must be a positive integer")
    v = logits_fp.shape[-1]
    zf, zq = logits_fp.reshape(-1, v).float(), logits_q.reshape(-1, v).float()
    idx = zf.topk(min(k, v), dim=-1).indices
    logp = F.log_softmax(zf, -1).gather(-1, idx)
    logq = F.log_softmax(zq, -1).gather(-1, idx)
    return (logp.exp() * (logp - logq)).sum(-1).mean()


def kl_full(logits_fp: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary ``KL(p_fp || q)`` per token, averaged."""
    v = logits_fp.shape[-1]
    logp = F.log_softmax(logits_fp.reshape(-1, v).float(), -1)
    logq = F.log_softmax(logits_q.reshape(-1, v).float(), -1)
    return (logp.exp() * (logp - logq)).sum(-1).mean()
