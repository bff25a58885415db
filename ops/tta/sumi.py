"""SuMi's objective as pure functions (Guo & Jin, ICLR 2025, "Smoothing the Shift").

SuMi adapts the LayerNorm affine parameters of an audio-visual classifier on a test stream. Per batch of ``B``
samples it uses three forward passes: the multimodal logits ``z_mm`` and the two unimodal logits ``z_a``, ``z_v``
(zero placeholders for the other modality), plus the per-modality token features ``F_a``, ``F_v``.

* **Interquartile-range smoothing** (Eq. (3)): per feature dimension of ``f = [mean(F_a), mean(F_v)]`` the batch
  quartiles ``Q1``, ``Q3`` and ``IQR = Q3 - Q1`` give a fence ``[Q1 - k (t/T) IQR, Q3 + k (t/T) IQR]`` that widens
  with the step ``t`` of ``T``; a sample is kept when at least ``(rho + (1 - rho) t/T)`` of its dimensions lie
  inside (``k = 1.5``, ``rho = 0.6``).
* **Unimodal assistance** (Eq. (4)): keep samples whose unimodal entropy ``H_u = (H_a + mu H_v) / (1 + mu)`` is
  at least ``gamma_u`` while the multimodal entropy ``H_mm`` is at most ``gamma_m``.
* **Mutual information sharing** (Eq. (5)): ``MI = KL(m_a || p_a) + KL(m_v || p_v)`` with ``m_a = (p_v + p_mm)/2``
  and ``m_v = (p_a + p_mm)/2``.
* **Balance** (Eq. (6)): ``L_bal = H(softmax(sum_i p_mm,i))``, a diversity term that is subtracted.
* **Weighting** (Eq. (7)): ``L = mean_{i in S} exp(-(H_mm,i - E0)) (H_mm,i + lambda MI_i) - L_bal``.

Official-code quirks (``zrguo/SuMi`` ``src/sumi.py``), each behind a flag, paper behaviour by default:

* ``quartiles="minmax"``: the code's "quartiles" are ``min + 0.25 (max - min)`` and ``min + 0.75 (max - min)``,
  not order statistics (default ``"quantile"``: true batch quartiles, ``torch.quantile`` linear interpolation).
* ``faithful_second_half=True``: for ``t >= T/2`` the code replaces the per-sample loss by the scalar
  ``mean(H_mm)``, so the MI term is switched off and the weighting becomes ``mean(H) * mean(coeff)``.
* Thresholds: the code uses ``gamma_m = E0 = ln(1000)/2 - 1 = 2.454`` for every dataset; the paper says
  ``0.4 ln C``. Callers pass the value (``OFFICIAL_MARGIN`` is exported).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ops.tta.entropy import eata_weights, softmax_entropy

OFFICIAL_MARGIN = math.log(1000) / 2 - 1  # the code's gamma_m and E0 (2.4539)
OFFICIAL_GAMMA_U = math.e / 10  # the code's gamma_u (0.2718)
QUARTILES = ("quantile", "minmax")


def iqr_fence(
    feat: torch.Tensor, t: int, total: int, k: float = 1.5, quartiles: str = "quantile"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Time-dependent IQR fence of Eq. (3).

    Args:
        feat: ``[B, F]`` per-sample features.
        t: Step index in ``[0, total)``.
        total: Number of steps ``T`` of the stream.
        k: Tukey's multiplier reached at ``t = T``.
        quartiles: ``quantile`` (order statistics) or ``minmax`` (official code's linear points of the range).

    Returns:
        ``(lower, upper)``, each ``[F]``.
    """
    if quartiles == "quantile":
        q = torch.quantile(feat, torch.tensor([0.25, 0.75], dtype=feat.dtype, device=feat.device), dim=0)
        q1, q3 = q[0], q[1]
    elif quartiles == "minmax":
        mn, mx = feat.min(0).values, feat.max(0).values
        q1, q3 = mn + 0.25 * (mx - mn), mn + 0.75 * (mx - mn)
    else:
        raise ValueError(f"quartiles={quartiles!r} must be one of {list(QUARTILES)}")
    iqr = q3 - q1
    width = k * t / total * iqr
    return q1 - width, q3 + width


