"""Results-page hook of the cross-paper study ``tta_arch``: test-time adaptation across architectures. Tent (Wang et
al., ICLR 2021) reports its gains on CNNs with BatchNorm; does that hold for a ViT with LayerNorm?

Used as ``report: reports.tta_arch:claim_report`` in ``conf/claim/tta_arch.yaml``. Entries ``cnn`` and ``vit`` train
the BaDLoss CNN and the MDA subject ViT on clean Fashion-MNIST (and test on the clean stream); entries
``<arch>_<corruption>`` test the same seed's weights on one corruption at severity 5. Every test pass logs, through
:class:`callbacks.tta.TTAComparison`, ``tta/<method>/acc`` and ``tta/<method>/acc_q1..q4`` for ``source`` (no
adaptation), ``tent``, ``eata`` and ``sar`` on the same model and stream.

The claims (:data:`CLAIMS`, pre-registered before the runs) compare methods *inside* runs and means over the four
corruption entries, which the spec's two-entry claims cannot express, so the hook builds them. Per seed, a method's
top-1 is averaged over the four corruptions (gaussian_noise, defocus_blur, fog, contrast); every claim is paired by
seed (the same trained model adapts on the same stream; across architectures, seed ``s`` draws the same training
subset, test images and corruption noise, ``data.seed = seed``):

1. ``tent_cnn``: Tent beats source under corruption on the CNN (BatchNorm): the paper's claim (primary).
2. ``tent_vit``: Tent beats source under corruption on the ViT (LayerNorm): the question (primary).
3. ``tent_cnn_vs_vit``: Tent gains more (over source) on the CNN than on the ViT (primary).
4. ``collapse_<arch>``: Tent's gain over source in the stream's first quarter is above its gain in the last
   (collapse; measured against source on the same quarter, so the images' own difficulty cancels).
5. ``eata_<arch>``, ``sar_<arch>``: EATA / SAR beat source, as 1-2.

Every claim on an architecture reads ``inconclusive: underfit`` when its source model's clean top-1 is below
:data:`MIN_CLEAN_ACC` or its training entry has not converged (the spec's rule on ``val/loss``), and ``inconclusive:
phenomenon absent`` when the corruptions cost its source model less than :data:`MIN_SHIFT` of top-1 (nothing for
adaptation to recover); claim 3 needs both architectures to pass. Tables: top-1 per stream and per quarter.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from suite.claims import Claim, ClaimResult, ClaimSpec, HookResult, Table, judge_values
from suite.report import mean_sd

ARCHS = {"cnn": "CNN (BatchNorm)", "vit": "ViT (LayerNorm)"}
CORRUPTIONS = ("gaussian_noise", "defocus_blur", "fog", "contrast")
METHODS = ("source", "tent", "eata", "sar")
LABELS = {"source": "source", "tent": "Tent", "eata": "EATA", "sar": "SAR"}
STATS = ("acc", "acc_q1", "acc_q2", "acc_q3", "acc_q4")
MIN_CLEAN_ACC = 0.5  # a 10-class classifier below this clean top-1 is underfit for the question
MIN_SHIFT = 0.05  # the corruptions must cost the source model at least 5 points (mean over corruptions)
BUG_MARGIN = 0.10  # a method this far below source on a stream is flagged on the page (a bug until shown otherwise)
# Smallest effect of interest: one point of top-1 (fraction 0.01), the resolution at which TTA tables report gains
# (the Tent paper's gains on CIFAR-10-C are tens of points; the question here is whether any gain survives on a ViT).
DELTA, DELTA_WHY = 0.01, "one point of top-1, the resolution TTA tables report (stated)"
# (id, text, primary) of every pre-registered claim; how each is computed: claim_values
CLAIMS = (
    ("tent_cnn", "Tent beats source under corruption on the CNN (BatchNorm), mean top-1 over 4 corruptions", True),
    ("tent_vit", "Tent beats source under corruption on the ViT (LayerNorm), mean top-1 over 4 corruptions", True),
    ("tent_cnn_vs_vit", "Tent gains more over source on the CNN (BatchNorm) than on the ViT (LayerNorm)", True),
    ("collapse_cnn", "Tent collapses over the stream on the CNN (its gain over source in Q4 below Q1's)", False),
    ("collapse_vit", "Tent collapses over the stream on the ViT (its gain over source in Q4 below Q1's)", False),
    ("eata_cnn", "EATA beats source under corruption on the CNN (BatchNorm)", False),
    ("eata_vit", "EATA beats source under corruption on the ViT (LayerNorm)", False),
    ("sar_cnn", "SAR beats source under corruption on the CNN (BatchNorm)", False),
    ("sar_vit", "SAR beats source under corruption on the ViT (LayerNorm)", False),
)

Data = dict[tuple[str, str], dict[str, dict[str, float]]]


def split_name(name: str) -> tuple[str, str] | None:
    """``cnn`` -> ``(cnn, clean)``, ``vit_fog`` -> ``(vit, fog)``; ``None`` for a name of neither form."""
    arch, _, corruption = name.partition("_")
    if arch not in ARCHS:
        return None
    return arch, corruption or "clean"


def collect(records: list[Any]) -> Data:
    """``(arch, corruption or 'clean') -> '<method>/<stat>' -> {seed: value}`` from the runs' ``tta/*`` metrics."""
    out: Data = defaultdict(lambda: defaultdict(dict))
    for rec in records:
        key = split_name(rec.name)
        if key is None:
            continue
        for m in METHODS:
            for s in STATS:
                v = rec.metrics.get(f"tta/{m}/{s}")
                if v is not None:
                    out[key][f"{m}/{s}"][str(rec.seed)] = float(v)
    return out


