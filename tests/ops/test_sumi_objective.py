"""SuMi's pieces (ops/tta) on hand-computed fixtures: IQR fence, selections, MI sharing, balance, the loss."""

from __future__ import annotations

import math

import pytest
import torch

from ops.tta import (
    balance_term,
    eata_weights,
    iqr_smoothing_mask,
    mutual_info_sharing,
    softmax_entropy,
    sumi_objective,
    unimodal_assist_mask,
)
from ops.tta.sumi import OFFICIAL_GAMMA_U, OFFICIAL_MARGIN, iqr_fence

FEAT = torch.tensor([[0.0, 0.0], [1.0, 10.0], [2.0, 20.0], [4.0, 40.0]], dtype=torch.float64)


def logits_of(probs: list[list[float]]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log()


def test_official_constants() -> None:
    assert math.isclose(OFFICIAL_MARGIN, 2.4538776, abs_tol=1e-6)
    assert math.isclose(OFFICIAL_GAMMA_U, 0.2718282, abs_tol=1e-6)


def test_minmax_fence_by_hand() -> None:
    # min 0 / max 4 (dim 0) and 0 / 40 (dim 1): "Q1" = 1, 10; "Q3" = 3, 30; IQR = 2, 20.
    lo, hi = iqr_fence(FEAT, t=0, total=4, quartiles="minmax")
    torch.testing.assert_close(lo, torch.tensor([1.0, 10.0], dtype=torch.float64))
    torch.testing.assert_close(hi, torch.tensor([3.0, 30.0], dtype=torch.float64))
    # t/T = 1/2: the fence widens by 1.5 * 0.5 * IQR = 1.5, 15.
    lo, hi = iqr_fence(FEAT, t=2, total=4, quartiles="minmax")
    torch.testing.assert_close(lo, torch.tensor([-0.5, -5.0], dtype=torch.float64))
    torch.testing.assert_close(hi, torch.tensor([4.5, 45.0], dtype=torch.float64))


def test_quantile_fence_by_hand() -> None:
    # Linear-interpolated quartiles of (0, 1, 2, 4): positions 0.75 and 2.25 -> 0.75 and 2.5.
    lo, hi = iqr_fence(FEAT, t=0, total=4, quartiles="quantile")
    torch.testing.assert_close(lo, torch.tensor([0.75, 7.5], dtype=torch.float64))
    torch.testing.assert_close(hi, torch.tensor([2.5, 25.0], dtype=torch.float64))


def test_iqr_mask_by_hand() -> None:
    # t = 0: fence [Q1, Q3]; rows 0 and 3 have no dimension inside, 2 * 0.6 = 1.2 needed.
    assert iqr_smoothing_mask(FEAT, 0, 2, quartiles="minmax").tolist() == [False, True, True, False]
    # t/T = 1/2: minmax fence [-0.5, 4.5] x [-5, 45] holds everything (1.6 of 2 dims needed).
    assert iqr_smoothing_mask(FEAT, 1, 2, quartiles="minmax").tolist() == [True, True, True, True]
    # True quartiles: fence [0.75 - 1.3125, 2.5 + 1.3125] x [7.5 - 13.125, 25 + 13.125] drops the outlier row 3.
    assert iqr_smoothing_mask(FEAT, 1, 2, quartiles="quantile").tolist() == [True, True, True, False]


def test_iqr_required_fraction() -> None:
    # 5 dims, per-dim min 0 / max 4 -> minmax fence [1, 3] at t = 0; 0.6 * 5 = 3 dims needed.
    feat = torch.tensor(
        [[0.0] * 5, [4.0] * 5, [2.0, 2.0, 2.0, 0.0, 0.0], [2.0, 2.0, 0.0, 0.0, 0.0]], dtype=torch.float64
    )
    assert iqr_smoothing_mask(feat, 0, 10, quartiles="minmax").tolist() == [False, False, True, False]
    # Fence [1 - 1.5 * 2 * 0.1, 3 + 0.3] = [0.7, 3.3] at t/T = 0.1, but now 0.64 * 5 = 3.2 dims are needed.
    assert iqr_smoothing_mask(feat, 1, 10, quartiles="minmax").tolist() == [False, False, False, False]
    # With min_keep = 0.4: 2 dims needed at t = 0, so row 3 passes too.
    assert iqr_smoothing_mask(feat, 0, 10, min_keep=0.4, quartiles="minmax").tolist() == [False, False, True, True]


def test_unimodal_assist_by_hand() -> None:
    ent_a = torch.tensor([0.1, 0.5, 0.5, 0.2])
    ent_v = torch.tensor([0.1, 0.3, 0.1, 0.2])
    ent_mm = torch.tensor([1.0, 1.0, 3.0, 0.5])
    # H_u = (0.1, 0.4, 0.3, 0.2); H_u >= e/10 and H_mm <= 2.454.
    assert unimodal_assist_mask(ent_a, ent_v, ent_mm).tolist() == [False, True, False, False]
    # mu = 3: H_u = (0.1, 0.35, 0.2, 0.2); gamma_m = 3.5 lets row 2's H_mm through but its H_u is too low.
    assert unimodal_assist_mask(ent_a, ent_v, ent_mm, mu=3.0, gamma_m=3.5).tolist() == [False, True, False, False]
    assert unimodal_assist_mask(ent_a, ent_v, ent_mm, gamma_u=0.25, gamma_m=3.5).tolist() == [False, True, True, False]


def test_mutual_info_by_hand() -> None:
    z_a, z_v, z_mm = logits_of([[0.5, 0.5]]), logits_of([[0.9, 0.1]]), logits_of([[0.7, 0.3]])
    # m_a = (p_v + p_mm)/2 = (0.8, 0.2), m_v = (p_a + p_mm)/2 = (0.6, 0.4).
    kl_a = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)
    kl_v = 0.6 * math.log(0.6 / 0.9) + 0.4 * math.log(0.4 / 0.1)
    assert mutual_info_sharing(z_a, z_v, z_mm).item() == pytest.approx(kl_a + kl_v, abs=1e-12)
    assert kl_a + kl_v == pytest.approx(0.503984, abs=1e-6)


