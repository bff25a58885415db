"""Shared helpers of the results-page hooks (``reports/<slug>.py``): verdicts, the plateau criterion, budget tables.

A claim page states one :class:`Verdict` per claim of the paper, from a fixed vocabulary:

* ``reproduced`` / ``not reproduced``: the runs tested the claim (the strongest entries plateaued, the phenomenon
  is present) and the method's margin over the baseline is beyond ``n_se`` standard errors, for or against;
* ``inconclusive: underfit``: the runs had not converged, so they cannot show the effect either way;
* ``inconclusive: phenomenon absent``: what the claim is about never appeared in the subject (e.g. no massive
  activations by the census's own criteria);
* ``inconclusive: within noise``: converged runs whose difference is within the seed noise.

The plateau criterion (:func:`plateau`): an entry has plateaued when its validation metric improved over the last
``frac`` (20%) of training by less than the seed spread (standard deviation over seeds) of its final value, or by
less than 1% of the final value with one seed (or when the seeds agree exactly). A claim whose runs early stopping
ends (spec key ``sizing_patience``) uses the stopping rule itself (:func:`patience_plateau`): no new best in the
last ``patience`` validations, on every seed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.errors import ConfigError

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
UNDERFIT = "inconclusive: underfit"
ABSENT = "inconclusive: phenomenon absent"
NOISE = "inconclusive: within noise"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, UNDERFIT, ABSENT, NOISE)
REL_TOL = 0.01  # one seed: a relative change below 1% counts as no change (plateau, compare)

Curve = Sequence[float] | Sequence[tuple[float, float]]


@dataclass
class Verdict:
    """One claim of the paper and what the runs say about it.

    Attributes:
        claim: the paper's claim in one sentence.
        verdict: one of :data:`VERDICTS`.
        evidence: the numbers behind the verdict, one line.
    """

    claim: str
    verdict: str
    evidence: str

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {', '.join(map(repr, VERDICTS))}")


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def verdict_table(verdicts: list[Verdict]) -> str:
    """Markdown table ``| claim | verdict | evidence |``, one row per :class:`Verdict` (verdict in bold)."""
    lines = ["| claim | verdict | evidence |", "|---|---|---|"]
    lines += [f"| {_cell(v.claim)} | **{v.verdict}** | {_cell(v.evidence)} |" for v in verdicts]
    return "\n".join(lines)


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
    n_se: float = 2.0,
    rel_tol: float = REL_TOL,
) -> str:
    """Verdict of ``method`` vs ``baseline`` (one value per seed each).

    ``UNDERFIT`` when not ``converged``; otherwise ``REPRODUCED`` when the method is better by more than ``n_se``
    standard errors of the difference of means (Welch: ``sqrt(s_m^2/n_m + s_b^2/n_b)``), ``NOT_REPRODUCED`` when
    worse by as much, else ``NOISE``. With a single value on both sides there is no standard error: the margin must
    then exceed ``rel_tol`` of the baseline's magnitude (deterministic runs, e.g. an exact solve).
    """
    if not converged:
        return UNDERFIT
    m, vm, nm = _mean_var(method)
    b, vb, nb = _mean_var(baseline)
    margin = (m - b) if higher_is_better else (b - m)
    one_each = nm < 2 and nb < 2  # no standard error: fall back to a relative margin
    threshold = rel_tol * max(abs(b), 1e-12) if one_each else n_se * math.sqrt(vm / nm + vb / nb)
    if margin > threshold:
        return REPRODUCED
    if margin < -threshold:
        return NOT_REPRODUCED
    return NOISE


def non_inferior(
    method: Sequence[float],
    reference: Sequence[float],
    *,
    margin: float,
    higher_is_better: bool,
    converged: bool = True,
    n_se: float = 2.0,
) -> str:
    """Verdict of a "keeps" / "matches" claim: ``method`` is no worse than ``reference`` by more than ``margin``.

    With ``d`` the difference of means signed so that positive is better and ``se`` its Welch standard error:
    ``REPRODUCED`` when the lower bound ``d - n_se * se`` lies above ``-margin`` (no worse than the margin, with
    confidence); ``NOT_REPRODUCED`` when the upper bound ``d + n_se * se`` lies below ``-margin`` (worse by more than
    the margin, with confidence); ``NOISE`` otherwise: a difference "within noise" is not evidence of non-inferiority
    when the noise is wider than the margin. ``UNDERFIT`` when not ``converged``. With one value on each side there
    is no standard error and the bound is the difference itself. The margin must be stated before the runs (in the
    hook, beside the claim) and shown on the page.
    """
    if margin < 0:
        raise ValueError(f"non-inferiority margin must be >= 0, got {margin}")
    if not converged:
        return UNDERFIT
    m, vm, nm = _mean_var(method)
    r, vr, nr = _mean_var(reference)
    d = (m - r) if higher_is_better else (r - m)
    se = 0.0 if nm < 2 and nr < 2 else math.sqrt(vm / nm + vr / nr)
    if d - n_se * se > -margin:
        return REPRODUCED
    if d + n_se * se < -margin:
        return NOT_REPRODUCED
    return NOISE


def _points(curve: Curve) -> list[tuple[float, float]]:
    pts = []
    for i, p in enumerate(curve):
        x, y = p if isinstance(p, tuple | list) else (i, p)
        if y is not None and math.isfinite(float(y)):
            pts.append((float(x), float(y)))
    return pts


def _window_start(pts: list[tuple[float, float]], frac: float) -> tuple[float, float]:
    """The last point at or before ``(1 - frac)`` of the training span (so the window covers >= ``frac``)."""
    x0, x1 = pts[0][0], pts[-1][0]
    cut = x1 - frac * (x1 - x0)
    before = [p for p in pts[:-1] if p[0] <= cut + 1e-9]
    return before[-1] if before else pts[0]


def plateau(curves: list[Curve], *, frac: float = 0.2, higher_is_better: bool) -> tuple[bool, str]:
    """Whether an entry's validation curves (one per seed) have plateaued, and a one-line explanation.

    Args:
        curves: one curve per seed, either values in training order or ``(step, value)`` pairs.
        frac: the final fraction of training whose improvement is measured (0.2 = the last 20%).
        higher_is_better: the metric's direction (accuracy: True, loss: False).

    Returns:
        ``(plateaued, explanation)``: plateaued when the mean improvement over the last ``frac`` of training is
        smaller than the seed spread of the final value (standard deviation over seeds), or than 1% of the final
        value with one seed. A curve with fewer than two points cannot show a plateau (``False``).
    """
    series = [p for p in (_points(c) for c in curves) if p]
    if not series:
        return False, "no validation curve logged"
    if any(len(s) < 2 for s in series):
        return False, "fewer than two validation points: cannot be judged"
    sign = 1.0 if higher_is_better else -1.0
    gains, finals, starts = [], [], []
    for s in series:
        x0, y0 = _window_start(s, frac)
        starts.append(x0)
        gains.append(sign * (s[-1][1] - y0))
        finals.append(s[-1][1])
    gain = statistics.fmean(gains)
    final = statistics.fmean(finals)
    spread = statistics.stdev(finals) if len(finals) > 1 else 0.0
    if spread > 0:
        tol, what = spread, f"the seed spread {spread:.3g}"
    else:
        tol = REL_TOL * max(abs(final), 1e-12)
        what = f"1% of the final value ({tol:.3g})"
    ok = gain < tol
    word = "plateaued" if ok else "still improving"
    return ok, (
        f"{word}: {'improved' if gain >= 0 else 'changed'} by {gain:.3g} since step {min(starts):g} "
        f"(the last {frac:.0%} of training) vs {what}; final {final:.4g} over {len(series)} "
        f"seed{'s' if len(series) != 1 else ''}"
    )


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
    where = (f"best at step {', '.join(f'{b:g}' for b in best_steps)}, last validation at "
             f"{', '.join(f'{x:g}' for x in last_steps)}")  # fmt: skip
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
        tol: the largest improvement still counted as converged; ``None`` = the seed spread (standard deviation
            over seeds) of ``base``'s ``key``, the plateau rule's own yardstick (1% of the value with one seed).
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
        return {r.seed: float(r.metrics[key]) for r in records
                if r.name == name and key in r.metrics and (seed is None or r.seed == seed)}  # fmt: skip

    longer, main = by_seed(base + suffix), by_seed(base)
    seeds = sorted(set(longer) & set(main), key=str)
    if not seeds:
        return None
    which = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    if not all(math.isfinite(longer[s]) and math.isfinite(main[s]) for s in seeds):
        return False, f"not shown converged: {key} of {base}{suffix} or {base} ({which}) is not finite"
    if tol is None:
        spread = values(records, base, key)
        sd = statistics.stdev(spread) if len(spread) > 1 else 0.0
        if sd > 0:
            tol, what = sd, f"the seed spread {sd:.3g}{unit}"
        else:  # one seed, or seeds that agree exactly: the plateau rule's relative fallback
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
        values_read = (f"mean {mean(main[s] for s in seeds):.4g} -> {mean(longer[s] for s in seeds):.4g}; change "
                       "per seed " + ", ".join(f"{longer[s] - main[s]:+.3g}" for s in seeds))  # fmt: skip
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


def curve_table(
    curves: dict[str, list[dict[int, float]]], names: Sequence[str], points: Sequence[int], digits: int = 3
) -> list[str]:
    """Markdown rows (header, rule, one row per entry) of ``mean ± s.e.`` over seeds at each of ``points``;
    ``curves[name]`` holds one ``{point: value}`` dict per seed."""
    lines = ["| entry | " + " | ".join(str(p) for p in points) + " |", "|---|" + "---|" * len(points)]
    for n in names:
        cells = []
        for p in points:
            vals = [c[p] for c in curves[n]]
            cells.append(f"{statistics.fmean(vals):.{digits}f} ± {std_error(vals):.{digits}f}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


def _spec(spec_or_slug: dict | str | None) -> dict:
    """A claim spec: the dict itself, or ``conf/claim/<slug>.yaml`` read for a slug (``{}`` when absent)."""
    if isinstance(spec_or_slug, str):
        from omegaconf import OmegaConf

        path = Path(__file__).resolve().parents[1] / "conf" / "claim" / f"{spec_or_slug}.yaml"
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False) if path.exists() else {}
    return spec_or_slug or {}


def sizing_spec(spec_or_slug: dict | str | None) -> tuple[str | None, bool]:
    """``(sizing_metric, sizing_higher_is_better)`` of a claim spec (a dict, or a slug read from ``conf/claim``)."""
    spec = _spec(spec_or_slug)
    return spec.get("sizing_metric"), bool(spec.get("sizing_higher_is_better", False))


def sizing_untrained(spec_or_slug: dict | str | None) -> dict[str, str]:
    """The spec's ``sizing_untrained``: entries that train nothing (an exact score, a closed-form solve), by name,
    with the reason; their sizing row reads ``n/a`` instead of a plateau judgement. A name that is no run is a
    ConfigError."""
    spec = _spec(spec_or_slug)
    value = spec.get("sizing_untrained") or {}
    if not isinstance(value, dict) or not all(isinstance(v, str) and v.strip() for v in value.values()):
        raise ConfigError(f"sizing_untrained={value!r} must map entry names to the reason they train nothing")
    unknown = sorted(set(value) - {e["name"] for e in spec.get("runs", [])})
    if unknown:
        raise ConfigError(f"sizing_untrained names {unknown}, which are not runs of the claim")
    return {str(k): str(v).strip() for k, v in value.items()}


def sizing_patience(spec_or_slug: dict | str | None) -> int | None:
    """The spec's ``sizing_patience`` (validations without a new best that count as a plateau: runs that early
    stopping ends, judged by :func:`patience_plateau`), or ``None`` for the endpoint rule of :func:`plateau`."""
    value = _spec(spec_or_slug).get("sizing_patience")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"sizing_patience={value!r} must be an integer >= 1 (validations) or absent")
    return value
