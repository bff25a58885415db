"""BracketIRELitModule: supervised learning falls, adaptation never reads the ground truth and moves the EMA teacher,
metrics on the tone-mapped sRGB, the warm-up schedule and one-line errors."""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import pytest
import torch

from core.errors import CheckpointError, ConfigError
from layers.vision.tmrnet import TMRNet
from lightning_modules.bracketire import BracketIRELitModule
from lightning_modules.bracketire.module import MODULE_OWNED
from lightning_modules.bracketire.schedule import cosine_warmup_factor
from ops.isp.deform import batched_modulated_deform_conv2d
from ops.isp.losses import synthetic_loss

TINY = {
    "net": {
        "channels": 4,
        "n_feat": 1,
        "n_common": 1,
        "n_specific": 1,
        "n_recon": 1,
        "dcn_groups": 2,
        "dcn_impl": "batched",
    }
}


def _batch(b=2, hw=8, seed=0, gt=True):
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(b, 1, 4, hw, hw, generator=g) * 2
    scales = torch.tensor([1 / 16, 1 / 4, 1, 4, 16])[None, :, None, None, None]
    raws = (base * scales).clamp(0, 1)
    out = {
        "raws": raws,
        "flow": torch.zeros(b, 5, 2),
        "meta": {
            "red_gain": torch.full((b,), 1.8),
            "blue_gain": torch.full((b,), 1.5),
            "cam2rgb": torch.eye(3).expand(b, 3, 3),
        },
    }
    if gt:
        out["gt"] = base[:, 0]
    return out


@pytest.mark.parametrize("arch", ["tmrnet", "shared", "single", "early"])
def test_model_net_sets_every_network_argument(arch):
    """Each ``model.net`` key reaches the network ``arch`` builds; the baselines take its width and blocks
    (``n_common + n_specific`` body blocks); missing keys are TMRNet's defaults, recorded in the hyper-parameters."""
    net = {"channels": 6, "n_feat": 3, "n_common": 2, "n_specific": 4, "n_recon": 1, "dcn_groups": 3}
    net |= {"alpha_init": 0.25, "alpha_learnable": False, "flow": "oracle", "max_offset": 2.5, "dcn_impl": "batched"}
    m = BracketIRELitModule(net=net, arch=arch, frames=4)
    assert m.hparams.net == net  # every TMRNet argument but the module's own frames / arch / scale
    assert BracketIRELitModule(net={"channels": 8}).hparams.net == {
        k: p.default for k, p in inspect.signature(TMRNet).parameters.items() if k not in MODULE_OWNED
    } | {"channels": 8}
    n, blocks = m.net, lambda seq: len(seq) - 2  # ResidualBlocksWithInputConv: conv, lrelu, then the blocks
    assert n.feat[0].out_channels == 6 and blocks(n.feat) == 3 and blocks(n.recon.body) == 1
    if arch in ("tmrnet", "shared"):
        assert blocks(n.common) == 2 and n.flow_mode == "oracle" and n.num_frames == 4
        assert n.align.groups == 3 and n.align.max_mag == 2.5 and n.align.dcn is batched_modulated_deform_conv2d
        if arch == "tmrnet":
            assert [blocks(b) for b in n.branches] == [4] * 4
            assert "alpha" not in dict(n.named_parameters()) and torch.all(n.alpha == 0.25)
        else:
            assert not hasattr(n, "branches")
    else:
        assert blocks(n.body) == 2 + 4
        assert n.feat[0].in_channels == (8 * 4 if arch == "early" else 8)


def test_supervised_steps_reduce_the_mu_law_loss():
    torch.manual_seed(0)
    m = BracketIRELitModule(**TINY)
    batch = _batch()
    opt = torch.optim.AdamW(m.trainable_parameters(), lr=5e-3)
    raws, flow = m._inputs(batch)
    first = float(synthetic_loss(m(raws, flow), batch["gt"]))
    for _ in range(12):
        loss = synthetic_loss(m(raws, flow), batch["gt"])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(synthetic_loss(m(raws, flow), batch["gt"])) < 0.8 * first


