"""One-line errors for the Hydra entry points."""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Callable

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
    return _one_line(msg.replace("\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", ""))


def run_main(hydra_main: Callable[[], object]) -> None:
    """Call a ``@hydra.main`` function; print ``error: ...`` on one line and exit 2 for user errors."""
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let exceptions reach us instead of Hydra's multi-line report
    try:
        hydra_main()
    except SuiteError as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        sys.exit(2)
    except (ConfigCompositionException, OverrideParseException, MissingConfigException) as err:
        print(f"error: {_config_hint(err)}", file=sys.stderr)
        sys.exit(2)
    except (HydraException, OmegaConfBaseException) as err:
        print(f"error: {_config_hint(err)}", file=sys.stderr)
        sys.exit(2)
