"""Preflight of a GPU machine's own Python for the suite (``benchmarks/gpu_check.sh``, ``benchmarks/gpu_claims.sh``).

Checks, printing one line each and failing with one line naming what is missing:

1. the packages the machine must bring (torch, lightning, torchmetrics, timm, torch_geometric, ...) import;
2. with ``--target DIR`` (the wheels of ``make gpu-wheels`` installed there): hydra, omegaconf, antlr4 (and fla with
   ``--fla``) import *from that folder*, so a machine that happens to hold other versions cannot hide a wheel that
   failed to install;
3. every ``--experiment`` composes with the overrides given (``trainer=gpu`` composes without a GPU) and its model
   and datamodule instantiate, on the CPU: a config or API mismatch with the machine's torch shows here, in
   seconds, not after the GPU run started;
4. with ``--cuda``: torch sees a CUDA device (a tiny matmul runs on it).

Usage: ``python benchmarks/gpu_preflight.py [--target DIR] [--fla] [--cuda] [--experiment SLUG [OVERRIDES...]]...``
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

BENCH_SKIP = "a GPU machine's preflight, not a benchmark: benchmarks/gpu_check.sh runs it"
"""Why ``make bench`` does not run this script (the Makefile reads this line)."""
ROOT = Path(__file__).resolve().parents[1]
MACHINE = ("torch", "lightning", "torchmetrics", "timm", "torch_geometric", "numpy", "scipy", "matplotlib", "yaml")
WHEELS = ("hydra", "omegaconf", "antlr4")


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def check_imports(target: Path | None, fla: bool) -> dict[str, str]:
    versions = {}
    for name in MACHINE:
        try:
            mod = importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - any import failure is one line
            fail(f"the machine's Python lacks {name} ({type(err).__name__}: {err})")
        versions[name] = str(getattr(mod, "__version__", "?"))
    for name in WHEELS + (("fla",) if fla else ()):
        try:
            mod = importlib.import_module(name)
        except Exception as err:  # noqa: BLE001
            fail(f"{name} does not import ({type(err).__name__}: {err}): run `make gpu-wheels` and carry .whl/")
        where = Path(mod.__file__).resolve()
        if target is not None and not where.is_relative_to(target.resolve()):
            fail(f"{name} imports from {where.parent}, not from the wheel target {target}: the wheel did not install")
        versions[name] = str(getattr(mod, "__version__", "?"))
    return versions


def check_experiment(slug: str, overrides: list[str]) -> str:
    """Compose ``experiment=<slug>`` with ``overrides`` and instantiate its model and datamodule on the CPU."""
    import hydra
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import suite.resolvers  # noqa: F401 - registers the config resolvers

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        try:
            cfg = compose("train", overrides=[f"experiment={slug}", *overrides], return_hydra_config=False)
        except Exception as err:  # noqa: BLE001
            fail(f"experiment={slug} {' '.join(overrides)} does not compose: {type(err).__name__}: {err}")
    try:
        model = hydra.utils.instantiate(cfg.model)
        hydra.utils.instantiate(cfg.data)
    except Exception as err:  # noqa: BLE001
        fail(f"experiment={slug}: model/data do not instantiate here: {type(err).__name__}: {err}")
    params = sum(p.numel() for p in model.parameters())
    return f"{slug}: composes ({cfg.trainer.get('accelerator', '?')}), model {type(model).__name__} {params:,} params"


def check_cuda() -> str:
    import torch

    if not torch.cuda.is_available():
        fail("no CUDA device visible to torch")
    x = torch.ones(64, 64, device="cuda")
    assert float((x @ x).sum()) == 64.0**3
    return f"cuda: {torch.cuda.get_device_name(0)}, torch {torch.__version__} (CUDA {torch.version.cuda})"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None, help="folder the GPU wheels were installed into")
    p.add_argument("--fla", action="store_true", help="also require fla (from the target)")
    p.add_argument("--cuda", action="store_true", help="also require a CUDA device")
    p.add_argument("--experiment", nargs="+", action="append", default=[], metavar="SLUG [OVERRIDE ...]")
    args = p.parse_args(argv)
    versions = check_imports(Path(args.target) if args.target else None, args.fla)
    print("preflight: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"preflight: python {sys.version.split()[0]}" + (f", wheels from {args.target}" if args.target else ""))
    for slug, *overrides in args.experiment:
        print("preflight: " + check_experiment(slug, overrides))
    if args.cuda:
        print("preflight: " + check_cuda())
    print("preflight: ok")


if __name__ == "__main__":
    main()
