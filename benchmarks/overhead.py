"""The spine's per-step overhead: a bare PyTorch loop vs Lightning alone vs the suite's real configuration.

Every variant trains the same MLP (same init, data, optimiser, batch) for the same number of steps, each in its own
process (a variant run after another in one process inherits its threads, wandb service and allocator state), and the
variants are interleaved over ``--rounds`` rounds (every variant once per round, the order rotating) so drift on a
shared machine hits all of them alike. Each round gives each variant's median per-step wall time and main-process CPU
time after warm-up; we report their medians over the rounds and each variant's ratio to the bare loop (and the
suite's to Lightning alone) as the geometric mean of the per-round ratios with its 95% interval over the rounds
(``benchmarks/_timing.py``); the goal (the suite <= 1.1x bare) is met only when the interval clears it. Ablations (the
suite's config minus one thing) say what each part of the suite costs.

Variants:

- ``bare``: the PyTorch loop (``zero_grad``, forward, ``backward``, ``step``) over the suite's resumable loader.
- ``lightning``: a bare ``Trainer`` (no logger, no callbacks, no progress bar): Lightning's own floor.
- ``suite``: the configuration ``python -m train`` runs (``conf/train.yaml``: callbacks=default, logger=wandb (CSV +
  wandb offline), trainer=cpu), instantiated by ``suite.run``'s own builders.
- ``suite-...``: the suite with one Hydra override (see ``VARIANTS``), to attribute the cost.

    python benchmarks/overhead.py [--steps 400] [--rounds 5] [--width 512] [--batch 128] [--only suite,bare] [--quick]
    python benchmarks/overhead.py --profile suite   # where one step's time goes (cProfile, grouped by component)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._timing import add_args, describe, header, interleave, ratio_interval, rounds_of  # noqa: E402
from datamodules._base import ResumableLoader  # noqa: E402
from lightning_modules._base import SuiteLitModule  # noqa: E402

# name -> Hydra overrides on top of the suite's configuration (None: not the suite's config at all).
VARIANTS: dict[str, list[str] | None] = {
    "bare": None,
    "lightning": None,
    "suite": [],
    "suite-no-wandb": ["logger=csv"],
    "suite-no-loggers": ["logger=none"],
    "suite-no-bar": ["trainer.enable_progress_bar=false"],
    "suite-no-lr-monitor": ["~callbacks.lr_monitor"],
    "suite-no-suite-callbacks": ["~callbacks.finite_loss", "~callbacks.preemption", "~callbacks.config_in_checkpoint"],
    "suite-log-every-1": ["trainer.log_every_n_steps=1"],
    "suite-before": [
        "+logger.wandb.async_log=false",
        "+logger.csv.flush_logs_every_n_steps=1",
        "callbacks.progress_bar._target_=lightning.pytorch.callbacks.RichProgressBar",
        "callbacks.progress_bar.refresh_rate=100",
    ],
    "suite-sync-wandb": ["+logger.wandb.async_log=false"],
    "suite-csv-every-step": ["+logger.csv.flush_logs_every_n_steps=1"],
    "suite-rich-bar": [
        "callbacks.progress_bar._target_=lightning.pytorch.callbacks.RichProgressBar",
        "callbacks.progress_bar.refresh_rate=100",
    ],
}
DESCRIPTION = {
    "bare": "bare PyTorch loop",
    "lightning": "Lightning Trainer, nothing on",
    "suite": "the suite (python -m train's config)",
    "suite-no-wandb": "  suite, CSV logger only",
    "suite-no-loggers": "  suite, no loggers",
    "suite-no-bar": "  suite, no progress bar",
    "suite-no-lr-monitor": "  suite, no LR monitor",
    "suite-no-suite-callbacks": "  suite, no finite/preempt/config cb",
    "suite-log-every-1": "  suite, log_every_n_steps=1",
    "suite-before": "  suite with sync loggers and a per-batch bar",
    "suite-sync-wandb": "  suite, synchronous wandb logging",
    "suite-csv-every-step": "  suite, CSV written every step",
    "suite-rich-bar": "  suite, Lightning's rich bar (per batch)",
}
GOAL = 1.1


def make_net(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )


def make_data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g))


def bare(steps: int, width: int, batch: int) -> tuple[list[float], list[float]]:
    net = make_net(width)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = ResumableLoader(make_data(steps * batch), batch_size=batch, shuffle=True, seed=0)
    wall, cpu = [], []
    last, last_cpu = time.perf_counter(), time.process_time()
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        now, now_cpu = time.perf_counter(), time.process_time()
        wall.append(now - last)
        cpu.append(now_cpu - last_cpu)
        last, last_cpu = now, now_cpu
    return wall, cpu


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
    """Time between consecutive ``on_train_batch_end`` calls: one whole step, every hook included. With a
    ``profiler`` (``--profile``), profiles the steps after the first fifth."""

    profiler = None  # a cProfile.Profile, set by --profile

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.last: tuple[float, float] | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = (time.perf_counter(), time.process_time())
        if self.last is not None:
            self.wall.append(now[0] - self.last[0])
            self.cpu.append(now[1] - self.last[1])
        self.last = now
        if self.profiler is not None and batch_idx == trainer.max_steps // 5:
            self.profiler.enable()

    def on_train_end(self, trainer, pl_module) -> None:
        if self.profiler is not None:
            self.profiler.disable()


def lightning(steps: int, width: int, batch: int) -> tuple[list[float], list[float]]:
    import lightning.pytorch as pl

    timer = _StepTimer()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
        use_distributed_sampler=False,
    )
    loader = ResumableLoader(make_data(steps * batch), batch_size=batch, shuffle=True, seed=0)
    trainer.fit(_Lit(width), train_dataloaders=loader)
    return timer.wall, timer.cpu


def suite(steps: int, width: int, batch: int, overrides: list[str], out: str) -> tuple[list[float], list[float]]:
    """The trainer ``python -m train`` builds (callbacks, loggers and trainer from the composed config, through
    ``suite.run``'s instantiation), fitting the benchmark's MLP instead of an experiment's model."""
    import lightning.pytorch as pl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import suite.resolvers  # noqa: F401 - registers the resolvers conf/train.yaml uses (the run's wandb name)
    from suite.build import instantiate
    from suite.build import instantiate_group as _instantiate_group

    os.environ.setdefault("WANDB_MODE", "offline")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=["trainer=cpu", f"paths.output_dir={out}", "trainer.max_epochs=1", f"trainer.max_steps={steps}"]
            + overrides,
        )
    callbacks = _instantiate_group(cfg.get("callbacks"), "callbacks")
    if cfg.trainer.get("enable_progress_bar") is False:
        callbacks = [cb for cb in callbacks if not isinstance(cb, pl.callbacks.ProgressBar)]
    loggers = _instantiate_group(cfg.get("logger"), "logger")
    if not loggers:
        callbacks = [cb for cb in callbacks if not isinstance(cb, pl.callbacks.LearningRateMonitor)]
    flat = OmegaConf.to_container(cfg, resolve=True)
    for logger in loggers:
        logger.log_hyperparams({k: v for k, v in flat.items() if k != "hydra"})
    timer = _StepTimer()
    trainer = instantiate(cfg.trainer, "trainer", callbacks=[*callbacks, timer], logger=loggers or False)
    loader = ResumableLoader(make_data(steps * batch), batch_size=batch, shuffle=True, seed=0)
    trainer.fit(_Lit(width), train_dataloaders=loader)
    for logger in loggers:
        logger.finalize("success")
    return timer.wall, timer.cpu


