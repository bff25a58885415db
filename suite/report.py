"""Shared helpers of the results-page hooks (``reports/<slug>.py``): the weak-baseline rule, convergence readings,
longer-run checks, budget tables, per-entry values and curves.

The verdict vocabulary and statistics live in :mod:`suite.stats` (95% Student-t intervals, paired by seed or Welch;
the best-so-far convergence rule) and the declared claims in :mod:`suite.claims`; :func:`compare`,
:func:`non_inferior` and :func:`plateau` here apply the same rules to plain value lists for hooks that judge a
comparison the spec cannot declare.

The weak-baseline rule (:func:`baseline_checks`): every claim entry records its headline validation metric before
training (``eval_at_start``, :mod:`suite.start_metrics`) beside its final value. The claim spec's ``headline:`` names
the metric, its direction, the baselines and an optional trivial reference::

    headline:
      start: val/normalized_entropy      # compared at step 0 and at the end (default: sizing_metric)
      metric: test/normalized_entropy    # compared with the reference (default: the start key's final value)
      higher_is_better: true             # default: sizing_higher_is_better
      baselines: [pb_s, cb_s, cb_sa]     # default: every entry but the first (the method) and the `_long` checks
      reference: {value: 0.0, what: "the uniform policy"}   # or {entry: <name>} or {metric: test/<key>}

A baseline is weak when, over its seeds, its final value is not shown better than its start, or its headline metric
not better than the reference: the 95% Student-t interval on the mean gain reaches 0, or the gain is at most 1% of
the start (reference). A ``reproduced`` verdict read against a weak baseline reads ``inconclusive: weak baseline``
(:func:`suite.claims.apply_weak_baselines`). Runs from before the rule have no start: "start not recorded".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError
from suite import stats as _stats
from suite.rundir import start_key

REPRODUCED = _stats.REPRODUCED
NOT_REPRODUCED = _stats.NOT_REPRODUCED
UNDERFIT = _stats.UNDERFIT
ABSENT = _stats.ABSENT
NOISE = _stats.NOISE
WEAK = _stats.WEAK
VERDICTS = _stats.VERDICTS
REL_TOL = 0.01  # one seed: a relative change below 1% counts as no change (plateau, compare)

Curve = Sequence[float] | Sequence[tuple[float, float]]


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


@dataclass
class BaselineCheck:
    """What the weak-baseline rule reads for one baseline entry.

    Attributes:
        name: the entry.
        weak: True when it ends no better than its start or than the reference; ``None`` when neither could be
            judged (no start recorded, no reference).
        reading: one line with the numbers.
    """

    name: str
    weak: bool | None
    reading: str


HEADLINE_KEYS = ("start", "metric", "higher_is_better", "baselines", "reference")


def headline_spec(spec: Any) -> dict[str, Any]:
    """The claim spec's ``headline:`` with its defaults (module docstring): ``start``, ``metric``,
    ``higher_is_better``, ``baselines`` and ``reference`` (``None`` or a dict with one of ``value`` / ``entry`` /
    ``metric``, and ``what``). A malformed ``headline:`` is a ConfigError naming the key."""
    spec = _spec(spec)
    raw = spec.get("headline") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"headline={raw!r} must be a mapping with keys {list(HEADLINE_KEYS)}")
    unknown = sorted(set(raw) - set(HEADLINE_KEYS))
    if unknown:
        raise ConfigError(f"headline has unknown keys {unknown} (known: {list(HEADLINE_KEYS)})")
    names = [e["name"] for e in spec.get("runs", [])]
    # `start: null` opts out of the start rule (a metric whose step-0 value is not comparable with its final one)
    start = raw["start"] if "start" in raw else spec.get("sizing_metric")
    longer = {n for n in names if n.endswith("_long") and n[: -len("_long")] in names}  # longer-run checks
    baselines = raw.get("baselines", [n for n in names[1:] if n not in longer])
    if not isinstance(baselines, list) or sorted(set(baselines) - set(names)):
        raise ConfigError(f"headline.baselines={baselines!r} must list runs of the claim (runs: {names})")
    hib = raw.get("higher_is_better", spec.get("sizing_higher_is_better", False))
    if not isinstance(hib, bool):
        raise ConfigError(f"headline.higher_is_better={hib!r} must be true or false")
    ref = raw.get("reference")
    if isinstance(ref, int | float) and not isinstance(ref, bool):
        ref = {"value": float(ref)}
    if ref is not None:
        kinds = [k for k in ("value", "entry", "metric") if k in ref] if isinstance(ref, dict) else []
        if len(kinds) != 1 or sorted(set(ref) - {"value", "entry", "metric", "what"}):
            raise ConfigError(f"headline.reference={ref!r} must be a number or {{value|entry|metric: ..., what: ...}}")
        if "entry" in ref and ref["entry"] not in names:
            raise ConfigError(f"headline.reference.entry={ref['entry']!r} is not a run of the claim (runs: {names})")
    return {
        "start": start,
        "metric": raw.get("metric") or start,
        "higher_is_better": hib,
        "baselines": list(baselines),
        "reference": ref,
    }


def _no_better(gains: Sequence[float], scale: float) -> tuple[bool, float]:
    """Whether the mean of ``gains`` (positive = better) is not shown above 0 by the 95% Student-t interval on it
    (its lower end at or below 0), or is at most :data:`REL_TOL` of ``|scale|``; and that mean."""
    gain = statistics.fmean(gains)
    lo = _stats.paired_interval(list(gains), [0.0] * len(gains)).lo if len(gains) > 1 else gain
    return lo <= 0 or gain <= REL_TOL * abs(scale), gain


def _finite(x: Any) -> bool:
    return x is not None and math.isfinite(float(x))


def baseline_checks(records: list[Any], spec: dict | str | None) -> dict[str, BaselineCheck]:
    """The weak-baseline rule on every baseline with runs (module docstring), by entry name.

    Start rule: per seed, the start key's final value against its ``@start`` value (the untrained model); entries in
    ``sizing_untrained`` train nothing and skip it. Reference rule: the headline metric per seed against a fixed
    ``value``, the ``metric`` of the same run, or the mean over seeds of another ``entry`` (Welch, :func:`compare`)."""
    head = headline_spec(spec)
    untrained = sizing_untrained(spec)
    sign = 1.0 if head["higher_is_better"] else -1.0
    start, metric, ref = head["start"], head["metric"], head["reference"]
    out = {}
    for name in head["baselines"]:
        runs = [r for r in records if r.name == name]
        if not runs:
            continue
        parts, weak = [], None
        if name in untrained:
            parts.append("trains nothing: no start to improve on")
        elif not start:
            parts.append("start not judged: the spec names no `sizing_metric` or `headline.start`, or sets it null")
        else:
            pairs = [(r.metrics.get(start_key(start)), r.metrics.get(start)) for r in runs]
            pairs = [(a, b) for a, b in pairs if _finite(a) and _finite(b)]
            if not pairs:
                parts.append(f"start not recorded (no `{start_key(start)}` in its runs)")
            else:
                s0 = statistics.fmean(a for a, _ in pairs)
                s1 = statistics.fmean(b for _, b in pairs)
                bad, gain = _no_better([sign * (b - a) for a, b in pairs], s0)
                weak = bad
                word = "ends no better than its start" if bad else "improves on its start"
                parts.append(
                    f"{word}: `{start}` {s0:.4g} at step 0 -> {s1:.4g} at the end (gain {gain:+.3g}, "
                    f"{len(pairs)} seed{'s' * (len(pairs) > 1)})"
                )
        if ref is not None:
            bad, text = _reference_check(runs, records, metric, ref, sign)
            if bad is not None:
                weak = bool(weak) or bad
            parts.append(text)
        out[name] = BaselineCheck(name, weak, "; ".join(parts))
    return out


def _reference_check(
    runs: list[Any], records: list[Any], metric: str, ref: dict, sign: float
) -> tuple[bool | None, str]:
    """The reference rule on one baseline's ``runs``: ``(weak or None when not judged, reading)``."""
    what = ref.get("what") or ref.get("entry") or ref.get("metric") or "the reference"
    vals = [(r, float(r.metrics[metric])) for r in runs if _finite(r.metrics.get(metric))]
    if not vals:
        return None, f"no `{metric}` to compare with {what}"
    mean = statistics.fmean(v for _, v in vals)
    if "entry" in ref:
        theirs = values(records, ref["entry"], metric)
        if not theirs:
            return None, f"no `{metric}` of `{ref['entry']}` ({what}) to compare with"
        bad = compare([v for _, v in vals], theirs, higher_is_better=sign > 0) != REPRODUCED
        level = f"{mean_sd(theirs)} of `{ref['entry']}`"
    else:
        if "value" in ref:
            pairs = [(v, float(ref["value"])) for _, v in vals]
        else:
            pairs = [(v, float(r.metrics[ref["metric"]])) for r, v in vals if _finite(r.metrics.get(ref["metric"]))]
            if not pairs:
                return None, f"no `{ref['metric']}` ({what}) in its runs to compare with"
        level_value = statistics.fmean(b for _, b in pairs)
        bad, _ = _no_better([sign * (v - b) for v, b in pairs], level_value)
        level = f"{level_value:.4g}"
    word = "no better than" if bad else "better than"
    return bad, f"`{metric}` {mean:.4g} is {word} {what} ({level})"


