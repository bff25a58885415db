"""BaDLoss scoring vs sklearn (NearestNeighbors, KNeighborsClassifier, roc_auc_score) on random trajectories, the
fast kNN vs its naive twin (float64 outputs and gradients), epoch filter, ranks, rejection, and the baselines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from sklearn.neighbors import KNeighborsClassifier, NearestNeighbors

from lightning_modules.badloss import baselines, scoring
from suite.errors import ConfigError


def trajectories(n: int = 120, m: int = 60, e: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, e, generator=g, dtype=torch.float64) * 3, torch.rand(
        m, e, generator=g, dtype=torch.float64
    ) * 3


@pytest.mark.parametrize("k", [1, 7, 50])
def test_knn_distance_matches_sklearn_and_naive(k):
    traj, clean = trajectories()
    dist, _ = NearestNeighbors(n_neighbors=k).fit(clean.numpy()).kneighbors(traj.numpy())
    fast = scoring.knn_mean_distance(traj, clean, k)
    np.testing.assert_allclose(fast.numpy(), dist.mean(1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scoring.knn_mean_distance_naive(traj, clean, k).numpy(), dist.mean(1), atol=1e-12)


def test_knn_gradients_match_naive():
    traj, clean = trajectories(n=20, m=15, e=6)
    grads = []
    for fn in (scoring.knn_mean_distance, scoring.knn_mean_distance_naive):
        q, r = traj.clone().requires_grad_(True), clean.clone().requires_grad_(True)
        (fn(q, r, 5) * torch.linspace(0.5, 1.5, 20, dtype=torch.float64)).sum().backward()
        grads.append((q.grad, r.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        assert float(a.abs().sum()) > 0


@pytest.mark.parametrize("log", [True, False])
def test_anomaly_scores_match_sklearn_recipe(log):
    traj, clean = trajectories(seed=1)
    dist, _ = NearestNeighbors(n_neighbors=50).fit(clean.numpy()).kneighbors(traj.numpy())
    d = dist.mean(1)
    s = np.log(0.01 + d) if log else d
    expected = (s - s.min()) / (s.max() - s.min())
    got = scoring.anomaly_scores(traj, clean, k=50, eps=0.01, log=log)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)
    assert float(got.min()) == 0.0 and float(got.max()) == 1.0


def test_two_class_scores_match_kneighbors_classifier():
    traj, clean = trajectories(seed=2)
    _, bd = trajectories(m=30, seed=3)
    bd = bd + 0.5
    ref = np.concatenate([clean.numpy(), bd.numpy()])
    lab = np.r_[np.zeros(len(clean)), np.ones(len(bd))]
    proba = KNeighborsClassifier(n_neighbors=20).fit(ref, lab).predict_proba(traj.numpy())[:, 1]
    np.testing.assert_allclose(scoring.two_class_scores(traj, clean, bd, k=20).numpy(), proba, atol=1e-12)


def test_filter_epochs_drops_spikes():
    means = [2.0, 1.0, 0.8, 0.7, 3.0, 0.6, 0.5, 1.3, 0.4]
    traj = torch.tensor(means, dtype=torch.float64).repeat(5, 1)
    # epoch 4 (3.0 >= 2 * mean(1.0, 0.8, 0.7)) and epoch 7 (1.3 >= 2 * mean(0.7, 0.6, 0.5)) are spikes.
    assert scoring.filter_epochs(traj) == [0, 1, 2, 3, 5, 6, 8]
    assert scoring.filter_epochs(traj[:, :2]) == [0, 1]


def test_ranks_and_rejection():
    scores = torch.tensor([0.3, 0.9, 0.1, 0.5, 0.7])
    ranks = scoring.scores_to_ranks(scores)
    np.testing.assert_allclose(ranks.numpy(), [0.25, 1.0, 0.0, 0.5, 0.75])
    assert scoring.select_keep(ranks, 0.4).tolist() == [0, 2, 3]  # the two highest scores go
    assert scoring.select_keep(ranks, 0.0).tolist() == [0, 1, 2, 3, 4]
    s = torch.rand(1000, generator=torch.Generator().manual_seed(0))
    assert len(scoring.select_keep(scoring.scores_to_ranks(s), 0.4)) == 600
    with pytest.raises(ConfigError, match="reject_frac=1.0"):
        scoring.select_keep(ranks, 1.0)
    with pytest.raises(ConfigError, match="model.k=51"):
        scoring.knn_mean_distance(torch.rand(3, 2), torch.rand(50, 2), 51)


def test_roc_auc_matches_sklearn():
    s = torch.rand(200, generator=torch.Generator().manual_seed(0))
    p = s + 0.3 * torch.randn(200, generator=torch.Generator().manual_seed(1)) > 0.7
    assert scoring.roc_auc(s, p) == pytest.approx(roc_auc_score(p.numpy(), s.numpy()), abs=1e-12)
    assert np.isnan(scoring.roc_auc(s, torch.zeros(200, dtype=torch.bool)))


def planted(n_per_class: int = 100, n_bad: int = 8, d: int = 16, seed: int = 0):
    """Two classes of Gaussian features; class 1 holds ``n_bad`` examples shifted along one direction."""
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(2 * n_per_class, d, generator=g, dtype=torch.float64)
    y = torch.cat([torch.zeros(n_per_class), torch.ones(n_per_class)]).long()
    bad = torch.arange(n_per_class, n_per_class + n_bad)
    f[bad, 0] += 8.0
    return f, y, bad


def test_spectral_signatures_remove_planted_outliers():
    f, y, bad = planted()
    score, remove = baselines.spectral_signatures(f, y, eps=0.1)
    assert int(remove.sum()) == 2 * 15  # 1.5 * eps of each class
    assert bool(remove[bad].all())
    assert roc_auc_score(np.isin(np.arange(200), bad.numpy()), score.numpy()) > 0.95


def test_activation_clustering_flags_small_cluster_only():
    f, y, bad = planted(n_bad=20)
    f[bad, 1] += 8.0
    score, remove = baselines.activation_clustering(f, y, n_components=4, size_threshold=0.35)
    assert set(torch.nonzero(remove).squeeze(1).tolist()) == set(bad.tolist())
    assert float(score[bad].min()) > float(score[~remove].max())


def test_abl_isolation_and_lga():
    losses = torch.tensor([0.5, 0.01, 2.0, 0.02, 1.0, 0.3, 0.9, 1.1, 0.7, 0.6])
    _, remove = baselines.abl_isolation(losses, 0.2)
    assert torch.nonzero(remove).squeeze(1).tolist() == [1, 3]
    assert float(baselines.abl_lga_loss(torch.tensor(0.2), 0.5)) == pytest.approx(-0.2)
    assert float(baselines.abl_lga_loss(torch.tensor(0.9), 0.5)) == pytest.approx(0.9)


def test_claim_report_pairs_the_clean_accuracy_cost_by_seed():
    from types import SimpleNamespace

    from reports.badloss import detection_table, summary_table

    def rec(name, seed, **m):
        return SimpleNamespace(name=name, seed=seed, metrics={k.replace("__", "/"): v for k, v in m.items()})

    records = [
        rec("none", 0, test__acc=0.90, test__asr_mean=0.5),
        rec("none", 1, test__acc=0.80, test__asr_mean=0.3),
        rec("badloss", 1, test__acc=0.70, test__asr_mean=0.1, detect__auc=0.9, detect__auc_patch=1.0),
        rec("badloss", 0, test__acc=0.85, test__asr_mean=0.1, detect__auc=0.8, detect__auc_patch=0.9),
    ]
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in summary_table(records).splitlines()[2:]}
    assert rows["none"][2] == "40.00 ± 10.00"  # mean ASR
    assert rows["badloss"][4] == "7.50 ± 2.50"  # costs 0.90 - 0.85 and 0.80 - 0.70, paired by seed
    det = detection_table(records).splitlines()
    assert len(det) == 3 and det[2].startswith("| badloss | 85.00 ± 5.00 | 95.00 ± 5.00")
