"""Multimodal (audio-visual) data: the embedded pairs and streams, corruptions, and the READ json layout."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules.av_corruptions import corrupt_audio, corrupt_video, synth_spectrograms
from datamodules.multimodal import MultimodalDataModule, log_mel_fbank, mel_filterbank

SMALL = dict(image_source="digits", n_train=200, n_val=50, n_test=120, audio_shape=(16, 8), batch_size=32)


def make(**kw) -> MultimodalDataModule:  # noqa: ANN003
    dm = MultimodalDataModule(**{**SMALL, **kw})
    dm.setup()
    return dm


def test_embedded_shapes_sizes_and_determinism() -> None:
    dm = make(stream="wild")
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [200, 50, 120]
    (a, v), y = dm.datasets["train"][0]
    assert a.shape == (16, 8) and v.shape == (1, 8, 8) and 0 <= int(y) < 10
    (ab, vb), yb = next(iter(dm.test_dataloader()))
    assert ab.shape == (16, 16, 8) and vb.shape == (16, 1, 8, 8) and yb.shape == (16,)
    again = make(stream="wild")
    assert torch.equal(again.datasets["test"].audio, dm.datasets["test"].audio)
    assert torch.equal(again.datasets["test"].video, dm.datasets["test"].video)
    other = make(stream="wild", seed=1)
    assert not torch.equal(other.datasets["test"].labels, dm.datasets["test"].labels)
    # Clean splits are standardised with the train statistics.
    assert abs(float(dm.datasets["train"].audio.mean())) < 1e-4
    assert float(dm.datasets["train"].video.std()) == pytest.approx(1.0, abs=1e-3)


def test_audio_carries_class_pitch() -> None:
    # The synthesised spectrogram's loudest bin rises with the class pair c // 2.
    rng = np.random.default_rng(0)
    peaks = [synth_spectrograms(np.full(200, c), (32, 16), rng).mean((0, 1)).argmax() for c in (0, 2, 4, 6, 8)]
    assert peaks == sorted(peaks) and len(set(peaks)) == 5


def _audio_probe(contour: float) -> tuple[float, float]:
    """Held-out ten-class and pitch-pair accuracy of a linear probe on the audio features alone."""
    from sklearn.linear_model import LogisticRegression

    from datamodules.av_corruptions import audio_features

    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, 2400)
    x = audio_features(synth_spectrograms(y, (32, 16), rng, contour)).reshape(len(y), -1)
    pred = LogisticRegression(max_iter=500).fit(x[:1800], y[:1800]).predict(x[1800:])
    return float((pred == y[1800:]).mean()), float((pred // 2 == y[1800:] // 2).mean())


@pytest.mark.slow
def test_audio_alone_carries_the_class_so_unimodal_confidence_can_differ() -> None:
    """The generator's guarantee (SuMi issue): audio alone, without the image, identifies the class (pitch -> pair,
    contour -> which of the pair), so a sample can be confident in each modality by itself; with ``contour = 0``
    it knows only the pair (at most about half of the ten-class accuracy)."""
    acc, pair = _audio_probe(2.0)
    assert pair > 0.9 and acc > 0.78
    blind, pair0 = _audio_probe(0.0)
    assert pair0 > 0.9 and blind < 0.6
    with pytest.raises(ConfigError, match="audio_contour"):
        make(audio_contour=-1.0)


def test_streams_corrupt_the_right_modality() -> None:
    clean, video, audio = make(stream="clean"), make(stream="video"), make(stream="audio")
    assert torch.equal(clean.datasets["test"].audio, video.datasets["test"].audio)
    assert not torch.equal(clean.datasets["test"].video, video.datasets["test"].video)
    assert torch.equal(clean.datasets["test"].video, audio.datasets["test"].video)
    assert not torch.equal(clean.datasets["test"].audio, audio.datasets["test"].audio)
    assert all(m.startswith("video:") for m in video.datasets["test"].meta)
    # Training data stays clean whatever the stream.
    assert torch.equal(clean.datasets["train"].video, video.datasets["train"].video)
    missing = make(stream="missing_audio")
    assert torch.count_nonzero(missing.datasets["test"].audio) == 0
    assert torch.count_nonzero(missing.datasets["train"].audio) > 0


def test_wild_stream_mixes_targets_and_severities() -> None:
    dm = make(stream="wild", missing_rate=0.2, n_test=1000, n_train=500, n_val=100)
    meta = dm.datasets["test"].meta
    kinds = {"both" if "+" in m and "missing" not in m else m.split(":")[0] for m in meta}
    assert {"video", "audio", "both", "missing_audio", "missing_video"} <= kinds
    severities = {int(p.split(":")[2]) for m in meta for p in m.split("+") if p.count(":") == 2}
    assert severities == {1, 3, 5}
    frac_missing = sum("missing" in m for m in meta) / len(meta)
    assert 0.12 < frac_missing < 0.28
    for i, m in enumerate(meta):
        if m == "missing_video":
            assert torch.count_nonzero(dm.datasets["test"].video[i]) == 0


def test_corruptions_grow_with_severity() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.full((4, 1, 8, 8), 0.5)
    dev = [float((corrupt_video(x, "gaussian_noise", s, gen) - x).abs().mean()) for s in (1, 3, 5)]
    assert dev[0] < dev[1] < dev[2]
    contrast = [float(corrupt_video(torch.rand(4, 1, 8, 8, generator=gen), "contrast", s, gen).std()) for s in (1, 5)]
    assert contrast[1] < contrast[0]
    power = synth_spectrograms(np.arange(4), (16, 8), np.random.default_rng(0))
    added = [float((corrupt_audio(power, "traffic", s, np.random.default_rng(1)) - power).mean()) for s in (1, 3, 5)]
    assert 0 < added[0] < added[1] < added[2]
    with pytest.raises(ValueError, match="fog"):
        corrupt_video(x, "fog", 1, gen)


def test_bad_config() -> None:
    with pytest.raises(ConfigError, match="data.stream='storm'"):
        MultimodalDataModule(stream="storm")
    with pytest.raises(ConfigError, match=r"data.severities=\[0, 6\]"):
        MultimodalDataModule(severities=[0, 6])
    with pytest.raises(ConfigError, match="fog"):
        MultimodalDataModule(video_corruptions=["fog"])
    with pytest.raises(ConfigError, match="exceeds the 1797 digits images"):
        make(n_train=2000)


# -- READ layout ----------------------------------------------------------------------------------------------------
def test_mel_filterbank_and_fbank_peak() -> None:
    fb = mel_filterbank(16, 512, 16000)
    assert fb.shape == (16, 257) and torch.all(fb.sum(1) > 0)
    centres = fb.argmax(1)
    assert torch.all(centres[1:] >= centres[:-1])
    t = torch.arange(16000) / 16000
    tone = torch.sin(2 * math.pi * 1000 * t)
    spec = log_mel_fbank(tone, 16000, 16, target_length=120)
    assert spec.shape == (120, 16)
    hz_per_bin = 8000 / 256
    expected = int((fb[:, round(1000 / hz_per_bin)]).argmax())
    assert int(spec[:90].mean(0).argmax()) == expected


def write_read_layout(root, rows: list[dict], frame_k: dict[str, int] | None = None) -> None:  # noqa: ANN001
    from PIL import Image
    from scipy.io import wavfile

    (root / "class_labels_indices.csv").write_text("index,mid,display_name\n0,/m/a,alpha\n1,/m/b,beta\n")
    for r in rows:
        vid = r["video_id"]
        k = (frame_k or {}).get(vid, 5)
        (root / "frames" / f"frame_{k}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((20, 30, 3), 40 * len(vid) % 255, dtype=np.uint8)).save(
            root / "frames" / f"frame_{k}" / f"{vid}.jpg"
        )
        sig = (np.sin(2 * np.pi * 440 * np.arange(4000) / 8000) * 20000).astype(np.int16)
        (root / "audio").mkdir(exist_ok=True)
        wavfile.write(root / "audio" / f"{vid}.wav", 8000, sig)
    doc = {
        "data": [
            {
                "video_id": r["video_id"],
                "wav": f"audio/{r['video_id']}.wav",
                "video_path": "frames",
                "labels": r["labels"],
            }
            for r in rows
        ]
    }
    (root / "train.json").write_text(json.dumps(doc))
    (root / "test.json").write_text(json.dumps({"data": doc["data"][:2]}))


REAL = dict(source="real", target_length=32, num_mel_bins=16, image_size=16, val_fraction=0.25, batch_size=2)


def test_read_layout_loader(tmp_path) -> None:  # noqa: ANN001
    rows = [{"video_id": f"v{i}", "labels": "/m/a" if i % 2 else "/m/b"} for i in range(4)]
    write_read_layout(tmp_path, rows, frame_k={"v1": 3})  # v1 only has an earlier frame: the fall-back reads it
    dm = MultimodalDataModule(data_dir=str(tmp_path), **REAL)
    dm.setup()
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [3, 1, 2]
    (a, v), y = dm.datasets["test"][1]
    assert a.shape == (32, 16) and v.shape == (3, 16, 16) and int(y) == 0  # v1 -> /m/a -> index 0
    assert int(dm.datasets["test"][0][1]) == 1
    assert torch.isfinite(a).all() and float(a.std()) > 0


def test_read_layout_errors(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(MissingDataError, match="train.json"):
        MultimodalDataModule(data_dir=str(tmp_path), **REAL).setup()
    write_read_layout(tmp_path, [{"video_id": "v0", "labels": "/m/a"}, {"video_id": "v1", "labels": "/m/b"}])
    (tmp_path / "frames" / "frame_5" / "v1.jpg").unlink()
    with pytest.raises(MissingDataError, match=r"row 1: no frame .*v1.jpg"):
        MultimodalDataModule(data_dir=str(tmp_path), **REAL).setup()
    (tmp_path / "train.json").write_text(json.dumps({"data": [{"video_id": "v0", "labels": "/m/a"}]}))
    with pytest.raises(DataFormatError, match=r"train.json: row 0 lacks field\(s\) \['wav', 'video_path'\]"):
        MultimodalDataModule(data_dir=str(tmp_path), **REAL).setup()
    bad = {"data": [{"video_id": "v0", "wav": "audio/v0.wav", "video_path": "frames", "labels": "/m/zzz"}]}
    (tmp_path / "train.json").write_text(json.dumps(bad))
    with pytest.raises(DataFormatError, match="row 0 has label '/m/zzz'"):
        MultimodalDataModule(data_dir=str(tmp_path), **REAL).setup()
