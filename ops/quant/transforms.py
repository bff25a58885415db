"""Orthogonal transforms for rotation-based quantization: Hadamard, random Hadamard (QuaRot), KLT (OSTQuant init),
and the Cayley retraction on the Stiefel manifold used to learn them.

* Sylvester Hadamard ``H_{2n} = [[H, H], [H, -H]] / sqrt(2)`` (``n`` a power of two).
* Random Hadamard ``diag(s) H``, ``s`` uniform random signs (QuaRot's ``random_hadamard_matrix``: the signs act
  first, ``x -> (x * s) H``). The order matters: ``H diag(s)`` would send the all-ones (common-mode) direction of the
  residual stream onto a single channel -- an outlier made by the rotation -- while ``diag(s) H`` spreads it. For a
  width that is not a power of two a random orthogonal matrix (QR of a Gaussian, sign-fixed) stands in; documented
  deviation.
* KLT: the eigenvectors of a covariance, largest eigenvalue first. OSTQuant's ``--use_klt`` initialises
  ``R_res = KLT(rows of [W_q; W_k; W_v; W_up; W_gate]) @ random Hadamard`` (:func:`weight_klt`), with the
  covariance of the rows, centred: ``C = (W - 1 mu^T)^T (W - 1 mu^T) / N``, ``mu`` the mean row (the Karhunen-Loeve
  transform diagonalises the covariance). ``centered=False`` keeps the uncentred second moment ``W^T W / N`` (it
  differs only by the rank-one term ``mu mu^T``).
* Cayley retraction (Li, Li & Todorovic, ICLR 2020, the ``SGDG`` option of the official code): for a Euclidean gradient
  ``G`` at ``R``, the skew matrix ``A = G R^T - R G^T`` and ``R' = (I + lr/2 A)^{-1} (I - lr/2 A) R`` stays exactly
  orthogonal (``R'^T R' = I``) and moves along ``-grad`` to first order.
"""

from __future__ import annotations

import math

import torch

from core.errors import ConfigError


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def hadamard(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Orthonormal Sylvester Hadamard matrix ``[n, n]`` (``n`` a power of two)."""
    if not is_pow2(n):
        raise ConfigError(f"Hadamard size n={n} must be a power of two")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).to(dtype)


def random_orthogonal(
    n: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Haar-random orthogonal ``[n, n]`` (QR of a Gaussian with the sign of ``diag(R)`` fixed)."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    return (q * torch.sign(torch.diag(r))[None]).to(dtype)


def random_hadamard(
    n: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """QuaRot's randomised Hadamard ``diag(s) H`` (random orthogonal when ``n`` is not a power of two)."""
    if not is_pow2(n):
        return random_orthogonal(n, generator, dtype)
    s = torch.randint(0, 2, (n,), generator=generator).to(dtype) * 2 - 1
    return s[:, None] * hadamard(n, dtype)


def klt(cov: torch.Tensor) -> torch.Tensor:
    """Eigenvectors of a symmetric ``cov [..., n, n]`` as columns, largest eigenvalue first (batched)."""
    evals, evecs = torch.linalg.eigh(cov.double())
    order = evals.argsort(dim=-1, descending=True)
    return evecs.gather(-1, order.unsqueeze(-2).expand_as(evecs)).to(cov.dtype)


def row_covariance(rows: torch.Tensor, centered: bool = True) -> torch.Tensor:
    """Covariance ``[..., n, n]`` of the ``N`` rows of ``rows [..., N, n]`` (rows = observations), in float64:
    ``(W - mu)^T (W - mu) / N`` (``centered``) or the second moment ``W^T W / N``."""
    w = rows.double()
    if centered:
        w = w - w.mean(-2, keepdim=True)
    return w.mT @ w / w.shape[-2]


def weight_klt(rows: torch.Tensor, centered: bool = True) -> torch.Tensor:
    """KLT ``[..., n, n]`` (float64) of weight rows ``[..., N, n]``: :func:`klt` of :func:`row_covariance`."""
    return klt(row_covariance(rows, centered))


def cayley_retraction(r: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
    """One Cayley step on the Stiefel manifold: ``(I + lr/2 A)^{-1} (I - lr/2 A) R``, ``A = G R^T - R G^T``.

    ``r, grad [..., n, n]``: a leading batch dimension holds independent rotations (OSTQuant's per-head ``R_ov``).
    """
    a = grad @ r.mT - r @ grad.mT
    eye = torch.eye(r.shape[-1], dtype=r.dtype, device=r.device)
    return torch.linalg.solve(eye + 0.5 * lr * a, (eye - 0.5 * lr * a) @ r)


class CayleySGD(torch.optim.Optimizer):
    """SGD with momentum on the Stiefel manifold via the Cayley retraction (square orthogonal parameters, or batches
    ``[..., n, n]`` of them such as per-head rotations).

    The momentum buffer holds Euclidean gradients; each step retracts along the skew part, so every parameter stays
    orthogonal to rounding error (re-orthonormalised by QR every ``reortho_every`` steps against drift).

    Args:
        params: Square orthogonal matrices.
        lr: Step size.
        momentum: Heavy-ball momentum.
        reortho_every: QR re-orthonormalisation period (0: never).
    """

    def __init__(self, params, lr: float = 0.01, momentum: float = 0.9, reortho_every: int = 10) -> None:
        if lr <= 0:
            raise ConfigError(f"rotate_lr={lr!r} must be > 0")
        super().__init__(params, {"lr": lr, "momentum": momentum})
        self.reortho_every, self._steps = reortho_every, 0

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self._steps += 1
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad)
                new = cayley_retraction(p, buf, group["lr"])
                if self.reortho_every and self._steps % self.reortho_every == 0:
                    q, r = torch.linalg.qr(new)
                    new = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
                p.copy_(new)
        return loss
