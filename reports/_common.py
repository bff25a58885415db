"""Helpers shared by the results-page hooks under ``reports/`` (per-seed values of an entry's metric)."""

from __future__ import annotations

import statistics

from suite.compare import RunRecord


def seed_values(records: list[RunRecord], name: str, key: str) -> list[tuple[int | None, float]]:
    """``(seed, value)`` of ``key`` for every run of entry ``name``, sorted by seed."""
    return sorted((r.seed, r.metrics[key]) for r in records if r.name == name and key in r.metrics)


def seed_mean(vals: list[tuple[int | None, float]]) -> float:
    return statistics.fmean(v for _, v in vals) if vals else float("nan")


def seed_std(vals: list[tuple[int | None, float]]) -> float:
    return statistics.stdev(v for _, v in vals) if len(vals) > 1 else 0.0
