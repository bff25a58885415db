"""RX-DPM overhead: wall time of each base solver and its RX variant at the same NFE, side by side.

RX adds no denoiser call, only a few vector operations per coarse interval (the coarse step and the extrapolation),
so the goal is RX <= 1.05x its base solver with a real network. Timed on a small U-Net (14x14 images, the
Fashion-MNIST setting of the rx_dpm claim) and on the exact mixture denoiser (where vector operations dominate).
Base and RX run once each per round over ``--rounds`` interleaved rounds after a warm-up; RX/base is printed with
its 95% interval over the rounds (``benchmarks/_timing.py``). The claim itself (error vs NFE, FID, ablation) is
`make claim METHOD=rx_dpm`.

    python benchmarks/rx_dpm_speed.py [--nfe 20] [--batch 256] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import add_args, calibrate, describe, header, interleave, ratio_interval, rounds_of, seconds  # noqa: E402
from datamodules.mixtures import make_mixture  # noqa: E402
from layers.diffusion import EDMPrecond, SmallUNet  # noqa: E402
from ops.samplers import karras_sigmas, rx_sample, sample, steps_for_nfe  # noqa: E402
from ops.scores.gmm import gmm_denoiser  # noqa: E402

GOAL = 1.05


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nfe", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    add_args(ap)
    args = ap.parse_args()
    rounds = rounds_of(ap, args)
    batch, nfe = (2, 6) if args.quick else (args.batch, args.nfe)
    solvers = ("euler", "heun") if args.quick else ("euler", "heun", "dpm2", "dpmpp_2m")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    net = EDMPrecond(SmallUNet(1, channels=16, emb_dim=64), 0.5).eval()
    w, mu, cov = make_mixture("ring2d")
    cases = {
        "U-Net 14x14": (lambda x, s: net(x, s), torch.randn(batch, 1, 14, 14) * 80),
        "exact mixture": (lambda x, s: gmm_denoiser(x, s, w, mu, cov), torch.randn(batch, 2, dtype=torch.float64)),
    }
    print(f"NFE budget {nfe}, batch {batch}, one thread; {header(rounds)}")
    print(f"{'denoiser':<14} {'solver':<10} {'base s':>8} {'RX s':>8} {'NFE':>4}  RX/base")
    with torch.no_grad():
        for case, (den, x) in cases.items():
            for solver in solvers:
                sig = karras_sigmas(steps_for_nfe(solver, nfe, True))
                run_base = lambda d=den, y=x, g=sig, s=solver: sample(d, y, g, s)  # noqa: E731
                run_rx = lambda d=den, y=x, g=sig, s=solver: rx_sample(d, y, g, s, k=2)  # noqa: E731
                out = run_rx()  # warm-up (and the NFE actually spent)
                n = calibrate(run_base)
                arms = {"base": lambda f=run_base, n=n: seconds(f, n), "rx": lambda f=run_rx, n=n: seconds(f, n)}
                t = interleave(arms, rounds)
                iv = ratio_interval(t["rx"], t["base"])
                goal = {"goal": GOAL} if case.startswith("U-Net") else {}
                print(
                    f"{case:<14} {solver:<10} {statistics.median(t['base']):8.3f} {statistics.median(t['rx']):8.3f} "
                    f"{out.nfe:4d}  {describe(iv, **goal)}"
                )


if __name__ == "__main__":
    main()
