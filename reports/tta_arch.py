"""Results-page hook of the cross-paper study ``tta_arch`` (issue 50 item 5): test-time adaptation across
architectures. Tent reports its gains on CNNs with BatchNorm; does that hold for a ViT with LayerNorm?

Used as ``report: reports.tta_arch:claim_report`` in ``conf/claim/tta_arch.yaml``. Entries ``cnn`` and ``vit`` train
the BaDLoss CNN and the MDA subject ViT on clean Fashion-MNIST (and test on the clean stream); entries
``<arch>_<corruption>`` test the same seed's weights on one corruption at severity 5. Every test pass logs, through
:class:`callbacks.tta.TTAComparison`, ``tta/<method>/acc`` and ``tta/<method>/acc_q1..q4`` for ``source`` (no
adaptation), ``tent``, ``eata`` and ``sar`` on the same model and stream. The hook tabulates top-1 per architecture,
corruption and method (mean ± std over seeds) and the accuracy per quarter of the stream.

Pre-registered verdicts (stated before the runs). Per seed, a method's *gain* is its top-1 minus the source model's
on the same stream, averaged over the four corruptions (gaussian_noise, defocus_blur, fog, contrast); seeds are
paired (the same trained model adapts), so a claim "X beats source" is ``suite.report.compare`` of the per-seed gains
against zero (two standard errors of their mean).

1. *Tent beats source under corruption on the CNN (BatchNorm)*: the paper's claim.
2. *Tent beats source under corruption on the ViT (LayerNorm)*: the question.
3. *Tent gains more on the CNN than on the ViT*: ``compare`` of the two architectures' per-seed gains (unpaired).
4. *Tent collapses over the stream* (one verdict per architecture): per seed, its gain over source in the first
   quarter of the stream minus its gain in the last quarter, mean over corruptions, against zero ("reproduced" =
   collapse: the gain in the last quarter is below the first quarter's beyond seed noise). Measured against source
   on the same quarter, so the images' own difficulty in each quarter cancels.
5. *EATA beats source*, *SAR beats source* (one verdict per architecture each): secondary, as 1-2.

Every verdict on an architecture reads ``inconclusive: underfit`` when its source model's clean top-1 is below
:data:`MIN_CLEAN_ACC` or, by the suite's rule, when its training entry's ``val/loss`` has not plateaued (the page's
sizing section); ``inconclusive: phenomenon absent`` when the corruptions cost its source model less than
:data:`MIN_SHIFT` of top-1 (mean over corruptions: nothing for adaptation to recover). Verdict 3 needs both
architectures to pass these gates.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from suite import report as rep

ARCHS = {"cnn": "CNN (BatchNorm)", "vit": "ViT (LayerNorm)"}
CORRUPTIONS = ("gaussian_noise", "defocus_blur", "fog", "contrast")
METHODS = ("source", "tent", "eata", "sar")
LABELS = {"source": "source", "tent": "Tent", "eata": "EATA", "sar": "SAR"}
STATS = ("acc", "acc_q1", "acc_q2", "acc_q3", "acc_q4")
MIN_CLEAN_ACC = 0.5  # a 10-class classifier below this clean top-1 is underfit for the question
MIN_SHIFT = 0.05  # the corruptions must cost the source model at least 5 points (mean over corruptions)
BUG_MARGIN = 0.10  # a method this far below source on a stream is flagged on the page (a bug until shown otherwise)

Table = dict[tuple[str, str], dict[str, dict[int, float]]]


def split_name(name: str) -> tuple[str, str] | None:
    """``cnn`` -> ``(cnn, clean)``, ``vit_fog`` -> ``(vit, fog)``; ``None`` for a name of neither form."""
    arch, _, corruption = name.partition("_")
    if arch not in ARCHS:
        return None
    return arch, corruption or "clean"


def collect(records: list[Any]) -> Table:
    """``(arch, corruption or 'clean') -> '<method>/<stat>' -> {seed: value}`` from the runs' ``tta/*`` metrics."""
    out: Table = defaultdict(lambda: defaultdict(dict))
    for rec in records:
        key = split_name(rec.name)
        if key is None:
            continue
        for m in METHODS:
            for s in STATS:
                v = rec.metrics.get(f"tta/{m}/{s}")
                if v is not None:
                    out[key][f"{m}/{s}"][int(rec.seed or 0)] = float(v)
    return out


