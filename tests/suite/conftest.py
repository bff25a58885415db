"""The local SLURM test cluster (tests/slurm/local_cluster.sh), one per pytest run, shared by every SLURM test.

Skipped with a one-line reason only when a precondition is missing (no root, no packages, a host name that does not
resolve or a machine with only a loopback interface: slurmdbd cannot resolve its host there). Otherwise a start that
fails does so once per pytest run, within the script's deadlines, naming the daemon's own error line; every test
that needs the cluster then reports that same line at once. The daemons the fixture started are always stopped by
PID, whether the start succeeded, failed or timed out.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "tests" / "slurm" / "local_cluster.sh"


def _up_interfaces() -> list[str]:
    """Network interfaces other than loopback that are not down (``/sys/class/net/<if>/operstate``)."""
    net = Path("/sys/class/net")
    if not net.is_dir():
        return []
    out = []
    for iface in sorted(net.iterdir()):
        try:
            state = (iface / "operstate").read_text().strip()
            loopback = int((iface / "type").read_text().strip()) == 772  # ARPHRD_LOOPBACK
        except (OSError, ValueError):
            continue
        if not loopback and state != "down":
            out.append(iface.name)
    return out


def cluster_precondition(
    hostname: str | None = None, interfaces: list[str] | None = None, resolve=socket.getaddrinfo
) -> str | None:
    """Why a local SLURM cluster cannot start on this machine (one line), or ``None`` when it can.

    slurmdbd and slurmctld resolve the machine's host name at start; in a network namespace with only a loopback
    interface that fails and the daemons never come up (measured: every SLURM test then waited 300 s)."""
    host = socket.gethostname() if hostname is None else hostname
    up = _up_interfaces() if interfaces is None else interfaces
    if not host:
        return "the machine has no host name (slurmdbd resolves its host at start)"
    try:
        resolve(host, None)
    except OSError as err:
        return f"host name {host!r} does not resolve ({err}); slurmdbd resolves its host at start"
    if not up:
        return "only a loopback network interface (a network namespace without a network): slurmdbd cannot start"
    return None


def stop_cluster(state: Path, script: Path = SCRIPT) -> None:
    """Stop every daemon the script started for ``state``, by PID (also after a failed or timed-out start)."""
    subprocess.run(["bash", str(script), "stop", str(state)], capture_output=True, text=True, timeout=120)


def start_cluster(state: Path, script: Path = SCRIPT, timeout: float = 300) -> dict[str, str]:
    """Start the cluster with state in ``state``; on failure stop what was started and raise ``RuntimeError``
    carrying the script's last line (the daemon's own error, see ``wait_for`` in the script)."""
    try:
        start = subprocess.run(
            ["bash", str(script), "start", str(state)], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        stop_cluster(state, script)
        raise RuntimeError(f"the local SLURM cluster did not start within {timeout:.0f} s") from None
    if start.returncode != 0:
        stop_cluster(state, script)
        lines = [line for line in start.stderr.splitlines() if line.strip()]
        raise RuntimeError(f"the local SLURM cluster did not start: {lines[-1] if lines else start.returncode}")
    return {"SLURM_CONF": str(state / "slurm.conf")}


@pytest.fixture(scope="session")
def slurm() -> Iterator[dict[str, str]]:
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        pytest.skip("no SLURM and no apt-get to install it")
    if os.geteuid() != 0:
        pytest.skip("starting a local SLURM cluster needs root")
    reason = cluster_precondition()
    if reason:
        pytest.skip(f"no local SLURM cluster: {reason}")
    inst = subprocess.run(["bash", str(SCRIPT), "install"], capture_output=True, text=True, timeout=900)
    if inst.returncode != 0:
        pytest.skip(f"could not install SLURM packages: {inst.stderr.strip()[-300:]}")
    # Not under pytest's tmp root (mode 700): the daemons run as the munge and mysql users.
    state = Path(tempfile.mkdtemp(prefix="suite-slurm-"))
    state.chmod(0o755)
    try:
        # Raised once: pytest keeps a session fixture's error and reports it for every test that needs it.
        yield start_cluster(state)
    finally:
        stop_cluster(state)
        time.sleep(1)
        pids = [state / "run" / f for f in ("slurmd.pid", "slurmctld.pid", "slurmdbd.pid", "mariadbd.pid")]
        survivors = [p.name for p in pids if p.exists()]
        shutil.rmtree(state, ignore_errors=True)
        assert not survivors, f"a daemon pid file survived stop: {survivors}"
