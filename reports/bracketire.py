"""Results-page hook of the bracketire claim (``report: reports.bracketire:claim_report``), after Zhang et al.,
"Exposure Bracketing Is All You Need For A High-Quality Image" (ICLR 2025): TMRNet and the self-supervised
adaptation.

The verdicts are the spec's declared claims (``conf/claim/bracketire.yaml``). This hook supplies what they are gated
on and the page's tables:

* Convergence. The supervised entries anneal a cosine to ~0, which flattens every validation curve by construction,
  so above the convergence rule they are judged by the 4x-steps checks (``<entry>_long``: TMRNet's, early fusion's,
  single frame's; the other supervised entries, the same network and schedule with one component changed, inherit
  TMRNet's). The adaptation entries (``adapt_*`` with training) are judged on their own curve instead
  (:func:`adaptation_converged`): they run at a constant lr and the page scores their final weights, so a flat end of
  their validation PSNR, either way, means the adaptation has stopped moving the model.
* Phenomenon. TMRNet's frame-specific blocks start switched off (alpha = 0): when mean |alpha| stays below
  :data:`MIN_ALPHA`, TMRNet is the shared-only recurrence in effect and "frame-specific blocks help" cannot be tested.
* Tables: every entry's PSNR / SSIM / |alpha| / parameters, and the adaptation's learning-rate sweep; the example
  figures of the run folders (PNG, not kept in the results data: skipped with a note when absent).
"""

from __future__ import annotations

import math
import shutil
import statistics
from pathlib import Path

from suite import stats
from suite.claims import ClaimSpec, Figure, HookResult, Table, fmt, seed_values
from suite.compare import RunRecord
from suite.report import apply_longer_checks, longer_run_check, mean_sd, series

ROWS = {
    "tmrnet": "TMRNet (alpha learnable, init 0)",
    "shared": "shared-branch-only recurrence",
    "single": "single-frame network (frame 0)",
    "early": "early-fusion burst network",
    "single_wide": "single-frame network, as many parameters as TMRNet (31 body blocks)",
    "early_wide": "early-fusion burst network, as many parameters as TMRNet (30 body blocks)",
    "average": "exposure-normalised frame averaging",
    "tmrnet_alpha1": "TMRNet, alpha fixed to 1 (no modulation)",
    "tmrnet_f3": "TMRNet on the 3 shortest frames",
    "tmrnet_plus": "BracketIRE+: TMRNet (x4 SR head, beta init 0)",
    "single_plus": "BracketIRE+: single-frame network",
    "adapt_none": "shifted domain: synthetic TMRNet, no adaptation",
    "adapt_full": "shifted domain: EMA teacher + temporally unbalanced loss",
    "adapt_noself": "shifted domain: EMA teacher only (w_self = 0)",
    "adapt_lr_div10": "shifted domain: adaptation as adapt_full at a tenth of the official lr",
    "adapt_lr_x10": "shifted domain: adaptation as adapt_full at 10x the official lr",
    "tmrnet_long": "sizing check: TMRNet at 4x the steps (seed 0)",
    "early_long": "sizing check: early fusion at 4x the steps (seed 0)",
    "single_long": "sizing check: single frame at 4x the steps (seed 0)",
}
KEYS = ("test/psnr", "test/ssim", "test/alpha_abs")
# mean |alpha| of the trained TMRNet below this: the frame-specific branches never switched on (alpha starts at 0)
MIN_ALPHA = 0.05
ALPHA_CLAIM = "tmrnet_vs_shared"
# the 4x-steps check (`<entry>_long`, seed 0): a test-PSNR gain over the same seed's main run beyond this many dB
# means the main runs had not converged, whatever their (annealed) validation curves say
LONG_GAIN = 0.2
LONG_BASES = ("tmrnet", "early", "single")
# same network and schedule as TMRNet with one component changed: they inherit TMRNet's failed 4x check
INHERIT = ("tmrnet_plus", "single_plus", "tmrnet_alpha1", "tmrnet_f3", "shared", "single_wide", "early_wide")
# the adaptation's learning-rate sweep (conf/claim/bracketire.yaml): entry -> lr, the official 7.5e-5
# (real_bash/train_real.sh) in adapt_full; a run's own config, when recorded, wins over this table
SWEEP = {"adapt_lr_div10": 7.5e-6, "adapt_full": 7.5e-5, "adapt_lr_x10": 7.5e-4}
ADAPTED = ("adapt_lr_div10", "adapt_full", "adapt_lr_x10", "adapt_noself")  # trained adaptations, table order
# The adaptation's own convergence rule (:func:`adaptation_converged`), when the spec declares no `converge.tol`:
# LONG_GAIN carried from 4x the steps to their last ADAPT_FRAC on a log-linear learning curve (psnr = a + b log t:
# 0.2 dB per 4x is b log 4, so the last 20% move b log 1.25 = 0.2 log 1.25 / log 4 = 0.032 dB).
ADAPT_FRAC = 0.2
ADAPT_FLAT = LONG_GAIN * math.log(1.0 / (1.0 - ADAPT_FRAC)) / math.log(4.0)
EXAMPLES = ("tmrnet", "tmrnet_plus", "adapt_full")  # entries whose run folder draws bracketire_examples.png


