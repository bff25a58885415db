"""The statistics of a claim verdict, as a reviewer in the field computes them.

Everything here is plain arithmetic on per-seed values; the Student-t distribution comes from scipy.

* :func:`paired_interval`: a 95% Student-t confidence interval on the mean of the per-seed differences
  ``a[s] - b[s]`` (``n - 1`` degrees of freedom), for entries that share what a seed determines (data, split,
  evaluation samples): the pairing removes the seed-to-seed variation that both entries share.
* :func:`welch_interval`: the Welch interval on the difference of means (Welch-Satterthwaite degrees of freedom), for
  entries whose seeds do not pair.
* :func:`decide`: the verdict of a claim from its interval and its pre-registered smallest effect of interest
  ``delta`` (superiority, non-inferiority or equivalence), with the p-value that matches the decision:
  ``p < 0.05`` exactly when the 95% interval decides ``reproduced``.
* :func:`holm`: Holm's step-down adjustment across a page's primary claims.
* :func:`seeds_for_half_width`: the seeds an interval of half-width ``delta`` needs, given the spread seen.
* :func:`converged`: the convergence rule: the best-so-far validation value gained less than a tolerance over the last
  20% of training, on every seed (a run that peaked and then got worse is converged at its best).

Every difference is signed so that positive means "better" (the caller multiplies by -1 for lower-is-better metrics).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LEVEL = 0.95
ALPHA = 1.0 - LEVEL

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
UNDERFIT = "inconclusive: underfit"
ABSENT = "inconclusive: phenomenon absent"
NOISE = "inconclusive: within noise"
WEAK = "inconclusive: weak baseline"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, UNDERFIT, ABSENT, NOISE, WEAK)

KINDS = ("superiority", "non_inferior", "equivalent")


def _t():
    from scipy import stats  # imported on use: the floor modules stay light

    return stats.t


def t_quantile(level: float, df: float) -> float:
    """The two-sided Student-t critical value: ``P(|T_df| <= q) = level``."""
    if not 0 < level < 1:
        raise ValueError(f"level={level} must lie in (0, 1)")
    if not df > 0:
        raise ValueError(f"df={df} must be > 0")
    return float(_t().ppf(0.5 + level / 2, df))


def t_two_sided_p(t: float, df: float) -> float:
    """``P(|T_df| >= |t|)``; 0 for an infinite statistic, 1 for a zero one with no spread."""
    if math.isnan(t):
        return 1.0
    if math.isinf(t):
        return 0.0
    return float(min(1.0, 2 * _t().sf(abs(t), df)))


@dataclass(frozen=True)
class Interval:
    """A confidence interval on the difference ``a - b`` (positive = ``a`` better, signs applied by the caller).

    Attributes:
        diff: the estimate (mean of paired differences, or difference of means).
        lo, hi: the interval's ends at ``level``; equal to ``diff`` when there is no spread (``se == 0``).
        se: its standard error.
        df: the t distribution's degrees of freedom (``n - 1`` paired; Welch-Satterthwaite otherwise); ``nan`` with
            no spread to estimate.
        n: values used on each side (paired: the number of pairs, twice).
        paired: whether the interval pairs by seed.
        level: the confidence level.
    """

    diff: float
    lo: float
    hi: float
    se: float
    df: float
    n: tuple[int, int]
    paired: bool
    level: float = LEVEL

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    @property
    def method(self) -> str:
        return "paired" if self.paired else "Welch"

    def p_value(self, null: float = 0.0) -> float:
        """Two-sided p-value of the t test of ``diff == null`` (what scipy's ttest_rel / ttest_ind report)."""
        if self.se == 0:
            return 0.0 if self.diff != null else 1.0
        return t_two_sided_p((self.diff - null) / self.se, self.df)

    def shifted(self, by: float) -> Interval:
        return Interval(self.diff + by, self.lo + by, self.hi + by, self.se, self.df, self.n, self.paired, self.level)


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _interval(diff: float, se: float, df: float, n: tuple[int, int], paired: bool, level: float) -> Interval:
    if se <= 1e-12 * max(abs(diff), 1.0):  # equal values up to rounding: no spread
        se = 0.0
    if se == 0 or not math.isfinite(df):
        return Interval(diff, diff, diff, 0.0, math.nan if se == 0 else df, n, paired, level)
    q = t_quantile(level, df)
    return Interval(diff, diff - q * se, diff + q * se, se, df, n, paired, level)


def paired_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Interval:
    """The paired-t interval on ``mean(a[i] - b[i])``: ``a`` and ``b`` are in seed order, one value per seed each.

    Raises:
        ValueError: different lengths, a non-finite value, or fewer than two pairs."""
    if len(a) != len(b):
        raise ValueError(f"paired interval needs one value per seed on both sides, got {len(a)} and {len(b)}")
    d = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
    if len(_finite(d)) != len(d):
        raise ValueError("paired interval on a non-finite value")
    n = len(d)
    if n < 2:
        raise ValueError(f"a paired interval needs at least 2 seeds, got {n}")
    se = statistics.stdev(d) / math.sqrt(n)
    return _interval(statistics.fmean(d), se, n - 1, (n, n), True, level)


def welch_df(va: float, na: int, vb: float, nb: int) -> float:
    """Welch-Satterthwaite degrees of freedom for sample variances ``va``, ``vb`` over ``na``, ``nb`` values."""
    qa, qb = va / na, vb / nb
    den = (qa * qa / (na - 1) if na > 1 else 0.0) + (qb * qb / (nb - 1) if nb > 1 else 0.0)
    return (qa + qb) ** 2 / den if den > 0 else math.inf


def welch_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Interval:
    """The Welch interval on ``mean(a) - mean(b)``.

    Raises:
        ValueError: a non-finite value, or fewer than two values on a side."""
    xa, xb = _finite(a), _finite(b)
    if len(xa) != len(a) or len(xb) != len(b):
        raise ValueError("Welch interval on a non-finite value")
    if len(xa) < 2 or len(xb) < 2:
        raise ValueError(f"a Welch interval needs at least 2 seeds a side, got {len(xa)} and {len(xb)}")
    va, vb = statistics.variance(xa), statistics.variance(xb)
    se = math.sqrt(va / len(xa) + vb / len(xb))
    df = welch_df(va, len(xa), vb, len(xb))
    return _interval(statistics.fmean(xa) - statistics.fmean(xb), se, df, (len(xa), len(xb)), False, level)


def welch_from_summary(
    mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int, level: float = LEVEL
) -> Interval:
    """The Welch interval from each side's mean, standard deviation and count: what a page that kept only
    ``mean ± sd (n)`` still allows (a paired interval needs the per-seed values)."""
    if n_a < 2 or n_b < 2:
        raise ValueError(f"a Welch interval needs at least 2 seeds a side, got {n_a} and {n_b}")
    va, vb = sd_a * sd_a, sd_b * sd_b
    se = math.sqrt(va / n_a + vb / n_b)
    return _interval(mean_a - mean_b, se, welch_df(va, n_a, vb, n_b), (n_a, n_b), False, level)


def exact_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Interval:
    """A zero-width "interval" for deterministic entries (an exact solve, a closed form): one value a side, no noise
    to estimate. Only a claim that declares its entries deterministic may use it."""
    xa, xb = _finite(a), _finite(b)
    if not xa or not xb:
        raise ValueError("no finite values to compare")
    if max(xa) != min(xa) or max(xb) != min(xb):
        raise ValueError("a deterministic entry gave different values on different seeds: it is not exact")
    d = statistics.fmean(xa) - statistics.fmean(xb)
    return Interval(d, d, d, 0.0, math.nan, (len(xa), len(xb)), False, level)


def interval(
    a: Mapping[object, float] | Sequence[float],
    b: Mapping[object, float] | Sequence[float],
    *,
    paired: bool,
    sign: float = 1.0,
    level: float = LEVEL,
) -> Interval:
    """The interval on ``sign * (a - b)``. Paired: ``a`` and ``b`` map seed -> value, and the seeds both have are
    paired (in sorted order); Welch: all values of each side.

    Raises:
        ValueError: too few values (see :func:`paired_interval`, :func:`welch_interval`)."""
    if paired:
        if not isinstance(a, Mapping) or not isinstance(b, Mapping):
            raise ValueError("a paired interval needs seed -> value mappings")
        seeds = sorted(set(a) & set(b), key=str)
        iv = paired_interval([sign * a[s] for s in seeds], [sign * b[s] for s in seeds], level)
    else:
        va = list(a.values()) if isinstance(a, Mapping) else list(a)
        vb = list(b.values()) if isinstance(b, Mapping) else list(b)
        iv = welch_interval([sign * v for v in va], [sign * v for v in vb], level)
    return iv


def decide(iv: Interval, *, kind: str = "superiority", delta: float = 0.0) -> tuple[str, float, str]:
    """The verdict of one claim from its interval (positive = the claimed direction).

    * ``superiority`` (the method is better): ``reproduced`` when the interval lies above 0; ``not reproduced`` when
      it lies below 0 (the opposite holds), or entirely below ``delta`` (no effect as large as the smallest effect
      of interest: evidence against the claim's size at this scale); ``within noise`` otherwise.
    * ``non_inferior`` (no worse than ``delta``): ``reproduced`` when the interval lies above ``-delta``;
      ``not reproduced`` when it lies below ``-delta``; ``within noise`` otherwise.
    * ``equivalent`` (within ``±delta``): ``reproduced`` when the interval lies inside ``(-delta, delta)``;
      ``not reproduced`` when it lies entirely outside it; ``within noise`` otherwise.

    Returns:
        ``(verdict, p, qualifier)``: p is the two-sided p-value of the test that matches the decision (the null
        ``0`` for superiority, ``-delta`` for non-inferiority, the larger of the two one-sided tests at ``±delta``
        doubled for equivalence), so ``p < 1 - level`` exactly when the interval decides ``reproduced``; the
        qualifier names why a ``not reproduced`` was reached, or that a reproduced effect is smaller than ``delta``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {list(KINDS)}")
    if delta < 0:
        raise ValueError(f"delta={delta} must be >= 0")
    if kind == "superiority":
        p = iv.p_value(0.0)
        if iv.lo > 0:
            small = delta > 0 and iv.hi < delta
            return REPRODUCED, p, f"smaller than delta {delta:g}" if small else ""
        if iv.hi < 0:
            return NOT_REPRODUCED, p, "the opposite holds"
        if delta > 0 and iv.hi < delta:  # the test of "the effect is at least delta": its p, not the one against 0
            return NOT_REPRODUCED, iv.p_value(delta), f"no effect as large as delta {delta:g}"
        return NOISE, p, ""
    if kind == "non_inferior":
        p = iv.p_value(-delta)  # the test at the margin, either way it decides
        if iv.lo > -delta:
            return REPRODUCED, p, ""
        if iv.hi < -delta:
            return NOT_REPRODUCED, p, f"worse by more than delta {delta:g}"
        return NOISE, p, ""
    # equivalence: two one-sided tests, each at level (1 + level) / 2, i.e. the two-sided interval inside (-d, d)
    p_lo = iv.p_value(-delta) if iv.diff > -delta else 1.0
    p_hi = iv.p_value(delta) if iv.diff < delta else 1.0
    p = max(p_lo, p_hi)
    if -delta < iv.lo and iv.hi < delta:
        return REPRODUCED, p, ""
    if iv.lo > delta or iv.hi < -delta:  # outside the band: the test at the edge it lies beyond
        return NOT_REPRODUCED, iv.p_value(delta if iv.lo > delta else -delta), f"differs by more than delta {delta:g}"
    return NOISE, p, ""


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (in the input order): sorted ascending, ``p_(i) * (m - i)``, made monotone,
    capped at 1. A claim whose adjusted p is below ``1 - level`` stays decided under a family-wise error rate of
    ``1 - level`` across the family."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out


def seeds_for_half_width(sd: float, delta: float, *, paired: bool, level: float = LEVEL, cap: int = 1000) -> int | None:
    """The seeds an interval of half-width ``delta`` needs (per side for Welch, equal sides), given the spread ``sd``
    (paired: of the per-seed differences; Welch: of one side's values, assumed equal on both): the smallest
    ``n >= 2`` with ``t(n) * sd * k / sqrt(n) <= delta`` (``k = 1`` paired, ``sqrt 2`` Welch). ``None`` when more
    than ``cap`` or when ``delta`` is 0."""
    if sd < 0 or not math.isfinite(sd):
        raise ValueError(f"sd={sd} must be finite and >= 0")
    if sd == 0:
        return 2
    if delta <= 0:
        return None
    k = 1.0 if paired else math.sqrt(2.0)
    for n in range(2, cap + 1):
        df = n - 1 if paired else 2 * n - 2
        if t_quantile(level, df) * sd * k / math.sqrt(n) <= delta:
            return n
    return None


def spread_for_plan(iv: Interval, a: Sequence[float] | None = None, b: Sequence[float] | None = None) -> float:
    """The spread that :func:`seeds_for_half_width` needs, read back from an interval: the sd of the differences
    (paired), or the larger of the two sides' sds (Welch; from ``a``, ``b`` when given)."""
    if iv.paired:
        return iv.se * math.sqrt(iv.n[0])
    if a is not None and b is not None and len(a) > 1 and len(b) > 1:
        return max(statistics.stdev(a), statistics.stdev(b))
    return iv.se * math.sqrt(min(iv.n) / 2)


# --- convergence ------------------------------------------------------------------------------------------------------


def _bests(series: list[list[tuple[float, float]]], sign: float) -> list[float]:
    """Per curve, the best value in the metric's direction, signed (``sign * value``)."""
    return [max(sign * y for _, y in s) for s in series]


@dataclass(frozen=True)
class Convergence:
    """Whether an entry converged (:func:`converged`), and why.

    Attributes:
        ok: converged on every seed.
        reading: one line with the numbers.
        gains: per seed, how much the best-so-far value improved over the last ``frac`` of training.
        tolerances: per seed, the tolerance it was held to.
        best_steps: per seed, the step of the best validation value (the weights a best-validation test scores).
    """

    ok: bool
    reading: str
    gains: tuple[float, ...] = ()
    tolerances: tuple[float, ...] = ()
    best_steps: tuple[float, ...] = ()


def _curve_points(curve: Sequence) -> list[tuple[float, float]]:
    pts = []
    for i, p in enumerate(curve):
        x, y = p if isinstance(p, tuple | list) else (i, p)
        if y is not None and math.isfinite(float(y)):
            pts.append((float(x), float(y)))
    return sorted(pts, key=lambda p: p[0])


def converged(
    curves: Sequence[Sequence],
    *,
    higher_is_better: bool,
    frac: float = 0.2,
    tol: float | None = None,
    rel: float = 0.01,
    scored_at_end: bool = False,
) -> Convergence:
    """The convergence rule on one entry's validation curves (one per seed, values or ``(step, value)`` pairs).

    ``scored_at_end``: the verdicts score the final weights (``evaluate: last``), so a run that got worse after its
    best by more than the tolerance is not converged there either (the weights scored are not the best ones).

    Per seed, the best-so-far curve (running max, or min for lower-is-better) is read at the start of the last
    ``frac`` of training and at its end; the seed converged when that gain is at most the tolerance: ``tol``
    (absolute) when given, else ``rel`` times the magnitude of the best value. The entry converged when every seed
    did. A curve that peaked and then got worse converged at its best (the best-so-far does not move); a curve still
    improving did not; the seed spread is never the tolerance.
    """
    if not 0 < frac < 1:
        raise ValueError(f"frac={frac} must lie in (0, 1)")
    series = [p for p in (_curve_points(c) for c in curves) if p]
    if not series:
        return Convergence(False, "no validation curve logged")
    if any(len(s) < 2 for s in series):
        return Convergence(False, "fewer than two validation points: cannot be judged")
    sign = 1.0 if higher_is_better else -1.0
    gains, tols, bests = [], [], []
    for s in series:
        x0, x1 = s[0][0], s[-1][0]
        cut = x1 - frac * (x1 - x0)
        best, best_at_cut, best_step = -math.inf, None, s[0][0]
        for x, y in s:
            if sign * y > best:
                best, best_step = sign * y, x
            if x <= cut + 1e-9:
                best_at_cut = best
        if best_at_cut is None:  # the window covers everything after the first point
            best_at_cut = sign * s[0][1]
        gains.append(best - best_at_cut)
        tols.append(float(tol) if tol is not None else rel * abs(best))
        bests.append(best_step)
    ok = all(g <= t for g, t in zip(gains, tols, strict=True))
    what = f"tolerance {tol:g}" if tol is not None else f"{rel:.0%} of the best value"
    if ok and scored_at_end:
        drops = [b - sign * s[-1][1] for b, s in zip(_bests(series, sign), series, strict=True)]
        bad = [i for i, (d, t) in enumerate(zip(drops, tols, strict=True)) if d > t]
        if bad:
            i = max(bad, key=lambda j: drops[j] - tols[j])
            return Convergence(
                False,
                f"got worse after its best: the final value is {drops[i]:.3g} below the best (> {tols[i]:.3g}, {what}) "
                f"on {len(bad)} of {len(series)} seed{'s' * (len(series) != 1)}, and the final weights are scored",
                tuple(gains),
                tuple(tols),
                tuple(bests),
            )
    worst = max(range(len(gains)), key=lambda i: gains[i] - tols[i])
    seeds = f"{len(series)} seed{'s' * (len(series) != 1)}"
    if ok:
        reading = (
            f"converged: the best-so-far value gained at most {max(gains):.3g} over the last {frac:.0%} of "
            f"training on {seeds} ({what}); best at step {', '.join(f'{b:g}' for b in bests)}"
        )
    else:
        n_bad = sum(g > t for g, t in zip(gains, tols, strict=True))
        reading = (
            f"still improving: the best-so-far value gained {gains[worst]:.3g} (> {tols[worst]:.3g}, {what}) "
            f"over the last {frac:.0%} of training on {n_bad} of {seeds}"
        )
    return Convergence(ok, reading, tuple(gains), tuple(tols), tuple(bests))