def test_mutual_info_targets_carry_gradient() -> None:
    z_a, z_v, z_mm = (
        logits_of([[0.5, 0.5]]).requires_grad_(),
        logits_of([[0.9, 0.1]]).requires_grad_(),
        logits_of([[0.7, 0.3]]).requires_grad_(),
    )
    mutual_info_sharing(z_a, z_v, z_mm).sum().backward()
    assert z_mm.grad.abs().sum() > 1e-3  # z_mm only enters through the (attached) mixtures
    z_mm.grad = None
    mutual_info_sharing(z_a, z_v, z_mm, detach_targets=True).sum().backward()
    assert z_mm.grad is None or z_mm.grad.abs().sum() == 0


def test_balance_by_hand() -> None:
    z = logits_of([[0.7, 0.3], [0.2, 0.8]])
    # sum of probabilities (0.9, 1.1) -> softmax -> entropy.
    q = [math.exp(0.9) / (math.exp(0.9) + math.exp(1.1)), math.exp(1.1) / (math.exp(0.9) + math.exp(1.1))]
    expected = -sum(v * math.log(v) for v in q)
    assert balance_term(z).item() == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx(0.688172, abs=1e-6)


def test_entropy_and_weights_by_hand() -> None:
    h = softmax_entropy(logits_of([[0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 1e-300, 1e-300]]))
    torch.testing.assert_close(h, torch.tensor([math.log(4), math.log(2)], dtype=torch.float64))
    w = eata_weights(torch.tensor([1.0, 2.0, 0.0]), margin=1.0)
    torch.testing.assert_close(w, torch.tensor([1.0, math.exp(-1.0), math.e]))


def _h(p: list[float]) -> float:
    return -sum(v * math.log(v) for v in p)


def _kl(m: list[float], p: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(m, p))


PA = [[0.5, 0.5], [0.6, 0.4], [0.99, 0.01]]
PV = [[0.5, 0.5], [0.45, 0.55], [0.98, 0.02]]
PM = [[0.9, 0.1], [0.8, 0.2], [0.999, 0.001]]


def _manual_loss(rows: list[int], lam: float, e0: float, second_half: bool = False) -> float:
    hs = [_h(PM[i]) for i in rows]
    coeff = [math.exp(-(h - e0)) for h in hs]
    if second_half:
        core = sum(hs) / len(hs) * sum(coeff) / len(coeff)
    else:
        mi = []
        for i in rows:
            m_a = [(v + m) / 2 for v, m in zip(PV[i], PM[i])]
            m_v = [(a + m) / 2 for a, m in zip(PA[i], PM[i])]
            mi.append(_kl(m_a, PA[i]) + _kl(m_v, PV[i]))
        core = sum(c * (h + lam * k) for c, h, k in zip(coeff, hs, mi)) / len(rows)
    p_sum = [sum(PM[i][c] for i in rows) for c in range(2)]
    z = sum(math.exp(v) for v in p_sum)
    bal = _h([math.exp(v) / z for v in p_sum])
    return core - bal


