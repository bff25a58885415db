"""Results-page hook of the ADDP claim (``report: reports.addp:claim_report``): per-step x0 quality curves, the
insight ablations against vanilla diffusion and the discriminative baseline, correction rounds; one verdict per claim.

Criteria (the hook's own, stated on the page):

* Claim 1a, early steps contribute most: the quality gained by the first half of the DDIM steps (from x0 = 0 to
  step K/2) against the second half, per seed of the vanilla entry; ``phenomenon absent`` if the model never beats
  the x0 = 0 prediction. The first step's gain over x0 = 0 is large by construction, so a stricter row compares
  steps 2..K/2 with the second half.
* Claim 1b, quality drops at late steps: the best step's quality against the final step's, per seed.
* Claim 2: each variant's final metric against vanilla diffusion (``test/absrel`` for depth, lower is better;
  ``test/iou`` for masks), gated on both entries' validation plateau (``val/absrel``, ``val/iou``).
* Claim 3: ``test/iou_round3`` (refined expression + negative) and ``test/iou_round2`` against ``test/iou_round1``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from suite.report import ABSENT, Verdict, compare, entry_curves, mean_sd, plateau, values, verdict_table

TASKS = {
    "depth": {"metric": "test/absrel", "val": "val/absrel", "curve": "absrel", "hib": False, "label": "AbsRel"},
    "ref": {"metric": "test/iou", "val": "val/iou", "curve": "iou", "hib": True, "label": "IoU"},
}
VARIANTS = {"contrib": "contribution-aware timesteps", "aug": "drift-simulating augmentation", "both": "both"}


def _curve(records: list[Any], name: str, key: str) -> list[list[float]]:
    """Per seed, the x0 quality at steps 0..K (``test/curve/<key>/step<k>``)."""
    out = []
    for r in records:
        if r.name != name:
            continue
        ks = sorted(int(k.rsplit("step", 1)[1]) for k in r.metrics if k.startswith(f"test/curve/{key}/step"))
        if ks:
            out.append([float(r.metrics[f"test/curve/{key}/step{k}"]) for k in ks])
    return out


def _converged(records: list[Any], names: list[str], key: str, hib: bool) -> tuple[bool, str]:
    ok, notes = True, []
    for n in names:
        curves = entry_curves(records, n, key)
        if not curves:
            return False, f"{n}: no {key} curve"
        flat, why = plateau(curves, higher_is_better=hib)
        ok &= flat
        notes.append(f"{n}: {'plateaued' if flat else why}")
    return ok, "; ".join(notes)


def _curve_claims(records: list[Any], task: str, cfg: dict) -> list[Verdict]:
    name = f"{task}_vanilla"
    curves = _curve(records, name, cfg["curve"])
    if not curves:
        return []
    sign = 1 if cfg["hib"] else -1
    k = len(curves[0]) - 1
    conv, why = _converged(records, [name], cfg["val"], cfg["hib"])
    early = [sign * (c[k // 2] - c[0]) for c in curves]
    late = [sign * (c[k] - c[k // 2]) for c in curves]
    out = []
    v1 = ABSENT if max(early) <= 0 else compare(early, late, higher_is_better=True, converged=conv)
    out.append(Verdict(
        f"{task}: the early half of the DDIM steps contributes more quality than the late half ({cfg['label']})",
        v1, f"gain steps 1..{k // 2}: {mean_sd(early)}; steps {k // 2 + 1}..{k}: {mean_sd(late)} ({name})",
    ))  # fmt: skip
    # Step 1 always gains most over the trivial x0 = 0: the stricter reading leaves it out (steps 2..K/2 vs the rest).
    early2 = [sign * (c[k // 2] - c[1]) for c in curves]
    out.append(Verdict(
        f"{task}: the same without the first step (steps 2..{k // 2} vs {k // 2 + 1}..{k}, {cfg['label']})",
        compare(early2, late, higher_is_better=True, converged=conv),
        f"gain steps 2..{k // 2}: {mean_sd(early2)}; steps {k // 2 + 1}..{k}: {mean_sd(late)} ({name})",
    ))  # fmt: skip
    best = [max(c[1:]) if cfg["hib"] else min(c[1:]) for c in curves]
    last = [c[-1] for c in curves]
    steps = [1 + (c[1:].index(b)) for c, b in zip(curves, best)]
    out.append(Verdict(
        f"{task}: perception quality drops at the late denoising steps ({cfg['label']} of the best step vs the last)",
        compare(best, last, higher_is_better=cfg["hib"], converged=conv),
        f"best {mean_sd(best)} at steps {steps} of {k}; last {mean_sd(last)} ({name}; {why})",
    ))  # fmt: skip
    return out


def _ablation_claims(records: list[Any], task: str, cfg: dict) -> list[Verdict]:
    out = []
    base = values(records, f"{task}_vanilla", cfg["metric"])
    for var, what in VARIANTS.items():
        ours = values(records, f"{task}_{var}", cfg["metric"])
        if not ours or not base:
            continue
        conv, why = _converged(records, [f"{task}_{var}", f"{task}_vanilla"], cfg["val"], cfg["hib"])
        out.append(Verdict(
            f"{task}: {what} beats vanilla uniform-t diffusion ({cfg['metric']})",
            compare(ours, base, higher_is_better=cfg["hib"], converged=conv),
            f"{mean_sd(ours)} vs {mean_sd(base)}; {why}",
        ))  # fmt: skip
    disc = values(records, f"{task}_disc", cfg["metric"])
    best = values(records, f"{task}_both", cfg["metric"])
    if disc and best:
        conv, why = _converged(records, [f"{task}_both", f"{task}_disc"], cfg["val"], cfg["hib"])
        out.append(Verdict(
            f"{task}: aligned diffusion (both insights) beats the discriminative one-step network of the same size",
            compare(best, disc, higher_is_better=cfg["hib"], converged=conv),
            f"{mean_sd(best)} vs {mean_sd(disc)}; {why}",
        ))  # fmt: skip
    return out


def _rounds(records: list[Any]) -> list[Verdict]:
    out = []
    for name in ("ref_vanilla", "ref_both"):
        r1 = values(records, name, "test/iou_round1")
        if not r1:
            continue
        conv, why = _converged(records, [name], "val/iou", True)
        for r, what in ((2, "a negative expression naming the wrong object"), (3, "+ the refined expression")):
            rr = values(records, name, f"test/iou_round{r}")
            if rr:
                out.append(Verdict(
                    f"correctional guidance over rounds raises IoU: round {r} ({what}) vs round 1 ({name})",
                    compare(rr, r1, higher_is_better=True, converged=conv), f"{mean_sd(rr)} vs {mean_sd(r1)}; {why}",
                ))  # fmt: skip
    return out


def _plot_curves(records: list[Any], out_dir: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    drawn = False
    for ax, (task, cfg) in zip(axes, TASKS.items()):
        for var in ("vanilla", *VARIANTS):
            curves = _curve(records, f"{task}_{var}", cfg["curve"])
            if curves:
                mean = [statistics.fmean(c[i] for c in curves) for i in range(len(curves[0]))]
                ax.plot(range(len(mean)), mean, marker="o", label=var)
                drawn = True
        ax.set_xlabel("DDIM step (0: x0 = 0)")
        ax.set_ylabel(f"x0 {cfg['label']}")
        ax.set_title(task)
        ax.legend(fontsize=7)
    fig.tight_layout()
    if not drawn:
        plt.close(fig)
        return ""
    path = Path(out_dir) / "addp_x0_curves.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return f"![per-step x0 quality]({path.name})"


def _curve_table(records: list[Any]) -> str:
    lines = []
    for task, cfg in TASKS.items():
        rows = []
        for var in ("vanilla", *VARIANTS):
            curves = _curve(records, f"{task}_{var}", cfg["curve"])
            if curves:
                mean = [statistics.fmean(c[i] for c in curves) for i in range(len(curves[0]))]
                rows.append(f"| {task}_{var} | " + " | ".join(f"{v:.3f}" for v in mean) + " |")
        if rows:
            k = rows[0].count("|") - 3
            lines += [f"**{task}: x0 {cfg['label']} per DDIM step (mean over seeds)**", "",
                      "| entry | " + " | ".join(f"step {i}" for i in range(k + 1)) + " |",
                      "|---|" + "---|" * (k + 1), *rows, ""]  # fmt: skip
    return "\n".join(lines)


def claim_report(records: list[Any], out_dir: Path, spec: dict | None = None) -> str:
    verdicts: list[Verdict] = []
    for task, cfg in TASKS.items():
        verdicts += _curve_claims(records, task, cfg)
    for task, cfg in TASKS.items():
        verdicts += _ablation_claims(records, task, cfg)
    verdicts += _rounds(records)
    parts = ["## Verdicts (computed by reports/addp.py; every component is our interpretation)", ""]
    parts.append(verdict_table(verdicts) if verdicts else "No finished runs yet.")
    parts += ["", _curve_table(records), _plot_curves(records, out_dir)]
    return "\n".join(parts)
