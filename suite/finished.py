"""A finished run is read-only to ``ckpt_path=last``.

When ``fit`` ends on its budget the runner writes :data:`MARKER` into the run folder (the step and epoch it ended
at, and the budget). ``ckpt_path=last`` then never resumes that folder with the same budget: resuming a finished run
would re-test it and rewrite its ``metrics.json`` (the ``train/*`` and ``val/*`` keys of the fit it did not rerun
lost), and a method's post-fit analysis would run again on other data. A larger budget
(``trainer.max_epochs=<more> ckpt_path=last``) still extends it; a SLURM job of a finished run (a requeue, or a
claim rerun of its multirun) has nothing to do and ends at once with status 0.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from suite.summary import shown

MARKER = "finished.json"


def write_finished(run_dir: Path, global_step: int, epoch: int, max_epochs: int | None, max_steps: int) -> None:
    """Mark ``run_dir`` finished: ``fit`` ended at ``global_step``/``epoch`` under that budget (written whole)."""
    state = {"global_step": int(global_step), "epoch": int(epoch), "max_epochs": max_epochs, "max_steps": max_steps}
    tmp = run_dir / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, run_dir / MARKER)


def read_finished(run_dir: Path) -> dict[str, Any] | None:
    """The marker of a finished run, or ``None`` for a run that never finished (interrupted, failed, running).

    An unreadable marker still means finished: it is only ever written whole, so it was damaged afterwards, and a
    damaged marker must not turn a finished run back into a resumable one."""
    path = run_dir / MARKER
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        state = None
    if not isinstance(state, dict):
        return {"global_step": -1, "epoch": -1}
    return state


def extends(done: dict[str, Any], max_epochs: int | None, max_steps: int | None) -> bool:
    """Whether the budget ``max_epochs``/``max_steps`` trains a run that finished at ``done`` any further.

    Lightning's rules: ``max_steps=-1`` is no step limit; ``max_epochs=None`` is 1000 epochs without a step limit
    and no epoch limit with one; ``max_epochs=-1`` is no epoch limit."""
    step, epoch = int(done.get("global_step", -1)), int(done.get("epoch", -1))
    if step < 0 or epoch < 0:  # a damaged marker: nothing says how far the run got
        return False
    no_step_limit = max_steps is None or int(max_steps) == -1
    if max_epochs is None:
        max_epochs = 1000 if no_step_limit else -1
    more_epochs = int(max_epochs) == -1 or int(max_epochs) > epoch
    more_steps = no_step_limit or int(max_steps) > step
    return more_epochs and more_steps


def refusal(run_dir: Path, done: dict[str, Any], max_steps: int | None) -> str:
    """The one-line reason ``ckpt_path=last`` does not resume the finished run ``run_dir``, and what to type."""
    step, epoch = int(done.get("global_step", -1)), int(done.get("epoch", -1))
    if max_steps is not None and int(max_steps) > 0:
        more = f"trainer.max_steps=<more than {step}>"
    else:
        more = f"trainer.max_epochs=<more than {epoch}>"
    return (
        f"ckpt_path=last: {shown(run_dir)} finished (global step {step}, epoch {epoch}; {MARKER}) and a finished "
        f"run is never resumed; to train it longer extend its budget: {more} ckpt_path=last; for a new run drop "
        "ckpt_path=last"
    )


def reopen(run_dir: Path) -> Path | None:
    """Before a finished run is extended: its ``metrics.json`` becomes ``metrics.step<N>.json`` (kept, never
    overwritten; ``make compare`` reads only ``metrics.json``) and the marker goes, so that an extension stopped
    half-way is an interrupted run, resumable with its new budget. Returns where the old metrics went."""
    done = read_finished(run_dir)
    if done is None:
        return None
    kept = None
    metrics = run_dir / "metrics.json"
    if metrics.is_file():
        kept = run_dir / f"metrics.step{int(done.get('global_step', -1))}.json"
        os.replace(metrics, kept)
    (run_dir / MARKER).unlink(missing_ok=True)
    return kept


def in_slurm_job() -> bool:
    """Whether this process is a SLURM job of a multirun (``make slurm``, a claim with ``launcher=slurm``) or a
    requeued SLURM job: ``ckpt_path=last`` there comes from ``conf/launcher/slurm.yaml``, not from the user."""
    env = os.environ
    if "SLURM_JOB_ID" not in env:
        return False
    if env.get("SLURM_RESTART_COUNT", "0").strip() not in ("", "0"):
        return True
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False
