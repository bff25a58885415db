"""What a finished (or interrupted) run prints last: where its results went."""

from __future__ import annotations

import contextlib
import csv
import math
import shlex
from pathlib import Path


def shown(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies below it (what the user typed), else absolute."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


BOOKKEEPING = ("lr-",)
"""Prefixes of logged values that are bookkeeping, not results: Lightning's ``LearningRateMonitor`` (``lr-Adam``,
``lr-AdamW/pg1``). They stay in the CSV/wandb curves, never in ``metrics.json``, the summary or the tables."""


def is_result(key: str) -> bool:
    """Whether a logged key is a result (``val/acc``) rather than bookkeeping (:data:`BOOKKEEPING`)."""
    return not str(key).startswith(BOOKKEEPING)


def _fmt(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else str(value)


def metrics_lines(metrics: dict[str, float]) -> list[str]:
    """One named metric per line (``test/mae  0.577``), in place of Lightning's table with one column per test
    dataloader: each metric's name already says what it evaluates (``test/ppl_len128``, ``test/asr_patch``)."""
    if not metrics:
        return ["  (no metrics logged)"]
    width = max(len(k) for k in metrics)
    return [f"  {k:<{width}}  {_fmt(v)}" for k, v in sorted(metrics.items())]


def leaderboard_lines(path: Path, top: int = 5) -> list[str]:
    """The first ``top`` rows of a ``leaderboard.csv`` (leaderbot): rank, model, score."""
    try:
        with path.open(newline="") as fh:
            rows = [r for _, r in zip(range(top), csv.DictReader(fh))]
    except (OSError, csv.Error):
        return []
    out = []
    for r in rows:
        score = r.get("score", "")
        with contextlib.suppress(ValueError):
            score = f"{float(score):.4f}"
        out.append(f"    {r.get('rank', '?'):>3}. {r.get('model', '?')}  (score {score})")
    return out


def run_summary(run_dir: str | Path, metrics: dict[str, float], what: str = "run") -> str:
    """The run folder, metrics.json, plots, checkpoint and (leaderbot) the top of the leaderboard, as text."""
    run_dir = Path(run_dir)
    lines = [f"{what} finished: {shown(run_dir)}/", f"metrics ({shown(run_dir / 'metrics.json')}):"]
    lines += metrics_lines(metrics)
    skip = {"wandb", "csv", ".hydra", "checkpoints"}
    plots = sorted(p for p in run_dir.rglob("*.png") if not (set(p.relative_to(run_dir).parts[:-1]) & skip))
    if plots:
        lines.append("plots: " + ", ".join(shown(p) for p in plots))
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    if ckpt.is_file():
        lines.append(f"checkpoint: {shown(ckpt)}")
    board = run_dir / "leaderboard.csv"
    if board.is_file():
        lines.append(f"leaderboard ({shown(board)}), top 5:")
        lines += leaderboard_lines(board)
    curves = run_dir / "csv" / "metrics.csv"
    if curves.is_file():
        lines.append(f"curves: {shown(curves)}")
    return "\n".join(lines)


def resume_command(overrides: list[str], run_dir: str | Path) -> str:
    """The exact command that resumes this run in its own folder, as the README's ``make`` form (it works outside
    the venv): ``make train METHOD=<slug> ARGS='<overrides> ckpt_path=last hydra.run.dir=<run>'``. Each override is
    shell-quoted inside ARGS (the Makefile hands ARGS to the shell) and ``$`` doubled (make would expand it)."""
    keep = [o for o in overrides if not o.startswith(("ckpt_path=", "hydra.run.dir="))]
    method = next((o.split("=", 1)[1] for o in keep if o.startswith("experiment=")), None)
    args = [o for o in keep if not o.startswith("experiment=")] + ["ckpt_path=last", f"hydra.run.dir={shown(run_dir)}"]
    inner = " ".join(shlex.quote(a) for a in args).replace("$", "$$")
    return "make train" + (f" METHOD={shlex.quote(method)}" if method else "") + " ARGS=" + shlex.quote(inner)
