"""GrassLitModule: equal-budget baselines, Lion + one-cycle, L1 loss, evaluation averaged over rewirings."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lion_pytorch import Lion

from core.errors import ConfigError
from datamodules.molecules import MoleculesDataModule
from layers.graph.grass import GrassNet, NoAffineBatchNorm
from layers.graph.grass_baselines import GINENet, GPSNet, count_parameters
from lightning_modules.grass import GrassLitModule, RewiringMAE

SMALL = dict(num_layers=2, dim=16, hidden_dim=16, encoding_steps=4, num_components=4, added_edges_per_node=2)


def small(**net_kwargs) -> GrassNet:
    """A small GRASS network: the ``model.net`` the LitModule gets from Hydra."""
    return GrassNet(**{**SMALL, **net_kwargs})


@pytest.mark.parametrize("arch,cls", [("gine", GINENet), ("gps", GPSNet)])
def test_baselines_match_the_grass_parameter_budget(arch: str, cls: type):
    grass = count_parameters(GrassLitModule(small(), arch="grass").net)
    lit = GrassLitModule(small(), arch=arch)
    assert isinstance(lit.net, cls)
    assert abs(count_parameters(lit.net) - grass) / grass < 0.15
    assert lit.num_eval_rewirings == 1, "deterministic baselines are evaluated once"
    assert isinstance(GrassLitModule(small(), arch=arch, baseline_dim=8).net, cls)


def test_config_errors():
    with pytest.raises(ConfigError, match="model.arch"):
        GrassLitModule(arch="grit")
    with pytest.raises(ConfigError, match="num_eval_rewirings"):
        GrassLitModule(num_eval_rewirings=0)
    with pytest.raises(ConfigError, match="model.net.encoding"):
        GrassNet(encoding="lap")


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
    lit = GrassLitModule(small())
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
        small(),
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
        ),
    )
    before = [p.detach().clone() for p in lit.parameters()]
    trainer = pl.Trainer(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        use_distributed_sampler=False,
    )
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
    net = small(edge_removal_rate=0.5)
    lit = GrassLitModule(net)
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


def _grass_page(tmp_path: Path, records: list) -> tuple[dict, object]:
    """The grass page's verdicts by id and the hook's result, judged as ``make claim`` would."""
    from suite.claim import judge_page, load_spec
    from suite.claims import ClaimSpec

    verdicts, _, result, _, conv, _ = judge_page(ClaimSpec.from_dict("grass", load_spec("grass")), records, tmp_path)
    return {v.id: v for v in verdicts}, result, conv


def _mae_runs(name: str, maes, *, flat: bool = True, params: float | None = None) -> list:
    """One run per seed of ``name`` with test MAE ``maes[seed]``; a validation curve flat over its last half
    (converged) or still falling at the stop."""
    from suite.compare import RunRecord

    out = []
    for seed, m in enumerate(maes):
        curve = [(i, m) if flat and i >= 5 else (i, m + 0.05 * (10 - i)) for i in range(11)]
        metrics = {"test/mae": m, **({"test/params": params} if params is not None else {})}
        out.append(RunRecord(Path(f"/runs/{name}/{seed}"), name, seed, metrics, {"val/mae": curve}))
    return out


def test_claim_report_verdicts(tmp_path: Path):
    from suite import stats

    recs = _mae_runs("grass", (0.30, 0.31, 0.32)) + _mae_runs("gine", (0.40, 0.41, 0.42))
    recs += _mae_runs("gps", (0.29, 0.31, 0.33)) + _mae_runs("grass_no_rewiring", (0.50, 0.51, 0.52))
    recs += _mae_runs("grass_no_rrwp", (0.20, 0.21, 0.22))
    by_id, _, _ = _grass_page(tmp_path, recs)
    gine = by_id["grass_vs_gine"]
    assert gine.verdict == stats.REPRODUCED and gine.primary and not gine.paired  # declared: Welch
    assert gine.diff == pytest.approx(0.10) and 0 < gine.lo < gine.diff < gine.hi  # lower MAE = positive
    assert by_id["grass_vs_gps"].verdict == stats.NOISE and by_id["grass_vs_gps"].published == pytest.approx(
        0.023
    )  # lower MAE: positive
    assert by_id["rewiring_helps"].verdict == stats.REPRODUCED and not by_id["rewiring_helps"].primary
    assert by_id["rrwp_helps"].verdict == stats.NOT_REPRODUCED and by_id["rrwp_helps"].hi < 0  # the opposite holds
    # a GRASS still improving at the stop: every comparison with it is underfit, the interval still shown
    rising = _mae_runs("grass", (0.30, 0.31, 0.32), flat=False) + _mae_runs("gine", (0.40, 0.41, 0.42))
    by_id, _, _ = _grass_page(tmp_path, rising)
    assert by_id["grass_vs_gine"].verdict == stats.UNDERFIT and by_id["grass_vs_gine"].lo > 0
    by_id, _, _ = _grass_page(tmp_path, _mae_runs("gine", (0.40, 0.41)))
    assert by_id["grass_vs_gine"].verdict == stats.NOISE and by_id["grass_vs_gine"].why.startswith("no finished")


def test_claim_report_4x_check_overrides_a_plateau_and_reaches_the_ablations(tmp_path: Path):
    from suite import stats

    recs = _mae_runs("grass", (0.30, 0.31, 0.32)) + _mae_runs("gine", (0.40, 0.41, 0.42))
    recs += _mae_runs("grass_no_rrwp", (0.50, 0.51, 0.52))
    # 4x the epochs gains 0.001 on GRASS (under 1% of 0.30) and worsens GINE: both converged
    by_id, result, conv = _grass_page(
        tmp_path, [*recs, *_mae_runs("grass_long", (0.299,)), *_mae_runs("gine_long", (0.41,))]
    )
    assert by_id["grass_vs_gine"].verdict == stats.REPRODUCED and by_id["rrwp_helps"].verdict == stats.REPRODUCED
    assert conv["grass"][0] and conv["gine"][0]
    checks = {row[0]: row for row in result.tables[0].rows}
    assert checks["`grass`"][1] == "converged" and "worsens test/mae by 0.01" in checks["`gine`"][2]
    # a cooled GRASS: 4x the epochs gains 0.05 > 1% of the value, though its validation curve is flat
    by_id, _, conv = _grass_page(tmp_path, [*recs, *_mae_runs("grass_long", (0.25,))])
    assert by_id["grass_vs_gine"].verdict == stats.UNDERFIT
    assert (
        by_id["rrwp_helps"].verdict == stats.UNDERFIT and "grass's 4x check: not converged" in conv["grass_no_rrwp"][1]
    )


def test_claim_report_drrwp_row_and_parameter_counts(tmp_path: Path):
    recs = _mae_runs("grass", (0.40, 0.41, 0.42), params=1000.0) + _mae_runs("gine", (0.60, 0.61, 0.62), params=990.0)
    recs += _mae_runs("grass_drrwp", (0.20, 0.41, 0.62), params=1000.0)
    _, result, _ = _grass_page(tmp_path, recs)
    (table,) = [t for t in result.tables if t.title.startswith("D-RRWP")]
    (row,) = table.rows
    assert row[0] == "grass_drrwp" and row[1] == "0.4100"
    lo, hi = (float(x) for x in row[2].split("[")[1].rstrip("]").split(","))
    assert lo < 0 < hi  # no difference shown: the spread of D-RRWP's seeds is large
    assert any("grass 1,000, gine 990, grass_drrwp 1,000" in n for n in result.notes)


def test_claim_report_states_the_ordering_at_4x(tmp_path: Path):
    from reports.grass import long_ordering

    recs = _mae_runs("grass", (0.30, 0.32)) + _mae_runs("gine", (0.40, 0.42)) + _mae_runs("gps", (0.35,))
    long = _mae_runs("grass_long", (0.26,)) + _mae_runs("gine_long", (0.45,))
    _, result, _ = _grass_page(tmp_path, [*recs, *long, *_mae_runs("gps_long", (0.50,))])
    text = " ".join(result.notes)
    assert "grass_long 0.2600, gine_long 0.4500, gps_long 0.5000: GRASS lowest;" in text
    assert "the main runs order them grass < gps < gine" in text  # the baselines swap places at 4x
    _, result, _ = _grass_page(tmp_path, [*recs, *long, *_mae_runs("gps_long", (0.40,))])
    assert "GRASS lowest; the same ordering as the main runs" in " ".join(result.notes)
    lost = long_ordering({"grass": {"0": 0.3}, "gine": {"0": 0.4}, "grass_long": {"0": 0.5}, "gine_long": {"0": 0.38}})
    assert lost is not None and "GRASS not lowest (gine is)" in lost
    assert long_ordering({"grass": {"0": 0.3}, "grass_long": {"0": 0.2}}) is None  # no baseline at 4x: no ordering
    _, result, _ = _grass_page(tmp_path, recs)
    assert not any("Ordering at 4x" in n for n in result.notes)
