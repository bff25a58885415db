"""Results-page hook of the ADDP claim (Pang, Xu & Wang, ICLR 2025; ``report: reports.addp:claim_report``).

Every component is our interpretation (no official code). The ablations against vanilla diffusion and the
discriminative network are the spec's declared claims (``conf/claim/addp.yaml``); this hook adds:

* Convergence of every entry on its task's validation metric (``val/absrel``, ``val/iou``), overridden by the 4x
  check (``<entry>_long``, seed 0, 4x the steps) where the claim has one: the cosine decay flattens every validation
  curve, converged or not. ``contrib`` and ``aug`` inherit the checks of ``vanilla`` and ``both``; ``both`` without
  its own inherits ``vanilla``'s.
* Claim 1a, early steps contribute most: per seed of the vanilla entry, the quality gained over the first half of
  the DDIM steps (from x0 = 0 to step K/2) against the second half, paired by seed; ``phenomenon absent`` if the
  model never beats x0 = 0. The first step's gain over x0 = 0 is large by construction, so a stricter claim compares
  steps 2..K/2 with the second half.
* Claim 1b, quality drops at late steps: the best step of the seed-mean curve (steps 1..K), then per seed its quality
  against the last step's (paired); ``not reproduced`` when the mean curve is best at the last step. The step is
  chosen on the same test curves it is scored on (no per-step validation curve is logged), which favours a drop.
* Claim 3: ``test/iou_round{r}`` (r = 2: + a negative; 3: + the refined expression) against the restart control
  ``test/iou_restart{r}`` of the same run (the same re-noise + re-denoise with the original expression and no
  negative), paired by seed: the verdict measures the correction, not the resampling.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from suite.claims import Claim, ClaimResult, ClaimSpec, Figure, HookResult, Table, judge_values
from suite.report import NOT_REPRODUCED, apply_longer_checks, entry_curves, longer_run_check, plateau

TASKS = {
    "depth": {"metric": "test/absrel", "val": "val/absrel", "curve": "absrel", "hib": False, "label": "AbsRel"},
    "ref": {"metric": "test/iou", "val": "val/iou", "curve": "iou", "hib": True, "label": "IoU"},
}
VARIANTS = ("contrib", "aug", "both")
# The smallest effect of interest of the hook's own claims, as the spec's declared ones (the paper's numbers were not
# recovered): 2 IoU points; 0.001 AbsRel, about 5% of vanilla diffusion's AbsRel (0.017) at this scale.
DELTA = {"depth": 0.001, "ref": 0.02}
DELTA_WHY = {
    "depth": "about 5% of vanilla diffusion's AbsRel here (0.017); the paper's numbers were not recovered",
    "ref": "2 IoU points, the smallest gain a referring-segmentation table reports; the paper's numbers were not "
    "recovered",
}


def _curves(records: list[Any], name: str, key: str) -> dict[str, list[float]]:
    """Per seed, the x0 quality at DDIM steps 0..K (``test/curve/<key>/step<k>``)."""
    out = {}
    for r in records:
        if r.name != name:
            continue
        ks = sorted(int(k.rsplit("step", 1)[1]) for k in r.metrics if k.startswith(f"test/curve/{key}/step"))
        if ks:
            out[str(r.seed)] = [float(r.metrics[f"test/curve/{key}/step{k}"]) for k in ks]
    return out


def longer_checks(records: list[Any]) -> dict[str, tuple[bool, str]]:
    """The 4x check of every entry that has a ``<entry>_long`` run (the task's test metric, 1% of its value)."""
    out = {}
    for task, cfg in TASKS.items():
        for var in ("vanilla", *VARIANTS, "disc"):
            check = longer_run_check(records, f"{task}_{var}", cfg["metric"], higher_is_better=cfg["hib"])
            if check is not None:
                out[f"{task}_{var}"] = check
    return out


def convergence(records: list[Any], spec: ClaimSpec) -> dict[str, tuple[bool, str]]:
    """Entry -> ``(converged, reading)``: the convergence rule on the task's validation metric (the spec's window
    and relative tolerance), and every failed 4x check, own or inherited."""
    judged, inherit = {}, {}
    checks = longer_checks(records)
    for task, cfg in TASKS.items():
        for var in ("vanilla", *VARIANTS, "disc"):
            name = f"{task}_{var}"
            curves = entry_curves(records, name, cfg["val"])
            if not curves:
                continue
            ok, why = plateau(curves, higher_is_better=cfg["hib"], frac=spec.frac, rel=spec.rel)
            if ok and name in checks and checks[name][0]:
                why += "; 4x check passed"
            if var in VARIANTS and name not in checks:
                # no 4x run of its own: the checks of vanilla and both (same network and schedule) stand for it
                inherit[name] = [f"{task}_{v}" for v in ("vanilla", "both") if v != var]
                passed = [n for n in inherit[name] if n in checks and checks[n][0]]
                if ok and passed:
                    why += f"; inherits the passed 4x check of {' and '.join(passed)}"
            judged[name] = (ok, why)
    return apply_longer_checks(judged, checks, inherit)


def _unconverged(conv: dict[str, tuple[bool, str]], name: str) -> dict[str, str]:
    ok, why = conv.get(name, (False, "no validation curve"))
    return {} if ok else {name: why}


def _curve_claims(records: list[Any], task: str, cfg: dict, conv: dict) -> list[ClaimResult]:
    """Claims 1a and 1b on the vanilla entry's per-step x0 quality, paired by seed."""
    name = f"{task}_vanilla"
    curves = _curves(records, name, cfg["curve"])
    if not curves:
        return []
    k = min(len(c) for c in curves.values()) - 1
    h = k // 2
    sign = 1.0 if cfg["hib"] else -1.0
    unconv = _unconverged(conv, name)

    def claim(id_: str, text: str, a: str, b: str, hib: bool) -> Claim:
        return Claim(id_, text, f"test/curve/{cfg['curve']}", (a, b), hib, delta=DELTA[task], delta_why=DELTA_WHY[task])

    late = {s: sign * (c[k] - c[h]) for s, c in curves.items()}
    out = []
    for first, tag in ((0, ""), (1, "_from_step2")):
        early = {s: sign * (c[h] - c[first]) for s, c in curves.items()}
        # the model never beats x0 = 0: absent only once it converged, else it may still learn
        absent = "the x0 quality never beats x0 = 0" if first == 0 and max(early.values()) <= 0 and not unconv else None
        text = (
            f"{task}: the early half of the DDIM steps contributes more {cfg['label']} than the late half"
            if first == 0
            else f"{task}: the same without the first step (steps 2..{h} vs {h + 1}..{k})"
        )
        c = claim(f"{task}_early_half{tag}", text, f"gain steps {first + 1}..{h}", f"gain steps {h + 1}..{k}", True)
        r = judge_values(c, early, late, paired=True, unconverged=unconv, absent=absent)
        out.append(replace(r, evidence=f"per-step x0 quality of {name}", against=(name,)))
    mean = [statistics.fmean(c[i] for c in curves.values()) for i in range(k + 1)]
    pick = (max if cfg["hib"] else min)(range(1, k + 1), key=lambda i: mean[i])
    c = claim(
        f"{task}_late_drop",
        f"{task}: perception quality drops at the late denoising steps ({cfg['label']} of the best step vs the last)",
        f"step {pick} (best of the seed mean)",
        f"step {k} (last)",
        cfg["hib"],
    )
    best = {s: v[pick] for s, v in curves.items()}
    r = judge_values(c, best, {s: v[k] for s, v in curves.items()}, paired=True, unconverged=unconv)
    why = f"best step {pick} of {k}, chosen on the same test curves it is scored on (favours a drop)"
    if pick == k and not unconv:
        r = replace(
            r, verdict=NOT_REPRODUCED, why="the seed-mean curve is best at the last step: quality does not drop"
        )
    return [*out, replace(r, evidence=f"{why}; {name}", against=(name,))]


def _round_claims(records: list[Any], conv: dict) -> list[ClaimResult]:
    """Claim 3: each correction round against the same restarts without correction, per run, paired by seed."""
    out = []
    for name in ("ref_vanilla", "ref_both"):
        for r, what in ((2, "a negative expression naming the wrong object"), (3, "+ the refined expression")):
            key, ctrl = f"test/iou_round{r}", f"test/iou_restart{r}"
            runs = [x for x in records if x.name == name and key in x.metrics and ctrl in x.metrics]
            if not runs:
                continue
            c = Claim(
                f"{name}_round{r}",
                f"correctional guidance raises IoU: round {r} ({what}) vs the same restarts without correction "
                f"({name})",
                key,
                (f"round {r}", f"restart {r} (control)"),
                True,
                delta=DELTA["ref"],
                delta_why=DELTA_WHY["ref"],
            )
            a = {str(x.seed): float(x.metrics[key]) for x in runs}
            b = {str(x.seed): float(x.metrics[ctrl]) for x in runs}
            res = judge_values(c, a, b, paired=True, unconverged=_unconverged(conv, name))
            out.append(replace(res, evidence=f"{ctrl} of the same run is the control", against=(name,)))
    return out


def _curve_tables(records: list[Any]) -> list[Table]:
    tables = []
    for task, cfg in TASKS.items():
        rows = []
        for var in ("vanilla", *VARIANTS):
            curves = list(_curves(records, f"{task}_{var}", cfg["curve"]).values())
            if curves:
                n = min(map(len, curves))
                rows.append([f"{task}_{var}", *(f"{statistics.fmean(c[i] for c in curves):.3f}" for i in range(n))])
        if rows:
            cols = ["entry", *(f"step {i}" for i in range(max(map(len, rows)) - 1))]
            tables.append(Table(f"{task}: x0 {cfg['label']} per DDIM step (mean over seeds)", cols, rows))
    return tables


def _plot_curves(records: list[Any], out_dir: Path) -> Figure | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for ax, (task, cfg) in zip(axes, TASKS.items(), strict=True):
        for var in ("vanilla", *VARIANTS):
            curves = list(_curves(records, f"{task}_{var}", cfg["curve"]).values())
            if curves:
                n = min(map(len, curves))
                ax.plot(range(n), [statistics.fmean(c[i] for c in curves) for i in range(n)], marker="o", label=var)
        ax.set_xlabel("DDIM step (0: x0 = 0)")
        ax.set_ylabel(f"x0 {cfg['label']}")
        ax.set_title(task)
        if ax.lines:
            ax.legend(fontsize=7)
    drawn = any(ax.lines for ax in axes)
    path = Path(out_dir) / "addp_x0_curves.png"
    if drawn:
        fig.tight_layout()
        fig.savefig(path, dpi=90)
    plt.close(fig)
    return Figure("per-step x0 quality", path) if drawn else None


def claim_report(records: list[Any], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The curve and correction-round verdicts, every entry's convergence (task metric and 4x checks), the per-step
    x0 quality tables and figure."""
    conv = convergence(records, spec)
    verdicts = [v for task, cfg in TASKS.items() for v in _curve_claims(records, task, cfg, conv)]
    verdicts += _round_claims(records, conv)
    tables = _curve_tables(records)
    checks = longer_checks(records)
    if checks:
        unchecked = [t for t in TASKS if not any(n.startswith(f"{t}_") for n in checks)]
        note = "contrib and aug inherit the checks of vanilla and both, both without its own inherits vanilla's" + (
            f"; no 4x runs for {', '.join(unchecked)}: its entries are judged by the rule alone" if unchecked else ""
        )
        rows = [[n, "yes" if ok else "no", why] for n, (ok, why) in checks.items()]
        tables.insert(
            0, Table("4x checks (seed 0 at 4x the steps, test metric)", ["entry", "converged", "reading"], rows, note)
        )
    fig = _plot_curves(records, out_dir)
    return HookResult(verdicts=verdicts, tables=tables, figures=[fig] if fig else [], convergence=conv)
