"""Quantization Space Utilization Rate (QSUR), OSTQuant Sec. 3.

Status of the definition: **reconstructed, not verified against the equations.** The stored
copies of arXiv 2501.13987 that could be searched give the abstract ("QSUR ... assesses the quantizability of
transformed data by measuring the space utilization of the data in the quantization space") and the official
README's Fig. 1 caption (``X ~ N(mu, Sigma)``; ``lambda_1, lambda_2`` the spread along the principal axes after the
eigenvalue decomposition of ``Sigma``; smoothing, rotation and OST change QSUR), both consistent with what follows,
but not the Sec. 3 equations themselves, so no equation number is cited and the hypercube's side is offered in
three forms (below). The official code has no QSUR. For ``mu = 0`` the two vertex-based forms agree.

For activations ``X ~ N(mu, Sigma)``, ``Sigma = Q Lambda Q^T``, the data occupy the Mahalanobis ellipsoid of radius
``phi``, of volume ``V_X = pi^{d/2} / Gamma(d/2 + 1) * phi^d * prod_i lambda_i^{1/2}``. A uniform quantizer covers
the hypercube ``V_S`` that contains it, so ``QSUR = V_X / V_S`` (the share of the quantization grid the data can
use). Three choices of the cube:

* ``vertices``: the largest absolute coordinate of the principal-axis vertices ``v = mu +- phi sqrt(lambda_i) q_i``
  (a symmetric grid ``[-r, r]``), ``V_S = (2 max|v|)^d``;
* ``vertex_range``: the cube spanned by the smallest and largest vertex coordinate, ``V_S = (max v - min v)^d``
  (an asymmetric grid ``[min v, max v]``; our recollection of the paper's form, unverified);
* ``box``: the exact bounding box ``max_j (|mu_j| + phi sqrt(Sigma_jj))`` (half-width ``r``).

Computed in log space (``lgamma``, ``sum log lambda``). Rotations keep ``Lambda`` (QSUR bounded by the eigenvalue
spread); rotation + scaling can make ``Lambda`` isotropic, reaching the ball-in-cube maximum
``pi^{d/2} / (Gamma(d/2 + 1) 2^d)`` (for ``mu = 0``).
"""

from __future__ import annotations

import math

import torch

from core.errors import ConfigError

BOXES = ("vertices", "vertex_range", "box")


def log_qsur(cov: torch.Tensor, mean: torch.Tensor | None = None, phi: float = 1.0, box: str = "vertices"):
    """``log QSUR`` of ``N(mean, cov)``; ``cov [d, d]``, ``mean [d]`` (default zero). Returns a scalar tensor."""
    if box not in BOXES:
        raise ConfigError(f"qsur box={box!r} must be one of {list(BOXES)}")
    cov = cov.double()
    d = cov.shape[0]
    mean = torch.zeros(d, dtype=torch.float64) if mean is None else mean.double()
    lam, q = torch.linalg.eigh(cov)
    lam = lam.clamp_min(1e-300)
    log_vx = d / 2 * math.log(math.pi) - math.lgamma(d / 2 + 1) + d * math.log(phi) + 0.5 * lam.log().sum()
    if box in ("vertices", "vertex_range"):
        axes = phi * q * lam.sqrt()[None, :]  # column i = phi sqrt(lambda_i) q_i
        v = torch.cat([mean[:, None] + axes, mean[:, None] - axes], 1)  # [d, 2d] vertex coordinates
        side = v.max() - v.min() if box == "vertex_range" else 2 * v.abs().max()
    else:
        side = 2 * (mean.abs() + phi * torch.diag(cov).clamp_min(0).sqrt()).amax()
    return log_vx - d * torch.log(side)


def qsur(cov: torch.Tensor, mean: torch.Tensor | None = None, phi: float = 1.0, box: str = "vertices"):
    """``QSUR = V_X / V_S`` (see module docstring)."""
    return log_qsur(cov, mean, phi, box).exp()


def qsur_of_samples(x: torch.Tensor, phi: float = 1.0, box: str = "vertices") -> torch.Tensor:
    """QSUR of the empirical mean / covariance of samples ``x [N, d]``."""
    x = x.double()
    return qsur(torch.cov(x.T), x.mean(0), phi, box)
