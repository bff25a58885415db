"""Results-page hook of the SEMDICE downstream-adaptation check (``conf/claim/semdice_finetune.yaml``): online DDPG on
the task reward from the SEMDICE-pre-trained actor, from the APT-pre-trained actor (both from the ``semdice_deep``
claim's runs of the same seed: APT online as its paper runs it, ``apt``, and APT offline on SEMDICE's data,
``apt_offline``) and from scratch; return curves over environment steps, final returns and verdicts.

The x-axis is ``val/env_steps`` (logged beside ``val/return`` at every validation). The area under the return curve
(mean ``val/return`` over the validations) measures how fast an entry adapts; the final ``test/return`` is what it
reaches (the paper's URLB metric: the return after a fixed fine-tuning budget).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from suite.report import (
    Verdict,
    compare,
    curve_table,
    entry_curves,
    mean_sd,
    plateau,
    std_error,
    values,
    verdict_table,
)

METRIC = "val/return"
X = "val/env_steps"
METHOD = "semdice"
PRETRAINED = "apt"  # APT pre-trained online, as its paper runs it (the deep claim's apt_online)
OFFLINE = "apt_offline"  # APT pre-trained offline on SEMDICE's data (the deep claim's apt)
SCRATCH = "scratch"
NAMES = (METHOD, PRETRAINED, OFFLINE, SCRATCH)


def return_curves(records: list[Any], name: str) -> list[dict[int, float]]:
    """Per seed of entry ``name``: ``{environment steps: deterministic return}`` (the two curves zipped)."""
    xs, ys = entry_curves(records, name, X), entry_curves(records, name, METRIC)
    return [{int(x): y for (_, x), (_, y) in zip(cx, cy)} for cx, cy in zip(xs, ys)]


def _plot(curves: dict[str, list[dict[int, float]]], out_dir: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    drawn = False
    for name, per_seed in curves.items():
        if not per_seed:
            continue
        xs = sorted(set.intersection(*(set(c) for c in per_seed)))
        if not xs:
            continue
        mean = [statistics.fmean(c[x] for c in per_seed) for x in xs]
        se = [std_error([c[x] for c in per_seed]) for x in xs]
        ax.plot(xs, mean, marker=".", label=f"{name} ({len(per_seed)} seeds)")
        ax.fill_between(xs, [m - s for m, s in zip(mean, se)], [m + s for m, s in zip(mean, se)], alpha=0.2)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("environment steps of fine-tuning")
    ax.set_ylabel("deterministic return (mean ± s.e.)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "semdice_finetune_returns.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path.name


def claim_report(records: list[Any], out_dir: Path) -> str:
    """Markdown: return-vs-steps table (mean ± s.e. over seeds), plot, final returns and areas, verdicts."""
    out_dir = Path(out_dir)
    names = [n for n in NAMES if any(r.name == n for r in records)]
    curves = {n: return_curves(records, n) for n in names}
    per_seed = [c for n in names for c in curves[n]]
    points = sorted(set.intersection(*(set(c) for c in per_seed))) if per_seed else []
    shown = points if len(points) <= 8 else [points[round(i * (len(points) - 1) / 7)] for i in range(8)]
    lines = [
        "## Return of the deterministic actor vs environment steps of fine-tuning (mean ± s.e. over seeds)",
        "",
        *curve_table(curves, names, shown, digits=1),
    ]
    plot = _plot(curves, out_dir)
    if plot:
        lines += ["", f"![return curves]({plot})"]
    finals = {n: values(records, n, "test/return") for n in names}
    auc = {n: [statistics.fmean(c[p] for p in points) for c in curves[n]] if points else [] for n in names}
    lines += ["", "| entry | final test/return | area under the return curve (mean val/return) |", "|---|---|---|"]
    lines += [f"| {n} | {mean_sd(finals[n])} | {mean_sd(auc[n])} |" for n in names]

    verdicts = []
    conv = {n: plateau([sorted(c.items()) for c in curves[n]], higher_is_better=True) for n in names}
    if finals.get(METHOD):
        for other, claim in (
            (PRETRAINED, "Fine-tuning from the SEMDICE-pre-trained actor reaches a higher task return than from the "
                         "APT-pre-trained actor (best downstream adaptation among SEM pre-training methods)"),
            (OFFLINE, "Fine-tuning from the SEMDICE-pre-trained actor reaches a higher task return than from the "
                      "actor APT pre-trained offline on the same data"),
            (SCRATCH, "Fine-tuning from the SEMDICE-pre-trained actor reaches a higher task return than from scratch"),
        ):  # fmt: skip
            if not finals.get(other):
                continue
            ok = conv[METHOD][0] and conv[other][0]
            verdicts.append(
                Verdict(
                    claim,
                    compare(finals[METHOD], finals[other], higher_is_better=True, converged=ok),
                    f"final return {METHOD} {mean_sd(finals[METHOD])} vs {other} {mean_sd(finals[other])}; "
                    f"{METHOD} {conv[METHOD][1]}; {other} {conv[other][1]}",
                )
            )
        if auc.get(SCRATCH) and auc[METHOD]:
            verdicts.append(
                Verdict(
                    "Pre-training with SEMDICE speeds up adaptation (area under the return curve above scratch)",
                    compare(auc[METHOD], auc[SCRATCH], higher_is_better=True),
                    f"mean val/return over {len(points)} evaluations: {METHOD} {mean_sd(auc[METHOD])} vs "
                    f"{SCRATCH} {mean_sd(auc[SCRATCH])}; {PRETRAINED} {mean_sd(auc.get(PRETRAINED, []))}",
                )
            )
    lines += ["", "## Verdicts", "", verdict_table(verdicts) if verdicts else "No runs to judge."]
    return "\n".join(lines)
