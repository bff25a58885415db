"""Results-page hook of the cross-paper study ``quant_outliers`` (issue 50 item 5): does the W4A4 damage of a
classifier follow its massive activations?

Used as ``report: reports.quant_outliers:claim_report`` in ``conf/claim/quant_outliers.yaml``. Each run trains one
classifier (entry ``vit``: the MDA subject; entry ``cnn``: the BaDLoss CNN) and writes ``outlier_census.csv``
(:class:`callbacks.outlier_census.OutlierCensus`, the last census is the end of fit), ``quant_calibration.json``
(W4A4) and ``quant_w8a8_calibration.json`` (the W8A8 control) (:class:`callbacks.quant_classifier.
ClassifierQuantCalibration`). The hook tabulates, per architecture and method, the full-precision top-1, the W4A4
top-1 and its drop, the W8A8 drop and the census (max over layers of top1 / median |h|), mean ± std over seeds.

Pre-registered verdicts (stated before the runs; ``hi`` is the architecture with the larger mean census ratio):

1. *The architecture with the larger outlier ratio loses more top-1 to RTN W4A4*: ``suite.report.compare`` of the
   RTN W4A4 drops (``hi`` vs the other, higher is "more damage"; two standard errors of the difference).
2. *The outlier-aware methods recover more of the RTN drop there*: per seed, recovery = RTN drop minus the smallest
   drop of SmoothQuant / QuaRot / OSTQuant; compared the same way.
3. *Control: W8A8 RTN costs under one point of top-1 on both architectures* (mean drop < :data:`W8_MARGIN`).

Verdicts 1-2 read ``inconclusive: phenomenon absent`` when the two architectures' census ratios overlap over seeds
(no architecture has the larger outliers), ``inconclusive: underfit`` when a classifier's full-precision top-1 is below
:data:`MIN_FP_ACC` (the drops of a near-chance model mean nothing) or, by the suite's rule (never a verdict on runs
that have not converged), when an entry's ``val/loss`` has not plateaued (the page's sizing section).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from reports.systematic_outliers import census_summary, read_census
from suite import report as rep

METHODS = ("fp", "rtn", "smoothquant", "quarot", "ostquant")
AWARE = ("smoothquant", "quarot", "ostquant")
LABELS = {"fp": "FP", "rtn": "RTN", "smoothquant": "SmoothQuant", "quarot": "QuaRot", "ostquant": "OSTQuant"}
MIN_FP_ACC = 0.5  # a 10-class classifier below this top-1 is underfit for the question
W8_MARGIN = 0.01  # the W8A8 control: RTN within one point of full precision


def _json(path: Path, name: str) -> dict | None:
    files = sorted(path.rglob(name))
    return json.loads(files[-1].read_text())["results"] if files else None


def collect(records: list[Any]) -> dict[str, dict[str, list[float]]]:
    """``arch -> key -> values over seeds``: ``ratio``, ``<method>_acc``, ``<method>_drop``, ``w8_<method>_drop``."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rec in records:
        d = out[rec.name]
        w4 = _json(Path(rec.path), "quant_calibration.json")
        w8 = _json(Path(rec.path), "quant_w8a8_calibration.json")
        for m, r in (w4 or {}).items():
            d[f"{m}_acc"].append(float(r["acc"]))
            d[f"{m}_drop"].append(float(r["acc_drop"]))
        for m, r in (w8 or {}).items():
            d[f"w8_{m}_drop"].append(float(r["acc_drop"]))
        cfiles = sorted(Path(rec.path).rglob("outlier_census.csv"))
        if cfiles:
            c = read_census(cfiles[-1])
            d["ratio"].append(float(census_summary(c[max(c)])["ratio_max"]))
    return out


def _ms(v: list[float], pct: bool = False) -> str:
    if not v:
        return "-"
    k = 100.0 if pct else 1.0
    sd = statistics.stdev(v) * k if len(v) > 1 else 0.0
    return f"{statistics.fmean(v) * k:.1f} ± {sd:.1f}"


def _recovery(d: dict[str, list[float]]) -> list[float]:
    aware = [d[f"{m}_drop"] for m in AWARE if d.get(f"{m}_drop")]
    return [r - min(a[i] for a in aware) for i, r in enumerate(d["rtn_drop"])] if aware else []


