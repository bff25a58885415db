"""Results-page hook of the stickbreaking claim (``report: reports.stickbreaking:claim_report``)."""

from __future__ import annotations

import statistics
from pathlib import Path

from reports._common import seed_mean as _mean
from reports._common import seed_std as _std
from reports._common import seed_values as _values
from suite.compare import RunRecord


def claim_report(records: list[RunRecord], out_dir: Path) -> str:
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
    lines += ["", "## Verdict (computed from the runs above)", ""]
    if "stickbreaking" in growth and "softmax_rope" in growth:
        sb, rope = growth["stickbreaking"], growth["softmax_rope"]
        better = sb[1] < rope[1]
        lines.append(
            f"* At 8x the training length, stick-breaking has perplexity {sb[1]:.3f} vs softmax+RoPE {rope[1]:.3f} "
            f"({'lower: the claim holds here' if better else 'not lower: the claim does not hold here'}); "
            f"growth from T=128 to 1024: {sb[0]:.3f}x vs {rope[0]:.3f}x."
        )
        if "softmax_nope" in growth:
            nope = growth["softmax_nope"]
            lines.append(f"* softmax NoPE: perplexity {nope[1]:.3f} at T=1024, growth {nope[0]:.3f}x.")
    else:
        lines.append("* not enough runs for a verdict")
    return "\n".join(lines)
