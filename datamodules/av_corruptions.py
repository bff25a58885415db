"""Synthesised class-conditional "audio" spectrograms and Kinetics50-C / VGGSound-C-style corruptions.

The embedded default of :mod:`datamodules.multimodal` pairs each real Fashion-MNIST image with a power spectrogram
``[T, F]`` generated for its class (AV-MNIST style, ``papers/DATA.md`` section 10):

* the **pitch** (fundamental frequency bin, with harmonics) encodes the class *pair* ``c // 2`` (5 pitches), so
  audio separates T-shirt / Pullover / Coat / Shirt, which the images confuse;
* the **pitch contour** encodes ``c % 2`` (steady vs. rising chirp, slope ``contour`` in units of ``F / 16`` bins,
  jittered by N(0, 0.6)): ``contour = 0`` leaves audio blind to the pair's two classes, which the images separate
  easily; at the datamodule's default 2.0 audio alone separates them too, less reliably than the pitch.

So both modalities carry class information of their own and part of it is shared: fusion beats either modality, as
in audio-visual action recognition, and a sample can be confidently classified by each modality alone (SuMi's
unimodal assistance selects on exactly that). A linear probe on the audio features alone reaches 0.71 / 0.86 /
0.95 ten-class accuracy at ``contour`` 1.2 / 2.0 / 3.0 (96% on the pitch pairs at each): tested in
tests/datamodules/test_multimodal.py. Per sample the onset, duration, gain, pitch and a background noise floor are
random.

Corruptions follow READ's Kinetics50-C / VGGSound-C: ImageNet-C-style video corruptions (a subset of the 15, the
shared functions of :mod:`datamodules.corruptions` with ImageNet-C's parameters, :data:`VIDEO_TABLE`) and
the 6 audio corruptions (gaussian_noise, traffic, crowd, rain, thunder, wind), each at severities 1-5. Audio noise
is added in the power domain (the READ benchmark mixes noise waveforms into the audio), as spectral signatures:
traffic = low-frequency rumble, crowd = babble of other classes' harmonics, rain = broadband crackle, thunder =
loud low-frequency bursts, wind = slowly modulated low-mid band.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from datamodules import corruptions

VIDEO_CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "contrast", "brightness")
#: Video corruption -> (shared function of :mod:`datamodules.corruptions`, its parameter per severity 1..5). The noise,
#: contrast and brightness parameters are ImageNet-C's (READ corrupts 224 px frames); defocus is approximated by a
#: Gaussian blur of std sigma (kernel radius ceil(2 sigma)), which SuMi's pinned results were produced with.
VIDEO_TABLE: dict[str, tuple[Callable[..., torch.Tensor], tuple[float, ...]]] = {
    "gaussian_noise": (corruptions.gaussian_noise, (0.08, 0.12, 0.18, 0.26, 0.38)),
    "shot_noise": (corruptions.shot_noise, (60.0, 25.0, 12.0, 5.0, 3.0)),
    "impulse_noise": (corruptions.impulse_noise, (0.03, 0.06, 0.09, 0.17, 0.27)),
    "defocus_blur": (partial(corruptions.gaussian_blur, truncate=2.0), (0.6, 0.9, 1.2, 1.6, 2.2)),
    "contrast": (corruptions.contrast, (0.4, 0.3, 0.2, 0.1, 0.05)),
    "brightness": (corruptions.brightness, (0.1, 0.2, 0.3, 0.4, 0.5)),
}
AUDIO_CORRUPTIONS = ("gaussian_noise", "traffic", "crowd", "rain", "thunder", "wind")


def _harmonics(t_len: int, f_len: int, f0: np.ndarray, slope: np.ndarray, width: float = 0.6) -> np.ndarray:
    """Harmonic stack ``[N, T, F]`` with fundamental ``f0 + slope * t/T`` (bins), harmonics decaying as 1/h."""
    tt = np.linspace(0.0, 1.0, t_len)[None, :, None]
    ff = np.arange(f_len)[None, None, :]
    pitch = f0[:, None, None] + slope[:, None, None] * tt
    out = np.zeros((len(f0), t_len, f_len))
    for h in (1, 2, 3):
        out += np.exp(-((ff - h * pitch) ** 2) / (2 * width**2)) / h
    return out


def synth_spectrograms(
    labels: np.ndarray, shape: tuple[int, int], rng: np.random.Generator, contour: float = 2.0
) -> np.ndarray:
    """Class-conditional power spectrograms.

    Args:
        labels: ``[N]`` classes in ``0..9``.
        shape: ``(T, F)``.
        rng: Numpy generator (sample randomness).
        contour: Chirp slope of the odd classes (``F / 16`` bins over the clip): the audio's cue for ``c % 2``.

    Returns:
        ``[N, T, F]`` float32 power (non-negative).
    """
    t_len, f_len = shape
    n = len(labels)
    f0 = 1.2 + 1.0 * (labels // 2) * (f_len / 16) + rng.uniform(-0.35, 0.35, n)
    slope = np.where(labels % 2 == 1, contour, 0.0) * (f_len / 16) + rng.normal(0.0, 0.6, n)
    tone = _harmonics(t_len, f_len, f0, slope)
    onset = rng.uniform(0.0, 0.3, n)
    dur = rng.uniform(0.5, 0.7, n)
    tt = np.linspace(0.0, 1.0, t_len)[None, :]
    env = 1.0 / (1 + np.exp(-(tt - onset[:, None]) * 30)) * 1.0 / (1 + np.exp((tt - (onset + dur)[:, None]) * 30))
    gain = rng.uniform(0.6, 1.4, n)[:, None, None]
    floor = rng.exponential(0.05, (n, t_len, f_len))
    return (gain * env[:, :, None] * tone + floor).astype(np.float32)


def audio_features(power: np.ndarray) -> np.ndarray:
    """Log-compressed spectrogram ``log(1 + 10 P)`` (the models see these, standardised)."""
    return np.log1p(10.0 * power).astype(np.float32)


def corrupt_audio(power: np.ndarray, kind: str, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Add a READ-style audio corruption to power spectrograms ``[N, T, F]`` at ``severity`` in 1..5."""
    if kind not in AUDIO_CORRUPTIONS:
        raise ValueError(f"audio corruption {kind!r} must be one of {list(AUDIO_CORRUPTIONS)}")
    n, t_len, f_len = power.shape
    level = [0.15, 0.3, 0.5, 0.8, 1.2][severity - 1]
    ff = np.arange(f_len)[None, None, :] / f_len
    tt = np.linspace(0.0, 1.0, t_len)[None, :, None]
    if kind == "gaussian_noise":
        noise = rng.exponential(1.0, power.shape)
    elif kind == "traffic":
        noise = np.exp(-ff / 0.15) * (1 + 0.5 * np.sin(2 * np.pi * rng.uniform(0.5, 2, (n, 1, 1)) * tt)) * 2.0
        noise = noise * rng.exponential(1.0, power.shape)
    elif kind == "crowd":
        others = rng.integers(0, 10, (n, 3))
        noise = sum(synth_spectrograms(others[:, j], (t_len, f_len), rng) for j in range(3)) * 0.7
    elif kind == "rain":
        hits = rng.random((n, t_len, 1)) < 0.5
        noise = hits * (0.3 + ff) * rng.exponential(1.5, power.shape)
    elif kind == "thunder":
        bursts = np.zeros((n, t_len, 1))
        for _ in range(2):
            c = rng.uniform(0, 1, (n, 1, 1))
            bursts += np.exp(-((tt - c) ** 2) / 0.005)
        noise = bursts * np.exp(-ff / 0.3) * 4.0 * rng.exponential(1.0, power.shape)
    else:  # wind
        mod = 1 + np.sin(2 * np.pi * rng.uniform(0.2, 1.0, (n, 1, 1)) * tt + rng.uniform(0, 6.3, (n, 1, 1)))
        noise = mod * np.exp(-((ff - 0.3) ** 2) / 0.03) * 1.5 * rng.exponential(1.0, power.shape)
    return (power + level * noise).astype(np.float32)


def corrupt_video(images: torch.Tensor, kind: str, severity: int, gen: torch.Generator) -> torch.Tensor:
    """ImageNet-C-style corruption of images ``[N, C, H, W]`` in ``[0, 1]`` at ``severity`` in 1..5.

    The shared corruption functions of :mod:`datamodules.corruptions` with READ's table :data:`VIDEO_TABLE`. RGB
    frames get the standard per-channel contrast and HSV brightness; on SuMi's grey frames these equal, bit for bit,
    the global-mean contrast and additive brightness its results were produced with.
    """
    if kind not in VIDEO_CORRUPTIONS:
        raise ValueError(f"video corruption {kind!r} must be one of {list(VIDEO_CORRUPTIONS)}")
    fn, params = VIDEO_TABLE[kind]
    return fn(images, params[severity - 1], gen)
