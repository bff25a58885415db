"""Training form of the spiking neurons: one fused recurrence with a hand-written backward pass (BPTT).

The naive twins are the per-step functions of :mod:`layers.spiking.neurons` (``tslif_step``, ``tclif_step``,
``lif_step``) differentiated by autograd; ``tests/layers/test_spiking.py`` checks outputs, states and gradients of
this scan against them in float64.

Why: run step by step under autograd, every time step of TS-LIF records about fifteen small autograd nodes (two of
them Python ``autograd.Function`` calls for the spikes), and the recurrence over the window dominated a training step
(about 3x the cost of the rest of the GRU-cell model on CPU). Here the forward loop runs without a graph (about ten
in-place tensor ops per step), every quantity that does not carry the recurrence (input drives, outputs, surrogate
derivatives, parameter gradients) is computed for all steps at once, and the backward loop carries only the two
potential gradients.

One generic two-compartment recurrence covers all three neurons (TS-LIF notation, Eqs. (6)-(10) of
``docs/methods/ts_lif.md``)::

    p_d[t] = d0 v_d[t-1] + d1 x[t] - gamma_ds v_s[t-1]        (dendrite, pre-reset)
    p_s[t] = d2 v_s[t-1] + d3 x[t] - kappa p_d[t]             (soma, uses the new dendrite)
    s_s = H(p_s - theta),  s_d = H(p_d - theta)                (ATan surrogate in the backward pass)
    y[t] = a_s * s_s + a_d * s_d
    v_s[t] = p_s - theta s_s,  v_d[t] = p_d - gamma r          (soft reset; r = s_d, or s_s for TC-LIF)

* TS-LIF: as written (``reset_dendrite_by="dendrite"``).
* TC-LIF: ``d = (1, 1, 1, 0)``, ``gamma_ds = -beta_1``, ``kappa = -beta_2``, ``a_s = 1``, ``a_d = 0``, and the
  somatic spike resets the dendrite (``reset_dendrite_by="soma"``).
* LIF: the dendrite alone (``d0 = beta``, ``d1 = 1``, ``gamma = theta``, ``a_d = 1``); the soma is switched off
  (``soma=False``), so no ops are spent on it.

Backward, with ``g_vd, g_vs`` the gradients w.r.t. the post-reset potentials carried from step ``t+1`` (plus any
gradient on the returned states at ``t``), and ``sg`` the ATan surrogate derivative (the loop itself only does the
products with ``g_vd, g_vs``; the ``g_y`` terms and the ``sg`` factors are formed for all steps before it)::

    g_ss = g_y a_s - theta g_vs [- gamma g_vd for TC-LIF]      (reset terms dropped if detach_reset)
    g_sd = g_y a_d - gamma g_vd
    g_ps = g_vs + g_ss sg(p_s - theta)
    g_pd = g_vd + g_sd sg(p_d - theta) - kappa g_ps
    g_vd[t-1] = d0 g_pd,   g_vs[t-1] = d2 g_ps - gamma_ds g_pd

and then, for all steps at once, ``g_x = d1 g_pd + d3 g_ps``, ``g_d0 = sum g_pd v_d[t-1]``, ``g_d1 = sum g_pd x``,
``g_gamma_ds = -sum g_pd v_s[t-1]``, ``g_d2 = sum g_ps v_s[t-1]``, ``g_d3 = sum g_ps x``, ``g_kappa = -sum g_ps p_d``,
``g_a_s = sum g_y s_s``, ``g_a_d = sum g_y s_d``.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from layers.spiking.surrogate import atan_surrogate_grad


def _shift(v: torch.Tensor) -> torch.Tensor:
    """``[T, ...]`` -> the previous step's values ``v[t-1]`` with zeros at ``t = 0`` (states start at rest)."""
    return torch.cat([torch.zeros_like(v[:1]), v[:-1]])


