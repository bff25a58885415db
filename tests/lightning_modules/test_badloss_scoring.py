"""BaDLoss scoring vs sklearn (NearestNeighbors, KNeighborsClassifier, roc_auc_score) on random trajectories, the
fast kNN vs its naive twin (float64 outputs and gradients), epoch filter, ranks, rejection, and the baselines."""

from __future__ import annotations

from pathlib import Path

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
    assert rows["none"][2] == "40.00 ± 14.14"  # mean ASR, sample std over seeds (as the final-metrics table)
    assert rows["badloss"][4] == "7.50 ± 3.54"  # costs 0.90 - 0.85 and 0.80 - 0.70, paired by seed
    det = detection_table(records).splitlines()
    assert len(det) == 3 and det[2].startswith("| badloss | 85.00 ± 7.07 | 95.00 ± 7.07")


def test_claim_verdicts_need_implanted_attacks_and_a_plateau():
    from types import SimpleNamespace

    from reports.badloss import verdicts

    flat = {"val/loss": [(0, 1.0), (10, 0.5), (20, 0.5)]}

    def rec(name, seed, acc, asr, patch, curves=flat):
        m = {"test/acc": acc, "test/asr_mean": asr, "test/asr_patch": patch, "test/asr_sinusoid": 0.0}
        return SimpleNamespace(name=name, seed=seed, metrics=m, curves=curves)

    records = [rec("none", s, 0.90, 0.45, 0.9) for s in range(3)]
    records += [rec("badloss", s, 0.89 - 0.001 * s, 0.02 + 0.001 * s, 0.03) for s in range(3)]
    records += [rec("spectral", s, 0.88, 0.30 + 0.01 * s, 0.6) for s in range(3)]
    v = verdicts(records, {"sizing_metric": "val/loss"})
    assert [x.verdict for x in v] == ["reproduced", "reproduced", "reproduced"]
    assert "1 of 2 attacks implanted in `none` (ASR >= 50%: patch)" in v[0].evidence
    assert "average other defence" in v[1].claim and "vs the average of spectral" in v[1].evidence
    # a weak, still-learning defence in the average makes that row untested; the best-defence row does not use it
    falling = {"val/loss": [(0, 1.0), (10, 0.8), (20, 0.6)]}
    with_abl = records + [rec("abl", s, 0.88, 0.80 + 0.01 * s, 0.9, falling) for s in range(3)]
    v = verdicts(with_abl, {"sizing_metric": "val/loss"})
    assert [x.verdict for x in v] == ["reproduced", "inconclusive: underfit", "reproduced"]
    assert "vs the average of spectral, abl 0.56" in v[1].evidence and "not converged: abl" in v[1].evidence
    no_attack = [rec(r.name, r.seed, r.metrics["test/acc"], 0.01, 0.02) for r in records]
    assert verdicts(no_attack, {"sizing_metric": "val/loss"})[0].verdict == "inconclusive: phenomenon absent"
    one_point = [rec(r.name, r.seed, r.metrics["test/acc"], r.metrics["test/asr_mean"], 0.9, {"val/loss": [(20, 0.5)]})
                 for r in records]  # fmt: skip
    assert {x.verdict for x in verdicts(one_point, {"sizing_metric": "val/loss"})} == {"inconclusive: underfit"}


