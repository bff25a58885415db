"""The local SLURM cluster fixture (tests/suite/conftest.py) without SLURM: its precondition, the script's start
deadlines that name the daemon's error line, and the cleanup of a failed or timed-out start."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from tests.suite.conftest import SCRIPT, cluster_precondition, start_cluster


def _no_resolve(host, port):
    raise OSError(-2, "Name or service not known")


def test_precondition_names_what_is_missing():
    assert cluster_precondition("node1", ["eth0"], resolve=lambda h, p: []) is None
    reason = cluster_precondition("node1", ["eth0"], resolve=_no_resolve)
    assert reason.startswith("host name 'node1' does not resolve") and "slurmdbd" in reason
    assert cluster_precondition("node1", [], resolve=lambda h, p: []).startswith("only a loopback network interface")
    assert cluster_precondition("", ["eth0"]).startswith("the machine has no host name")


def test_wait_for_gives_up_at_its_deadline_with_the_daemons_error_line(tmp_path):
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "slurmdbd.log").write_text(
        "[2026-12-04T16:00:00.000] debug: starting\n"
        '[2026-12-04T16:00:00.010] error: Unable to resolve "vm": Unknown host\n'
    )
    text = SCRIPT.read_text()
    functions = "\n".join(
        re.search(rf"^{name}\(\) {{\n.*?^}}$", text, re.M | re.S).group(0) for name in ("daemon_error", "wait_for")
    )
    start = time.monotonic()
    proc = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\nB={tmp_path}\n{functions}\nwait_for 1 slurmdbd false"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1 and time.monotonic() - start < 10
    assert proc.stderr.strip() == (
        "local_cluster.sh: slurmdbd did not start within 1 s: slurmdbd.log: [2026-12-04T16:00:00.010] error: "
        'Unable to resolve "vm": Unknown host'
    )


@pytest.mark.parametrize("mode", ["fails", "hangs"])
def test_a_failed_start_stops_what_it_started_and_names_the_error(mode: str, tmp_path):
    fake = tmp_path / "cluster.sh"
    fake.write_text(
        'if [ "$1" = stop ]; then touch "$2/stopped"; exit 0; fi\n'
        'touch "$2/started"\n'
        + (
            "echo 'local_cluster.sh: slurmdbd did not start within 60 s: error: Unknown host' >&2; exit 1\n"
            if mode == "fails"
            else "exec sleep 30\n"
        )
    )
    with pytest.raises(RuntimeError) as err:
        start_cluster(tmp_path, script=fake, timeout=2)
    assert (tmp_path / "started").exists() and (tmp_path / "stopped").exists()  # the daemons it started are stopped
    assert str(err.value) == (
        "the local SLURM cluster did not start: local_cluster.sh: slurmdbd did not start within 60 s: error: "
        "Unknown host"
        if mode == "fails"
        else "the local SLURM cluster did not start within 2 s"
    )
