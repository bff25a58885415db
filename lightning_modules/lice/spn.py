"""A LearnSPN-style sum-product network over mixed tabular data (LiCE's plausibility model).

The SPN models ``p(x, y)`` over the table form of :mod:`datamodules.tabular` (continuous features in ``[0, 1]``,
binary in ``{0, 1}``, categorical as codes) plus the label. Structure learning follows LearnSPN (Gens & Domingos,
2013), the algorithm behind SPFlow's ``learn_mspn`` that the LiCE code uses:

* **product node** when the variables of the current scope split into groups that are pairwise independent
  (G-test on the discretised variables, connected components of the dependency graph);
* otherwise a **sum node** over a 2-means clustering of the rows (weights = cluster fractions);
* a **leaf** for a single variable, or a fully factorised product when a slice has fewer than
  ``min_instances_slice`` rows or the depth limit is reached.

Leaves: histogram (continuous, equal-width bins on ``[0, 1]``, Laplace-smoothed *as a density*: the smoothed bin
masses are divided by the bin widths, unlike SPFlow, see the notes), categorical and binary (Laplace-smoothed).

Two evaluations (both in the log domain):

* :meth:`SPN.log_likelihood`: exact, a sum node is ``logsumexp_c(log w_c + l_c)``;
* :meth:`SPN.max_approx`: a sum node is ``max_c(log w_c + l_c)`` (LiCE's MIO encodes this lower bound).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.special import logsumexp
from scipy.stats import chi2

from core.errors import ConfigError

LEAF_KINDS = ("continuous", "binary", "categorical")


@dataclass
class Node:
    """Base SPN node; ``scope`` lists the variable (column) indices it covers."""

    scope: list[int]
    id: int = -1


@dataclass
class HistogramLeaf(Node):
    """Piecewise-constant density on ``[0, 1]``: ``p(x) = densities[i]`` for ``breaks[i] <= x < breaks[i+1]``.

    The last bin is closed (``x = 1`` falls into it). ``breaks`` ``[B + 1]`` with ``breaks[0] = 0``,
    ``breaks[-1] = 1``; ``densities`` ``[B]`` integrate to 1.
    """

    breaks: np.ndarray = field(default_factory=lambda: np.array([0.0, 1.0]))
    densities: np.ndarray = field(default_factory=lambda: np.array([1.0]))


@dataclass
class CategoricalLeaf(Node):
    """``p(x = k) = probs[k]`` for codes ``k = 0..K-1`` (binary features are the case ``K = 2``)."""

    probs: np.ndarray = field(default_factory=lambda: np.array([0.5, 0.5]))


@dataclass
class ProductNode(Node):
    """``log p = sum_c log p_c`` over children with disjoint scopes."""

    children: list[Node] = field(default_factory=list)


@dataclass
class SumNode(Node):
    """``p = sum_c w_c p_c`` over children with the same scope; ``weights`` sum to 1."""

    children: list[Node] = field(default_factory=list)
    weights: np.ndarray = field(default_factory=lambda: np.array([1.0]))


BREAK_TOL = 1e-9


def histogram_bin(breaks: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Bin index of each ``x`` (right-open bins, the last closed; values outside ``[b_0, b_B]`` are clipped).

    A value within ``BREAK_TOL`` below a break counts as on the break: normalised integer data such as
    ``(50 - 1) / 98`` land one ulp below ``0.5``, and the MIO (whose bins hold ``b_i <= x`` up to the solver's
    feasibility tolerance) must agree with this evaluation.
    """
    idx = np.searchsorted(breaks, np.asarray(x, np.float64) + BREAK_TOL, side="right") - 1
    return np.clip(idx, 0, len(breaks) - 2)


