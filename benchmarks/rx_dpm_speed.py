"""RX-DPM overhead: wall time of each base solver and its RX variant at the same NFE, side by side.

RX adds no denoiser call, only a few vector operations per coarse interval (the coarse step and the extrapolation),
so the goal is RX <= 1.05x its base solver with a real network. Timed on a small U-Net (14x14 images, the
Fashion-MNIST setting of the rx_dpm claim) and on the exact mixture denoiser (where vector operations dominate).
The claim itself (error vs NFE, FID, ablation) is `make claim METHOD=rx_dpm`.

    python benchmarks/rx_dpm_speed.py [--nfe 20] [--batch 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datamodules.mixtures import make_mixture  # noqa: E402
from layers.diffusion import EDMPrecond, SmallUNet  # noqa: E402
from ops.samplers import karras_sigmas, rx_sample, sample, steps_for_nfe  # noqa: E402
from ops.scores.gmm import gmm_denoiser  # noqa: E402


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nfe", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    net = EDMPrecond(SmallUNet(1, channels=16, emb_dim=64), 0.5).eval()
    w, mu, cov = make_mixture("ring2d")
    cases = {
        "U-Net 14x14": (lambda x, s: net(x, s), torch.randn(args.batch, 1, 14, 14) * 80),
        "exact mixture": (lambda x, s: gmm_denoiser(x, s, w, mu, cov), torch.randn(args.batch, 2, dtype=torch.float64)),
    }
    print(f"NFE budget {args.nfe}, batch {args.batch}, median of {args.repeats}")
    print(f"{'denoiser':<14} {'solver':<10} {'base s':>8} {'RX s':>8} {'RX/base':>8} {'NFE':>4}")
    with torch.no_grad():
        for case, (den, x) in cases.items():
            for solver in ("euler", "heun", "dpm2", "dpmpp_2m"):
                sig = karras_sigmas(steps_for_nfe(solver, args.nfe, True))
                run_base = lambda d=den, y=x, g=sig, s=solver: sample(d, y, g, s)  # noqa: E731
                run_rx = lambda d=den, y=x, g=sig, s=solver: rx_sample(d, y, g, s, k=2)  # noqa: E731
                base, rx, out = timed(run_base, args.repeats), timed(run_rx, args.repeats), run_rx()
                print(f"{case:<14} {solver:<10} {base:8.3f} {rx:8.3f} {rx / base:8.2f} {out.nfe:4d}")


if __name__ == "__main__":
    main()
