"""Results page of MDA's claim check (``conf/claim/mda.yaml``): metric tables per method, verdicts, example maps.

Paper claim (abstract): MDA "outperforms 7 existing ViT attribution methods by an average of 12% across 12
attribution metrics". The paper's 12 are RISE and MAS insertion / deletion / ins-del, monotonicity, positive /
negative perturbation and three ImageNet-Segmentation scores; here the ten perturbation metrics are computed on the
embedded data (the segmentation set is replaced by the planted-trigger localisation, reported as held out). The
"average gain" is, per seed, the mean over the ten metrics of MDA's relative improvement over the **best** baseline
on that metric (sign-corrected for lower-is-better metrics); the reading of "12% on average" is ours (the notes do
not fix the aggregation), and the stricter gain over the best baseline is the one judged.
"""

from __future__ import annotations

import math
import shutil
import statistics
from pathlib import Path

from lightning_modules.mda.evaluation import FAITHFULNESS, HELD_OUT, LOWER_IS_BETTER
from suite.compare import RunRecord
from suite.report import NOISE, NOT_REPRODUCED, REPRODUCED, UNDERFIT, Verdict, compare, plateau, verdict_table

BASELINES = (
    "gradcam_attn", "integrated_gradients", "transformer_attribution", "transition_attention", "bidirectional",
    "tis", "vit_cx",
)  # fmt: skip
ABLATIONS = (
    "mda", "mda_dense", "mda_blend_smooth", "mda_official", "mda_tau05", "mda_tau07", "mda_tau10", "mda_kappa005",
)  # fmt: skip
ABLATION_METRICS = ("rise_insdel", "mas_insdel", "mono_pos", "heldout_rise_insdel", "pointing", "forwards", "seconds")


def _vals(records: list[RunRecord], method: str, metric: str) -> list[float]:
    out = []
    for r in sorted(records, key=lambda r: (r.seed is None, r.seed)):
        v = r.metrics.get(f"attr/{method}/{metric}")
        if v is not None and math.isfinite(v):
            out.append(float(v))
    return out


def _fmt(vals: list[float]) -> str:
    vals = [float(v) for v in vals if v is not None and math.isfinite(float(v))]
    if not vals:
        return "—"
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.fmean(vals):.3f} ± {sd:.3f}"


def _table(records: list[RunRecord], methods: list[str], metrics: tuple[str, ...]) -> str:
    head = "| method | " + " | ".join(m + (" ↓" if m in LOWER_IS_BETTER else "") for m in metrics) + " |"
    lines = [head, "|---|" + "---|" * len(metrics)]
    for meth in methods:
        lines.append(f"| {meth} | " + " | ".join(_fmt(_vals(records, meth, m)) for m in metrics) + " |")
    return "\n".join(lines)


def gain_over_best(records: list[RunRecord], metrics: tuple[str, ...], method: str = "mda") -> list[float]:
    """Per seed: mean over ``metrics`` of the relative improvement of ``method`` over the best baseline."""
    gains = []
    for r in records:
        per = []
        for m in metrics:
            mine = r.metrics.get(f"attr/{method}/{m}")
            base = [r.metrics.get(f"attr/{b}/{m}") for b in BASELINES]
            base = [b for b in base if b is not None and math.isfinite(b)]
            if mine is None or not base:
                continue
            best = min(base) if m in LOWER_IS_BETTER else max(base)
            delta = (best - mine) if m in LOWER_IS_BETTER else (mine - best)
            per.append(delta / max(abs(best), 1e-6))
        if per:
            gains.append(statistics.fmean(per))
    return gains


def _best_baseline(records: list[RunRecord], metric: str) -> str:
    means = {b: statistics.fmean(v) for b in BASELINES if (v := _vals(records, b, metric))}
    return (min if metric in LOWER_IS_BETTER else max)(means, key=means.get)


def converged(records: list[RunRecord]) -> tuple[bool, str]:
    """The subjects trained to a plateau of ``val/loss`` (suite.report.plateau)."""
    curves = [[v for _, v in r.curves.get("val/loss", [])] for r in records]
    return plateau([c for c in curves if c], higher_is_better=False)


