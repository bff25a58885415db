"""The test tiers: `make test` runs the whole suite on two pytest-xdist workers with the port-binding tests in one
group, `make test-fast` leaves out the slow and spine tests, and a hung test still ends the run with its stack."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import tomllib

import pytest

from tests._helpers.hung import run_hung_test
from tests.conftest import PORTS, ROOT, SPINE, tier_marks


def _recipes(target: str) -> list[list[str]]:
    """The pytest command lines `make <target>` runs (``make -n``: printed, not run)."""
    proc = subprocess.run(
        ["make", "-n", "--no-print-directory", target], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines() if " -m pytest " in line]


def _recipe(target: str) -> list[str]:
    (line,) = _recipes(target)
    return line


def test_make_test_runs_two_grouped_workers_and_test_fast_leaves_out_slow_and_spine():
    (full, slurm), fast = _recipes("test"), _recipe("test-fast")
    xdist = ["-n", "2", "--dist", "loadgroup", "--max-worker-restart", "0"]
    cluster = ["tests/suite/test_slurm.py", "tests/suite/test_slurm_claim.py"]
    # the whole suite (no marker expression beyond pyproject's `not gpu`), the SLURM job tests after it on their own
    assert full[full.index("-n") :] == [*xdist, *(f"--ignore={t}" for t in cluster)]
    assert slurm[slurm.index("pytest") + 1 :] == cluster
    assert fast[fast.index("-n") :] == [*xdist, "-m", "not slow and not spine and not gpu"]


def test_tier_marks_name_spine_modules_and_tests_and_group_the_slurm_cluster():
    module, one_test = SPINE[0], next((e for e in SPINE if "::" in e), None)
    assert [m.name for m in tier_marks(f"{module}::test_x[a-b]", [])] == ["spine"]
    assert tier_marks(f"{module}x::test_x", []) == []  # another module whose path starts the same
    assert tier_marks("tests/ops/test_rope.py::test_x", ["tmp_path"]) == []
    if one_test is not None:
        assert [m.name for m in tier_marks(f"{one_test}[p]", [])] == ["spine"]
        assert tier_marks(f"{one_test}_other", []) == []
    (mark,) = tier_marks("tests/suite/test_new_cluster.py::test_x", ["tmp_path", "slurm"])
    assert (mark.name, mark.args) == ("xdist_group", (PORTS,))


def test_every_spine_entry_names_a_test_module_or_test_that_exists():
    for entry in SPINE:
        path, _, name = entry.partition("::")
        assert (ROOT / path).is_file(), f"SPINE entry {entry}: no such file"
        if name:
            tree = ast.parse((ROOT / path).read_text())
            defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name in defined, f"SPINE entry {entry}: no such test"


@pytest.mark.spine
def test_a_hung_test_under_the_workers_ends_the_run_once_with_its_stack(tmp_path):
    """pytest-timeout ends a hung test's worker; xdist must neither rerun the test on a fresh worker (its loadgroup
    scheduler does, once per allowed restart) nor lose the stack (faulthandler prints it before the timeout)."""
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < float(ini["faulthandler_timeout"]) < float(ini["timeout"])  # the stack comes before the worker ends
    full = _recipes("test")[0]
    xdist = [a for a in full[full.index("-n") :] if not a.startswith("--ignore=")]
    options = ["-o", "timeout=4", "-o", "faulthandler_timeout=2", *xdist]
    proc = run_hung_test(tmp_path, options, extra="\ndef test_fine():\n    assert True\n")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    # one crash report per run of the test (the short summary repeats it on wide terminals, so count report lines)
    crashes = re.findall(r"^worker '\w+' crashed while running 'test_hung.py::test_hung'$", out, flags=re.M)
    assert len(crashes) == 1 and out.count("node down") == 1, out[-3000:]
    assert 'test_hung.py", line 4 in test_hung' in out, out[-3000:]  # the hung frame, from faulthandler
