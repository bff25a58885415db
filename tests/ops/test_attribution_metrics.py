"""Attribution metrics and the curve projection on hand-made maps, curves and mock models (exact numbers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.errors import ConfigError
from ops.attribution import metrics as M
from ops.attribution.projection import normalize_curve, normalize_curve_naive, second_difference

IMG = torch.tensor([[[1.0, 0.5], [0.0, 0.0]]], dtype=torch.float64)  # [1, 2, 2]


def mass_model(x: torch.Tensor) -> torch.Tensor:
    """Two classes: p_0 = sum(x) / 4 (so the response is linear in the pixels present)."""
    p0 = x.reshape(len(x), -1).sum(1) / 4
    return torch.stack([p0, 1 - p0], 1)


def test_auc_official_formula():
    assert M.auc(np.array([0.0, 1.0])) == 0.5
    assert M.auc(np.array([1.0, 1.0, 1.0])) == 1.0
    assert M.auc(np.array([1.0, 0.0, 0.0, 0.0])) == pytest.approx(1 / 6)
    with pytest.raises(ConfigError):
        M.auc(np.array([1.0]))


def test_gkern_and_blur():
    k = M.gkern(5, 1.0, channels=2)
    assert k.shape == (2, 2, 5, 5) and float(k[0, 1].abs().sum()) == 0.0
    assert float(k[0, 0].sum()) == pytest.approx(1.0, abs=1e-3)  # truncated Gaussian, nearly all mass
    flat = torch.ones(1, 9, 9, dtype=torch.float64)
    assert float(M.blur(flat, 3, 1.0)[0, 4, 4]) == pytest.approx(float(M.gkern(3, 1.0, 1).sum()))


def test_rise_curves_by_hand():
    good = torch.tensor([[3.0, 2.0], [1.0, 0.0]])
    bad = -good
    zero = torch.zeros_like(IMG)
    ins = M.rise_curve(mass_model, IMG, good, "ins", zero, 1, 0)
    np.testing.assert_allclose(ins, [0, 0.25, 0.375, 0.375, 0.375])
    assert M.auc(ins) == pytest.approx(0.296875)
    ins_bad = M.rise_curve(mass_model, IMG, bad, "ins", zero, 1, 0)
    np.testing.assert_allclose(ins_bad, [0, 0, 0, 0.125, 0.375])
    assert M.auc(ins_bad) == pytest.approx(0.078125)
    dele = M.rise_curve(mass_model, IMG, good, "del", zero, 1, 0)
    np.testing.assert_allclose(dele, [0.375, 0.125, 0, 0, 0])
    assert len(M.rise_curve(mass_model, IMG, good, "ins", zero, 3, 0)) == 3  # ceil(4 / 3) + 1 points


def test_monotone_normalize_by_hand():
    raw = np.array([0.1, 0.5, 0.3, 0.9, 1.2])
    np.testing.assert_allclose(M.monotone_normalize(raw, 0.1, 0.9, "ins"), [0, 0.5, 0.5, 1, 1])
    raw_d = np.array([0.9, 0.95, 0.5, 0.7, 0.0])
    np.testing.assert_allclose(M.monotone_normalize(raw_d, 0.1, 0.9, "del"), [1, 1, 0.5, 0.5, 0])


def test_mas_by_hand():
    good = torch.tensor([[3.0, 2.0], [1.0, 0.0]])
    n, corr, pen, dens, norm = M.mas_single_run(mass_model, IMG, good, "ins", torch.zeros_like(IMG), 1, 0)
    assert n == 5
    np.testing.assert_allclose(norm, [0, 2 / 3, 1, 1, 1])
    np.testing.assert_allclose(dens, [0, 0.5, 5 / 6, 1, 1])
    np.testing.assert_allclose(pen, [0, 1 / 6, 1 / 6, 0, 0])
    np.testing.assert_allclose(corr, [0, 0.5, 5 / 6, 1, 1])
    assert M.auc(corr) == pytest.approx((0.5 + 5 / 6 + 1 + 0.5) / 4)
    # deletion: +penalty, then min-max rescaled
    _, corr_d, pen_d, dens_d, norm_d = M.mas_single_run(mass_model, IMG, good, "del", torch.zeros_like(IMG), 1, 0)
    np.testing.assert_allclose(norm_d, [1, 1 / 3, 0, 0, 0])
    np.testing.assert_allclose(dens_d, [1, 0.5, 1 / 6, 0, 0])
    np.testing.assert_allclose(pen_d, [0, 1 / 6, 1 / 6, 0, 0])
    np.testing.assert_allclose(corr_d, [1, 0.5, 1 / 6, 0, 0])


def test_mas_degenerate_falls_back_to_ramp():
    const = lambda x: torch.tensor([[0.7, 0.3]], dtype=torch.float64).expand(len(x), 2)  # noqa: E731
    _, corr, *_ = M.mas_single_run(const, IMG, torch.ones(2, 2), "del", torch.zeros_like(IMG), 1, 0)
    np.testing.assert_allclose(corr, np.linspace(1, 0, 5))


def test_monotonicity_and_perturbation():
    seg = torch.tensor([[0, 1], [2, 3]])
    good = torch.tensor([[3.0, 2.0], [1.0, 0.0]])
    img = torch.tensor([[[1.0, 0.6], [0.3, 0.1]]], dtype=torch.float64)
    raw, rho = M.monotonicity(mass_model, img, good, "positive", torch.zeros_like(img), 0, seg)
    np.testing.assert_allclose(raw, np.cumsum([0, 1.0, 0.6, 0.3, 0.1]) / 4)
    assert rho == pytest.approx(1.0)
    _, rho_neg = M.monotonicity(mass_model, img, good, "negative", torch.zeros_like(img), 0, seg)
    assert rho_neg == pytest.approx(1.0)
    _, rho_bad = M.monotonicity(mass_model, img, -good, "negative", torch.zeros_like(img), 0, seg)
    assert rho_bad == pytest.approx(1.0)  # removal always lowers a mass response: still monotone

    # perturbation with a threshold model: class 0 iff sum(x) > 1.5 (the full image sums to 2.0)
    def thresh(x):
        p0 = torch.sigmoid(50 * (x.reshape(len(x), -1).sum(1) - 1.5))
        return torch.stack([p0, 1 - p0], 1)

    fr = (0.0, 0.25, 0.5)
    np.testing.assert_allclose(M.perturbation_curve(thresh, img, good, "positive", 0, fractions=fr), [1, 0, 0])
    np.testing.assert_allclose(M.perturbation_curve(thresh, img, good, "negative", 0, fractions=fr), [1, 1, 1])
    np.testing.assert_allclose(M.perturbation_curve(thresh, img, -good, "negative", 0, fractions=fr), [1, 0, 0])


def test_localisation_by_hand():
    s = torch.zeros(4, 4)
    s[2:, 2:] = 1.0
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[3, 3] = True
    assert M.pointing_game(s, mask) == 1.0
    assert M.pointing_game(-s, mask) == 0.0
    assert M.topk_patch_iou(s, mask, 2, 1) == 1.0
    assert M.topk_patch_iou(s, mask, 2, 2) == 0.5
    with pytest.raises(ConfigError, match="does not divide"):
        M.topk_patch_iou(s, mask, 3, 1)


def test_bad_saliency_shape_is_a_clear_error():
    with pytest.raises(ConfigError, match="expected \\[H, W\\]"):
        M.rise_curve(mass_model, IMG, torch.ones(3, 3), "ins", torch.zeros_like(IMG), 1, 0)
    with pytest.raises(ConfigError, match="non-finite"):
        M.rise_curve(mass_model, IMG, torch.full((2, 2), float("nan")), "ins", torch.zeros_like(IMG), 1, 0)


def test_projection_hand_case_and_properties():
    np.testing.assert_allclose(normalize_curve(np.array([1.0, 1.0, 0.0]), 0), [1, 0.5, 0], atol=1e-7)
    np.testing.assert_allclose(normalize_curve(np.array([0.0, 0.0, 1.0]), 1), [0, 0.5, 1], atol=1e-7)
    rng = np.random.default_rng(0)
    y = np.minimum.accumulate(np.clip(1 - np.linspace(0, 1, 30) ** 0.5 + 0.1 * rng.standard_normal(30), 0, 1))
    y[0] = 1.0
    for kind, sign in ((0, 1), (1, -1)):
        x = normalize_curve(y, kind)
        assert (sign * (second_difference(30) @ x)).min() >= -1e-8
        assert x[0] == y[0] and x[-1] == y[-1] and x.min() >= 0 and x.max() <= 1
        np.testing.assert_allclose(normalize_curve(x, kind), x, atol=1e-6)  # idempotent
        np.testing.assert_allclose(normalize_curve_naive(y, kind), x, atol=1e-5)  # independent solver agrees
    with pytest.raises(ConfigError, match="endpoints"):
        normalize_curve(np.array([1.5, 0.0, 0.0]), 0)


def test_projection_falls_back_when_clarabel_fails(monkeypatch):
    """A Clarabel failure (seen at tight tolerances on a nearly flat deletion curve in the claim run) must not lose
    the image: retry at default tolerances, then the SLSQP twin, whose answer is the same projection."""
    import cvxpy as cp

    from ops.attribution import projection

    y = np.array([1.0, 0.2, 0.6, 0.1, 0.3, 0.0])
    expected = projection.normalize_curve_naive(y, 0)
    calls = []

    def failing_solve(self, *args, **kwargs):
        calls.append(kwargs)
        raise cp.error.SolverError("Solver 'CLARABEL' failed.")

    monkeypatch.setattr(cp.Problem, "solve", failing_solve)
    out = projection.normalize_curve(y, 0)
    assert len(calls) == 2 and "tol_feas" in calls[0] and "tol_feas" not in calls[1]  # tight, then default
    np.testing.assert_allclose(out, expected, atol=1e-12)
    assert np.all(np.diff(out, 2) >= -1e-9) and out[0] == 1.0 and out[-1] == 0.0  # convex, ends fixed
