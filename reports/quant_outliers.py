"""Results-page hook of the cross-paper study ``quant_outliers``: does the W4A4 damage of a classifier follow its
massive activations (OSTQuant, ICLR 2025, and "Systematic Outliers in Large Language Models", ICLR 2025)?

Used as ``report: reports.quant_outliers:claim_report`` in ``conf/claim/quant_outliers.yaml``. Each run trains one
classifier (entry ``vit``: the MDA subject; entry ``cnn``: the BaDLoss CNN) and writes ``outlier_census.csv``
(:class:`callbacks.outlier_census.OutlierCensus`, the last census is the end of fit), ``quant_calibration.json``
(W4A4) and ``quant_w8a8_calibration.json`` (the W8A8 control) (:class:`callbacks.quant_classifier.
ClassifierQuantCalibration`); all three are ``data_files`` of the spec. The study's quantizer (set in the spec):
weights RTN per output channel after BatchNorm is folded into its convolution, activations static per tensor with
ranges calibrated on clean held-out images (``act_scale=tensor fold_bn=true calib_split=val``): the setting in which
one large activation coarsens the grid of every input, the damage SmoothQuant and OSTQuant address.

Pre-registered verdicts (stated before the runs; ``hi`` is the architecture with the larger mean census ratio, the
entries are paired by seed when both train and test on the same seed's data):

1. ``larger_outliers_lose_more`` (primary): ``hi`` loses more top-1 to RTN W4A4 than the other architecture.
2. ``aware_recover_more`` (primary): the outlier-aware methods recover more of the RTN drop on ``hi``; per seed,
   recovery = RTN drop minus the smallest drop of SmoothQuant / QuaRot / OSTQuant.
3. ``w8a8_control_<arch>``: W8A8 RTN is non-inferior to full precision within :data:`DELTA` of top-1 on each
   architecture (the same model and test images: paired), a check that the quantizers are not broken.

Verdicts 1-2 read ``inconclusive: phenomenon absent`` when neither architecture has massive activations by the
census's criterion (mean over seeds of the census ratio below :data:`MASSIVE`, the systematic-outliers study's
threshold: :func:`massive_absent`), or when the two architectures' census ratios overlap over seeds (no architecture
has the larger outliers); ``inconclusive: underfit`` when a classifier's full-precision top-1 is
below :data:`MIN_FP_ACC` (the drops of a near-chance model mean nothing) or its ``val/loss`` had not converged.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from reports.systematic_outliers import MASSIVE, census_summary, read_census
from suite import report as rep
from suite.claims import Claim, ClaimResult, ClaimSpec, HookResult, Table, default_paired, judge_values

METHODS = ("fp", "rtn", "smoothquant", "quarot", "ostquant")
AWARE = ("smoothquant", "quarot", "ostquant")
LABELS = {"fp": "FP", "rtn": "RTN", "smoothquant": "SmoothQuant", "quarot": "QuaRot", "ostquant": "OSTQuant"}
MIN_FP_ACC = 0.5  # a 10-class classifier below this top-1 is underfit for the question
DELTA = 0.01  # one point of top-1 (10 of the 1000 test images): the smallest effect of interest, the control's margin

Data = dict[str, dict[str, dict[str, float]]]  # arch -> key -> {seed: value}


def _json(path: Path, name: str) -> dict | None:
    files = sorted(path.rglob(name))
    return json.loads(files[-1].read_text())["results"] if files else None


def collect(records: list[Any]) -> Data:
    """``arch -> key -> {seed: value}``: ``ratio``, ``<method>_acc``, ``<method>_drop``, ``w8_<method>_acc``,
    ``w8_<method>_drop``."""
    out: Data = defaultdict(lambda: defaultdict(dict))
    for rec in records:
        d, seed = out[rec.name], str(rec.seed)
        for prefix, name in (("", "quant_calibration.json"), ("w8_", "quant_w8a8_calibration.json")):
            for m, r in (_json(Path(rec.path), name) or {}).items():
                d[f"{prefix}{m}_acc"][seed] = float(r["acc"])
                d[f"{prefix}{m}_drop"][seed] = float(r["acc_drop"])
        cfiles = sorted(Path(rec.path).rglob("outlier_census.csv"))
        if cfiles:
            c = read_census(cfiles[-1])
            d["ratio"][seed] = float(census_summary(c[max(c)])["ratio_max"])
    return out


def recovery(d: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per seed, the RTN drop minus the smallest drop of the outlier-aware methods."""
    aware = [d[f"{m}_drop"] for m in AWARE if d.get(f"{m}_drop")]
    rtn = d.get("rtn_drop", {})
    return {s: rtn[s] - min(a[s] for a in aware) for s in rtn if aware and all(s in a for a in aware)}


def massive_absent(data: Data) -> str | None:
    """Why the phenomenon is absent when no architecture has massive activations (mean over seeds of its census
    ratio, the max over layers of top1 / median |h|, below :data:`MASSIVE`); ``None`` when one has."""
    means = {a: statistics.fmean(d["ratio"].values()) for a, d in data.items() if d.get("ratio")}
    if not means or max(means.values()) >= MASSIVE:
        return None
    seen = "; ".join(
        f"{a} {means[a]:.1f} (by seed " + ", ".join(f"{v:.1f}" for _, v in sorted(data[a]["ratio"].items())) + ")"
        for a in means
    )
    return (
        f"neither model has massive activations (census top1/median, max over layers: {seen}; criterion >= "
        f"{MASSIVE:.0f})"
    )