def run_variant(name: str, steps: int, width: int, batch: int) -> dict[str, list[float]]:
    torch.set_num_threads(1)
    if name == "bare":
        wall, cpu = bare(steps, width, batch)
    elif name == "lightning":
        wall, cpu = lightning(steps, width, batch)
    else:
        with tempfile.TemporaryDirectory() as out:
            wall, cpu = suite(steps, width, batch, VARIANTS[name] or [], out)
    return {"wall": wall, "cpu": cpu}


def measure(name: str, steps: int, width: int, batch: int) -> dict[str, float]:
    """Run one variant in a fresh process; median per-step wall and CPU time after the first fifth (warm-up)."""
    cmd = [sys.executable, __file__, "--variant", name, f"--steps={steps}", f"--width={width}", f"--batch={batch}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    if proc.returncode or line is None:
        raise SystemExit(f"variant {name} failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}")
    data = json.loads(line)
    warm = steps // 5
    return {k: statistics.median(v[warm:]) for k, v in data.items()}


# (substring of a profiled function's file or name, component), first match wins
_GROUPS = [
    ("torch._C", "torch kernels (forward, backward, optimiser)"),
    ("built-in method torch", "torch kernels (forward, backward, optimiser)"),
    ("torch/optim", "torch kernels (forward, backward, optimiser)"),
    ("torch/nn", "torch module calls"),
    ("torch/autograd", "torch module calls"),
    ("torch/utils/data", "data loading (same in the bare loop)"),
    ("datamodules/", "data loading (same in the bare loop)"),
    ("wandb", "loggers: wandb"),
    ("csv_logs", "loggers: CSV"),
    ("loggers/", "loggers: other"),
    ("rich", "progress bar"),
    ("suite/plumbing/progress", "progress bar"),
    ("lr_monitor", "LR monitor"),
    ("logger_connector", "Lightning: self.log / ResultCollection"),
    ("lightning_utilities", "Lightning: collection traversal (apply_to_collection)"),
    ("lightning/", "Lightning: loop, hooks, closure"),
    ("/callbacks/", "suite callbacks"),
]


def profile(name: str, steps: int, width: int, batch: int) -> None:
    """cProfile the steps after warm-up of one variant (in this process) and print main-thread time per step by
    component. cProfile inflates Python-heavy parts against torch kernels: read the shares, not the absolute ms;
    threads (wandb's logging thread, rich's redraw thread) are not profiled."""
    import cProfile
    import pstats

    if name in ("bare",):
        raise SystemExit("--profile: choose a Lightning variant (lightning, suite, suite-...)")
    _StepTimer.profiler = cProfile.Profile()
    run_variant(name, steps, width, batch)
    _StepTimer.profiler.disable()
    stats = pstats.Stats(_StepTimer.profiler).stats  # {(file, line, func): (cc, nc, tottime, cumtime, callers)}
    groups: dict[str, float] = {}
    n = steps - steps // 5 - 1

    def group_of(file: str, func: str) -> str:
        where = f"{file} {func}"
        return next((g for key, g in _GROUPS if key in where), "other Python (copy, inspect, contextlib, ...)")

    for (file, _, func), (_, _, tottime, _, callers) in stats.items():
        # A Python built-in (a lock wait, isinstance, ...) counts for the components that called it.
        if file == "~" and "torch" not in func and callers:
            spent = sum(c[2] for c in callers.values()) or 1.0
            for (cfile, _, cfunc), c in callers.items():
                g = group_of(cfile, cfunc)
                groups[g] = groups.get(g, 0.0) + tottime * c[2] / spent
            continue
        g = group_of(file, func)
        groups[g] = groups.get(g, 0.0) + tottime
    total = sum(groups.values())
    print(f"{name}: main-thread time per step under cProfile, {n} steps after warm-up ({total / n * 1e3:.2f} ms/step)")
    for group, t in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  {group:<58}{t / n * 1e3:>8.3f} ms {t / total:>6.1%}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--only", default=None, help="comma-separated variants (default: all)")
    p.add_argument("--profile", default=None, metavar="VARIANT", help="profile one variant's steps by component")
    p.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # internal: run one variant, print JSON
    add_args(p)
    a = p.parse_args()
    if a.profile:
        if a.profile not in VARIANTS:
            raise SystemExit(f"unknown variant {a.profile!r}; choose from {sorted(VARIANTS)}")
        profile(a.profile, a.steps, a.width, a.batch)
        return
    if a.variant:
        print(json.dumps(run_variant(a.variant, a.steps, a.width, a.batch)))
        return
    rounds = rounds_of(p, a)
    if a.quick:
        a.steps, a.width, a.batch, a.only = 30, 32, 8, a.only or "bare,suite"
    names = a.only.split(",") if a.only else list(VARIANTS)
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {sorted(VARIANTS)}")
    if "bare" not in names:
        names = ["bare", *names]
    rows = interleave({n: lambda n=n: measure(n, a.steps, a.width, a.batch) for n in names}, rounds)
    print(
        f"MLP 64-{a.width}-{a.width}-10, batch {a.batch}, {a.steps} steps (first fifth = warm-up), one torch thread, "
        f"each variant in its own process; per round the per-step median, below the median over rounds"
    )
    print(header(rounds))

    def ratio(n: str, base: str, clock: str):
        return ratio_interval([x[clock] for x in rows[n]], [x[clock] for x in rows[base]])

    print(f"{'variant':<40}{'wall ms':>9}{'cpu ms':>9}   x bare (wall; cpu)")
    for n in names:
        med = {k: statistics.median(x[k] for x in rows[n]) for k in ("wall", "cpu")}
        vs = "" if n == "bare" else f"   {describe(ratio(n, 'bare', 'wall'))}; {describe(ratio(n, 'bare', 'cpu'))}"
        print(f"{DESCRIPTION[n]:<40}{med['wall'] * 1e3:>9.3f}{med['cpu'] * 1e3:>9.3f}{vs}")
    if "suite" in names:
        print(f"step overhead suite/bare (wall): {describe(ratio('suite', 'bare', 'wall'), goal=GOAL)}")
        if "lightning" in names:
            print(f"suite/Lightning alone (wall): {describe(ratio('suite', 'lightning', 'wall'))}")


if __name__ == "__main__":
    main()
