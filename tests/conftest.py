"""Shared test helpers: compose the suite's Hydra config in-process, or run the CLI in a subprocess."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

import suite.resolvers  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_CONF = "hydra.searchpath=[file://tests/fixtures/conf]"

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


def compose_train(overrides: list[str], out_dir: Path) -> DictConfig:
    """The composed ``train`` config with the run folder redirected to ``out_dir`` (no Hydra run needed)."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(out_dir)
        cfg.paths.log_dir = str(out_dir / "logs")
        cfg.paths.root_dir = str(ROOT)
    return cfg


def run_cli(args: list[str], cwd: Path = ROOT, timeout: float = 600, env: dict | None = None):
    """Run ``python -m <args>`` like a user would; returns the CompletedProcess (text)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", **(env or {})}
    full_env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def fixture_conf() -> str:
    return FIXTURE_CONF


def run_entry(module: str, args: list[str]) -> int:
    """Run ``python -m <module> <args>`` (``train``/``evaluate``) in this process, through the same entry point
    (``suite.cli.run_main`` + ``@hydra.main``), for tests that run many commands; returns the exit status."""
    import importlib

    from suite.cli import run_main

    mod = importlib.import_module(module)
    saved = sys.argv
    sys.argv = [f"{module}.py", f"--config-path={ROOT / 'conf'}", *args]  # absolute: imported, not run as main
    with _logging_restored():
        try:
            run_main(mod.main, resume=module == "train")
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.argv = saved
    return 0


@contextlib.contextmanager
def _logging_restored():
    """Hydra configures logging for each run: a console handler on the ``sys.stdout`` of that moment (a test's
    captured output, closed when the test ends) and a file handler. Left in place, later tests' log records go to a
    closed stream, and the handler's error report lands wherever stderr is redirected then (inside pyomo's output
    capture it fed the tee's own pipe until it hung). Put the root logger back as it was."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
            handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)


@pytest.fixture
def one_thread():
    """Tiny convolutions: one thread is far faster than two contended ones on the shared 2-core machine. Use with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
