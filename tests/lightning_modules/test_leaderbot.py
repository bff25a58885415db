"""LeaderbotLitModule end to end: fitting through Lightning, metrics vs the package, Elo, artefacts, resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from core.errors import ConfigError
from datamodules.arena import ArenaDataModule, embedded_path, read_votes
from lightning_modules.leaderbot import LeaderbotLitModule
from lightning_modules.leaderbot import likelihoods as lk
from lightning_modules.leaderbot.elo import elo_to_scores, expand_battles, online_elo
from lightning_modules.leaderbot.fit import fit_newton
from lightning_modules.leaderbot.metrics import PairOutcomeMetrics, information_criteria
from lightning_modules.leaderbot.newton import DampedNewton

SOLVER_CLASSES = {"newton": DampedNewton, "lbfgs": torch.optim.LBFGS}

lb = pytest.importorskip("leaderbot")


@pytest.fixture(scope="module")
def subset_file(tmp_path_factory) -> Path:
    """The 10 most-played models of the bundled data, in the aggregated ``leaderbot`` format."""
    raw = json.loads(embedded_path().read_text())
    x, y = np.array(raw["X"]), np.array(raw["Y"])
    games = np.zeros(len(raw["models"]))
    np.add.at(games, x[:, 0], y.sum(1))
    np.add.at(games, x[:, 1], y.sum(1))
    keep = np.sort(np.argsort(-games)[:10])
    pos = {int(k): i for i, k in enumerate(keep)}
    rows = [(i, r) for i, r in enumerate(x.tolist()) if r[0] in pos and r[1] in pos]
    doc = {
        "models": [raw["models"][k] for k in keep],
        "X": [[pos[a], pos[b]] for _, (a, b) in rows],
        "Y": [y[i].tolist() for i, _ in rows],
    }
    path = tmp_path_factory.mktemp("arena") / "subset.json"
    path.write_text(json.dumps(doc))
    return path


def _trainer(tmp_path: Path, max_epochs: int = 50) -> pl.Trainer:
    return pl.Trainer(
        default_root_dir=str(tmp_path),
        max_epochs=max_epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )


def _dm(subset_file: Path, test_ratio: float = 0.0) -> ArenaDataModule:
    return ArenaDataModule(
        source="real", data_dir=str(subset_file.parent), filename=subset_file.name, test_ratio=test_ratio
    )


def test_lightning_fit_matches_plain_fit_and_writes_artifacts(subset_file: Path, tmp_path: Path):
    model = LeaderbotLitModule(kind="davidson", k_cov=1, k_tie=1, plot_top=8)
    dm = _dm(subset_file, test_ratio=0.25)
    trainer = _trainer(tmp_path)
    trainer.fit(model, datamodule=dm)
    assert trainer.current_epoch < 50, "L-BFGS should converge and stop the run early"
    assert model.w.dtype == torch.float64
    train = dm.datasets["train"]
    ref = fit_newton(model.layout, train.pairs, train.counts)
    got = float(
        lk.objective(
            model.params().detach(), train.pairs, train.counts, model.layout, model.basis, train.counts.sum(), True
        )
    )
    assert ref.converged and got <= ref.loss + 1e-12  # the same Newton iterations, through Lightning
    m = trainer.callback_metrics
    assert 0 <= float(m["train/grad_max"]) <= 1e-9  # logged stationarity of the last step: the claim's gate
    assert float(m["val/nll"]) == pytest.approx(
        float(
            lk.objective(
                model.params().detach(), train.pairs, train.counts, model.layout, model.basis, train.counts.sum(), False
            )
        ),
        rel=1e-9,
    )
    trainer.test(model, datamodule=dm)
    test_metrics = trainer.callback_metrics
    assert {"test/nll", "test/mae_tie", "test/kld", "test/jsd", "test/aic", "test/bic"} <= set(test_metrics)
    held_out = dm.datasets["test"]
    expected = lk.objective(
        model.params().detach(),
        held_out.pairs,
        held_out.counts,
        model.layout,
        model.basis,
        held_out.counts.sum(),
        False,
    )
    assert float(test_metrics["test/nll"]) == pytest.approx(float(expected), rel=1e-9)
    assert len(held_out.pairs) + len(train.pairs) == len(read_votes(subset_file)["pairs"])
    rows = list((tmp_path / "leaderboard.csv").read_text().splitlines())
    assert rows[0].startswith("rank,model,score,stderr") and len(rows) == 11
    se = [float(r.split(",")[3]) for r in rows[1:]]
    assert all(math.isfinite(v) and 0 < v < 1 for v in se), "constraints make the Fisher information invertible"
    for name in ("scores.png", "match_matrix.png", "kpca_map.png"):
        assert (tmp_path / name).stat().st_size > 1000


@pytest.mark.slow
def test_metrics_match_package_evaluate(subset_file: Path):
    votes = read_votes(subset_file)
    pairs = torch.as_tensor(votes["pairs"])
    for kind, cls, kw in (
        ("davidson", lb.Davidson, {"k_cov": 0, "k_tie": 1}),
        ("rao_kupper", lb.RaoKupper, {"k_cov": None, "k_tie": 0}),
        ("bradley_terry", lb.BradleyTerry, {"k_cov": 1}),
    ):
        y = votes["counts"].copy()
        if kind == "bradley_terry":
            # The package splits ties half/half into an *integer* array (odd ties are truncated); with even tie
            # counts the split is exact and both sides must agree. The suite never truncates.
            y[:, 2] = 2 * (y[:, 2] // 2)
        counts = torch.as_tensor(y, dtype=torch.float64)
        model = cls({"models": votes["models"], "X": votes["pairs"], "Y": y}, **kw)
        layout = lk.Layout(kind, len(votes["models"]), kw["k_cov"], kw.get("k_tie", 0))
        w = lk.initial_params(layout, pairs, counts)
        w[layout.blocks()["x"]] *= 3.0
        if "tie" in layout.blocks():
            w[layout.blocks()["tie"]] = 0.4
        model._delegated_model.param = w.numpy().copy()
        probs = lk.probabilities(w, pairs, layout, lk.dct_basis(layout.m, layout.k_tie))
        metric = PairOutcomeMetrics(has_tie=kind != "bradley_terry")
        metric.update(probs[:40], counts[:40])  # two updates: sums must compose
        metric.update(probs[40:], counts[40:])
        got = {k: float(v) for k, v in metric.compute().items()}
        sel = lb.evaluate.model_selection([model], report=False)
        gof = lb.evaluate.goodness_of_fit([model], report=False)
        assert got["nll"] == pytest.approx(sel["nll"][0], rel=1e-10)
        ic = information_criteria(got["nll"], layout.n_param, len(pairs))
        assert ic["aic"] == pytest.approx(sel["aic"][0], rel=1e-10)
        assert ic["bic"] == pytest.approx(sel["bic"][0], rel=1e-10)
        assert got["cel_win"] == pytest.approx(sel["cel_win"][0], rel=1e-10)
        for key, ref in (
            ("mae_win", "err_win"),
            ("mae_loss", "err_loss"),
            ("mae_all", "err_all"),
            ("kld", "kld"),
            ("jsd", "jsd"),
        ):
            assert got[key] == pytest.approx(gof[ref][0], rel=1e-9), (kind, key)
        if kind != "bradley_terry":
            assert got["mae_tie"] == pytest.approx(gof["err_tie"][0], rel=1e-9)
        else:
            assert "mae_tie" not in got


def test_bradley_terry_kld_with_the_package_integer_tie_split(subset_file: Path):
    """Hand-computed: one pair [w, l, t] = [3, 1, 1], P = (1/2, 1/2). Exact split: p = (0.7, 0.3), KLD =
    0.7 ln 1.4 + 0.3 ln 0.6; the package's integer split drops the odd tie: p = (0.75, 0.25), KLD = 0.75 ln 1.5 +
    0.25 ln 0.5. Then on real pairs with odd tie counts ``kld_pkg`` equals the package's own ``goodness_of_fit``."""
    metric = PairOutcomeMetrics(has_tie=False)
    metric.update(torch.tensor([[0.5, 0.5, 0.0]]), torch.tensor([[3.0, 1.0, 1.0]]))
    got = metric.compute()
    assert float(got["kld"]) == pytest.approx(0.7 * math.log(1.4) + 0.3 * math.log(0.6), rel=1e-12)
    assert float(got["kld_pkg"]) == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5), rel=1e-12)
    assert "kld_pkg" not in PairOutcomeMetrics(has_tie=True).compute()

    votes = read_votes(subset_file)
    y = votes["counts"].copy()
    assert (y[:, 2] % 2 == 1).any()  # odd tie counts present: the two conventions differ
    model = lb.BradleyTerry({"models": votes["models"], "X": votes["pairs"], "Y": y}, k_cov=None)
    layout = lk.Layout("bradley_terry", len(votes["models"]), None, 0)
    pairs, counts = torch.as_tensor(votes["pairs"]), torch.as_tensor(y, dtype=torch.float64)
    w = lk.initial_params(layout, pairs, counts) * 3.0
    model._delegated_model.param = w.numpy().copy()
    metric = PairOutcomeMetrics(has_tie=False)
    metric.update(lk.probabilities(w, pairs, layout, lk.dct_basis(layout.m, 0)), counts)
    got = {k: float(v) for k, v in metric.compute().items()}
    ref = lb.evaluate.goodness_of_fit([model], report=False)["kld"][0]
    assert got["kld_pkg"] == pytest.approx(ref, rel=1e-9)
    assert abs(got["kld"] - ref) > 1e-3 * ref  # the exact split is a different number


