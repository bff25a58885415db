"""Claim-check report for TTA comparisons: a per-variant table over seeds and accuracy-over-the-stream curves.

Used as ``report: reports.sumi:claim_report`` in ``conf/claim/<slug>.yaml`` with runs that enable
``callbacks.tta.TTAComparison`` (metrics ``tta/<variant>/<key>``, per-batch history in ``tta_compare.csv``).
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

KEYS = ("acc", "acc_q1", "acc_q2", "acc_q3", "acc_q4", "selected")


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.1f} ± {100 * sd:.1f}"


def variant_table(records: list[Any]) -> tuple[list[str], dict[str, dict[str, list[float]]]]:
    """``variant -> key -> values over runs`` from the records' ``tta/<variant>/<key>`` metrics."""
    table: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    order: list[str] = []
    for rec in records:
        for name, value in rec.metrics.items():
            parts = name.split("/")
            if len(parts) == 3 and parts[0] == "tta" and parts[2] in KEYS:
                if parts[1] not in order:
                    order.append(parts[1])
                table[parts[1]][parts[2]].append(float(value))
    return order, table


def _curves(records: list[Any], out_dir: Path, window: int = 10) -> Path | None:
    """Plot the running accuracy (moving average over ``window`` batches, mean over seeds) of every variant."""
    per_variant: dict[str, list[list[float]]] = defaultdict(list)
    for rec in records:
        f = Path(rec.path) / "tta_compare.csv"
        if not f.exists():
            continue
        rows: dict[str, list[float]] = defaultdict(list)
        with f.open() as fh:
            for r in csv.DictReader(fh):
                if r.get("acc"):
                    rows[r["variant"]].append(float(r["acc"]))
        for k, v in rows.items():
            per_variant[k].append(v)
    if not per_variant:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, runs in per_variant.items():
        n = min(len(r) for r in runs)
        mean = [sum(r[i] for r in runs) / len(runs) for i in range(n)]
        smooth = [
            sum(mean[max(0, i - window + 1) : i + 1]) / len(mean[max(0, i - window + 1) : i + 1]) for i in range(n)
        ]
        ax.plot(range(n), smooth, label=name, lw=2 if name.startswith("sumi") and name == "sumi" else 1)
    ax.set_xlabel("test batch (stream position)")
    ax.set_ylabel(f"accuracy (moving average, {window} batches)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = out_dir / "sumi_stream_accuracy.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def verdict(order: list[str], table: dict[str, dict[str, list[float]]], method: str = "sumi") -> list[str]:
    """Sentences computed from the table: does ``method`` beat each baseline in accuracy and in stability?"""
    if method not in table:
        return []
    mean = lambda v: statistics.mean(v) if v else float("nan")  # noqa: E731
    acc = mean(table[method]["acc"])
    drop = mean([b - a for a, b in zip(table[method]["acc_q1"], table[method]["acc_q4"])])
    out = []
    for base in order:
        if base == method:
            continue
        b_acc = mean(table[base]["acc"])
        b_drop = mean([b - a for a, b in zip(table[base]["acc_q1"], table[base]["acc_q4"])])
        out.append(
            f"- {method} vs {base}: online accuracy {100 * acc:.1f} vs {100 * b_acc:.1f} "
            f"({'higher' if acc > b_acc else 'not higher'}); Q4 - Q1 {100 * drop:+.1f} vs {100 * b_drop:+.1f} "
            f"({'more stable' if drop > b_drop else 'not more stable'})."
        )
    return out


def claim_report(records: list[Any], out_dir: Path) -> str:
    """Markdown: per-variant online accuracy, per-quarter accuracy (collapse), selected fraction; and a plot."""
    order, table = variant_table(records)
    if not order:
        return "No TTA comparison metrics found (was `callbacks.tta_compare.enabled=true`?)."
    lines = [
        "## Test-time adaptation on the stream (mean ± std over seeds, %)",
        "",
        "| variant | online acc | Q1 | Q2 | Q3 | Q4 | Q4 - Q1 | selected |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in order:
        t = table[name]
        drop = [b - a for a, b in zip(t["acc_q1"], t["acc_q4"])]
        cells = [_fmt(t[k]) for k in ("acc", "acc_q1", "acc_q2", "acc_q3", "acc_q4")] + [
            _fmt(drop),
            _fmt(t["selected"]),
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", *verdict(order, table)]
    plot = _curves(records, Path(out_dir))
    if plot is not None:
        lines += ["", f"![accuracy over the stream]({plot.name})"]
    return "\n".join(lines)