def per_seed(data: Table, arch: str, fn: Any) -> list[float]:
    """``mean over corruptions of fn(cell, seed)`` for every seed present in all four corruptions (sorted)."""
    cells = [data.get((arch, c)) for c in CORRUPTIONS]
    if any(c is None or not c.get("source/acc") for c in cells):
        return []
    seeds = sorted(set.intersection(*(set(c["source/acc"]) for c in cells)))
    out = []
    for s in seeds:
        try:
            out.append(statistics.fmean(fn(c, s) for c in cells))
        except KeyError:
            continue
    return out


def gains(data: Table, arch: str, method: str, stat: str = "acc") -> list[float]:
    return per_seed(data, arch, lambda c, s: c[f"{method}/{stat}"][s] - c[f"source/{stat}"][s])


def collapse(data: Table, arch: str, method: str = "tent") -> list[float]:
    """Per seed: the gain over source in the stream's first quarter minus the gain in its last (> 0: collapse)."""
    return per_seed(
        data,
        arch,
        lambda c, s: (
            (c[f"{method}/acc_q1"][s] - c["source/acc_q1"][s]) - (c[f"{method}/acc_q4"][s] - c["source/acc_q4"][s])
        ),
    )


def _mean(v: list[float]) -> float:
    return statistics.fmean(v) if v else float("nan")


def _ms(v: list[float] | dict[int, float], pct: bool = True) -> str:
    vals = list(v.values()) if isinstance(v, dict) else list(v)
    if not vals:
        return "-"
    k = 100.0 if pct else 1.0
    sd = statistics.stdev(vals) * k if len(vals) > 1 else 0.0
    return f"{statistics.fmean(vals) * k:.1f} ± {sd:.1f}"


def gate(data: Table, arch: str, converged: dict[str, bool] | None = None) -> tuple[str | None, str]:
    """``(UNDERFIT | ABSENT | None, reading)`` for one architecture (module docstring)."""
    clean = list(data.get((arch, "clean"), {}).get("source/acc", {}).values())
    corrupted = per_seed(data, arch, lambda c, s: c["source/acc"][s])
    reading = f"source clean {_ms(clean)}, corrupted {_ms(corrupted)}"
    if not (converged or {}).get(arch, True):
        return rep.UNDERFIT, reading + " (training not plateaued)"
    if clean and _mean(clean) < MIN_CLEAN_ACC:
        return rep.UNDERFIT, reading
    if clean and corrupted and _mean(clean) - _mean(corrupted) < MIN_SHIFT:
        return rep.ABSENT, reading
    return None, reading


