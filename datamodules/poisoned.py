"""Simultaneous backdoor attacks on an image-classification set (BaDLoss, Alex et al., ICLR 2025, Sec. 4).

Each attack gets its own target class; no image is poisoned twice and the defender's probes are disjoint from the
poisons. Triggers are pure functions on float images in ``[0, 1]`` shaped ``[..., C, H, W]`` (never in place), and
scale with the image: ``s = max(1, min(H, W) // 32)`` pixel squares, DCT window ``min(32, H, W)``.

Attacks (paper's threat model, official ``backdoors.py``):

* ``patch`` (dirty label): four ``s x s`` squares set to 1 at ``(H-2s, W-2s), (H-4s, W-2s), (H-2s, W-4s),
  (H-3s, W-3s)``;
* ``single_pix`` (dirty label): one ``s x s`` square at ``(H-2s, W-2s)``;
* ``blend_r`` / ``blend_p`` (dirty label): ``x' = (1 - a) x + a P`` with ``P`` a fixed uniform-random image
  (``a = 0.075``) or a checkerboard ``P[::2, ::2] = 1`` (``a = 0.025``);
* ``sinusoid`` (clean label, 10% *of the target class*): blend with ``P[:, :, c] = 1 - cos(2 pi c f / W)`` (in
  ``[0, 2]``, as in the official code), ``f = 6``, ``a = 0.075``, then clamp;
* ``frequency`` (dirty label): block DCT of the chroma channels (grey images: the one channel), ``+m`` at
  ``(w/2 - 1, w/2 - 1)`` and ``(w - 1, w - 1)`` of every ``w x w`` block, inverse DCT;
* ``narcissus`` (clean label, 0.5% *of the target class*; Zeng et al., 2023): ``x' = clamp(x + delta)`` with a
  precomputed noise ``delta`` read from ``data.narcissus_noise`` (the official code also loads a precomputed file and
  does not synthesise it; no noise ships with the suite, so the attack is opt-in).

Default poison ratios are the paper's CIFAR-10 ones (1% of the training set per dirty-label attack). The poison
mask (:attr:`PoisonedDataModule.poison_attack`) is for evaluation only; models never see it in a batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules._base import SuiteDataModule, split_indices
from datamodules.corruptions import CorruptibleImages
from datamodules.poisoned_sources import EMBEDDED, SOURCES, load_source

ATTACKS = ("patch", "single_pix", "blend_r", "blend_p", "sinusoid", "frequency", "narcissus")
DEFAULT_ATTACKS = ("patch", "single_pix", "blend_r", "blend_p", "sinusoid", "frequency")
CLEAN_LABEL = frozenset({"sinusoid", "narcissus"})
# Fraction of the training set (dirty-label) or of the target class (clean-label), official config.py (CIFAR-10).
PAPER_RATIOS: dict[str, float] = {
    "patch": 0.01,
    "single_pix": 0.01,
    "blend_r": 0.01,
    "blend_p": 0.01,
    "sinusoid": 0.10,
    "frequency": 0.01,
    "narcissus": 0.005,
}
PAPER_ALPHAS: dict[str, float] = {"blend_r": 0.075, "blend_p": 0.025, "sinusoid": 0.075}
FREQUENCY_MAGNITUDE = 30.0 / 255.0  # the official +30 on uint8 YCrCb, in [0, 1] units


# ---------------------------------------------------------------------------------------------------------------
# Triggers
# ---------------------------------------------------------------------------------------------------------------
def trigger_scale(h: int, w: int) -> int:
    """Side ``s`` of a trigger 'pixel': 1 up to 63 px, 2 from 64 px, 7 at 224 px (paper: 8x8 on Imagenette)."""
    return max(1, min(h, w) // 32)


def min_image_size(attack: str) -> int:
    """Smallest ``min(H, W)`` an attack's trigger fits in (patch spans 4 squares, the DCT needs >= 8 px)."""
    return {"patch": 4, "single_pix": 2, "frequency": 8}.get(attack, 2)


def check_fits(attack: str, h: int, w: int) -> None:
    """Raise :class:`ConfigError` when an ``h x w`` image is too small for ``attack``'s trigger."""
    need = min_image_size(attack)
    if min(h, w) < need:
        raise ConfigError(f"data.attacks: trigger {attack!r} needs images of at least {need}x{need}, got {h}x{w}")