def weak_baselines(checks: dict[str, BaselineCheck]) -> dict[str, str]:
    """Entry name -> the reading, for the baselines :func:`baseline_checks` found weak."""
    return {n: c.reading for n, c in checks.items() if c.weak}


def baseline_section(records: list[Any], spec: dict | str | None) -> tuple[list[str], dict[str, str]]:
    """The claim page's weak-baseline section (markdown lines) and the weak baselines it found (for
    :func:`weak_baseline_rule`)."""
    head = headline_spec(spec)
    checks = baseline_checks(records, spec)
    lines = ["## Baselines: better than their start and than a trivial reference?", ""]
    ref = head["reference"]
    ref_text = ""
    if ref is not None:
        what = ref.get("what") or ref.get("entry") or ref.get("metric")
        ref_text = f", or whose `{head['metric']}` is no better than {what}"
    direction = "higher" if head["higher_is_better"] else "lower"
    start_text = (
        f"its own start (`{head['start']}` of the untrained model, recorded at step 0 by `eval_at_start`; "
        f"{direction} is better)"
        if head["start"]
        else "its own start (not judged here: `headline.start: null`)"
    )
    lines.append(
        f"A baseline that ends no better than {start_text}{ref_text} is a weak baseline: a verdict that reads "
        f"`{REPRODUCED}` against it reads `{WEAK}` instead. No better: the 95% Student-t interval on the mean gain "
        "over seeds reaches 0, or the gain is at most 1% of the start (the reference)."
    )
    if not head["baselines"]:  # the spec says so: `headline: {baselines: []}`
        return [
            lines[0],
            "",
            "The claim's entries are not baselines of one another (`headline.baselines: []`): "
            "its baselines are computed inside each run, so the rule has nothing to judge here.",
        ], {}
    if not checks:
        return [*lines, "", "No baseline has runs."], {}
    unrecorded = [c for c in checks.values() if "start not recorded" in c.reading]
    if unrecorded:
        which = "These runs" if len(unrecorded) == len(checks) else "Some of these runs"
        tail = (
            "no verdict is changed by the rule"
            if all(c.weak is None for c in checks.values())
            else "only the reference can mark them weak"
        )
        lines += ["", f"{which} recorded no step-0 value (runs from before the rule): start not recorded, and {tail}."]
    lines += ["", "| baseline | weak | reading |", "|---|---|---|"]
    for c in checks.values():
        state = "not judged" if c.weak is None else ("**yes**" if c.weak else "no")
        lines.append(f"| {c.name} | {state} | {_cell(c.reading)} |")
    return lines, weak_baselines(checks)