def histogram_leaf_logdensity(breaks: np.ndarray, densities: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``log rho_i`` of the bin that holds each ``x`` (the histogram leaf's output).

    Args:
        breaks: ``[B + 1]`` increasing break points.
        densities: ``[B]`` bin densities.
        x: ``[N]`` values.

    Returns:
        ``[N]`` log-densities.
    """
    return np.log(densities[histogram_bin(breaks, np.asarray(x, np.float64))])


class SPN:
    """A sum-product network with ordered node ids (children before parents).

    Args:
        root: The root node.
        kinds: Per variable ``continuous`` | ``binary`` | ``categorical``.
        n_categories: Per variable the number of categories (ignored for continuous).
    """

    def __init__(self, root: Node, kinds: Sequence[str], n_categories: Sequence[int]) -> None:
        self.root, self.kinds, self.n_categories = root, list(kinds), list(n_categories)
        self.nodes: list[Node] = []
        self._number(root)

    def _number(self, node: Node) -> None:
        for child in getattr(node, "children", []):
            self._number(child)
        node.id = len(self.nodes)
        self.nodes.append(node)

    def leaf_values(self, leaf: Node, data: np.ndarray) -> np.ndarray:
        """``[N]`` log-density of one leaf at the rows of ``data`` ``[N, V]``."""
        x = data[:, leaf.scope[0]]
        if isinstance(leaf, HistogramLeaf):
            return histogram_leaf_logdensity(leaf.breaks, leaf.densities, x)
        if isinstance(leaf, CategoricalLeaf):
            return np.log(leaf.probs[np.clip(np.rint(x).astype(np.int64), 0, len(leaf.probs) - 1)])
        raise TypeError(f"unknown leaf {type(leaf).__name__}")

    def _evaluate(self, data: np.ndarray, exact: bool) -> np.ndarray:
        data = np.atleast_2d(np.asarray(data, np.float64))
        values: list[np.ndarray] = []
        for node in self.nodes:  # children come first
            if isinstance(node, ProductNode):
                values.append(np.sum([values[c.id] for c in node.children], axis=0))
            elif isinstance(node, SumNode):
                terms = np.stack([values[c.id] + np.log(w) for c, w in zip(node.children, node.weights)])
                values.append(logsumexp(terms, axis=0) if exact else terms.max(axis=0))
            else:
                values.append(self.leaf_values(node, data))
        return np.stack(values)

    def log_likelihood(self, data: np.ndarray) -> np.ndarray:
        """Exact ``log p(x)`` ``[N]`` of rows ``[N, V]`` (sum nodes: logsumexp)."""
        return self._evaluate(data, exact=True)[self.root.id]

    def max_approx(self, data: np.ndarray) -> np.ndarray:
        """Max-approximation ``[N]``: every sum node is ``max_c(log w_c + l_c)`` (a lower bound on the exact LL)."""
        return self._evaluate(data, exact=False)[self.root.id]

    def node_values(self, data: np.ndarray, exact: bool = False) -> np.ndarray:
        """``[n_nodes, N]`` value of every node (indexed by node id)."""
        return self._evaluate(data, exact)

    def node_bounds(self) -> list[tuple[float, float]]:
        """Interval ``[lower, upper]`` of every node's max-approximated log value over the whole domain."""
        bounds: list[tuple[float, float]] = []
        for node in self.nodes:
            if isinstance(node, HistogramLeaf):
                logs = np.log(node.densities)
                bounds.append((float(logs.min()), float(logs.max())))
            elif isinstance(node, CategoricalLeaf):
                logs = np.log(node.probs)
                bounds.append((float(logs.min()), float(logs.max())))
            elif isinstance(node, ProductNode):
                bounds.append(
                    (sum(bounds[c.id][0] for c in node.children), sum(bounds[c.id][1] for c in node.children))
                )
            else:
                assert isinstance(node, SumNode)
                lo = max(bounds[c.id][0] + np.log(w) for c, w in zip(node.children, node.weights))
                hi = max(bounds[c.id][1] + np.log(w) for c, w in zip(node.children, node.weights))
                bounds.append((float(lo), float(hi)))
        return bounds

    def __len__(self) -> int:
        return len(self.nodes)


# ---------------------------------------------------------------------------------------------------------------
# Structure learning
# ---------------------------------------------------------------------------------------------------------------
def _discretise(col: np.ndarray, kind: str, n_bins: int) -> np.ndarray:
    if kind == "continuous":
        return histogram_bin(np.linspace(0.0, 1.0, n_bins + 1), col)
    return np.rint(col).astype(np.int64)


def g_test_independent(a: np.ndarray, b: np.ndarray, alpha: float) -> bool:
    """G-test of independence of two discrete samples; ``True`` when independence is *not* rejected at ``alpha``."""
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    ka, kb = ai.max() + 1, bi.max() + 1
    if ka < 2 or kb < 2:
        return True
    table = np.zeros((ka, kb))
    np.add.at(table, (ai, bi), 1.0)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    nz = table > 0
    g = 2.0 * float(np.sum(table[nz] * np.log(table[nz] / expected[nz])))
    return bool(chi2.sf(g, (ka - 1) * (kb - 1)) > alpha)


def _components(n: int, edges: list[tuple[int, int]]) -> list[list[int]]:
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in edges:
        parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def _two_means(x: np.ndarray, rng: np.random.Generator, iters: int = 20) -> np.ndarray:
    """Hard 2-means (Lloyd) on rows ``[N, D]``, k-means++ seeded; returns labels ``[N]`` in ``{0, 1}``."""
    first = x[rng.integers(len(x))]
    d2 = ((x - first) ** 2).sum(1)
    second = x[rng.choice(len(x), p=d2 / d2.sum())] if d2.sum() > 0 else x[rng.integers(len(x))]
    centres = np.stack([first, second])
    labels = np.zeros(len(x), np.int64)
    for _ in range(iters):
        new = ((x[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)
        if np.array_equal(new, labels) and _ > 0:
            break
        labels = new
        for k in range(2):
            if np.any(labels == k):
                centres[k] = x[labels == k].mean(0)
    return labels


class LearnSPN:
    """LearnSPN structure and parameter learning (see the module docstring).

    Args:
        kinds: Per variable ``continuous`` | ``binary`` | ``categorical``.
        n_categories: Per variable number of categories (binary = 2; ignored for continuous).
        n_bins: Histogram bins of continuous leaves (and of the discretisation used by the G-test).
        min_instances_slice: Slices with fewer rows become fully factorised products of leaves.
        max_depth: Depth limit of the sum/product alternation (then factorise).
        alpha: Significance level of the G-test (smaller = fewer dependencies found = more product nodes).
        laplace: Laplace pseudo-count of leaves.
        seed: Seed of the clustering.
    """

    def __init__(
        self,
        kinds: Sequence[str],
        n_categories: Sequence[int],
        n_bins: int = 10,
        min_instances_slice: int = 200,
        max_depth: int = 4,
        alpha: float = 0.001,
        laplace: float = 1.0,
        seed: int = 0,
    ) -> None:
        bad = [k for k in kinds if k not in LEAF_KINDS]
        if bad:
            raise ConfigError(f"spn kinds {bad} must be in {list(LEAF_KINDS)}")
        if len(n_categories) != len(kinds):
            raise ConfigError(f"spn n_categories has {len(n_categories)} entries for {len(kinds)} variables")
        if n_bins < 1:
            raise ConfigError(f"model.spn_bins={n_bins} must be >= 1")
        if min_instances_slice < 2:
            raise ConfigError(f"model.spn_min_instances={min_instances_slice} must be >= 2")
        if max_depth < 0:
            raise ConfigError(f"model.spn_max_depth={max_depth} must be >= 0")
        if not 0 < alpha < 1:
            raise ConfigError(f"model.spn_alpha={alpha} must be in (0, 1)")
        if laplace <= 0:
            raise ConfigError(f"model.spn_laplace={laplace} must be > 0")
        self.kinds, self.n_categories = list(kinds), [int(k) for k in n_categories]
        self.n_bins, self.min_instances, self.max_depth = n_bins, min_instances_slice, max_depth
        self.alpha, self.laplace = alpha, laplace
        self.rng = np.random.default_rng(seed)

    def fit(self, data: np.ndarray) -> SPN:
        """Learn an SPN on rows ``[N, V]`` (table form)."""
        data = np.asarray(data, np.float64)
        if data.ndim != 2 or data.shape[1] != len(self.kinds) or len(data) == 0:
            raise ConfigError(f"LearnSPN.fit needs a non-empty [N, {len(self.kinds)}] array, got {data.shape}")
        root = self._learn(data, list(range(data.shape[1])), depth=0, try_product=True)
        return SPN(root, self.kinds, self.n_categories)

    def leaf(self, data: np.ndarray, var: int) -> Node:
        """Maximum-likelihood (Laplace-smoothed) leaf for variable ``var`` on rows ``data`` ``[N, V]``."""
        col = data[:, var]
        if self.kinds[var] == "continuous":
            breaks = np.linspace(0.0, 1.0, self.n_bins + 1)
            counts = np.bincount(histogram_bin(breaks, col), minlength=self.n_bins).astype(np.float64)
            mass = (counts + self.laplace) / (counts.sum() + self.laplace * self.n_bins)
            return HistogramLeaf([var], breaks=breaks, densities=mass / np.diff(breaks))
        k = self.n_categories[var]
        counts = np.bincount(np.clip(np.rint(col).astype(np.int64), 0, k - 1), minlength=k).astype(np.float64)
        return CategoricalLeaf([var], probs=(counts + self.laplace) / (counts.sum() + self.laplace * k))

    def _factorise(self, data: np.ndarray, scope: list[int]) -> Node:
        if len(scope) == 1:
            return self.leaf(data, scope[0])
        return ProductNode(list(scope), children=[self.leaf(data, v) for v in scope])

    def _independent_groups(self, data: np.ndarray, scope: list[int]) -> list[list[int]]:
        disc = {v: _discretise(data[:, v], self.kinds[v], self.n_bins) for v in scope}
        edges = [
            (i, j)
            for (i, a), (j, b) in itertools.combinations(enumerate(scope), 2)
            if not g_test_independent(disc[a], disc[b], self.alpha)
        ]
        return [[scope[i] for i in group] for group in _components(len(scope), edges)]

    def _cluster_features(self, data: np.ndarray, scope: list[int]) -> np.ndarray:
        cols = []
        for v in scope:
            if self.kinds[v] == "categorical":
                cols.append(np.eye(self.n_categories[v])[np.rint(data[:, v]).astype(np.int64)])
            else:
                cols.append(data[:, v : v + 1])
        return np.concatenate(cols, axis=1)

    def _learn(self, data: np.ndarray, scope: list[int], depth: int, try_product: bool) -> Node:
        if len(scope) == 1 or len(data) < self.min_instances or depth >= self.max_depth:
            return self._factorise(data, scope)
        if try_product:
            groups = self._independent_groups(data, scope)
            if len(groups) > 1:
                children = [self._learn(data, g, depth + 1, try_product=False) for g in groups]
                return ProductNode(list(scope), children=children)
        labels = _two_means(self._cluster_features(data, scope), self.rng)
        sizes = np.bincount(labels, minlength=2)
        if sizes.min() == 0:  # rows cannot be split: fall back to a factorisation
            return self._factorise(data, scope)
        children = [self._learn(data[labels == k], scope, depth + 1, try_product=True) for k in range(2)]
        return SumNode(list(scope), children=children, weights=sizes / sizes.sum())
