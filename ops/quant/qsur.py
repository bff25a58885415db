"""Quantization Space Utilization Rate (QSUR), OSTQuant Sec. 3.

For activations ``X ~ N(mu, Sigma)``, ``Sigma = Q Lambda Q^T``, the data occupy the Mahalanobis ellipsoid of radius
``phi``, of volume ``V_X = pi^{d/2} / Gamma(d/2 + 1) * phi^d * prod_i lambda_i^{1/2}``. A uniform quantizer covers
the hypercube ``V_S = (2 r)^d`` that contains it, so ``QSUR = V_X / V_S`` (the share of the quantization grid the
data can use). Two choices of the half-width ``r``:

* ``vertices`` (the paper): the largest coordinate of the principal-axis vertices ``mu +- phi sqrt(lambda_i) q_i``;
* ``box``: the exact bounding box ``max_j (|mu_j| + phi sqrt(Sigma_jj))``.

Computed in log space (``lgamma``, ``sum log lambda``). Rotations keep ``Lambda`` (QSUR bounded by the eigenvalue
spread); rotation + scaling can make ``Lambda`` isotropic, reaching the ball-in-cube maximum
``pi^{d/2} / (Gamma(d/2 + 1) 2^d)`` (for ``mu = 0``).
"""

from __future__ import annotations

import math

import torch

from suite.errors import ConfigError

BOXES = ("vertices", "box")


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
    if box == "vertices":
        axes = phi * q * lam.sqrt()[None, :]  # column i = phi sqrt(lambda_i) q_i
        r = torch.maximum((mean[:, None] + axes).abs().amax(), (mean[:, None] - axes).abs().amax())
    else:
        r = (mean.abs() + phi * torch.diag(cov).clamp_min(0).sqrt()).amax()
    return log_vx - d * torch.log(2 * r)


def qsur(cov: torch.Tensor, mean: torch.Tensor | None = None, phi: float = 1.0, box: str = "vertices"):
    """``QSUR = V_X / V_S`` (see module docstring)."""
    return log_qsur(cov, mean, phi, box).exp()


def qsur_of_samples(x: torch.Tensor, phi: float = 1.0, box: str = "vertices") -> torch.Tensor:
    """QSUR of the empirical mean / covariance of samples ``x [N, d]``."""
    x = x.double()
    return qsur(torch.cov(x.T), x.mean(0), phi, box)