def _mean_var(values: Sequence[float]) -> tuple[float, float, int]:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        raise ValueError("no finite values to compare")
    return statistics.fmean(vals), statistics.variance(vals) if len(vals) > 1 else 0.0, len(vals)


def compare(
    method: Sequence[float],
    baseline: Sequence[float],
    *,
    higher_is_better: bool,
    converged: bool = True,
    rel_tol: float = REL_TOL,
    paired: bool = False,
) -> str:
    """Verdict of ``method`` vs ``baseline`` (one value per seed each) by the 95% Student-t interval on the
    difference (:mod:`suite.stats`): Welch, or paired by position when ``paired`` (both in seed order).

    ``UNDERFIT`` when not ``converged``; otherwise ``REPRODUCED`` when the interval lies on the better side of 0,
    ``NOT_REPRODUCED`` when it lies on the worse side, else ``NOISE`` (also with fewer than two seeds on a side,
    except one value on each side: deterministic runs, e.g. an exact solve, where the margin must exceed
    ``rel_tol`` of the baseline's magnitude). A claim declared in the spec (:mod:`suite.claims`) gets the full
    row: interval, p, the smallest effect of interest."""
    if not converged:
        return UNDERFIT
    m, _, nm = _mean_var(method)
    b, _, nb = _mean_var(baseline)
    sign = 1.0 if higher_is_better else -1.0
    if nm < 2 and nb < 2:  # no spread to estimate: a relative margin
        margin = sign * (m - b)
        threshold = rel_tol * max(abs(b), 1e-12)
        return REPRODUCED if margin > threshold else NOT_REPRODUCED if margin < -threshold else NOISE
    try:
        iv = (
            _stats.interval(list(method), list(baseline), paired=False, sign=sign)
            if not paired
            else (_stats.paired_interval([sign * v for v in method], [sign * v for v in baseline]))
        )
    except ValueError:
        return NOISE
    return _stats.decide(iv)[0]


