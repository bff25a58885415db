"""TULIP's towers: open_clip parity and checkpoint loading, student == teacher at identity RoPE and zero positions,
SDPA == naive attention (float64, outputs and gradients), Long-CLIP stretching, NTK expansion, gradients."""

from __future__ import annotations

import json

import open_clip
import pytest
import torch

from core.errors import CheckpointError, ConfigError
from layers.vision_language import (
    AbsoluteTextTower,
    DualEncoder,
    RoPETextTower,
    build_open_clip,
    clip_loss,
    distill_loss,
    stretch_positions,
)
from ops.rope import ntk_theta
from tests._helpers.tulip import TOWERS

SIZES = {**TOWERS, "text_layers": 2}  # the tower tests stack two text layers


def tokens(batch: int, length: int, eot_at: list[int], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(1, 49000, (batch, length), generator=g)
    for b, e in enumerate(eot_at):
        t[b, e], t[b, e + 1 :] = 49407, 0
    return t


def test_dual_encoder_equals_open_clip_and_a_saved_state_dict_loads_unchanged(tmp_path):
    torch.manual_seed(0)
    clip = build_open_clip(**SIZES)
    enc = DualEncoder.from_open_clip(clip)
    t, img = tokens(3, 12, [4, 11, 7]), torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(enc.text(t), clip.encode_text(t), rtol=0, atol=0)
        torch.testing.assert_close(enc.visual(img), clip.encode_image(img), rtol=0, atol=0)
        torch.testing.assert_close(enc.text(t[:, :8]), enc.text(torch.cat([t[:, :8], torch.zeros(3, 4).long()], 1)))
    # a named open_clip architecture + a local checkpoint file, as a user with ViT-B/16 weights runs it
    cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 16, "layers": 1, "width": 16, "head_width": 8, "patch_size": 8},
        "text_cfg": {"context_length": 12, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 2},
    }
    (tmp_path / "tulip-tiny-test.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(tmp_path)
    torch.save({"state_dict": clip.state_dict()}, tmp_path / "clip.pt")
    loaded = DualEncoder.from_open_clip(build_open_clip("tulip-tiny-test", str(tmp_path / "clip.pt")))
    with torch.no_grad():
        torch.testing.assert_close(loaded.text(t), enc.text(t), rtol=0, atol=0)
        torch.testing.assert_close(loaded.visual(img), enc.visual(img), rtol=0, atol=0)
    with pytest.raises(CheckpointError, match="does not exist"):
        build_open_clip("tulip-tiny-test", str(tmp_path / "nope.pt"))
    (tmp_path / "bad.pt").write_bytes(b"\x80garbage")
    with pytest.raises(CheckpointError, match="bad.pt"):
        build_open_clip("tulip-tiny-test", str(tmp_path / "bad.pt"))


def test_vit_b16_architecture_builds_offline_on_the_meta_device():
    with torch.device("meta"):
        model = build_open_clip("ViT-B-16")
    text = AbsoluteTextTower.from_open_clip(model)
    assert text.context_length == 77 and text.transformer.width == 512
    student = RoPETextTower.from_teacher(text, heads=8)
    assert student.head_dim == 64 and not hasattr(student, "positional_embedding")


def test_student_equals_teacher_with_identity_rope_and_zero_positions():
    torch.manual_seed(1)
    teacher = build_open_clip(**SIZES).double()
    tower = AbsoluteTextTower.from_open_clip(teacher)
    with torch.no_grad():
        tower.positional_embedding.zero_()
    student = RoPETextTower.from_teacher(tower, heads=2, attention="naive").double()
    student.angles.zero_()  # identity rotation (theta -> inf still turns the first pair, see tests/ops/test_rope.py)
    t = tokens(4, 12, [3, 11, 6, 9])
    torch.testing.assert_close(student(t), tower(t), rtol=1e-12, atol=1e-12)
    assert student.token_embedding.weight.data_ptr() != tower.token_embedding.weight.data_ptr()  # a copy
    student.set_rope(12, 10000.0)
    assert (student(t) - tower(t)).abs().max() > 1e-4  # with rotation, it differs


def test_sdpa_equals_naive_attention_outputs_and_gradients():
    torch.manual_seed(2)
    tower = AbsoluteTextTower.from_open_clip(build_open_clip(**SIZES))
    fast = RoPETextTower.from_teacher(tower, heads=2).double()
    slow = RoPETextTower.from_teacher(tower, heads=2, attention="naive").double()
    slow.load_state_dict(fast.state_dict())
    t = tokens(3, 10, [9, 2, 5])
    a, b = fast(t), slow(t)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    a.square().sum().backward()
    b.square().sum().backward()
    for (name, p), q in zip(fast.named_parameters(), slow.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12, msg=name)


def test_long_clip_stretching():
    pos = torch.randn(77, 8, dtype=torch.float64)
    out = stretch_positions(pos, keep=20, factor=4)
    assert out.shape == (248, 8)  # 20 + 57 * 4, Long-CLIP's context
    torch.testing.assert_close(out[:20], pos[:20], rtol=0, atol=0)
    torch.testing.assert_close(out[20::4], pos[20:], rtol=0, atol=0)  # every kept source row on its new index
    torch.testing.assert_close(out[22], (pos[20] + pos[21]) / 2)  # halfway between rows 20 and 21
    torch.testing.assert_close(out[247], pos[76] + 0.75 * (pos[76] - pos[75]))  # extrapolated tail
    tower = AbsoluteTextTower.from_open_clip(build_open_clip(**SIZES))
    tower.stretch(keep=4, factor=4)
    assert tower.context_length == 4 + 8 * 4 and tower(tokens(2, 36, [35, 20])).shape == (2, 16)
    with pytest.raises(ConfigError, match="keep=12"):
        stretch_positions(pos[:12], keep=12)


def test_ntk_expansion_and_length_check():
    tower = AbsoluteTextTower.from_open_clip(build_open_clip(**SIZES))
    student = RoPETextTower.from_teacher(tower, heads=2)
    theta = student.expand(48, old_length=12, scaling_factor=8.0)
    assert theta == pytest.approx(ntk_theta(10000.0, 8.0, 48, 12, 8)) and student.context_length == 48
    assert student(tokens(2, 48, [47, 30])).isfinite().all()
    assert student.expand(96, old_length=48, scaling_factor=None) == pytest.approx(theta)  # no-NTK ablation
    with pytest.raises(ConfigError, match="exceeds the tower's context 96"):
        student(tokens(1, 97, [96]))


@pytest.mark.parametrize("kind", ["rope", "absolute"])
def test_every_parameter_gets_a_gradient(kind):
    torch.manual_seed(3)
    enc = DualEncoder.from_open_clip(build_open_clip(**SIZES))
    if kind == "rope":
        enc = enc.with_text(RoPETextTower.from_teacher(enc.text, heads=2))
    t = tokens(4, 12, [11, 11, 11, 11])  # every position used, so every absolute position row gets a gradient
    img = torch.randn(4, 3, 16, 16)
    f_i, f_t = enc.encode_image(img), enc.encode_text(t)
    loss = clip_loss(f_i, f_t, enc.scale()) + distill_loss(f_t.detach(), f_t * 2, "l2")
    loss.backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_distillation_losses():
    a, b = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    assert distill_loss(a, a).item() == pytest.approx(0.0, abs=1e-12)
    assert distill_loss(a, 3 * a).item() == pytest.approx(0.0, abs=1e-12)  # cosine ignores the scale
    assert distill_loss(a, b, "mse").item() == pytest.approx(((a - b) ** 2).mean().item())
    assert distill_loss(a, b, "l2").item() == pytest.approx((a - b).norm(dim=1).mean().item())


def test_quick_gelu_for_openai_weights():
    from open_clip.transformer import QuickGELU

    acts = lambda m: {type(b.mlp.gelu) for b in m.transformer.resblocks}  # noqa: E731
    assert acts(build_open_clip(**SIZES)) == {torch.nn.GELU}
    assert acts(build_open_clip(**SIZES, quick_gelu=True)) == {QuickGELU}
    with torch.device("meta"):
        vit = build_open_clip(model_name="ViT-B-16", quick_gelu=True)
    assert acts(vit) == {QuickGELU} and {type(b.mlp.gelu) for b in vit.visual.transformer.resblocks} == {QuickGELU}
    # the paper profile loads OpenAI's ViT-B/16 weights, so it must build the QuickGELU architecture
    import yaml

    from tests.conftest import ROOT

    spec = yaml.safe_load((ROOT / "conf" / "claim" / "paper" / "tulip.yaml").read_text())
    assert "model.net.model_name=ViT-B-16 model.net.quick_gelu=true" in spec["overrides"]