def per_seed(data: Data, arch: str, fn: Any) -> dict[str, float]:
    """``{seed: mean over the four corruptions of fn(cell, seed)}`` for every seed present in all four (a missing
    corruption gives nothing rather than a mean over fewer)."""
    cells = [data.get((arch, c)) for c in CORRUPTIONS]
    if any(c is None or not c.get("source/acc") for c in cells):
        return {}
    out = {}
    for s in sorted(set.intersection(*(set(c["source/acc"]) for c in cells)), key=lambda s: (len(s), s)):
        try:
            out[s] = statistics.fmean(fn(c, s) for c in cells)
        except KeyError:
            continue
    return out


def acc(data: Data, arch: str, method: str, stat: str = "acc") -> dict[str, float]:
    return per_seed(data, arch, lambda c, s: c[f"{method}/{stat}"][s])


def gains(data: Data, arch: str, method: str, stat: str = "acc") -> dict[str, float]:
    return per_seed(data, arch, lambda c, s: c[f"{method}/{stat}"][s] - c[f"source/{stat}"][s])


def claim_values(data: Data, cid: str) -> tuple[tuple[str, str], str, dict, dict, list[str]]:
    """``(entry labels, metric, method side, compared side, architectures whose gates apply)`` of claim ``cid``:
    per seed, a mean over the four corruptions."""
    what, _, arch = cid.partition("_")
    if cid == "tent_cnn_vs_vit":
        a, b = gains(data, "cnn", "tent"), gains(data, "vit", "tent")
        return ("cnn: Tent", "vit: Tent"), "tta/tent/acc - tta/source/acc", a, b, ["cnn", "vit"]
    if what == "collapse":
        q1, q4 = gains(data, arch, "tent", "acc_q1"), gains(data, arch, "tent", "acc_q4")
        return (f"{arch}: Q1", f"{arch}: Q4"), "tta/tent/acc_q - tta/source/acc_q", q1, q4, [arch]
    labels = (f"{arch}: {LABELS[what]}", f"{arch}: source")
    return labels, "tta/<method>/acc", acc(data, arch, what), acc(data, arch, "source"), [arch]


def gate(data: Data, arch: str, convergence: dict[str, tuple[bool, str]]) -> tuple[str | None, str | None, str]:
    """``(underfit reason, absent reason, reading)`` of one architecture (module docstring)."""
    clean = list(data.get((arch, "clean"), {}).get("source/acc", {}).values())
    corrupted = list(acc(data, arch, "source").values())
    reading = f"source clean {mean_sd(clean)}, corrupted {mean_sd(corrupted)}"
    ok, why = convergence.get(arch, (True, ""))
    if not ok:  # the engine names the entry in front of the reason
        return why, None, reading
    if clean and statistics.fmean(clean) < MIN_CLEAN_ACC:
        return f"source clean top-1 below {MIN_CLEAN_ACC} ({reading})", None, reading
    if clean and corrupted and statistics.fmean(clean) - statistics.fmean(corrupted) < MIN_SHIFT:
        return None, f"{arch}: the corruptions cost source less than {MIN_SHIFT} ({reading})", reading
    return None, None, reading


