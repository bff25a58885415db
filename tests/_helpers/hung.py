"""The hung-test harness: a test file whose test waits forever, run by pytest under this repository's
``pyproject.toml`` settings (its timeout and faulthandler options, overridden to seconds)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

HUNG = "import threading\n\ndef test_hung():\n    threading.Event().wait()\n"


def run_hung_test(tmp_path: Path, options: list[str], extra: str = "", timeout: float = 300):
    """Write ``test_hung.py`` (``test_hung`` waits forever, then ``extra`` test code) into ``tmp_path`` and run pytest
    on it with the repository's ini options and ``options`` (``-o timeout=2``, xdist flags); returns the
    CompletedProcess (text)."""
    hung = tmp_path / "test_hung.py"
    hung.write_text(HUNG + extra)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        str(ROOT / "pyproject.toml"),
        "--rootdir",
        str(tmp_path),
        *options,
        str(hung),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
