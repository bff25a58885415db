"""Results-page hook of the cross-paper study ``tta_arch``: test-time adaptation across architectures. Tent (Wang et
al., ICLR 2021) reports its gains on CNNs with BatchNorm; does that hold for a ViT with LayerNorm?

Used as ``report: reports.tta_arch:claim_report`` in ``conf/claim/tta_arch.yaml``. Entries ``cnn`` and ``vit`` train
the BaDLoss CNN and the MDA subject ViT on clean Fashion-MNIST (and test their best-validation weights on the clean
stream); entries ``<arch>_<corruption>`` test the same weights on one corruption at severity 5, and
``<arch>_label_shift`` on the gaussian_noise images sorted by class (an online label shift, SAR's wild setting). Every
test pass logs, through :class:`callbacks.tta.TTAComparison`, ``tta/<method>/acc`` and ``tta/<method>/acc_q1..q4``
for ``source`` (no adaptation), ``bn`` (BN-adapt: test-batch BatchNorm statistics, no gradient step; the source model
on the ViT, which has no BatchNorm), ``tent``, ``eata`` and ``sar`` on the same model and stream.

The claims are declared in the spec (``claims:``, with their deltas); they compare arms scored inside the same runs,
so this hook computes their per-seed values (:func:`side_values`) and judges them, and its verdicts replace the
engine's. A claim's metric is a run metric or a difference of two (``tta/tent/acc - tta/bn/acc``); on a training
entry (``cnn``, ``vit``) it is the mean over that architecture's four i.i.d. corruption streams (a seed missing one of
them gives nothing rather than a mean over fewer), on a stream entry the run's own value. Gates, per architecture a
claim reads: ``inconclusive: underfit`` when its source model's clean top-1 is below :data:`MIN_CLEAN_ACC` or its
training entry has not converged (the spec's rule on ``val/loss``); ``inconclusive: phenomenon absent`` when the
corruptions cost its source model less than :data:`MIN_SHIFT` (nothing to recover), and for a collapse claim (one on
the stream's quarters) read on a stream where collapse cannot occur: only the :data:`WILD_STREAMS` qualify.

Tables: top-1 per stream (every corruption a row, with Tent minus BN-adapt and its paired 95% interval; a stream on
which the source model sits near chance is named so) and per quarter of the stream.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from suite import stats
from suite.claims import Claim, ClaimResult, ClaimSpec, HookResult, Table, judge_values, stated
from suite.report import mean_sd

ARCHS = {"cnn": "CNN (BatchNorm)", "vit": "ViT (LayerNorm)"}
CORRUPTIONS = ("gaussian_noise", "defocus_blur", "fog", "contrast")
WILD_STREAMS = ("label_shift",)  # streams where Tent can collapse (SAR's wild settings); the corruptions are i.i.d.
STREAMS = ("clean", *CORRUPTIONS, *WILD_STREAMS)
METHODS = ("source", "bn", "tent", "eata", "sar")
LABELS = {"source": "source", "bn": "BN-adapt", "tent": "Tent", "eata": "EATA", "sar": "SAR"}
STATS = ("acc", "acc_q1", "acc_q2", "acc_q3", "acc_q4")
NUM_CLASSES = 10
MIN_CLEAN_ACC = 0.5  # a 10-class classifier below this clean top-1 is underfit for the question
MIN_SHIFT = 0.05  # the corruptions must cost the source model at least 5 points (mean over corruptions)
NEAR_CHANCE = 0.06  # a source top-1 within this of chance (1/10) on a stream: the stream carries almost no signal
BUG_MARGIN = 0.10  # a method this far below source on an i.i.d. stream is flagged on the page

Data = dict[tuple[str, str], dict[str, dict[str, float]]]


def split_name(name: str) -> tuple[str, str] | None:
    """``cnn`` -> ``(cnn, clean)``, ``vit_fog`` -> ``(vit, fog)``; ``None`` for a name of neither form."""
    arch, _, stream = name.partition("_")
    if arch not in ARCHS:
        return None
    return arch, stream or "clean"


def collect(records: list[Any]) -> Data:
    """``(arch, stream) -> 'tta/<method>/<stat>' -> {seed: value}`` from the runs' ``tta/*`` metrics."""
    out: Data = defaultdict(lambda: defaultdict(dict))
    for rec in records:
        key = split_name(rec.name)
        if key is None:
            continue
        for m in METHODS:
            for s in STATS:
                v = rec.metrics.get(f"tta/{m}/{s}")
                if v is not None:
                    out[key][f"tta/{m}/{s}"][str(rec.seed)] = float(v)
    return out