def verdicts(data: Data, convergence: dict[str, tuple[bool, str]]) -> list[ClaimResult]:
    """The pre-registered claims (:data:`CLAIMS`) judged on :func:`collect`'s table; ``convergence``: entry ->
    ``(converged, reading)`` by the spec's rule (the training entries ``cnn`` and ``vit``)."""
    gates = {a: gate(data, a, convergence) for a in ARCHS}
    out = []
    for cid, text, primary in CLAIMS:
        labels, metric, a, b, archs = claim_values(data, cid)
        if not a or not b:
            continue
        claim = Claim(cid, text, f"{metric} (mean of 4 corruptions)", labels, True, delta=DELTA,
                      delta_why=DELTA_WHY, primary=primary, paired=True)  # fmt: skip
        underfit = {x: gates[x][0] for x in archs if gates[x][0]}
        absent = "; ".join(gates[x][1] for x in archs if gates[x][1]) or None
        res = judge_values(claim, a, b, paired=True, unconverged=underfit, absent=absent)
        res.evidence = "; ".join(gates[x][2] for x in archs)
        res.against = ()  # source, Tent, EATA and SAR adapt inside each run: no baseline entry to judge
        out.append(res)
    return out


def suspicious(data: Data) -> list[str]:
    """Streams on which an adapting method ends more than :data:`BUG_MARGIN` below source, or source is at chance."""
    notes = []
    for (arch, corruption), cell in sorted(data.items()):
        src = cell.get("source/acc", {})
        for m in METHODS[1:]:
            for s, v in sorted(cell.get(f"{m}/acc", {}).items()):
                if s in src and src[s] - v > BUG_MARGIN:
                    notes.append(f"{arch} {corruption} seed {s}: {LABELS[m]} {v:.3f} vs source {src[s]:.3f}")
        for s, v in sorted(src.items()):
            if v <= 0.11:
                notes.append(f"{arch} {corruption} seed {s}: source at chance ({v:.3f})")
    return notes


def _pct(values: dict[str, float]) -> str:
    return mean_sd([100.0 * v for v in values.values()])


def tables(data: Data) -> list[Table]:
    """Top-1 per stream (with Tent's first and last quarter) and per quarter of the stream, in %."""
    rows = []
    for arch in ARCHS:
        for corruption in ("clean", *CORRUPTIONS):
            cell = data.get((arch, corruption))
            if cell is not None:
                q = f"{_pct(cell.get('tent/acc_q1', {}))} -> {_pct(cell.get('tent/acc_q4', {}))}"
                rows.append([arch, corruption, *(_pct(cell.get(f"{m}/acc", {})) for m in METHODS), q])
        if acc(data, arch, "source"):
            rows.append([arch, "**mean of 4**", *(_pct(acc(data, arch, m)) for m in METHODS), ""])
    top1 = Table(
        "Top-1 per stream (%, mean ± sd over seeds; 5,000 test images, online, one step per batch of 128)",
        ["architecture", "stream", *(LABELS[m] for m in METHODS), "Tent Q1 -> Q4"],
        rows,
    )
    rows = []
    for arch in ARCHS:
        for m in METHODS:
            qs = [acc(data, arch, m, f"acc_q{q}") for q in range(1, 5)]
            if any(qs):
                rows.append([arch, LABELS[m], *(_pct(v) for v in qs)])
    quarters = Table(
        "Top-1 per quarter of the stream (%, mean over the 4 corruptions, mean ± sd over seeds)",
        ["architecture", "method", "Q1", "Q2", "Q3", "Q4"],
        rows,
    )
    return [top1, quarters]


def claim_report(records: list[Any], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The pre-registered verdicts, the two tables and the sanity flags (see the module docstring).

    Args:
        records: the study's ``suite.compare.RunRecord``s.
        spec: the claim spec (its convergence rule judges the training entries ``cnn`` and ``vit``).
        out_dir: folder of the results page (unused).
    """
    data = collect(records)
    if not data:
        return HookResult(notes=["No runs with `tta/*` metrics found."])
    flags = suspicious(data)
    sanity = (
        f"Sanity (a method more than {BUG_MARGIN * 100:.0f} points below source, or source at chance, is a bug until "
        "shown otherwise): " + ("; ".join(flags) if flags else "none.")
    )
    return HookResult(verdicts=verdicts(data, spec.convergence(records)), tables=tables(data), notes=[sanity])
