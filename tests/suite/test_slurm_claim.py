"""A paper-profile claim on the local SLURM test cluster: ``python -m suite.claim ... --profile paper launcher=slurm``
submits both entries' seeds as SLURM jobs through Hydra's submitit launcher at once, waits, and builds the page with
the published numbers; ``--report-only`` rebuilds it from the cluster's run folders.

Uses the session cluster fixture of tests/suite/conftest.py (munge, MariaDB, slurmdbd, slurmctld, slurmd; root
only, skipped otherwise). It uses the SLURM test cluster's fixed ports: never run two SLURM test sessions at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
SPEC = ROOT / "tests" / "fixtures" / "conf" / "claim_paper_spine_fixture.yaml"


def _claim(env: dict, *args: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    full_env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, "-m", "suite.claim", "spine_fixture", "--profile", "paper", "--spec", str(SPEC), *args]
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=1200)


def test_two_entry_paper_claim_through_submitit(slurm, tmp_path):
    out, page = tmp_path / "runs", tmp_path / "page.md"
    # The spec asks for trainer=gpu (a paper profile); the extra override wins, as `make claim ... ARGS=` does.
    launch = ["launcher=slurm", "trainer=cpu", "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=20"]
    proc = _claim(slurm, "--out", str(out), "--page", str(page), *launch)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    # Both entries' submitters were started before either finished (printed commands come first, then the waits).
    printed = [line for line in proc.stdout.splitlines() if line.startswith("$ ")]
    assert len(printed) == 2 and all("launcher=slurm" in c and "trainer=cpu" in c for c in printed)
    assert "trainer=gpu" not in " ".join(printed)
    jobs = {}
    for name in ("sgd_lr005", "sgd_lr001"):
        for seed in (0, 1):
            metrics = json.loads((out / name / str(seed) / "metrics.json").read_text())
            assert metrics["test/mse"] > 0
        # one folder per array task (<array>_<task>), beside the array's own submission folder (<array>)
        ids = sorted(p.name for p in (out / name / ".submitit").iterdir() if "_" in p.name and p.name[0].isdigit())
        assert ids, f"{name}: no submitit job folder"
        jobs[name] = ids
        assert len(ids) == 2 and all(list((out / name / ".submitit" / i).glob("*_log.out")) for i in ids), ids
    status = json.loads((out / "claim_status.json").read_text())
    assert {k: v[0] for k, v in status.items()} == {"sgd_lr005": 0, "sgd_lr001": 0}
    env = {**os.environ, **slurm}
    array_ids = sorted({i.split("_")[0] for ids in jobs.values() for i in ids})
    assert len(array_ids) == 2, array_ids  # one job array per entry
    deadline = time.monotonic() + 120
    while True:  # the result files land before slurmctld books the last job as completed
        states = subprocess.run(
            ["sacct", "-j", ",".join(array_ids), "-X", "-n", "-o", "JobID,State"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.split()
        if states.count("COMPLETED") >= 4 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert states.count("COMPLETED") >= 4, states  # two seeds per entry
    text = page.read_text()
    assert "make claim METHOD=spine_fixture PROFILE=paper" in text
    assert "## Published numbers beside this run" in text
    mse = [json.loads((out / "sgd_lr005" / s / "metrics.json").read_text())["test/mse"] for s in ("0", "1")]
    row = next(line for line in text.splitlines() if line.startswith("| sgd_lr005 | test/mse | 0.5 |"))
    assert f"{sum(mse) / 2:.4g}" in row and "(2)" in row
    assert "| sgd_lr005 | test/r2 | not in the paper |" in text

    # --report-only on the cluster's run folders: the same four runs, nothing resubmitted.
    page.unlink()
    again = _claim(slurm, "--out", str(out), "--page", str(page), "--report-only", *launch)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(4 runs)" in again.stdout and not any(line.startswith("$ ") for line in again.stdout.splitlines())
    assert row in page.read_text()
