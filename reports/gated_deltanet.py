"""Results-page hook of the gated_deltanet claim (``report: reports.gated_deltanet:claim_report``).

Gets the finished runs and returns markdown with per-seed numbers and a verdict computed from them, so
``make claim`` (or ``--report-only``) rewrites an honest reading rather than a hand-written one.
"""

from __future__ import annotations

from pathlib import Path

from reports._common import seed_mean as _mean
from reports._common import seed_std as _std
from reports._common import seed_values as _values
from suite.compare import RunRecord

CHANCE_RECALL = 1 / 31  # 31 value tokens in the recall tasks' default vocabulary


def claim_report(records: list[RunRecord], out_dir: Path) -> str:
    """Per task: accuracy of GDN vs DeltaNet, Mamba2-style and softmax per seed, and whether GDN matches both."""
    key = "test/acc_len64"
    lines = ["## Per-seed recall accuracy (T = 64)", ""]
    lines += ["| task | mixer | seeds | per seed | mean ± std |", "|---|---|---|---|---|"]
    verdicts = []
    for task in ("mqar", "overwrite"):
        means = {}
        for mixer in ("gdn", "deltanet", "mamba2", "softmax"):
            vals = _values(records, f"{mixer}_{task}", key)
            if not vals:
                continue
            means[mixer] = (_mean(vals), _std(vals), len(vals))
            per = ", ".join(f"{v:.3f} (s{s})" for s, v in vals)
            lines.append(f"| {task} | {mixer} | {len(vals)} | {per} | {_mean(vals):.3f} ± {_std(vals):.3f} |")
        if {"gdn", "deltanet", "mamba2"} <= means.keys():
            g, d, m = means["gdn"], means["deltanet"], means["mamba2"]
            best = max(d[0], m[0])
            ok = g[0] >= best
            close = abs(g[0] - best) <= max(g[1], d[1] if d[0] >= m[0] else m[1])
            word = "matches or beats" if ok else ("is within one std of" if close else "falls below")
            verdicts.append(
                f"* **{task}**: GDN {g[0]:.3f} {word} the better component "
                f"({'DeltaNet' if d[0] >= m[0] else 'Mamba2-style'} {best:.3f}); DeltaNet {d[0]:.3f}, "
                f"Mamba2-style {m[0]:.3f}, softmax {means['softmax'][0]:.3f} (n = {g[2]}/{d[2]}/{m[2]}"
                f"/{means['softmax'][2] if 'softmax' in means else 0} seeds; chance {CHANCE_RECALL:.3f})."
                if "softmax" in means
                else f"* **{task}**: GDN {g[0]:.3f} {word} the better component ({best:.3f})."
            )
    lines += ["", "## Verdict (computed from the runs above)", "", *(verdicts or ["* not enough runs for a verdict"])]
    return "\n".join(lines)
