"""BracketIRE speed, side by side in one run (one thread):

* TMRNet training step (forward + backward + AdamW) in brackets/s at the CPU size of the claim (C = 16, blocks
  2/2/3/2, 16^2 packed patches, batch 4) with the ``batched`` deformable convolution and with torchvision's
  ``deform_conv2d``, and at the paper's width (C = 64, blocks 5/16/24/5, 8 groups) on a small patch;
* the simulator: brackets/s of :func:`datamodules.bracket.simulate_sample` (341 sub-frames of procedural motion,
  unprocessing, averaging, noise, 10 bits) at the same patch size, vs the training step's brackets/s
  (goal: >= 5x, simulation never the bottleneck), raw and amortised over the datamodule's cache (each bracket is
  simulated once, on first access), and the vectorised bracket synthesis vs its naive loop twin.

Timings are noisy on a shared machine: read the ratios. Run: ``python benchmarks/bracketire_speed.py``.
"""

from __future__ import annotations

import time

import torch

from datamodules.bracket import DOMAIN_SETTINGS, PHOTOS, linear_photo, simulate_sample
from layers.vision.tmrnet import TMRNet
from ops.isp.losses import synthetic_loss
from ops.isp.simulate import iso1600near_levels, naive_simulate_bracket, rgb2cam_matrix, simulate_bracket


def best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def train_rate(net: TMRNet, batch: int, hw: int, steps: int = 3) -> float:
    """Brackets per second of a training step (forward + backward + AdamW)."""
    x, gt = torch.rand(batch, 5, 4, hw, hw), torch.rand(batch, 4, hw, hw) * 4
    opt = torch.optim.AdamW(net.parameters(), 1e-4)

    def step():
        loss = synthetic_loss(net(x), gt)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    return batch * steps / best(lambda: [step() for _ in range(steps)], 2)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cpu = {"channels": 16, "n_feat": 2, "n_common": 2, "n_specific": 3, "n_recon": 2, "dcn_groups": 4}
    fast = train_rate(TMRNet(dcn_impl="batched", **cpu), 4, 16)
    tv = train_rate(TMRNet(dcn_impl="torchvision", **cpu), 4, 16)
    print(f"TMRNet CPU size (C=16, 16^2 patches, batch 4): {fast:.1f} brackets/s with the batched DCN, "
          f"{tv:.1f} with torchvision's deform_conv2d ({fast / tv:.2f}x)")  # fmt: skip
    paper = {"channels": 64, "n_feat": 5, "n_common": 16, "n_specific": 24, "n_recon": 5, "dcn_groups": 8}
    net = TMRNet(dcn_impl="batched", **paper)
    rate = train_rate(net, 1, 16, steps=1)
    params = sum(p.numel() for p in net.parameters())
    print(f"TMRNet paper width (C=64, 5/16/24/5, {params / 1e6:.1f} M parameters, 16^2 patch, batch 1): "
          f"{rate:.2f} brackets/s, {fast / rate:.0f}x slower per bracket than the CPU size")  # fmt: skip

    photo = linear_photo(PHOTOS["train"][0])
    g = torch.Generator().manual_seed(0)
    sim = 5 / best(lambda: [simulate_sample(photo, 32, False, DOMAIN_SETTINGS["synthetic"], g) for _ in range(5)])
    print(f"simulator (341 sub-frames, 32^2 RGB -> 16^2 packed): {sim:.1f} brackets/s = {sim / fast:.1f}x the "
          f"training step's {fast:.1f} brackets/s (goal >= 5x: {'met' if sim >= 5 * fast else 'NOT met'})")  # fmt: skip
    # the datamodule simulates each bracket once (first access) and caches it: per training draw, the claim's run
    # (n_train brackets behind max_steps x batch draws) pays n_train / (steps x batch) of a simulation
    n_train, steps, batch = 256, 1200, 4
    amortised = sim * steps * batch / n_train
    print(f"simulator amortised over the cache at the claim's settings ({n_train} brackets, {steps} steps x {batch}): "
          f"{amortised:.0f} draws/s = {amortised / fast:.0f}x the training step "
          f"(goal >= 5x: {'met' if amortised >= 5 * fast else 'NOT met'})")  # fmt: skip
    plus = 3 / best(lambda: [simulate_sample(photo, 64, True, DOMAIN_SETTINGS["synthetic"], g) for _ in range(3)])
    print(f"simulator, BracketIRE+ (64^2 RGB sub-frames, x4 down): {plus:.1f} brackets/s")

    frames = torch.rand(341, 3, 32, 32) * 3
    shot, read = iso1600near_levels(torch.rand(5), torch.randn(5))
    args = (frames, rgb2cam_matrix(), 1.8, 1.6, shot, read, torch.randn(5, 4, 16, 16))
    t_vec, t_loop = best(lambda: simulate_bracket(*args)), best(lambda: naive_simulate_bracket(*args), 1)
    print(f"bracket synthesis: vectorised {1e3 * t_vec:.1f} ms vs naive loop {1e3 * t_loop:.1f} ms "
          f"({t_loop / t_vec:.1f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
