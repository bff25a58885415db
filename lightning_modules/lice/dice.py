"""A DiCE-style model-agnostic counterfactual search (the paper's DiCE baseline, suite implementation).

DiCE's "random" method (Mothilal et al., 2020; ``dice-ml``) as used for top-1 counterfactuals: sample candidates
by changing a random subset of the *mutable* features to random allowed values (respecting immutability and
monotonicity, integer grids and categories), keep those the classifier assigns to the desired class, return the one
closest in the inverse-MAD distance, then apply DiCE's post-hoc sparsity enhancement (revert each changed feature
to the factual value, or move a continuous one as far back as a bisection allows, while the prediction stays
valid). It knows nothing about the data density: that is the point of the comparison. ``dice-ml`` itself is not a
dependency (its current release pins old pandas/numpy and needs the model in its own wrappers); this search uses
the same sampling and sparsity steps on the suite's feature specs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from core.errors import ConfigError
from lightning_modules.lice.mio import CounterfactualResult, distance


class DiceRandomSearch:
    """Random-sampling counterfactual search with post-hoc sparsity enhancement.

    Args:
        features: Feature specs.
        predict_logit: Maps table rows ``[N, F]`` to classifier logits ``[N]``.
        costs: ``[F]`` distance weights (the same as the MIO's).
        n_samples: Candidates sampled per factual.
        margin: A candidate is valid when ``sign * logit >= margin``.
        seed: Seed of the sampler.
    """

    def __init__(
        self,
        features: Sequence[Any],
        predict_logit: Callable[[np.ndarray], np.ndarray],
        costs: np.ndarray,
        n_samples: int = 2000,
        margin: float = 1e-4,
        seed: int = 0,
    ) -> None:
        if n_samples < 1:
            raise ConfigError(f"model.dice_samples={n_samples} must be >= 1")
        self.features, self.predict_logit, self.costs = list(features), predict_logit, np.asarray(costs)
        self.n_samples, self.margin = n_samples, margin
        self.rng = np.random.default_rng(seed)

    def _allowed_range(self, f: Any, v: float) -> tuple[float, float]:
        lo = v if f.monotone == "increasing" else 0.0
        hi = v if f.monotone == "decreasing" else 1.0
        return lo, hi

    def _sample_value(self, f: Any, v: float, n: int) -> np.ndarray:
        lo, hi = self._allowed_range(f, v)
        if f.kind == "continuous":
            vals = self.rng.uniform(lo, hi, size=n)
            if f.discrete and f.step < 1.0:
                vals = np.clip(np.round(vals / f.step) * f.step, lo, hi)
            return vals
        if f.kind == "binary":
            return self.rng.integers(round(lo), round(hi) + 1, size=n).astype(np.float64)
        c0 = round(v)
        allowed = [
            i
            for i in range(f.n_categories)
            if not (f.monotone == "increasing" and i < c0) and not (f.monotone == "decreasing" and i > c0)
        ]
        return self.rng.choice(allowed, size=n).astype(np.float64)

    def _valid(self, rows: np.ndarray, desired: int) -> np.ndarray:
        sign = 1.0 if desired == 1 else -1.0
        return sign * self.predict_logit(rows) >= self.margin

    def generate(self, x0: np.ndarray, desired: int) -> CounterfactualResult:
        """Top-1 counterfactual for factual ``x0`` ``[F]`` toward ``desired``; ``not_found`` if no sample is valid."""
        start = time.perf_counter()
        x0 = np.asarray(x0, np.float64)
        mutable = [j for j, f in enumerate(self.features) if not f.immutable]
        if not mutable:
            return CounterfactualResult("not_found", seconds=time.perf_counter() - start)
        cand = np.repeat(x0[None], self.n_samples, axis=0)
        n_change = self.rng.integers(1, len(mutable) + 1, size=self.n_samples)
        for i in range(self.n_samples):
            for j in self.rng.choice(mutable, size=n_change[i], replace=False):
                cand[i, j] = self._sample_value(self.features[j], x0[j], 1)[0]
        ok = self._valid(cand, desired)
        if not ok.any():
            return CounterfactualResult("not_found", seconds=time.perf_counter() - start)
        cand = cand[ok]
        dists = np.array([distance(x0, c, self.features, self.costs) for c in cand])
        best = self.sparsify(x0, cand[int(np.argmin(dists))], desired)
        dist = distance(x0, best, self.features, self.costs)
        return CounterfactualResult("found", best, dist, None, time.perf_counter() - start)

    def sparsify(self, x0: np.ndarray, x: np.ndarray, desired: int, steps: int = 10) -> np.ndarray:
        """DiCE's post-hoc sparsity enhancement: walk each changed feature back toward ``x0`` while valid."""
        x = x.copy()
        order = np.argsort([-self.costs[j] * abs(x[j] - x0[j]) for j in range(len(x))])
        for j in order:
            if x[j] == x0[j]:
                continue
            trial = x.copy()
            trial[j] = x0[j]
            if self._valid(trial[None], desired)[0]:
                x = trial
                continue
            f = self.features[j]
            if f.kind != "continuous":
                continue
            lo, hi = 0.0, 1.0  # fraction of the change kept; 1 is valid, 0 is not
            for _ in range(steps):
                mid = 0.5 * (lo + hi)
                trial[j] = x0[j] + mid * (x[j] - x0[j])
                if f.discrete and f.step < 1.0:
                    trial[j] = np.round(trial[j] / f.step) * f.step
                if self._valid(trial[None], desired)[0]:
                    hi = mid
                else:
                    lo = mid
            trial[j] = x0[j] + hi * (x[j] - x0[j])
            if f.discrete and f.step < 1.0:
                trial[j] = np.round(trial[j] / f.step) * f.step
            if self._valid(trial[None], desired)[0]:
                x = trial
        return x
