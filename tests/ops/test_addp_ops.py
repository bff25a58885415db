"""ADDP's pure functions: the contribution-aware timestep distribution and its sampling vs loss-weight equivalence,
the drift-simulating augmentations, correctional guidance (noise vs x0 form), and the x0-recording sampler."""

from __future__ import annotations

import pytest
import torch

from core.errors import ConfigError
from ops.addp import (
    contribution_curve,
    correctional_cfg,
    ddim_timesteps,
    loss_weight,
    mix_self,
    power_distribution,
    sample_timesteps,
    tailored_augment,
    vp_sigma_tilde,
)
from ops.samplers import recording, sample


def test_contribution_curve_follows_the_gains_and_normalises():
    steps = ddim_timesteps(100, 10)
    q = torch.tensor([0.0, 0.5, 0.7, 0.8, 0.85, 0.86, 0.86, 0.85, 0.84, 0.83, 0.82], dtype=torch.float64)
    p = contribution_curve(q, steps, 100, higher_is_better=True, floor=0.0, smooth=0.0)
    assert float(p.sum()) == pytest.approx(1.0, abs=1e-12)
    # gains 0.5, 0.2, 0.1, 0.05, 0.01 on the first five steps; none later (quality falls)
    mass = [float(p[(torch.arange(1, 101)[:, None] - steps[None]).abs().argmin(1) == k].sum()) for k in range(10)]
    assert mass[:5] == pytest.approx([0.5 / 0.86, 0.2 / 0.86, 0.1 / 0.86, 0.05 / 0.86, 0.01 / 0.86], rel=1e-9)
    assert sum(mass[5:]) == 0.0
    # an error metric gains when it falls: the mirrored curve gives the same distribution
    assert torch.allclose(contribution_curve(1 - q, steps, 100, higher_is_better=False, floor=0.0), p)
    # floor mixes in uniform mass; no gain at all is uniform; smoothing keeps the total
    pf = contribution_curve(q, steps, 100, floor=0.2)
    assert float(pf.min()) == pytest.approx(0.2 / 100) and float(pf.sum()) == pytest.approx(1.0)
    flat = contribution_curve(torch.zeros(11, dtype=torch.float64), steps, 100)
    assert torch.allclose(flat, torch.full((100,), 0.01, dtype=torch.float64))
    assert float(contribution_curve(q, steps, 100, smooth=3.0).sum()) == pytest.approx(1.0)
    with pytest.raises(ConfigError):
        contribution_curve(q[:5], steps, 100)


def test_sampling_and_loss_weight_give_the_same_expected_loss():
    """E_{t~p}[L_t] = E_{t~U}[T p_t L_t]: exactly, and by Monte Carlo with both estimators."""
    T = 50
    p = power_distribution(T, 2.0)
    g = torch.Generator().manual_seed(0)
    L = torch.rand(T, generator=g, dtype=torch.float64) + torch.linspace(0, 1, T, dtype=torch.float64)
    exact = float((p * L).sum())
    t_all = torch.arange(1, T + 1)
    assert float((loss_weight(p, t_all) * L).mean()) == pytest.approx(exact, rel=1e-12)
    n = 200_000
    t_p = sample_timesteps(p, n, torch.Generator().manual_seed(1))
    t_u = torch.randint(1, T + 1, (n,), generator=torch.Generator().manual_seed(2))
    by_sampling = float(L[t_p - 1].mean())
    by_weight = float((loss_weight(p, t_u) * L[t_u - 1]).mean())
    assert by_sampling == pytest.approx(exact, rel=0.01) and by_weight == pytest.approx(exact, rel=0.01)
    assert int(t_p.min()) >= 1 and int(t_p.max()) <= T
    with pytest.raises(ConfigError):
        sample_timesteps(p * 2, 4)


def test_timestep_grid():
    assert ddim_timesteps(100, 10).tolist() == [100, 89, 78, 67, 56, 45, 34, 23, 12, 1]
    s = vp_sigma_tilde(torch.arange(1, 101), 100)
    assert bool((s[1:] > s[:-1]).all()) and float(s[0]) < 0.05 and float(s[-1]) > 100
    with pytest.raises(ConfigError):
        ddim_timesteps(5, 6)


def test_augmentations():
    m = -torch.ones(16, 1, 12, 12, dtype=torch.float64)
    m[:, :, 4:8, 4:8] = 1.0
    g = torch.Generator().manual_seed(0)
    out = tailored_augment(m, "morph", 0.5, g)  # r = 1: a 3x3 dilation (6x6 square) or erosion (2x2)
    areas = sorted({int((o > 0).sum()) for o in out})
    assert set(areas) <= {4, 36} and len(areas) == 2
    sh = tailored_augment(m, "shift", 0.5, torch.Generator().manual_seed(1))
    assert all(int((s > 0).sum()) == 16 for s in sh)  # a shift of <= 1 px keeps the square inside
    assert any(not torch.equal(s, m[0]) for s in sh)
    d = torch.linspace(-1, 1, 144, dtype=torch.float64).view(1, 1, 12, 12).repeat(4, 1, 1, 1)
    assert torch.equal(tailored_augment(d, "warp", 0.0), d)
    w = tailored_augment(d, "warp", 1.0, torch.Generator().manual_seed(2))
    assert 0.01 < float((w - d).abs().mean()) < 1.0
    assert torch.allclose(mix_self(d, -d, 0.5), torch.zeros_like(d))
    with pytest.raises(ConfigError):
        tailored_augment(d, "blur", 1.0)


def test_correctional_guidance_same_in_noise_and_x0_form():
    g = torch.Generator().manual_seed(0)
    x, sigma = torch.randn(3, 4, generator=g, dtype=torch.float64), 0.7
    dc, du, dn = (torch.randn(3, 4, generator=g, dtype=torch.float64) for _ in range(3))
    eps = lambda d: (x - d) / sigma  # noqa: E731
    guided_x0 = correctional_cfg(dc, du, dn, w=2.5, w_neg=0.8)
    guided_eps = correctional_cfg(eps(dc), eps(du), eps(dn), w=2.5, w_neg=0.8)
    assert torch.allclose(eps(guided_x0), guided_eps, atol=1e-12)
    assert torch.allclose(correctional_cfg(dc, du, None, w=1.0), dc, atol=1e-15)
    assert torch.allclose(correctional_cfg(dc, du, dn, w=1.0, w_neg=1.0), dc - dn + du)


def test_recording_keeps_every_ddim_x0_prediction():
    den, calls = recording(lambda x, s: 0.5 * x / (1 + s[:, None]))
    out = sample(den, torch.ones(2, 3), torch.tensor([4.0, 2.0, 1.0, 0.0]), "euler")
    assert [c[0] for c in calls] == [4.0, 2.0, 1.0] and torch.equal(out.x, calls[-1][1])
