"""Spiking neurons for TS-LIF (Feng et al., ICLR 2025) and its baselines LIF and TC-LIF.

Equation numbers refer to the list in ``docs/methods/ts_lif.md`` (the paper's Section 3 in order):

* LIF, Eq. (1): ``v[t] = beta v[t-1] + x[t]``, ``s = H(v - theta)``, soft reset ``v <- v - theta s``.
* TC-LIF (Zhang et al., AAAI 2024), Eqs. (2)-(3): ``u_d[t] = u_d[t-1] + beta_1 u_s[t-1] + x[t]``,
  ``u_s[t] = u_s[t-1] + beta_2 u_d[t]``, ``beta_1 = -sigmoid(c_1)``, ``beta_2 = sigmoid(c_2)``, somatic spike only,
  resets ``u_d <- u_d - gamma s``, ``u_s <- u_s - theta s``.
* TS-LIF, Eqs. (6)-(10): dendrite ``v_d[t] = d0 v_d[t-1] + d1 x[t] - gamma_ds v_s[t-1]`` (6); soma with direct
  somatic current injection ``v_s[t] = d2 v_s[t-1] + d3 x[t] - kappa v_d[t]`` (7); somatic and dendritic spikes
  ``s_s = H(v_s - theta)``, ``s_d = H(v_d - theta)`` (8); output ``y = alpha_s * s_s + alpha_d * s_d`` (9) with
  per-channel learnable ``alpha``; soft reset ``v_d <- v_d - gamma s_d``, ``v_s <- v_s - theta s_s`` (10).

Every neuron exists twice: a naive per-step function (``*_step``, the literal equations differentiated by autograd,
the parity oracle) and the module's training form (``forward``: :func:`layers.spiking.scan.two_compartment_scan`, a
fused loop with a hand-written backward pass).
Both start from zero state. Inputs are ``[B, T, *, H]``: time is dim 1, per-channel parameters broadcast on the
last dim ``H``. The official code's TS-LIF coefficients are unconstrained learnable scalars (the sigmoid-bounded
versions are commented out there); we follow it.
"""

from __future__ import annotations

import torch
from torch import nn

from core.errors import ConfigError
from layers.spiking.scan import two_compartment_scan
from layers.spiking.surrogate import spike

TSLIF_INIT_DECAY = (0.8, 0.2, 0.3, 0.7)  # d0, d1, d2, d3 of the official TSLIFNode
TSLIF_INIT_KAPPA = 0.8
TSLIF_INIT_GAMMA_DS = 0.1


# -- naive per-step references --------------------------------------------------------------------------------------
def lif_step(
    x: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, theta: float = 1.0, alpha: float = 2.0, detach_reset=False
) -> tuple[torch.Tensor, torch.Tensor]:
    """One LIF step, Eq. (1). ``x, v``: ``[N, H]``. Returns ``(s, v')``."""
    v = beta * v + x
    s = spike(v - theta, alpha)
    r = s.detach() if detach_reset else s
    return s, v - theta * r


