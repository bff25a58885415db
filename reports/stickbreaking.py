"""Results-page hook of the stickbreaking claim (``report: reports.stickbreaking:claim_report``)."""

from __future__ import annotations

import statistics
from pathlib import Path

from reports._common import seed_mean as _mean
from reports._common import seed_std as _std
from reports._common import seed_values as _values
from suite.compare import RunRecord
from suite.report import Verdict, compare, mean_sd, sizing, sizing_spec, values, verdict_table


def claim_report(records: list[RunRecord], out_dir: Path, spec: dict | None = None) -> str:
    """Perplexity growth from the training length (128) to 8x (1024) per mixer and the length-generalisation verdict."""
    lengths = (128, 256, 512, 1024)
    lines = ["## Length generalisation (trained at T = 128)", ""]
    lines += ["| mixer | seeds | " + " | ".join(f"ppl@{t}" for t in lengths) + " | ppl@1024 / ppl@128 |"]
    lines.append("|---|---|" + "---|" * (len(lengths) + 1))
    growth = {}
    for name in ("stickbreaking", "softmax_rope", "softmax_nope"):
        cols = [_values(records, name, f"test/ppl_len{t}") for t in lengths]
        if not cols[0] or not cols[-1]:
            continue
        ratios = [v1 / v0 for (s0, v0), (s1, v1) in zip(cols[0], cols[-1]) if s0 == s1]
        growth[name] = (statistics.fmean(ratios), _mean(cols[-1]), len(cols[0]))
        cells = " | ".join(f"{_mean(c):.3f} ± {_std(c):.3f}" for c in cols)
        lines.append(f"| {name} | {len(cols[0])} | {cells} | {statistics.fmean(ratios):.3f} |")
    lines += ["", "## Verdicts (computed from the runs above)", ""]
    metric, hib = sizing_spec(spec or "stickbreaking")
    judged = sizing(records, metric or "val/loss", higher_is_better=hib)

    def check(claim: str, a: str, b: str, length: int) -> Verdict | None:
        va, vb = values(records, a, f"test/ppl_len{length}"), values(records, b, f"test/ppl_len{length}")
        if not va or not vb:
            return None
        ok = [judged.get(n, (False, ""))[0] for n in (a, b)]
        still = [n for n, o in zip((a, b), ok, strict=True) if not o]
        word = compare(va, vb, higher_is_better=False, converged=all(ok))
        return Verdict(
            claim,
            word,
            f"ppl@{length}: {a} {mean_sd(va)} vs {b} {mean_sd(vb)}"
            + (f"; still improving at the stop: {', '.join(still)}" if still else "; both plateaued"),
        )

    verdicts = [
        check("At 8x the training length, stick-breaking has lower perplexity than softmax+RoPE", "stickbreaking",
              "softmax_rope", lengths[-1]),
        check("At 8x the training length, stick-breaking has lower perplexity than softmax NoPE", "stickbreaking",
              "softmax_nope", lengths[-1]),
        check("At the training length, stick-breaking has lower perplexity than softmax+RoPE", "stickbreaking",
              "softmax_rope", lengths[0]),
    ]  # fmt: skip
    verdicts = [v for v in verdicts if v]
    if verdicts:
        lines += [verdict_table(verdicts), ""]
        lines.append(
            "Rule: `reproduced` / `not reproduced` when the mean perplexity is lower / higher by more than two "
            "standard errors of the difference over seeds, `inconclusive: within noise` otherwise, `inconclusive: "
            f"underfit` when either entry had not plateaued on `{metric}`."
        )
    if "stickbreaking" in growth and "softmax_rope" in growth:
        sb, rope = growth["stickbreaking"], growth["softmax_rope"]
        lines.append(
            f"* Growth of perplexity from T=128 to 1024: stick-breaking {sb[0]:.3f}x vs softmax+RoPE {rope[0]:.3f}x"
            + (f", softmax NoPE {growth['softmax_nope'][0]:.3f}x." if "softmax_nope" in growth else ".")
        )
    else:
        lines.append("* not enough runs for a verdict")
    return "\n".join(lines)