def non_inferior(
    method: Sequence[float],
    reference: Sequence[float],
    *,
    margin: float,
    higher_is_better: bool,
    converged: bool = True,
    paired: bool = False,
) -> str:
    """Verdict of a "keeps" / "matches" claim: ``method`` is no worse than ``reference`` by more than ``margin``,
    by the 95% Student-t interval on the difference (Welch, or paired by position): ``REPRODUCED`` when its lower
    end lies above ``-margin``, ``NOT_REPRODUCED`` when its upper end lies below ``-margin``, ``NOISE`` otherwise
    (a difference within noise is not evidence of non-inferiority when the noise is wider than the margin).
    ``UNDERFIT`` when not ``converged``. With one value on each side the bound is the difference itself."""
    if margin < 0:
        raise ValueError(f"non-inferiority margin must be >= 0, got {margin}")
    if not converged:
        return UNDERFIT
    m, _, nm = _mean_var(method)
    r, _, nr = _mean_var(reference)
    sign = 1.0 if higher_is_better else -1.0
    if nm < 2 and nr < 2:
        iv = _stats.exact_interval([sign * m], [sign * r])
    else:
        try:
            iv = (
                _stats.interval(list(method), list(reference), paired=False, sign=sign)
                if not paired
                else (_stats.paired_interval([sign * v for v in method], [sign * v for v in reference]))
            )
        except ValueError:
            return NOISE
    if iv.lo > -margin:
        return REPRODUCED
    if iv.hi < -margin:
        return NOT_REPRODUCED
    return NOISE