def test_adaptation_uses_no_ground_truth_and_the_teacher_follows(tmp_path: Path):
    torch.manual_seed(0)
    sup = BracketIRELitModule(**TINY)
    ckpt = tmp_path / "sup.ckpt"
    torch.save({"state_dict": sup.state_dict()}, ckpt)
    m = BracketIRELitModule(mode="adapt", init_ckpt=str(ckpt), ema_decay=0.5, **TINY)
    assert all(torch.equal(a, b) for a, b in zip(m.net.state_dict().values(), sup.net.state_dict().values()))
    assert {id(p) for p in m.trainable_parameters()}.isdisjoint({id(p) for p in m.teacher.parameters()})
    opt = torch.optim.AdamW(m.trainable_parameters(), lr=1e-2)
    batch = _batch(gt=False)  # the shifted domain's training split: no "gt" key at all
    m.log = lambda *a, **k: None
    before = [p.detach().clone() for p in m.teacher.parameters()]
    loss = m.training_step(batch, 0)
    assert math.isfinite(float(loss))
    opt.zero_grad()
    loss.backward()
    opt.step()
    m.on_train_batch_end(None, batch, 0)
    moved = [float((p - q).abs().max()) for p, q in zip(m.teacher.parameters(), before)]
    student = [float((p - q).abs().max()) for p, q in zip(m.net.parameters(), before)]
    assert max(moved) > 0 and max(moved) == pytest.approx(0.5 * max(student), rel=1e-4)


def test_metrics_score_tonemapped_srgb_with_a_border_crop():
    m = BracketIRELitModule(arch="average", crop=1, **TINY)
    m.log, m.log_dict = (lambda *a, **k: None), (lambda *a, **k: None)
    batch = _batch(hw=10)  # 10 x 10 less a 1-pixel border: 8 x 8, at least SSIM's 7 x 7 window
    m._score(batch, "test")
    psnr = float(m.test_metrics["psnr"].compute())
    assert 10 < psnr < 60  # averaging clipped frames is imperfect but close
    perfect = dict(batch, gt=m(*m._inputs(batch)))
    m.test_metrics.reset()
    m._score(perfect, "test")
    assert float(m.test_metrics["psnr"].compute()) > 90 and float(m.test_metrics["ssim"].compute()) > 0.999


def test_schedule_warms_up_then_decays():
    assert cosine_warmup_factor(0, 10, 100) == pytest.approx(0.1)
    assert cosine_warmup_factor(9, 10, 100) == pytest.approx(1.0)
    assert cosine_warmup_factor(55, 10, 100) == pytest.approx(0.5)
    assert cosine_warmup_factor(100, 10, 100) == pytest.approx(0.0)
    assert cosine_warmup_factor(500, 10, -1) == 1.0


def test_bad_input_and_configuration_are_one_line(tmp_path: Path):
    m = BracketIRELitModule(**TINY)
    bad = _batch()
    bad["raws"] = bad["raws"][:, :3]
    with pytest.raises(ConfigError, match=r"T >= 5"):
        m._inputs(bad)
    with pytest.raises(ConfigError, match="model.arch"):
        BracketIRELitModule(arch="hdrnet")
    with pytest.raises(ConfigError, match=r"model.net has unknown keys \['chanels'\]"):
        BracketIRELitModule(net={"chanels": 8})
    with pytest.raises(ConfigError, match="model.net.scale is set by model.scale"):
        BracketIRELitModule(net={"scale": 4})
    with pytest.raises(ConfigError, match="model.net.channels='8' must be int"):
        BracketIRELitModule(net={"channels": "8"})
    with pytest.raises(ConfigError, match="model.net.channels=6 must be a positive multiple of model.net.dcn_groups=4"):
        BracketIRELitModule(net={"channels": 6, "dcn_groups": 4})
    with pytest.raises(ConfigError, match="model.net.flow='spynet'"):
        BracketIRELitModule(net={"flow": "spynet"})
    with pytest.raises(ConfigError, match="init_ckpt"):
        BracketIRELitModule(mode="adapt", **TINY)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        BracketIRELitModule(mode="adapt", init_ckpt=str(tmp_path / "none.ckpt"), **TINY)
    (tmp_path / "junk.ckpt").write_bytes(b"\x80\xff junk")
    with pytest.raises(CheckpointError, match="cannot be read"):
        BracketIRELitModule(init_ckpt=str(tmp_path / "junk.ckpt"), **TINY)
    with pytest.raises(ConfigError, match="ground truth: the shifted"):
        m.training_step(_batch(gt=False), 0)
    small = BracketIRELitModule(crop=3, **TINY)  # 8x8 output less 3 per border: 2x2 < SSIM's 7x7 window
    with pytest.raises(ConfigError, match=r"scored area \(2, 2\).*model.ssim_kernel=7"):
        small.validation_step(_batch(), 0)