def claim_report(records: list[RunRecord], out_dir: Path) -> str:
    """Markdown for the MDA claim page (tables, verdicts, example grid)."""
    out_dir = Path(out_dir)
    records = [r for r in records if any(k.startswith("attr/") for k in r.metrics)]
    if not records:
        return "No run logged attribution metrics (`model.attribution.enabled=true`)."
    ok, why = converged(records)
    n_img = [r.metrics.get("attr/n_images", 0) for r in records]
    skipped = {k: sum(r.metrics.get(f"attr/skipped_{k}", 0) for r in records) for k in ("wrong", "lowconf", "blur")}
    lines = [
        "## Attribution benchmark",
        "",
        f"Seeds: {len(records)}; images scored per seed: {[int(n) for n in n_img]}; skipped over all seeds: "
        f"{int(skipped['wrong'])} misclassified, {int(skipped['lowconf'])} below 60% confidence, "
        f"{int(skipped['blur'])} blur calibration failed. Localisation images per seed: "
        f"{[int(r.metrics.get('attr/n_localisation', 0)) for r in records]}. Subjects: test accuracy "
        f"{_fmt([r.metrics.get('test/acc', float('nan')) for r in records])}, backdoor ASR "
        f"{_fmt([r.metrics.get('test/asr_patch', float('nan')) for r in records])}; plateau: {why}.",
        "",
        "### Metrics MDA's search uses and the paper reports (mean ± std over seeds; ↓ lower is better)",
        "",
        _table(records, ["mda", *BASELINES, "rollout"], FAITHFULNESS),
        "",
        "### Held-out metrics (never seen by MDA's search): mean-colour substrate, trigger localisation",
        "",
        _table(records, ["mda", *BASELINES, "rollout"], HELD_OUT),
        "",
        "### Ablations (tau cutoff, kappa, gamma sparse/dense, smoothing, the official code's quirks)",
        "",
        _table(records, [a for a in ABLATIONS if _vals(records, a, "rise_insdel")], ABLATION_METRICS),
    ]
    gains = gain_over_best(records, FAITHFULNESS)
    per_metric = []
    for m in FAITHFULNESS:
        b = _best_baseline(records, m)
        per_metric.append((m, b, compare(_vals(records, "mda", m), _vals(records, b, m),
                                         higher_is_better=m not in LOWER_IS_BETTER, converged=ok)))  # fmt: skip
    wins = sum(v == REPRODUCED for _, _, v in per_metric)
    losses = sum(v not in (REPRODUCED, NOISE, UNDERFIT) for _, _, v in per_metric)
    g_mean = statistics.fmean(gains) if gains else float("nan")
    verdicts = [
        Verdict(
            "MDA outperforms the 7 ViT attribution baselines on average across the attribution metrics (paper: +12%)",
            compare(gains, [0.0] * len(gains), higher_is_better=True, converged=ok) if gains else NOISE,
            f"mean relative gain over the best baseline per metric, over 10 metrics: {100 * g_mean:+.1f}% "
            f"(per seed {', '.join(f'{100 * g:+.1f}%' for g in gains)})",
        ),
        Verdict(
            "MDA is the best method on each metric (per-metric reading of the same claim)",
            REPRODUCED
            if wins == len(FAITHFULNESS)
            else (UNDERFIT if not ok else NOISE if not losses else NOT_REPRODUCED),
            f"better than the best baseline beyond 2 s.e. on {wins}/{len(FAITHFULNESS)} metrics, worse on {losses}: "
            + "; ".join(f"{m} vs {b}: {v}" for m, b, v in per_metric),
        ),
    ]
    held = []
    for m in ("heldout_rise_insdel", "pointing", "iou_top1"):
        if not _vals(records, "mda", m):
            continue
        b = _best_baseline(records, m)
        v = compare(_vals(records, "mda", m), _vals(records, b, m), higher_is_better=True, converged=ok)
        held.append(f"{m}: MDA {_fmt(_vals(records, 'mda', m))} vs {b} {_fmt(_vals(records, b, m))} ({v})")
        verdicts.append(
            Verdict(
                f"(suite check, not a paper claim) MDA's advantage holds on the held-out metric {m}",
                v,
                held[-1],
            )
        )
    lines += ["", "## Verdicts", "", verdict_table(verdicts)]
    for r in sorted(records, key=lambda r: (r.seed is None, r.seed)):
        png = Path(r.path) / "mda_examples.png"
        if png.exists():
            shutil.copy(png, out_dir / "mda_examples.png")
            lines += ["", f"Example maps (seed {r.seed}; the last row carries the planted trigger):", "",
                      "![example maps](mda_examples.png)"]  # fmt: skip
            break
    return "\n".join(lines)