def _points(curve: Curve) -> list[tuple[float, float]]:
    pts = []
    for i, p in enumerate(curve):
        x, y = p if isinstance(p, tuple | list) else (i, p)
        if y is not None and math.isfinite(float(y)):
            pts.append((float(x), float(y)))
    return pts


def plateau(
    curves: list[Curve], *, frac: float = 0.2, higher_is_better: bool, tol: float | None = None, rel: float = REL_TOL
) -> tuple[bool, str]:
    """Whether an entry's validation curves (one per seed) converged: :func:`suite.stats.converged` (the best-so-far
    value gained at most ``tol``, else ``rel`` of the best value, over the last ``frac`` of training, on every
    seed), as ``(converged, one-line reading)``."""
    c = _stats.converged(curves, higher_is_better=higher_is_better, frac=frac, tol=tol, rel=rel)
    return c.ok, c.reading


def patience_plateau(curves: list[Curve], *, patience: int, higher_is_better: bool) -> tuple[bool, str]:
    """The early-stopping criterion (Lightning's ``EarlyStopping`` with ``min_delta=0``): an entry has plateaued when,
    on every seed, none of its last ``patience`` validations beat the best value before them. A run that early
    stopping ended before its step cap meets it by construction; one that reached the cap meets it only if its last
    ``patience`` validations brought no new best.

    Args:
        curves: one validation curve per seed (values in training order or ``(step, value)`` pairs).
        patience: the number of validations without a new best (the ``EarlyStopping`` patience).
        higher_is_better: the metric's direction.

    Returns:
        ``(plateaued, explanation)``; a curve with ``patience`` or fewer points cannot show it (``False``).
    """
    if patience < 1:
        raise ValueError(f"patience={patience} must be >= 1")
    series = [p for p in (_points(c) for c in curves) if p]
    if not series:
        return False, "no validation curve logged"
    sign = 1.0 if higher_is_better else -1.0
    best_steps, last_steps, rising = [], [], 0
    for s in series:
        ys = [sign * y for _, y in s]
        best = max(range(len(ys)), key=lambda i: (ys[i], -i))  # the first occurrence of the best value
        best_steps.append(s[best][0])
        last_steps.append(s[-1][0])
        rising += len(s) - 1 - best < patience
    seeds = f"{len(series)} seed{'s' if len(series) != 1 else ''}"
    where = (
        f"best at step {', '.join(f'{b:g}' for b in best_steps)}, last validation at "
        f"{', '.join(f'{x:g}' for x in last_steps)}"
    )
    if rising:
        news = f"{rising} of {seeds} set a new best in the last {patience} validations"
        return False, f"still improving: {news} ({where})"
    return True, f"plateaued: no new best in the last {patience} validations on any of {seeds} ({where})"


def budget_table(budget: dict[str, dict[str, Any]] | None) -> str:
    """Markdown table of the paper's budget beside the one run here.

    ``budget`` is the claim spec's ``budget:`` key, ``{paper: {model: ..., steps: ..., data: ...}, here: {...}}``;
    rows are the union of both sides' keys (in order of first appearance), columns ``paper | here``.
    """
    if not budget:
        return "No `budget:` in the claim spec: the paper's budget is not stated beside this one."
    sides = [s for s in ("paper", "here") if s in budget] + [s for s in budget if s not in ("paper", "here")]
    rows = list(dict.fromkeys(k for s in sides for k in (budget[s] or {})))
    lines = ["| | " + " | ".join(sides) + " |", "|---|" + "---|" * len(sides)]
    for row in rows:
        cells = [_cell((budget[s] or {}).get(row, "—")) for s in sides]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- helpers on RunRecord lists (suite.compare.RunRecord: name, seed, metrics, curves) -----------------------------


def series(record: Any, key: str) -> list[tuple[int, float]]:
    """A record's ``key`` curve as ``(step, value)`` pairs (also tries ``key_epoch`` / ``key_step``)."""
    curves = getattr(record, "curves", {}) or {}
    return list(curves.get(key) or curves.get(f"{key}_epoch") or curves.get(f"{key}_step") or [])


