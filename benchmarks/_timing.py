"""What every benchmark shares: interleaved rounds, ratios with a 95% interval over the rounds, goal verdicts.

A benchmark times its arms (A = the fast path, B = its twin, ...) in rounds, each round running every arm once
(:func:`interleave`; the order rotates, A B, B A, A B, ...), so a slow spell of a shared machine hits every arm of
that round alike. Each round gives one ratio A/B; the ratio reported is their geometric mean with a 95% Student-t
interval on the per-round log-ratios (``n - 1`` degrees of freedom), back-transformed (:func:`ratio_interval`).
A goal is called met only when the whole interval clears it (:func:`goal_verdict`).

Every benchmark takes ``--rounds`` (default at least :data:`MIN_ROUNDS`) and ``--quick`` (few rounds, tiny sizes: a
smoke run that shows the output, not a measurement) through :func:`add_args`.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from suite.stats import t_quantile  # noqa: E402

LEVEL = 0.95
MIN_ROUNDS = 5
QUICK_ROUNDS = 3
T = TypeVar("T")


@dataclass(frozen=True)
class Interval:
    """A positive quantity (a ratio, a rate) estimated over ``n`` rounds: geometric mean and its interval."""

    estimate: float
    low: float
    high: float
    n: int
    level: float = LEVEL


def log_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """Geometric mean of positive ``values`` and its Student-t interval, computed on ``log(values)`` and mapped back.

    Args:
        values: one positive value per round (at least two).
        level: two-sided confidence level.

    Raises:
        ValueError: fewer than two values, or a value that is not finite and positive.
    """
    vals = [float(v) for v in values]
    if len(vals) < 2:
        raise ValueError(f"an interval needs at least 2 rounds, got {len(vals)}")
    if not all(math.isfinite(v) and v > 0 for v in vals):
        raise ValueError(f"every value must be finite and > 0, got {vals}")
    logs = [math.log(v) for v in vals]
    mean = statistics.fmean(logs)
    half = t_quantile(level, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(vals), level)


def ratio_interval(num: Sequence[float], den: Sequence[float], level: float = LEVEL) -> Interval:
    """The per-round ratio ``num[r] / den[r]`` with its interval over the rounds (:func:`log_interval`)."""
    if len(num) != len(den):
        raise ValueError(f"numerator has {len(num)} rounds, denominator {len(den)}")
    return log_interval([a / b for a, b in zip(num, den)], level)


def goal_verdict(iv: Interval, goal: float, better: Literal["lower", "higher"], unit: str = "x") -> str:
    """``goal met`` when the whole interval is on the good side of ``goal``, ``goal missed`` when it is wholly on the
    bad side, ``goal not met (interval crosses <goal>)`` otherwise."""
    if better not in ("lower", "higher"):
        raise ValueError(f"better={better!r} must be 'lower' or 'higher'")
    good, bad = (iv.high <= goal, iv.low > goal) if better == "lower" else (iv.low >= goal, iv.high < goal)
    if good:
        return "goal met"
    if bad:
        return "goal missed"
    return f"goal not met (interval crosses {fmt(goal, unit)})"


def overall_verdict(verdicts: Sequence[str]) -> str:
    """One verdict for a goal that must hold in every case: met when met in all, missed when missed in any, else the
    first ``not met``."""
    if not verdicts:
        raise ValueError("no verdicts to combine")
    if all(v == "goal met" for v in verdicts):
        return "goal met"
    if "goal missed" in verdicts:
        return "goal missed"
    return next(v for v in verdicts if v != "goal met")


def fmt(value: float, unit: str = "x") -> str:
    """A ratio (``unit="x"``), a share (``"%"``, value as a fraction) or a plain number, to about 3 digits."""
    if unit == "%":
        pct = 100 * value
        return f"{pct:,.0f}%" if abs(pct) >= 1000 else f"{pct:.1f}%" if abs(pct) >= 1 else f"{pct:.3g}%"
    a = abs(value)
    text = f"{value:,.0f}" if a >= 100 else f"{value:.1f}" if a >= 10 else f"{value:.2f}" if a >= 1 else f"{value:#.3g}"
    return text + unit


def describe(
    iv: Interval, unit: str = "x", goal: float | None = None, better: Literal["lower", "higher"] = "lower"
) -> str:
    """``1.23x (95% CI 1.10x-1.38x, 5 rounds)``, followed by ``; goal <= 1.1x: <verdict>`` when there is a goal."""
    bound = unit if unit in ("x", "%") else ""  # a long unit ("queries/s") is written once, after the estimate
    text = f"{fmt(iv.estimate, unit)} ({iv.level:.0%} CI {fmt(iv.low, bound)}-{fmt(iv.high, bound)}, {iv.n} rounds)"
    if goal is not None:
        text += (
            f"; goal {'<=' if better == 'lower' else '>='} {fmt(goal, unit)}: {goal_verdict(iv, goal, better, unit)}"
        )
    return text


def round_order(names: Sequence[str], r: int) -> list[str]:
    """The order of round ``r``: every arm once, rotated by ``r`` (A B, B A, A B, ... for two arms)."""
    k = r % len(names)
    return [*names[k:], *names[:k]]


def interleave(arms: Mapping[str, Callable[[], T]], rounds: int, warmup: bool = False) -> dict[str, list[T]]:
    """Call every arm once per round for ``rounds`` rounds (order: :func:`round_order`); ``warmup`` first calls each
    arm once, untimed and discarded. Returns each arm's results, one per round, in round order."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds} must be >= 1")
    if not arms:
        raise ValueError("no arms to interleave")
    names = list(arms)
    if warmup:
        for name in names:
            arms[name]()
    out: dict[str, list[T]] = {name: [] for name in names}
    for r in range(rounds):
        for name in round_order(names, r):
            out[name].append(arms[name]())
    return out


def seconds(fn: Callable[[], object], inner: int = 1) -> float:
    """Wall seconds per call of ``fn``, timed over ``inner`` back-to-back calls (for calls too short to time alone)."""
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def calibrate(fn: Callable[[], object], min_seconds: float = 0.05) -> int:
    """How many back-to-back calls of ``fn`` last at least ``min_seconds`` (judged from one call): the ``inner`` of
    :func:`seconds` for an arm too short to time once per round."""
    once = seconds(fn)
    return max(1, math.ceil(min_seconds / once)) if once > 0 else 1000


def add_args(parser: argparse.ArgumentParser, rounds: int = MIN_ROUNDS) -> None:
    """Add ``--rounds`` and ``--quick`` to a benchmark's parser."""
    parser.add_argument("--rounds", type=int, default=rounds, help=f"interleaved rounds (default {rounds}, >= 2)")
    parser.add_argument(
        "--quick", action="store_true", help=f"smoke run: {QUICK_ROUNDS} rounds, tiny sizes (shows the output only)"
    )


def rounds_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The rounds to run: ``--rounds`` (``QUICK_ROUNDS`` under ``--quick``); fewer than 2 is a one-line error."""
    rounds = QUICK_ROUNDS if args.quick else args.rounds
    if rounds < 2:
        parser.error(f"--rounds {rounds}: an interval needs at least 2 rounds ({MIN_ROUNDS}+ for a figure to quote)")
    return rounds


def header(rounds: int) -> str:
    """The line that says how the ratios below were measured."""
    note = "" if rounds >= MIN_ROUNDS else f"; fewer than {MIN_ROUNDS} rounds: not a figure to quote"
    return (
        f"{rounds} interleaved rounds; each ratio is the geometric mean of its per-round ratios with a {LEVEL:.0%} "
        f"Student-t interval over the rounds{note}"
    )
