"""Results-page hook of the ostquant claim (``report: reports.ostquant:claim_report``).

Paper: "OSTQuant: Refining Large Language Model Quantization with Orthogonal and Scaling Transformations for Better
Distribution Fitting" (ICLR 2025): learned orthogonal and scaling transforms with the KL-Top loss close more of the
W4A4KV4 gap to full precision than RTN, SmoothQuant, GPTQ, QuaRot and SpinQuant.

Each run trains one subject LM of the suite (softmax attention, the context-aware-scaling variant of the outliers
paper, stick-breaking, Gated DeltaNet) and :class:`callbacks.quant_calibration.QuantCalibration` logs
``quant/<method>_<key>`` and writes ``quant_calibration.json`` (per method: validation loss, perplexity and its gap to
full precision, KL to full precision, mean log-QSUR); an outlier census of the subject runs alongside
(``outlier_census.csv``). Both files are ``data_files`` of the spec.

The spec declares OSTQuant against each baseline and the loss ablation as two metrics of the softmax runs (paired by
seed by construction). The hook adds what the spec cannot say:

* a method claim reads ``inconclusive: phenomenon absent`` where the two methods gave identical results on every
  seed (:func:`same_function`: KL-Top and full KL when ``k`` covers the vocabulary);
* the cross-paper claim (the outlier-free ``ca_scale`` subject loses less to RTN W4A4 than softmax) is read on the
  RTN damage, a quantity derived per seed from two logged metrics (:func:`rtn_damage`), ``inconclusive: phenomenon
  absent`` unless the softmax subject has massive activations by the census's criterion
  (:data:`reports.systematic_outliers.MASSIVE`);

and the perplexity table per subject and method, the KL / log-QSUR table, the loss ablation, the cross-paper table
and the computed rankings.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reports.systematic_outliers import MASSIVE, census_summary, read_census
from suite import report as rep
from suite.claims import Claim, ClaimResult, ClaimSpec, HookResult, Table, default_paired, judge_values, seed_values

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
ABLATIONS = ("ostquant_kl", "ostquant_ce")
CROSS_PAPER = "ca_scale_quantizes_better"  # the declared claim read on the derived RTN damage

Results = dict[str, dict[str, dict[str, dict[str, float]]]]  # subject -> method -> key -> {seed: value}


def _mean(v: Mapping[str, float] | list[float]) -> float:
    v = [x for x in (v.values() if isinstance(v, Mapping) else v) if math.isfinite(x)]
    return statistics.fmean(v) if v else float("nan")


def collect(records: list[Any]) -> tuple[Results, dict[str, dict[str, dict[str, Any]]], dict]:
    """``subject -> method -> key -> {seed: value}``, ``subject -> {seed: census summary at the last step}``, bits."""
    table: Results = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    census: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    bits: dict[str, Any] = {}
    for rec in records:
        files = sorted(Path(rec.path).rglob("quant_calibration.json"))
        if files:
            data = json.loads(files[-1].read_text())
            bits = data.get("bits", bits)
            for method, res in data["results"].items():
                for k, v in res.items():
                    table[rec.name][method][k][str(rec.seed)] = float(v)
        cfiles = sorted(Path(rec.path).rglob("outlier_census.csv"))
        if cfiles:
            c = read_census(cfiles[-1])
            census[rec.name][str(rec.seed)] = census_summary(c[max(c)])
    return table, census, bits


def same_function(records: list[Any], spec: ClaimSpec) -> dict[str, str]:
    """Claim id -> why its phenomenon is absent, for every declared claim on two metrics of one entry that were
    identical on every seed: the two methods are the same function there (e.g. a top-k that covers the whole vocabulary
    is the full KL), so neither can beat the other."""
    out = {}
    for c in spec.claims:
        if c.entries[0] != c.entries[1] or c.metrics[0] == c.metrics[1]:
            continue
        a, b = (seed_values(records, c.entries[0], m) for m in c.metrics)
        if a and a == b:
            out[c.id] = (
                f"`{c.metrics[0]}` and `{c.metrics[1]}` were identical on every seed: the same function here (a top-k "
                "that covers the whole vocabulary is the full KL)"
            )
    return out


def rtn_damage(res: Mapping[str, Mapping[str, Mapping[str, float]]]) -> dict[str, float]:
    """Per seed, the relative perplexity increase of RTN W4A4: ``ppl_rtn / ppl_fp - 1``."""
    q, f = res.get("rtn", {}).get("ppl", {}), res.get("fp", {}).get("ppl", {})
    return {s: q[s] / f[s] - 1 for s in q if s in f}


def cross_paper(claim: Claim, records: list[Any], table: Results, census: dict, conv: dict) -> ClaimResult | None:
    """The subject-vs-subject ``claim`` on the RTN damage per seed (:func:`rtn_damage`; paired as the spec says, else
    by default), phenomenon absent unless the compared-with subject (softmax) has massive activations (mean over seeds
    of the census's largest top1/median); ``None`` without results on both subjects."""
    a, b = (rtn_damage(table.get(s, {})) for s in claim.entries)
    if not a or not b:
        return None
    base = claim.entries[1]
    ratio = _mean([c["ratio_max"] for c in census.get(base, {}).values()])
    absent = None
    if not ratio >= MASSIVE:
        absent = f"the {base} subject has no massive activations (top1/median {ratio:.1f}, criterion >= {MASSIVE:g})"
    unconverged = {n: conv[n][1] for n in claim.entries if n in conv and not conv[n][0]}
    paired = claim.paired if claim.paired is not None else default_paired(records, *claim.entries)
    return judge_values(claim, a, b, paired=paired, unconverged=unconverged, absent=absent)


def tables(table: Results, census: dict, bits: dict) -> list[Table]:
    """Perplexity per subject and method, KL / log-QSUR, the loss ablation and the cross-paper table."""
    methods = [m for m in LABELS if any(m in t for t in table.values())]
    main = [m for m in methods if m not in ABLATIONS]
    b = ", ".join(f"{k}={v}" for k, v in bits.items())
    ppl_rows, kl_rows = [], []
    for subject, res in table.items():
        cells = []
        for m in main:
            ppl, gap = res.get(m, {}).get("ppl"), res.get(m, {}).get("ppl_gap", {})
            cells.append(
                "-" if not ppl else f"{_mean(ppl):.3f}" + ("" if m == "fp" else f" ({rep.mean_sd(gap.values())})")
            )
        ppl_rows.append([subject, *cells])
        kl_rows.append(
            [subject]
            + [
                f"{_mean(res[m]['kl']):.2e} / {_mean(res[m].get('log_qsur', {})):.1f}"
                if res.get(m, {}).get("kl")
                else "-"
                for m in main
                if m != "fp"
            ]
        )
    out = [
        Table(
            f"Validation perplexity after quantization ({b}; gap = ppl - FP ppl per seed, mean ± sd)",
            ["subject", *(LABELS[m] for m in main)],
            ppl_rows,
        ),
        Table(
            "KL to the full-precision model (token mean) / mean log-QSUR of the inputs of the input-side linears",
            ["subject", *(LABELS[m] for m in main if m != "fp")],
            kl_rows,
        ),
    ]
    abl = [m for m in ("ostquant", *ABLATIONS) if m in methods]
    if len(abl) > 1:
        rows = [[s, *(_mean(r[m]["ppl_gap"]) for m in abl)] for s, r in table.items() if all(m in r for m in abl)]
        same = [s for s, r in table.items() if "ostquant_kl" in r and r["ostquant"]["ppl"] == r["ostquant_kl"]["ppl"]]
        note = (
            f"KL-Top and full KL give identical results on {', '.join(same)}: the top-k (official k = 1000, capped "
            "at the vocabulary) covers the whole vocabulary, so the two losses are the same function there."
            if same
            else ""
        )
        out.append(
            Table(
                "Loss ablation (OSTQuant, gap to FP perplexity, mean over seeds)",
                ["subject", *(LABELS[m] for m in abl)],
                rows,
                note,
            )
        )
    rot = [m for m in ("quarot", "spinquant", "ostquant") if m in methods]
    rows = []
    for subject, res in table.items():
        fp = _mean(res["fp"]["ppl"]) if "fp" in res else float("nan")
        best = min((m for m in rot if m in res), key=lambda m: _mean(res[m]["ppl"]), default=None)
        cs = list(census.get(subject, {}).values())
        ratio, sink = _mean([c["ratio_max"] for c in cs]), _mean([c["sink_max"] for c in cs])
        rows.append(
            [
                subject,
                f"{fp:.3f}",
                f"{100 * _mean(rtn_damage(res)):+.2f} %",
                LABELS.get(best, "-"),
                f"{100 * (_mean(res[best]['ppl']) / fp - 1):+.2f} %" if best else "-",
                f"{ratio:.1f}" if ratio == ratio else "-",
                f"{sink:.3f}" if sink == sink else "- (no attention)",
            ]
        )
    columns = [
        "subject",
        "FP ppl",
        "RTN damage",
        "best rotation method",
        "its damage",
        "act top1/median",
        "largest attn share on token 0",
    ]
    out.append(Table("Cross-paper: does an outlier-free architecture quantize better?", columns, rows))
    return out


def rankings(table: Results) -> list[str]:
    """Computed readings: methods per subject by perplexity gap, and subjects by quantization damage."""
    main = [m for m in LABELS if m != "fp" and m not in ABLATIONS]
    gaps = {s: {m: _mean(r[m]["ppl_gap"]) for m in main if r.get(m, {}).get("ppl")} for s, r in table.items()}
    out = []
    for subject, g in gaps.items():
        if g:
            order = " < ".join(f"{LABELS[m]} ({g[m]:+.3f})" for m in sorted(g, key=g.get))
            out.append(f"{subject}: gap to FP, smallest first: {order}.")
    wins = [s for s, g in gaps.items() if "ostquant" in g and g["ostquant"] <= min(g.values())]
    out.append(f"OSTQuant has the smallest gap on {len(wins)} of {len(table)} subjects ({', '.join(wins) or '-'}).")
    dmg = {s: _mean(rtn_damage(r)) for s, r in table.items() if rtn_damage(r)}
    if dmg:
        order = " < ".join(f"{s} ({100 * d:+.2f} %)" for s, d in sorted(dmg.items(), key=lambda kv: kv[1]))
        out.append(f"RTN damage (relative perplexity increase), smallest first: {order}.")
        fps = sorted(((s, _mean(table[s]["fp"]["ppl"])) for s in dmg), key=lambda kv: -kv[1])
        out.append(
            "FP perplexity, largest first: " + " > ".join(f"{s} ({p:.3f})" for s, p in fps) + ". Subjects that reach "
            "different FP quality are not equally hard to quantize (a sharper model has more to lose), so damage "
            "across architectures is compared at unequal quality; K/V quantization also differs by mixer (KV cache "
            "for attention, none for Gated DeltaNet's recurrent state)."
        )
    return out


def claim_report(records: list[Any], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The absent method claims, the cross-paper verdict, tables and rankings (module docstring)."""
    absent = same_function(records, spec)
    table, census, bits = collect(records)
    if not table:
        return HookResult(absent=absent, notes=["No `quant_calibration.json` found in the runs: no table."])
    declared = {c.id: c for c in spec.claims}
    cross = None
    if CROSS_PAPER in declared:
        cross = cross_paper(declared[CROSS_PAPER], records, table, census, spec.convergence(records))
    return HookResult(
        verdicts=[cross] if cross else [],
        absent=absent,
        tables=tables(table, census, bits),
        notes=rankings(table),
    )
