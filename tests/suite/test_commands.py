"""Commands that do what they say, each run as a user types it: ``make bench`` reaches every benchmark (GPU-only
scripts skipped, saying why; a failing one does not stop the rest), ``make test-gpu`` without CUDA says that nothing
was tested and fails, ``-h`` is ``--help`` and lists only the training config groups, a misspelt key is hinted
only with a key the composed config uses, ``gpu_check.sh --bare --preflight`` names the Python it needs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from tests._helpers.make import run_make
from tests.conftest import PORTS, ROOT

BENCHMARKS = sorted(p.name for p in (ROOT / "benchmarks").glob("[!_]*.py"))  # _*.py: shared helpers


def _make(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_make_bench_lists_every_script_as_run_or_skipped_with_its_reason():
    proc = _make("bench", "BENCH_LIST=1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    said = {}
    for line in lines[:-1]:
        m = re.fullmatch(r"== benchmarks/(\S+\.py): (runs|skipped: .+)", line)
        assert m, line
        said[m.group(1)] = m.group(2)
    assert sorted(said) == BENCHMARKS
    skipped = sorted(name for name, what in said.items() if what != "runs")
    # the two scripts of the GPU machine: one needs a subcommand, the other is that machine's preflight
    assert skipped == ["gpu_claims.py", "gpu_preflight.py"], said
    assert "needs a subcommand" in said["gpu_claims.py"] and "gpu_check.sh" in said["gpu_preflight.py"]
    assert lines[-1] == f"bench: {len(BENCHMARKS) - 2} to run, 2 skipped"


def test_the_skipped_gpu_claims_script_does_need_an_argument():
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_claims.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2 and "required" in proc.stderr, proc.stderr


def test_make_bench_runs_past_a_failing_script_and_fails_at_the_end(tmp_path):
    (tmp_path / "a_ok.py").write_text("print('ran a_ok')\n")
    (tmp_path / "b_fails.py").write_text("import sys\nsys.exit('b_fails broke')\n")
    (tmp_path / "c_gpu.py").write_text('BENCH_SKIP = "needs a GPU"\nraise SystemExit("c_gpu must not run")\n')
    (tmp_path / "d_ok.py").write_text("print('ran d_ok')\n")
    (tmp_path / "_helper.py").write_text("raise SystemExit('a helper must not run')\n")
    proc = _make("bench", f"BENCH_DIR={tmp_path}")
    assert proc.returncode != 0
    out = proc.stdout.splitlines()
    assert "ran a_ok" in out and "ran d_ok" in out, proc.stdout
    assert f"== {tmp_path}/c_gpu.py: skipped: needs a GPU" in out
    assert "c_gpu must not run" not in proc.stderr and "b_fails broke" in proc.stderr
    assert "a helper must not run" not in proc.stderr and not any("_helper" in line for line in out)
    assert out[-1] == f"bench: 2 run, 1 skipped, failed: {tmp_path}/b_fails.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device: make test-gpu runs the tests")
def test_make_test_gpu_without_cuda_says_nothing_was_tested_and_fails():
    proc = _make("test-gpu")
    assert proc.returncode != 0
    assert "no CUDA device: nothing tested" in proc.stderr.splitlines()
    assert "passed" not in proc.stdout and "deselected" not in proc.stdout, proc.stdout


def _groups_listed(help_text: str) -> list[str]:
    section = help_text.split("== Configuration groups ==")[1].split("== Config ==")[0]
    return [line.split(":")[0] for line in section.splitlines()[2:] if line.strip()]


def test_dash_h_is_help_and_lists_only_the_training_groups():
    short, long = _make("train", "ARGS=-h"), _make("train", "ARGS=--help")
    assert short.returncode == 0 and long.returncode == 0, short.stderr[-2000:]
    assert short.stdout == long.stdout and "== Config ==" in short.stdout
    groups = _groups_listed(short.stdout)
    expected = {"callbacks", "data", "debug", "experiment", "hparams_search", "launcher", "logger", "model"}
    expected |= {"paths", "trainer"}
    if any((ROOT / "conf" / "local").glob("*.yaml")):  # git-ignored: a user's cluster settings
        expected.add("local")
    assert set(groups) == expected, groups  # conf/claim/ (claim specs, claim/gpu, claim/paper) is not a run's group
    proc = subprocess.run(
        [sys.executable, "evaluate.py", "-h"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0 and set(_groups_listed(proc.stdout)) == expected, proc.stderr[-2000:]


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        ("model.lrr=1", "model.newton.lr"),  # leaderbot's default optimizer=newton never reads model.lbfgs
        ("model.optimizer=lbfgs model.lrr=1", "model.lbfgs.lr"),
    ],
)
def test_a_typo_is_hinted_with_a_key_the_config_uses(args: str, hint: str):
    proc = _make("train", "METHOD=leaderbot", f"ARGS={args}")
    assert proc.returncode == 2
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
    assert errors == [f"error: unknown config key 'model.lrr' (did you mean '{hint}'?)"], proc.stderr[-2000:]


def test_bare_preflight_states_that_its_python_needs_torch(tmp_path):
    """`bash benchmarks/gpu_check.sh --bare --preflight` runs the machine's own Python (python3, or PY=...): one
    without torch fails at once with one line that says what that Python must bring (here: this interpreter with
    its site-packages switched off, so torch is not importable)."""
    python = tmp_path / "python-without-torch"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    env = {**os.environ, "PY": str(python), "GPU_WHEELS": str(tmp_path)}
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--bare", "--preflight"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {python} has no torch: --bare runs the machine's own Python, which must bring torch, lightning, "
        "torchmetrics, timm and torch-geometric (PY=<python> picks another one)"
    ]


#: The MDA subject with test-time adaptation and quantization (tests/callbacks/test_callbacks_ddp.py), one batch.
MDA_DDP = (
    "trainer=ddp_cpu debug=fdr logger=csv trainer.enable_progress_bar=false data.subset=1000 data.test_subset=200 "
    "callbacks=quant_classifier callbacks.quant_calibration.methods=[fp,rtn] "
    "callbacks.quant_calibration.calib_batches=1 "
    "++callbacks.tta._target_=callbacks.tta.TestTimeAdaptation ++callbacks.tta.method=tent ++callbacks.tta.lr=0.01"
)


@pytest.mark.slow
@pytest.mark.spine
@pytest.mark.xdist_group(PORTS)
def test_ddp_on_cpu_gives_the_sync_dist_advice_only_for_per_rank_values(tmp_path):
    """`make train METHOD=mda ARGS="trainer=ddp_cpu ..."`: Lightning advises `sync_dist=True` for every tensor logged
    per epoch under DDP. The test-time adaptation and quantization numbers are pooled over the ranks before they are
    logged, so the advice is noise there and is gone; MDA's own val/loss and test/loss are each rank's shard mean,
    and the advice for them stays."""
    proc = run_make("train", "METHOD=mda", f"ARGS={MDA_DDP} paths.log_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    advised = set(re.findall(r"It is recommended to use `self\.log\('([^']+)', \.\.\., sync_dist=True\)`", proc.stderr))
    assert {"val/loss", "test/loss"} <= advised, advised
    synced = sorted(k for k in advised if k.startswith(("tta/", "quant/")))
    assert synced == [], synced
    metrics = (next((tmp_path / "debug" / "mda" / "runs").iterdir()) / "metrics.json").read_text()
    assert '"tta/acc_q1"' in metrics and '"quant/rtn_acc"' in metrics  # they were logged, only the advice is gone
