"""SumiLitModule and its audio-visual transformer: modes, placeholders, gradients, config errors, learning."""

from __future__ import annotations

import pytest
import torch

from core.errors import ConfigError
from layers.multimodal import AudioVisualTransformer
from lightning_modules.sumi import SumiLitModule
from tests._helpers.tta import tiny_sumi

C = 5


def tiny(**kw) -> SumiLitModule:  # noqa: ANN003
    m = tiny_sumi(C, **kw)
    m.log = m.log_dict = lambda *a, **k: None  # noqa: ARG005 - called outside a Trainer
    return m


def batch(b: int = 6) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(b, 8, 4, generator=g), torch.randn(b, 1, 8, 8, generator=g)), torch.arange(b) % C


def test_modes_and_placeholders() -> None:
    m = tiny().eval()
    (a, v), _ = batch()
    out = m.tta_forward((a, v))
    assert out["logits"].shape == (6, C) and out["feat_a"].shape == (6, 8) and out["feat_v"].shape == (6, 8)
    torch.testing.assert_close(out["logits"], m((a, v)))
    torch.testing.assert_close(out["logits_a"], m.net(a, v, "audioonly"))
    torch.testing.assert_close(out["logits_v"], m.net(a, v, "videoonly"))
    # Unimodal passes ignore the other modality (zero placeholders); the multimodal one does not.
    torch.testing.assert_close(m.net(a, v + 5, "audioonly"), out["logits_a"])
    torch.testing.assert_close(m.net(a + 5, v, "videoonly"), out["logits_v"])
    assert not torch.allclose(m((a, v + 5)), out["logits"])
    # A modality missing from the whole batch: the multimodal forward falls back to the other's unimodal mode.
    torch.testing.assert_close(m((a, None)), out["logits_a"])
    missing = m.tta_forward((None, v))
    assert missing["logits_a"] is None and missing["feat_a"] is None
    torch.testing.assert_close(missing["logits"], out["logits_v"])
    with pytest.raises(ValueError, match="both modalities are missing"):
        m.net(None, None)
    with pytest.raises(ValueError, match=r"audio must be \[B, 8, 4\]"):
        m.net(torch.randn(2, 4, 8), v[:2])


def test_placeholder_count_matters() -> None:
    torch.manual_seed(0)
    kw = dict(audio_shape=(8, 4), audio_patch=(4, 2), image_shape=(1, 8, 8), image_patch=4, dim=8, heads=2)
    one = AudioVisualTransformer(C, **kw).eval()
    many = AudioVisualTransformer(C, placeholder_video=7, **kw).eval()
    many.load_state_dict(one.state_dict())
    (a, v), _ = batch()
    # Mean pooling runs over the zero tokens too: the code's 1 vs 317 placeholders are not interchangeable.
    assert not torch.allclose(one(a, v, "audioonly"), many(a, v, "audioonly"))
    torch.testing.assert_close(one(a, v, "multimodal"), many(a, v, "multimodal"))


def test_training_step_reaches_every_parameter() -> None:
    m = tiny(modality_dropout=0.0)
    loss = m.training_step(batch(), 0)
    assert torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert missing == []
    # Without the unimodal terms the audio/video-specific fusion norms get no gradient.
    m = tiny(modality_dropout=0.0, unimodal_weight=0.0)
    m.training_step(batch(), 0).backward()
    assert m.net.blocks_u[0].norm1_a.weight.grad is None and m.net.norm_v.weight.grad is None


def test_modality_dropout_zeroes_tokens() -> None:
    m = tiny(modality_dropout=0.99)
    torch.manual_seed(1)
    ta, tv = torch.ones(200, 3, 8), torch.ones(200, 3, 8)
    da, dv = m._drop_modalities(ta, tv)
    dropped_a = (da.sum((1, 2)) == 0).float().mean()
    dropped_v = (dv.sum((1, 2)) == 0).float().mean()
    assert 0.35 < dropped_a < 0.65 and 0.35 < dropped_v < 0.65
    assert not torch.any((da.sum((1, 2)) == 0) & (dv.sum((1, 2)) == 0))  # never both


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="model.num_classes=3 must equal model.net.num_classes=5"):
        SumiLitModule(AudioVisualTransformer(C), num_classes=3)
    with pytest.raises(ConfigError, match="modality_dropout=1.0"):
        tiny(modality_dropout=1.0)
    with pytest.raises(ConfigError, match="model.net.image_patch=5"):
        AudioVisualTransformer(C, image_patch=5)
    with pytest.raises(ConfigError, match="model.net.heads=3"):
        AudioVisualTransformer(C, dim=32, heads=3)


@pytest.mark.slow
def test_learns_embedded_pairs() -> None:
    from datamodules.multimodal import MultimodalDataModule

    dm = MultimodalDataModule(
        image_source="digits", n_train=1200, n_val=300, n_test=16, audio_shape=(16, 8), stream="clean", batch_size=64
    )
    dm.setup()
    torch.manual_seed(0)
    net = AudioVisualTransformer(
        10,
        audio_shape=(16, 8),
        audio_patch=(4, 4),
        image_shape=(1, 8, 8),
        image_patch=2,
        dim=16,
        heads=2,
        depth_specific=1,
    )
    m = SumiLitModule(net, num_classes=10)
    m.log = m.log_dict = lambda *a, **k: None  # noqa: ARG005 - called outside a Trainer
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    tr = dm.datasets["train"]
    for step in range(120):
        i = torch.randint(0, len(tr), (64,), generator=torch.Generator().manual_seed(step))
        loss = m.training_step(((tr.audio[i], tr.video[i]), tr.labels[i]), step)
        opt.zero_grad()
        loss.backward()
        opt.step()
    va = dm.datasets["val"]
    m.eval()
    with torch.no_grad():
        out = m.tta_forward((va.audio, va.video))
    acc = {k: float((out[k].argmax(-1) == va.labels).float().mean()) for k in ("logits", "logits_a", "logits_v")}
    assert acc["logits"] > 0.7  # chance is 0.1
    assert acc["logits"] >= max(acc["logits_a"], acc["logits_v"]) - 0.02  # fusion is at least as good


def test_shared_encoder_passes_match_separate_passes_float64() -> None:
    """``tta_forward`` (encoders run once, three fusion passes) against three separate ``forward_eval``-style calls:
    outputs and the gradients of SuMi's loss agree in float64."""
    from ops.tta import sumi_objective

    m = tiny().double().eval()
    (a, v), _ = batch()
    a, v = a.double(), v.double()

    def loss_of(out: dict) -> torch.Tensor:
        feat = torch.cat([out["feat_a"], out["feat_v"]], -1)
        kw = dict(gamma_m=10.0, gamma_u=0.0, use_iqr=False)
        return sumi_objective(out["logits_a"], out["logits_v"], out["logits"], feat, 0, 4, **kw).loss

    fused = m.tta_forward((a, v))
    loss_of(fused).backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    separate = {
        "logits": m.net(a, v, "multimodal"),
        "logits_a": m.net(a, v, "audioonly"),
        "logits_v": m.net(a, v, "videoonly"),
        "feat_a": m.net.encode_audio(a).mean(1),
        "feat_v": m.net.encode_video(v).mean(1),
    }
    for k in separate:
        torch.testing.assert_close(fused[k], separate[k], rtol=1e-12, atol=1e-12)
    loss_of(separate).backward()
    assert grads and set(grads) == {n for n, p in m.named_parameters() if p.grad is not None}
    for n, p in m.named_parameters():
        if n in grads:
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-10, atol=1e-12)