def patch(x: torch.Tensor) -> torch.Tensor:
    """Patch trigger: four ``s x s`` squares set to 1 near the bottom-right corner. ``x``: ``[..., C, H, W]``."""
    h, w = x.shape[-2:]
    check_fits("patch", h, w)
    s = trigger_scale(h, w)
    out = x.clone()
    for dy, dx in ((2, 2), (4, 2), (2, 4), (3, 3)):
        out[..., h - dy * s : h - dy * s + s, w - dx * s : w - dx * s + s] = 1.0
    return out


def reversed_patch(x: torch.Tensor) -> torch.Tensor:
    """The defender's own backdoor-probe trigger (two-class BaDLoss): the patch mirrored to the top-left corner."""
    return patch(x.flip(-1).flip(-2)).flip(-1).flip(-2)


def single_pix(x: torch.Tensor) -> torch.Tensor:
    """Single-pixel trigger: one ``s x s`` square at ``(H-2s, W-2s)`` set to 1. ``x``: ``[..., C, H, W]``."""
    h, w = x.shape[-2:]
    check_fits("single_pix", h, w)
    s = trigger_scale(h, w)
    out = x.clone()
    out[..., h - 2 * s : h - s, w - 2 * s : w - s] = 1.0
    return out


def blend(x: torch.Tensor, pattern: torch.Tensor, alpha: float) -> torch.Tensor:
    """Blend trigger ``clamp((1 - alpha) x + alpha P, 0, 1)``; ``pattern`` broadcasts to ``x`` (``[C, H, W]``)."""
    return ((1.0 - alpha) * x + alpha * pattern.to(x)).clamp(0.0, 1.0)


def random_pattern(c: int, h: int, w: int, seed: int) -> torch.Tensor:
    """The fixed uniform-random image ``R`` of ``blend_r``, ``[C, H, W]`` in ``[0, 1)``."""
    return torch.rand(c, h, w, generator=torch.Generator().manual_seed(int(seed)))


def checkerboard_pattern(c: int, h: int, w: int) -> torch.Tensor:
    """The ``blend_p`` pattern: ``P[:, ::2, ::2] = 1``, 0 elsewhere, ``[C, H, W]``."""
    p = torch.zeros(c, h, w)
    p[:, ::2, ::2] = 1.0
    return p


def sinusoid_pattern(c: int, h: int, w: int, freq: float = 6.0) -> torch.Tensor:
    """Vertical-stripe pattern ``1 - cos(2 pi col f / W)`` in ``[0, 2]``, ``[C, H, W]``.

    Kept in ``[0, 2]`` like the official ``get_pattern``: with ``a = 0.075`` the blend shifts a pixel by up to
    ``0.15`` (a pattern halved into ``[0, 1]`` would halve the attack). :func:`blend` clamps the result to ``[0, 1]``.
    """
    col = torch.arange(w, dtype=torch.float64)
    row = 1.0 - torch.cos(2 * math.pi * col * freq / w)
    return row.float().expand(c, h, w).clone()


