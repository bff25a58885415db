"""Claim-check report for OSTQuant: quantized perplexity per subject model and method, and the cross-paper view.

Used as ``report: reports.ostquant:claim_report`` in ``conf/claim/ostquant.yaml``. Each run trains one subject
LM of the suite (softmax attention, the context-aware-scaling variant of the outliers paper, stick-breaking, Gated
DeltaNet, ...) and :class:`callbacks.quant_calibration.QuantCalibration` writes ``quant_calibration.json`` (validation
loss / perplexity / KL to full precision / mean log-QSUR per method). The hook adds:

* the W4A4KV4 table (claim 6a): perplexity and gap to full precision per method, per subject (mean over seeds);
* the loss ablation (KL-Top vs full KL vs cross-entropy) where those methods ran;
* the cross-paper table (claim 6b): per subject, the relative perplexity damage of RTN and of the best rotation
  method, next to the subject's own outlier census (when the run also had ``callbacks.outlier_census``).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from reports.systematic_outliers import census_summary, read_census

LABELS = {
    "fp": "FP",
    "rtn": "RTN",
    "gptq": "GPTQ",
    "smoothquant": "SmoothQuant",
    "quarot": "QuaRot",
    "spinquant": "SpinQuant",
    "ostquant": "OSTQuant",
    "ostquant_kl": "OSTQuant (full KL)",
    "ostquant_ce": "OSTQuant (CE)",
}


def _mean(v: list[float]) -> float:
    v = [x for x in v if x == x]
    return statistics.mean(v) if v else float("nan")


def _sd(v: list[float]) -> float:
    return statistics.stdev(v) if len(v) > 1 else 0.0


def collect(records: list[Any]) -> tuple[dict[str, dict[str, dict[str, list[float]]]], dict[str, list], dict]:
    """``subject -> method -> key -> values over seeds``, ``subject -> census summaries``, bits."""
    table: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    census: dict[str, list[dict[str, Any]]] = defaultdict(list)
    bits: dict[str, Any] = {}
    for rec in records:
        files = sorted(Path(rec.path).rglob("quant_calibration.json"))
        if files:
            data = json.loads(files[-1].read_text())
            bits = data.get("bits", bits)
            for method, res in data["results"].items():
                for k, v in res.items():
                    table[rec.name][method][k].append(float(v))
        cfiles = sorted(Path(rec.path).rglob("outlier_census.csv"))
        if cfiles:
            c = read_census(cfiles[-1])
            census[rec.name].append(census_summary(c[max(c)]))
    return table, census, bits


def claim_report(records: list[Any], out_dir: Path) -> str:
    """Markdown appended to ``docs/results/ostquant.md`` (see module docstring)."""
    table, census, bits = collect(records)
    if not table:
        return "No `quant_calibration.json` found in the runs."
    methods = [m for m in LABELS if any(m in t for t in table.values())]
    main = [m for m in methods if m not in ("ostquant_kl", "ostquant_ce")]
    b = ", ".join(f"{k}={v}" for k, v in bits.items())
    lines = [
        f"## Validation perplexity after quantization ({b}; mean ± std over seeds; gap = ppl - FP ppl)",
        "",
        "| subject | " + " | ".join(LABELS[m] for m in main) + " |",
        "|---|" + "---|" * len(main),
    ]
    for subject, res in table.items():
        cells = []
        for m in main:
            ppl, gap = res[m]["ppl"], res[m].get("ppl_gap", [])
            cells.append(
                "-"
                if not ppl
                else f"{_mean(ppl):.3f}" + ("" if m == "fp" else f" ({_mean(gap):+.3f} ± {_sd(gap):.3f})")
            )
        lines.append(f"| {subject} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "KL to the full-precision model (token mean) and mean log-QSUR of the inputs of the input-side linears:",
    ]
    lines += ["", "| subject | " + " | ".join(f"{LABELS[m]} KL / logQSUR" for m in main if m != "fp") + " |"]
    lines.append("|---|" + "---|" * (len(main) - 1))
    for subject, res in table.items():
        cells = [
            f"{_mean(res[m]['kl']):.2e} / {_mean(res[m].get('log_qsur', [])):.1f}" if res[m]["kl"] else "-"
            for m in main
            if m != "fp"
        ]
        lines.append(f"| {subject} | " + " | ".join(cells) + " |")
    if any(m in methods for m in ("ostquant_kl", "ostquant_ce")):
        abl = [m for m in ("ostquant", "ostquant_kl", "ostquant_ce") if m in methods]
        lines += ["", "## Loss ablation (OSTQuant, gap to FP perplexity)", ""]
        lines += ["| subject | " + " | ".join(LABELS[m] for m in abl) + " |", "|---|" + "---|" * len(abl)]
        for subject, res in table.items():
            if not all(res[m]["ppl"] for m in abl):
                continue
            lines.append(f"| {subject} | " + " | ".join(f"{_mean(res[m].get('ppl_gap', [])):+.3f}" for m in abl) + " |")
        same = [s for s, r in table.items() if r["ostquant"]["ppl"] and r["ostquant"]["ppl"] == r["ostquant_kl"]["ppl"]]
        if same:
            lines += [
                "",
                f"KL-Top and full KL give identical results on {', '.join(same)}: the top-k (official k = 1000, capped"
                " at the vocabulary) covers the whole vocabulary, so the two losses are the same function there.",
            ]
    lines += [
        "",
        "## Cross-paper: does an outlier-free architecture quantize better?",
        "",
        "| subject | FP ppl | RTN damage | best rotation method | its damage | act top1/median | largest attn share "
        "on token 0 |",
        "|---|---|---|---|---|---|---|",
    ]
    rot = [m for m in ("quarot", "spinquant", "ostquant") if m in methods]
    for subject, res in table.items():
        fp = _mean(res["fp"]["ppl"]) if "fp" in res else float("nan")
        rtn = _mean(res["rtn"]["ppl"]) / fp - 1 if "rtn" in res else float("nan")
        best = min(rot, key=lambda m: _mean(res[m]["ppl"])) if rot else None
        dmg = _mean(res[best]["ppl"]) / fp - 1 if best else float("nan")
        cs = census.get(subject, [])
        ratio, sink = _mean([c["ratio_max"] for c in cs]), _mean([c["sink_max"] for c in cs])
        ratio = f"{ratio:.1f}" if ratio == ratio else "-"
        sink = f"{sink:.3f}" if sink == sink else "- (no attention probabilities)"
        lines.append(
            f"| {subject} | {fp:.3f} | {100 * rtn:+.2f} % | {LABELS.get(best, '-')} | {100 * dmg:+.2f} % | "
            f"{ratio} | {sink} |"
        )
    lines += ["", "## Verdict (computed)", "", *verdict(table, main)]
    return "\n".join(lines)


def verdict(table: dict, main: list[str]) -> list[str]:
    """Ranking lines: methods per subject by perplexity gap, and subjects by quantization damage."""
    out = []
    for subject, res in table.items():
        ranked = sorted((m for m in main if m != "fp" and res[m]["ppl"]), key=lambda m: _mean(res[m]["ppl_gap"]))
        if ranked:
            order = " < ".join(f"{LABELS[m]} ({_mean(res[m]['ppl_gap']):+.3f})" for m in ranked)
            out.append(f"* {subject}: gap to FP, smallest first: {order}.")
    if "ostquant" in main:
        wins = [
            s
            for s, res in table.items()
            if res["ostquant"]["ppl"]
            and all(
                _mean(res["ostquant"]["ppl_gap"]) <= _mean(res[m]["ppl_gap"])
                for m in main
                if m != "fp" and res[m]["ppl"]
            )
        ]
        out.append(
            f"* OSTQuant has the smallest gap on {len(wins)} of {len(table)} subjects ({', '.join(wins) or '-'})."
        )
    if "rtn" in main and "fp" in main:
        dmg = {s: _mean(r["rtn"]["ppl"]) / _mean(r["fp"]["ppl"]) - 1 for s, r in table.items() if r["rtn"]["ppl"]}
        order = " < ".join(f"{s} ({100 * d:+.2f} %)" for s, d in sorted(dmg.items(), key=lambda kv: kv[1]))
        out.append(f"* RTN damage (relative perplexity increase), smallest first: {order}.")
        fps = {s: _mean(r["fp"]["ppl"]) for s, r in table.items() if s in dmg}
        order = " > ".join(f"{s} ({p:.3f})" for s, p in sorted(fps.items(), key=lambda kv: -kv[1]))
        out.append(
            f"* FP perplexity, largest first: {order}. Subjects that reach different FP quality are not equally hard "
            "to quantize (a sharper model has more to lose), so damage across architectures is compared at unequal "
            "quality; K/V quantization also differs by mixer (KV cache for attention, none for Gated DeltaNet's "
            "recurrent state)."
        )
    return out
