"""MDA's subject module and attribution benchmark: checkpoint loading, bad input, skip counting, the results hook."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from core.errors import CheckpointError, ConfigError
from lightning_modules.mda import MdaLitModule
from lightning_modules.mda.evaluation import evaluate_attributions, patch_grid
from suite.compare import RunRecord


def tiny_vit() -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(
        img_size=8, patch_size=2, in_chans=1, num_classes=3, embed_dim=16, depth=1, num_heads=2, mlp_ratio=2.0
    ).eval()


def test_subject_ckpt_round_trip_and_errors(tmp_path: Path):
    net = tiny_vit()
    torch.save({"state_dict": {f"net.{k}": v for k, v in net.state_dict().items()}}, tmp_path / "suite.ckpt")
    torch.save(net.state_dict(), tmp_path / "plain.pth")
    for f in ("suite.ckpt", "plain.pth"):
        other = tiny_vit()
        with torch.no_grad():
            for p in other.parameters():
                p.add_(1.0)
        MdaLitModule(other, num_classes=3, subject_ckpt=str(tmp_path / f))
        torch.testing.assert_close(other.state_dict(), net.state_dict())
    with pytest.raises(CheckpointError, match="no such file"):
        MdaLitModule(tiny_vit(), num_classes=3, subject_ckpt=str(tmp_path / "missing.ckpt"))
    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read"):
        MdaLitModule(tiny_vit(), num_classes=3, subject_ckpt=str(tmp_path / "bad.ckpt"))
    big = VisionTransformer(img_size=8, patch_size=2, in_chans=1, num_classes=3, embed_dim=32, depth=1, num_heads=2)
    torch.save(big.state_dict(), tmp_path / "big.pth")
    with pytest.raises(CheckpointError, match="does not fit model.net"):
        MdaLitModule(tiny_vit(), num_classes=3, subject_ckpt=str(tmp_path / "big.pth"))


def test_bad_configuration_fails_at_construction():
    with pytest.raises(ConfigError, match="unknown attribution method"):
        MdaLitModule(tiny_vit(), num_classes=3, attribution={"enabled": True, "methods": ["shap"]})
    with pytest.raises(ConfigError, match="classes"):
        MdaLitModule(tiny_vit(), num_classes=10)
    with pytest.raises(ConfigError, match="does not divide"):
        patch_grid(28, 28, 5)


def test_benchmark_skips_and_counts_images():
    net = tiny_vit()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, 1, 8, 8, generator=g)
    with torch.no_grad():
        probs = torch.softmax(net(x), 1)
    pred = probs.argmax(1)
    labels = pred.clone()
    labels[0] = (pred[0] + 1) % 3  # one misclassified image
    kw = dict(mda_variants={"mda": {}}, patch=2, patch_count=16, mda_kwargs={"blur_klen": (3, 2, 5)})
    # an untrained subject is never 99% confident: every correctly classified image is skipped, and counted
    out = evaluate_attributions(net, x, labels, ["mda", "rollout"], min_confidence=0.99, **kw)
    assert out["attr/skipped_wrong"] == 1 and out["attr/skipped_lowconf"] == 3 and out["attr/n_images"] == 0
    # with no threshold, the blur calibration decides: 1.0 max confidence always passes
    out = evaluate_attributions(
        net,
        x[1:3],
        labels[1:3],
        ["mda", "rollout"],
        min_confidence=0.0,
        **{**kw, "mda_kwargs": {"blur_klen": (3, 2, 5), "blur_max_conf": 1.0}},
    )
    assert out["attr/n_images"] == 2
    for key in ("mda/rise_ins", "mda/mas_insdel", "rollout/pert_neg", "mda/forwards", "mda/heldout_rise_ins"):
        assert torch.isfinite(torch.tensor(out[f"attr/{key}"])), key
    assert 16 <= out["attr/mda/forwards"] < 16 * 8 * 2 + 64


def test_report_hook_on_synthetic_records(tmp_path: Path):
    from lightning_modules.mda.evaluation import FAITHFULNESS, LOWER_IS_BETTER
    from reports.mda import BASELINES, gain_over_best
    from suite import stats
    from suite.claim import judge_page, load_spec
    from suite.claims import ClaimSpec

    recs = []
    for seed in range(3):
        m = {"attr/n_images": 5.0, "test/acc": 0.8}
        for metric in FAITHFULNESS:
            good = 0.2 if metric in LOWER_IS_BETTER else 0.8
            bad = 0.4 if metric in LOWER_IS_BETTER else 0.6
            m[f"attr/mda/{metric}"] = good + 0.001 * seed
            for b in BASELINES:
                m[f"attr/{b}/{metric}"] = bad
            if FAITHFULNESS.index(metric) < seed:  # seed s: one baseline second on s metrics, so the ranks spread
                m[f"attr/{BASELINES[0]}/{metric}"] = bad + (-0.01 if metric in LOWER_IS_BETTER else 0.01)
        curve = [(i, 0.5 - 0.01 * min(i, 5) + 0.0001 * seed) for i in range(10)]
        recs.append(RunRecord(tmp_path / str(seed), f"subject_s{seed}", seed, m, {"val/loss": curve}))
    gains = gain_over_best(recs, FAITHFULNESS)
    assert len(gains) == 3 and min(gains.values()) > 0.3  # (0.8-0.6)/0.6 and (0.4-0.2)/0.4 -> 0.41 on average
    verdicts, *_ = judge_page(ClaimSpec.from_dict("mda", load_spec("mda")), recs, tmp_path)
    by_id = {v.id: v for v in verdicts}
    assert by_id["mda_mean_rank"].verdict == stats.REPRODUCED and by_id["mda_mean_rank"].diff > 0
    assert by_id["mda_every_metric"].verdict == stats.REPRODUCED and "on 10/10 metrics" in by_id["mda_every_metric"].why


def test_benchmark_runs_at_the_end_of_trainer_test(tmp_path: Path):
    """The attribution benchmark inside ``trainer.test`` (inference-mode tensors, logging, the example grid)."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    net = tiny_vit()
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = net(x).argmax(1)
    attribution = {
        "enabled": True,
        "n_images": 2,
        "methods": ["mda", "rollout"],
        "mda_variants": {"mda": {}},
        "patch_count": 16,
        "min_confidence": 0.0,
        "mda": {"blur_klen": [3, 2, 5], "blur_max_conf": 1.0},
    }
    module = MdaLitModule(net, num_classes=3, attribution=attribution)
    trainer = pl.Trainer(
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.test(module, dataloaders=DataLoader(TensorDataset(x, y), batch_size=4))
    m = trainer.callback_metrics
    assert float(m["attr/n_images"]) == 2 and 0.0 <= float(m["attr/mda/rise_ins"]) <= 1.0
    assert float(m["attr/mda/forwards"]) > 16 and (tmp_path / "mda_examples.png").stat().st_size > 1000


def test_binary_subject_metrics_take_one_score_per_image():
    """num_classes=2 makes the suite's metrics torchmetrics' binary task: [B] scores, not [B, 2] logits."""
    from lightning_modules._base import metric_inputs

    torch.manual_seed(0)
    net = VisionTransformer(
        img_size=8, patch_size=2, in_chans=1, num_classes=2, embed_dim=16, depth=1, num_heads=2, mlp_ratio=2.0
    )
    m = MdaLitModule(net, num_classes=2)
    x, y = torch.rand(6, 1, 8, 8), torch.tensor([0, 1, 1, 0, 1, 0])
    logits = m(x)
    scores = metric_inputs(logits, 2)
    assert scores.shape == (6,)
    torch.testing.assert_close(scores, torch.softmax(logits, 1)[:, 1])
    assert metric_inputs(logits.repeat(1, 5), 10).shape == (6, 10)  # multiclass: logits unchanged
    with pytest.raises(ConfigError, match="num_classes=3"):
        metric_inputs(logits, 3)
    m.train_metrics.update(scores, y)
    acc = float(m.train_metrics.compute()["train/acc"])
    assert acc == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    m.val_metrics.reset()
    m.validation_step((x, y), 0)  # the step itself updates the binary metrics without a shape error
    assert float(m.val_metrics.compute()["val/acc"]) == pytest.approx(acc)


def test_default_run_measures_mda_and_a_run_that_measured_nothing_says_so(tmp_path: Path, caplog):
    """`make train METHOD=mda` scores MDA (attribution on by default); a benchmark whose images all
    fail the paper's filters says so in one line instead of logging attr/n_images 0 silently."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from tests.conftest import compose_train

    assert compose_train(["experiment=mda"], tmp_path).model.attribution.enabled is True
    net = tiny_vit()
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = net(x).argmax(1)
    attribution = {
        "enabled": True,
        "n_images": 2,
        "methods": ["mda"],
        "mda_variants": {"mda": {}},
        "patch_count": 16,
        "min_confidence": 0.99,
    }
    trainer = pl.Trainer(
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    with caplog.at_level("WARNING", logger="lightning_modules.mda.module"):
        trainer.test(
            MdaLitModule(net, num_classes=3, attribution=attribution),
            dataloaders=DataLoader(TensorDataset(x, y), batch_size=4),
        )
    assert float(trainer.callback_metrics["attr/n_images"]) == 0
    assert [r.getMessage() for r in caplog.records if r.name == "lightning_modules.mda.module"] == [
        "mda: attribution measured nothing: 0 of 2 clean test images usable (0 misclassified, 2 below "
        "min_confidence=0.99, 0 without a blur calibration); train the subject longer or raise "
        "model.attribution.n_images"
    ]