def test_claim_4x_check_of_none_settles_or_fails_the_clean_cost():
    """``none_long`` (the undefended model trained 4x the epochs) settles ``none`` when the plateau rule reads its
    noisy constant-LR curve as still improving and the 4x run gains less clean test accuracy than the seed spread;
    a larger gain makes the clean-cost row underfit. The 4x runs never enter a claim as a defence."""
    from types import SimpleNamespace

    from reports.badloss import claim_report, convergence, verdicts

    flat = {"val/loss": [(0, 1.0), (10, 0.5), (20, 0.5)]}
    noisy = {"val/loss": [(0, 1.0), (10, 0.30), (16, 0.33), (20, 0.30)]}  # last 20%: -0.03, more than the spread

    def rec(name, seed, acc, asr=0.9, curves=flat):
        m = {"test/acc": acc, "test/asr_mean": asr, "test/asr_patch": asr}
        return SimpleNamespace(name=name, seed=seed, metrics=m, curves=curves, path=".")

    accs = [0.890, 0.880, 0.885]  # seed spread (std) 0.005
    records = [rec("none", s, a, curves=noisy) for s, a in enumerate(accs)]
    records += [rec("badloss", s, a - 0.02, asr=0.05) for s, a in enumerate(accs)]
    records += [rec("spectral", s, a - 0.01, asr=0.20) for s, a in enumerate(accs)]
    spec = {"sizing_metric": "val/loss"}
    judged, checks = convergence(records, spec)
    assert not judged["none"][0] and judged["none"][1].startswith("still improving") and checks == {}
    assert verdicts(records, spec)[2].verdict == "inconclusive: underfit"
    assert "not converged: none (see sizing)" in verdicts(records, spec)[2].evidence
    settled = records + [
        rec("none_long", s, a + d, asr=0.99) for s, a, d in zip(range(3), accs, (0.002, -0.003, 0.001))
    ]
    judged, checks = convergence(settled, spec)
    assert checks["none"][0] and judged["none"][0] and "which settles it" in judged["none"][1]
    v = verdicts(settled, spec)
    assert [x.verdict for x in v] == ["reproduced"] * 3  # BaDLoss ASR below spectral; cost 2 points < 5
    assert "best other defence spectral" in v[0].evidence and "none_long" not in v[0].evidence + v[1].evidence
    assert "none and badloss converged" in v[2].evidence
    page = claim_report(settled, Path("."), spec)
    assert "* none: converged: still improving" in page and "| none_long | 3 |" in page
    gains = records + [rec("none_long", s, a + 0.02) for s, a in enumerate(accs)]
    judged, _ = convergence(gains, spec)
    assert not judged["none"][0] and "improves test/acc by 0.02" in judged["none"][1]
    assert verdicts(gains, spec)[2].verdict == "inconclusive: underfit"


def test_claim_4x_check_of_a_defence_also_pairs_its_mean_asr():
    """``abl_long`` (ABL's detection, then 4x the retraining) settles ``abl`` only when neither its clean accuracy
    nor its mean ASR moves (either way) by more than the seed spread: the verdicts compare that ASR. ``none``'s
    ASR is not checked (its verdicts use only its clean accuracy)."""
    from types import SimpleNamespace

    from reports.badloss import claim_report, convergence, verdicts

    flat = {"val/loss": [(0, 1.0), (10, 0.5), (20, 0.5)]}
    noisy = {"val/loss": [(0, 1.0), (10, 0.30), (16, 0.33), (20, 0.30)]}

    def rec(name, seed, acc, asr, curves=flat):
        m = {"test/acc": acc, "test/asr_mean": asr, "test/asr_patch": asr}
        return SimpleNamespace(name=name, seed=seed, metrics=m, curves=curves, path=".")

    records = [rec("none", s, 0.88 + 0.005 * s, 0.9) for s in range(3)]
    records += [rec("none_long", s, 0.88 + 0.005 * s, 0.2) for s in range(3)]  # none's ASR falls: not checked
    records += [rec("badloss", s, 0.86, 0.05 + 0.01 * s) for s in range(3)]
    records += [rec("spectral", s, 0.87, 0.20 + 0.01 * s) for s in range(3)]
    abl = [rec("abl", s, 0.87 + 0.005 * s, 0.60 + 0.05 * s, noisy) for s in range(3)]  # ASR spread ~0.041
    spec = {"sizing_metric": "val/loss"}
    judged, checks = convergence(records + abl, spec)
    assert judged["none"][0] and "mean ASR" not in checks["none"][1]
    assert not judged["abl"][0] and "abl" not in checks  # no 4x run: the noisy curve reads as still improving
    # same accuracy, ASR 0.01 lower at 4x: both within the spread, so the 4x run settles ABL
    steady = [rec("abl_long", s, 0.87 + 0.005 * s, 0.59 + 0.05 * s) for s in range(3)]
    judged, checks = convergence(records + abl + steady, spec)
    assert checks["abl"][0] and judged["abl"][0] and "which settles it" in judged["abl"][1]
    assert "clean accuracy: " in checks["abl"][1] and "; mean ASR: " in checks["abl"][1]
    v = verdicts(records + abl + steady, spec)
    assert v[1].verdict == "reproduced" and "every averaged entry converged" in v[1].evidence
    assert "clean accuracy: " in claim_report(records + abl + steady, Path("."), spec)
    # same accuracy, but 4x the retraining lowers ABL's ASR by 0.2 (spread ~0.041): not converged, row untested
    falls = [rec("abl_long", s, 0.87 + 0.005 * s, 0.40 + 0.05 * s) for s in range(3)]
    judged, checks = convergence(records + abl + falls, spec)
    assert not checks["abl"][0] and not judged["abl"][0] and "mean ASR: " in judged["abl"][1]
    assert verdicts(records + abl + falls, spec)[1].verdict == "inconclusive: underfit"
    # a rising ASR at 4x (the kept poisons implant with more epochs) is no convergence either: two-sided
    rises = [rec("abl_long", s, 0.87 + 0.005 * s, 0.80 + 0.05 * s) for s in range(3)]
    judged, checks = convergence(records + abl + rises, spec)
    assert not judged["abl"][0] and "worsens test/asr_mean by 0.2" in checks["abl"][1]