@pytest.fixture(scope="module")
def arena_full():
    votes = read_votes(embedded_path())
    return torch.as_tensor(votes["pairs"]), torch.as_tensor(votes["counts"], dtype=torch.float64), len(votes["models"])


def test_fit_matches_package_fits(arena_full):
    """On the full bundled data, against the package's recorded fits
    (tests/fixtures/leaderbot_package_fits.py): the suite's default fit (Newton, the experiment's budget of 60
    steps) has NLL <= package + 1e-6 and a Kendall tau >= 0.99 with the package's ranking.

    Davidson(0, 1) with the package's defaults is the exception for tau: its BFGS stops at ``max_iter=1500`` far
    from the minimum (gradient ~5e-4; NLL 1.1e-4 above the suite's), and its ranking there has tau 0.981 with the
    minimiser's. Continued for another 1500 iterations the package comes to within 3e-6 of the suite's NLL and its
    ranking to tau >= 0.99, asserted on the ``rounds=1`` record."""
    from scipy.stats import kendalltau

    from tests.fixtures.leaderbot_package_fits import load

    pairs, counts, m = arena_full
    fits: dict[tuple, object] = {}
    for rec in load():
        layout = lk.Layout(rec["kind"], m, rec["k_cov"], rec["k_tie"])
        basis = lk.dct_basis(m, layout.k_tie)
        key = (rec["kind"], rec["k_cov"], rec["k_tie"])
        if key not in fits:
            fits[key] = fit_newton(layout, pairs, counts, max_steps=60)
        res = fits[key]
        pkg = torch.tensor(rec["param"], dtype=torch.float64, requires_grad=True)
        pkg_loss = lk.objective(pkg, pairs, counts, layout, basis, counts.sum(), True)
        (pkg_grad,) = torch.autograd.grad(pkg_loss, pkg)
        nll_pkg = float(lk.objective(pkg.detach(), pairs, counts, layout, basis, counts.sum(), False))
        assert nll_pkg == pytest.approx(rec["nll"], rel=1e-9)  # the record is what the package computes
        assert res.converged and res.nll <= rec["nll"] + 1e-6, key
        tau = kendalltau(res.w[:m].numpy(), rec["param"][:m]).statistic
        if key == ("davidson", 0, 1) and rec["rounds"] == 0:
            assert pkg_grad.abs().max() > 1e-4  # not a stationary point: the package's iteration cap
            assert res.nll < rec["nll"] - 1e-4 and tau >= 0.98
        else:
            assert tau >= 0.99, (key, rec["rounds"], tau)
    w = fits[("davidson", 0, 1)].w.clone().requires_grad_(True)
    layout = lk.Layout("davidson", m, 0, 1)
    loss = lk.objective(w, pairs, counts, layout, lk.dct_basis(m, 1), counts.sum(), True)
    assert torch.autograd.grad(loss, w)[0].abs().max() < 1e-9  # the suite's fit is a stationary point
    assert abs(fits[("davidson", None, 0)].nll - 1.0100) < 5e-5  # the paper's Davidson(None, 0) NLL


