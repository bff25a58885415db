"""Results-page hook of the ostquant_minilm claim (``report: reports.ostquant_minilm:claim_report``): OSTQuant
(ICLR 2025) at W4A4KV4 on the pretrained all-MiniLM-L6-v2, by masked-LM loss.

The spec declares the method claims (OSTQuant against each baseline, KL-Top against full KL) as two metrics of the
``minilm`` runs (``quant/<method>_loss``), paired by seed. They need the MLM head fit converged: by the convergence
rule on its validation loss and by the 4x check (:func:`head_check`, the ``minilm_long`` entry); this hook replaces
the entry's convergence reading with both, sets the same comparison with the 4x head beside each verdict as evidence,
marks a claim absent where the two methods were the same function (:func:`reports.ostquant.same_function`), and
tabulates the runs' ``quant_calibration.json`` (a ``data_files`` entry of the spec)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from reports.ostquant import LABELS, collect, same_function
from suite import report as rep
from suite.claims import Claim, ClaimResult, ClaimSpec, HookResult, Table, interval_text, judge

HEAD_KEY = "quant/fp_loss"


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
        rows.append(
            [
                LABELS[m],
                rep.mean_sd(loss.values()),
                "—" if m == "fp" else rep.mean_sd(gap),
                rep.mean_sd(res[m]["ppl"].values()),
                rep.mean_sd(res[m].get("kl", {}).values()),
            ]
        )
    b = ", ".join(f"{k}={v}" for k, v in bits.items())
    title = "4x head fit (sizing check only, not a claim)" if sizing_only else "Masked-LM loss after quantization"
    note = "Held-out masked positions; gap = quantized - full precision per seed."
    return Table(f"{title}: {subject} ({b})", ["method", "MLM loss", "loss gap", "ppl", "KL to FP"], rows, note)


def readings(res: dict) -> list[str]:
    """Computed readings of one subject: the ranking by loss gap and OSTQuant's per-seed wins over each baseline."""
    fp = res.get("fp", {}).get("loss", {})
    gaps = {
        m: statistics.fmean(res[m]["loss"][s] - fp[s] for s in res[m]["loss"] if s in fp)
        for m in LABELS
        if m != "fp" and res.get(m, {}).get("loss") and fp
    }
    if not gaps:
        return []
    out = [
        "Loss gap to FP, smallest first: "
        + " < ".join(f"{LABELS[m]} ({gaps[m]:+.4f})" for m in sorted(gaps, key=gaps.get))
        + "."
    ]
    ours = res.get("ostquant", {}).get("loss", {})
    for base in ("rtn", "gptq", "smoothquant", "quarot"):
        theirs = res.get(base, {}).get("loss", {})
        seeds = [s for s in ours if s in theirs]
        if seeds:
            wins = sum(ours[s] < theirs[s] for s in seeds)
            out.append(f"OSTQuant vs {LABELS[base]}: lower loss on {wins} of {len(seeds)} seeds.")
    return out


def with_longer_head(claim: Claim, records: list[Any], convergence: dict, absent: str | None) -> ClaimResult | None:
    """The declared ``claim`` as the engine judges it, with the same comparison on the 4x head fit
    (``<entry>_long``) as evidence, not a claim; ``None`` when either has no interval (nothing to add)."""
    longer = f"{claim.entries[0]}_long"
    w = judge(replace(claim, entries=(longer, longer)), records)
    v = judge(claim, records, convergence, absent=absent)
    if w.diff is None or v.diff is None:
        return None
    return replace(v, evidence=f"with the 4x head: {interval_text(w)} (would read: {w.verdict})")


def claim_report(records: list[Any], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The head fit's convergence per main entry, the 4x evidence beside the declared verdicts, the method tables and
    readings (module docstring)."""
    mains = list(dict.fromkeys(r.name for r in rep.main_runs(records)))
    result = HookResult(absent=same_function(records, spec))
    result.convergence = {subject: fit_convergence(records, subject, spec) for subject in mains}
    convergence = {**spec.convergence(records), **result.convergence}
    for claim in spec.claims:
        v = with_longer_head(claim, records, convergence, result.absent.get(claim.id))
        if v is not None:
            result.verdicts.append(v)
    table, _, bits = collect(records)
    if not table:
        result.notes.append("No `quant_calibration.json` found in the runs: no table.")
    for subject, res in table.items():
        result.tables.append(method_table(subject, res, bits, sizing_only=subject not in mains))
        result.notes += [f"{subject}: {line}" for line in readings(res)]
    return result
