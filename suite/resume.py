"""Which checkpoint a run continues from: ``ckpt_path=last`` finds the newest interrupted run of the same
configuration (or one whose budget this run extends), never another configuration's weights nor a finished run."""

from __future__ import annotations

import logging
from pathlib import Path

from core.errors import CheckpointError, SuiteError
from suite.finished import extends, read_finished, refusal
from suite.rundir import read_overrides
from suite.summary import shown

log = logging.getLogger(__name__)


def run_overrides() -> list[str] | None:
    """This run's command-line overrides (None outside a Hydra run)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return None


_IGNORED = ("ckpt_path=", "hydra.", "paths.", "trainer.enable_progress", "eval_at_start=")  # none changes training
_BUDGET = ("trainer.max_epochs=", "trainer.max_steps=")


def _key(items: list[str], ignore: tuple[str, ...] = _IGNORED) -> list[str]:
    return sorted(o for o in items if not o.startswith(ignore))


def _same_run(overrides: list[str], run_dir: Path, ignore: tuple[str, ...] = _IGNORED) -> bool:
    """Whether ``run_dir`` was started with the same overrides (ignoring ckpt_path and hydra/paths settings)."""
    saved = read_overrides(run_dir)
    return saved is not None and _key(saved, ignore) == _key(overrides, ignore)


def find_resumable(
    log_dir: Path, overrides: list[str], max_epochs: int | None = None, max_steps: int | None = -1
) -> tuple[Path | None, str]:
    """The run folder ``ckpt_path=last`` continues in, and a note for the user.

    The newest ``runs/*/checkpoints/last.ckpt`` of an interrupted run started with the same overrides; else of one
    that differs only in ``trainer.max_epochs``/``trainer.max_steps`` and that this budget (``max_epochs``,
    ``max_steps``: the composed trainer's) trains further (extending a run's budget: it resumes and says so); else
    none (a new run, also said). Never another configuration's weights, and never a finished run
    (:mod:`suite.finished`): when the only candidates finished, a :class:`SuiteError` says so and how to extend one.
    """
    ckpts = sorted(log_dir.glob("runs/*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    runs = [p.parents[1] for p in ckpts]
    same = [r for r in runs if _same_run(overrides, r) and read_finished(r) is None]
    if same:
        return same[-1], f"ckpt_path=last: resuming {shown(same[-1] / 'checkpoints' / 'last.ckpt')} in its own folder"
    budget = [r for r in runs if _same_run(overrides, r, _IGNORED + _BUDGET)]
    longer = [r for r in budget if (done := read_finished(r)) is None or extends(done, max_epochs, max_steps)]
    if longer:
        run = longer[-1]
        before = [o for o in read_overrides(run) or [] if o.startswith(_BUDGET)] or ["the experiment's budget"]
        now = [o for o in overrides if o.startswith(_BUDGET)] or ["the experiment's budget"]
        return run, (
            f"ckpt_path=last: extending {shown(run)} from {' '.join(before)} to {' '.join(now)} "
            "(resumes from its last.ckpt in its own folder)"
        )
    if budget:  # every run of this configuration finished, and this budget trains none of them further
        raise SuiteError(refusal(budget[-1], read_finished(budget[-1]) or {}, max_steps))
    if ckpts:
        return None, (
            f"ckpt_path=last: no run under {shown(log_dir / 'runs')} was started with these overrides; starting a "
            "new run (to start from another run's weights pass ckpt_path=<its checkpoints/last.ckpt>)"
        )
    return None, f"ckpt_path=last: nothing to resume under {shown(log_dir / 'runs')}; starting a new run"


def resolve_checkpoint(
    ckpt_path: str | None,
    output_dir: Path,
    log_dir: Path | None = None,
    overrides: list[str] | None = None,
    budget: tuple[int | None, int | None] = (None, -1),
) -> str | None:
    """``None`` | ``last`` | a path.

    ``last`` is this run folder's ``checkpoints/last.ckpt`` (``python -m train`` points ``hydra.run.dir`` at the
    folder it resumes, see :func:`suite.cli.resume_in_place`; a requeued SLURM job reuses its folder); else the
    newest ``last.ckpt`` under ``log_dir`` of an interrupted run started with the *same overrides* (never another
    configuration's weights). A run with nothing to resume starts fresh, so requeued jobs just work. A finished
    folder is resumed only when ``budget`` (``trainer.max_epochs``, ``trainer.max_steps``) trains it further;
    otherwise :class:`SuiteError` (:mod:`suite.finished`).
    """
    if ckpt_path in (None, "", "null"):
        return None
    if ckpt_path == "last":
        own = output_dir / "checkpoints" / "last.ckpt"
        if own.exists():
            done = read_finished(output_dir)
            if done is not None and not extends(done, *budget):
                raise SuiteError(refusal(output_dir, done, budget[1]))
            return str(own)
        found = []
        if log_dir is not None and overrides is not None:
            found = [
                p
                for p in log_dir.glob("runs/*/checkpoints/last.ckpt")
                if _same_run(overrides, p.parents[1]) and read_finished(p.parents[1]) is None
            ]
        if found:
            return str(max(found, key=lambda p: p.stat().st_mtime))
        log.info("ckpt_path=last: no last.ckpt of an interrupted run of this configuration found; starting afresh")
        return None
    path = Path(ckpt_path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    return str(path)
