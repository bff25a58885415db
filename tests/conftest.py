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
os.environ.setdefault("SUITE_PRINT_CONFIG", "false")  # no config tree at the start of every run a test makes

#: The pytest-xdist group of the tests that bind TCP ports: the local SLURM cluster's daemons listen on fixed ports,
#: and a DDP run's rendezvous port, once Lightning has put it in a worker's ``MASTER_PORT``, stays fixed for every
#: later run from that worker.
PORTS = "ports"

#: Tests that must share one pytest-xdist worker, by group. ``--dist loadgroup`` (`make test`) runs a group on one
#: worker, one test at a time. An entry is a test module or one test (``path::name``, every parametrization); a test
#: that uses the ``slurm`` fixture joins ``PORTS`` without an entry.
GROUPS = {
    # Ports (see PORTS): every test that starts DDP processes.
    "tests/suite/test_ddp.py": PORTS,
    "tests/suite/test_print_config.py::test_a_ddp_run_prints_the_tree_once": PORTS,
    "tests/callbacks/test_callbacks_ddp.py": PORTS,
    "tests/callbacks/test_loss_dynamics.py::test_ddp_two_processes_record_the_single_process_matrix": PORTS,
    "tests/suite/test_startup_watch.py::test_two_slurm_tasks_one_failing_at_startup": PORTS,
    # The leaderbot package compiles its losses with numba in every process (no disk cache): one worker compiles
    # them once instead of both.
    "tests/lightning_modules/test_leaderbot.py": "leaderbot_numba",
    "tests/lightning_modules/test_leaderbot_parity.py": "leaderbot_numba",
}

#: Spine tests: those that run whole experiments end to end as a user does (the CLI or the train entry point, ``make``
#: as typed, several processes, a claim's runs, training on embedded data). Marked ``spine`` at collection, so
#: `make test-fast` (``-m "not slow and not spine"``) leaves them out; `make test` runs them. Entries as in GROUPS;
#: a test may also say ``pytest.mark.spine`` itself.
SPINE = (
    "tests/test_experiments.py",
    "tests/callbacks/test_callback_registry.py::test_callback_does_its_work_through_train",
    "tests/callbacks/test_callback_registry.py::test_each_callback_works_with_three_experiments_the_vit_and_the_cnn_among_them",
    "tests/callbacks/test_callback_resume.py",
    "tests/callbacks/test_callbacks_ddp.py",
    "tests/callbacks/test_loss_dynamics.py::test_ddp_two_processes_record_the_single_process_matrix",
    "tests/datamodules/test_unreadable_files.py",
    "tests/lightning_modules/test_addp_training.py::test_training_on_the_embedded_task_beats_the_untrained_model",
    "tests/suite/test_best_weights.py",
    "tests/suite/test_claim_compare.py",
    "tests/suite/test_claim_preflight.py::test_a_failed_paper_run_writes_its_page_beside_the_runs_never_into_docs",
    "tests/suite/test_claim_preflight.py::test_smoke_of_a_paper_profile_runs_one_batch_on_cpu_into_logs",
    "tests/suite/test_cli_errors.py",
    "tests/suite/test_ddp.py",
    "tests/suite/test_print_config.py::test_a_run_prints_the_tree_once_before_training_by_default_and_not_when_off",
    "tests/suite/test_print_config.py::test_a_ddp_run_prints_the_tree_once",
    "tests/suite/test_sweeps.py",
    "tests/suite/test_devices.py::test_a_gpu_asked_for_on_a_cpu_machine_is_one_line_and_leaves_no_folder",
    "tests/suite/test_devices.py::test_compare_labels_runs_by_what_they_ran_on_not_by_the_trainer_asked_for",
    "tests/suite/test_finished_runs.py",
    "tests/suite/test_gpu_path.py",
    "tests/suite/test_last_is_final.py",
    "tests/suite/test_nan_and_checkpoints.py",
    "tests/suite/test_no_hang.py",
    "tests/suite/test_paper_profiles.py::test_one_training_step_at_reduced_width_on_real_format_fixture",
    "tests/suite/test_refused_runs.py",
    "tests/suite/test_resume.py",
    "tests/suite/test_slurm.py",
    "tests/suite/test_slurm_claim.py",
    "tests/suite/test_user_commands.py",
    "tests/suite/test_wandb_offline.py",
)


def _names(nodeid: str, entry: str) -> bool:
    """Whether ``entry`` (a module path or ``path::name``) names the test ``nodeid``."""
    return nodeid == entry or nodeid.startswith((f"{entry}::", f"{entry}["))


def tier_marks(nodeid: str, fixturenames: list[str] | tuple[str, ...]) -> list[pytest.MarkDecorator]:
    """The marks the tiers add to the test ``nodeid`` (relative to the repository root) that uses ``fixturenames``:
    ``spine`` when an entry of ``SPINE`` names it, ``xdist_group`` when one of ``GROUPS`` does or it uses the SLURM
    cluster."""
    marks = []
    if any(_names(nodeid, entry) for entry in SPINE):
        marks.append(pytest.mark.spine)
    groups = {group for entry, group in GROUPS.items() if _names(nodeid, entry)}
    if "slurm" in fixturenames:
        groups.add(PORTS)
    if len(groups) > 1:
        raise ValueError(f"{nodeid} is in two xdist groups: {sorted(groups)}")
    marks += [pytest.mark.xdist_group(group) for group in groups]
    return marks


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for mark in tier_marks(item.nodeid, getattr(item, "fixturenames", ())):
            item.add_marker(mark)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker's torch (and the runs its tests start) gets its share of the cores: two workers
    with two threads each on two cores run slower than with one each."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        torch.set_num_threads(threads)


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
