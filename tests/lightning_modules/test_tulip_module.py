"""TULIP's stages: the chain through run folders (train entry point), stage entry (copy, freeze, NTK, stretch),
optimiser groups, and the one-line errors of a stage run without its previous stage."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from core.errors import CheckpointError, ConfigError
from layers.vision_language import build_open_clip, clip_loss, pca_features, stretch_positions
from lightning_modules.tulip import TulipLitModule
from ops.rope import ntk_theta
from tests._helpers.tulip import TOWERS, net_overrides
from tests.conftest import run_entry

NET = TOWERS
TINY = [
    "logger=csv",
    "trainer.enable_progress_bar=false",
    "data.image_size=16",
    "data.short_context=12",
    "data.long_context=36",
    "data.train_families=4",
    "data.val_families=2",
    "data.test_families=2",
    "data.batch_size=8",
    "data.min_details=1",
    "data.max_details=2",
    *net_overrides(),
    "model.longclip_keep=4",
    "model.length_bins=[30]",
    "trainer.val_check_interval=null",
    "trainer.check_val_every_n_epoch=1",
    "model.warmup_steps=1",
]


def _run(tmp_path: Path, name: str, *extra: str) -> tuple[int, Path | None]:
    logs = tmp_path / name
    code = run_entry("train", ["experiment=tulip", *TINY, f"paths.log_dir={logs}", *extra])
    runs = list((logs / "train" / "tulip" / "runs").glob("*")) if (logs / "train").exists() else []
    return code, (runs[0] if runs else None)


def test_stages_chain_through_run_folders(tmp_path, capsys):
    code, first = _run(tmp_path, "s1", "model.stages=[clip,distill]", "model.stage_steps={clip:3,distill:2}")
    assert code == 0, capsys.readouterr().err[-2000:]
    state = torch.load(first / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["state_dict"]["done"].tolist() == [True, True, False] and state["global_step"] == 5
    # metrics named for what they are: no `val/loss` standing for minus R@1, no `lr-*` bookkeeping
    metrics = json.loads((first / "metrics.json").read_text())
    assert "val/long_r1" in metrics and "val/loss" not in metrics
    assert [k for k in metrics if k.startswith("lr-")] == [], sorted(metrics)
    # the token embedding is frozen in stage 1: still the teacher's; the blocks moved
    sd = state["state_dict"]
    assert torch.equal(sd["student.token_embedding.weight"], sd["teacher.text.token_embedding.weight"])
    assert not torch.equal(sd["student.ln_final.weight"], sd["teacher.text.ln_final.weight"]) or not torch.equal(
        sd["student.transformer.resblocks.0.attn.in_proj_weight"],
        sd["teacher.text.transformer.resblocks.0.attn.in_proj_weight"],
    )
    # stage 2 from the run folder (through the config): it starts from the distilled student, NTK-expanded
    net = build_open_clip(**NET)
    mod = TulipLitModule(net, long_context=36, stages=["expand"], init_from=str(first), stage_steps={"expand": 2})
    for k, v in sd.items():
        if k.startswith("student."):
            torch.testing.assert_close(mod.state_dict()[k], v, rtol=0, atol=0)
    code, second = _run(
        tmp_path, "s2", "model.stages=[expand]", f"model.init_from={first}", "model.stage_steps={expand:2}"
    )
    assert code == 0, capsys.readouterr().err[-2000:]
    assert torch.load(second / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]["done"].all()
    # a stage-2 run from a CLIP-only run refuses, naming the command that makes stage 1
    code, clip_only = _run(tmp_path, "s0", "model.stages=[clip]", "model.stage_steps={clip:2}")
    assert code == 0
    capsys.readouterr()
    code, _ = _run(tmp_path, "s3", "model.stages=[expand]", f"model.init_from={clip_only}")
    err = capsys.readouterr().err
    assert code == 2 and "no distilled student" in err and "model.stages=[clip,distill]" in err, err[-2000:]


def test_stage_two_without_stage_one_is_one_line():
    with pytest.raises(ConfigError, match=r"make train METHOD=tulip ARGS=\"model.stages=\[clip,distill\]\""):
        TulipLitModule(build_open_clip(**NET), long_context=36, stages=["expand"])
    with pytest.raises(CheckpointError, match="no checkpoint there"):
        TulipLitModule(build_open_clip(**NET), long_context=36, stages=["expand"], init_from="no/such/run")
    with pytest.raises(ConfigError, match="require_distill=false"):
        TulipLitModule(build_open_clip(**NET), long_context=36, stages=["clip", "expand"])
    with pytest.raises(ConfigError, match="text_tower"):
        TulipLitModule(build_open_clip(**NET), long_context=36, text_tower="alibi")


def test_stage_entry_copies_expands_and_stretches():
    torch.manual_seed(0)
    mod = TulipLitModule(build_open_clip(**NET), long_context=36, ntk_scaling_factor=8.0)
    with torch.no_grad():
        mod.teacher.text.ln_final.weight.add_(1.0)
    mod._enter("distill")
    assert torch.equal(mod.student.ln_final.weight, mod.teacher.text.ln_final.weight)
    assert mod.student.context_length == 12
    names = [n for n, _ in mod._stage_parameters("distill")]
    assert names and not any(n.startswith("token_embedding") for n in names)
    mod.done[1] = True
    mod._enter("expand")
    assert mod.student.context_length == 36
    assert mod.student.theta == pytest.approx(ntk_theta(10000.0, 8.0, 36, 12, 8))
    enc, ctx = mod.eval_model()
    assert ctx == 36 and enc.text is mod.student
    groups = mod.configure_optimizers()[0][2].param_groups
    no_decay, decay = {id(p) for p in groups[1]["params"]}, {id(p) for p in groups[0]["params"]}
    assert groups[1]["weight_decay"] == 0.0 and id(mod.teacher.logit_scale) in no_decay
    assert id(mod.student.ln_final.bias) in no_decay and id(mod.student.ln_final.weight) in no_decay
    # the official groups: every matrix not named bn/ln/bias/logit_scale is decayed, position tables included
    assert id(mod.teacher.visual.positional_embedding) in decay and id(mod.student.text_projection) in decay
    assert groups[0]["weight_decay"] == 0.1 and all(p.ndim >= 2 for p in groups[0]["params"])
    no_ntk = TulipLitModule(build_open_clip(**NET), long_context=36, ntk_scaling_factor=None)
    no_ntk._enter("expand")
    assert no_ntk.student.theta == 10000.0 and no_ntk.student.context_length == 36
    official = TulipLitModule(build_open_clip(**NET), long_context=36, ntk_lengths=[231, 248])  # the official flags
    official._enter("expand")
    assert official.student.context_length == 36
    assert official.student.theta == pytest.approx(ntk_theta(10000.0, 8.0, 231, 248, 8))
    assert official.student.theta < 10000.0  # the official ratio 8 * 231 / 248 - 7 < 1 shrinks the base
    with pytest.raises(ConfigError, match="model.ntk_lengths"):
        TulipLitModule(build_open_clip(**NET), long_context=36, ntk_lengths=[231])
    lc = TulipLitModule(
        build_open_clip(**NET),
        long_context=36,
        text_tower="longclip",
        longclip_keep=4,
        stages=["clip", "expand"],
        longclip_pca_dim=4,
    )
    lc._enter("expand")
    pos, src = lc.student.positional_embedding, lc.teacher.text.positional_embedding
    assert pos.shape[0] == 36 and torch.equal(pos[:4], src[:4]) and torch.allclose(pos[4::4], src[4:])


def _batch(n: int = 6, long: int = 36, short: int = 12) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = {"image": torch.randn(n, 3, 16, 16, generator=g)}
    for key, length in (("long", long), ("short", short)):
        ids = torch.randint(1, 49000, (n, length), generator=g)
        ids[:, 0], ids[:, -1] = 49406, 49407  # SOT ... EOT
        out[key] = ids
    return out


def test_stage_two_loss_weighs_long_and_short_captions():
    torch.manual_seed(0)
    mod = TulipLitModule(build_open_clip(**NET), long_context=36, stages=["clip", "expand"], require_distill=False)
    assert (mod.long_weight, mod.short_weight) == (0.8, 0.2)  # the released recipe is the default
    mod._enter("expand")
    batch = _batch()
    with torch.no_grad():
        mod.long_weight, mod.short_weight = 1.0, 0.0
        long = mod._loss("expand", batch)
        mod.long_weight, mod.short_weight = 0.0, 1.0
        short = mod._loss("expand", batch)
        assert abs(long - short) > 1e-3  # the two terms differ, so a wrong weighting shows
        for lw, sw in ((0.8, 0.2), (1.0, 1.0)):
            mod.long_weight, mod.short_weight = lw, sw
            torch.testing.assert_close(mod._loss("expand", batch), lw * long + sw * short)
    with pytest.raises(ConfigError, match="model.long_weight=0"):
        TulipLitModule(build_open_clip(**NET), long_context=36, long_weight=0.0, short_weight=0.0)


def test_longclip_freezes_the_kept_positions_and_filters_the_short_loss_by_pca():
    torch.manual_seed(0)
    lc = TulipLitModule(
        build_open_clip(**NET),
        long_context=36,
        text_tower="longclip",
        longclip_keep=4,
        stages=["clip", "expand"],
        longclip_pca_dim=2,
        long_weight=1.0,
        short_weight=1.0,
    )
    lc._enter("expand")
    teacher_pos = lc.teacher.text.positional_embedding.detach().clone()
    enc, ctx = lc.model_for("expand")
    batch = _batch()
    # the short-caption loss matches the short captions with the image features filtered to 2 principal components
    f_i = enc.encode_image(batch["image"])
    want = clip_loss(f_i, enc.encode_text(batch["long"]), enc.scale()) + clip_loss(
        pca_features(f_i, 2), enc.encode_text(batch["short"]), enc.scale()
    )
    loss = lc._loss("expand", batch)
    torch.testing.assert_close(loss, want)
    plain = clip_loss(f_i, enc.encode_text(batch["long"]), enc.scale()) + clip_loss(
        f_i, enc.encode_text(batch["short"]), enc.scale()
    )
    assert abs(loss - plain) > 1e-3  # PCA changes the loss, so ignoring it shows
    # the kept rows get no update: one optimiser step of the expand stage leaves them, and moves the others
    opt = lc.configure_optimizers()[0][1]
    opt.zero_grad()
    loss.backward()
    opt.step()
    pos = lc.student.positions(36).detach()
    torch.testing.assert_close(pos[:4], teacher_pos[:4], rtol=0, atol=0)
    assert not torch.allclose(pos[4:], stretch_positions(teacher_pos, 4, 4)[4:])
    with pytest.raises(ConfigError, match="model.longclip_pca_dim=16"):
        TulipLitModule(
            build_open_clip(**NET),
            long_context=36,
            text_tower="longclip",
            longclip_keep=4,
            stages=["clip", "expand"],
            longclip_pca_dim=16,
        )


def test_pca_features_keep_the_top_components():
    g = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(6, 3, generator=g, dtype=torch.float64))[0]  # [6, 3] orthonormal
    coef = torch.randn(20, 3, generator=g, dtype=torch.float64) * torch.tensor([5.0, 2.0, 0.5], dtype=torch.float64)
    x = coef @ basis.T + 3.0
    torch.testing.assert_close(pca_features(x, 3), x)  # rank 3 around its mean: 3 components reconstruct it
    one = pca_features(x, 1)
    centred = x - x.mean(0)
    top = torch.linalg.svd(centred)[2][0]
    torch.testing.assert_close(one - x.mean(0), torch.outer(centred @ top, top))


def test_temperature_keeps_its_gradient_at_the_cap_and_is_clamped_after_the_step():
    torch.manual_seed(0)
    mod = TulipLitModule(build_open_clip(**NET), long_context=36, stages=["clip"])
    opts, scheds = mod.configure_optimizers()
    mod.optimizers, mod.lr_schedulers = (lambda: opts), (lambda: scheds)
    mod.manual_backward, mod.log = (lambda loss: loss.backward()), (lambda *a, **k: None)
    cap = math.log(100.0)
    with torch.no_grad():
        mod.teacher.logit_scale.fill_(cap + 0.5)  # beyond the cap, where a step can leave it
    mod._step("clip", _batch())
    assert mod.teacher.logit_scale.grad.abs().item() > 1e-6, "a clamp in the forward would cut this gradient"
    assert mod.teacher.logit_scale.item() == pytest.approx(cap)  # the parameter is clamped after the step


def test_stage_two_keeps_the_teachers_text_projection():
    for choice in ("teacher", "student"):
        mod = TulipLitModule(build_open_clip(**NET), long_context=36, expand_projection=choice)
        mod._enter("distill")
        with torch.no_grad():
            mod.student.text_projection.add_(1.0)  # as stage 1 moves it
        distilled = mod.student.text_projection.detach().clone()
        mod.done[1] = True
        mod._enter("expand")
        want = mod.teacher.text.text_projection.detach() if choice == "teacher" else distilled
        torch.testing.assert_close(mod.student.text_projection.detach(), want, rtol=0, atol=0)
    with pytest.raises(ConfigError, match="model.expand_projection='last'"):
        TulipLitModule(build_open_clip(**NET), long_context=36, expand_projection="last")
