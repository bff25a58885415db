"""The verdict statistics (suite.stats) against scipy.stats on hand-made samples, and the convergence rule on the
curves that simpler rules misread (two standard errors; a signed gain)."""

from __future__ import annotations

import math

import pytest
from scipy import stats as ss

from suite import stats

A = [0.812, 0.797, 0.845, 0.801, 0.829]
B = [0.790, 0.781, 0.820, 0.799, 0.806]  # shares each seed's draw with A: the pairing removes it
C = [0.70, 0.74, 0.69]


def test_paired_interval_matches_scipy_ttest_rel():
    iv = stats.paired_interval(A, B)
    ref = ss.ttest_rel(A, B)
    ci = ref.confidence_interval(0.95)
    assert iv.paired and iv.df == len(A) - 1 and iv.n == (5, 5)
    assert iv.diff == pytest.approx(sum(a - b for a, b in zip(A, B, strict=True)) / 5, rel=1e-12)
    assert (iv.lo, iv.hi) == pytest.approx((ci.low, ci.high), rel=1e-10)
    assert iv.p_value() == pytest.approx(ref.pvalue, rel=1e-10)


def test_welch_interval_matches_scipy_ttest_ind():
    iv = stats.welch_interval(A, C)
    ref = ss.ttest_ind(A, C, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert not iv.paired and iv.n == (5, 3)
    assert iv.df == pytest.approx(ref.df, rel=1e-10)
    assert (iv.lo, iv.hi) == pytest.approx((ci.low, ci.high), rel=1e-10)
    assert iv.p_value() == pytest.approx(ref.pvalue, rel=1e-10)


def test_pairing_matters_and_the_mapping_pairs_by_seed():
    # Welch on the same data cannot see that every seed moved together: its interval is wider and covers 0
    paired = stats.interval(dict(enumerate(A)), dict(enumerate(B)), paired=True)
    welch = stats.interval(A, B, paired=False)
    assert paired.lo > 0 and welch.lo < 0
    assert stats.decide(paired)[0] == stats.REPRODUCED
    assert stats.decide(welch)[0] == stats.NOISE
    # a shuffled mapping pairs by key, not by position
    shuffled = {s: B[s] for s in (4, 2, 0, 3, 1)}
    again = stats.interval(dict(enumerate(A)), shuffled, paired=True)
    assert again.lo == pytest.approx(paired.lo) and again.hi == pytest.approx(paired.hi)
    # lower is better: the sign flips the difference and the interval
    flipped = stats.interval(dict(enumerate(A)), dict(enumerate(B)), paired=True, sign=-1.0)
    assert flipped.diff == pytest.approx(-paired.diff) and flipped.hi == pytest.approx(-paired.lo)


def test_two_standard_errors_is_not_a_95_interval():
    # three seeds a side: 2 s.e. is about an 82% interval; this difference clears 2 s.e. but not the t interval
    a, b = [1.0, 1.2, 1.4], [0.7, 0.8, 0.95]
    iv = stats.welch_interval(a, b)
    assert iv.diff > 2 * iv.se  # two standard errors would call it decided
    assert stats.decide(iv)[0] == stats.NOISE
    assert ss.ttest_ind(a, b, equal_var=False).pvalue > 0.05


@pytest.mark.parametrize(
    ("lo", "hi", "delta", "kind", "verdict"),
    [
        (0.1, 0.5, 0.0, "superiority", stats.REPRODUCED),
        (0.1, 0.5, 1.0, "superiority", stats.REPRODUCED),  # real but smaller than delta: still reproduced, qualified
        (-0.5, -0.1, 0.0, "superiority", stats.NOT_REPRODUCED),
        (-0.2, 0.3, 0.5, "superiority", stats.NOT_REPRODUCED),  # no effect as large as delta
        (-0.2, 0.6, 0.5, "superiority", stats.NOISE),
        (-0.2, 0.3, 0.0, "superiority", stats.NOISE),
        (-0.2, 0.3, 0.5, "non_inferior", stats.REPRODUCED),
        (-0.9, -0.6, 0.5, "non_inferior", stats.NOT_REPRODUCED),
        (-0.7, 0.1, 0.5, "non_inferior", stats.NOISE),
        (-0.2, 0.3, 0.5, "equivalent", stats.REPRODUCED),
        (0.6, 0.9, 0.5, "equivalent", stats.NOT_REPRODUCED),
        (0.2, 0.9, 0.5, "equivalent", stats.NOISE),
    ],
)
def test_decide(lo, hi, delta, kind, verdict):
    mid = (lo + hi) / 2
    iv = stats.Interval(mid, lo, hi, (hi - lo) / 2 / 2.776, 4.0, (5, 5), True)
    got, p, why = stats.decide(iv, kind=kind, delta=delta)
    assert got == verdict
    if verdict == stats.REPRODUCED:  # the p-value agrees with the interval's decision
        assert p < 0.05
    if kind == "superiority" and verdict == stats.REPRODUCED and delta:
        assert "smaller than delta" in why
    if "as large as delta" in why:  # decided against the effect of interest: its own test, at delta
        assert p < 0.05 and p == pytest.approx(iv.p_value(delta))


def test_decide_p_matches_the_interval_at_the_boundary():
    # a non-inferiority interval whose lower end sits just above -delta: p just below 0.05
    iv = stats.welch_interval(A, B)
    assert iv.lo < 0
    delta = -iv.lo + 1e-9
    verdict, p, _ = stats.decide(iv, kind="non_inferior", delta=delta)
    assert verdict == stats.REPRODUCED and p == pytest.approx(0.05, abs=1e-6)
    verdict, p, _ = stats.decide(iv, kind="non_inferior", delta=-iv.lo - 1e-6)
    assert verdict == stats.NOISE and p > 0.05


def test_holm_matches_the_step_down_rule():
    p = [0.01, 0.04, 0.03, 0.2]
    assert stats.holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert stats.holm([0.5]) == [0.5]
    assert stats.holm([]) == []


def test_seeds_for_half_width():
    sd, delta = 0.02, 0.01
    n = stats.seeds_for_half_width(sd, delta, paired=True)
    assert ss.t.ppf(0.975, n - 1) * sd / math.sqrt(n) <= delta < ss.t.ppf(0.975, n - 2) * sd / math.sqrt(n - 1)
    welch = stats.seeds_for_half_width(sd, delta, paired=False)
    assert welch > n  # per side, and the Welch difference carries both sides' noise
    assert stats.seeds_for_half_width(0.0, 0.01, paired=True) == 2
    assert stats.seeds_for_half_width(1.0, 0.0, paired=True) is None


def test_too_few_values_raise():
    with pytest.raises(ValueError, match="at least 2"):
        stats.paired_interval([1.0], [0.5])
    with pytest.raises(ValueError, match="at least 2"):
        stats.welch_interval([1.0, 2.0], [0.5])
    with pytest.raises(ValueError, match="non-finite"):
        stats.welch_interval([1.0, float("nan")], [0.5, 0.7])


# --- convergence: the curves a signed-gain rule misreads -------------------------------------------------------------


def _steps(ys):
    return [(100 * i, y) for i, y in enumerate(ys)]


def test_a_loss_that_rose_after_its_best_converged_at_its_best():
    loss = _steps([3.0, 2.0, 1.5, 1.2, 1.1, 1.0, 1.05, 1.2, 1.5, 1.8])
    c = stats.converged([loss], higher_is_better=False)
    assert c.ok and c.best_steps == (500.0,)


def test_a_curve_still_improving_is_underfit():
    acc = _steps([0.2, 0.3, 0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8])
    c = stats.converged([acc], higher_is_better=True)
    assert not c.ok and "still improving" in c.reading
    # one seed still improving is enough to call the entry underfit
    flat = _steps([0.2, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8])
    assert not stats.converged([flat, acc], higher_is_better=True).ok


def test_a_noisy_flat_curve_converged():
    noise = [0.003, -0.004, 0.002, -0.001, 0.004, -0.003, 0.001, -0.002, 0.0, 0.003]
    acc = _steps([0.4] + [0.8 + e for e in noise])
    assert stats.converged([acc], higher_is_better=True).ok


def test_a_ceiling_converged_and_the_tolerance_is_declared():
    acc = _steps([0.5, 0.9, 0.97, 0.99, 0.993, 0.994, 0.995, 0.995, 0.996, 0.997])
    assert stats.converged([acc], higher_is_better=True).ok  # 0.002 < 1% of 0.997
    assert not stats.converged([acc], higher_is_better=True, tol=0.001).ok  # a declared absolute tolerance


def test_convergence_is_not_the_seed_spread():
    # two seeds far apart (a spread of 0.2) both still rising by 0.1: underfit whatever the spread
    a = _steps([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    b = _steps([y - 0.3 for _, y in a])
    assert not stats.converged([a, b], higher_is_better=True).ok


def test_a_new_best_in_the_window_is_still_improving_even_if_the_end_fell_back():
    # the signed end-to-end gain over the window is 0 (0.6 -> 0.6); the best-so-far gained 0.2 there: not converged
    acc = _steps([0.2, 0.4, 0.5, 0.55, 0.58, 0.6, 0.6, 0.6, 0.6, 0.8, 0.6])
    c = stats.converged([acc], higher_is_better=True)
    assert not c.ok and c.gains == pytest.approx((0.2,)) and c.best_steps == (900.0,)


def test_welch_from_summary_matches_scipy():
    iv = stats.welch_from_summary(0.9921, 0.0044, 3, 0.7354, 0.21, 3)
    ref = ss.ttest_ind_from_stats(0.9921, 0.0044, 3, 0.7354, 0.21, 3, equal_var=False)
    assert iv.p_value() == pytest.approx(ref.pvalue, rel=1e-9)
    full = stats.welch_interval(A, C)
    again = stats.welch_from_summary(sum(A) / 5, ss.tstd(A), 5, sum(C) / 3, ss.tstd(C), 3)
    assert (again.lo, again.hi) == pytest.approx((full.lo, full.hi), rel=1e-9)


def test_final_weights_scored_after_the_best_are_not_converged():
    # evaluate: last scores the final weights: a loss that rose past its best by more than the tolerance fails
    loss = _steps([3.0, 2.0, 1.5, 1.2, 1.1, 1.0, 1.05, 1.2, 1.5, 1.8])
    c = stats.converged([loss], higher_is_better=False, scored_at_end=True)
    assert not c.ok and c.reading.startswith("got worse after its best: the final value is 0.8 below the best")
    flat = _steps([3.0, 2.0, 1.5, 1.2, 1.1, 1.0, 1.0, 1.0, 1.005, 1.004])
    assert stats.converged([flat], higher_is_better=False, scored_at_end=True).ok


def test_every_decided_verdict_has_a_p_below_alpha():
    # a decided verdict (either word) always carries the p of the test that decided it, so Holm can keep it
    for lo, hi, kind, delta in [
        (-0.9, -0.6, "non_inferior", 0.5),
        (0.6, 0.9, "equivalent", 0.5),
        (-0.9, -0.6, "equivalent", 0.5),
        (-0.5, -0.1, "superiority", 0.0),
        (-0.2, 0.3, "superiority", 0.5),
        (0.1, 0.5, "superiority", 0.0),
    ]:
        iv = stats.Interval((lo + hi) / 2, lo, hi, (hi - lo) / 2 / 2.776, 4.0, (5, 5), True)
        verdict, p, _ = stats.decide(iv, kind=kind, delta=delta)
        assert verdict in (stats.REPRODUCED, stats.NOT_REPRODUCED) and p < 0.05, (lo, hi, kind)
    # equal values up to rounding have no spread
    assert stats.paired_interval([0.3 + 1e-16, 0.3, 0.3], [0.1, 0.1, 0.1]).se == 0.0
