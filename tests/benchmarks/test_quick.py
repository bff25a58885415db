"""Every benchmark's ``--quick`` run (few rounds, tiny sizes) prints its ratios with intervals over the rounds and
states each goal's verdict from the interval. Each run is a subprocess as ``make bench`` starts it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    p.name for p in (ROOT / "benchmarks").glob("[!_]*.py") if not re.search(r"^BENCH_SKIP = ", p.read_text(), re.M)
)
# scripts that print no ratio (their output is objectives), and the scripts whose ratios carry a goal
NO_RATIO = {"lice_time_limit.py"}
NO_GOAL = {"grass_throughput.py", "lice_mio_speed.py"} | NO_RATIO
INTERVAL = re.compile(r"\(95% CI [^ ()]+-[^ ()]+, 3 rounds\)")
VERDICT = re.compile(r"goal (<=|>=) [^:]+: (goal met|goal missed|goal not met \(interval crosses [^)]+\))")


def test_every_benchmark_has_a_quick_mode():
    assert len(SCRIPTS) >= 14
    lacking = [
        s
        for s in SCRIPTS
        if '"--quick"' not in (ROOT / "benchmarks" / s).read_text()
        and "add_args(" not in (ROOT / "benchmarks" / s).read_text()
    ]
    assert lacking == []


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_quick_run_prints_every_ratio_with_its_interval(script):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=840,
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "NOT met" not in out  # the old point-estimate verdict
    if script in NO_RATIO:
        assert re.search(r"^\d+ \| base \| ", out, re.M), out
        return
    assert "3 interleaved rounds" in out and "fewer than 5 rounds: not a figure to quote" in out, out
    assert INTERVAL.search(out), out
    # a ratio line is any line printing "<number>x" (but a combined verdict, "goal ...: goal met"): each one carries
    # its interval
    lines = [ln for ln in out.splitlines() if not ln.startswith("goal ")]
    assert [ln for ln in lines if re.search(r"\d(\.\d+)?x\b", ln) and not INTERVAL.search(ln)] == []
    if script not in NO_GOAL:
        assert VERDICT.search(out), out
        verdicts = [ln for ln in out.splitlines() if re.search(r"\b(met|missed)\b", ln)]
        assert all(VERDICT.search(ln) or ln.startswith("goal ") for ln in verdicts), verdicts
