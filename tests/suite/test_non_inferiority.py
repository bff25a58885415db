"""`suite.report.non_inferior`: the verdict of "keeps" / "matches" claims, on synthetic values."""

from __future__ import annotations

import pytest

from suite.report import NOISE, NOT_REPRODUCED, REPRODUCED, UNDERFIT, non_inferior


@pytest.mark.parametrize("hib", [True, False])
def test_non_inferiority_bounds(hib):
    sign = 1.0 if hib else -1.0
    ref = [10.0, 10.2, 9.8]  # mean 10, sd 0.2

    def v(values):
        return non_inferior([sign * x for x in values], [sign * x for x in ref], margin=1.0, higher_is_better=hib)

    assert v([9.6, 9.5, 9.4]) == REPRODUCED  # 0.5 worse, well inside the 1.0 margin
    assert v([11.0, 11.2, 10.8]) == REPRODUCED  # better
    assert v([8.0, 8.2, 7.8]) == NOT_REPRODUCED  # 2.0 worse, beyond the margin with confidence
    assert v([7.0, 12.0, 10.0]) == NOISE  # mean 9.67, but the spread puts the lower bound past -1.0
    assert v([9.3, 8.7, 9.0]) == NOISE  # 1.0 worse on average: neither bound clears the margin


def test_non_inferiority_edge_cases():
    assert non_inferior([1.0], [1.0], margin=0.1, higher_is_better=True, converged=False) == UNDERFIT
    assert non_inferior([0.95], [1.0], margin=0.1, higher_is_better=True) == REPRODUCED  # one seed each: d itself
    assert non_inferior([0.85], [1.0], margin=0.1, higher_is_better=True) == NOT_REPRODUCED
    with pytest.raises(ValueError, match="margin"):
        non_inferior([1.0], [1.0], margin=-0.1, higher_is_better=True)