def test_newton_stays_in_the_start_basin_of_a_multimodal_model(arena_full):
    """Rao-Kupper(k_cov=1, k_tie=1) has several local minima; with the default (large) initial damping the Newton
    fit reaches the published NLL 1.0102 (undamped first steps end in a worse basin, 1.0108)."""
    pairs, counts, m = arena_full
    res = fit_newton(lk.Layout("rao_kupper", m, 1, 1), pairs, counts, max_steps=60)
    assert res.converged and abs(res.nll - 1.0102) < 5e-5


@pytest.mark.slow
def test_package_fixture_reproduces_live():
    """The recorded package fits are what the package computes (the models it fits in seconds), and the suite's
    fit of each is at least as good."""
    from tests.fixtures.leaderbot_package_fits import load, package_fit

    for rec in load():
        if (rec["kind"], rec["k_cov"]) == ("davidson", 0):
            continue  # minutes of scipy BFGS; regenerate with python -m tests.fixtures.leaderbot_package_fits
        live = package_fit(rec["kind"], rec["k_cov"], rec["k_tie"], rec["rounds"])
        assert live["nll"] == pytest.approx(rec["nll"], rel=1e-12)
        # BFGS stops at a gradient tolerance: BLAS reduction order (thread count) moves its stopping point by
        # ~2e-7 in the parameters while the NLL agrees to 1e-14, so the parameters are compared at 1e-5.
        assert np.allclose(live["param"], rec["param"], rtol=0, atol=1e-5)


