"""Debug modes (``debug=fdr|limit|overfit``): what a module or callback may skip to keep them quick."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def smoke_test(trainer: Any) -> bool:
    """Whether this run is a smoke test of the pipeline: ``fast_dev_run`` or any ``debug=`` mode.

    Modules and callbacks with heavy post-hoc work (quantization calibration, counterfactual search, Hessians) run
    it in a reduced form then. ``suite.run.build`` sets ``trainer.suite_smoke`` from the config key ``smoke``,
    which every ``conf/debug/*.yaml`` sets.
    """
    return bool(getattr(trainer, "fast_dev_run", False)) or bool(getattr(trainer, "suite_smoke", False))


OVERFIT_DROP = 0.001
"""``debug=overfit`` passes when the training loss on its one batch ends at least this fraction (of the first
value's magnitude) below where it started: the loss must fall, by more than float noise. Ten epochs at an
experiment's own learning rate are a smoke check, not convergence (leaderbot's NLL has a floor near 1.0; ts_lif's
Adam at 1e-4 moves 1% in ten steps), so the threshold asks for a fall, not for a fit."""


def overfit_verdict(csv_file: str | Path, drop: float = OVERFIT_DROP) -> str:
    """One line: did ``debug=overfit`` overfit its batch? Reads the run's ``train/loss`` curve (the CSV log) and
    compares its last value with its first against :data:`OVERFIT_DROP`."""
    from suite.compare import _read_csv_curves

    rule = f"threshold: the loss must fall, its last value at least {drop:.1%} below its first"
    path = Path(csv_file)
    curves = _read_csv_curves(path) if path.is_file() else {}
    curve = next((curves[k] for k in ("train/loss", "train/loss_step", "train/loss_epoch") if curves.get(k)), [])
    values = [v for _, v in sorted(curve, key=lambda sv: sv[0]) if math.isfinite(v)]
    if len(values) < 2:
        return f"overfit check: no train/loss curve to judge (needs the CSV log, {path}); {rule}"
    first, last = values[0], values[-1]
    fell = (first - last) / abs(first) if first else (1.0 if last < 0 else 0.0)
    verdict = "PASSED" if fell >= drop else "FAILED (the batch was not overfitted)"
    return f"overfit check: {verdict}: train/loss {first:.4g} -> {last:.4g} ({-fell:+.2%}); {rule}"
