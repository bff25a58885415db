"""Audio-visual classification data for multimodal test-time adaptation (SuMi, READ).

Two sources:

* ``embedded`` (default, no network): real Fashion-MNIST images (the Debian ``dataset-fashion-mnist`` files via
  :func:`datamodules.fashion_mnist.load_fashion_mnist`; sklearn's digits with ``image_source=digits``), each paired
  with a "sound" spectrogram synthesised for its class (:mod:`datamodules.av_corruptions`). The train and val
  splits are clean; the test split is the corrupted **stream** chosen by ``stream``:

  - ``clean``; ``video`` / ``audio`` / ``both``: every sample corrupted on that modality (both: independent
    corruptions on each);
  - ``missing_audio`` / ``missing_video``: that modality zeroed for every sample;
  - ``wild`` (SuMi's complex multimodal noise): per sample a random target (video, audio, both, or one modality
    missing with probability ``missing_rate``), corruption type and severity from ``severities`` (mixed weak and
    strong), in a seeded shuffled order, read once.

* ``real``: the READ benchmark's Kinetics50-C / VGGSound-C layout (CAV-MAE data json), path only: ``data_dir``
  holds ``train_json``, ``test_json`` (one corruption/severity json of READ, e.g. ``ks50_test_gaussian_noise_5.json``)
  and ``label_csv`` (``index,mid,display_name``); each json is ``{"data": [{"video_id", "wav", "video_path",
  "labels"}, ...]}``; frames are ``<video_path>/frame_<k>/<video_id>.jpg`` (middle frame ``k = 5`` of 10, lower
  ones as fall-back) and audio is a wav file turned into a Kaldi-style log-mel filterbank ``[target_length,
  num_mel_bins]``. Relative paths are resolved against ``data_dir``.

Items are ``((audio [T, F], video [C, H, W]), label)``.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules._base import ResumableLoader, SuiteDataModule, require_files, seeded_permutation, split_indices
from datamodules.av_corruptions import (
    AUDIO_CORRUPTIONS,
    VIDEO_CORRUPTIONS,
    audio_features,
    corrupt_audio,
    corrupt_video,
    synth_spectrograms,
)
from datamodules.fashion_mnist import load_digits_images, load_fashion_mnist

STREAMS = ("clean", "video", "audio", "both", "missing_audio", "missing_video", "wild")
IMAGE_SOURCES = ("fashion_mnist", "digits")
READ_HOW_TO_GET = (
    "Get Kinetics50-C / VGGSound-C from the READ benchmark (github.com/XLearning-SCU/2024-ICLR-READ): its json "
    "files, class_labels_indices csv, extracted frames and wav files, and point data.data_dir at them."
)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class PairedDataset(Dataset):
    """In-memory pairs ``((audio [T, F], video [C, H, W]), y)``; ``meta`` describes each sample's corruption."""

    def __init__(self, audio: torch.Tensor, video: torch.Tensor, labels: torch.Tensor, meta: list[str] | None = None):
        if not len(audio) == len(video) == len(labels):
            raise ValueError(f"audio/video/labels lengths differ: {len(audio)}, {len(video)}, {len(labels)}")
        self.audio, self.video, self.labels = audio, video, labels.long()
        self.meta = meta or ["clean"] * len(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        return (self.audio[i], self.video[i]), self.labels[i]


# -- the real READ layout ------------------------------------------------------------------------------------------
def mel_filterbank(n_mels: int, n_fft: int, sample_rate: int, f_min: float = 20.0) -> torch.Tensor:
    """Triangular HTK-mel filters ``[n_mels, n_fft // 2 + 1]`` (Kaldi's ``fbank`` convention)."""
    mel = lambda f: 1127.0 * math.log(1.0 + f / 700.0)  # noqa: E731
    lo, hi = mel(f_min), mel(sample_rate / 2)
    centres = torch.linspace(lo, hi, n_mels + 2)
    freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    fm = 1127.0 * torch.log1p(freqs / 700.0)
    left, mid, right = centres[:-2, None], centres[1:-1, None], centres[2:, None]
    return ((fm - left) / (mid - left)).clamp(min=0).minimum(((right - fm) / (right - mid)).clamp(min=0))


def log_mel_fbank(wave: torch.Tensor, sample_rate: int, n_mels: int, target_length: int) -> torch.Tensor:
    """Log-mel filterbank ``[target_length, n_mels]`` (25 ms Hann windows, 10 ms shift, zero-padded or cut)."""
    win, hop = int(0.025 * sample_rate), int(0.010 * sample_rate)
    wave = wave - wave.mean()
    if len(wave) < win:
        wave = torch.nn.functional.pad(wave, (0, win - len(wave)))
    n_fft = 1 << (win - 1).bit_length()
    spec = (
        torch.stft(wave, n_fft, hop, win, window=torch.hann_window(win), center=False, return_complex=True).abs() ** 2
    )
    fb = torch.log(mel_filterbank(n_mels, n_fft, sample_rate) @ spec + 1e-6).T
    if fb.shape[0] < target_length:
        fb = torch.nn.functional.pad(fb, (0, 0, 0, target_length - fb.shape[0]))
    return fb[:target_length]


def read_label_csv(path: Path) -> dict[str, int]:
    """``mid -> index`` from a CAV-MAE ``class_labels_indices.csv`` (columns ``index,mid,display_name``)."""
    out: dict[str, int] = {}
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not {"index", "mid"} <= set(reader.fieldnames):
            raise DataFormatError(f"{path}: header must have columns index,mid,display_name (got {reader.fieldnames})")
        for row_no, row in enumerate(reader, start=2):
            try:
                out[row["mid"]] = int(row["index"])
            except (TypeError, ValueError):
                raise DataFormatError(f"{path}: row {row_no} has a non-integer index {row.get('index')!r}") from None
    return out


class ReadJsonDataset(Dataset):
    """One READ / CAV-MAE data json: audio fbank + middle video frame + first label.

    Args:
        json_path: The data json.
        label_index: ``mid -> class index``.
        root: Folder that relative ``wav`` / ``video_path`` entries are resolved against.
        target_length, num_mel_bins: Filterbank shape.
        image_size: Frames are resized (shorter side) and centre-cropped to this.
        audio_mean, audio_std: Filterbank normalisation (CAV-MAE Kinetics50: -5.081, 4.4849).
        frame: Frame index to read (``frame_<k>``); lower indices are tried when it is missing.
    """

    def __init__(
        self,
        json_path: Path,
        label_index: dict[str, int],
        root: Path,
        target_length: int = 1024,
        num_mel_bins: int = 128,
        image_size: int = 224,
        audio_mean: float = -5.081,
        audio_std: float = 4.4849,
        frame: int = 5,
    ) -> None:
        try:
            doc = json.loads(json_path.read_text())
        except json.JSONDecodeError as err:
            raise DataFormatError(f"{json_path}: not valid json (line {err.lineno}: {err.msg})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
            raise DataFormatError(f'{json_path}: expected {{"data": [...]}} at the top level')
        self.items: list[tuple[Path, Path, int]] = []
        for row, entry in enumerate(doc["data"]):
            missing = [k for k in ("wav", "labels", "video_id", "video_path") if k not in entry]
            if missing:
                raise DataFormatError(f"{json_path}: row {row} lacks field(s) {missing}")
            mid = str(entry["labels"]).split(",")[0]
            if mid not in label_index:
                raise DataFormatError(f"{json_path}: row {row} has label {mid!r} not in the label csv")
            wav = Path(entry["wav"]) if Path(entry["wav"]).is_absolute() else root / entry["wav"]
            frames = Path(entry["video_path"])
            frames = frames if frames.is_absolute() else root / frames
            image = next(
                (
                    frames / f"frame_{k}" / f"{entry['video_id']}.jpg"
                    for k in range(frame, -1, -1)
                    if (frames / f"frame_{k}" / f"{entry['video_id']}.jpg").is_file()
                ),
                None,
            )
            if image is None:
                raise MissingDataError(
                    f"{json_path}: row {row}: no frame {frames}/frame_<0..{frame}>/{entry['video_id']}.jpg. "
                    f"{READ_HOW_TO_GET}"
                )
            if not wav.is_file():
                raise MissingDataError(f"{json_path}: row {row}: audio file {wav} is missing. {READ_HOW_TO_GET}")
            self.items.append((wav, image, label_index[mid]))
        self.target_length, self.num_mel_bins, self.image_size = target_length, num_mel_bins, image_size
        self.audio_mean, self.audio_std = audio_mean, audio_std

    def __len__(self) -> int:
        return len(self.items)

    def _audio(self, path: Path) -> torch.Tensor:
        from scipy.io import wavfile

        try:
            sr, data = wavfile.read(path)
        except ValueError as err:
            raise DataFormatError(f"{path}: unreadable wav ({err})") from None
        data = np.asarray(data)
        if np.issubdtype(data.dtype, np.integer):
            data = data / float(np.iinfo(data.dtype).max)
        wave = torch.as_tensor(data, dtype=torch.float32)
        wave = wave.mean(-1) if wave.dim() == 2 else wave
        fb = log_mel_fbank(wave, int(sr), self.num_mel_bins, self.target_length)
        return (fb - self.audio_mean) / self.audio_std

    def _image(self, path: Path) -> torch.Tensor:
        from PIL import Image

        with Image.open(path) as im:
            im = im.convert("RGB")
            w, h = im.size
            s = self.image_size / min(w, h)
            im = im.resize((max(self.image_size, round(w * s)), max(self.image_size, round(h * s))), Image.BICUBIC)
            w, h = im.size
            left, top = (w - self.image_size) // 2, (h - self.image_size) // 2
            im = im.crop((left, top, left + self.image_size, top + self.image_size))
            x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)
        return (x - torch.tensor(IMAGENET_MEAN)[:, None, None]) / torch.tensor(IMAGENET_STD)[:, None, None]

    def __getitem__(self, i: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        wav, image, label = self.items[i]
        return (self._audio(wav), self._image(image)), torch.tensor(label)


class MultimodalDataModule(SuiteDataModule):
    """Paired audio-visual data: clean train/val, a corrupted test stream.

    Args:
        source, data_dir, batch_size, num_workers, seed: See ``SuiteDataModule``.
        test_batch_size: Batch size of the test stream (the TTA batch; SuMi: 16 on Kinetics50-C).
        image_source: ``fashion_mnist`` or ``digits`` (embedded).
        n_train, n_val, n_test: Embedded split sizes (drawn from Fashion-MNIST's 10,000 test images, which load in
            a fraction of a second; the 60,000 train images take much longer to decompress).
        audio_shape: ``(T, F)`` of the synthesised spectrograms.
        audio_contour: Strength of the audio's cue for the second class of each pitch pair
            (:func:`datamodules.av_corruptions.synth_spectrograms`; 0: audio only knows the pair).
        stream: Test stream, one of ``clean``, ``video``, ``audio``, ``both``, ``missing_audio``,
            ``missing_video``, ``wild``.
        video_corruptions, audio_corruptions: Corruption types drawn from (``null``: all).
        severities: Severities drawn from, each in 1..5 (``[5]`` is READ's setting; ``[1, 5]`` mixes weak/strong).
        missing_rate: In the ``wild`` stream, the probability that a sample loses one modality.
        train_json, test_json, label_csv: READ layout file names inside ``data_dir`` (``real``).
        target_length, num_mel_bins, image_size: Real-data input shapes.
        val_fraction: Fraction of the real train json held out for validation.
    """

    def __init__(
        self,
        source: str = "embedded",
        data_dir: str = "data/ks50",
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
        test_batch_size: int = 16,
        image_source: str = "fashion_mnist",
        n_train: int = 6000,
        n_val: int = 1000,
        n_test: int = 3000,
        audio_shape: Sequence[int] = (32, 16),
        audio_contour: float = 2.0,
        stream: str = "wild",
        video_corruptions: Sequence[str] | None = None,
        audio_corruptions: Sequence[str] | None = None,
        severities: Sequence[int] = (1, 3, 5),
        missing_rate: float = 0.1,
        train_json: str = "train.json",
        test_json: str = "test.json",
        label_csv: str = "class_labels_indices.csv",
        target_length: int = 1024,
        num_mel_bins: int = 128,
        image_size: int = 224,
        val_fraction: float = 0.1,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        if test_batch_size < 1:
            raise ConfigError(f"data.test_batch_size={test_batch_size} must be >= 1")
        if image_source not in IMAGE_SOURCES:
            raise ConfigError(f"data.image_source={image_source!r} must be one of {list(IMAGE_SOURCES)}")
        if stream not in STREAMS:
            raise ConfigError(f"data.stream={stream!r} must be one of {list(STREAMS)}")
        if min(n_train, n_val, n_test) < 1:
            raise ConfigError(f"data.n_train/n_val/n_test={n_train}/{n_val}/{n_test} must all be >= 1")
        self.video_corruptions = tuple(video_corruptions or VIDEO_CORRUPTIONS)
        self.audio_corruptions = tuple(audio_corruptions or AUDIO_CORRUPTIONS)
        bad = [c for c in self.video_corruptions if c not in VIDEO_CORRUPTIONS]
        bad += [c for c in self.audio_corruptions if c not in AUDIO_CORRUPTIONS]
        if bad:
            raise ConfigError(
                f"data corruptions {bad} unknown; video: {list(VIDEO_CORRUPTIONS)}, audio: {list(AUDIO_CORRUPTIONS)}"
            )
        if not severities or any(int(s) not in range(1, 6) for s in severities):
            raise ConfigError(f"data.severities={list(severities)} must be a non-empty list of values in 1..5")
        if not 0.0 <= missing_rate <= 1.0:
            raise ConfigError(f"data.missing_rate={missing_rate} must be in [0, 1]")
        if not 0.0 <= audio_contour <= 8.0:
            raise ConfigError(f"data.audio_contour={audio_contour} must be in [0, 8] (chirp slope in F/16 bins)")
        if len(audio_shape) != 2 or min(audio_shape) < 1:
            raise ConfigError(f"data.audio_shape={list(audio_shape)} must be [T, F] with positive sizes")
        self.test_batch_size, self.image_source = test_batch_size, image_source
        self.n_train, self.n_val, self.n_test = n_train, n_val, n_test
        self.audio_shape = (int(audio_shape[0]), int(audio_shape[1]))
        self.audio_contour = float(audio_contour)
        self.stream, self.severities, self.missing_rate = stream, [int(s) for s in severities], missing_rate
        self.train_json, self.test_json, self.label_csv = train_json, test_json, label_csv
        self.target_length, self.num_mel_bins, self.image_size = target_length, num_mel_bins, image_size
        self.val_fraction = val_fraction

    # -- embedded ----------------------------------------------------------------------------------------------------
    def _images(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.image_source == "digits":
            return load_digits_images()

        return load_fashion_mnist("test")

    def load_embedded(self) -> dict[str, Any]:
        images, labels = self._images()
        n = self.n_train + self.n_val + self.n_test
        if n > len(labels):
            raise ConfigError(
                f"data.n_train+n_val+n_test={n} exceeds the {len(labels)} {self.image_source} images available"
            )
        perm = seeded_permutation(len(labels), self.seed)  # the test stream's order is this shuffle
        a, b = self.n_train, self.n_train + self.n_val
        idx = {"train": perm[:a], "val": perm[a:b], "test": perm[b:n]}
        rng = np.random.default_rng(self.seed)
        out: dict[str, Any] = {}
        for split in ("train", "val", "test"):
            ii = idx[split]
            video = images[ii].float().div(255.0).unsqueeze(1)  # [N, 1, H, W] in [0, 1]
            power = synth_spectrograms(labels[ii].numpy(), self.audio_shape, rng, self.audio_contour)
            meta = ["clean"] * len(ii)
            if split == "test":
                power, video, meta = self._corrupt_stream(power, video, rng)
            audio = torch.from_numpy(audio_features(power))
            out[split] = (audio, video, labels[ii], meta)
        # Standardise both modalities with the clean train statistics; missing modalities become exact zeros.
        a_mu, a_sd = out["train"][0].mean(), out["train"][0].std()
        v_mu, v_sd = out["train"][1].mean(), out["train"][1].std()
        datasets: dict[str, Any] = {}
        for split, (audio, video, y, meta) in out.items():
            audio, video = (audio - a_mu) / a_sd, (video - v_mu) / v_sd
            for i, m in enumerate(meta):
                if "missing_audio" in m:
                    audio[i] = 0.0
                if "missing_video" in m:
                    video[i] = 0.0
            datasets[split] = PairedDataset(audio, video, y, meta)
        return datasets

    def _corrupt_stream(
        self, power: np.ndarray, video: torch.Tensor, rng: np.random.Generator
    ) -> tuple[np.ndarray, torch.Tensor, list[str]]:
        """Corrupt the test samples per ``stream``; returns new power, video and a description per sample."""
        n = len(video)
        gen = torch.Generator().manual_seed(self.seed + 1)
        if self.stream == "clean":
            return power, video, ["clean"] * n
        if self.stream in ("missing_audio", "missing_video"):
            return power, video, [self.stream] * n
        if self.stream == "wild":
            u = rng.random(n)
            half = self.missing_rate / 2
            target = np.where(
                u < half,
                "missing_audio",
                np.where(u < 2 * half, "missing_video", rng.choice(["video", "audio", "both"], n)),
            )
        else:
            target = np.array([self.stream] * n)
        power, video = power.copy(), video.clone()
        vkind = rng.choice(self.video_corruptions, n)
        akind = rng.choice(self.audio_corruptions, n)
        sev_v = rng.choice(self.severities, n)
        sev_a = rng.choice(self.severities, n)
        do_v, do_a = np.isin(target, ("video", "both")), np.isin(target, ("audio", "both"))
        # Corrupt in groups of equal (type, severity): vectorised, and deterministic given the seed.
        for kind in self.video_corruptions:
            for sev in self.severities:
                ii = np.nonzero(do_v & (vkind == kind) & (sev_v == sev))[0]
                if len(ii):
                    video[torch.from_numpy(ii)] = corrupt_video(video[torch.from_numpy(ii)], kind, int(sev), gen)
        for kind in self.audio_corruptions:
            for sev in self.severities:
                ii = np.nonzero(do_a & (akind == kind) & (sev_a == sev))[0]
                if len(ii):
                    power[ii] = corrupt_audio(power[ii], kind, int(sev), rng)
        meta = []
        for i in range(n):
            parts = [f"video:{vkind[i]}:{sev_v[i]}"] if do_v[i] else []
            parts += [f"audio:{akind[i]}:{sev_a[i]}"] if do_a[i] else []
            parts += [str(target[i])] if str(target[i]).startswith("missing") else []
            meta.append("+".join(parts))
        return power, video, meta

    # -- real ----------------------------------------------------------------------------------------------------------
    def load_real(self) -> dict[str, Any]:
        root = Path(self.data_dir)
        train_p, test_p, csv_p = require_files(root, [self.train_json, self.test_json, self.label_csv], READ_HOW_TO_GET)
        labels = read_label_csv(csv_p)
        kw = dict(target_length=self.target_length, num_mel_bins=self.num_mel_bins, image_size=self.image_size)
        train = ReadJsonDataset(train_p, labels, root, **kw)
        test = ReadJsonDataset(test_p, labels, root, **kw)
        tr, va = split_indices(len(train), [1 - self.val_fraction, self.val_fraction], self.seed)
        return {
            "train": torch.utils.data.Subset(train, tr.tolist()),
            "val": torch.utils.data.Subset(train, va.tolist()),
            "test": test,
        }

    def test_dataloader(self) -> ResumableLoader:
        """The test stream, in its stored order, in batches of ``test_batch_size`` (the TTA batch)."""
        return ResumableLoader(
            self.datasets["test"],
            batch_size=self.test_batch_size,
            shuffle=False,
            seed=self.seed,
            num_workers=self.num_workers,
        )