def test_elo_online_update_and_module(subset_file: Path, tmp_path: Path):
    # one win of a over b from 1000/1000 with K = 4: +2 / -2
    assert online_elo([1000.0, 1000.0], [0], [1], [1.0], k=4.0, base=10.0, scale=400.0) == [1002.0, 998.0]
    r = online_elo([1000.0, 1000.0], [0, 0], [1, 1], [0.5, 0.5], k=32.0, base=10.0, scale=400.0)
    assert r == [1000.0, 1000.0]
    a, b, s = expand_battles(torch.tensor([[0, 1]]), torch.tensor([[2.0, 1.0, 1.0]]), seed=0)
    assert sorted(s) == [0.0, 0.5, 1.0, 1.0] and set(a) == {0} and set(b) == {1}
    assert torch.allclose(
        elo_to_scores(torch.tensor([1400.0, 1000.0], dtype=torch.float64), 10.0, 400.0),
        torch.tensor([0.5 * math.log(10), -0.5 * math.log(10)], dtype=torch.float64),
    )
    model = LeaderbotLitModule(kind="elo", k_cov=None, k_tie=0, elo_k=8.0, plots=False)
    dm = _dm(subset_file)
    trainer = _trainer(tmp_path, max_epochs=5)
    trainer.fit(model, datamodule=dm)
    assert trainer.current_epoch == 1  # one pass, then stop
    assert not torch.equal(model.ratings, torch.full_like(model.ratings, 1000.0))
    m = trainer.callback_metrics
    assert 0.6 < float(m["val/nll"]) < 0.7 and "val/mae_tie" not in m
    bt = LeaderbotLitModule(kind="bradley_terry", k_cov=None, k_tie=0, plots=False)
    trainer = _trainer(tmp_path / "bt")
    trainer.fit(bt, datamodule=_dm(subset_file))
    assert float(trainer.callback_metrics["val/nll"]) < float(m["val/nll"])  # the MLE fits better than Elo