@pytest.mark.parametrize("kernel", [3, 7, 11])
def test_ssim_window_is_model_ssim_kernel(kernel):
    """``ssim_kernel`` sets SSIM's Gaussian window (torchmetrics ignores kernel_size unless sigma matches it): the
    score equals a direct k x k Gaussian SSIM with sigma 1.5 k / 11, and 7 and 11 give different scores."""
    from torchmetrics.functional.image import structural_similarity_index_measure as ssim

    g = torch.Generator().manual_seed(1)
    a = torch.rand(2, 3, 16, 16, generator=g, dtype=torch.float64)
    b = (a + 0.2 * torch.rand(2, 3, 16, 16, generator=g, dtype=torch.float64)).clamp(0, 1)
    metric = BracketIRELitModule(ssim_kernel=kernel, **TINY).test_metrics["ssim"]
    metric.update(b, a)
    got = float(metric.compute())
    x = torch.arange(kernel, dtype=torch.float64) - kernel // 2
    gauss = torch.exp(-(x**2) / (2 * (1.5 * kernel / 11) ** 2))
    w = (gauss[:, None] * gauss[None]) / gauss.sum() ** 2  # the normalised k x k Gaussian window
    pad = kernel // 2
    ap, bp = (torch.nn.functional.pad(x, (pad,) * 4, mode="reflect") for x in (a, b))
    conv = lambda x: torch.nn.functional.conv2d(x, w.expand(3, 1, kernel, kernel), groups=3)  # noqa: E731
    mu_a, mu_b = conv(ap), conv(bp)
    s_aa, s_bb, s_ab = conv(ap * ap) - mu_a**2, conv(bp * bp) - mu_b**2, conv(ap * bp) - mu_a * mu_b
    c1, c2 = 0.01**2, 0.03**2
    ref = ((2 * mu_a * mu_b + c1) * (2 * s_ab + c2)) / ((mu_a**2 + mu_b**2 + c1) * (s_aa + s_bb + c2))
    assert got == pytest.approx(float(ref.mean()), abs=1e-6)  # the metric's state is float32
    if kernel == 7:
        assert abs(got - float(ssim(b, a, data_range=1.0))) > 1e-3  # the 11-window default differs


@pytest.mark.parametrize("profile", ["cpu", "paper"])
def test_every_claim_entry_builds_the_network_it_names(profile, tmp_path: Path):
    """Each entry of conf/claim/bracketire.yaml (and its paper profile) composes with ``experiment=bracketire`` and
    builds its model: a stale network key in a spec fails here, not hours into a claim run."""
    from hydra.utils import instantiate

    from suite.claim import entry_command, load_spec
    from tests.conftest import compose_train

    spec = load_spec("bracketire", profile=profile)
    built = {}
    for entry in spec["runs"]:
        cmd = entry_command("bracketire", entry, spec, tmp_path, [])
        overrides = [
            o.replace("${hydra:job.num}", "0").replace("\\${", "${")
            for o in cmd[cmd.index("experiment=bracketire") :]
            if not o.startswith(("hydra.", "seed=", "logger=", "trainer.enable"))
        ]
        cfg = compose_train(overrides, tmp_path)
        if cfg.model.init_ckpt is None:  # the adaptation entries read a tmrnet run's checkpoint
            built[entry["name"]] = instantiate(cfg.model)
    blocks = lambda seq: len(seq) - 2  # noqa: E731 - ResidualBlocksWithInputConv: conv, lrelu, then the blocks
    if profile == "cpu":
        assert blocks(built["single_wide"].net.body) == 31 and blocks(built["early_wide"].net.body) == 30
        alpha1 = built["tmrnet_alpha1"].net
        assert torch.all(alpha1.alpha == 1) and "alpha" not in dict(alpha1.named_parameters())
        assert built["tmrnet_plus"].net.recon.scale == 4 and built["tmrnet_f3"].net.num_frames == 3
    else:
        tmrnet = built["tmrnet"].net
        assert tmrnet.feat[0].out_channels == 64 and [blocks(tmrnet.feat), blocks(tmrnet.common)] == [5, 16]
        assert blocks(tmrnet.branches[0]) == 24 and blocks(tmrnet.recon.body) == 5 and tmrnet.align.groups == 8
        assert tmrnet.flow_mode == "learned" and built["single"].net.feat[0].out_channels == 64
