"""One-line errors for the Hydra entry points."""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import sys
from collections.abc import Callable, Iterator

from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from suite.errors import SuiteError


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())


def _config_hint(err: BaseException) -> str:
    """Explain a Hydra/OmegaConf error in one line, suggesting the closest valid key for a misspelling."""
    msg = str(err)
    cause = err.__cause__ or err
    full_key = getattr(cause, "full_key", None)
    m = re.search(r"Key '([^']+)' is not in struct", msg + str(cause))
    parent = getattr(cause, "parent_node", None) or getattr(cause, "object", None)
    if m and full_key:
        suggestion = ""
        try:
            keys = list(parent.keys()) if parent is not None else []
            close = difflib.get_close_matches(m.group(1), [str(k) for k in keys], n=1)
            if close:
                suggestion = f" (did you mean '{close[0]}'?)"
        except Exception:  # noqa: BLE001 - the hint is best effort
            pass
        return f"unknown config key '{full_key}'{suggestion}"
    msg = msg.split("Config search path")[0]
    return _one_line(msg.replace("Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", ""))


def fail(message: str) -> None:
    """Print ``error: <message>`` as one line on stderr and exit with status 2."""
    print(f"error: {_one_line(message)}", file=sys.stderr, flush=True)
    sys.exit(2)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Inside a Hydra task: turn :class:`SuiteError` into one line + exit 2 (``SystemExit`` passes through Hydra's
    job runner without its multi-line "Error executing job" report)."""
    try:
        yield
    except SuiteError as err:
        fail(str(err))


def run_main(hydra_main: Callable[[], object]) -> None:
    """Call a ``@hydra.main`` function; print ``error: ...`` on one line and exit 2 for user errors."""
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let exceptions reach us instead of Hydra's multi-line report
    try:
        hydra_main()
    except SuiteError as err:
        fail(str(err))
    except (ConfigCompositionException, OverrideParseException, MissingConfigException) as err:
        fail(_config_hint(err))
    except (HydraException, OmegaConfBaseException) as err:
        fail(_config_hint(err))
    except Exception as err:
        # Launcher failures (e.g. sbatch refusing a job) are the user's to fix, not a traceback.
        if type(err).__module__.startswith("submitit"):
            fail(f"SLURM submission failed: {err}")
        raise