def _adapt_curve(record: RunRecord, key: str = "val/psnr") -> list[tuple[float, float]]:
    """One adaptation run's ``key`` curve from its start: the step-0 value (``<key>@start``, the checkpoint before
    any adaptation step, :mod:`suite.start_metrics`) when recorded, then every validation."""
    pts = [(float(x), float(y)) for x, y in series(record, key) if y is not None and math.isfinite(float(y))]
    start = record.metrics.get(f"{key}@start")
    if start is not None and math.isfinite(float(start)) and not (pts and pts[0][0] <= 0):
        pts.insert(0, (0.0, float(start)))
    return pts


def adaptation_converged(
    records: list[RunRecord], name: str, key: str = "val/psnr", tol: float = ADAPT_FLAT
) -> tuple[bool, str]:
    """The adaptation's own convergence: entry ``name`` has converged when, on every seed, ``key`` changed by at most
    ``tol`` dB either way over the last ``ADAPT_FRAC`` of its steps (from the last validation at or before 80% of
    the steps to the end). Two-sided, not best-so-far: the page scores the final weights (``evaluate: last``), so a
    PSNR still falling is an adaptation still moving too. Sound because the claim runs the adaptation at a constant
    lr (a cosine to 0 would flatten the end by construction). Fewer than two points on any seed: not converged.

    Returns:
        ``(converged, one-line reading)`` with the largest late change and the change since the start (mean over
        seeds).
    """
    curves = [c for c in (_adapt_curve(r, key) for r in records if r.name == name) if c]
    if not curves:
        return False, "no validation curve logged"
    if any(len(c) < 2 for c in curves):
        return False, "fewer than two validation points: cannot be judged"
    late, total, starts = [], [], []
    for c in curves:
        cut = c[-1][0] - ADAPT_FRAC * (c[-1][0] - c[0][0])
        x0, y0 = [p for p in c[:-1] if p[0] <= cut + 1e-9][-1]  # c[0] is always a candidate
        starts.append(x0)
        late.append(c[-1][1] - y0)
        total.append(c[-1][1] - c[0][1])
    worst = max(late, key=abs)
    ok = abs(worst) <= tol
    n_moving = sum(abs(x) > tol for x in late)
    seeds = f"{len(curves)} seed{'s' if len(curves) != 1 else ''}"
    state = "converged" if ok else f"still moving on {n_moving} of {seeds}"
    return ok, (
        f"{state} (its own curve): {key} changed by up to {worst:+.3f} dB over the last {ADAPT_FRAC:.0%} of its "
        f"steps (since step {min(starts):g}; allowed ±{tol:.3f} on every seed), {statistics.fmean(total):+.3f} dB "
        f"since step {curves[0][0][0]:g} (mean of {seeds})"
    )


