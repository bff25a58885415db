"""BaDLoss scoring vs sklearn (NearestNeighbors, KNeighborsClassifier, roc_auc_score) on random trajectories, the
fast kNN vs its naive twin (float64 outputs and gradients), epoch filter, ranks, rejection, and the baselines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from sklearn.neighbors import KNeighborsClassifier, NearestNeighbors

from core.errors import ConfigError
from lightning_modules.badloss import baselines, scoring


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


FLAT = [(0, 1.0), (5, 0.6), (10, 0.5), (15, 0.5), (20, 0.5)]  # best-so-far val/loss flat over the last 20%
NOISY = [(0, 1.0), (10, 0.30), (16, 0.33), (18, 0.29), (20, 0.28)]  # a new best in the last 20%: still improving


def _rec(name, seed, acc, asr, patch=None, curve=FLAT, **extra):
    """A run record of the claim: ``test/asr_patch`` (``patch``, default ``asr``) and ``test/asr_sinusoid`` (0) are
    its attacks; the data follow the seed (the default pairing)."""
    from suite.compare import RunRecord

    metrics = {
        "test/acc": acc,
        "test/asr_mean": asr,
        "test/asr_patch": asr if patch is None else patch,
        "test/asr_sinusoid": 0.0,
        **{k.replace("__", "/"): v for k, v in extra.items()},
    }
    defence = name.removesuffix("_long")
    config = {"data": {"seed": seed}, "model": {"defence": defence, "detect_epochs": 0 if defence == "none" else 2}}
    return RunRecord(Path("."), name, seed, metrics, {"val/loss": curve}, config)


def _judge(records, tmp_path):
    from suite.claim import judge_page, load_spec
    from suite.claims import ClaimSpec

    verdicts, _, result, hook_md, conv, _ = judge_page(
        ClaimSpec.from_dict("badloss", load_spec("badloss")), records, tmp_path
    )
    assert not hook_md  # the hook returns data, and did not fail
    return {v.id: v for v in verdicts}, result, conv


def _base():
    records = [_rec("none", s, 0.90 + 0.001 * s, 0.45, patch=0.9) for s in range(3)]
    records += [_rec("badloss", s, 0.88 - 0.002 * s, 0.02 + 0.001 * s, patch=0.03) for s in range(3)]
    records += [_rec("spectral", s, 0.88, 0.30 + 0.01 * s, patch=0.6) for s in range(3)]
    return records


def test_claim_tables_pair_the_clean_accuracy_cost_by_seed():
    from reports.badloss import asr_table, detection_table, summary_table

    records = [
        _rec("none", 0, 0.90, 0.5),
        _rec("none", 1, 0.80, 0.3),
        _rec("badloss", 1, 0.70, 0.1, detect__auc=0.9, detect__auc_patch=1.0),
        _rec("badloss", 0, 0.85, 0.1, detect__auc=0.8, detect__auc_patch=0.9),
    ]
    t = summary_table(records)
    rows = {r[0]: r for r in t.rows}
    assert rows["none"][2] == "40 ± 14 (n=2)"  # mean ASR in %, sample sd over seeds
    assert rows["badloss"][4] == "7.5 ± 3.5 (n=2)"  # costs 0.90 - 0.85 and 0.80 - 0.70, paired by seed
    assert rows["none"][4] == "0" and rows["none"][5] == "—"
    det = detection_table(records)
    assert det.columns == ["defence", "AUC (all)", "AUC patch"]
    assert det.rows == [["badloss", "85 ± 7.1 (n=2)", "95 ± 7.1 (n=2)"]]  # `none` has no detection
    assert asr_table(records).columns[3:5] == ["ASR patch", "ASR sinusoid"]


def test_claim_asr_verdicts_need_implanted_attacks_and_converged_entries(tmp_path):
    by_id, result, conv = _judge(_base(), tmp_path)
    avg, best, cost = by_id["asr_vs_average_defence"], by_id["asr_vs_best_defence"], by_id["clean_cost_modest"]
    assert [v.id for v in by_id.values()][0] == "asr_vs_average_defence" and avg.primary and not best.primary
    assert avg.verdict == best.verdict == "reproduced" and avg.paired and best.paired and avg.n == (3, 3)
    assert avg.diff == pytest.approx(0.289) and avg.lo > 0
    assert avg.published == pytest.approx(0.6344 - 0.0798)  # the paper's gap, signed like diff (lower ASR: +)
    assert avg.against == ("spectral",) and best.entries == ("badloss", "spectral")
    assert avg.evidence == best.evidence == "1 of 2 attacks implanted in `none` (mean ASR >= 50%): patch"
    # clean cost 2-2.6 points, paired by seed: inside the 5-point non-inferiority margin
    assert cost.verdict == "reproduced" and cost.kind == "non_inferior" and cost.paired
    assert cost.diff == pytest.approx(-0.023) and cost.lo > -0.05
    # a still-improving ABL in the average makes that claim underfit; the best-defence claim does not read ABL
    rising = [(0, 1.0), (5, 0.9), (10, 0.8), (15, 0.7), (20, 0.6)]
    by_id, _, _ = _judge(
        _base() + [_rec("abl", s, 0.88, 0.80 + 0.01 * s, patch=0.9, curve=rising) for s in range(3)], tmp_path
    )
    assert by_id["asr_vs_average_defence"].verdict == "inconclusive: underfit"
    assert "abl: still improving" in by_id["asr_vs_average_defence"].why
    assert by_id["asr_vs_average_defence"].against == ("spectral", "abl")
    assert by_id["asr_vs_best_defence"].verdict == "reproduced"
    # no attack implanted in `none`: nothing for a defence to remove
    absent = [_rec(r.name, r.seed, r.metrics["test/acc"], 0.01, patch=0.02) for r in _base()]
    by_id, _, _ = _judge(absent, tmp_path)
    assert (
        by_id["asr_vs_average_defence"].verdict
        == by_id["asr_vs_best_defence"].verdict
        == ("inconclusive: phenomenon absent")
    )
    assert by_id["clean_cost_modest"].verdict == "reproduced"  # the cost needs no attack


def test_claim_convergence_reads_the_retraining_phase(tmp_path):
    """A defended run validates its detection model first: its best val/loss there must not hide a retraining
    that is still improving (detect_epochs = 2 validation points here)."""
    detect_best = [(0, 0.2), (1, 0.1), (2, 1.0), (10, 0.8), (20, 0.6)]  # best-so-far of the whole curve: flat
    records = [r for r in _base() if r.name != "spectral"]
    records += [_rec("spectral", s, 0.88, 0.30 + 0.01 * s, curve=detect_best) for s in range(3)]
    by_id, _, conv = _judge(records, tmp_path)
    assert not conv["spectral"][0] and conv["spectral"][1].startswith("still improving")
    assert conv["none"][0] and conv["badloss"][0]
    assert by_id["asr_vs_best_defence"].verdict == "inconclusive: underfit"


def test_claim_4x_check_of_none_settles_or_fails_the_clean_cost(tmp_path):
    """``none_long`` (4x the epochs) settles ``none`` when the rule reads its noisy constant-LR curve as still
    improving and the 4x run moves clean test accuracy by at most 1%; a larger gain leaves the clean cost underfit.
    The 4x runs never enter a claim as a defence."""
    accs = [0.890, 0.880, 0.885]
    records = [_rec("none", s, a, 0.9, curve=NOISY) for s, a in enumerate(accs)]
    records += [_rec("badloss", s, a - 0.02 - 0.001 * s, 0.05) for s, a in enumerate(accs)]
    records += [_rec("spectral", s, a - 0.01, 0.20 + 0.01 * s) for s, a in enumerate(accs)]
    by_id, _, conv = _judge(records, tmp_path)
    assert not conv["none"][0] and conv["none"][1].startswith("still improving")
    assert (
        by_id["clean_cost_modest"].verdict == "inconclusive: underfit"
        and "none: still" in by_id["clean_cost_modest"].why
    )
    steady = [_rec("none_long", s, a + d, 0.99) for s, a, d in zip(range(3), accs, (0.002, -0.003, 0.001))]
    by_id, _, conv = _judge(records + steady, tmp_path)
    assert conv["none"][0] and "which settles it" in conv["none"][1]
    assert by_id["clean_cost_modest"].verdict == "reproduced"
    assert by_id["asr_vs_best_defence"].entries == ("badloss", "spectral")  # not none_long
    assert by_id["asr_vs_average_defence"].against == ("spectral",)
    gains = [_rec("none_long", s, a + 0.02, 0.9) for s, a in enumerate(accs)]
    by_id, _, conv = _judge(records + gains, tmp_path)
    assert not conv["none"][0] and "improves test/acc by 0.02" in conv["none"][1]
    assert by_id["clean_cost_modest"].verdict == "inconclusive: underfit"


def test_claim_4x_check_of_a_defence_also_pairs_its_mean_asr(tmp_path):
    """``abl_long`` (ABL's isolation, then 4x the retraining) settles ``abl`` only when neither its clean accuracy
    nor its mean ASR moves (either way) by more than 1% of its value: the verdicts compare that ASR. ``none``'s ASR
    is not checked (its claims use only its clean accuracy)."""
    from reports.badloss import convergence
    from suite.claim import load_spec
    from suite.claims import ClaimSpec

    spec = ClaimSpec.from_dict("badloss", load_spec("badloss"))
    records = [_rec("none", s, 0.88 + 0.005 * s, 0.9) for s in range(3)]
    records += [_rec("none_long", s, 0.88 + 0.005 * s, 0.2) for s in range(3)]  # none's ASR falls: not checked
    records += [_rec("badloss", s, 0.86, 0.05 + 0.01 * s) for s in range(3)]
    records += [_rec("spectral", s, 0.87, 0.20 + 0.01 * s) for s in range(3)]
    abl = [_rec("abl", s, 0.87 + 0.005 * s, 0.60 + 0.05 * s, curve=NOISY) for s in range(3)]
    judged, checks = convergence(records + abl, spec)
    assert judged["none"][0] and "mean ASR" not in checks["none"][1]
    assert not judged["abl"][0] and "abl" not in checks  # no 4x run: the noisy curve reads as still improving
    steady = [_rec("abl_long", s, 0.87 + 0.005 * s, 0.597 + 0.05 * s) for s in range(3)]  # ASR -0.003: within 1%
    judged, checks = convergence(records + abl + steady, spec)
    assert checks["abl"][0] and judged["abl"][0] and "which settles it" in judged["abl"][1]
    assert "clean accuracy: " in checks["abl"][1] and "; mean ASR: " in checks["abl"][1]
    by_id, _, _ = _judge(records + abl + steady, tmp_path)
    assert by_id["asr_vs_average_defence"].verdict == "reproduced"
    falls = [_rec("abl_long", s, 0.87 + 0.005 * s, 0.40 + 0.05 * s) for s in range(3)]
    judged, checks = convergence(records + abl + falls, spec)
    assert not checks["abl"][0] and not judged["abl"][0] and "mean ASR: " in judged["abl"][1]
    by_id, _, _ = _judge(records + abl + falls, tmp_path)
    assert by_id["asr_vs_average_defence"].verdict == "inconclusive: underfit"
    rises = [_rec("abl_long", s, 0.87 + 0.005 * s, 0.80 + 0.05 * s) for s in range(3)]  # kept poisons implant
    judged, checks = convergence(records + abl + rises, spec)
    assert not judged["abl"][0] and "worsens test/asr_mean by 0.2" in checks["abl"][1]


def test_claim_trajectory_plot_needs_its_npz(tmp_path):
    """The plot reads ``badloss_detection.npz`` (binary, not kept as data): without it, a note and no figure."""
    from reports.badloss import claim_report
    from suite.claim import load_spec
    from suite.claims import ClaimSpec
    from suite.compare import RunRecord

    spec = ClaimSpec.from_dict("badloss", load_spec("badloss"))
    result = claim_report(_base(), spec, tmp_path)
    assert not result.figures and any("badloss_detection.npz" in n for n in result.notes)
    run = tmp_path / "run"
    run.mkdir()
    g = np.random.default_rng(0)
    np.savez(
        run / "badloss_detection.npz",
        trajectories=g.random((12, 5)),
        poison_attack=np.r_[[-1] * 8, 0, 0, 1, 1],
        probe_kind=np.r_[[0] * 6, 1, 1, [0] * 4],
        attack_names=np.array(["patch", "blend_r"]),
    )
    records = [r for r in _base() if not (r.name == "badloss" and r.seed == 0)]
    records.append(RunRecord(run, "badloss", 0, {"test/acc": 0.88, "test/asr_mean": 0.02}))
    result = claim_report(records, spec, tmp_path)
    assert [f.path.name for f in result.figures] == ["badloss_trajectories.png"] and result.figures[0].path.exists()
    assert not any("badloss_detection.npz" in n for n in result.notes)


def test_knn_distances_are_float64_whatever_the_input():
    """kNN distances are float64 differences, so a copy is at distance exactly 0 (on float32 loss-sized trajectories
    the matrix-product cdist gives self-distances of ~0.008 and swaps neighbour ranks)."""
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
    """FastICA before 2-means (Chen et al.). Fixture: three unimodal directions of std 10 and one
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
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA, FastICA

    # PCA in its place: 2-means splits a std-10 direction and both halves pass the size test
    zp = PCA(n_components=4, random_state=0).fit_transform(f[100:].numpy() - f[100:].numpy().mean(0))
    assert np.bincount(KMeans(n_clusters=2, n_init=5, random_state=0).fit_predict(zp)).min() / 100 >= 0.35
    # the path is sklearn's FastICA (10 components, all-zero columns dropped), then KMeans
    x = f[100:].numpy()
    z = FastICA(n_components=4, whiten="unit-variance", random_state=0, max_iter=400, tol=1e-4).fit_transform(x)
    np.testing.assert_allclose(baselines.reduce_features(np.c_[x, np.zeros(100)], 10), z, atol=1e-10)
    assign = KMeans(n_clusters=2, n_init=5, random_state=0).fit_predict(z)
    assert set(np.nonzero(assign == np.argmin(np.bincount(assign)))[0] + 100) == set(bad.tolist())
