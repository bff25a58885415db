"""GrassLitModule: equal-budget baselines, Lion + one-cycle, L1 loss, evaluation averaged over rewirings."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lion_pytorch import Lion

from datamodules.molecules import MoleculesDataModule
from layers.graph.grass import GrassNet, NoAffineBatchNorm
from layers.graph.grass_baselines import GINENet, GPSNet, count_parameters
from lightning_modules.grass import GrassLitModule, RewiringMAE
from suite.errors import ConfigError

SMALL = dict(num_layers=2, dim=16, hidden_dim=16, encoding_steps=4, num_components=4, added_edges_per_node=2)


@pytest.mark.parametrize("arch,cls", [("gine", GINENet), ("gps", GPSNet)])
def test_baselines_match_the_grass_parameter_budget(arch: str, cls: type):
    grass = count_parameters(GrassLitModule(arch="grass", **SMALL).net)
    lit = GrassLitModule(arch=arch, **SMALL)
    assert isinstance(lit.net, cls)
    assert abs(count_parameters(lit.net) - grass) / grass < 0.15
    assert lit.num_eval_rewirings == 1, "deterministic baselines are evaluated once"
    assert isinstance(GrassLitModule(arch=arch, baseline_dim=8, **SMALL).net, cls)


def test_config_errors():
    with pytest.raises(ConfigError, match="model.arch"):
        GrassLitModule(arch="grit")
    with pytest.raises(ConfigError, match="num_eval_rewirings"):
        GrassLitModule(num_eval_rewirings=0)
    with pytest.raises(ConfigError, match="model.encoding"):
        GrassLitModule(encoding="lap")


def test_rewiring_mae_is_the_mean_of_per_rewiring_maes():
    m = RewiringMAE(3)
    preds = torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, 3.0]])
    target = torch.tensor([1.0, 1.0])
    m.update(preds[:, :1], target[:1])
    m.update(preds[:, 1:], target[1:])
    mean, std = m.compute()
    per = torch.tensor([0.5, 1.0, 2.0])
    assert float(mean) == pytest.approx(float(per.mean())) and float(std) == pytest.approx(
        float(per.std(unbiased=False))
    )


def test_weight_decay_excludes_biases():
    lit = GrassLitModule(**SMALL)
    decay, no_decay = lit.trainable_parameters()
    assert all(p.ndim > 1 for p in decay["params"]) and no_decay["weight_decay"] == 0.0
    assert any(p.ndim == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(lit.parameters()))


def test_fit_and_test_with_lion_one_cycle_and_bn_recollection(tmp_path: Path):
    torch.manual_seed(0)
    dm = MoleculesDataModule(
        data_dir=str(tmp_path), batch_size=8, num_molecules=40, split_sizes=(16, 8, 8), cache=False
    )
    lit = GrassLitModule(
        **SMALL,
        num_eval_rewirings=3,
        bn_recalibration_epochs=1,
        optimizer=partial(Lion, lr=5e-4, betas=(0.95, 0.98), weight_decay=0.5),
        scheduler=partial(
            torch.optim.lr_scheduler.OneCycleLR,
            max_lr=5e-4,
            pct_start=0.1,
            div_factor=5000.0,
            final_div_factor=1.0,
            cycle_momentum=False,
        ),  # fmt: skip
    )
    before = [p.detach().clone() for p in lit.parameters()]
    trainer = pl.Trainer(
        max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", use_distributed_sampler=False,
    )  # fmt: skip
    trainer.fit(lit, datamodule=dm)
    sched = trainer.lr_scheduler_configs[0].scheduler
    assert sched.total_steps == 4  # 2 epochs x 2 batches
    group = trainer.optimizers[0].param_groups[0]
    assert isinstance(trainer.optimizers[0], Lion) and group["betas"] == (0.95, 0.98)  # no momentum cycling
    assert group["initial_lr"] == pytest.approx(1e-7) and group["max_lr"] == pytest.approx(5e-4)
    assert group["min_lr"] == pytest.approx(1e-7)  # 1e-7 -> 5e-4 -> 1e-7
    assert any(not torch.equal(a, b) for a, b in zip(before, lit.parameters()))
    metrics = trainer.test(lit, datamodule=dm, verbose=False)[0]
    assert metrics["test/mae"] > 0 and metrics["test/mae_std"] > 0  # rewirings disagree
    assert metrics["test/loss"] == pytest.approx(metrics["test/mae"], rel=1e-5)
    assert metrics["test/params"] == count_parameters(lit.net)  # logged for the claim's equal-budget column
    norms = [m for m in lit.net.modules() if type(m) is NoAffineBatchNorm]
    assert all(int(m.num_batches_tracked) == 2 for m in norms), "statistics re-collected over the 2 train batches"
    assert all(m.momentum == 0.1 for m in norms)
    assert all(layer.removal_active for layer in lit.net.layers)


def test_bn_recollection_is_a_cumulative_average_without_edge_removal():
    torch.manual_seed(0)
    net = GrassNet(**SMALL, edge_removal_rate=0.5)
    lit = GrassLitModule(**SMALL, edge_removal_rate=0.5)
    lit.net = net
    from torch_geometric.data import Batch

    from tests.layers.test_grass_layer import molecule

    batches = [Batch.from_data_list([molecule(7, s), molecule(9, s + 1)]) for s in range(3)]
    seen = []
    bn = net.layers[0].node_norm
    hook = bn.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
    torch.manual_seed(1)
    net.k = 0  # deterministic inputs so the expected mean can be recomputed
    lit.recollect_batch_norm(batches, epochs=1)
    hook.remove()
    expected = torch.stack([s.mean(0) for s in seen]).mean(0)
    torch.testing.assert_close(bn.running_mean, expected, rtol=1e-5, atol=1e-6)


def test_claim_report_verdicts():
    from types import SimpleNamespace

    from reports.grass import claim_report

    def rec(name: str, mae: float) -> SimpleNamespace:  # a validation curve flat over the last 20%: plateaued
        return SimpleNamespace(name=name, seed=0, metrics={"test/mae": mae}, curves={"val/mae": [(0, mae), (5, mae)]})

    text = claim_report([rec("grass", 0.4), rec("grass", 0.6), rec("gine", 0.6), rec("gps", 0.8),
                         rec("grass_no_rewiring", 0.7), rec("grass_drrwp", 0.45)], None)  # fmt: skip
    claim = "| GRASS has a lower test MAE than the best baseline (GINE, GraphGPS) at equal parameters |"
    assert f"{claim} **inconclusive: within noise** | test MAE grass 0.5 ± 0.14 (n=2) vs gine 0.6 (1 seed)" in text
    assert "16.7% lower MAE" in text
    assert "`grass_no_rewiring`: MAE 0.7000 (+0.2000 vs GRASS, one seed" in text
    assert "so removing the random regular rewiring raises the MAE (one seed" in text
    # the D-RRWP run (MAE 0.45 < GRASS-with-RRWP 0.5) is described as what it is: D-RRWP in place of RRWP
    assert "`grass_drrwp`: MAE 0.4500 (-0.0500" in text and "so replacing RRWP by D-RRWP lowers the MAE" in text
    assert "instead of D-RRWP" not in text
    assert "**not reproduced**" in claim_report([rec("grass", 0.9), rec("gine", 0.6)], None)
    unconverged = [
        SimpleNamespace(name=n, seed=0, metrics={"test/mae": m}, curves={}) for n, m in (("grass", 0.4), ("gine", 0.6))
    ]
    assert "**inconclusive: underfit**" in claim_report(unconverged, None)  # one validation point: not tested
    worse = claim_report([rec("grass", 0.9), rec("gine", 0.6)], None)
    assert "50.0% higher MAE" in worse and "reduction" not in worse
    assert "No finished GRASS run" in claim_report([rec("gine", 0.6)], None)


def test_claim_report_4x_check_overrides_a_plateau_and_reaches_the_ablations():
    from types import SimpleNamespace

    from reports.grass import claim_report

    def rec(name: str, mae: float, seed: int) -> SimpleNamespace:  # flat validation curves: every entry plateaued
        return SimpleNamespace(
            name=name, seed=seed, metrics={"test/mae": mae}, curves={"val/mae": [(0, mae), (5, mae)]}
        )

    recs = [rec("grass", m, s) for s, m in enumerate((0.30, 0.31, 0.32))]  # seed spread 0.01
    recs += [rec("gine", m, s) for s, m in enumerate((0.40, 0.41, 0.42))]
    recs += [rec("grass_no_rrwp", m, s) for s, m in enumerate((0.50, 0.51, 0.52))]
    claim = "| GRASS has a lower test MAE than the best baseline (GINE, GraphGPS) at equal parameters |"
    rrwp = "| The RRWP encoding lowers GRASS's test MAE (vs no encoding) |"
    converged = claim_report([*recs, rec("grass_long", 0.295, 0), rec("gine_long", 0.41, 0)], None)
    assert f"{claim} **reproduced**" in converged and f"{rrwp} **reproduced**" in converged
    assert "`grass`: converged: the longer run (grass_long) improves test/mae by 0.005 on seed 0" in converged
    assert "`gine`: converged: the longer run (gine_long) worsens test/mae by 0.01" in converged
    assert "both converged" in converged
    cooled = claim_report([*recs, rec("grass_long", 0.25, 0)], None)  # 4x the epochs gains 0.05 > 0.01
    assert f"{claim} **inconclusive: underfit**" in cooled
    assert f"{rrwp} **inconclusive: underfit**" in cooled and "grass's 4x check: not converged" in cooled


def test_claim_report_significance_and_parameter_counts():
    from types import SimpleNamespace

    from reports.grass import claim_report

    def rec(name: str, mae: float, params: float = 1000.0) -> SimpleNamespace:
        curves = {"val/mae": [(0, 1.0), (5, 0.5)]}  # the same final value for every seed: plateau by 1% rule is off
        return SimpleNamespace(name=name, seed=0, metrics={"test/mae": mae, "test/params": params}, curves=curves)

    clear = [rec("grass", m) for m in (0.40, 0.41, 0.42)] + [rec("gine", m, 990.0) for m in (0.60, 0.61, 0.62)]
    text = claim_report(clear, None)
    assert "outside 2 s.e." in text and "**inconclusive: underfit**" in text  # still improving at the stop
    assert "grass 1,000, gine 990" in text
    noisy = [rec("grass", m) for m in (0.3, 0.5, 0.7)] + [rec("gine", m) for m in (0.4, 0.6, 0.8)]
    assert "within 2 s.e.: not significant" in claim_report(noisy, None)
    ablations = clear + [rec("grass_no_rewiring", m) for m in (0.50, 0.51, 0.52)]
    ablations += [rec("grass_no_rrwp", m) for m in (0.30, 0.31, 0.32)]
    ablations += [rec("grass_drrwp", m) for m in (0.20, 0.41, 0.62)]
    text = claim_report(ablations, None)
    assert "removing the random regular rewiring raises the MAE here" in text
    assert "removing the RRWP encoding lowers the MAE here" in text
    assert "replacing RRWP by D-RRWP makes no significant difference here" in text


def test_claim_report_states_the_ordering_at_4x():
    from types import SimpleNamespace

    from reports.grass import claim_report, long_ordering

    def rec(name: str, mae: float, seed: int = 0) -> SimpleNamespace:
        return SimpleNamespace(
            name=name, seed=seed, metrics={"test/mae": mae}, curves={"val/mae": [(0, 1.0), (5, mae)]}
        )

    recs = [rec("grass", 0.30), rec("grass", 0.32, 1), rec("gine", 0.40), rec("gine", 0.42, 1), rec("gps", 0.35)]
    text = claim_report([*recs, rec("grass_long", 0.26), rec("gine_long", 0.45), rec("gps_long", 0.50)], None)
    assert "grass_long 0.2600, gine_long 0.4500, gps_long 0.5000: GRASS lowest;" in text
    assert "the main runs order them grass < gps < gine" in text  # the baselines swap places at 4x
    same = claim_report([*recs, rec("grass_long", 0.26), rec("gine_long", 0.45), rec("gps_long", 0.40)], None)
    assert "GRASS lowest; the same ordering as the main runs" in same
    lost = long_ordering({"grass": [0.3], "gine": [0.4], "grass_long": [0.5], "gine_long": [0.38]})
    assert lost is not None and "GRASS not lowest (gine is)" in lost
    assert long_ordering({"grass": [0.3], "grass_long": [0.2]}) is None  # no baseline at 4x: nothing to order
    assert "Ordering at 4x" not in claim_report(recs, None)