def _lr(records: list[RunRecord], name: str) -> float | None:
    """The entry's learning rate: its runs' recorded config (``model.optimizer.lr``), else :data:`SWEEP`."""
    for r in (r for r in records if r.name == name):
        lr = (((getattr(r, "config", None) or {}).get("model") or {}).get("optimizer") or {}).get("lr")
        if isinstance(lr, int | float) and not isinstance(lr, bool):
            return float(lr)
    return SWEEP.get(name, SWEEP["adapt_full"] if name in ADAPTED else None)  # adapt_noself: the official lr


def _gain(after: dict[str, float], before: dict[str, float]) -> str:
    """The paired-by-seed gain with its 95% interval (``—`` with fewer than two shared seeds)."""
    try:
        iv = stats.interval(after, before, paired=True)
    except ValueError:
        return "—"
    return f"{fmt(iv.diff)} [{fmt(iv.lo)}, {fmt(iv.hi)}] (n={iv.n[0]})"


def results_table(records: list[RunRecord]) -> Table:
    """PSNR / SSIM / mean |alpha| (mean ± sd over seeds) and the parameter count of every entry that ran."""
    rows = []
    for name, what in ROWS.items():
        cols = [list(seed_values(records, name, k).values()) for k in KEYS]
        if not cols[0]:
            continue
        params = list(seed_values(records, name, "test/params").values())
        rows.append([name, what, *(mean_sd(c) if c else "—" for c in cols), f"{int(params[0]):,}" if params else "—"])
    return Table(
        "Results (test split, mean ± sd over seeds)",
        ["entry", "what", "PSNR (dB)", "SSIM", "mean abs(alpha)", "parameters"],
        rows,
        "PSNR / SSIM on the 16-bit mu-tonemapped linear sRGB (half-resolution demosaic) with a border crop; the "
        "`adapt_*` rows are scored on the shifted domain's test split."
        if rows
        else "No finished runs.",
    )


def sweep_table(records: list[RunRecord], judged: dict[str, tuple[bool, str]], tol: float) -> Table | None:
    """The adaptation's lr sweep: test PSNR before (``adapt_none``, the same seeds' checkpoints) and after each
    trained adaptation, the gain paired by seed with its 95% interval, and the adaptation's own convergence."""
    before = seed_values(records, "adapt_none", "test/psnr")
    rows = []
    for name in ADAPTED:
        after = seed_values(records, name, "test/psnr")
        if not after:
            continue
        seeds = sorted(set(after) & set(before), key=str)
        lr = _lr(records, name)
        official = " (official)" if lr is not None and math.isclose(lr, SWEEP["adapt_full"]) else ""
        ok, why = judged.get(name, (False, "no curve"))
        rows.append(
            [
                name,
                f"{lr:.1e}{official}" if lr is not None else "?",
                "0" if name == "adapt_noself" else "1",
                mean_sd([before[s] for s in seeds]),
                mean_sd([after[s] for s in seeds] if seeds else list(after.values())),
                _gain(after, before),
                f"{'yes' if ok else 'no'}: {why}",
            ]
        )
    if not rows:
        return None
    columns = [
        "entry",
        "lr",
        "w_self",
        "test PSNR before (adapt_none)",
        "test PSNR after",
        "gain, paired by seed [95% CI]",
        "converged (own curve)",
    ]
    note = (
        f"Each seed adapts its own `tmrnet` checkpoint at a constant lr; the official lr is {SWEEP['adapt_full']:g} "
        "(real_bash/train_real.sh of the official code). The adaptation entries are gated on their own `val/psnr` "
        f"curve (step 0 = the checkpoint): converged when, on every seed, it changed by at most ±{tol:.3f} dB over "
        f"the last {ADAPT_FRAC:.0%} of the adaptation steps (the 4x check's {LONG_GAIN:g} dB carried to the last "
        f"{ADAPT_FRAC:.0%} of the steps on a log-linear curve), not on TMRNet's 4x check."
    )
    return Table("Self-supervised adaptation: learning-rate sweep (shifted domain, test split)", columns, rows, note)