def iqr_smoothing_mask(
    feat: torch.Tensor,
    t: int,
    total: int,
    k: float = 1.5,
    min_keep: float = 0.6,
    quartiles: str = "quantile",
) -> torch.Tensor:
    """Samples kept by interquartile-range smoothing, Eq. (3).

    Args:
        feat: ``[B, F]`` features (detached by the caller or here: the mask carries no gradient).
        t: Step index in ``[0, total)``.
        total: Number of steps ``T``.
        k: Fence multiplier at ``t = T``.
        min_keep: Fraction of dimensions that must lie inside the fence at ``t = 0``; it grows linearly to 1.
        quartiles: See :func:`iqr_fence`.

    Returns:
        ``[B]`` bool mask.
    """
    feat = feat.detach()
    lower, upper = iqr_fence(feat, t, total, k, quartiles)
    inside = ((feat >= lower) & (feat <= upper)).sum(-1)
    return inside >= feat.shape[-1] * (min_keep + (1.0 - min_keep) * t / total)


def unimodal_assist_mask(
    ent_a: torch.Tensor,
    ent_v: torch.Tensor,
    ent_mm: torch.Tensor,
    mu: float = 1.0,
    gamma_u: float = OFFICIAL_GAMMA_U,
    gamma_m: float = OFFICIAL_MARGIN,
) -> torch.Tensor:
    """Unimodal-assistance selection, Eq. (4): ``H_u >= gamma_u`` and ``H_mm <= gamma_m``.

    Args:
        ent_a: ``[B]`` entropy of the audio-only prediction.
        ent_v: ``[B]`` entropy of the video-only prediction.
        ent_mm: ``[B]`` entropy of the multimodal prediction.
        mu: Weight of the video entropy in ``H_u = (H_a + mu H_v) / (1 + mu)``.
        gamma_u: Lower bound on the unimodal entropy.
        gamma_m: Upper bound on the multimodal entropy.

    Returns:
        ``[B]`` bool mask.
    """
    h_u = (ent_a.detach() + mu * ent_v.detach()) / (1.0 + mu)
    return (h_u >= gamma_u) & (ent_mm.detach() <= gamma_m)


def mutual_info_sharing(
    z_a: torch.Tensor, z_v: torch.Tensor, z_mm: torch.Tensor, detach_targets: bool = False
) -> torch.Tensor:
    """Mutual information sharing, Eq. (5): ``KL(m_a || p_a) + KL(m_v || p_v)`` per sample.

    ``m_a = (p_v + p_mm) / 2`` and ``m_v = (p_a + p_mm) / 2``. As in the official code the mixtures are not
    detached (``detach_targets=False``), so gradients also flow into the other predictions.

    Args:
        z_a, z_v, z_mm: ``[B, C]`` logits.
        detach_targets: Stop gradients through ``m_a`` and ``m_v``.

    Returns:
        ``[B]``.
    """
    p_a, p_v, p_mm = z_a.softmax(-1), z_v.softmax(-1), z_mm.softmax(-1)
    m_a, m_v = (p_v + p_mm) / 2, (p_a + p_mm) / 2
    if detach_targets:
        m_a, m_v = m_a.detach(), m_v.detach()
    kl_a = F.kl_div(z_a.log_softmax(-1), m_a, reduction="none").sum(-1)
    kl_v = F.kl_div(z_v.log_softmax(-1), m_v, reduction="none").sum(-1)
    return kl_a + kl_v


def balance_term(z_mm: torch.Tensor) -> torch.Tensor:
    """Balance (diversity) term, Eq. (6): entropy of ``softmax(sum_i p_mm,i)`` over classes.

    The official code applies a softmax to the *summed probabilities* (not a normalisation); we keep that.

    Args:
        z_mm: ``[B, C]`` multimodal logits of the selected samples.

    Returns:
        Scalar.
    """
    p_sum = z_mm.softmax(-1).sum(0)
    return -(p_sum.softmax(0) * p_sum.log_softmax(0)).sum()