def verdicts(records: list[Any], data: Data, convergence: dict[str, tuple[bool, str]]) -> list[ClaimResult]:
    """The pre-registered verdicts (module docstring) from :func:`collect`'s table; ``convergence``: entry ->
    ``(converged, reading)`` (the page's convergence rule)."""
    archs = [a for a in data if data[a].get("ratio") and data[a].get("rtn_drop")]
    out: list[ClaimResult] = []
    if len(archs) == 2:
        hi, lo = sorted(archs, key=lambda a: -statistics.fmean(data[a]["ratio"].values()))
        absent = massive_absent(data)
        if absent is None and not min(data[hi]["ratio"].values()) > max(data[lo]["ratio"].values()):
            ratios = ", ".join(f"{a} {rep.mean_sd(data[a]['ratio'].values())}" for a in (hi, lo))
            absent = f"the census ratios overlap over seeds ({ratios}): no architecture has the larger outliers"
        unconverged = {a: convergence[a][1] for a in archs if a in convergence and not convergence[a][0]}
        for a in archs:
            acc = statistics.fmean(data[a]["fp_acc"].values()) if data[a].get("fp_acc") else float("nan")
            if not acc >= MIN_FP_ACC:
                unconverged[a] = f"full-precision top-1 {acc:.3f} < {MIN_FP_ACC} (near chance)"
        paired = default_paired(records, hi, lo)
        why = f"one point of top-1 ({DELTA * 1000:.0f} of 1000 test images), the control's margin"
        for cid, text, a, b in (
            (
                "larger_outliers_lose_more",
                "The architecture with the larger outlier ratio loses more top-1 to RTN W4A4",
                data[hi]["rtn_drop"],
                data[lo]["rtn_drop"],
            ),
            (
                "aware_recover_more",
                "The outlier-aware methods (best of SmoothQuant / QuaRot / OSTQuant) recover more "
                "of the RTN W4A4 drop on the architecture with the larger outliers",
                recovery(data[hi]),
                recovery(data[lo]),
            ),
        ):
            claim = Claim(
                cid,
                f"{text} ({hi} over {lo})",
                "top-1 (fraction)",
                (hi, lo),
                higher_is_better=True,
                delta=DELTA,
                delta_why=why,
                primary=True,
            )
            if a and b:
                out.append(judge_values(claim, a, b, paired=paired, unconverged=unconverged, absent=absent))
    for arch in data:
        fp, q = data[arch].get("w8_fp_acc"), data[arch].get("w8_rtn_acc")
        if fp and q:
            claim = Claim(
                f"w8a8_control_{arch}",
                f"Control: W8A8 RTN costs under one point of top-1 ({arch})",
                "W8A8 top-1 (fraction)",
                (f"{arch} W8A8 RTN", f"{arch} FP"),
                higher_is_better=True,
                kind="non_inferior",
                delta=DELTA,
                delta_why="the study's pre-registered margin",
            )
            # the same trained model scored on the same test images: paired by seed; a quantizer check, so the
            # classifier's convergence does not enter
            out.append(judge_values(claim, q, fp, paired=True))
    return out


def table(data: Data) -> Table:
    """Per architecture: the census ratio and, per method, W4A4 top-1 and its drop (percent), and the W8A8 RTN drop."""
    rows = []
    for arch, d in data.items():
        cells = [
            f"{rep.mean_sd([100 * v for v in d.get(f'{m}_acc', {}).values()])} "
            f"({rep.mean_sd([100 * v for v in d.get(f'{m}_drop', {}).values()])})"
            for m in METHODS
        ]
        w8 = rep.mean_sd([100 * v for v in d.get("w8_rtn_drop", {}).values()])
        rows.append([arch, rep.mean_sd(d.get("ratio", {}).values()), *cells, w8])
    columns = [
        "architecture",
        "census top1/median (max over layers)",
        *(f"{LABELS[m]} W4A4 top-1 % (drop)" for m in METHODS),
        "RTN W8A8 drop",
    ]
    return Table(
        "Top-1 after quantization and the outlier census (mean ± sd over seeds; drop in points from FP)", columns, rows
    )


def quantizer_note(records: list[Any]) -> str | None:
    """One line naming the W4A4 quantizer the runs used (from their ``quant_calibration.json``)."""
    seen = set()
    for rec in records:
        files = sorted(Path(rec.path).rglob("quant_calibration.json"))
        if files:
            p = json.loads(files[-1].read_text())
            seen.add((p.get("act_scale", "token"), bool(p.get("fold_bn", False)), p.get("calib_split", "train")))
    if not seen:
        return None
    words = {"token": "dynamic per token", "tensor": "static per tensor (ranges calibrated once)"}
    return (
        "Quantizer: "
        + "; ".join(
            f"activations {words.get(a, a)}, BatchNorm {'folded into its convolution' if f else 'not folded'}, "
            f"calibration on the {c} split"
            for a, f, c in sorted(seen)
        )
        + "; weights RTN per output channel."
    )


def claim_report(records: list[Any], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The pre-registered verdicts, the table and the quantizer note (module docstring)."""
    data = collect(records)
    if not data:
        return HookResult(notes=["No runs with `quant_calibration.json` found: no verdict."])
    note = quantizer_note(records)
    return HookResult(
        verdicts=verdicts(records, data, spec.convergence(records)), tables=[table(data)], notes=[note] if note else []
    )