def convergence(records: list[RunRecord], spec: ClaimSpec) -> dict[str, tuple[bool, str]]:
    """Entry -> ``(converged, reading)``: the convergence rule, overridden by every failed 4x check (and, for the
    entries in :data:`INHERIT`, by TMRNet's); the trained adaptation entries by :func:`adaptation_converged`."""
    judged = spec.convergence(records)
    checks = {}
    for base in LONG_BASES:
        check = longer_run_check(records, base, "test/psnr", higher_is_better=True, tol=LONG_GAIN, unit=" dB")
        if check is not None:
            checks[base] = check
    out = apply_longer_checks(judged, checks, {n: ("tmrnet",) for n in INHERIT})
    tol = spec.tol if spec.tol is not None else ADAPT_FLAT
    for name in ADAPTED:
        if any(r.name == name for r in records):
            out[name] = adaptation_converged(records, name, tol=tol)
    return out


def _examples(records: list[RunRecord], out_dir: Path) -> tuple[list[Figure], list[str]]:
    """The before / after figure of the first seed of each of :data:`EXAMPLES`, copied beside the page; a figure
    copied there by an earlier build stays when the run folders are gone (PNGs are not kept in the results data)."""
    figures, missing = [], []
    for name in EXAMPLES:
        runs = sorted((r for r in records if r.name == name), key=lambda r: (r.seed is None, str(r.seed)))
        if not runs:
            continue
        target = Path(out_dir) / f"bracketire_examples_{name}.png"
        drawn = next((r for r in runs if (Path(r.path) / "bracketire_examples.png").exists()), None)
        if drawn is not None:
            shutil.copy(Path(drawn.path) / "bracketire_examples.png", target)
            figures.append(Figure(f"Before / after, `{name}` seed {drawn.seed} (test brackets, mu-tonemapped)", target))
        elif target.exists():
            figures.append(
                Figure(f"Before / after, `{name}` (test brackets, mu-tonemapped; drawn by the runs)", target)
            )
        else:
            missing.append(name)
    notes = []
    if missing:
        notes.append(
            f"Example figures of {', '.join(f'`{n}`' for n in missing)}: not in the run folders (PNGs are not kept "
            "in the results data; a rerun of the claim draws them)."
        )
    return figures, notes


def claim_report(records: list[RunRecord], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The convergence gates and the phenomenon check of the declared claims, the results and lr-sweep tables, and
    the example figures."""
    judged = convergence(records, spec)
    absent = {}
    alpha = seed_values(records, "tmrnet", "test/alpha_abs")
    both = all(judged.get(n, (False,))[0] for n in ("tmrnet", "shared"))
    if alpha and statistics.fmean(alpha.values()) < MIN_ALPHA and both:  # underfit: more training may switch it on
        absent[ALPHA_CLAIM] = (
            f"mean |alpha| of TMRNet {statistics.fmean(alpha.values()):.3g} < {MIN_ALPHA}: the frame-specific "
            "branches stayed off, so TMRNet is the shared-only recurrence in effect"
        )
    tables = [results_table(records)]
    sweep = sweep_table(records, judged, spec.tol if spec.tol is not None else ADAPT_FLAT)
    notes = []
    if sweep is not None:
        tables.append(sweep)
        start = judged.get("tmrnet", (True, ""))
        if not start[0]:
            notes.append(
                f"The checkpoint the adaptation starts from is itself not converged by TMRNet's own gate ({start[1]}): "
                "the adaptation verdicts are about adapting that model."
            )
    figures, missing = _examples(records, out_dir)
    return HookResult(tables=tables, figures=figures, notes=[*notes, *missing], convergence=judged, absent=absent)
