"""Tabular SEMDICE module, its baselines, the online data-collection callback and the tabular-MDP datamodule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from callbacks.online_collection import OnlineDataCollection
from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules.tabular_mdp import TabularMDPDataModule
from lightning_modules.semdice import SemdiceLitModule
from ops.semdice import tabular as tb
from suite.build import build
from tests.conftest import compose_train


def _fit(tmp_path: Path, *overrides: str, epochs: int = 2):
    cfg = compose_train(
        [
            "experiment=semdice",
            "logger=none",
            "callbacks=none",
            f"trainer.max_epochs={epochs}",
            "trainer.enable_progress_bar=false",
            "data.trajectories_per_epoch=5",
            *overrides,
        ],
        tmp_path,
    )
    objs = build(cfg)
    objs["trainer"].fit(objs["model"], datamodule=objs["datamodule"])
    return objs["model"], objs["datamodule"], objs["trainer"]


def test_callback_collects_one_trajectory_per_step_with_epsilon_schedule(tmp_path):
    model, dm, trainer = _fit(tmp_path, "model.kind=uniform")
    assert dm.num_collected == 10 and float(dm.counts.sum()) == 10 * 100
    cb = OnlineDataCollection()
    assert [cb.epsilon(i) for i in (0, 1, 9)] == [1.0, 0.5, 0.1]
    # uniform policy: normalised entropy exactly 0; h_opt from the convex program is the top entropy
    assert abs(float(trainer.callback_metrics["val/normalized_entropy"])) < 1e-6
    assert float(trainer.callback_metrics["val/h_opt"]) > float(trainer.callback_metrics["val/entropy"])
    assert float(trainer.callback_metrics["val/trajectories"]) == 10


def test_semdice_fused_equals_autograd_and_learns(tmp_path):
    fused, _, tr_f = _fit(tmp_path / "f", "model.fused=true")
    naive, _, tr_n = _fit(tmp_path / "n", "model.fused=false")
    torch.testing.assert_close(fused.nu.detach(), naive.nu.detach(), rtol=0, atol=1e-10)
    torch.testing.assert_close(fused.mu.detach(), naive.mu.detach(), rtol=0, atol=1e-10)
    torch.testing.assert_close(fused.policy, naive.policy, rtol=0, atol=1e-10)
    assert float(tr_f.callback_metrics["val/normalized_entropy"]) > 0.3  # 10 trajectories already beat uniform
    # the recovered policy is a distribution per state, and d_b is the data distribution (paper)
    torch.testing.assert_close(fused.policy.sum(1), torch.ones(20, dtype=torch.float64))
    n_sa = tr_f.datamodule.counts.sum(-1)
    torch.testing.assert_close(fused.d_b, n_sa / n_sa.sum())


def test_official_d_b_is_stationary_distribution_under_mle_model(tmp_path):
    model, dm, _ = _fit(tmp_path, "model.d_b=official", epochs=1)
    # d_b was computed for the policy before the last step; recompute it from the stored policy history
    pre = model.d_b.clone()
    model.refresh_data(dm)
    expected = tb.stationary_distribution(tb.mle_model(dm.counts), dm.p0, model.policy, dm.gamma)
    torch.testing.assert_close(model.d_b, expected, rtol=0, atol=1e-12)
    assert float((pre - dm.counts.sum(-1) / dm.counts.sum()).abs().max()) > 1e-3  # not the data distribution


@pytest.mark.parametrize("kind", ["pb_s", "cb_s", "cb_sa", "maxent"])
def test_baselines_run(tmp_path, kind):
    model, dm, tr = _fit(tmp_path, f"model.kind={kind}", epochs=1)
    ne = float(tr.callback_metrics["val/normalized_entropy"])
    if kind == "maxent":
        assert abs(ne - 1) < 1e-4
    else:
        # the PG moved the logits, and the policy is no longer uniform (5 trajectories: not necessarily better)
        assert float(model.logits.detach().abs().max()) > 1e-3 and 1e-6 < abs(ne) < 1.0


def test_bad_config_errors():
    with pytest.raises(ConfigError, match="model.kind='ppo'"):
        SemdiceLitModule(kind="ppo")
    with pytest.raises(ConfigError, match="model.alpha=0.0 must be > 0"):
        SemdiceLitModule(alpha=0.0)
    with pytest.raises(ConfigError, match="model.d_b='x'"):
        SemdiceLitModule(d_b="x")
    with pytest.raises(ConfigError, match=r"data.gamma=1.0 must lie in \(0, 1\)"):
        TabularMDPDataModule(gamma=1.0)
    m = SemdiceLitModule(optimizer=lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9))
    with pytest.raises(ConfigError, match="model.fused=true runs plain gradient descent"):
        m.configure_optimizers()


def test_real_npz_loader(tmp_path):
    T, p0 = tb.random_mdp(6, 3, 2, seed=2)
    np.savez(tmp_path / "mdp.npz", T=T.numpy(), p0=p0.numpy())
    dm = TabularMDPDataModule(source="real", data_dir=str(tmp_path), horizon=7)
    dm.setup("fit")
    assert (dm.num_states, dm.num_actions) == (6, 3) and torch.equal(dm.T, T)
    dm.collect(torch.full((6, 3), 1 / 3, dtype=torch.float64), 1.0)
    assert float(dm.counts.sum()) == 7
    bad = T.numpy().copy()
    bad[4, 2, 0] += 0.5
    np.savez(tmp_path / "bad.npz", T=bad, p0=p0.numpy())
    with pytest.raises(DataFormatError, match=r"bad.npz: T\[4, 2, :\] sums to 1.5"):
        TabularMDPDataModule(source="real", data_dir=str(tmp_path), filename="bad.npz").setup("fit")
    np.savez(tmp_path / "nop0.npz", T=T.numpy())
    with pytest.raises(DataFormatError, match=r"missing array\(s\) \['p0'\]"):
        TabularMDPDataModule(source="real", data_dir=str(tmp_path), filename="nop0.npz").setup("fit")
    with pytest.raises(MissingDataError, match="absent.npz"):
        TabularMDPDataModule(source="real", data_dir=str(tmp_path), filename="absent.npz").setup("fit")


# -- the baselines' official update --------------------------------------------------------------------------------
def test_official_baseline_update_on_a_three_state_fixture():
    """One step of the official update on a 3-state, 2-action MDP, against values derived by hand: action 0 stays,
    action 1 moves to the next state (mod 3); uniform policy; state reward r = (1, 0, 0); gamma = 1/2.
    P_pi: from s, stay w.p. 1/2, move to s+1 w.p. 1/2. V solves V = r + (1/2)(V(s)/2 + V(s+1)/2):
      V0 = 1 + V0/4 + V1/4,  V1 = V1/4 + V2/4,  V2 = V2/4 + V0/4  ->  V1 = V2/3, V2 = V0/3  ->  V0 = 36/26 = 18/13,
      V2 = 6/13, V1 = 2/13. Q(s, 0) = r(s) + V(s)/2, Q(s, 1) = r(s) + V(s+1)/2."""
    S, A, gamma, lr = 3, 2, 0.5, 0.1
    T = torch.zeros(S, A, S, dtype=torch.float64)
    for s in range(S):
        T[s, 0, s] = 1.0
        T[s, 1, (s + 1) % S] = 1.0
    r = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    V = torch.tensor([18 / 13, 2 / 13, 6 / 13], dtype=torch.float64)
    Q = torch.stack([r + V / 2, r + V.roll(-1) / 2], 1)
    p_s = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    theta = torch.zeros(S, A, dtype=torch.float64) + lr * p_s[:, None] * Q  # one ascent step from uniform logits
    expected = torch.log_softmax(theta, 1)  # the reset: log(pi), pi = softmax(theta)
    got = tb.official_pg_ascent(torch.zeros(S, A, dtype=torch.float64), T, gamma, r, p_s, lr, 1)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    from ops.semdice import fused

    got_np = fused.official_pg_ascent(np.zeros((S, A)), T.numpy(), gamma, r.numpy(), p_s.numpy(), lr, 1)
    np.testing.assert_allclose(got_np, expected.numpy(), rtol=0, atol=1e-12)
    # the hand values: state 0 prefers staying (Q = 1 + 9/13 vs 1 + 1/13), state 2 moving (to state 0)
    assert got[0, 0] > got[0, 1] and got[2, 1] > got[2, 0]


def test_official_update_fused_equals_torch_twin_over_many_steps():
    g = torch.Generator().manual_seed(3)
    T = tb.random_mdp(6, 3, 3, 1.0, 0)[0]
    r = torch.rand(6, 3, generator=g, dtype=torch.float64)
    p_s = torch.rand(6, generator=g, dtype=torch.float64)
    p_s /= p_s.sum()
    logits = torch.randn(6, 3, generator=g, dtype=torch.float64)
    from ops.semdice import fused

    a = tb.official_pg_ascent(logits, T, 0.95, r, p_s, 0.01, 100)
    b = fused.official_pg_ascent(logits.numpy(), T.numpy(), 0.95, r.numpy(), p_s.numpy(), 0.01, 100)
    np.testing.assert_allclose(b, a.numpy(), rtol=0, atol=1e-12)


def test_official_density_reward_and_discounted_distribution():
    # -log p_s min-max normalised: the rarest state gets 1, the most frequent 0
    r = tb.official_density_reward(torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64))
    torch.testing.assert_close(r, torch.tensor([0.0, float(np.log(3.5) / np.log(7)), 1.0], dtype=torch.float64))
    counts = torch.zeros(2, 1, 2, dtype=torch.float64)
    counts[0, 0, 1] = 1.0  # t = 0
    counts[1, 0, 0] = 0.5  # t = 1 at gamma = 0.5
    expected = torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)
    torch.testing.assert_close(tb.discounted_state_distribution(counts), expected, rtol=0, atol=1e-9)


def test_datamodule_keeps_discounted_counts(tmp_path):
    _, dm, _ = _fit(tmp_path, "model.kind=uniform", epochs=1)
    # each 100-step trajectory adds sum_t gamma^t to the discounted counts
    expected = dm.num_collected * sum(dm.gamma**t for t in range(dm.horizon))
    assert abs(float(dm.discounted_counts.sum()) - expected) < 1e-9
    assert float(dm.counts.sum()) == dm.num_collected * dm.horizon
    state = dm.state_dict()
    fresh = TabularMDPDataModule()
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.discounted_counts, dm.discounted_counts)


@pytest.mark.parametrize("kind", ["pb_s", "cb_s", "cb_sa"])
def test_baselines_default_to_the_official_update_and_fused_equals_torch(tmp_path, kind):
    fused_m, dm, _ = _fit(tmp_path / "f", f"model.kind={kind}", epochs=1)
    assert fused_m.baseline_update == "official"
    naive_m, _, _ = _fit(tmp_path / "n", f"model.kind={kind}", "model.fused=false", epochs=1)
    torch.testing.assert_close(fused_m.policy, naive_m.policy, rtol=0, atol=1e-10)
    # the logits were reset to log pi after the last trajectory's steps
    torch.testing.assert_close(fused_m.logits.detach(), torch.log(fused_m.policy + 1e-100), rtol=0, atol=1e-12)
    if kind == "pb_s":  # the official reward: -log p_s of the discounted data distribution, in [0, 1]
        assert float(fused_m.reward.min()) == 0.0 and float(fused_m.reward.max()) == 1.0
    exact, _, _ = _fit(tmp_path / "e", f"model.kind={kind}", "model.baseline_update=exact", epochs=1)
    assert float((exact.policy - fused_m.policy).abs().max()) > 1e-3  # a different update


def test_bad_baseline_update_is_one_line():
    with pytest.raises(ConfigError, match="model.baseline_update='pg'"):
        SemdiceLitModule(baseline_update="pg")
