"""Claim-check hook for LiCE: per dataset, a method x metric table of the counterfactual results.

``suite.claim`` calls :func:`claim_report(records, out_dir)` with one record per finished run (``name`` = the claim
entry, i.e. the dataset; ``metrics`` = the run's ``metrics.json``). The paper's claim (Table 2): LiCE counterfactuals
have a markedly higher SPN log-likelihood than the plain MIO's and DiCE's at a small cost in distance and sparsity,
with validity preserved.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

METHODS = ("mio", "lice_threshold", "lice_optimize", "dice")
COLUMNS = (
    ("valid", "valid %", 100.0),
    ("spn_ll", "SPN LL ↑", 1.0),
    ("true_ll", "true log-density ↑", 1.0),
    ("distance", "distance ↓", 1.0),
    ("sparsity", "sparsity ↓", 1.0),
    ("plausible", "LL ≥ τ %", 100.0),
    ("seconds", "median s", 1.0),
    ("timeouts", "time-outs", 1.0),
)


def _cell(values: list[float], scale: float) -> str:
    if not values:
        return "—"
    arr = np.asarray(values) * scale
    return f"{arr.mean():.2f} ± {arr.std():.2f}" if len(arr) > 1 else f"{arr.mean():.2f}"


def method_table(metrics_per_seed: list[dict[str, float]]) -> str:
    """Markdown table (methods x metrics, mean ± std over seeds) from ``test/<method>/<metric>`` keys."""
    present = [c for c in COLUMNS if any(f"test/{m}/{c[0]}" in r for r in metrics_per_seed for m in METHODS)]
    lines = ["| method | " + " | ".join(c[1] for c in present) + " |", "|---" * (len(present) + 1) + "|"]
    for m in METHODS:
        if not any(f"test/{m}/valid" in r for r in metrics_per_seed):
            continue
        cells = [
            _cell([r[f"test/{m}/{k}"] for r in metrics_per_seed if f"test/{m}/{k}" in r], s) for k, _, s in present
        ]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def claim_report(records: list[Any], out_dir: Path) -> str:
    """Markdown section: one table per claim entry plus the LiCE-vs-MIO verdict."""
    by_name: dict[str, list[dict[str, float]]] = defaultdict(list)
    for rec in records:
        by_name[rec.name].append(rec.metrics)
    parts = ["## Counterfactuals per method", ""]
    for name, runs in by_name.items():
        acc = [r["test/acc"] for r in runs if "test/acc" in r]
        tau = [r["test/threshold"] for r in runs if "test/threshold" in r]
        parts += [f"### {name}", "", f"Classifier test accuracy {_cell(acc, 1.0)}; median-LL threshold τ = "
                  f"{_cell(tau, 1.0)}; {len(runs)} seed(s).", "", method_table(runs), ""]  # fmt: skip
        verdict = []
        for m in ("lice_threshold", "lice_optimize"):
            d_ll = [r[f"test/{m}/spn_ll"] - r["test/mio/spn_ll"] for r in runs
                    if f"test/{m}/spn_ll" in r and "test/mio/spn_ll" in r]  # fmt: skip
            d_dist = [r[f"test/{m}/distance"] - r["test/mio/distance"] for r in runs
                      if f"test/{m}/distance" in r and "test/mio/distance" in r]  # fmt: skip
            if d_ll:
                verdict.append(f"{m} vs mio: SPN LL {np.mean(d_ll):+.2f} nats, distance {np.mean(d_dist):+.2f}")
        if verdict:
            parts += ["; ".join(verdict) + ".", ""]
    return "\n".join(parts)