def zipped_curves(records: list[Any], name: str, x_key: str, y_key: str) -> dict[str, dict[int, float]]:
    """Per seed of entry ``name``: ``{x: y}`` from two curves logged together (``x_key`` holds the x value of each
    row of ``y_key``, e.g. environment steps beside a return), zipped in log order."""
    out = {}
    for r in records:
        xs, ys = series(r, x_key), series(r, y_key)
        if r.name == name and xs and ys:
            out[str(r.seed)] = {int(x): y for (_, x), (_, y) in zip(xs, ys, strict=False)}
    return out


def entry_curves(records: list[Any], name: str, key: str) -> list[list[tuple[int, float]]]:
    """The ``key`` curve of every seed of entry ``name`` (empty curves dropped)."""
    return [c for c in (series(r, key) for r in records if r.name == name) if c]


def mean_curve(curves: list[list[tuple[int, float]]], counts: bool = False) -> list[tuple]:
    """Mean over seeds at every step that any seed logged (a step's mean uses the seeds that have it); with
    ``counts``, ``(step, mean, number of seeds)`` triples (early stopping ends seeds at different steps)."""
    by_step: dict[int, list[float]] = {}
    for c in curves:
        for step, v in c:
            if math.isfinite(v):
                by_step.setdefault(step, []).append(v)
    if counts:
        return [(s, statistics.fmean(v), len(v)) for s, v in sorted(by_step.items())]
    return [(s, statistics.fmean(v)) for s, v in sorted(by_step.items())]


def sizing(
    records: list[Any], metric: str, *, higher_is_better: bool, frac: float = 0.2, patience: int | None = None
) -> dict[str, tuple[bool, str]]:
    """:func:`plateau` of every entry (by name, in order of appearance) on the sizing metric; with ``patience``
    (runs that early stopping ends: the spec's ``sizing_patience``), :func:`patience_plateau` instead."""
    names = list(dict.fromkeys(r.name for r in records))
    if patience is not None:
        return {
            n: patience_plateau(entry_curves(records, n, metric), patience=patience, higher_is_better=higher_is_better)
            for n in names
        }
    return {n: plateau(entry_curves(records, n, metric), frac=frac, higher_is_better=higher_is_better) for n in names}