def verdicts(data: dict[str, dict[str, list[float]]], converged: dict[str, bool] | None = None) -> list[rep.Verdict]:
    """The three pre-registered verdicts (module docstring) from :func:`collect`'s table; ``converged`` (entry ->
    plateaued, the page's sizing rule) makes verdicts 1-2 ``inconclusive: underfit`` when an entry has not."""
    archs = [a for a in data if data[a].get("ratio") and data[a].get("rtn_drop")]
    out: list[rep.Verdict] = []
    if len(archs) == 2:
        hi, lo = sorted(archs, key=lambda a: -statistics.fmean(data[a]["ratio"]))
        separated = min(data[hi]["ratio"]) > max(data[lo]["ratio"])
        fit = all(statistics.fmean(data[a]["fp_acc"]) >= MIN_FP_ACC for a in archs)
        fit = fit and all((converged or {}).get(a, True) for a in archs)
        census = f"census top1/median {hi} {_ms(data[hi]['ratio'])} vs {lo} {_ms(data[lo]['ratio'])}"

        def word(a: list[float], b: list[float]) -> str:
            if not fit:
                return rep.UNDERFIT
            return rep.compare(a, b, higher_is_better=True) if separated else rep.ABSENT

        out.append(rep.Verdict(
            "The architecture with the larger outlier ratio loses more top-1 to RTN W4A4",
            word(data[hi]["rtn_drop"], data[lo]["rtn_drop"]),
            f"{census}; RTN W4A4 drop (points) {hi} {_ms(data[hi]['rtn_drop'], True)} vs {lo} "
            f"{_ms(data[lo]['rtn_drop'], True)}", against=()))  # fmt: skip
        rh, rl = _recovery(data[hi]), _recovery(data[lo])
        if rh and rl:
            out.append(rep.Verdict(
                "The outlier-aware methods (best of SmoothQuant / QuaRot / OSTQuant) recover more of the RTN W4A4 drop "
                "on the architecture with the larger outliers", word(rh, rl),
                f"recovered (points) {hi} {_ms(rh, True)} vs {lo} {_ms(rl, True)}", against=()))  # fmt: skip
    w8 = {a: data[a]["w8_rtn_drop"] for a in data if data[a].get("w8_rtn_drop")}
    if w8:
        ok = all(statistics.fmean(v) < W8_MARGIN for v in w8.values())
        out.append(rep.Verdict(
            f"Control: W8A8 RTN costs under {W8_MARGIN * 100:.0f} point of top-1 on every architecture",
            rep.REPRODUCED if ok else rep.NOT_REPRODUCED,
            "; ".join(f"{a} {_ms(v, True)}" for a, v in w8.items()), against=()))  # fmt: skip
    return out


def claim_report(records: list[Any], out_dir: Path, spec: dict | None = None) -> str:
    """Markdown appended to ``docs/results/quant_outliers.md`` (see module docstring)."""
    data = collect(records)
    metric, hib = rep.sizing_spec(spec or "quant_outliers")
    converged = {k: v[0] for k, v in rep.sizing(records, metric or "val/loss", higher_is_better=hib).items()}
    if not data:
        return "No runs with `quant_calibration.json` found."
    head = "| architecture | census top1/median (max over layers) | " + " | ".join(
        f"{LABELS[m]} W4A4 top-1 % (drop)" for m in METHODS
    )
    lines = [
        "## Top-1 after quantization and the outlier census (mean ± std over seeds; drop in points from FP)",
        "",
        head + " | RTN W8A8 drop |",
        "|---|---|" + "---|" * len(METHODS) + "---|",
    ]
    for arch, d in data.items():
        cells = [f"{_ms(d.get(f'{m}_acc', []), True)} ({_ms(d.get(f'{m}_drop', []), True)})" for m in METHODS]
        lines.append(
            f"| {arch} | {_ms(d.get('ratio', []))} | "
            + " | ".join(cells)
            + f" | {_ms(d.get('w8_rtn_drop', []), True)} |"
        )
    lines += [
        "",
        "## Verdicts (pre-registered in `reports/quant_outliers.py`)",
        "",
        rep.verdict_table(verdicts(data, converged)),
    ]
    return "\n".join(lines)
