"""LiCE's SPN: leaves, exact log-likelihood vs max-approximation, LearnSPN against known densities."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from core.errors import ConfigError
from lightning_modules.lice.spn import (
    SPN,
    CategoricalLeaf,
    HistogramLeaf,
    LearnSPN,
    ProductNode,
    SumNode,
    g_test_independent,
    histogram_bin,
    histogram_leaf_logdensity,
)


def test_histogram_leaf_logdensity_bins():
    breaks = np.array([0.0, 0.25, 0.5, 1.0])
    dens = np.array([0.4, 2.0, 1.2])  # a lookup table here; normalisation is tested on learned SPNs below
    x = np.array([0.0, 0.2499, 0.25, 0.7, 1.0])
    np.testing.assert_allclose(histogram_leaf_logdensity(breaks, dens, x), np.log([0.4, 0.4, 2.0, 1.2, 1.2]))
    # normalised integer data one ulp below a break (49/98 = 0.49999999999999994) counts as on the break
    assert histogram_bin(np.linspace(0, 1, 11), np.array([(50 - 1) / 98]))[0] == 5


def _hand_spn() -> SPN:
    # p(a, c) = 0.3 * H1(a) C1(c) + 0.7 * H2(a) C2(c)
    h1 = HistogramLeaf([0], breaks=np.array([0.0, 0.5, 1.0]), densities=np.array([1.6, 0.4]))
    h2 = HistogramLeaf([0], breaks=np.array([0.0, 0.5, 1.0]), densities=np.array([0.2, 1.8]))
    c1 = CategoricalLeaf([1], probs=np.array([0.9, 0.1]))
    c2 = CategoricalLeaf([1], probs=np.array([0.25, 0.75]))
    root = SumNode(
        [0, 1],
        children=[ProductNode([0, 1], children=[h1, c1]), ProductNode([0, 1], children=[h2, c2])],
        weights=np.array([0.3, 0.7]),
    )
    return SPN(root, ["continuous", "binary"], [0, 2])


def test_exact_and_max_approx_by_hand():
    spn = _hand_spn()
    x = np.array([[0.1, 0.0], [0.9, 1.0], [0.6, 0.0]])
    a = 0.3 * np.array([1.6 * 0.9, 0.4 * 0.1, 0.4 * 0.9])
    b = 0.7 * np.array([0.2 * 0.25, 1.8 * 0.75, 1.8 * 0.25])
    np.testing.assert_allclose(spn.log_likelihood(x), np.log(a + b), rtol=0, atol=1e-12)
    np.testing.assert_allclose(spn.max_approx(x), np.log(np.maximum(a, b)), rtol=0, atol=1e-12)
    # the bounds of every node contain its values
    bounds = spn.node_bounds()
    vals = spn.node_values(x)
    for node in spn.nodes:
        assert np.all(vals[node.id] >= bounds[node.id][0] - 1e-12) and np.all(
            vals[node.id] <= bounds[node.id][1] + 1e-12
        )


def _integral(spn: SPN, n_cont: int, cats: list[int], n_grid: int) -> float:
    """Midpoint rule on a grid aligned with the (common, equal-width) histogram breaks: exact for the SPN."""
    mids = (np.arange(n_grid) + 0.5) / n_grid
    grids = [mids] * n_cont + [np.arange(k, dtype=np.float64) for k in cats]
    pts = np.array(list(itertools.product(*grids)))
    return float(np.exp(spn.log_likelihood(pts)).sum() / n_grid**n_cont)


def test_learned_spn_is_normalised_and_bounds_exact_ll():
    rng = np.random.default_rng(0)
    n = 3000
    z = rng.integers(0, 2, n)  # a latent cluster makes the variables dependent -> sum nodes
    a = np.clip(rng.normal(0.3 + 0.4 * z, 0.1), 0, 1)
    b = np.clip(rng.normal(0.7 - 0.4 * z, 0.1), 0, 1)
    c = (rng.random(n) < 0.2 + 0.6 * z).astype(float)
    data = np.stack([a, b, c], 1)
    spn = LearnSPN(["continuous", "continuous", "binary"], [0, 0, 2], n_bins=10, min_instances_slice=100).fit(data)
    assert any(isinstance(nd, SumNode) for nd in spn.nodes), "dependent data must produce a sum node"
    assert _integral(spn, 2, [2], 10) == pytest.approx(1.0, abs=1e-9)
    ll, mx = spn.log_likelihood(data), spn.max_approx(data)
    assert np.all(mx <= ll + 1e-12)
    assert float(np.mean(ll - mx)) > 1e-4  # the approximation is not exact on mixtures


def test_learnspn_matches_a_known_product_density():
    # x ~ piecewise-constant density on 10 bins, c ~ Cat(0.2, 0.5, 0.3), independent: the SPN must factorise and
    # its average log-likelihood must approach the true one.
    rng = np.random.default_rng(1)
    true_dens = np.array([0.5, 0.5, 1.0, 2.0, 2.0, 1.0, 1.0, 0.5, 0.5, 1.0])
    n = 20000
    bins = rng.choice(10, size=n, p=true_dens / true_dens.sum())
    x = (bins + rng.random(n)) / 10
    c = rng.choice(3, size=n, p=[0.2, 0.5, 0.3]).astype(float)
    data = np.stack([x, c], 1)
    spn = LearnSPN(["continuous", "categorical"], [0, 3], n_bins=10, min_instances_slice=100).fit(data)
    assert isinstance(spn.root, ProductNode) and len(spn.nodes) == 3
    true_ll = np.log(true_dens[bins]) + np.log(np.array([0.2, 0.5, 0.3])[c.astype(int)])
    assert float(np.mean(spn.log_likelihood(data))) == pytest.approx(float(np.mean(true_ll)), abs=0.01)
    np.testing.assert_allclose(spn.log_likelihood(data), spn.max_approx(data), atol=1e-12)  # no sum node


def test_g_test_detects_dependence():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 3, 2000)
    assert g_test_independent(a, rng.integers(0, 3, 2000), alpha=0.001)
    assert not g_test_independent(a, (a + (rng.random(2000) < 0.2)) % 3, alpha=0.001)


def test_learnspn_rejects_bad_config():
    with pytest.raises(ConfigError, match="spn_bins"):
        LearnSPN(["continuous"], [0], n_bins=0)
    with pytest.raises(ConfigError, match="kinds"):
        LearnSPN(["gaussian"], [0])
    with pytest.raises(ConfigError, match=r"\[N, 2\]"):
        LearnSPN(["continuous", "binary"], [0, 2]).fit(np.zeros((5, 3)))
