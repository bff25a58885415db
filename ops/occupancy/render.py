"""Differentiable volume rendering of a voxel volume along rays (PreWorld Sec. 3.2, RenderOcc/DVGO style).

Rays are sampled in the unbounded-contracted space of DVGO/Mip-NeRF360: origins are normalised by the scene centre
and radius, samples sit at the midpoints of the bins ``linspace(0, 2, n_inner + 1)`` (inner) and
``2 / linspace(1, 1/64, n_outer + 1)`` beyond (outer), as in the official ``sample_ray``, and a point with
``|p| > 1`` is contracted to ``p / |p| * ((1 + bg) - bg / |p|)`` with the official background length
``bg = (half-extent - radius) / radius`` (1/39 for radius 39 of a 40 m grid), so that the contracted space fills
the grid. The volume's attributes are read at the (un-normalised) contracted points by trilinear interpolation, then

    alpha_i = 1 - (1 + exp(sigma_i + shift)) ** (-interval)                  (raw2alpha, DVGO Eq. 4)
    w_i     = alpha_i * prod_{j<i} (1 - alpha_j)                              (alphas_to_weights)
    D       = sum_i w_i * d_i                                                 (rendered depth, Eq. 5 with d for c)
    S, C    = sum_i w_i * semantic_logits_i,  sum_i w_i * rgb_i              (Eq. 5 of the paper)

with the per-sample depth ``d_i`` of one of two conventions (:data:`DEPTH_MODES`):

* ``contracted`` (default): the metric distance from the ray origin to the point where the volume is read,
  ``|center + radius * contract(o' + t d) - o|``. It equals ``radius * t`` inside the ball and stays within the grid
  outside it, so a surface in the contracted shell renders at its grid distance and leftover background weight
  cannot inflate the depth beyond the grid;
* ``official``: ``radius * t / (1 + t)`` (the official ``render_depth``, ``s = 1 - 1/(1 + t)``), a normalised
  distance carried over from RenderOcc/DVGO and compared there with metric LiDAR depth.

All functions work on a dense ``[R, S]`` layout (R rays, S samples per ray) so that the exclusive cumulative
product replaces the CUDA segment kernel of the official code; ``naive.py`` holds the loop twins.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ALPHA_INIT_SHIFT = math.log(1.0 / (1.0 - 1e-6) - 1.0)  # official `act_shift`: alpha ~ 1e-6 at sigma = 0


def contract(p: torch.Tensor, bg_len: float) -> torch.Tensor:
    """Scene contraction: identity inside the unit ball, ``p/|p| * ((1 + bg) - bg/|p|)`` outside. [..., 3]."""
    norm = p.norm(dim=-1, keepdim=True)
    safe = norm.clamp_min(1.0)
    outer = p / safe * ((1.0 + bg_len) - bg_len / safe)
    return torch.where(norm > 1.0, outer, p)


DEPTH_MODES = ("contracted", "official")


def background_length(pc_range: tuple[float, ...], radius: float) -> float:
    """Official background length ``(half-extent - radius) / radius`` of ``NerfHead`` (x half-extent of
    ``pc_range``): the contracted shell ``[radius, radius (1 + bg)]`` then ends at the grid's edge."""
    half = (pc_range[3] - pc_range[0]) / 2.0
    if not half > radius > 0:
        raise ValueError(f"radius={radius} must be in (0, {half}), the grid's half-extent, for a background length")
    return (half - radius) / radius


