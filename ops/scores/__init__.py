"""Exact scores, denoisers and score Hessians of analytically tractable distributions (rx_dpm, sgm_lipschitz)."""

from __future__ import annotations

from ops.scores.gmm import check_gmm, gmm_denoiser, gmm_hessian, gmm_log_prob, gmm_sample, gmm_score
from ops.scores.naive import naive_gmm_denoiser, naive_gmm_hessian

__all__ = [
    "check_gmm",
    "gmm_denoiser",
    "gmm_hessian",
    "gmm_log_prob",
    "gmm_sample",
    "gmm_score",
    "naive_gmm_denoiser",
    "naive_gmm_hessian",
]
