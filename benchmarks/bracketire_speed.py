"""BracketIRE speed, side by side in one run (one thread):

* TMRNet training step (forward + backward + AdamW) in brackets/s at the CPU size of the claim (C = 16, blocks
  2/2/3/2, 16^2 packed patches, batch 4) with the ``batched`` deformable convolution and with torchvision's
  ``deform_conv2d``, and at the paper's width (C = 64, blocks 5/16/24/5, 8 groups) on a small patch;
* the simulator: brackets/s of :func:`datamodules.bracket.simulate_sample` (341 sub-frames of procedural motion,
  unprocessing, averaging, noise, 10 bits) at the same patch size, vs the training step's brackets/s
  (goal: >= 5x, simulation never the bottleneck), raw and amortised over the datamodule's cache (each bracket is
  simulated once, on first access), and the vectorised bracket synthesis vs its naive loop twin.

Timings are noisy on a shared machine: read the ratios. The arms alternate over ``--rounds`` interleaved rounds after
a warm-up, and each ratio is printed with its 95% interval over the rounds (``benchmarks/_timing.py``); a goal is met
only when the interval clears it. Run: ``python benchmarks/bracketire_speed.py [--rounds 5] [--quick]``.
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
    Interval,
    add_args,
    describe,
    header,
    interleave,
    ratio_interval,
    rounds_of,
    seconds,
)
from datamodules.bracket import DOMAIN_SETTINGS, PHOTOS, linear_photo, simulate_sample  # noqa: E402
from layers.vision.tmrnet import TMRNet  # noqa: E402
from ops.isp.losses import synthetic_loss  # noqa: E402
from ops.isp.simulate import (  # noqa: E402
    iso1600near_levels,
    naive_simulate_bracket,
    rgb2cam_matrix,
    simulate_bracket,
)

GOAL = 5.0


def train_step(net: TMRNet, batch: int, hw: int):
    """One training step (forward + backward + AdamW) on a fixed random batch of ``batch`` brackets."""
    x, gt = torch.rand(batch, 5, 4, hw, hw), torch.rand(batch, 4, hw, hw) * 4
    opt = torch.optim.AdamW(net.parameters(), 1e-4)

    def step() -> None:
        loss = synthetic_loss(net(x), gt)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(parser)
    args = parser.parse_args()
    rounds = rounds_of(parser, args)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cpu = {"channels": 16, "n_feat": 2, "n_common": 2, "n_specific": 3, "n_recon": 2, "dcn_groups": 4}
    if args.quick:
        cpu = {"channels": 8, "n_feat": 1, "n_common": 1, "n_specific": 1, "n_recon": 1, "dcn_groups": 2}
    batch, n_sim = (1, 1) if args.quick else (4, 5)
    photo = linear_photo(PHOTOS["train"][0])
    g = torch.Generator().manual_seed(0)
    arms = {
        "batched": train_step(TMRNet(dcn_impl="batched", **cpu), batch, 16),
        "torchvision": train_step(TMRNet(dcn_impl="torchvision", **cpu), batch, 16),
        "simulator": lambda: [simulate_sample(photo, 32, False, DOMAIN_SETTINGS["synthetic"], g) for _ in range(n_sim)],
    }
    per = {"batched": batch, "torchvision": batch, "simulator": n_sim}  # brackets per call
    paper = {"channels": 64, "n_feat": 5, "n_common": 16, "n_specific": 24, "n_recon": 5, "dcn_groups": 8}
    if not args.quick:
        net = TMRNet(dcn_impl="batched", **paper)
        params = sum(p.numel() for p in net.parameters())
        arms["paper"], per["paper"] = train_step(net, 1, 16), 1
    t = interleave({k: lambda f=f: seconds(f) for k, f in arms.items()}, rounds, warmup=True)
    s = {k: [v / per[k] for v in ts] for k, ts in t.items()}  # seconds per bracket, per round
    rate = {k: 1 / statistics.median(v) for k, v in s.items()}
    print(header(rounds))
    size = "C=8, blocks 1/1/1/1, batch 1" if args.quick else "C=16, 16^2 patches, batch 4"
    print(
        f"TMRNet CPU size ({size}): {rate['batched']:.1f} brackets/s with the batched DCN, "
        f"{rate['torchvision']:.1f} with torchvision's deform_conv2d; batched/torchvision speed "
        f"{describe(ratio_interval(s['torchvision'], s['batched']))}"
    )
    if "paper" in s:
        print(
            f"TMRNet paper width (C=64, 5/16/24/5, {params / 1e6:.1f} M parameters, 16^2 patch, batch 1): "
            f"{rate['paper']:.2f} brackets/s, slower per bracket than the CPU size by "
            f"{describe(ratio_interval(s['paper'], s['batched']))}"
        )
    else:
        print("TMRNet paper width: skipped under --quick")
    sim = ratio_interval(s["batched"], s["simulator"])
    print(
        f"simulator (341 sub-frames, 32^2 RGB -> 16^2 packed): {rate['simulator']:.1f} brackets/s; over the "
        f"training step: {describe(sim, goal=GOAL, better='higher')}"
    )
    # the datamodule simulates each bracket once (first access) and caches it: per training draw, the claim's run
    # (n_train brackets behind max_steps x batch draws) pays n_train / (steps x batch) of a simulation
    n_train, steps, claim_batch = 256, 1200, 4
    k = steps * claim_batch / n_train
    amortised = Interval(sim.estimate * k, sim.low * k, sim.high * k, sim.n)
    print(
        f"simulator amortised over the cache at the claim's settings ({n_train} brackets, {steps} steps x "
        f"{claim_batch}), over the training step: {describe(amortised, goal=GOAL, better='higher')}"
    )
    if not args.quick:
        t0 = time.perf_counter()
        for _ in range(3):
            simulate_sample(photo, 64, True, DOMAIN_SETTINGS["synthetic"], g)
        print(
            f"simulator, BracketIRE+ (64^2 RGB sub-frames, x4 down): {3 / (time.perf_counter() - t0):.1f} brackets/s "
            "(one measurement, no ratio)"
        )

    frames = torch.rand(341, 3, 32, 32) * 3
    shot, read = iso1600near_levels(torch.rand(5), torch.randn(5))
    synth = (frames, rgb2cam_matrix(), 1.8, 1.6, shot, read, torch.randn(5, 4, 16, 16))
    t = interleave(
        {
            "vec": lambda: seconds(lambda: simulate_bracket(*synth)),
            "loop": lambda: seconds(lambda: naive_simulate_bracket(*synth)),
        },
        rounds,
        warmup=True,
    )
    speed = describe(ratio_interval(t["loop"], t["vec"]))
    print(
        f"bracket synthesis: vectorised {1e3 * statistics.median(t['vec']):.1f} ms vs naive loop "
        f"{1e3 * statistics.median(t['loop']):.1f} ms (medians): {speed}"
    )


if __name__ == "__main__":
    main()