@pytest.mark.parametrize("solver", ["newton", "lbfgs"])
def test_checkpoint_is_weights_only_and_resumes_exactly(subset_file: Path, tmp_path: Path, solver: str):
    kw = dict(kind="rao_kupper", k_cov=0, k_tie=1, plots=False, standard_errors=False, optimizer=solver)
    kw.update(newton={"max_iter": 1}, lbfgs={"max_iter": 3, "max_eval": 6})  # 2 steps must not converge yet
    model = LeaderbotLitModule(**kw)
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(model, datamodule=_dm(subset_file))
    ckpt = tmp_path / "two.ckpt"
    trainer.save_checkpoint(ckpt)
    state = torch.load(ckpt, weights_only=True)
    assert state["hyper_parameters"]["kind"] == "rao_kupper" and "state" in state["optimizer_states"][0]
    # continue 2 -> 4 epochs from the checkpoint == 4 epochs straight
    assert trainer.current_epoch == 2 and isinstance(model.optimizers().optimizer, SOLVER_CLASSES[solver])
    straight = LeaderbotLitModule(**kw)
    _trainer(tmp_path / "a", max_epochs=4).fit(straight, datamodule=_dm(subset_file))
    assert not torch.allclose(straight.params(), model.params(), rtol=0, atol=1e-9)  # epochs 3-4 moved it
    resumed = LeaderbotLitModule(**kw)
    _trainer(tmp_path / "b", max_epochs=4).fit(
        resumed, datamodule=_dm(subset_file), ckpt_path=str(ckpt), weights_only=True
    )
    assert torch.allclose(straight.params(), resumed.params(), rtol=0, atol=1e-12)


def test_bad_config_fails_at_construction():
    with pytest.raises(ConfigError, match="model.kind='thurstone'"):
        LeaderbotLitModule(kind="thurstone")
    with pytest.raises(ConfigError, match="model.k_tie=1 must be 0 for kind=bradley_terry"):
        LeaderbotLitModule(kind="bradley_terry", k_cov=None, k_tie=1)
    with pytest.raises(ConfigError, match="model.k_cov=-1"):
        LeaderbotLitModule(kind="davidson", k_cov=-1)
    with pytest.raises(ConfigError, match="model.k_cov=0 must be null for kind=elo"):
        LeaderbotLitModule(kind="elo", k_cov=0, k_tie=0)
    with pytest.raises(ConfigError, match="model.k_cov=200 must be null or an integer in"):
        lk.Layout("davidson", 129, 200, 1)


def _leaderbot_page(records: list, tmp_path: Path):
    """The leaderbot page's verdicts by id, the hook's result and the convergence per entry."""
    from suite.claim import judge_page, load_spec
    from suite.claims import ClaimSpec

    spec = ClaimSpec.from_dict("leaderbot", load_spec("leaderbot"))
    verdicts, _, result, _, conv, _ = judge_page(spec, records, tmp_path)
    return {v.id: v for v in verdicts}, result, conv


