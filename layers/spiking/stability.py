"""Stability and frequency-response analysis of the two-compartment neurons (TS-LIF Section 3.3, Eqs. (11)-(13)).

Below threshold (no spike, no reset) Eqs. (6)-(7) are a linear system. Substituting the new dendritic potential
into the soma update gives

    v[t] = A v[t-1] + B x[t],   v = (v_d, v_s),                                         Eq. (11)
    A = [[d0, -gamma_ds], [-kappa d0, d2 + kappa gamma_ds]],  B = [d1, d3 - kappa d1].

The system is stable iff the spectral radius rho(A) < 1 (Eq. (12)), and the transfer function from the input to each
compartment is ``H(z) = (I - A z^-1)^-1 B`` (Eq. (13)), evaluated on the unit circle ``z = e^{j omega}``. With the
official initial values the dendrite is low-pass and the soma band/high-pass (the paper's frequency-separation claim).
TC-LIF is the special case ``d0 = d1 = d2 = 1``, ``d3 = 0``; its ``det A = 1``, so it is only marginally stable.
All functions are pure tensor functions (they also take the learned coefficients of a trained neuron).
"""

from __future__ import annotations

import torch


def system_matrix(
    d: torch.Tensor, kappa: torch.Tensor | float, gamma_ds: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A [2, 2], B [2])`` of Eq. (11) from ``d = (d0, d1, d2, d3)`` and the couplings."""
    d = torch.as_tensor(d)
    kappa = torch.as_tensor(kappa, dtype=d.dtype)
    gamma_ds = torch.as_tensor(gamma_ds, dtype=d.dtype)
    a = torch.stack([torch.stack([d[0], -gamma_ds]), torch.stack([-kappa * d[0], d[2] + kappa * gamma_ds])])
    b = torch.stack([d[1], d[3] - kappa * d[1]])
    return a, b


def spectral_radius(a: torch.Tensor) -> torch.Tensor:
    """``max |eig(A)|`` for ``A [..., n, n]`` (Eq. (12): stable iff < 1)."""
    return torch.linalg.eigvals(a).abs().amax(-1)


def frequency_response(a: torch.Tensor, b: torch.Tensor, omega: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Complex gains ``(H_d(omega), H_s(omega))`` of Eq. (13), each ``[W]`` for ``omega [W]`` in radians/step."""
    omega = torch.as_tensor(omega, dtype=a.dtype)
    ctype = torch.complex128 if a.dtype == torch.float64 else torch.complex64
    z_inv = torch.exp(-1j * omega.to(ctype))  # [W]
    eye = torch.eye(2, dtype=ctype)
    m = eye - a.to(ctype) * z_inv[:, None, None]  # [W, 2, 2]
    h = torch.linalg.solve(m, b.to(ctype).expand(len(omega), 2))  # [W, 2]
    return h[:, 0], h[:, 1]


def impulse_response(a: torch.Tensor, b: torch.Tensor, steps: int) -> torch.Tensor:
    """Kernel ``k[j] = A^j B`` for ``j < steps``, ``[steps, 2]``: the subthreshold states are ``v[t] = sum_j k[j]
    x[t-j]`` (a causal convolution, the closed form of Eq. (11))."""
    out, k = [], b
    for _ in range(steps):
        out.append(k)
        k = a @ k
    return torch.stack(out)


def linear_response(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Subthreshold states for input ``x [B, T, H]`` by convolution with the impulse response: ``[B, T, H, 2]``."""
    t = x.shape[1]
    k = impulse_response(a, b, t)  # [T, 2]
    # v[t] = sum_{j<=t} k[j] x[t-j]: a Toeplitz matrix product over time.
    idx = torch.arange(t)
    lag = idx[:, None] - idx[None, :]  # [T(out), T(in)]
    toeplitz = torch.where((lag >= 0)[..., None], k[lag.clamp(min=0)], torch.zeros((), dtype=k.dtype))  # [T, T, 2]
    return torch.einsum("tsc,bsh->bthc", toeplitz, x)