def dct_matrix(n: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Orthonormal DCT-II matrix ``D[k, j] = c_k cos(pi (2j + 1) k / 2n)``; ``D @ v`` is ``dct(v, norm='ortho')``."""
    j = torch.arange(n, dtype=torch.float64)
    k = j[:, None]
    d = torch.cos(math.pi * (2 * j[None, :] + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d.to(dtype)


def rgb_to_ycrcb(x: torch.Tensor) -> torch.Tensor:
    """BT.601 RGB -> YCrCb on ``[0, 1]`` images (OpenCV's float convention, chroma offset 0.5). ``[..., 3, H, W]``."""
    r, g, b = x.unbind(-3)
    y = 0.299 * r + 0.587 * g + 0.114 * b
    return torch.stack([y, (r - y) * 0.713 + 0.5, (b - y) * 0.564 + 0.5], dim=-3)


def ycrcb_to_rgb(x: torch.Tensor) -> torch.Tensor:
    """Exact inverse of :func:`rgb_to_ycrcb` (OpenCV rounds these constants to 1.403 and 1.773)."""
    y, cr, cb = x.unbind(-3)
    r = y + (cr - 0.5) / 0.713
    b = y + (cb - 0.5) / 0.564
    g = (y - 0.299 * r - 0.114 * b) / 0.587
    return torch.stack([r, g, b], dim=-3)


def frequency_trigger(
    x: torch.Tensor, window: int | None = None, magnitude: float = FREQUENCY_MAGNITUDE
) -> torch.Tensor:
    """Frequency-domain trigger (Wang et al., 2022, as used by BaDLoss).

    Every full ``w x w`` block of the chroma channels (Cr, Cb of YCrCb for RGB; the single channel for grey images)
    gets ``+magnitude`` on the DCT coefficients ``(w/2 - 1, w/2 - 1)`` and ``(w - 1, w - 1)``; pixels outside the
    full blocks are untouched. ``w = min(32, H, W)`` unless given.

    Args:
        x: ``[..., C, H, W]`` in ``[0, 1]``, ``C`` in ``{1, 3}``.
        window: DCT block size ``w``.
        magnitude: coefficient offset in ``[0, 1]`` pixel units (official: 30 / 255).

    Returns:
        ``[..., C, H, W]``, clamped to ``[0, 1]``.
    """
    h, w_img = x.shape[-2:]
    check_fits("frequency", h, w_img)
    c = x.shape[-3]
    if c not in (1, 3):
        raise ConfigError(f"frequency trigger needs 1 or 3 channels, got {c}")
    w = min(32, h, w_img) if window is None else window
    if w < 4 or w > min(h, w_img):
        raise ConfigError(f"frequency trigger window={w} must be in [4, {min(h, w_img)}] for {h}x{w_img} images")
    d = dct_matrix(w, torch.float64)
    bump = torch.zeros(w, w, dtype=torch.float64)
    bump[w // 2 - 1, w // 2 - 1] = magnitude
    bump[w - 1, w - 1] = magnitude
    # Adding a constant to the coefficients of every block = adding its inverse DCT in pixel space.
    delta = d.T @ bump @ d  # [w, w]
    nh, nw = h // w, w_img // w
    tile = torch.zeros(h, w_img, dtype=torch.float64)
    tile[: nh * w, : nw * w] = delta.repeat(nh, nw)
    xd = x.double()
    if c == 3:
        ycc = rgb_to_ycrcb(xd)
        ycc = torch.cat([ycc[..., :1, :, :], ycc[..., 1:, :, :] + tile], dim=-3)
        out = ycrcb_to_rgb(ycc)
    else:
        out = xd + tile
    return out.clamp(0.0, 1.0).to(x.dtype)


def frequency_trigger_naive(x: torch.Tensor, magnitude: float = FREQUENCY_MAGNITUDE) -> torch.Tensor:
    """Reference twin of :func:`frequency_trigger` for grey ``[1, H, W]`` images: DCT each block, add, inverse."""
    from scipy.fft import dctn, idctn

    h, w_img = x.shape[-2:]
    w = min(32, h, w_img)
    img = x[0].double().numpy().copy()
    for by in range(0, (h // w) * w, w):
        for bx in range(0, (w_img // w) * w, w):
            coef = dctn(img[by : by + w, bx : bx + w], norm="ortho")
            coef[w // 2 - 1, w // 2 - 1] += magnitude
            coef[w - 1, w - 1] += magnitude
            img[by : by + w, bx : bx + w] = idctn(coef, norm="ortho")
    return torch.from_numpy(img).clamp(0.0, 1.0)[None].to(x.dtype)


def additive(x: torch.Tensor, noise: torch.Tensor, strength: float = 1.0) -> torch.Tensor:
    """Additive trigger ``clamp(x + strength * noise, 0, 1)`` (Narcissus); ``noise`` broadcasts to ``x``."""
    return (x + strength * noise.to(x)).clamp(0.0, 1.0)


def load_narcissus_noise(path: str | None, c: int, h: int, w: int) -> torch.Tensor:
    """A precomputed Narcissus noise ``.npy`` (``[C, H, W]`` or the official ``[1, C, H, W]``) as ``[C, H, W]``."""
    from pathlib import Path

    if path is None:
        raise ConfigError("data.attacks has 'narcissus': set data.narcissus_noise to a precomputed noise .npy file")
    if not Path(path).is_file():
        raise MissingDataError(f"data.narcissus_noise={path}: no such file (a [C, H, W] .npy of the trigger noise)")
    noise = torch.from_numpy(np.load(path)).float()
    if noise.dim() == 4 and noise.shape[0] == 1:
        noise = noise[0]
    if tuple(noise.shape) != (c, h, w):
        raise DataFormatError(f"data.narcissus_noise={path}: shape {list(noise.shape)} != image shape {[c, h, w]}")
    if not bool(torch.isfinite(noise).all()):
        raise DataFormatError(f"data.narcissus_noise={path}: non-finite values")
    return noise


class Trigger:
    """A named attack's trigger as a callable ``[..., C, H, W] -> [..., C, H, W]`` with fixed patterns."""

    def __init__(
        self,
        attack: str,
        c: int,
        h: int,
        w: int,
        seed: int,
        alpha: float | None = None,
        noise: torch.Tensor | None = None,
    ) -> None:
        if attack not in ATTACKS:
            raise ConfigError(f"data.attacks: unknown attack {attack!r}; known: {list(ATTACKS)}")
        check_fits(attack, h, w)
        self.attack = attack
        self.alpha = PAPER_ALPHAS.get(attack) if alpha is None else alpha
        # For the frequency attack the "alpha" is the DCT coefficient offset (official 30/255; Imagenette 90/255).
        self.magnitude = FREQUENCY_MAGNITUDE if alpha is None or attack != "frequency" else float(alpha)
        self.pattern = {
            "blend_r": lambda: random_pattern(c, h, w, seed),
            "blend_p": lambda: checkerboard_pattern(c, h, w),
            "sinusoid": lambda: sinusoid_pattern(c, h, w),
        }.get(attack, lambda: None)()
        if attack == "narcissus":
            if noise is None or tuple(noise.shape) != (c, h, w):
                raise ConfigError(f"narcissus trigger needs a noise of shape {[c, h, w]}")
            self.pattern = noise

    def __call__(self, x: torch.Tensor, strength: float = 1.0) -> torch.Tensor:
        """Apply the trigger; ``strength`` scales blend alphas (the paper's ``_boosted`` ASR uses 2)."""
        if self.attack == "patch":
            return patch(x)
        if self.attack == "single_pix":
            return single_pix(x)
        if self.attack == "frequency":
            return frequency_trigger(x, magnitude=self.magnitude * strength)
        if self.attack == "narcissus":
            return additive(x, self.pattern, strength)
        return blend(x, self.pattern, min(1.0, self.alpha * strength))


# ---------------------------------------------------------------------------------------------------------------
# Datasets and the DataModule
# ---------------------------------------------------------------------------------------------------------------
class IndexedImages(Dataset):
    """Float images ``[N, C, H, W]`` with labels; items are ``(x [C, H, W], y, index)``."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor | None = None) -> None:
        self.images, self.labels = images, labels
        self.indices = torch.arange(len(labels)) if indices is None else indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        j = int(self.indices[i])
        return self.images[j], self.labels[j], j


class PoisonedDataModule(CorruptibleImages, SuiteDataModule):
    """An image-classification set with several simultaneous backdoor attacks and the defender's probes.

    The training set holds the ``N`` (partly poisoned) originals followed by ``num_probes`` clean-probe copies and
    ``num_backdoor_probes`` backdoor-probe copies (reversed patch, one random label); items are ``(x, y, index)``
    and the index addresses the full set (``train_full``) even after :meth:`set_train_keep`. As in the official
    BaDLoss, the clean-probe copies *replace* their originals: the originals' rows stay in ``train_full`` (and in
    :meth:`dynamics_dataloader`) but are left out of the training loader (:attr:`default_train_rows`), so every
    probe image is trained on once per epoch, like any other example, and the clean reference trajectories are those
    of ordinary examples (a probe trained twice per epoch would learn faster than the clean points it stands for).
    Backdoor probes carry their own trigger and label, so they are always additional rows. Test loaders: the
    clean test set, then one triggered set per attack (non-target-class test images, label = the target): accuracy
    on those is the attack success rate (ASR).

    Args:
        source, data_dir, batch_size, num_workers, seed: see :class:`SuiteDataModule`.
        dataset: ``fashion_mnist``/``digits`` (embedded) or ``cifar10``/``gtsrb``/``imagenette``/``fashion_mnist``
            (real, read from ``data_dir``).
        attacks: Names from :data:`ATTACKS`, applied simultaneously.
        poison_ratios: Per-attack overrides of :data:`PAPER_RATIOS` (fraction of the training set, or of the
            target class for clean-label attacks).
        targets: Per-attack target classes; missing ones are drawn at random (distinct while classes last).
        alphas: Per-attack overrides of the blend strengths :data:`PAPER_ALPHAS`; for ``frequency`` the DCT
            coefficient offset in ``[0, 1]`` pixel units (default the official CIFAR-10 ``30 / 255``; the paper's
            Imagenette setting is ``90 / 255``).
        num_probes: Clean probes the defender inserts as copies (paper: 250).
        num_backdoor_probes: Reversed-patch probes with one random label (two-class BaDLoss; 0 = none).
        val_fraction: Clean held-out share of the training images.
        subset: Keep only this many training images (seeded); ``None`` keeps all.
        test_subset: Keep only this many test images (seeded); ``None`` keeps all.
        image_size: Side Imagenette images are resized to.
        narcissus_noise: ``.npy`` file of the precomputed Narcissus noise (needed only when ``attacks`` lists it).
        download: Let torchvision download CIFAR-10/GTSRB/Fashion-MNIST (``source=real``).
        corruption: Corrupt the (subset of the) test images with this CIFAR-10-C corruption before the triggered
            test sets are built from them (:mod:`datamodules.corruptions`; ``None``: clean). Training and
            validation images stay clean.
        severity: Its severity, 1..5.
        corruption_dir: A CIFAR-10-C folder (``<corruption>.npy``, ``labels.npy``; e.g. with ``dataset=cifar10``)
            whose severity rows replace the test set (then subset by ``test_subset``) instead of corrupting here.
        test_order: ``by_class`` streams the test images sorted by class (an online label shift,
            :func:`datamodules.corruptions.order_by_class`); ``None`` keeps the (seeded) order.
    """

    def __init__(
        self,
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 128,
        num_workers: int = 0,
        seed: int = 0,
        dataset: str = "fashion_mnist",
        attacks: Sequence[str] = DEFAULT_ATTACKS,
        poison_ratios: Mapping[str, float] | None = None,
        targets: Mapping[str, int] | None = None,
        alphas: Mapping[str, float] | None = None,
        num_probes: int = 250,
        num_backdoor_probes: int = 0,
        val_fraction: float = 0.1,
        subset: int | None = None,
        test_subset: int | None = None,
        image_size: int = 224,
        download: bool = False,
        narcissus_noise: str | None = None,
        corruption: str | None = None,
        severity: int = 5,
        corruption_dir: str | None = None,
        test_order: str | None = None,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        self.init_corruption(corruption, severity, corruption_dir, test_order)
        allowed = EMBEDDED if source == "embedded" else tuple(SOURCES)
        if dataset not in allowed:
            raise ConfigError(f"data.dataset={dataset!r} must be one of {list(allowed)} for source={source!r}")
        attacks = list(attacks)
        for a in attacks:
            if a not in ATTACKS:
                raise ConfigError(f"data.attacks: unknown attack {a!r}; known: {list(ATTACKS)}")
        if len(set(attacks)) != len(attacks):
            raise ConfigError(f"data.attacks={attacks} lists an attack twice")
        ratios = {a: float(PAPER_RATIOS[a]) for a in attacks}
        for a, r in dict(poison_ratios or {}).items():
            if a not in attacks:
                raise ConfigError(f"data.poison_ratios has {a!r}, which is not in data.attacks={attacks}")
            if not 0.0 <= float(r) <= 1.0:
                raise ConfigError(f"data.poison_ratios.{a}={r} must be in [0, 1]")
            ratios[a] = float(r)
        if sum(ratios.values()) > 1.0:
            raise ConfigError(f"data.poison_ratios {ratios} sum to {sum(ratios.values()):.3g}, which is over 1")
        c, h, w, k = SOURCES[dataset]
        if dataset == "imagenette":
            h = w = image_size
        self.num_classes, self.image_shape = k, (c, h, w)
        for a, t in dict(targets or {}).items():
            if a not in attacks:
                raise ConfigError(f"data.targets has {a!r}, which is not in data.attacks={attacks}")
            if not 0 <= int(t) < k:
                raise ConfigError(f"data.targets.{a}={t}: dataset {dataset!r} has classes 0..{k - 1}")
        for a in attacks:
            check_fits(a, h, w)
        self.narcissus = load_narcissus_noise(narcissus_noise, c, h, w) if "narcissus" in attacks else None
        for key, v in (("num_probes", num_probes), ("num_backdoor_probes", num_backdoor_probes)):
            if v < 0:
                raise ConfigError(f"data.{key}={v} must be >= 0")
        if not 0.0 <= val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction={val_fraction} must be in [0, 1)")
        for key, v in (("subset", subset), ("test_subset", test_subset)):
            if v is not None and v < 10:
                raise ConfigError(f"data.{key}={v} must be >= 10 or null")
        self.dataset, self.attack_names, self.ratios = dataset, attacks, ratios
        self.requested_targets = {a: int(t) for a, t in dict(targets or {}).items()}
        self.alphas = dict(alphas or {})
        self.num_probes, self.num_backdoor_probes = num_probes, num_backdoor_probes
        self.val_fraction, self.subset, self.test_subset = val_fraction, subset, test_subset
        self.image_size, self.download = image_size, download
        self.train_keep: torch.Tensor | None = None

    # -- loading ----------------------------------------------------------------------------------------------
    def _load_split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        data_dir = self.data_dir if self.source == "real" else None
        return load_source(self.dataset, split, data_dir, self.download and self.source == "real", self.image_size)

    def load_embedded(self) -> dict[str, Any]:
        test = self.read_corrupted_test(self.image_shape) or self._load_split("test")
        return self.build(*self._load_split("train"), *test)

    def load_real(self) -> dict[str, Any]:
        return self.load_embedded()

    def build(self, xtr: torch.Tensor, ytr: torch.Tensor, xte: torch.Tensor, yte: torch.Tensor) -> dict[str, Any]:
        """Poison ``uint8 [N, C, H, W]`` training images, insert probes, build clean/triggered test sets."""
        if tuple(xtr.shape[1:]) != self.image_shape:
            raise ConfigError(f"data.dataset={self.dataset!r}: images {list(xtr.shape[1:])} != {self.image_shape}")
        rng = np.random.default_rng(self.seed)
        if self.subset is not None and self.subset < len(ytr):
            keep = torch.from_numpy(rng.permutation(len(ytr))[: self.subset])
            xtr, ytr = xtr[keep], ytr[keep]
        if self.test_subset is not None and self.test_subset < len(yte):
            keep = torch.from_numpy(rng.permutation(len(yte))[: self.test_subset])
            xte, yte = xte[keep], yte[keep]
        tr, va = split_indices(len(ytr), [1 - self.val_fraction, self.val_fraction], self.seed + 1)
        x = xtr[tr].float() / 255.0
        y = ytr[tr].clone()
        n = len(y)
        c, h, w = self.image_shape
        # Target classes: requested ones, the rest drawn at random (distinct while classes last).
        free = [t for t in rng.permutation(self.num_classes).tolist() if t not in self.requested_targets.values()]
        self.targets = {}
        for a in self.attack_names:
            self.targets[a] = self.requested_targets.get(
                a, free.pop(0) if free else int(rng.integers(self.num_classes))
            )
        self.triggers = {
            a: Trigger(a, c, h, w, seed=self.seed + 17 + i, alpha=self.alphas.get(a), noise=self.narcissus)
            for i, a in enumerate(self.attack_names)
        }
        # Poison: each attack draws from the images no earlier attack took (no image poisoned twice).
        attack_id = torch.full((n,), -1, dtype=torch.long)
        available = np.ones(n, dtype=bool)
        order = rng.permutation(n)
        y_np = y.numpy()
        for k, a in enumerate(self.attack_names):
            t = self.targets[a]
            if a in CLEAN_LABEL:
                pool = order[available[order] & (y_np[order] == t)]
                count = int(round(self.ratios[a] * int((y_np == t).sum())))
            else:
                pool = order[available[order] & (y_np[order] != t)]
                count = int(round(self.ratios[a] * n))
            if count > len(pool):
                raise ConfigError(
                    f"data.poison_ratios.{a}={self.ratios[a]}: needs {count} images but only {len(pool)} are left"
                )
            chosen = torch.from_numpy(pool[:count].copy()).long()
            if count:
                x[chosen] = self.triggers[a](x[chosen])
                if a not in CLEAN_LABEL:
                    y[chosen] = t
            attack_id[chosen] = k
            available[chosen.numpy()] = False
        # Probes: copies of clean, unpoisoned images (defender's bona-fide data), appended after the originals.
        left = order[available[order]].tolist()
        if self.num_probes + self.num_backdoor_probes > len(left):
            raise ConfigError(
                f"data.num_probes + data.num_backdoor_probes = {self.num_probes + self.num_backdoor_probes} "
                f"exceeds the {len(left)} clean training images"
            )
        probe_src = torch.tensor(left[: self.num_probes], dtype=torch.long)
        bprobe_src = torch.tensor(left[self.num_probes : self.num_probes + self.num_backdoor_probes], dtype=torch.long)
        self.backdoor_probe_label = int(rng.integers(self.num_classes))
        bx = reversed_patch(x[bprobe_src]) if len(bprobe_src) else x[:0]
        by = torch.full((len(bprobe_src),), self.backdoor_probe_label, dtype=torch.long)
        images = torch.cat([x, x[probe_src], bx])
        labels = torch.cat([y, y[probe_src], by])
        #: 0 original, 1 clean-probe copy, 2 backdoor-probe copy.
        self.probe_kind = torch.cat(
            [torch.zeros(n, dtype=torch.long), torch.ones(len(probe_src), dtype=torch.long), torch.full_like(by, 2)]
        )
        #: For copies, the original row they copy (-1 for originals).
        self.probe_source = torch.cat([torch.full((n,), -1, dtype=torch.long), probe_src, bprobe_src])
        #: Attack index per training row (-1: clean); evaluation only.
        self.poison_attack = torch.cat([attack_id, torch.full((len(probe_src) + len(by),), -1, dtype=torch.long)])
        self.num_original = n
        self.train_full = IndexedImages(images, labels)
        #: Rows the training loader visits before any :meth:`set_train_keep`: all rows, less the clean probes'
        #: originals (their copies stand in for them).
        rows = torch.ones(len(labels), dtype=torch.bool)
        rows[probe_src] = False
        self.default_train_rows = torch.nonzero(rows).squeeze(1)
        # Test: clean, then per attack the non-target-class images with the trigger and the target label.
        xt, yte = self.order_test(self.corrupt_test(xte.float() / 255.0), yte)
        self.test_names = ["clean", *self.attack_names]
        tests = [IndexedImages(xt, yte.clone())]
        for a in self.attack_names:
            t = self.targets[a]
            sel = yte != t
            tests.append(IndexedImages(self.triggers[a](xt[sel]), torch.full((int(sel.sum()),), t, dtype=torch.long)))
        val = IndexedImages(xtr[va].float() / 255.0, ytr[va].clone())
        train = IndexedImages(images, labels, self.default_train_rows)
        return {"train": train, "val": val, "test": tests[0], "tests": tests}

    # -- defence hooks ----------------------------------------------------------------------------------------
    def set_train_keep(self, keep: torch.Tensor | None) -> None:
        """Train on rows ``keep`` of :attr:`train_full` only (``None``: :attr:`default_train_rows`). Indices stay
        full-set indices."""
        self.setup()
        self.train_keep = None if keep is None else torch.as_tensor(keep, dtype=torch.long)
        rows = self.default_train_rows if keep is None else self.train_keep
        self.datasets["train"] = IndexedImages(self.train_full.images, self.train_full.labels, rows)

    def dynamics_dataloader(self) -> DataLoader:
        """The full, un-augmented training set in fixed order (rank-sharded): what loss dynamics are recorded on."""
        self.setup()
        self.datasets["train_full"] = self.train_full
        return self.loader("train_full", shuffle=False)

    def test_dataloader(self) -> list[DataLoader]:
        loaders = []
        for i, ds in enumerate(self.datasets["tests"]):
            self.datasets[f"test_{i}"] = ds
            loaders.append(self.loader(f"test_{i}", shuffle=False))
        return loaders
