"""Errors the suite reports to the user as one line (no traceback)."""

from __future__ import annotations


class SuiteError(Exception):
    """A user-facing error: bad configuration, missing or corrupt data, a failed run.

    ``train.py``/``evaluate.py`` print ``error: <message>`` on one line and exit with status 2.
    """


class ConfigError(SuiteError, ValueError):
    """A configuration value is out of range or inconsistent. Raised at construction time."""


class MissingDataError(SuiteError, FileNotFoundError):
    """A dataset file is missing or unreadable; the message names the file and where to get it."""


class DataFormatError(SuiteError, ValueError):
    """A data file exists but its content is malformed; the message names the file and row."""


class NonFiniteLossError(SuiteError, FloatingPointError):
    """The training loss became NaN or infinite."""


class CheckpointError(SuiteError):
    """A checkpoint is missing, truncated or unsafe to load."""


def check(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)


PREEMPTED_EXIT_CODE = 143
"""Exit status of a run stopped by SIGTERM after writing ``last.ckpt``: 128 + 15, the POSIX convention for
"terminated by SIGTERM" that shells, SLURM (``ExitCode 143``), Kubernetes and systemd report as a signal-terminated,
not a failed, job. SLURM requeues a preempted job whatever its status; the requeued job resumes (``ckpt_path=last``)."""


class Preempted(SuiteError):
    """The run was stopped by SIGTERM (preemption, ``scancel``, a time limit) or Ctrl-C and wrote ``last.ckpt``.

    Args:
        message: What was written and the resume command (first line: what happened).
        exit_code: :data:`PREEMPTED_EXIT_CODE` for SIGTERM, 130 for SIGINT (128 + the signal, as shells report).
    """

    def __init__(self, message: str, exit_code: int = PREEMPTED_EXIT_CODE) -> None:
        super().__init__(message)
        self.exit_code = exit_code