def test_sumi_objective_by_hand() -> None:
    z_a, z_v, z_mm = logits_of(PA), logits_of(PV), logits_of(PM)
    feat = torch.zeros(3, 4, dtype=torch.float64)
    # Row 2: unimodal entropies tiny (< e/10) -> not selected; rows 0, 1 have H_u >= e/10 and H_mm <= 0.6.
    step = sumi_objective(z_a, z_v, z_mm, feat, t=0, total=10, gamma_m=0.6, e_margin=0.4, use_iqr=False)
    assert step.selected.tolist() == [0, 1]
    assert step.loss.item() == pytest.approx(_manual_loss([0, 1], 5.0, 0.4), abs=1e-10)
    step = sumi_objective(z_a, z_v, z_mm, feat, t=0, total=10, lam=0.0, gamma_m=0.6, e_margin=0.4, use_iqr=False)
    assert step.loss.item() == pytest.approx(_manual_loss([0, 1], 0.0, 0.4), abs=1e-10)


def test_sumi_objective_second_half_quirk() -> None:
    z_a, z_v, z_mm = logits_of(PA), logits_of(PV), logits_of(PM)
    feat = torch.zeros(3, 4, dtype=torch.float64)
    kw = dict(gamma_m=0.6, e_margin=0.4, use_iqr=False, faithful_second_half=True)
    first = sumi_objective(z_a, z_v, z_mm, feat, t=4, total=10, **kw)
    second = sumi_objective(z_a, z_v, z_mm, feat, t=5, total=10, **kw)
    assert first.loss.item() == pytest.approx(_manual_loss([0, 1], 5.0, 0.4), abs=1e-10)
    assert second.loss.item() == pytest.approx(_manual_loss([0, 1], 5.0, 0.4, second_half=True), abs=1e-10)
    paper = sumi_objective(z_a, z_v, z_mm, feat, t=5, total=10, gamma_m=0.6, e_margin=0.4, use_iqr=False)
    assert paper.loss.item() == pytest.approx(_manual_loss([0, 1], 5.0, 0.4), abs=1e-10)


def test_sumi_objective_empty_selection_and_ablation() -> None:
    z_a, z_v, z_mm = logits_of(PA), logits_of(PV), logits_of(PM)
    feat = torch.zeros(3, 4, dtype=torch.float64)
    empty = sumi_objective(z_a, z_v, z_mm, feat, t=0, total=10, gamma_m=0.0, use_iqr=False)
    assert empty.loss is None and empty.selected.numel() == 0
    # Without unimodal assistance only H_mm <= gamma_m remains: row 2 (H_mm tiny) is selected too.
    step = sumi_objective(z_a, z_v, z_mm, feat, t=0, total=10, gamma_m=0.6, use_iqr=False, use_unimodal=False)
    assert step.selected.tolist() == [0, 1, 2]


def test_sumi_objective_intersects_iqr_and_entropy_sets() -> None:
    z_a, z_v, z_mm = logits_of(PA), logits_of(PV), logits_of(PM)
    feat = torch.tensor([[0.0, 0.0], [5.0, 5.0], [10.0, 10.0]], dtype=torch.float64)
    # minmax fence at t = 0 is [2.5, 7.5]: only row 1 passes IQR smoothing; rows 0, 1 pass the entropy test.
    step = sumi_objective(z_a, z_v, z_mm, feat, t=0, total=10, gamma_m=0.6, quartiles="minmax")
    assert step.iqr_mask.tolist() == [False, True, False]
    assert step.entropy_mask.tolist() == [True, True, False]
    assert step.selected.tolist() == [1]


def test_sumi_objective_gradients_flow_to_all_logits() -> None:
    z_a, z_v, z_mm = (logits_of(p).requires_grad_() for p in (PA, PV, PM))
    feat = torch.zeros(3, 4, dtype=torch.float64)
    step = sumi_objective(z_a, z_v, z_mm, feat, t=0, total=10, gamma_m=0.6, use_iqr=False)
    step.loss.backward()
    for z in (z_a, z_v, z_mm):
        assert z.grad[:2].abs().sum() > 1e-6  # selected rows get gradient
        assert z.grad[2].abs().sum() == 0  # the unselected row does not
    # The EATA weights are constants (detached): the gradient is that of sum_i c_i L_i with c_i frozen.
    c = eata_weights(softmax_entropy(z_mm[:2]), OFFICIAL_MARGIN)
    z_m2 = z_mm.detach().clone().requires_grad_()
    manual = c * (softmax_entropy(z_m2[:2]) + 5 * mutual_info_sharing(z_a[:2].detach(), z_v[:2].detach(), z_m2[:2]))
    (manual.mean() - balance_term(z_m2[:2])).backward()
    torch.testing.assert_close(z_m2.grad, z_mm.grad)
