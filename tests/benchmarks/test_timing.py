"""The shared timing helper of the benchmarks: the interval against a hand computation, the verdicts, and that the
rounds really interleave the arms."""

from __future__ import annotations

import argparse
import math

import pytest

from benchmarks._timing import (
    Interval,
    add_args,
    describe,
    goal_verdict,
    interleave,
    log_interval,
    overall_verdict,
    ratio_interval,
    round_order,
    rounds_of,
)

T_975_DF2 = 4.302652729749462  # Student-t 97.5% quantile, 2 degrees of freedom (tables: 4.303)
T_975_DF4 = 2.7764451051977934  # 4 degrees of freedom (tables: 2.776)


def test_interval_is_the_t_interval_on_the_log_ratios_back_transformed():
    # ratios 2, 4, 8: logs = ln2 * (1, 2, 3), mean 2 ln2, standard deviation ln2, n = 3
    iv = ratio_interval([2.0, 8.0, 24.0], [1.0, 2.0, 3.0])
    half = T_975_DF2 * math.log(2) / math.sqrt(3)
    assert iv.n == 3
    assert iv.estimate == pytest.approx(4.0, rel=1e-9)
    assert iv.low == pytest.approx(math.exp(2 * math.log(2) - half), rel=1e-9)
    assert iv.high == pytest.approx(math.exp(2 * math.log(2) + half), rel=1e-9)
    assert (round(iv.low, 4), round(iv.high, 4)) == (0.7149, 22.38)


def test_interval_over_five_rounds_by_hand():
    ratios = [1.0, 1.1, 1.2, 1.05, 0.95]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 5
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 4)
    iv = log_interval(ratios)
    assert iv.estimate == pytest.approx(math.exp(mean), rel=1e-9)
    assert iv.low == pytest.approx(math.exp(mean - T_975_DF4 * sd / math.sqrt(5)), rel=1e-9)
    assert iv.high == pytest.approx(math.exp(mean + T_975_DF4 * sd / math.sqrt(5)), rel=1e-9)


def test_interval_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match="at least 2 rounds"):
        log_interval([1.5])
    with pytest.raises(ValueError, match="finite and > 0"):
        log_interval([1.0, 0.0])
    with pytest.raises(ValueError, match="3 rounds, denominator 2"):
        ratio_interval([1.0, 2.0, 3.0], [1.0, 2.0])


@pytest.mark.parametrize(
    ("low", "high", "better", "verdict"),
    [
        (0.9, 1.05, "lower", "goal met"),
        (1.0, 1.1, "lower", "goal met"),  # the bound itself satisfies "<= 1.1"
        (1.0, 1.2, "lower", "goal not met (interval crosses 1.10x)"),
        (1.15, 1.3, "lower", "goal missed"),
        (1.2, 2.0, "higher", "goal met"),
        (1.0, 1.2, "higher", "goal not met (interval crosses 1.10x)"),
        (0.5, 1.05, "higher", "goal missed"),
    ],
)
def test_goal_is_met_only_when_the_interval_clears_it(low, high, better, verdict):
    assert goal_verdict(Interval(math.sqrt(low * high), low, high, 5), 1.1, better) == verdict


def test_describe_prints_the_interval_and_the_verdict():
    iv = Interval(1.234, 1.1, 1.38, 5)
    assert describe(iv) == "1.23x (95% CI 1.10x-1.38x, 5 rounds)"
    assert (
        describe(iv, goal=1.1)
        == "1.23x (95% CI 1.10x-1.38x, 5 rounds); goal <= 1.10x: goal not met (interval crosses 1.10x)"
    )
    share = Interval(0.31, 0.24, 0.401, 7)
    assert describe(share, "%", goal=0.5, better="higher") == (
        "31.0% (95% CI 24.0%-40.1%, 7 rounds); goal >= 50.0%: goal missed"
    )


def test_rounds_alternate_the_arms_and_rotate_who_goes_first():
    calls: list[str] = []
    arms = {name: (lambda name=name: calls.append(name) or len(calls)) for name in ("A", "B")}
    out = interleave(arms, 5)
    assert calls == ["A", "B", "B", "A", "A", "B", "B", "A", "A", "B"]
    # each arm's results are one per round, in round order: its call's position in the log
    assert out == {"A": [1, 4, 5, 8, 9], "B": [2, 3, 6, 7, 10]}


def test_every_round_runs_every_arm_once_never_all_of_one_first():
    calls: list[str] = []
    names = ["fast", "naive", "ref"]
    interleave({n: (lambda n=n: calls.append(n)) for n in names}, 6, warmup=True)
    assert calls[:3] == names  # the warm-up
    rounds = [calls[3 + 3 * r : 6 + 3 * r] for r in range(6)]
    assert all(sorted(r) == sorted(names) for r in rounds)
    assert [r[0] for r in rounds] == ["fast", "naive", "ref", "fast", "naive", "ref"]
    assert round_order(names, 1) == ["naive", "ref", "fast"]


def test_quick_takes_few_rounds_and_one_round_is_refused(capsys):
    parser = argparse.ArgumentParser(prog="bench")
    add_args(parser)
    assert rounds_of(parser, parser.parse_args([])) == 5
    assert rounds_of(parser, parser.parse_args(["--quick"])) == 3
    with pytest.raises(SystemExit):
        rounds_of(parser, parser.parse_args(["--rounds", "1"]))
    assert "--rounds 1: an interval needs at least 2 rounds" in capsys.readouterr().err


def test_a_goal_for_every_case_is_met_only_when_met_in_each():
    crosses = "goal not met (interval crosses 1.15x)"
    assert overall_verdict(["goal met", "goal met"]) == "goal met"
    assert overall_verdict(["goal met", crosses]) == crosses
    assert overall_verdict([crosses, "goal missed", "goal met"]) == "goal missed"


def test_shares_and_large_ratios_keep_their_digits():
    assert describe(Interval(0.105, 0.0004, 113.5, 3), "%") == "10.5% (95% CI 0.04%-11,350%, 3 rounds)"
    assert describe(Interval(948.2, 32.8, 27447.0, 3)) == "948x (95% CI 32.8x-27,447x, 3 rounds)"
