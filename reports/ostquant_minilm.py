"""Results-page hook of the ostquant_minilm claim (``report: reports.ostquant_minilm:claim_report``): W4A4KV4 of the
pretrained all-MiniLM-L6-v2 by masked-LM loss, from the runs' ``quant_calibration.json``."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from reports.ostquant import LABELS, _mean, _sd, collect
from suite import report as rep

HEAD_KEY = "quant/fp_loss"


def subjects(records: list[Any], table: dict) -> list[str]:
    """The subjects that get verdicts: the entries of :func:`suite.report.main_runs` (not ``<x>_long``) with a table."""
    names = {r.name for r in rep.main_runs(records)}
    return [n for n in table if n in names]


def head_check(records: list[Any], subject: str = "minilm", spec: dict | None = None) -> tuple[bool, str] | None:
    """The 4x sizing check of the MLM head fit: ``<subject>_long`` (the head fitted 4x the steps, same seeds) against
    ``subject`` on the held-out full-precision masked-LM loss, paired by seed. Allowed: 1% of that loss (the plateau
    rule's one-seed yardstick), not the seed spread: each seed holds out different pydoc text, so the spread (about
    0.9 nats) measures the text, not the fit. A non-finite loss on either side fails the check.

    Returns ``None`` when the spec has no ``<subject>_long`` entry and no such runs exist (e.g. the paper profile);
    a failed check when the spec lists the entry but no seed has both runs (the 4x run crashed or is missing)."""
    longer = f"{subject}_long"
    listed = any(isinstance(e, dict) and e.get("name") == longer for e in (spec or {}).get("runs", []))
    main = {r.seed: float(r.metrics[HEAD_KEY]) for r in records if r.name == subject and HEAD_KEY in r.metrics}
    paired = [main[r.seed] for r in records if r.name == longer and HEAD_KEY in r.metrics and r.seed in main]
    finite = [abs(v) for v in paired if math.isfinite(v)]
    tol = float(f"{rep.REL_TOL * statistics.fmean(finite):.3g}") if finite else 0.0
    check = rep.longer_run_check(records, subject, HEAD_KEY, higher_is_better=False, tol=tol)
    if check is None and listed:
        return False, f"not shown converged: no seed has both {subject} and {longer} ({HEAD_KEY} missing)"
    return check


def verdicts(records: list[Any], spec: dict | None = None) -> list[rep.Verdict]:
    """OSTQuant vs each baseline on the pretrained MiniLM: masked-LM loss gap to FP, paired by seed (the same head,
    masks and calibration batches per seed: :func:`suite.report.compare` on the per-seed differences against 0);
    ``inconclusive: underfit`` when the MLM head fit of the main entry had not plateaued on the sizing metric or fails
    its 4x check (:func:`head_check`). The evidence adds what the same comparison would read with the 4x head (those
    runs are a sizing check, not a claim)."""
    metric, hib = rep.sizing_spec(spec or "ostquant_minilm")
    judged = rep.sizing(rep.main_runs(records), metric or "val/loss", higher_is_better=hib)
    table, _, _ = collect(records)
    out = []
    for subject in subjects(records, table):
        res, longer = table[subject], table.get(f"{subject}_long")
        fit = judged.get(subject, (False, "no validation curve"))
        check = head_check(records, subject, spec)
        converged = fit[0] and (check is None or check[0])
        ours = res["ostquant"]["loss"]
        for base in ("rtn", "gptq", "smoothquant", "quarot", "ostquant_kl"):
            theirs = res[base]["loss"]
            if not ours or not theirs:
                continue
            diff = [o - b for o, b in zip(ours, theirs, strict=False)]
            word = rep.compare(diff, [0.0] * len(diff), higher_is_better=False, converged=converged)
            claim = f"OSTQuant has a smaller W4A4KV4 masked-LM loss gap than {LABELS[base]} ({subject})"
            if base == "ostquant_kl":
                claim = f"The KL-Top loss beats full KL as the calibration loss ({subject})"
            evidence = f"MLM loss {rep.mean_sd(ours)} vs {rep.mean_sd(theirs)}; paired difference {rep.mean_sd(diff)}"
            if not fit[0]:
                evidence += f"; head fit {fit[1]}"
            if check is not None and not check[0]:
                evidence += f"; head fit 4x check: {check[1]}"
            if longer and longer["ostquant"]["loss"] and longer[base]["loss"]:
                d4 = [o - b for o, b in zip(longer["ostquant"]["loss"], longer[base]["loss"], strict=False)]
                w4 = rep.compare(d4, [0.0] * len(d4), higher_is_better=False)
                evidence += f"; with the 4x head: paired difference {rep.mean_sd(d4)} (would read: {w4})"
            out.append(rep.Verdict(claim, word, evidence))
    return out


def claim_report(records: list[Any], out_dir: Path, spec: dict | None = None) -> str:
    """Markdown appended to ``docs/results/ostquant_minilm.md``: W4A4KV4 of the pretrained MiniLM by masked-LM loss.

    One table over seeds (the runs of ``conf/claim/ostquant_minilm.yaml``, each writing ``quant_calibration.json``):
    per method the held-out masked-LM loss, its gap to full precision, the perplexity gap and the KL to the
    full-precision MLM distribution at the masked positions; then the computed ranking.
    """
    table, _, bits = collect(records)
    if not table:
        return "No `quant_calibration.json` found in the runs."
    b = ", ".join(f"{k}={v}" for k, v in bits.items())
    lines = ["## Verdicts (computed)", "", rep.verdict_table(verdicts(records, spec)), ""]
    mains = subjects(records, table)
    for subject in mains:
        check = head_check(records, subject, spec)
        if check is not None:
            what = "held-out full-precision MLM loss, paired by seed; allowed 1% of the loss"
            lines += [
                f"4x sizing check of the MLM head fit ({subject}, {what}): {check[1]}. The plateau rule above "
                "measures the head's validation loss against a seed spread that mostly reflects which text each "
                "seed holds out, so this paired check is the one that can fail.",
                "",
            ]
    for subject, res in table.items():
        sizing_only = subject not in mains
        methods = [m for m in LABELS if res[m]["loss"]]
        fp = res["fp"]["loss"] if "fp" in res else []
        n = len(next(iter(res.values()))["loss"])
        title = "4x head fit (sizing check only, not a claim)" if sizing_only else "Masked-LM loss after quantization"
        lines += [
            f"## {title}: {subject} ({b}; mean ± std over {n} seeds)",
            "",
            "Held-out masked positions; gap = quantized - full precision (per seed, then averaged).",
            "",
            "| method | MLM loss | loss gap | ppl | ppl gap | KL to FP |",
            "|---|---|---|---|---|---|",
        ]
        gaps: dict[str, float] = {}
        for m in methods:
            loss = res[m]["loss"]
            gap = [q - f for q, f in zip(loss, fp, strict=False)] if fp else []
            gaps[m] = _mean(gap)
            lines.append(
                f"| {LABELS[m]} | {_mean(loss):.4f} ± {_sd(loss):.4f} | "
                + ("—" if m == "fp" else f"{_mean(gap):+.4f} ± {_sd(gap):.4f}")
                + f" | {_mean(res[m]['ppl']):.2f} | "
                + ("—" if m == "fp" else f"{_mean(res[m].get('ppl_gap', [])):+.2f}")
                + f" | {_mean(res[m]['kl']):.4f} |"
            )
        ranked = sorted((m for m in methods if m != "fp"), key=lambda m: gaps[m])
        lines += ["", "Reading (computed; the verdicts are above):" if sizing_only else "Verdict (computed):", ""]
        if ranked:
            lines.append(
                "* Loss gap to FP, smallest first: " + " < ".join(f"{LABELS[m]} ({gaps[m]:+.4f})" for m in ranked) + "."
            )
        main = [m for m in ranked if m not in ("ostquant_kl", "ostquant_ce")]
        if "ostquant" in main:
            best = main[0]
            lines.append(
                "* OSTQuant "
                + ("has the smallest gap" if best == "ostquant" else f"does not have the smallest gap ({LABELS[best]})")
                + f" among {', '.join(LABELS[m] for m in main)}."
            )
            for base in ("rtn", "smoothquant", "quarot"):
                if base in gaps:
                    wins = sum(o < q for o, q in zip(res["ostquant"]["loss"], res[base]["loss"], strict=False))
                    lines.append(
                        f"* OSTQuant vs {LABELS[base]}: lower loss on {wins} of {len(res['ostquant']['loss'])} seeds."
                    )
        if "ostquant" in gaps and "ostquant_kl" in gaps:
            lines.append(
                f"* Loss ablation: KL-Top (k = 1000 of 30,522) gap {gaps['ostquant']:+.4f} vs full KL "
                f"{gaps['ostquant_kl']:+.4f}."
            )
    return "\n".join(lines)