def _seed_order(s: str) -> tuple[int, str]:
    return len(s), s


def run_values(cell: dict[str, dict[str, float]], expr: str) -> dict[str, float]:
    """``{seed: value}`` of ``expr`` (a metric, or ``a - b``) on one stream's runs; seeds lacking a term drop out."""
    terms = [t.strip() for t in expr.split(" - ")]
    if len(terms) > 2 or not all(terms):
        raise ValueError(f"claim metric {expr!r}: a run metric or a difference `a - b` of two")
    cols = [cell.get(t, {}) for t in terms]
    seeds = sorted(set.intersection(*(set(c) for c in cols)), key=_seed_order)
    return {s: cols[0][s] - (cols[1][s] if len(cols) > 1 else 0.0) for s in seeds}


def side_values(data: Data, entry: str, expr: str) -> dict[str, float]:
    """Per seed, ``expr`` on ``entry``: on a training entry the mean over its architecture's four corruption streams
    (seeds present in all four), on a stream entry the run's own value."""
    if entry in ARCHS:
        per = [run_values(data.get((entry, c), {}), expr) for c in CORRUPTIONS]
        seeds = sorted(set.intersection(*(set(p) for p in per)), key=_seed_order)
        return {s: statistics.fmean(p[s] for p in per) for s in seeds}
    key = split_name(entry)
    return run_values(data.get(key, {}), expr) if key else {}


def gate(data: Data, arch: str, convergence: dict[str, tuple[bool, str]]) -> tuple[str | None, str | None, str]:
    """``(underfit reason, absent reason, reading)`` of one architecture (module docstring)."""
    clean = list(data.get((arch, "clean"), {}).get("tta/source/acc", {}).values())
    corrupted = list(side_values(data, arch, "tta/source/acc").values())
    reading = f"{arch} source clean {mean_sd(clean)}, corrupted {mean_sd(corrupted)}"
    ok, why = convergence.get(arch, (True, ""))
    if not ok:  # the engine names the entry in front of the reason
        return why, None, reading
    if clean and statistics.fmean(clean) < MIN_CLEAN_ACC:
        return f"source clean top-1 below {MIN_CLEAN_ACC} ({reading})", None, reading
    if clean and corrupted and statistics.fmean(clean) - statistics.fmean(corrupted) < MIN_SHIFT:
        return None, f"{arch}: the corruptions cost source less than {MIN_SHIFT} ({reading})", reading
    return None, None, reading


def is_collapse(claim: Claim) -> bool:
    """A claim about the course of the stream (it reads quarters)."""
    return any("/acc_q" in m for m in claim.metrics)


