"""``debug=overfit``'s verdict: did the run memorise its batch (smoke mode itself: :mod:`core.smoke`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from suite.rundir import read_csv_curves

OVERFIT_FRACTION = 0.1
"""``debug=overfit`` memorised its batch when the training loss ends (the mean of its last :data:`OVERFIT_LAST`
values) at most this fraction of its first value: driven near zero from where it started, not merely lower
(a loss that falls 40% in ten steps has learnt something, not memorised the batch)."""
OVERFIT_LAST = 3


def overfit_rule(check: Mapping[str, Any] | None, slug: str) -> dict[str, Any]:
    """The memorisation criterion of experiment ``slug``: ``conf/debug/overfit.yaml``'s ``overfit_check`` defaults
    (``fraction``, ``epochs``) updated by its entry under ``experiments`` (``applies: false`` with ``why``: the
    check does not apply to that method)."""
    check = dict(check or {})
    rule = {
        "fraction": OVERFIT_FRACTION,
        "applies": True,
        "why": "",
        **{k: check[k] for k in ("fraction",) if k in check},
    }
    rule.update(dict((check.get("experiments") or {}).get(slug) or {}))
    return rule


def overfit_verdict(csv_file: str | Path, check: Mapping[str, Any] | None = None, slug: str = "") -> str:
    """One line: did ``debug=overfit`` memorise its batch? Reads the run's ``train/loss`` curve (the CSV log):
    ``PASSED`` when the mean of its last :data:`OVERFIT_LAST` values is at most ``fraction`` of its first,
    ``NOT MEMORISED`` (with the numbers and how to train longer) otherwise, or why the check does not apply."""
    rule = overfit_rule(check, slug)
    if not rule["applies"]:
        return f"overfit check: does not apply to {slug}: {' '.join(str(rule['why']).split())}"
    fraction = float(rule["fraction"])
    criterion = (
        f"memorised: the mean of the last {OVERFIT_LAST} train/loss values at most {fraction:.0%} of the first"
        + (f" ({rule['why']})" if rule["why"] else "")
    )
    path = Path(csv_file)
    curves = read_csv_curves(path) if path.is_file() else {}
    curve = next((curves[k] for k in ("train/loss", "train/loss_step", "train/loss_epoch") if curves.get(k)), [])
    values = [v for _, v in sorted(curve, key=lambda sv: sv[0]) if math.isfinite(v)]
    if len(values) <= OVERFIT_LAST:
        return f"overfit check: no train/loss curve to judge (needs the CSV log, {path}); {criterion}"
    first, end = values[0], sum(values[-OVERFIT_LAST:]) / OVERFIT_LAST
    if first <= 0:
        return f"overfit check: cannot judge: train/loss starts at {first:.4g}; the rule needs a loss that is 0 at best"
    share = end / first
    said = f"train/loss {first:.4g} -> {end:.4g} ({share:.1%} of its start) in {len(values)} steps"
    if share <= fraction:
        return f"overfit check: PASSED: {said}; {criterion}"
    return (
        f"overfit check: NOT MEMORISED: {said}; {criterion}; "
        f'train longer to see whether it can: ARGS="debug=overfit overfit_check.run_epochs={10 * len(values)}"'
    )
