"""Did a run measure what its paper's method is about? A run that measured nothing says so in one line.

Each experiment names, in its root key ``method_metrics``, the metric keys (``fnmatch`` patterns) that only exist
when the paper's method ran and measured something: MDA's attribution scores, OSTQuant's quantized perplexities,
SuMi's adapted accuracy. :func:`measured_nothing` turns a run's final metrics into one line when none of them was
logged with a finite value, or when the experiment's ``method_predicted`` metric says the method predicted nothing
(their 0 is then finite but measures nothing); ``suite.run.train`` prints it after the run's summary.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase


def method_metric_hits(patterns: Iterable[str], metrics: Mapping[str, float]) -> dict[str, float]:
    """The finite metrics whose key matches one of ``patterns`` (``fnmatch``, e.g. ``quant/ostquant_*``)."""
    pats = [str(p) for p in patterns]
    return {
        k: v
        for k, v in metrics.items()
        if any(fnmatchcase(k, p) for p in pats) and isinstance(v, (int, float)) and math.isfinite(v)
    }


def measured_nothing(
    slug: str, patterns: Iterable[str] | None, metrics: Mapping[str, float], predicted: str | None = None
) -> str | None:
    """One line when an experiment declares ``method_metrics`` and the run logged none of them (finite), or when
    they were logged but ``predicted`` (the experiment's ``method_predicted``: a metric counting what the method
    predicted, preworld's ``test/occupied``) is 0, so they score an empty prediction (a 0 that is finite but is no
    measurement); else None."""
    pats = [str(p) for p in (patterns or [])]
    if not pats:
        return None
    hits = method_metric_hits(pats, metrics)
    if hits and predicted and metrics.get(predicted) == 0:
        return (
            f"note: {slug}: the method measured nothing: {predicted} is 0 (it predicted nothing), so its metrics "
            f"({', '.join(sorted(hits))}) score an empty prediction (see the run's warnings for why)"
        )
    if hits:
        return None
    return (
        f"note: {slug}: the method measured nothing: none of its metrics ({', '.join(pats)}) was logged with a "
        "finite value (switched off, or no test data it could use?)"
    )