def _full_fits(grad: dict | None = None, **changed) -> list:
    """One full-data run per published model at its published NLL and KLD%, stationary unless ``grad`` says
    otherwise (entry -> gradient, ``None`` for none logged); ``changed``: entry -> metrics to update."""
    from reports.leaderbot import PUBLISHED
    from suite.compare import RunRecord

    out = []
    for n, p in PUBLISHED.items():
        m = {"val/nll": p["nll"], "val/kld": p["kld_pct"] / 100, "val/mae_tie": 35.6 if n == "dv_0_1" else 49.0}
        g = (grad or {}).get(n, 1e-12)
        m |= {} if g is None else {"train/grad_max": g}
        out.append(RunRecord(Path(n), n, 0, m | changed.get(n, {})))
    return out


def _held_out(nll0: tuple, nll1: tuple, tie0=(30.0,) * 3, tie1=(30.0,) * 3, grad0: float = 1e-12) -> list:
    from suite.compare import RunRecord

    out = []
    for seed in range(3):
        for name, nll, tie, g in (("gen_dv_none_0", nll0, tie0, grad0), ("gen_dv_0_1", nll1, tie1, 1e-12)):
            m = {"test/nll": nll[seed], "test/mae_tie": tie[seed], "train/grad_max": g}
            out.append(RunRecord(Path(f"{name}{seed}"), name, seed, m))
    return out


def test_claim_report_published_nll(tmp_path: Path):
    from reports.leaderbot import PUBLISHED
    from suite import stats

    by_id, _, _ = _leaderbot_page(_full_fits(), tmp_path)
    assert (
        by_id["published_nll"].verdict == stats.REPRODUCED and "9/9 equal to 4 decimals" in by_id["published_nll"].why
    )
    recs = _full_fits(
        dv_0_1={"val/nll": PUBLISHED["dv_0_1"]["nll"] - 2e-4}, bt_none={"val/nll": PUBLISHED["bt_none"]["nll"] + 1e-3}
    )
    nll = _leaderbot_page(recs, tmp_path)[0]["published_nll"]
    assert nll.verdict == stats.NOT_REPRODUCED and nll.why.startswith("7/9")
    assert "lower (a better fit of the same objective, counted as matched): dv_0_1" in nll.why
    assert "higher: bt_none" in nll.why
    nll = _leaderbot_page([r for r in recs if r.name != "dv_0_0"], tmp_path)[0]["published_nll"]
    assert nll.verdict == stats.UNDERFIT and "not run: dv_0_0" in nll.why and "dv_0_0: not run" in nll.why
    recs = _full_fits(dv_0_1={"val/nll": PUBLISHED["dv_0_1"]["nll"] - 2e-4})
    assert _leaderbot_page(recs, tmp_path)[0]["published_nll"].verdict == stats.REPRODUCED  # lower counts


