"""PreWorld rendering and voxel pooling throughput, vectorised vs the loop twins, side by side in one run (one
thread):

* volume rendering forward + backward (trilinear read of density / semantics / RGB at contracted ray samples,
  raw2alpha, weights, rendered depth / semantics / RGB, a loss on them) in rays/s;
* lift-splat voxel pooling forward + backward in frustum points/s.

The goal is a ratio >= 20x. Sizes are small so that the loop twins finish. Each path is timed once per round over
``--rounds`` interleaved rounds after a warm-up; each ratio is printed with its 95% interval over the rounds
(``benchmarks/_timing.py``). Run: ``python benchmarks/preworld_render.py [--rounds 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import add_args, describe, header, interleave, ratio_interval, rounds_of, seconds  # noqa: E402
from ops.occupancy import naive as N  # noqa: E402
from ops.occupancy import render as R  # noqa: E402
from ops.occupancy.pool import voxel_pool  # noqa: E402

PC = (-8.0, -8.0, -1.0, 8.0, 8.0, 3.0)
GOAL = 20.0


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(parser)
    args = parser.parse_args()
    rounds = rounds_of(parser, args)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    vol = torch.randn(1, 1 + 4 + 3, 16, 16, 4, generator=g)
    n_fast, n_slow = (256, 4) if args.quick else (4096, 16)
    o = torch.zeros(n_fast, 3) + torch.tensor([0.0, 0.0, 1.5])
    d = torch.nn.functional.normalize(torch.randn(n_fast, 3, generator=g), dim=-1)
    depth_n = 2 if args.quick else 8
    shape = (1, 2, depth_n, 8, 16)
    depth = torch.softmax(torch.randn(*shape, generator=g), 2).requires_grad_(True)
    ctx = torch.randn(1, 2, 16, 8, 16, generator=g).requires_grad_(True)
    pts = torch.rand(*shape, 3, generator=g) * torch.tensor([16.0, 16.0, 4.0]) + torch.tensor(PC[:3])
    small = (slice(None), slice(0, 1), slice(0, 2), slice(0, 2))
    d2, c2 = depth.detach()[small].requires_grad_(True), ctx.detach()[:, :1, :, :2].requires_grad_(True)
    p2 = pts[small]
    arms = {
        "render fast": lambda: seconds(lambda: render_step(vol, o, d, False)) / n_fast,
        "render naive": lambda: seconds(lambda: render_step(vol, o[:n_slow], d[:n_slow], True)) / n_slow,
        "pool fast": lambda: (
            seconds(lambda: voxel_pool(depth, ctx, pts, PC, (16, 16, 4)).sum().backward()) / depth.numel()
        ),
        "pool naive": lambda: (
            seconds(lambda: N.naive_voxel_pool(d2, c2, p2, PC, (16, 16, 4)).sum().backward()) / d2.numel()
        ),
    }  # seconds per ray / per point
    render_step(vol, o[:64], d[:64], False)  # warm-up
    render_step(vol, o[:1], d[:1], True)
    voxel_pool(depth, ctx, pts, PC, (16, 16, 4)).sum().backward()
    t = interleave(arms, rounds)
    print(f"one thread; {n_fast} rays vs {n_slow} for the loop twin; {depth.numel()} points vs {d2.numel()}")
    print(header(rounds))
    print("| what | vectorised | naive | speed-up |\n|---|---|---|---|")
    for what, unit, fast, slow in (
        ("render fwd+bwd", "rays/s", t["render fast"], t["render naive"]),
        ("voxel pooling fwd+bwd", "points/s", t["pool fast"], t["pool naive"]),
    ):
        rate_fast, rate_slow = len(fast) / sum(fast), len(slow) / sum(slow)
        iv = ratio_interval(slow, fast)
        print(f"| {what} ({unit}) | {rate_fast:,.0f} | {rate_slow:,.1f} | {describe(iv, goal=GOAL, better='higher')} |")


if __name__ == "__main__":
    main()