def judge_claim(claim: Claim, data: Data, convergence: dict[str, tuple[bool, str]]) -> ClaimResult | None:
    """The verdict of one declared claim on :func:`collect`'s table (module docstring); ``None`` for a claim on
    entries of neither form (``<arch>``, ``<arch>_<stream>``)."""
    streams = [split_name(e) for e in claim.entries]
    if None in streams:
        return None
    archs = list(dict.fromkeys(a for a, _ in streams))
    archs += [a for n in claim.converge or () if (k := split_name(n)) and (a := k[0]) not in archs]
    if is_collapse(claim):
        iid = [e for e, (_, s) in zip(claim.entries, streams, strict=True) if s not in WILD_STREAMS]
        if iid:
            why = (
                f"collapse is judged only on a stream where it can occur ({', '.join(WILD_STREAMS)}: SAR's wild "
                f"settings); {', '.join(sorted(set(iid)))} is an i.i.d. stream"
            )
            return stated(claim.id, claim.text, stats.ABSENT, why, primary=claim.primary, against=())
    a, b = (side_values(data, e, m) for e, m in zip(claim.entries, claim.metrics, strict=True))
    if not a or not b:  # said here: the engine would read a training entry's own (clean-stream) metric instead
        missing = [e for e, v in zip(claim.entries, (a, b), strict=True) if not v]
        why = "no finished runs on " + ", ".join(
            f"{e} (no seed with all of {', '.join(CORRUPTIONS)})" if e in ARCHS else e for e in missing
        )
        return stated(claim.id, claim.text, stats.NOISE, why, primary=claim.primary, against=())
    gates = {x: gate(data, x, convergence) for x in archs}
    underfit = {x: gates[x][0] for x in archs if gates[x][0]}
    absent = None
    if any(e in ARCHS for e in claim.entries):  # a mean over the corruptions: they must cost the source something
        absent = "; ".join(gates[x][1] for x in archs if gates[x][1]) or None
    paired = True if claim.paired is None else claim.paired
    res = judge_values(claim, a, b, paired=paired, unconverged=underfit, absent=absent)
    res.evidence = "; ".join(gates[x][2] for x in archs)
    res.against = ()  # the arms adapt inside each run: no baseline entry to judge
    return res


def verdicts(data: Data, spec: ClaimSpec, convergence: dict[str, tuple[bool, str]]) -> list[ClaimResult]:
    """Every declared claim of ``spec`` judged on ``data``; ``convergence``: entry -> ``(converged, reading)``."""
    return [r for c in spec.claims if (r := judge_claim(c, data, convergence)) is not None]


def near_chance(cell: dict[str, dict[str, float]]) -> float | None:
    """The source model's mean top-1 on a stream when it sits within :data:`NEAR_CHANCE` of chance, else ``None``."""
    src = list(cell.get("tta/source/acc", {}).values())
    if src and statistics.fmean(src) < 1 / NUM_CLASSES + NEAR_CHANCE:
        return statistics.fmean(src)
    return None


def suspicious(data: Data) -> list[str]:
    """An adapting method more than :data:`BUG_MARGIN` below source on an i.i.d. stream (on a wild stream that is
    what the stream tests), and BN-adapt differing from source on the ViT, which has no BatchNorm."""
    notes = []
    for (arch, stream), cell in sorted(data.items()):
        src = cell.get("tta/source/acc", {})
        if stream not in WILD_STREAMS:
            for m in METHODS[1:]:
                for s, v in sorted(cell.get(f"tta/{m}/acc", {}).items()):
                    if s in src and src[s] - v > BUG_MARGIN:
                        notes.append(f"{arch} {stream} seed {s}: {LABELS[m]} {v:.3f} vs source {src[s]:.3f}")
        if arch == "vit":
            for s, v in sorted(cell.get("tta/bn/acc", {}).items()):
                if s in src and v != src[s]:
                    notes.append(f"vit {stream} seed {s}: BN-adapt {v:.4f} differs from source {src[s]:.4f}")
    return notes


def _pct(values: dict[str, float]) -> str:
    return mean_sd([100.0 * v for v in values.values()]) if values else "—"


def _diff_ci(a: dict[str, float], b: dict[str, float]) -> str:
    """``+1.2 [-0.3, +2.7]`` points: the paired 95% t interval of ``a - b`` (the mean alone under two seeds)."""
    d = {s: 100.0 * (a[s] - b[s]) for s in a if s in b}
    if not d:
        return "—"
    mean = statistics.fmean(d.values())
    if len(d) < 2:
        return f"{mean:+.2f} (n=1)"
    try:
        iv = stats.paired_interval(list(d.values()), [0.0] * len(d))
    except ValueError:
        return f"{mean:+.2f} (n={len(d)}, no interval)"
    return f"{mean:+.2f} [{iv.lo:+.2f}, {iv.hi:+.2f}] (n={len(d)})"


