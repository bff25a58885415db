"""Results-page hook of the SEMDICE downstream-adaptation check (``conf/claim/semdice_finetune.yaml``).

Lee et al., "SEMDICE: Off-policy State Entropy Maximization via Stationary Distribution Correction Estimation"
(ICLR 2025): the best downstream adaptation among SEM pre-training methods. Online DDPG on the task reward from the
SEMDICE-pre-trained actor, from the APT-pre-trained actor (both from the ``semdice_deep`` claim's runs of the same
seed: APT online as its paper runs it, ``apt``, and APT offline on SEMDICE's data, ``apt_offline``) and from scratch.
The final-return claims are the spec's declared claims (the paper's URLB metric: the return after a fixed
fine-tuning budget). This hook adds the return curves over environment steps (table and plot), the area under them
(mean ``val/return`` over the validations: how fast an entry adapts), and the claim that SEMDICE adapts faster than
scratch on that area, judged with :func:`suite.claims.judge_values`.

The x-axis is ``val/env_steps`` (logged beside ``val/return`` at every validation).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from suite.claims import Claim, ClaimSpec, Figure, HookResult, Table, default_paired, judge_values, seed_values
from suite.compare import RunRecord
from suite.report import mean_sd, zipped_curves

METRIC = "val/return"
X = "val/env_steps"
METHOD = "semdice"
PRETRAINED = "apt"  # APT pre-trained online, as its paper runs it (the deep claim's apt_online)
OFFLINE = "apt_offline"  # APT pre-trained offline on SEMDICE's data (the deep claim's apt)
SCRATCH = "scratch"
ON_APT = "semdice_on_apt"  # SEMDICE pre-trained on APT online's own replay (the deep claim's semdice_on_apt)
NAMES = (METHOD, ON_APT, PRETRAINED, OFFLINE, SCRATCH)


def return_curves(records: list[RunRecord], name: str) -> dict[str, dict[int, float]]:
    """Per seed of entry ``name``: ``{environment steps: deterministic return}``."""
    return zipped_curves(records, name, X, METRIC)


def _plot(curves: dict[str, dict[str, dict[int, float]]], points: list[int], out_dir: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, per_seed in curves.items():
        vals = [[c[x] for c in per_seed.values()] for x in points]
        mean = [statistics.fmean(v) for v in vals]
        se = [statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else 0.0 for v in vals]
        ax.plot(points, mean, marker=".", label=f"{name} ({len(per_seed)} seeds)")
        ax.fill_between(points, [m - s for m, s in zip(mean, se)], [m + s for m, s in zip(mean, se)], alpha=0.2)
    ax.set(xlabel="environment steps of fine-tuning", ylabel="deterministic return (mean ± s.e.)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "semdice_finetune_returns.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def claim_report(records: list[RunRecord], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """Return-vs-steps table and plot, final returns and areas, and the adaptation-speed claim."""
    names = [n for n in NAMES if any(r.name == n for r in records)]
    curves = {n: return_curves(records, n) for n in names}
    per_seed = [c for n in names for c in curves[n].values()]
    points = sorted(set.intersection(*(set(c) for c in per_seed))) if per_seed else []
    shown = points if len(points) <= 8 else [points[round(i * (len(points) - 1) / 7)] for i in range(8)]
    rows = [[n, *(mean_sd([c[p] for c in curves[n].values()]) for p in shown)] for n in names]
    auc = {n: {s: statistics.fmean(c[p] for p in points) for s, c in curves[n].items()} for n in names if points}
    finals = [
        [n, mean_sd(seed_values(records, n, "test/return").values()), mean_sd(auc.get(n, {}).values())] for n in names
    ]
    result = HookResult(
        tables=[
            Table(
                "Return of the deterministic actor vs environment steps of fine-tuning",
                ["entry", *map(str, shown)],
                rows,
            ),
            Table(
                "Final return and area under the return curve",
                ["entry", "final test/return", "area under the return curve (mean val/return)"],
                finals,
            ),
        ]
    )
    plot = _plot(curves, points, Path(out_dir)) if points else None
    if plot:
        result.figures.append(Figure("return curves", plot))
    if auc.get(METHOD) and auc.get(SCRATCH):
        cfg = spec.get("adaptation_claim") or {}
        claim = Claim(
            id="faster_than_scratch",
            text="Pre-training with SEMDICE speeds up adaptation (area under the return curve above scratch)",
            metric=f"mean {METRIC} over {len(points)} evaluations",
            entries=(METHOD, SCRATCH),
            higher_is_better=True,
            delta=float(cfg.get("delta", 0.0)),
            delta_why=str(cfg.get("delta_why", "")),
        )
        paired = default_paired(records, METHOD, SCRATCH)
        result.verdicts.append(judge_values(claim, auc[METHOD], auc[SCRATCH], paired=paired))
    return result