def verdicts(data: Table, converged: dict[str, bool] | None = None) -> list[rep.Verdict]:
    """The pre-registered verdicts (module docstring) from :func:`collect`'s table; ``converged`` (entry ->
    plateaued, the page's sizing rule) makes an architecture's verdicts ``inconclusive: underfit`` when it has not."""
    out: list[rep.Verdict] = []
    gates = {a: gate(data, a, converged) for a in ARCHS}

    def beats(method: str, arch: str) -> None:
        g = gains(data, arch, method)
        if not g:
            return
        blocked, reading = gates[arch]
        word = blocked or rep.compare(g, [0.0] * len(g), higher_is_better=True)
        out.append(rep.Verdict(
            f"{LABELS[method]} beats source under corruption on the {ARCHS[arch]} (mean top-1 over the 4 corruptions, "
            "severity 5)", word, f"gain (points, paired by seed) {_ms(g)}; {reading}", against=()))  # fmt: skip

    beats("tent", "cnn")
    beats("tent", "vit")
    gc, gv = gains(data, "cnn", "tent"), gains(data, "vit", "tent")
    if gc and gv:
        blocked = gates["cnn"][0] or gates["vit"][0]
        out.append(rep.Verdict(
            "Tent gains more on the CNN (BatchNorm) than on the ViT (LayerNorm)",
            blocked or rep.compare(gc, gv, higher_is_better=True),
            f"gain (points) CNN {_ms(gc)} vs ViT {_ms(gv)}", against=()))  # fmt: skip
    for arch in ARCHS:
        c = collapse(data, arch)
        if not c:
            continue
        q1, q4 = gains(data, arch, "tent", "acc_q1"), gains(data, arch, "tent", "acc_q4")
        out.append(rep.Verdict(
            f"Tent collapses over the stream on the {ARCHS[arch]} (its gain over source in the last quarter below the "
            "first quarter's)", gates[arch][0] or rep.compare(c, [0.0] * len(c), higher_is_better=True),
            f"gain (points) in Q1 {_ms(q1)}, in Q4 {_ms(q4)}; Q1 - Q4 {_ms(c)}", against=()))  # fmt: skip
    for method in ("eata", "sar"):
        for arch in ARCHS:
            beats(method, arch)
    return out


def suspicious(data: Table) -> list[str]:
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


def claim_report(records: list[Any], out_dir: Path, spec: dict | None = None) -> str:
    """Markdown appended to ``docs/results/tta_arch.md`` (see module docstring)."""
    data = collect(records)
    if not data:
        return "No runs with `tta/*` metrics found."
    metric, hib = rep.sizing_spec(spec or "tta_arch")
    converged = {k: v[0] for k, v in rep.sizing(records, metric or "val/loss", higher_is_better=hib).items()}
    converged = {k: v for k, v in converged.items() if k in ARCHS}  # the test-only entries have no training curve
    lines = [
        "## Top-1 per stream (%, mean ± std over seeds; 5,000 test images, online, one step per batch of 128)",
        "",
        "| architecture | stream | " + " | ".join(LABELS[m] for m in METHODS) + " | Tent Q1 -> Q4 |",
        "|---|---|" + "---|" * len(METHODS) + "---|",
    ]
    for arch in ARCHS:
        for corruption in ("clean", *CORRUPTIONS):
            cell = data.get((arch, corruption))
            if cell is None:
                continue
            accs = " | ".join(_ms(cell.get(f"{m}/acc", {})) for m in METHODS)
            q = f"{_ms(cell.get('tent/acc_q1', {}))} -> {_ms(cell.get('tent/acc_q4', {}))}"
            lines.append(f"| {arch} | {corruption} | {accs} | {q} |")
        mean = per_seed(data, arch, lambda c, s: c["source/acc"][s])
        if mean:
            cells = [_ms(mean)] + [_ms(per_seed(data, arch, lambda c, s, m=m: c[f"{m}/acc"][s])) for m in METHODS[1:]]
            lines.append(f"| {arch} | **mean of 4** | " + " | ".join(cells) + " | |")
    lines += [
        "",
        "## Accuracy per quarter of the stream (%, mean over the 4 corruptions, mean ± std over seeds)",
        "",
        "| architecture | method | Q1 | Q2 | Q3 | Q4 |",
        "|---|---|---|---|---|---|",
    ]
    for arch in ARCHS:
        for m in METHODS:
            qs = [per_seed(data, arch, lambda c, s, m=m, q=q: c[f"{m}/acc_q{q}"][s]) for q in range(1, 5)]
            if any(qs):
                lines.append(f"| {arch} | {LABELS[m]} | " + " | ".join(_ms(v) for v in qs) + " |")
    notes = suspicious(data)
    lines += [
        "",
        f"Sanity (a method more than {BUG_MARGIN * 100:.0f} points below source, or source at chance, is a bug "
        "until shown otherwise): " + ("; ".join(notes) if notes else "none."),
        "",
        "## Verdicts (pre-registered in `reports/tta_arch.py`)",
        "",
        rep.verdict_table(verdicts(data, converged)),
    ]
    return "\n".join(lines)
