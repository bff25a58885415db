"""Lightning + Hydra step overhead vs a bare PyTorch loop on the same model and data, side by side in one run.

Both loops train the same MLP (same init, data, optimiser, batch) for the same number of steps; we compare the
median per-step wall time after warm-up (goal: suite <= 1.1x bare) and report the one-off start-up costs
(Hydra compose + instantiate, Trainer set-up) separately.

    python benchmarks/overhead.py [--steps 300] [--width 512] [--batch 128]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datamodules._base import ResumableLoader  # noqa: E402
from lightning_modules._base import SuiteLitModule  # noqa: E402


def make_net(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )  # fmt: skip


def make_data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g))


def bare(steps: int, width: int, batch: int) -> list[float]:
    net = make_net(width)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = ResumableLoader(make_data(steps * batch), batch_size=batch, shuffle=True, seed=0)
    times, last = [], time.perf_counter()
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times


class _Lit(SuiteLitModule):
    def __init__(self, width: int) -> None:
        super().__init__(optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
        self.net = make_net(width)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        return loss


class _StepTimer(__import__("lightning").pytorch.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []
        self.last = None

    def on_train_batch_end(self, *args) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.times.append(now - self.last)
        self.last = now


def suite(steps: int, width: int, batch: int) -> tuple[list[float], float]:
    import lightning.pytorch as pl
    from hydra import compose, initialize_config_dir

    t0 = time.perf_counter()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["logger=none", "callbacks=none", "trainer=cpu"])
    hydra_s = time.perf_counter() - t0
    timer = _StepTimer()
    trainer = pl.Trainer(
        accelerator=cfg.trainer.accelerator, devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[timer], use_distributed_sampler=False,
    )  # fmt: skip
    loader = ResumableLoader(make_data(steps * batch), batch_size=batch, shuffle=True, seed=0)
    trainer.fit(_Lit(width), train_dataloaders=loader)
    return timer.times, hydra_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=128)
    a = p.parse_args()
    warm = a.steps // 5
    # Interleave twice so drift on a shared machine hits both sides alike.
    b1 = bare(a.steps, a.width, a.batch)[warm:]
    s1, hydra_s = suite(a.steps, a.width, a.batch)
    b2 = bare(a.steps, a.width, a.batch)[warm:]
    s2, _ = suite(a.steps, a.width, a.batch)
    b, s = statistics.median(b1 + b2), statistics.median(s1[warm:] + s2[warm:])
    print(f"MLP 64-{a.width}-{a.width}-10, batch {a.batch}, {a.steps} steps, torch threads {torch.get_num_threads()}")
    print(f"{'loop':<22}{'median step (ms)':>18}")
    print(f"{'bare PyTorch':<22}{b * 1e3:>18.3f}")
    print(f"{'Lightning (suite)':<22}{s * 1e3:>18.3f}")
    print(f"step overhead ratio suite/bare = {s / b:.3f}x (goal <= 1.1x)")
    print(f"one-off Hydra compose: {hydra_s * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