@dataclass
class SumiStep:
    """What one SuMi step computed: the loss (``None`` when nothing was selected) and the selections."""

    loss: torch.Tensor | None
    selected: torch.Tensor  # [S] indices into the batch
    iqr_mask: torch.Tensor  # [B] bool
    entropy_mask: torch.Tensor  # [B] bool


def sumi_objective(
    z_a: torch.Tensor,
    z_v: torch.Tensor,
    z_mm: torch.Tensor,
    feat: torch.Tensor,
    t: int,
    total: int,
    *,
    lam: float = 5.0,
    mu: float = 1.0,
    gamma_u: float = OFFICIAL_GAMMA_U,
    gamma_m: float = OFFICIAL_MARGIN,
    e_margin: float = OFFICIAL_MARGIN,
    k: float = 1.5,
    min_keep: float = 0.6,
    quartiles: str = "quantile",
    use_iqr: bool = True,
    use_unimodal: bool = True,
    use_balance: bool = True,
    detach_mi_targets: bool = False,
    faithful_second_half: bool = False,
) -> SumiStep:
    """SuMi's loss for one batch, Eqs. (3)-(7).

    Args:
        z_a, z_v, z_mm: ``[B, C]`` audio-only, video-only and multimodal logits.
        feat: ``[B, F]`` concatenated mean token features of both modalities (Eq. (3)).
        t: Step index in ``[0, total)``.
        total: Number of steps ``T`` of the stream.
        lam: Weight ``lambda`` of the MI term (``0`` ablates it).
        mu, gamma_u, gamma_m: Unimodal-assistance parameters (Eq. (4)).
        e_margin: ``E0`` of the weights (Eq. (7)).
        k, min_keep, quartiles: IQR smoothing parameters (Eq. (3)).
        use_iqr: ``False`` ablates IQR smoothing (every sample passes it).
        use_unimodal: ``False`` ablates unimodal assistance; the multimodal reliability bound ``H_mm <= gamma_m``
            stays, so the ablation is an EATA-style filter.
        use_balance: Subtract the balance term.
        detach_mi_targets: Stop gradients through the MI mixtures (the code does not).
        faithful_second_half: Reproduce the code's ``t >= T/2`` switch to ``mean(H) * mean(coeff)``.

    Returns:
        :class:`SumiStep`.
    """
    ent_mm = softmax_entropy(z_mm)
    ent_a, ent_v = softmax_entropy(z_a).detach(), softmax_entropy(z_v).detach()
    b = z_mm.shape[0]
    iqr = (
        iqr_smoothing_mask(feat, t, total, k, min_keep, quartiles)
        if use_iqr
        else torch.ones(b, dtype=torch.bool, device=z_mm.device)
    )
    if use_unimodal:
        ent_ok = unimodal_assist_mask(ent_a, ent_v, ent_mm, mu, gamma_u, gamma_m)
    else:
        ent_ok = ent_mm.detach() <= gamma_m
    selected = torch.nonzero(iqr & ent_ok).flatten()
    if selected.numel() == 0:
        return SumiStep(None, selected, iqr, ent_ok)
    za, zv, zm, ent = z_a[selected], z_v[selected], z_mm[selected], ent_mm[selected]
    coeff = eata_weights(ent, e_margin)
    if faithful_second_half and t >= 0.5 * total:
        per_sample = ent.mean(0)  # scalar: the code's quirk, mean(H) * mean(coeff) after the broadcast below
    else:
        per_sample = ent + lam * mutual_info_sharing(za, zv, zm, detach_mi_targets) if lam else ent
    loss = (per_sample * coeff).mean(0)
    if use_balance:
        loss = loss - balance_term(zm)
    return SumiStep(loss, selected, iqr, ent_ok)
