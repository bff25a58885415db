"""PreWorld's losses: the 2D rendering losses of pre-training and the 3D occupancy losses of fine-tuning.

2D (Sec. 3.2, RenderOcc): SILog depth, class-weighted CE on rendered semantics, L1 colour, the entropy of the
background transmittance and the Mip-NeRF360 distortion loss (O(n) form of ``torch_efficient_distloss``).
3D (Sec. 3.4, BEVDet-Occ/MonoScene): class-weighted focal CE, scene-class affinity ``sem_scal``/``geo_scal`` and
Lovasz-softmax (Berman et al. 2018). The official 3D forms are here too: the sigmoid focal loss of its
``CustomFocalLoss`` (:func:`sigmoid_focal`, with :func:`radial_weight`) and a Lovasz term without free voxels
(``drop_class``). Trajectory: the official per-step L2 terms summed over steps (:func:`trajectory_loss`).
Loop twins live in ``naive.py``.
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
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    gamma: float = 2.0,
    ignore_index: int = 255,
) -> torch.Tensor:
    """Class-weighted focal cross-entropy ``-w_y (1 - p_y)^gamma log p_y``, weighted mean. logits [N, C]."""
    keep = target != ignore_index
    logits, target = logits[keep], target[keep]
    if target.numel() == 0:
        return logits.sum() * 0.0
    logp = F.log_softmax(logits, dim=-1).gather(1, target[:, None])[:, 0]
    wy = torch.ones_like(logp) if weight is None else weight.to(logits.dtype)[target]
    return (-(wy * (1.0 - logp.exp()).pow(gamma) * logp)).sum() / wy.sum()


def radial_weight(x: int, y: int, device=None, dtype=None) -> torch.Tensor:
    """Official per-voxel weight of ``CustomFocalLoss`` [X, Y]: ``1 + r / r_max`` with r the distance of the voxel
    index (i, j) from (X/2, Y/2), so 1 at the ego and 2 at the grid's corner (far voxels count up to twice)."""
    i = torch.arange(x, device=device, dtype=dtype or torch.get_default_dtype()) - x / 2
    j = torch.arange(y, device=device, dtype=i.dtype) - y / 2
    r = torch.sqrt(i[:, None] ** 2 + j[None, :] ** 2)
    return 1.0 + r / r.max().clamp_min(1e-12)


def sigmoid_focal(
    logits: torch.Tensor,
    target: torch.Tensor,
    class_weight: torch.Tensor,
    voxel_weight: torch.Tensor | None = None,
    gamma: float = 2.0,
    alpha: float = 0.25,
    scale: float = 100.0,
    ignore_index: int = 255,
) -> torch.Tensor:
    """Official 3D focal loss (``CustomFocalLoss``, sigmoid focal loss of Lin et al. 2017 over one-hot channels):

        scale * mean_i sum_c  w_c r_i a_t (1 - p_t)^gamma BCE(sigmoid(z_ic), y_ic),
        p_t = p if y = 1 else 1 - p,  a_t = alpha if y = 1 else 1 - alpha,

    over non-ignored voxels i. ``class_weight`` [C] weights each class *channel* for every voxel (the official
    passes ``1/log(freq + 1e-3)`` with 0 for the free class, so the free logit gets no focal gradient);
    ``voxel_weight`` [N] is :func:`radial_weight` per voxel (official), ones if None; ``scale`` is the official
    ``loss_weight`` 100. logits [N, C], target [N]."""
    keep = target != ignore_index
    z, y = logits[keep], target[keep]
    if y.numel() == 0:
        return logits.sum() * 0.0
    onehot = F.one_hot(y, z.shape[-1]).to(z.dtype)
    p = torch.sigmoid(z)
    p_t = onehot * p + (1 - onehot) * (1 - p)
    a_t = onehot * alpha + (1 - onehot) * (1 - alpha)
    bce = F.binary_cross_entropy_with_logits(z, onehot, reduction="none")
    w = class_weight.to(z.dtype)[None, :]
    if voxel_weight is not None:
        w = w * voxel_weight.to(z.dtype)[keep][:, None]
    return scale * (w * a_t * (1 - p_t).pow(gamma) * bce).sum(-1).mean()


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


def lovasz_softmax(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int = 255, drop_class: int | None = None
) -> torch.Tensor:
    """Lovasz-softmax over the classes present (Berman et al. 2018, Eq. 12). logits [N, C], target [N].

    ``drop_class`` (official: the free class, ``lovasz_softmax(..., ignore=17)``) removes the voxels of that label
    as well; the softmax still runs over all C classes, and the dropped class, never present, adds no term."""
    keep = target != ignore_index
    if drop_class is not None:
        keep = keep & (target != drop_class)
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
    """Trajectory loss (Sec. 3.3): per forecast step k, the sum over the 2 coordinates of the mean squared waypoint
    error over the batch, added over the steps (official: one ``loss_traj_{k}s`` term per step, summed by mmdet's
    loss parser).

    pred/gt [B, K, 2] (or [N, 2]: one step), valid [B, K] (or [N]) bool: invalid waypoints are left out."""
    if pred.dim() == 2:
        pred, gt = pred[:, None], gt[:, None]
        valid = None if valid is None else valid[:, None]
    if valid is None:
        valid = torch.ones(pred.shape[:2], dtype=torch.bool, device=pred.device)
    terms = []
    for k in range(pred.shape[1]):
        ok = valid[:, k]
        if ok.any():
            terms.append((pred[ok, k] - gt[ok, k]).pow(2).mean(0).sum())
    if not terms:
        return pred.sum() * 0.0
    return torch.stack(terms).sum()
