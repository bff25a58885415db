"""PreWorld's losses: the 2D rendering losses of pre-training and the 3D occupancy losses of fine-tuning.

2D (Sec. 3.2, RenderOcc): SILog depth, class-weighted CE on rendered semantics, L1 colour, the entropy of the
background transmittance and the Mip-NeRF360 distortion loss (O(n) form of ``torch_efficient_distloss``).
3D (Sec. 3.4, BEVDet-Occ/MonoScene): class-weighted focal CE, scene-class affinity ``sem_scal``/``geo_scal`` and
Lovasz-softmax (Berman et al. 2018). Loop twins live in ``naive.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silog(est: torch.Tensor, gt: torch.Tensor, lam: float = 0.85, eps: float = 1e-6) -> torch.Tensor:
    """Scale-invariant log depth loss ``sqrt(mean d^2 - lam (mean d)^2)``, ``d = log est - log gt`` (Eigen 2014)."""
    d = torch.log(est.clamp_min(eps)) - torch.log(gt.clamp_min(eps))
    return torch.sqrt((d.pow(2).mean() - lam * d.mean().pow(2)).clamp_min(1e-12))


def class_weights(freqs: torch.Tensor) -> torch.Tensor:
    """Rendering CE class weights ``1 / log(freq + 1e-3)`` from per-class (voxel or point) counts."""
    return 1.0 / torch.log(freqs.to(torch.float64) + 1e-3)


def weighted_ce(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, ignore_index: int = 255):
    """Class-weighted cross-entropy (weighted mean over non-ignored rays). logits [N, C], target [N]."""
    return F.cross_entropy(logits, target, weight=weight.to(logits.dtype), ignore_index=ignore_index)


def l1_color(rgb: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
    """Sum over the 3 channels of the mean absolute error. [N, 3]."""
    return (rgb - gt).abs().mean(0).sum()


def background_entropy(t_last: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Mean binary entropy of the background transmittance ``T_last`` (pushes each ray to all-or-nothing)."""
    p = t_last.clamp(eps, 1.0 - eps)
    return -(p * torch.log(p) + (1.0 - p) * torch.log(1.0 - p)).mean()


def distortion_loss(w: torch.Tensor, s: torch.Tensor, interval: torch.Tensor | float) -> torch.Tensor:
    """Mip-NeRF360 distortion ``sum_ij w_i w_j |m_i - m_j| + 1/3 sum_i w_i^2 delta_i``, mean over rays, in O(S).

    w [R, S] weights, s [S] or [R, S] sorted sample midpoints, interval scalar/[S]/[R, S] sample lengths. Uses
    ``sum_ij w_i w_j |m_i - m_j| = 2 sum_i w_i (m_i W_<i - (wm)_<i)`` with exclusive prefix sums."""
    s = s.expand_as(w)
    wm = w * s
    w_prefix = torch.cumsum(w, dim=-1) - w
    wm_prefix = torch.cumsum(wm, dim=-1) - wm
    bi = 2.0 * (w * (s * w_prefix - wm_prefix)).sum(-1)
    uni = (w.pow(2) * interval).sum(-1) / 3.0
    return (bi + uni).mean()


def focal_ce(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None, gamma: float = 2.0,
    ignore_index: int = 255,
) -> torch.Tensor:  # fmt: skip
    """Class-weighted focal cross-entropy ``-w_y (1 - p_y)^gamma log p_y``, weighted mean. logits [N, C]."""
    keep = target != ignore_index
    logits, target = logits[keep], target[keep]
    if target.numel() == 0:
        return logits.sum() * 0.0
    logp = F.log_softmax(logits, dim=-1).gather(1, target[:, None])[:, 0]
    wy = torch.ones_like(logp) if weight is None else weight.to(logits.dtype)[target]
    return (-(wy * (1.0 - logp.exp()).pow(gamma) * logp)).sum() / wy.sum()


def sem_scal(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = 255) -> torch.Tensor:
    """MonoScene scene-class affinity loss on semantics: per class present, BCE of precision, recall and
    specificity against 1, averaged over those classes. logits [N, C], target [N]."""
    keep = target != ignore_index
    p = F.softmax(logits[keep], dim=-1)
    y = F.one_hot(target[keep], logits.shape[-1]).to(p.dtype)
    tp = (p * y).sum(0)
    ps, ys = p.sum(0), y.sum(0)
    present = ys > 0
    if not present.any():
        return logits.sum() * 0.0
    prec = tp / ps.clamp_min(1e-12)
    rec = tp / ys.clamp_min(1e-12)
    neg_true = ((1 - p) * (1 - y)).sum(0)
    spec = neg_true / (1 - y).sum(0).clamp_min(1e-12)

    def bce1(x):  # BCE against target 1 = -log x (clamped)
        return -torch.log(x.clamp(1e-7, 1.0))

    loss = torch.zeros_like(tp)
    loss = loss + torch.where(ps > 0, bce1(prec), torch.zeros_like(tp))
    loss = loss + bce1(rec)
    has_neg = (1 - y).sum(0) > 0
    loss = loss + torch.where(has_neg, bce1(spec), torch.zeros_like(tp))
    return loss[present].mean()


def geo_scal(logits: torch.Tensor, target: torch.Tensor, empty_class: int, ignore_index: int = 255) -> torch.Tensor:
    """MonoScene geometry affinity loss: precision, recall and specificity of 'occupied' (``1 - p_empty``)."""
    keep = target != ignore_index
    p_occ = 1.0 - F.softmax(logits[keep], dim=-1)[:, empty_class]
    y = (target[keep] != empty_class).to(p_occ.dtype)
    tp = (p_occ * y).sum()
    prec = tp / p_occ.sum().clamp_min(1e-12)
    rec = tp / y.sum().clamp_min(1e-12)
    spec = ((1 - p_occ) * (1 - y)).sum() / (1 - y).sum().clamp_min(1e-12)
    return -(torch.log(prec.clamp(1e-7, 1)) + torch.log(rec.clamp(1e-7, 1)) + torch.log(spec.clamp(1e-7, 1)))


def lovasz_grad(gt_sorted: torch.Tensor) -> torch.Tensor:
    """Gradient of the Lovasz extension of the Jaccard loss w.r.t. sorted errors (Berman et al., Alg. 1)."""
    gts = gt_sorted.sum()
    inter = gts - gt_sorted.cumsum(0)
    union = gts + (1 - gt_sorted).cumsum(0)
    jac = 1.0 - inter / union
    if gt_sorted.numel() > 1:
        jac = torch.cat([jac[:1], jac[1:] - jac[:-1]])
    return jac


def lovasz_softmax(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = 255) -> torch.Tensor:
    """Lovasz-softmax over the classes present (Berman et al. 2018, Eq. 12). logits [N, C], target [N]."""
    keep = target != ignore_index
    p = F.softmax(logits[keep], dim=-1)
    y = target[keep]
    losses = []
    for c in range(p.shape[1]):
        fg = (y == c).to(p.dtype)
        if fg.sum() == 0:
            continue
        err = (fg - p[:, c]).abs()
        err_sorted, perm = torch.sort(err, descending=True)
        losses.append(torch.dot(err_sorted, lovasz_grad(fg[perm])))
    return torch.stack(losses).mean() if losses else logits.sum() * 0.0


def trajectory_loss(pred: torch.Tensor, gt: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Sum over the 2 coordinates of the mean squared waypoint error. pred/gt [N, 2], valid [N] bool."""
    if valid is not None:
        pred, gt = pred[valid], gt[valid]
    if pred.numel() == 0:
        return pred.sum() * 0.0
    return (pred - gt).pow(2).mean(0).sum()
