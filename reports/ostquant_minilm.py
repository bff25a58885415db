"""Results-page hook of the ostquant_minilm claim (``report: reports.ostquant_minilm:claim_report``): OSTQuant
(ICLR 2025) at W4A4KV4 on the pretrained all-MiniLM-L6-v2, by masked-LM loss, from the runs' ``quant_calibration.json``
(a ``data_files`` entry of the spec).

The spec's ``method_claims`` (OSTQuant against each baseline, KL-Top against full KL) are judged on the ``minilm``
entry by :func:`reports.ostquant.judge_methods`: paired by seed (the same fitted head, masks and calibration batches
per seed). They need the MLM head fit converged: by the convergence rule on its validation loss and by the 4x check
(:func:`head_check`, the ``minilm_long`` entry), which replaces the entry's convergence reading on the page."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from reports.ostquant import LABELS, collect, declared, judge_methods
from suite import report as rep
from suite.claims import ClaimSpec, HookResult, Table, interval_text, judge_values

HEAD_KEY = "quant/fp_loss"


def subjects(records: list[Any], table: dict) -> list[str]:
    """The subjects that get verdicts: the entries of :func:`suite.report.main_runs` (not ``<x>_long``) with a table."""
    names = {r.name for r in rep.main_runs(records)}
    return [n for n in table if n in names]


def head_check(records: list[Any], subject: str, spec: ClaimSpec) -> tuple[bool, str] | None:
    """The 4x sizing check of the MLM head fit: ``<subject>_long`` (the head fitted 4x the steps, same seeds) against
    ``subject`` on the held-out full-precision masked-LM loss, paired by seed, allowed 1% of that loss (the
    convergence rule's tolerance; never the seed spread, which here measures which pydoc text each seed holds out).
    A non-finite loss on either side fails.

    Returns ``None`` when the spec lists no ``<subject>_long`` entry (e.g. the paper profile); a failed check when it
    does but no seed has both runs (the 4x run crashed or is missing)."""
    longer = f"{subject}_long"
    listed = any(isinstance(e, dict) and e.get("name") == longer for e in spec.get("runs", []))
    check = rep.longer_run_check(records, subject, HEAD_KEY, higher_is_better=False)
    if check is None and listed:
        return False, f"not shown converged: no seed has both {subject} and {longer} ({HEAD_KEY} missing)"
    return check


def fit_convergence(records: list[Any], subject: str, spec: ClaimSpec) -> tuple[bool, str]:
    """The head fit converged: by the convergence rule on its validation curve and by its 4x check (both)."""
    ok, reading = spec.convergence(rep.main_runs(records)).get(subject, (False, "no validation curve"))
    check = head_check(records, subject, spec)
    if check is None:
        return ok, reading
    return ok and check[0], f"validation curve: {reading}; 4x head fit ({HEAD_KEY}, paired by seed): {check[1]}"


def method_table(subject: str, res: dict, bits: dict, sizing_only: bool) -> Table:
    """Per method: masked-LM loss, its gap to FP (per seed, then mean ± sd), perplexity, perplexity gap, KL to FP."""
    fp = res.get("fp", {}).get("loss", {})
    rows = []
    for m in (m for m in LABELS if res.get(m, {}).get("loss")):
        loss = res[m]["loss"]
        gap = [loss[s] - fp[s] for s in loss if s in fp]
        rows.append([LABELS[m], rep.mean_sd(loss.values()), "—" if m == "fp" else rep.mean_sd(gap),
                     rep.mean_sd(res[m]["ppl"].values()), rep.mean_sd(res[m].get("kl", {}).values())])  # fmt: skip
    b = ", ".join(f"{k}={v}" for k, v in bits.items())
    title = "4x head fit (sizing check only, not a claim)" if sizing_only else "Masked-LM loss after quantization"
    note = "Held-out masked positions; gap = quantized - full precision per seed."
    return Table(f"{title}: {subject} ({b})", ["method", "MLM loss", "loss gap", "ppl", "KL to FP"], rows, note)


def readings(res: dict) -> list[str]:
    """Computed readings of one subject: the ranking by loss gap and OSTQuant's per-seed wins over each baseline."""
    fp = res.get("fp", {}).get("loss", {})
    gaps = {m: statistics.fmean(res[m]["loss"][s] - fp[s] for s in res[m]["loss"] if s in fp)
            for m in LABELS if m != "fp" and res.get(m, {}).get("loss") and fp}  # fmt: skip
    if not gaps:
        return []
    out = ["Loss gap to FP, smallest first: " + " < ".join(f"{LABELS[m]} ({gaps[m]:+.4f})" for m in sorted(gaps,
           key=gaps.get)) + "."]  # fmt: skip
    ours = res.get("ostquant", {}).get("loss", {})
    for base in ("rtn", "gptq", "smoothquant", "quarot"):
        theirs = res.get(base, {}).get("loss", {})
        seeds = [s for s in ours if s in theirs]
        if seeds:
            wins = sum(ours[s] < theirs[s] for s in seeds)
            out.append(f"OSTQuant vs {LABELS[base]}: lower loss on {wins} of {len(seeds)} seeds.")
    return out


def claim_report(records: list[Any], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The method verdicts on each main subject (module docstring), their tables, and the 4x head fit's table."""
    table, _, bits = collect(records)
    if not table:
        return HookResult(notes=["No `quant_calibration.json` found in the runs: no verdict."])
    result = HookResult()
    claims = declared(spec, "method_claims")
    mains = subjects(records, table)
    for subject in mains:
        conv = fit_convergence(records, subject, spec)
        result.convergence[subject] = conv
        longer = table.get(f"{subject}_long", {})
        for v in judge_methods(claims, table[subject], subject, conv):
            c = next(c for c in claims if c.id == v.id)
            a, b = (longer.get(m, {}).get(c.metric) for m in c.entries)
            if a and b:  # the same comparison with the 4x head: evidence, not a claim
                w = judge_values(c, a, b, paired=True)
                v.evidence = f"with the 4x head: {interval_text(w)} (would read: {w.verdict})"
            result.verdicts.append(v)
    for subject, res in table.items():
        result.tables.append(method_table(subject, res, bits, sizing_only=subject not in mains))
        result.notes += [f"{subject}: {line}" for line in readings(res)]
    return result