def ray_bins(n_inner: int, n_outer: int | None = None, device=None, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Bin edges ``(lo, hi)`` [S] in normalised units: ``linspace(0, 2, n_inner + 1)`` then
    ``2 / linspace(1, 1/64, n_outer + 1)`` (``n_outer`` defaults to ``n_inner // 15`` as in the official code)."""
    n_outer = max(1, n_inner // 15) if n_outer is None else n_outer
    inner = torch.linspace(0.0, 2.0, n_inner + 1, device=device, dtype=dtype)
    outer = 2.0 / torch.linspace(1.0, 1.0 / 64.0, n_outer + 1, device=device, dtype=dtype)
    return torch.cat([inner[:-1], outer[:-1]]), torch.cat([inner[1:], outer[1:]])


def ray_distances(n_inner: int, n_outer: int | None = None, device=None, dtype=None) -> torch.Tensor:
    """Sample distances ``t`` [S = n_inner + n_outer] in normalised units: the midpoints of :func:`ray_bins`, as
    the official ``sample_ray`` places them."""
    lo, hi = ray_bins(n_inner, n_outer, device, dtype)
    return (lo + hi) / 2


def sample_ray_points(
    origins: torch.Tensor,
    dirs: torch.Tensor,
    t: torch.Tensor,
    center: torch.Tensor,
    radius: float,
    bg_len: float,
) -> torch.Tensor:
    """Contracted sample points in world units. origins/dirs [R, 3] (world; dirs unit), t [S] -> [R, S, 3].

    ``o' = (o - center) / radius``; ``q = contract(o' + t d)``; returned as ``center + radius * q`` so the volume is
    read where the world point (inside the ball) or its contracted image (outside) falls."""
    o = (origins - center) / radius
    q = contract(o[:, None, :] + t[None, :, None] * dirs[:, None, :], bg_len)
    return center + radius * q


def world_to_grid(points: torch.Tensor, pc_range: tuple[float, ...]) -> torch.Tensor:
    """World points [..., 3] -> ``grid_sample`` coordinates in [-1, 1] (align_corners=False: voxel centres), ordered
    (z, y, x) for a volume stored as ``[B, C, X, Y, Z]``."""
    lo = points.new_tensor(pc_range[:3])
    hi = points.new_tensor(pc_range[3:])
    g = 2.0 * (points - lo) / (hi - lo) - 1.0
    return g.flip(-1)


def sample_volume(volume: torch.Tensor, points: torch.Tensor, pc_range: tuple[float, ...]) -> torch.Tensor:
    """Trilinear read of ``volume`` [B, C, X, Y, Z] at world ``points`` [B, N, 3] -> [B, N, C] (zero outside)."""
    g = world_to_grid(points, pc_range)[:, :, None, None, :]  # [B, N, 1, 1, 3]
    out = F.grid_sample(volume, g, mode="bilinear", padding_mode="zeros", align_corners=False)  # [B, C, N, 1, 1]
    return out[..., 0, 0].transpose(1, 2)


def raw2alpha(sigma: torch.Tensor, shift: float = ALPHA_INIT_SHIFT, interval: float = 0.5) -> torch.Tensor:
    """``alpha = 1 - (1 + exp(sigma + shift)) ** (-interval)``, computed as ``1 - exp(-interval softplus(.))``."""
    return -torch.expm1(-interval * F.softplus(sigma + shift))


def alphas_to_weights(alpha: torch.Tensor, threshold: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights ``w_i = alpha_i prod_{j<i}(1 - alpha_j)`` and the background transmittance ``T_last``.

    alpha [R, S] -> (w [R, S], T_last [R]). ``threshold`` > 0 drops samples whose alpha or weight is below it
    (official: 1e-7) by zeroing their weight; transmittance keeps every sample."""
    trans = torch.cumprod(torch.cat([alpha.new_ones(alpha.shape[0], 1), 1.0 - alpha], dim=1), dim=1)
    w = alpha * trans[:, :-1]
    if threshold > 0:
        w = w * ((alpha >= threshold) & (w >= threshold)).to(w.dtype)
    return w, trans[:, -1]


def render_values(w: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``sum_i w_i v_i``: w [R, S], values [R, S, C] -> [R, C]."""
    return torch.einsum("rs,rsc->rc", w, values)


def sample_depths(t: torch.Tensor, points: torch.Tensor, origins: torch.Tensor, radius: float, mode: str):
    """Per-sample depth [R, S] of one of :data:`DEPTH_MODES` (module docstring): t [S] normalised distances,
    points [R, S, 3] the contracted world points of :func:`sample_ray_points`, origins [R, 3] world."""
    if mode == "contracted":
        return (points - origins[:, None, :]).norm(dim=-1)
    if mode == "official":
        return (radius * t / (1.0 + t))[None, :].expand(points.shape[0], -1)
    raise ValueError(f"depth_mode={mode!r} must be one of {list(DEPTH_MODES)}")


def render_depth(w: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
    """Rendered depth [R]: ``sum_i w_i d_i``, w [R, S], per-sample depths [R, S] of :func:`sample_depths`."""
    return (w * depths).sum(-1)


def render_rays(
    volume: torch.Tensor,
    origins: torch.Tensor,
    dirs: torch.Tensor,
    pc_range: tuple[float, ...],
    center: tuple[float, float, float],
    radius: float,
    bg_len: float | None = None,
    n_inner: int = 32,
    interval: float = 0.5,
    threshold: float = 0.0,
    depth_mode: str = "contracted",
) -> dict[str, torch.Tensor]:
    """Render a volume of raw attributes along rays.

    Args:
        volume: [B, 1 + C_sem + 3, X, Y, Z]: raw density, semantic logits, RGB (already activated by the heads).
        origins, dirs: [B, R, 3] world rays (dirs unit length).
        bg_len: background length; ``None`` is the official :func:`background_length` of ``pc_range``.
        depth_mode: per-sample depth convention (:data:`DEPTH_MODES`).
    Returns:
        ``depth`` [B, R], ``semantic`` [B, R, C_sem], ``rgb`` [B, R, 3], ``weights`` [B, R, S], ``t_last`` [B, R],
        and for the distortion loss ``s`` [S] (sample positions in ``s = t/(1+t)``) and ``s_interval`` [S] (their
        bin lengths in s).
    """
    b, r, _ = origins.shape
    if bg_len is None:
        bg_len = background_length(pc_range, radius)
    t = ray_distances(n_inner, device=volume.device, dtype=volume.dtype)
    c = volume.new_tensor(center)
    o = origins.reshape(-1, 3)
    pts = sample_ray_points(o, dirs.reshape(-1, 3), t, c, radius, bg_len)  # [B*R, S, 3]
    feats = sample_volume(volume, pts.reshape(b, -1, 3), pc_range).reshape(b * r, t.numel(), -1)
    alpha = raw2alpha(feats[..., 0], interval=interval)
    w, t_last = alphas_to_weights(alpha, threshold)
    n_sem = volume.shape[1] - 4
    lo, hi = ray_bins(n_inner, device=volume.device, dtype=volume.dtype)
    return {
        "depth": render_depth(w, sample_depths(t, pts, o, radius, depth_mode)).reshape(b, r),
        "semantic": render_values(w, feats[..., 1 : 1 + n_sem]).reshape(b, r, n_sem),
        "rgb": render_values(w, feats[..., 1 + n_sem :]).reshape(b, r, 3),
        "weights": w.reshape(b, r, -1),
        "t_last": t_last.reshape(b, r),
        "s": t / (1.0 + t),
        "s_interval": hi / (1.0 + hi) - lo / (1.0 + lo),
    }
