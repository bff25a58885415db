"""`make <target> ...` as a user types it, from the repository root: the one runner the command tests share."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import ROOT


def run_make(
    *args: str, timeout: float = 600, one_thread: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``make -s <args>`` in the repository root, output captured. wandb runs offline; torch uses one thread unless
    ``one_thread=False`` (the run's own setting); ``env`` adds to this process's environment."""
    full = {**os.environ, "WANDB_MODE": "offline", **({"OMP_NUM_THREADS": "1"} if one_thread else {}), **(env or {})}
    return subprocess.run(
        ["make", "-s", "--no-print-directory", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full,
    )