def longer_run_check(
    records: list[Any],
    base: str,
    key: str,
    *,
    higher_is_better: bool,
    tol: float | None = None,
    unit: str = "",
    suffix: str = "_long",
    seed: int | None = None,
    two_sided: bool = False,
) -> tuple[bool, str] | None:
    """The longer-budget sizing check: entry ``<base><suffix>`` is ``base`` trained longer (e.g. 4x the steps), on one
    seed or more; it counts as converged when the longer runs improve ``key`` (a test metric) over the same seeds of
    ``base`` by at most ``tol``, on average over the seeds both entries ran (the mean of the paired gains). A
    decaying schedule (cosine, one-cycle) flattens every validation curve by construction, so :func:`plateau` alone
    cannot tell a converged run from a cooled one; this check can.

    Args:
        records: the claim's ``RunRecord``s.
        base: the main entry's name.
        key: the metric compared (final value).
        higher_is_better: the metric's direction.
        tol: the largest improvement still counted as converged; ``None`` = 1% of the value (the convergence
            rule's default tolerance; the seed spread is never the tolerance).
        unit: appended to the numbers in the reading (e.g. ``" dB"``).
        suffix: the longer entry's name suffix.
        seed: pair only this seed; ``None`` = every seed that both entries ran.
        two_sided: also count a worsening by more than ``tol`` as not converged (a metric that the longer budget
            may move either way, e.g. a backdoor's success rate under a longer retraining).

    Returns:
        ``None`` when no seed has both runs, else ``(converged, one-line reading)``; a non-finite value on either
        side is not converged (nothing shows that the longer budget would not have helped).
    """

    def by_seed(name: str) -> dict[Any, float]:
        return {
            r.seed: float(r.metrics[key])
            for r in records
            if r.name == name and key in r.metrics and (seed is None or r.seed == seed)
        }

    longer, main = by_seed(base + suffix), by_seed(base)
    seeds = sorted(set(longer) & set(main), key=str)
    if not seeds:
        return None
    which = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    if not all(math.isfinite(longer[s]) and math.isfinite(main[s]) for s in seeds):
        return False, f"not shown converged: {key} of {base}{suffix} or {base} ({which}) is not finite"
    if tol is None:  # the convergence rule's tolerance, never the seed spread
        tol = REL_TOL * max(statistics.fmean(abs(main[s]) for s in seeds), 1e-12)
        what = f"1% of the value, {tol:.3g}{unit}"
    else:
        what = f"{tol:g}{unit}"
    sign = 1.0 if higher_is_better else -1.0
    gains = [(longer[s] - main[s]) * sign for s in seeds]
    gain = statistics.fmean(gains)
    ok = abs(gain) <= tol if two_sided else gain <= tol
    moved = f"improves {key} by {gain:.3g}{unit}" if gain >= 0 else f"worsens {key} by {-gain:.3g}{unit}"
    if len(seeds) == 1:
        values_read = f"{main[seeds[0]]:.4g} -> {longer[seeds[0]]:.4g}"
    else:
        mean = statistics.fmean
        values_read = (
            f"mean {mean(main[s] for s in seeds):.4g} -> {mean(longer[s] for s in seeds):.4g}; change "
            "per seed " + ", ".join(f"{longer[s] - main[s]:+.3g}" for s in seeds)
        )
        moved += " on average"
    return ok, (
        f"{'converged' if ok else 'not converged'}: the longer run ({base}{suffix}) {moved} on {which} "
        f"({values_read}; allowed: {what})"
    )


def longer_checks(
    records: list[Any], key: str, *, higher_is_better: bool, suffix: str = "_long", two_sided: bool = False
) -> dict[str, tuple[bool, str]]:
    """:func:`longer_run_check` on ``key`` of every entry that has a ``<entry><suffix>`` run, by entry name (sorted);
    entries without a pair are left out."""
    names = {str(getattr(r, "name", "")) for r in records}
    bases = sorted(n for n in names if n + suffix in names)
    checks = {
        n: longer_run_check(records, n, key, higher_is_better=higher_is_better, suffix=suffix, two_sided=two_sided)
        for n in bases
    }
    return {n: c for n, c in checks.items() if c is not None}


def main_runs(records: list[Any], suffix: str = "_long") -> list[Any]:
    """The claim's records without the longer-budget runs of :func:`longer_run_check` (entries named
    ``<entry><suffix>`` where ``<entry>`` is an entry too), which enter only the checks: a hook that tabulates or
    pairs runs by entry and seed uses these, or a longer run becomes an extra seed or setting. An entry whose name
    merely ends in the suffix, with no base entry, stays."""
    names = {str(getattr(r, "name", "")) for r in records}

    def is_longer(name: str) -> bool:
        return name.endswith(suffix) and name[: -len(suffix)] in names

    return [r for r in records if not is_longer(str(getattr(r, "name", "")))]