def test_knn_distances_are_float64_whatever_the_input():
    """Issue 18 item 3: on float32 loss-sized trajectories the matrix-product cdist gave self-distances of ~0.008 and
    swapped neighbour ranks; distances are now float64 differences, so a copy is at distance exactly 0."""
    g = torch.Generator().manual_seed(0)
    ref = (2.3 + 0.01 * torch.rand(60, 30, generator=g)).float()  # > 25 rows: where cdist switches to matmul
    query = (2.3 + 0.01 * torch.rand(50, 30, generator=g)).float()
    query[:10] = ref[:10]
    d1 = scoring.knn_mean_distance(query, ref, 1)
    assert d1.dtype == torch.float64 and d1[:10].tolist() == [0.0] * 10
    exact = ((query.double()[:, None] - ref.double()[None]) ** 2).sum(-1).sqrt()  # [50, 60] by hand
    np.testing.assert_allclose(
        scoring.knn_mean_distance(query, ref, 5).numpy(), exact.sort(1).values[:, :5].mean(1).numpy(), atol=1e-12
    )
    nearest = scoring.pairwise_distances(query, ref).argsort(1)[:, :5]
    assert torch.equal(nearest, exact.argsort(1)[:, :5])
    bd = ref[30:] + 0.001
    votes = scoring.two_class_scores(query, ref[:30], bd, k=1)
    assert votes.dtype == torch.float64 and votes[:10].tolist() == [0.0] * 10  # own copy is the nearest (clean)


def test_activation_clustering_uses_fastica():
    """Issue 18 item 4: FastICA before 2-means (Chen et al.). Fixture: three unimodal directions of std 10 and one
    bimodal direction (20 poisons at +3, std 0.3): PCA keeps the raw scales, so 2-means splits a std-10 Gaussian and
    both halves pass the 35% size test (nothing removed); ICA whitens to unit variance, where the bimodal direction
    is the best 2-means split and exactly the 20 poisons form the small cluster."""
    g = torch.Generator().manual_seed(0)
    f = torch.randn(200, 4, generator=g, dtype=torch.float64) * torch.tensor([10.0, 10.0, 10.0, 0.3])
    y = torch.cat([torch.zeros(100), torch.ones(100)]).long()
    bad = torch.arange(100, 120)
    f[bad, 3] += 3.0
    _, remove = baselines.activation_clustering(f, y, n_components=4)
    assert torch.nonzero(remove).squeeze(1).tolist() == bad.tolist()
    _, remove_pca = baselines.activation_clustering(f, y, n_components=4, reduction="pca")
    assert int(remove_pca.sum()) == 0
    # the default path is sklearn's FastICA (10 components, all-zero columns dropped), then KMeans
    from sklearn.cluster import KMeans
    from sklearn.decomposition import FastICA

    x = f[100:].numpy()
    z = FastICA(n_components=4, whiten="unit-variance", random_state=0, max_iter=400, tol=1e-4).fit_transform(x)
    np.testing.assert_allclose(baselines.reduce_features(np.c_[x, np.zeros(100)], 10), z, atol=1e-10)
    assign = KMeans(n_clusters=2, n_init=5, random_state=0).fit_predict(z)
    assert set(np.nonzero(assign == np.argmin(np.bincount(assign)))[0] + 100) == set(bad.tolist())
    with pytest.raises(ConfigError, match="ac_reduction"):
        baselines.activation_clustering(f, y, reduction="svd")
