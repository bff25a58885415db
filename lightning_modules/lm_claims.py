"""Report hooks of the causal-LM claim checks (``conf/claim/gated_deltanet.yaml``, ``conf/claim/stickbreaking.yaml``).

Each hook gets the finished runs and returns markdown with per-seed numbers and a verdict computed from them, so
``make claim`` (or ``--report-only``) rewrites an honest reading rather than a hand-written one.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from suite.compare import RunRecord

CHANCE_RECALL = 1 / 31  # 31 value tokens in the recall tasks' default vocabulary


def _values(records: list[RunRecord], name: str, key: str) -> list[tuple[int | None, float]]:
    return sorted((r.seed, r.metrics[key]) for r in records if r.name == name and key in r.metrics)


def _mean(vals: list[tuple[int | None, float]]) -> float:
    return statistics.fmean(v for _, v in vals) if vals else float("nan")


def _std(vals: list[tuple[int | None, float]]) -> float:
    return statistics.stdev(v for _, v in vals) if len(vals) > 1 else 0.0


def gated_deltanet_report(records: list[RunRecord], out_dir: Path) -> str:
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


def stickbreaking_report(records: list[RunRecord], out_dir: Path) -> str:
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