def tclif_step(
    x: torch.Tensor,
    u_d: torch.Tensor,
    u_s: torch.Tensor,
    beta_1: torch.Tensor,
    beta_2: torch.Tensor,
    theta: float = 1.0,
    gamma: float = 0.5,
    alpha: float = 2.0,
    detach_reset: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One TC-LIF step, Eqs. (2)-(3). Returns ``(s, u_d', u_s')``, all ``[N, H]``."""
    u_d = u_d + beta_1 * u_s + x
    u_s = u_s + beta_2 * u_d
    s = spike(u_s - theta, alpha)
    r = s.detach() if detach_reset else s
    return s, u_d - gamma * r, u_s - theta * r


def tslif_step(
    x: torch.Tensor,
    v_d: torch.Tensor,
    v_s: torch.Tensor,
    d: torch.Tensor,
    kappa: torch.Tensor,
    gamma_ds: torch.Tensor,
    alpha_s: torch.Tensor,
    alpha_d: torch.Tensor,
    theta: float = 1.0,
    gamma: float = 0.5,
    alpha: float = 2.0,
    dendritic_spike: bool = True,
    detach_reset: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One TS-LIF step, Eqs. (6)-(10), exactly as written.

    Args:
        x: Input current ``[N, H]``.
        v_d, v_s: Dendritic and somatic potentials ``[N, H]``.
        d: ``[4]`` coefficients ``(d0, d1, d2, d3)``; ``d3`` is the direct somatic injection gain.
        kappa, gamma_ds: Scalar couplings (dendrite -> soma and soma -> dendrite).
        alpha_s, alpha_d: ``[H]`` output weights of somatic and dendritic spikes.
        dendritic_spike: ``False`` is the ablation "w/o dendritic spike": the dendritic spike no longer reaches the
            output (``alpha_d = 0``, as the paper notes specify); the dendrite keeps its soft reset (Eq. (10)).

    Returns:
        ``(y, v_d', v_s')``, each ``[N, H]``.
    """
    v_d = d[0] * v_d + d[1] * x - gamma_ds * v_s
    v_s = d[2] * v_s + d[3] * x - kappa * v_d
    s_s = spike(v_s - theta, alpha)
    s_d = spike(v_d - theta, alpha)
    y = alpha_s * s_s + alpha_d * s_d if dendritic_spike else alpha_s * s_s
    rs, rd = (s_s.detach(), s_d.detach()) if detach_reset else (s_s, s_d)
    return y, v_d - gamma * rd, v_s - theta * rs


# -- modules (training form) ----------------------------------------------------------------------------------------
class _Neuron(nn.Module):
    def __init__(self, theta: float, alpha: float, detach_reset: bool) -> None:
        super().__init__()
        if theta <= 0:
            raise ConfigError(f"model.theta={theta} must be > 0 (firing threshold)")
        if alpha <= 0:
            raise ConfigError(f"model.surrogate_alpha={alpha} must be > 0")
        self.theta, self.alpha, self.detach_reset = float(theta), float(alpha), bool(detach_reset)

    @staticmethod
    def _check(x: torch.Tensor) -> None:
        if x.dim() < 3:
            raise ValueError(f"neuron input must be [B, T, *, H], got shape {tuple(x.shape)}")

    def _reset(self, s: torch.Tensor) -> torch.Tensor:
        return s.detach() if self.detach_reset else s


class LIFNeuron(_Neuron):
    """Leaky integrate-and-fire with a learnable decay ``beta`` (snntorch ``Leaky(learn_beta=True)``), Eq. (1).

    Args:
        beta: Initial decay, clamped to ``[0, 1]`` in the forward pass as snntorch does.
        theta: Threshold. alpha: ATan surrogate sharpness.
        detach_reset: snntorch detaches the reset from the graph (default ``True`` here, as there).
    """

    def __init__(self, beta: float = 0.9, theta: float = 1.0, alpha: float = 2.0, detach_reset: bool = True) -> None:
        super().__init__(theta, alpha, detach_reset)
        self.beta = nn.Parameter(torch.tensor(float(beta)))

    def forward(self, x: torch.Tensor, return_states: bool = False):
        """``x``: ``[B, T, *, H]`` -> spikes of the same shape (and the potential trace if asked).

        Training form: :func:`layers.spiking.scan.two_compartment_scan` with the dendrite alone (``d0 = beta``,
        ``d1 = 1``, reset ``theta``); its naive twin is :func:`lif_step`.
        """
        self._check(x)
        one, zero = x.new_ones(()), x.new_zeros(())
        d = torch.stack([self.beta.clamp(0, 1).to(x.dtype), one, zero, zero])
        y, v, _ = two_compartment_scan(
            x, d, zero, zero, zero, one, self.theta, self.theta, self.alpha, soma=False, detach_reset=self.detach_reset
        )
        return (y, v) if return_states else y

    def coefficients(self) -> dict[str, torch.Tensor]:
        return {"beta": self.beta.clamp(0, 1)}


class TCLIFNeuron(_Neuron):
    """Two-compartment LIF (TC-LIF): no somatic injection, no dendritic spike, Eqs. (2)-(3).

    In TS-LIF notation: ``d0 = d1 = d2 = 1``, ``d3 = 0``, ``gamma_ds = -beta_1``, ``kappa = -beta_2``.
    """

    def __init__(
        self,
        c1: float = 0.0,
        c2: float = 0.0,
        theta: float = 1.0,
        gamma: float = 0.5,
        alpha: float = 2.0,
        detach_reset: bool = False,
    ) -> None:
        super().__init__(theta, alpha, detach_reset)
        self.c = nn.Parameter(torch.tensor([float(c1), float(c2)]))
        self.gamma = float(gamma)

    def betas(self) -> tuple[torch.Tensor, torch.Tensor]:
        return -torch.sigmoid(self.c[0]), torch.sigmoid(self.c[1])

    def forward(self, x: torch.Tensor, return_states: bool = False):
        """``x``: ``[B, T, *, H]`` -> somatic spikes of the same shape (and ``(u_d, u_s)`` traces if asked).

        Training form: :func:`layers.spiking.scan.two_compartment_scan` with the somatic spike resetting the dendrite;
        its naive twin is :func:`tclif_step`.
        """
        self._check(x)
        b1, b2 = self.betas()
        one, zero = x.new_ones(()), x.new_zeros(())
        d = torch.stack([one, one, one, zero])
        y, u_d, u_s = two_compartment_scan(
            x,
            d,
            -b2,
            -b1,
            one,
            zero,
            self.theta,
            self.gamma,
            self.alpha,
            reset_dendrite_by="soma",
            detach_reset=self.detach_reset,
        )
        return (y, u_d, u_s) if return_states else y

    def coefficients(self) -> dict[str, torch.Tensor]:
        b1, b2 = self.betas()
        one = torch.ones_like(b1)
        return {"d": torch.stack([one, one, one, 0 * one]), "kappa": -b2, "gamma_ds": -b1}


class TSLIFNeuron(_Neuron):
    """Temporal-Segment LIF: dendritic + somatic compartments, direct somatic current injection, dendritic spikes,
    soft reset, learnable coefficients, ATan surrogate (Eqs. (4)-(10)).

    Args:
        hidden: Channels ``H`` (size of the per-channel spike weights ``alpha_s``, ``alpha_d``).
        theta: Threshold of both compartments. gamma: Dendritic soft-reset amount.
        alpha: ATan surrogate sharpness.
        somatic_injection: ``False`` fixes ``d3 = 0`` (ablation "w/o somatic injection").
        dendritic_spike: ``False`` is the ablation "w/o dendritic spike": ``alpha_d = 0`` fixed (no parameter), so
            ``s_d`` never reaches the output; the dendrite keeps its soft reset (see :func:`tslif_step`).
        detach_reset: Detach the reset from the graph (the official code does not).
    """

    def __init__(
        self,
        hidden: int,
        theta: float = 1.0,
        gamma: float = 0.5,
        alpha: float = 2.0,
        somatic_injection: bool = True,
        dendritic_spike: bool = True,
        detach_reset: bool = False,
    ) -> None:
        super().__init__(theta, alpha, detach_reset)
        if hidden < 1:
            raise ConfigError(f"model.hidden={hidden} must be >= 1")
        self.gamma = float(gamma)
        self.somatic_injection, self.dendritic_spike = bool(somatic_injection), bool(dendritic_spike)
        self.decay = nn.Parameter(torch.tensor(TSLIF_INIT_DECAY))
        self.kappa = nn.Parameter(torch.tensor(TSLIF_INIT_KAPPA))
        self.gamma_ds = nn.Parameter(torch.tensor(TSLIF_INIT_GAMMA_DS))
        self.alpha_s = nn.Parameter(torch.randn(hidden))
        self.alpha_d = nn.Parameter(torch.randn(hidden)) if dendritic_spike else None
        self.register_buffer("d_mask", torch.tensor([1.0, 1.0, 1.0, 1.0 if somatic_injection else 0.0]))

    def d(self) -> torch.Tensor:
        """Effective ``(d0, d1, d2, d3)`` with the ablation mask applied."""
        return self.decay * self.d_mask

    def alpha_d_eff(self) -> torch.Tensor:
        return self.alpha_d if self.alpha_d is not None else torch.zeros_like(self.alpha_s)

    def forward(self, x: torch.Tensor, return_states: bool = False):
        """``x``: ``[B, T, *, H]`` -> ``y`` of the same shape (and ``(v_d, v_s)`` traces after reset if asked).

        Training form: :func:`layers.spiking.scan.two_compartment_scan` (fused loop, hand-written BPTT); its naive
        twin is :func:`tslif_step`.
        """
        self._check(x)
        y, v_d, v_s = two_compartment_scan(
            x,
            self.d(),
            self.kappa,
            self.gamma_ds,
            self.alpha_s,
            self.alpha_d_eff(),
            self.theta,
            self.gamma,
            self.alpha,
            detach_reset=self.detach_reset,
        )
        return (y, v_d, v_s) if return_states else y

    def coefficients(self) -> dict[str, torch.Tensor]:
        return {"d": self.d(), "kappa": self.kappa, "gamma_ds": self.gamma_ds}


NEURONS = ("ts_lif", "lif", "tc_lif")


def make_neuron(
    name: str,
    hidden: int,
    theta: float = 1.0,
    alpha: float = 2.0,
    somatic_injection: bool = True,
    dendritic_spike: bool = True,
) -> nn.Module:
    """Build a neuron by name (``ts_lif``, ``lif``, ``tc_lif``); the ablation flags apply to ``ts_lif`` only."""
    if name == "ts_lif":
        return TSLIFNeuron(
            hidden, theta=theta, alpha=alpha, somatic_injection=somatic_injection, dendritic_spike=dendritic_spike
        )
    if name == "lif":
        return LIFNeuron(theta=theta, alpha=alpha)
    if name == "tc_lif":
        return TCLIFNeuron(theta=theta, alpha=alpha)
    raise ConfigError(f"model.neuron={name!r} must be one of {list(NEURONS)}")