def stream_label(stream: str, cell: dict[str, dict[str, float]]) -> str:
    chance = near_chance(cell)
    if chance is None:
        return stream
    return f"{stream} (source near chance: {100 * chance:.1f}%, chance {100 / NUM_CLASSES:.0f}%)"


def tables(data: Data) -> list[Table]:
    """Top-1 per stream, every corruption a row, with Tent minus BN-adapt; top-1 per quarter of the stream."""
    rows = []
    for arch in ARCHS:
        for stream in STREAMS:
            cell = data.get((arch, stream))
            if cell is None:
                continue
            tent_bn = _diff_ci(cell.get("tta/tent/acc", {}), cell.get("tta/bn/acc", {}))
            q = f"{_pct(cell.get('tta/tent/acc_q1', {}))} -> {_pct(cell.get('tta/tent/acc_q4', {}))}"
            accs = [_pct(cell.get(f"tta/{m}/acc", {})) for m in METHODS]
            rows.append([arch, stream_label(stream, cell), *accs, tent_bn, q])
            if stream == CORRUPTIONS[-1] and side_values(data, arch, "tta/source/acc"):
                means = {m: side_values(data, arch, f"tta/{m}/acc") for m in METHODS}
                rows.append(
                    [
                        arch,
                        "**mean of 4 corruptions**",
                        *(_pct(means[m]) for m in METHODS),
                        _diff_ci(means["tent"], means["bn"]),
                        "",
                    ]
                )
    top1 = Table(
        "Top-1 per stream (%, mean ± sd over seeds; 5,000 test images, online, one step per batch of 128)",
        ["architecture", "stream", *(LABELS[m] for m in METHODS), "Tent - BN-adapt [95% CI, paired]", "Tent Q1 -> Q4"],
        rows,
        note=(
            "BN-adapt normalises with test-batch statistics and takes no gradient step; the ViT has no BatchNorm, so "
            "there it is the source model. label_shift: the gaussian_noise images sorted by class. A stream on which "
            f"the source model's top-1 is within {100 * NEAR_CHANCE:.0f} points of chance is named so: it carries "
            "almost no signal for adaptation to recover."
        ),
    )
    rows = []
    for arch in ARCHS:
        for stream, label in (("corruptions", "mean of 4 corruptions"), *((w, w) for w in WILD_STREAMS)):
            for m in METHODS:
                if stream == "corruptions":
                    qs = [side_values(data, arch, f"tta/{m}/acc_q{q}") for q in range(1, 5)]
                else:
                    cell = data.get((arch, stream), {})
                    qs = [cell.get(f"tta/{m}/acc_q{q}", {}) for q in range(1, 5)]
                if any(qs):
                    rows.append([arch, label, LABELS[m], *(_pct(v) for v in qs)])
    quarters = Table(
        "Top-1 per quarter of the stream (%, mean ± sd over seeds)",
        ["architecture", "stream", "method", "Q1", "Q2", "Q3", "Q4"],
        rows,
    )
    return [top1, quarters]


def claim_report(records: list[Any], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The declared claims' verdicts, the two tables and the sanity flags (see the module docstring).

    Args:
        records: the study's ``suite.compare.RunRecord``s.
        spec: the claim spec (its claims, and its convergence rule on the training entries ``cnn`` and ``vit``).
        out_dir: folder of the results page (unused).
    """
    data = collect(records)
    if not data:
        return HookResult(notes=["No runs with `tta/*` metrics found."])
    flags = suspicious(data)
    sanity = (
        f"Sanity (an adapting method more than {BUG_MARGIN * 100:.0f} points below source on an i.i.d. stream, or "
        "BN-adapt differing from source on the ViT, is a bug until shown otherwise): "
        + ("; ".join(flags) if flags else "none.")
    )
    return HookResult(verdicts=verdicts(data, spec, spec.convergence(records)), tables=tables(data), notes=[sanity])
