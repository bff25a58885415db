"""PreWorld rendering and voxel pooling throughput, vectorised vs the loop twins, side by side in one run (one
thread):

* volume rendering forward + backward (trilinear read of density / semantics / RGB at contracted ray samples,
  raw2alpha, weights, rendered depth / semantics / RGB, a loss on them) in rays/s;
* lift-splat voxel pooling forward + backward in frustum points/s.

The goal is a ratio >= 20x. Sizes are small so that the loop twins finish; timings are noisy on a shared machine,
read the ratios. Run: ``python benchmarks/preworld_render.py``.
"""

from __future__ import annotations

import time

import torch

from ops.occupancy import naive as N
from ops.occupancy import render as R
from ops.occupancy.pool import voxel_pool

PC = (-8.0, -8.0, -1.0, 8.0, 8.0, 3.0)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def render_step(vol, o, d, naive: bool, n_inner: int = 16) -> None:
    vol = vol.detach().requires_grad_(True)
    t = R.ray_distances(n_inner)
    pts = R.sample_ray_points(o, d, t, torch.tensor((0.0, 0.0, 1.0)), 7.8, 0.2)
    read = N.naive_trilinear if naive else R.sample_volume
    feats = read(vol, pts.reshape(1, -1, 3), PC).reshape(o.shape[0], t.numel(), -1)
    alpha = (N.naive_raw2alpha if naive else R.raw2alpha)(feats[..., 0], R.ALPHA_INIT_SHIFT, 0.5)
    w, _ = (N.naive_alphas_to_weights if naive else R.alphas_to_weights)(alpha)
    render = N.naive_render if naive else R.render_values
    out = render(w, feats[..., 1:]).sum() + (w * t).sum()
    out.backward()


def main() -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    vol = torch.randn(1, 1 + 4 + 3, 16, 16, 4, generator=g)
    print("| what | vectorised | naive | ratio |\n|---|---|---|---|")
    n_fast, n_slow = 4096, 16
    o = torch.zeros(n_fast, 3) + torch.tensor([0.0, 0.0, 1.5])
    d = torch.nn.functional.normalize(torch.randn(n_fast, 3, generator=g), dim=-1)
    render_step(vol, o[:64], d[:64], False)  # warm-up
    fast = n_fast / timed(lambda: render_step(vol, o, d, False))
    slow = n_slow / timed(lambda: render_step(vol, o[:n_slow], d[:n_slow], True))
    print(f"| render fwd+bwd (rays/s) | {fast:,.0f} | {slow:,.1f} | {fast / slow:,.0f}x |")
    shape = (1, 2, 8, 8, 16)
    depth = torch.softmax(torch.randn(*shape, generator=g), 2).requires_grad_(True)
    ctx = torch.randn(1, 2, 16, 8, 16, generator=g).requires_grad_(True)
    pts = torch.rand(*shape, 3, generator=g) * torch.tensor([16.0, 16.0, 4.0]) + torch.tensor(PC[:3])
    n_pts = depth.numel()

    def pool(fn):
        fn(depth, ctx, pts, PC, (16, 16, 4)).sum().backward()

    pool(voxel_pool)
    fast = n_pts / timed(lambda: pool(voxel_pool))
    small = (slice(None), slice(0, 1), slice(0, 2), slice(0, 2))
    d2, c2 = depth.detach()[small].requires_grad_(True), ctx.detach()[:, :1, :, :2].requires_grad_(True)
    p2 = pts[small]
    t_slow = timed(lambda: N.naive_voxel_pool(d2, c2, p2, PC, (16, 16, 4)).sum().backward())
    slow = d2.numel() / t_slow
    print(f"| voxel pooling fwd+bwd (points/s) | {fast:,.0f} | {slow:,.1f} | {fast / slow:,.0f}x |")


if __name__ == "__main__":
    main()