def test_claim_report_kld_tie_mae_and_generalisation_verdicts(tmp_path: Path):
    """KLD% is judged on the package's tie split where a run reports it; the tie MAE is an exact comparison of
    deterministic fits; the held-out ordering is a paired t interval over the seeds' splits (hand-made numbers:
    NLL differences -0.0008, -0.0009, -0.0007 -> reproduced; tie MAE +3, +2, +4 -> the opposite holds)."""
    from reports.leaderbot import PUBLISHED
    from suite import stats

    bt = {
        n: {"val/kld": p["kld_pct"] / 100 - 0.0012, "val/kld_pkg": p["kld_pct"] / 100}
        for n, p in PUBLISHED.items()
        if n.startswith("bt_")
    }
    recs = _full_fits(**bt) + _held_out(
        (1.0134, 1.0140, 1.0129), (1.0126, 1.0131, 1.0122), (28.5, 29.0, 28.0), (31.5, 31.0, 32.0)
    )
    by_id, result, _ = _leaderbot_page(recs, tmp_path)
    assert by_id["published_kld"].verdict == stats.REPRODUCED and by_id["published_kld"].why.startswith("9/9")
    tie = by_id["tie_mae_full"]
    assert tie.verdict == stats.REPRODUCED and tie.lo == tie.hi == pytest.approx(49.0 - 35.6) and tie.published == 13.3
    nll = by_id["gen_nll"]
    assert nll.verdict == stats.REPRODUCED and nll.paired and nll.diff == pytest.approx(0.0008)
    assert 0 < nll.lo < nll.hi < 0.0011  # paired: the splits' shared difficulty (0.0011 apart) cancels
    assert by_id["gen_mae_tie"].verdict == stats.NOT_REPRODUCED and by_id["gen_mae_tie"].hi < 0
    gen = {row[0]: row for row in result.tables[1].rows}
    assert gen["gen_dv_0_1"][1] == 3 and gen["gen_dv_0_1"][2].startswith("1.013 ± 0.00045")
    assert gen["gen_bt_none"][1] == "not run"
    recs = _full_fits(**bt)
    recs[0].metrics.pop("val/kld_pkg")  # bt_none judged on the exact split: 0.12 points off
    kld = _leaderbot_page(recs, tmp_path)[0]["published_kld"]
    assert (
        kld.verdict == stats.NOT_REPRODUCED
        and "8/9" in kld.why
        and "off at the same NLL: bt_none 1.37 vs 1.49" in kld.why
    )


def test_claim_report_gates_every_verdict_on_stationary_fits(tmp_path: Path):
    """A verdict resting on a fit whose last gradient exceeds the tolerance (or was not logged) is underfit, and the
    page's convergence table says which fit."""
    from reports.leaderbot import GRAD_TOL, PUBLISHED, solver_check
    from suite import stats

    held = _held_out((1.0134, 1.0144, 1.0154), (1.0116, 1.0125, 1.0137))
    by_id, result, conv = _leaderbot_page(_full_fits() + held, tmp_path)
    assert by_id["published_nll"].verdict == stats.REPRODUCED and by_id["gen_nll"].verdict == stats.REPRODUCED
    stationarity = {row[0]: row for row in result.tables[2].rows}
    assert stationarity["dv_none_0"][1:] == [
        "yes",
        "stationary, largest abs gradient 1e-12 over 1 seed(s) (tolerance 1e-05)",
    ]
    by_id, _, conv = _leaderbot_page(_full_fits({"dv_none_0": 2 * GRAD_TOL}) + held, tmp_path)
    # an NLL equal to the published one stands (more minimisation could only lower it); the other rows are underfit
    assert by_id["published_nll"].verdict == stats.REPRODUCED
    assert (
        by_id["published_kld"].verdict == stats.UNDERFIT and "dv_none_0: not stationary" in by_id["published_kld"].why
    )
    assert by_id["tie_mae_full"].verdict == stats.UNDERFIT and "largest abs gradient 2e-05" in by_id["tie_mae_full"].why
    assert not conv["dv_none_0"][0] and by_id["gen_nll"].verdict == stats.REPRODUCED
    higher = _full_fits({"dv_none_0": 2 * GRAD_TOL}, dv_none_0={"val/nll": PUBLISHED["dv_none_0"]["nll"] + 1e-3})
    assert _leaderbot_page(higher + held, tmp_path)[0]["published_nll"].verdict == stats.UNDERFIT
    far = _held_out((1.0134, 1.0144, 1.0154), (1.0116, 1.0125, 1.0137), grad0=0.1)  # a held-out fit far from stationary
    by_id, _, _ = _leaderbot_page(_full_fits({"dv_none_0": None}) + far, tmp_path)  # no gradient logged
    assert "dv_none_0: no finite final gradient logged" in by_id["published_kld"].why
    assert by_id["gen_nll"].verdict == stats.UNDERFIT and "gen_dv_none_0: not stationary" in by_id["gen_nll"].why
    assert solver_check({}, "bt_0") == (False, "bt_0: not run")
