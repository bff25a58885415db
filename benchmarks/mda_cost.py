"""MDA's cost on the suite's subject ViT (patch 4 on 28x28, P = 49), side by side in one run.

* forward images and seconds per image for several candidate windows ``w`` (the paper's is
  ``min(2 floor(sqrt P), 28) = 14``), against the notes' estimate of about ``P x w`` forward images;
* the greedy search with the window's candidates in **one batched forward pass** vs the one-by-one twin, same image,
  same result (checked), as a time ratio (goal >= 5x), beside the ceiling the model itself sets: 14 single
  forwards over one forward of a batch of 14 (profiling showed the batched search spends ~95% of its time in that
  forward, so its ratio cannot exceed this one by much).

The subject is the randomly initialised subject architecture unless ``--ckpt`` names a trained checkpoint of
``experiment=mda``; the blur calibration is disabled (``blur_max_conf=1``) so every image is used. The machine may
be shared: only the ratios measured in this one run are meaningful. The two searches (and the two model calls of the
ceiling) alternate over ``--rounds`` interleaved rounds, round ``r`` on image ``r mod --images``; each ratio is
printed with its 95% interval over the rounds (``benchmarks/_timing.py``).

    python benchmarks/mda_cost.py [--images 3] [--rounds 5] [--ckpt path/to/last.ckpt] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import (  # noqa: E402
    add_args,
    calibrate,
    describe,
    header,
    interleave,
    ratio_interval,
    rounds_of,
    seconds,
)
from lightning_modules.mda.evaluation import model_probs, patch_grid  # noqa: E402
from lightning_modules.mda.module import load_subject  # noqa: E402
from ops.attribution.mda import greedy_patch_order, greedy_patch_order_naive, mda, window_size  # noqa: E402


def subject(ckpt: str | None) -> torch.nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    net = VisionTransformer(
        img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=64, depth=3, num_heads=4, mlp_ratio=2.0
    )
    if ckpt:
        load_subject(net, ckpt)
    return net.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=3)
    ap.add_argument("--ckpt", default=None)
    add_args(ap)
    args = ap.parse_args()
    rounds = rounds_of(ap, args)
    n_images, windows, n_order = (1, (4,), 8) if args.quick else (args.images, (4, 8, 14, 28), 49)
    torch.set_num_threads(1)
    net = subject(args.ckpt)
    fn = model_probs(net)
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(1, 28, 28, generator=g) for _ in range(n_images)]
    grid = patch_grid(28, 28, 4)
    p = 49
    print(f"P = {p}, paper window w = {window_size(p)}; {n_images} images; one thread")
    print("| window | forward images / image | P x w | ratio | seconds / image |")
    print("|---|---|---|---|---|")
    for w in windows:
        fw, secs = [], []
        for x in images:
            prior = torch.rand(28, 28, generator=g)
            t0 = time.perf_counter()
            res = mda(fn, x, prior, p, blur_klen=(3, 2, 3), blur_max_conf=1.0, segments=grid, window=w)
            secs.append(time.perf_counter() - t0)
            fw.append(res.forward_images)
        f = statistics.fmean(fw)
        print(f"| {w} | {f:.0f} | {p * w} | {f / (p * w):.2f} | {statistics.fmean(secs):.3f} |")
    # batched vs one-by-one candidate evaluation: the deletion-type search (window 14) over the first n_order patches
    order = list(range(n_order))
    searched: dict[str, list] = {"batched": [], "one-by-one": []}

    def search(name: str) -> float:
        x = images[len(searched[name]) % n_images]  # round r searches image r mod n_images
        start = torch.zeros_like(x)
        impl = greedy_patch_order if name == "batched" else greedy_patch_order_naive
        t0 = time.perf_counter()
        found, _ = impl(fn, start, x, grid, order, 14, False, 0)
        searched[name].append(found.order)
        return time.perf_counter() - t0

    t = interleave({name: lambda name=name: search(name) for name in searched}, rounds)
    if searched["batched"] != searched["one-by-one"]:
        raise SystemExit("batched and one-by-one searches disagree")
    print(header(rounds))
    print(
        f"greedy search (w=14, {n_order} patches): batched median {statistics.median(t['batched']):.3f} s, "
        f"one-by-one {statistics.median(t['one-by-one']):.3f} s"
    )
    speed = ratio_interval(t["one-by-one"], t["batched"])
    print(f"speed-up of batched candidate evaluation: {describe(speed, goal=5.0, better='higher')}")
    batch = torch.stack(images * 14)[:14]
    with torch.inference_mode():
        for _ in range(3):
            fn(batch[:1]), fn(batch)
        inner = calibrate(lambda: fn(batch))
        m = interleave(
            {"one": lambda: seconds(lambda: fn(batch[:1]), inner), "batch": lambda: seconds(lambda: fn(batch), inner)},
            rounds,
        )
    ceiling = ratio_interval([14 * v for v in m["one"]], m["batch"])
    print(
        f"model ceiling: 14 single forwards {14 * statistics.median(m['one']) * 1e3:.1f} ms vs one batch of 14 "
        f"{statistics.median(m['batch']) * 1e3:.1f} ms: {describe(ceiling)}"
    )


if __name__ == "__main__":
    main()