def apply_longer_checks(
    judged: dict[str, tuple[bool, str]],
    checks: dict[str, tuple[bool, str]],
    inherit: dict[str, Sequence[str]] | None = None,
    *,
    passed_settles: bool = False,
) -> dict[str, tuple[bool, str]]:
    """Per-entry convergence after the longer-budget checks: the plateau rule's ``judged`` (entry -> ``(ok, why)``),
    overridden by every failed :func:`longer_run_check` in ``checks`` (entry -> its result). An entry listed in
    ``inherit`` has no longer run of its own and takes the first failed check among the entries named for it (the
    same network and schedule with one component changed), so it is never counted converged on a cheaper check
    than those entries. By default a passed check leaves the plateau rule's answer as it is: both must hold (a
    failed check on a curve still rising is appended to the plateau rule's reading).

    ``passed_settles=True``: a passed check also settles its own entry as converged when the plateau rule read the
    curve as still rising (the reading keeps both; an entry with no curve, or too few points, is not settled). For
    constant-learning-rate runs whose validation metric moves from checkpoint to checkpoint by more than the seed
    spread of its final value, the endpoint rule measures that noise; the 4x run measures directly what more
    training does to the test metric. Its own limit: with one seed it compares two final values, each carrying that
    run's final-checkpoint noise, against the seed spread, so a hook that uses it says so on its page and gives the
    4x entry more seeds where the budget allows. Inheritors are not settled by it: only a failed check passes to
    them."""
    out = dict(judged)

    def fail(name: str, why: str) -> None:  # a curve still rising keeps its own reading in front
        out[name] = (False, why if judged[name][0] else f"{judged[name][1]}; and {why}")

    for name, (ok, why) in checks.items():
        if not ok and name in out:
            fail(name, why)
        elif ok and passed_settles and name in out and judged[name][1].startswith("still improving"):
            out[name] = (True, f"{judged[name][1]}; but {why}, which settles it")
    for name, sources in (inherit or {}).items():
        failed = [(s, checks[s][1]) for s in sources if s in checks and not checks[s][0]]
        if name in out and failed:
            src, why = failed[0]
            fail(name, f"{src}'s 4x check: {why}")
    return out


def values(records: list[Any], name: str, key: str) -> list[float]:
    """Final ``key`` of every seed of entry ``name`` (missing / non-finite dropped)."""
    out = []
    for r in records:
        v = r.metrics.get(key) if r.name == name else None
        if v is not None and math.isfinite(v):
            out.append(float(v))
    return out


def mean_sd(vals: Sequence[float]) -> str:
    """``mean ± sd`` with ``n`` (or the single value) for evidence lines."""
    vals = list(vals)
    if not vals:
        return "—"
    if len(vals) == 1:
        return f"{vals[0]:.4g} (1 seed)"
    return f"{statistics.fmean(vals):.4g} ± {statistics.stdev(vals):.2g} (n={len(vals)})"


def std_error(vals: Sequence[float]) -> float:
    """Standard error of the mean over seeds (0 for a single value)."""
    vals = list(vals)
    return statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0


def _spec(spec: Any) -> Any:
    """The claim spec a hook was given (a dict or a :class:`suite.claims.ClaimSpec`); never read from disk here."""
    return spec if spec is not None else {}


def sizing_untrained(spec: Any) -> dict[str, str]:
    """The spec's ``sizing_untrained``: entries that train nothing (an exact score, a closed-form solve), by name,
    with the reason; their sizing row reads ``n/a`` instead of a plateau judgement. A name that is no run is a
    ConfigError."""
    spec = _spec(spec)
    value = spec.get("sizing_untrained") or {}
    if not isinstance(value, dict) or not all(isinstance(v, str) and v.strip() for v in value.values()):
        raise ConfigError(f"sizing_untrained={value!r} must map entry names to the reason they train nothing")
    unknown = sorted(set(value) - {e["name"] for e in spec.get("runs", [])})
    if unknown:
        raise ConfigError(f"sizing_untrained names {unknown}, which are not runs of the claim")
    return {str(k): str(v).strip() for k, v in value.items()}


def sizing_patience(spec: Any) -> int | None:
    """The spec's ``sizing_patience`` (validations without a new best that count as a plateau: runs that early
    stopping ends, judged by :func:`patience_plateau`), or ``None`` for the endpoint rule of :func:`plateau`."""
    value = _spec(spec).get("sizing_patience")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"sizing_patience={value!r} must be an integer >= 1 (validations) or absent")
    return value