def _reduce_to(g: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Sum a broadcast gradient back to the shape of ``like`` (a scalar or per-channel parameter)."""
    return g.sum_to_size(like.shape) if like.dim() else g.sum()


class _TwoCompartmentScan(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: torch.Tensor,
        coef: torch.Tensor,
        a_s: torch.Tensor,
        a_d: torch.Tensor,
        theta: float,
        gamma: float,
        alpha: float,
        soma: bool,
        reset_by_soma: bool,
        detach_reset: bool,
    ):
        d0, d1, d2, d3, kappa, gamma_ds = coef.tolist()
        xt = x.movedim(1, 0)  # [T, B, *, H]
        steps = xt.shape[0]
        drive_d = xt * d1
        drive_s = xt * d3 if soma else None
        p_d = torch.empty_like(xt)  # pre-reset potentials of every step
        p_s = torch.empty_like(xt) if soma else None
        s_d = torch.empty_like(xt)
        s_s = torch.empty_like(xt) if soma else None
        v_d = torch.zeros_like(xt[0])
        v_s = torch.zeros_like(xt[0])
        for t in range(steps):
            pd = torch.add(drive_d[t], v_d, alpha=d0, out=p_d[t])
            if soma:
                pd.sub_(v_s, alpha=gamma_ds)
                ps = torch.add(drive_s[t], v_s, alpha=d2, out=p_s[t]).sub_(pd, alpha=kappa)
                torch.ge(ps, theta, out=s_s[t])
                v_s = torch.sub(ps, s_s[t], alpha=theta)
            torch.ge(pd, theta, out=s_d[t])
            v_d = torch.sub(pd, s_s[t] if reset_by_soma else s_d[t], alpha=gamma)
        y = a_d * s_d
        if soma:
            y = y + a_s * s_s
        post_d = p_d - gamma * (s_s if reset_by_soma else s_d)
        post_s = p_s - theta * s_s if soma else torch.zeros_like(xt)
        ctx.save_for_backward(x, coef, a_s, a_d, p_d, s_d, *((p_s, s_s) if soma else ()))
        ctx.cfg = (theta, gamma, alpha, soma, reset_by_soma, detach_reset)
        ctx.set_materialize_grads(False)  # unused outputs give None: no all-zero gradients to add in the loop
        return y.movedim(0, 1), post_d.movedim(0, 1), post_s.movedim(0, 1)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_y: torch.Tensor, g_post_d: torch.Tensor | None, g_post_s: torch.Tensor | None):  # type: ignore[override]
        theta, gamma, alpha, soma, reset_by_soma, detach_reset = ctx.cfg
        x, coef, a_s, a_d, p_d, s_d, *rest = ctx.saved_tensors
        p_s, s_s = rest if soma else (None, None)
        d0, d1, d2, d3, kappa, gamma_ds = coef.tolist()
        g_y = g_y.movedim(1, 0) if g_y is not None else torch.zeros_like(p_d)
        g_post_d = g_post_d.movedim(1, 0) if g_post_d is not None else None
        g_post_s = g_post_s.movedim(1, 0) if (g_post_s is not None and soma) else None
        keep = 0.0 if detach_reset else 1.0  # the reset's own gradient is dropped when it is detached
        # Everything that does not carry the recurrence, for all steps at once:
        #   g_ps = g_vs c_s + g_y a_s sg_s [+ g_vd m_s],  g_pd = g_vd c_d + g_y a_d sg_d - kappa g_ps
        sg_d = atan_surrogate_grad(p_d - theta, alpha)
        gy_d = g_y * a_d * sg_d
        c_d = 1 - (0.0 if reset_by_soma else gamma * keep) * sg_d
        if soma:
            sg_s = atan_surrogate_grad(p_s - theta, alpha)
            gy_s = g_y * a_s * sg_s
            c_s = 1 - theta * keep * sg_s
            m_s = -gamma * keep * sg_s if reset_by_soma else None
        g_pd = torch.empty_like(p_d)
        g_ps = torch.empty_like(p_d) if soma else None
        g_vd = torch.zeros_like(p_d[0])
        g_vs = torch.zeros_like(p_d[0])
        for t in range(p_d.shape[0] - 1, -1, -1):
            if g_post_d is not None:
                g_vd = g_vd + g_post_d[t]
            if soma:
                if g_post_s is not None:
                    g_vs = g_vs + g_post_s[t]
                gps = torch.addcmul(gy_s[t], g_vs, c_s[t], out=g_ps[t])
                if reset_by_soma:
                    gps.addcmul_(g_vd, m_s[t])
                gpd = torch.addcmul(gy_d[t], g_vd, c_d[t], out=g_pd[t]).sub_(gps, alpha=kappa)
                g_vs = gps.mul(d2).sub_(gpd, alpha=gamma_ds)
            else:
                gpd = torch.addcmul(gy_d[t], g_vd, c_d[t], out=g_pd[t])
            g_vd = gpd.mul(d0)
        v_d_prev = _shift(p_d - gamma * (s_s if reset_by_soma else s_d))
        xt = x.movedim(1, 0)
        g_x = g_pd * d1
        grads = [g_pd.mul(v_d_prev).sum(), g_pd.mul(xt).sum()]
        if soma:
            v_s_prev = _shift(p_s - theta * s_s)
            g_x = g_x.add_(g_ps, alpha=d3)
            grads += [g_ps.mul(v_s_prev).sum(), g_ps.mul(xt).sum(), -g_ps.mul(p_d).sum(), -g_pd.mul(v_s_prev).sum()]
            g_as = _reduce_to(g_y * s_s, a_s) if ctx.needs_input_grad[2] else None
        else:
            grads += [torch.zeros_like(grads[0])] * 4
            g_as = None
        g_coef = torch.stack(grads) if ctx.needs_input_grad[1] else None
        g_ad = _reduce_to(g_y * s_d, a_d) if ctx.needs_input_grad[3] else None
        return g_x.movedim(0, 1), g_coef, g_as, g_ad, None, None, None, None, None, None


def two_compartment_scan(
    x: torch.Tensor,
    d: torch.Tensor,
    kappa: torch.Tensor,
    gamma_ds: torch.Tensor,
    a_s: torch.Tensor,
    a_d: torch.Tensor,
    theta: float = 1.0,
    gamma: float = 0.5,
    alpha: float = 2.0,
    soma: bool = True,
    reset_dendrite_by: str = "dendrite",
    detach_reset: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the two-compartment recurrence (module docstring) from rest over ``x [B, T, *, H]``.

    Args:
        d: ``(d0, d1, d2, d3)``; kappa, gamma_ds: scalar couplings (0-dim tensors; any may require grad).
        a_s, a_d: Output weights of somatic and dendritic spikes, scalars or ``[H]``.
        soma: ``False`` keeps only the dendrite (LIF); its spikes are then the output.
        reset_dendrite_by: ``"dendrite"`` (TS-LIF: ``v_d -= gamma s_d``) or ``"soma"`` (TC-LIF: ``v_d -= gamma s_s``).
        detach_reset: Treat the reset as a constant in the backward pass (snntorch's LIF).

    Returns:
        ``(y, v_d, v_s)``, each ``[B, T, *, H]``; the potentials are after the reset (``v_s`` is zero without soma).
    """
    if reset_dendrite_by not in ("dendrite", "soma"):
        raise ValueError(f"reset_dendrite_by={reset_dendrite_by!r} must be 'dendrite' or 'soma'")
    if reset_dendrite_by == "soma" and not soma:
        raise ValueError("reset_dendrite_by='soma' needs soma=True")
    coef = torch.stack([d[0], d[1], d[2], d[3], kappa, gamma_ds]).to(x.dtype)
    return _TwoCompartmentScan.apply(
        x,
        coef,
        a_s.to(x.dtype),
        a_d.to(x.dtype),
        float(theta),
        float(gamma),
        float(alpha),
        bool(soma),
        reset_dendrite_by == "soma",
        bool(detach_reset),
    )
