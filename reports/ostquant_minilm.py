"""Results-page hook of the ostquant_minilm claim (``report: reports.ostquant_minilm:claim_report``): W4A4KV4 of the
pretrained all-MiniLM-L6-v2 by masked-LM loss, from the runs' ``quant_calibration.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reports.ostquant import LABELS, _mean, _sd, collect


def claim_report(records: list[Any], out_dir: Path) -> str:
    """Markdown appended to ``docs/results/ostquant_minilm.md``: W4A4KV4 of the pretrained MiniLM by masked-LM loss.

    One table over seeds (the runs of ``conf/claim/ostquant_minilm.yaml``, each writing ``quant_calibration.json``):
    per method the held-out masked-LM loss, its gap to full precision, the perplexity gap and the KL to the
    full-precision MLM distribution at the masked positions; then the computed ranking.
    """
    table, _, bits = collect(records)
    if not table:
        return "No `quant_calibration.json` found in the runs."
    b = ", ".join(f"{k}={v}" for k, v in bits.items())
    lines = []
    for subject, res in table.items():
        methods = [m for m in LABELS if res[m]["loss"]]
        fp = res["fp"]["loss"] if "fp" in res else []
        n = len(next(iter(res.values()))["loss"])
        lines += [
            f"## Masked-LM loss after quantization: {subject} ({b}; mean ± std over {n} seeds)",
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
        lines += ["", "Verdict (computed):", ""]
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
