"""Nothing hangs: every test has a timeout that fails a hung test with every thread's stack, and an in-process run
of the entry point leaves no log handler behind on a stream that closes with the test."""

from __future__ import annotations

import logging
import time
import tomllib

from tests._helpers.hung import run_hung_test
from tests.conftest import FIXTURE_CONF, ROOT, run_entry


def test_every_test_has_a_timeout_that_dumps_the_stacks(tmp_path):
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 300 <= int(ini["timeout"]) <= 1800 and ini["timeout_method"] == "thread"
    t0 = time.monotonic()
    proc = run_hung_test(tmp_path, ["-o", "timeout=2"], timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and time.monotonic() - t0 < 60, out[-2000:]
    assert "Timeout" in out and "test_hung.py" in out and "in test_hung" in out, out[-2000:]


def test_an_in_process_run_leaves_the_root_logger_as_it_was(tmp_path, capsys):
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    args = [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "debug=fdr", f"paths.log_dir={tmp_path}"]
    assert run_entry("train", args) == 0
    assert root.handlers == before and root.level == level
