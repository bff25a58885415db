"""Exposure brackets for BracketIRE / BracketIRE+ (Zhang et al., ICLR 2025): simulated from bundled photos, or the
released dataset.

**Embedded default** (``source=embedded``): photos bundled with scikit-image, scikit-learn and matplotlib (disjoint
photos for train / val / test), linearised (sRGB inverse gamma) and made HDR (a random gain, plus a moving light of
radiance up to ``light_max``). Each sample is a bracket of 5 exposures simulated by :mod:`ops.isp.simulate` exactly
as the paper's generator does (``4^n`` sub-frames averaged per exposure, clipping, Brooks unprocessing with the
Xiaomi-10S CCM and random white-balance gains, ISO-1600-like shot/read noise, 10 bits), from 341 sub-frames with
procedural motion (:mod:`ops.isp.motion`: a camera drift + shake and an independently moving light), which replaces
the paper's RIFE interpolation of HDR video. ``dataset=bracketire_plus`` area-downsamples the sub-frames x4 before
unprocessing (the x4 super-resolution task) while the ground truth stays at full resolution.

``domain=shifted`` is the "real" domain of the self-supervised adaptation: more noise, larger motion and other
white-balance gains; its training split carries no ground truth (val/test keep it, for scoring only).

**Real format** (``source=real``): the released BracketIRE / BracketIRE+ folders,
``<data_dir>/{Train,Test}/<scene>/<frame>/`` with ``raw_1.npy raw_4.npy raw_16.npy raw_64.npy raw_256.npy``
(``[h, w, 4]`` 10-bit codes), ``raw_gt.npy`` (``[H, W, 4]`` float HDR RAW; ``H = 4h`` for BracketIRE+) and
``metadata.npy`` (a pickled dict with ``red_gain``, ``blue_gain``, ``cam2rgb``; read with a restricted unpickler
that accepts numpy arrays only).

Each sample is a dict: ``raws`` ``[5, 4, h, w]`` in ``[0, 1]`` (not exposure-normalised; frame 0 the shortest),
``gt`` ``[4, s h, s w]`` (absent from the shifted domain's training split), ``flow`` ``[5, 2]`` (the oracle global
``(dx, dy)`` from frame 0 to each frame, in input pixels; zeros for real data) and ``meta`` (``red_gain``,
``blue_gain``, ``cam2rgb``).
"""

from __future__ import annotations

import functools
import io
import math
import os
import pickle
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from core.errors import ConfigError, DataFormatError
from core.rng import EVAL_SEED
from datamodules._base import SuiteDataModule, require_files
from ops.isp.motion import camera_path, oracle_flow, paste_light, translate_crops
from ops.isp.simulate import (
    BLUE_GAIN,
    RED_GAIN,
    SHOT_RANGE,
    downsample_x4,
    hdr_ground_truth,
    iso1600near_levels,
    rgb2cam_matrix,
    simulate_bracket,
    srgb_linearize,
    subframe_counts,
)

DATASETS = ("bracketire", "bracketire_plus")
DOMAINS = ("synthetic", "shifted")
N_EXP, RATIO = 5, 4
RAW_FILES = [f"raw_{RATIO**n}.npy" for n in range(N_EXP)]
PHOTOS = {
    "train": ["astronaut", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "motorcycle", "china"],
    "val": ["chelsea"],
    "test": ["flower", "grace_hopper"],
}
HOW_TO_GET = (
    "BracketIRE / BracketIRE+ come from the authors' links in github.com/cszhilu1998/BracketIRE (README, Dataset): "
    "unpack so that <data_dir>/Train/<scene>/<frame>/raw_1.npy ... exist, or use data.source=embedded"
)


@dataclass(frozen=True)
class Domain:
    """Simulator settings of one domain: noise, motion (pixels at ground-truth resolution, over the whole bracket),
    white-balance gain ranges and the scene's brightness."""

    shot_range: tuple[float, float] = SHOT_RANGE
    camera_shift: float = 6.0
    shake: float = 1.0
    light_shift: float = 8.0
    red_gain: tuple[float, float] = RED_GAIN
    blue_gain: tuple[float, float] = BLUE_GAIN
    gain_range: tuple[float, float] = (0.5, 4.0)
    light_max: float = 12.0


DOMAIN_SETTINGS = {
    "synthetic": Domain(),
    # the "real" captures: 2.5x the noise, twice the motion, warmer light (other red/blue gains)
    "shifted": Domain(
        shot_range=(0.003, 0.012),
        camera_shift=12.0,
        shake=2.0,
        light_shift=16.0,
        red_gain=(1.2, 1.8),
        blue_gain=(2.0, 3.0),
    ),
}


@functools.cache
def linear_photo(name: str) -> Tensor:
    """:func:`load_photo`, linearised (sRGB inverse gamma) and cached (loading all photos takes seconds)."""
    return srgb_linearize(load_photo(name))


def load_photo(name: str) -> Tensor:
    """A bundled photo as sRGB ``[3, H, W]`` in ``[0, 1]`` (no network: files shipped inside the wheels)."""
    if name in ("china", "flower"):
        from sklearn.datasets import load_sample_image

        arr = load_sample_image(f"{name}.jpg")
    elif name == "grace_hopper":
        import matplotlib.cbook
        import matplotlib.image

        with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
            arr = matplotlib.image.imread(f, format="jpg")
    elif name == "motorcycle":
        from skimage import data

        arr = data.stereo_motorcycle()[0]
    else:
        from skimage import data

        arr = getattr(data, name)()
    return torch.from_numpy(np.array(arr[..., :3])).permute(2, 0, 1).float() / 255.0


def simulate_sample(photo_lin: Tensor, patch: int, plus: bool, domain: Domain, g: torch.Generator) -> dict[str, Any]:
    """One simulated bracket from a linear photo ``[3, H, W]``; ``patch`` is the ground truth's RGB side (even; a
    multiple of 8 for BracketIRE+). See the module docstring for the fields."""
    counts = subframe_counts(N_EXP, RATIO)
    k = sum(counts)

    def u(*shape: int) -> Tensor:
        return torch.rand(*shape, generator=g)

    margin = int(math.ceil(domain.camera_shift + 2 * domain.shake)) + 2
    side = patch + 2 * margin
    _, hp, wp = photo_lin.shape
    if hp < side or wp < side:
        raise ConfigError(f"data.patch_size: a photo of {hp}x{wp} is too small for a {side}x{side} scene crop")
    y0, x0 = int(u(1) * (hp - side + 1)), int(u(1) * (wp - side + 1))
    lo, hi = math.log(domain.gain_range[0]), math.log(domain.gain_range[1])
    scene = photo_lin[:, y0 : y0 + side, x0 : x0 + side] * math.exp(lo + (hi - lo) * float(u(1)))
    path = camera_path(k, domain.camera_shift * float(u(1)), domain.shake * float(u(1)), u(3))
    frames = translate_crops(scene, path + margin, (patch, patch))
    # the light: a soft disk moving on its own straight line, radiance up to light_max, a random warm/cool tint
    start = u(2) * patch
    angle = 2 * math.pi * float(u(1))
    direction = torch.tensor([math.cos(angle), math.sin(angle)])
    centers = start + torch.linspace(0, 1, k)[:, None] * domain.light_shift * float(u(1)) * direction
    radiance = (1.0 + (domain.light_max - 1.0) * u(1)) * (0.7 + 0.3 * u(3))
    frames = paste_light(frames, centers, 1.5 + 3.0 * float(u(1)), radiance)
    gt_rgb = frames[0]
    if plus:
        frames = downsample_x4(frames)
    rgb2cam = rgb2cam_matrix()
    r = domain.red_gain[0] + (domain.red_gain[1] - domain.red_gain[0]) * u(1)[0]
    b = domain.blue_gain[0] + (domain.blue_gain[1] - domain.blue_gain[0]) * u(1)[0]
    shot, read = iso1600near_levels(u(N_EXP), torch.randn(N_EXP, generator=g), domain.shot_range)
    h, w = frames.shape[-2] // 2, frames.shape[-1] // 2
    raws = simulate_bracket(frames, rgb2cam, r, b, shot, read, torch.randn(N_EXP, 4, h, w, generator=g))
    flow = oracle_flow(path, counts) / (2.0 * (4.0 if plus else 1.0))  # RGB pixels at GT scale -> packed input px
    meta = {"red_gain": r, "blue_gain": b, "cam2rgb": torch.linalg.inv(rgb2cam)}
    return {"raws": raws, "gt": hdr_ground_truth(gt_rgb, rgb2cam, r, b), "flow": flow, "meta": meta}


def augment(sample: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
    """Random horizontal / vertical flips and transpose, jointly on ``raws`` and ``gt`` (the official training
    augmentation), with the oracle flow transformed alike."""
    out = dict(sample)
    flow = sample["flow"].clone()
    raws, gt = sample["raws"], sample.get("gt")
    flips = torch.rand(3, generator=g) < 0.5
    if flips[0]:
        raws, gt, flow[:, 0] = raws.flip(-1), None if gt is None else gt.flip(-1), -flow[:, 0]
    if flips[1]:
        raws, gt, flow[:, 1] = raws.flip(-2), None if gt is None else gt.flip(-2), -flow[:, 1]
    if flips[2]:
        raws, gt, flow = raws.transpose(-1, -2), None if gt is None else gt.transpose(-1, -2), flow.flip(-1)
    out["raws"], out["flow"] = raws.contiguous(), flow
    if gt is not None:
        out["gt"] = gt.contiguous()
    return out


# validation / test brackets are drawn from core.rng.EVAL_SEED: independent of the run's seed


class SimulatedBrackets(Dataset):
    """``n`` brackets, each simulated on first access from ``photos[i % len(photos)]`` (names of bundled photos) with
    a generator seeded by ``(seed, i)`` and then cached, so a sample never depends on the access order and a debug
    run simulates only what it reads."""

    def __init__(
        self,
        photos: list[str],
        n: int,
        patch: int,
        plus: bool,
        domain: Domain,
        seed: int,
        labelled: bool = True,
        train: bool = False,
    ) -> None:
        self.photos, self.n, self.patch, self.plus, self.domain = photos, n, patch, plus, domain
        self.seed, self.labelled, self.train = seed, labelled, train
        self.cache: dict[int, dict[str, Any]] = {}
        self.draws = 0

    def __len__(self) -> int:
        return self.n

    def sample(self, i: int) -> dict[str, Any]:
        if i not in self.cache:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
            s = simulate_sample(linear_photo(self.photos[i % len(self.photos)]), self.patch, self.plus, self.domain, g)
            if not self.labelled:
                s.pop("gt")
            self.cache[i] = s
        return self.cache[i]

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not self.train:
            return self.sample(i)
        self.draws += 1
        return augment(self.sample(i), torch.Generator().manual_seed(self.seed * 7919 + self.draws))


# -- real format ---------------------------------------------------------------------------------------------------
class _NumpyOnly(pickle.Unpickler):
    """Unpickler for ``metadata.npy``: numpy arrays, dtypes and scalars only (no arbitrary code)."""

    ALLOWED = {"_reconstruct", "ndarray", "dtype", "scalar"}

    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] == "numpy" and name in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"metadata may hold numpy arrays only, found {module}.{name}")


def load_metadata(path: Path) -> dict[str, Tensor]:
    """``red_gain``, ``blue_gain`` (scalars) and ``cam2rgb`` ``[3, 3]`` from an official ``metadata.npy``."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        _, _, dtype = read(f, max_header_size=100_000)
        if dtype.hasobject:
            obj = _NumpyOnly(io.BytesIO(f.read())).load()
        else:
            raise DataFormatError(f"{path}: metadata.npy must hold a pickled dict, found a {dtype} array")
    meta = obj.item() if isinstance(obj, np.ndarray) else obj
    if not isinstance(meta, dict) or not {"red_gain", "blue_gain", "cam2rgb"} <= set(meta):
        raise DataFormatError(f"{path}: metadata needs red_gain, blue_gain and cam2rgb")
    return {
        "red_gain": torch.as_tensor(np.asarray(meta["red_gain"], dtype=np.float32).reshape(())),
        "blue_gain": torch.as_tensor(np.asarray(meta["blue_gain"], dtype=np.float32).reshape(())),
        "cam2rgb": torch.as_tensor(np.asarray(meta["cam2rgb"], dtype=np.float32).reshape(3, 3)),
    }


def _read_raw(path: Path) -> Tensor:
    arr = np.load(path, mmap_mode="r", allow_pickle=False)
    if arr.ndim != 3 or arr.shape[-1] != 4:
        raise DataFormatError(f"{path}: expected packed RGGB [h, w, 4], got shape {arr.shape}")
    return torch.from_numpy(np.array(arr, dtype=np.float32)).permute(2, 0, 1)


class ReleasedBrackets(Dataset):
    """Frames of the released layout; ``patch`` (packed input side) crops randomly (train) or centrally (eval).

    Args:
        frames: folders holding the 5 raws, ``raw_gt.npy`` and ``metadata.npy``.
        scale: 1 (BracketIRE) or 4 (BracketIRE+).
        patch: packed input patch side; ``None`` keeps the whole frame.
        train: random crops + augmentation; ``length`` samples per epoch (the official 500 batches).
        seed: of the crops.
    """

    def __init__(
        self, frames: list[Path], scale: int, patch: int | None, train: bool, length: int | None, seed: int
    ) -> None:
        self.frames, self.scale, self.patch, self.train, self.seed = frames, scale, patch, train, seed
        self.length = length or len(frames)
        self.draws = 0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        root = self.frames[i % len(self.frames)]
        try:
            return self._read(root, i)
        except DataFormatError:
            raise
        except Exception as err:  # noqa: BLE001 - a corrupt file becomes one line naming its folder
            raise DataFormatError(f"cannot read the bracket in {root} ({type(err).__name__}: {err})") from None

    def _read(self, root: Path, i: int) -> dict[str, Any]:
        raws = torch.stack([_read_raw(root / f) for f in RAW_FILES]) / (2**10 - 1)
        gt = _read_raw(root / "raw_gt.npy")
        h, w = raws.shape[-2:]
        if gt.shape[-2:] != (h * self.scale, w * self.scale):
            raise DataFormatError(
                f"{root / 'raw_gt.npy'}: ground truth {tuple(gt.shape[-2:])} is not x{self.scale} the raws {(h, w)}"
            )
        g = torch.Generator().manual_seed(self.seed * 7919 + self.draws + (i if not self.train else 0))
        self.draws += int(self.train)
        if self.patch is not None and (h > self.patch or w > self.patch):
            p = self.patch
            if self.train:
                y, x = (
                    int(torch.randint(0, h - p + 1, (1,), generator=g)),
                    int(torch.randint(0, w - p + 1, (1,), generator=g)),
                )
            else:
                y, x = (h - p) // 2, (w - p) // 2
            s = self.scale
            raws, gt = raws[..., y : y + p, x : x + p], gt[..., s * y : s * (y + p), s * x : s * (x + p)]
        sample = {"raws": raws, "gt": gt, "flow": torch.zeros(N_EXP, 2), "meta": load_metadata(root / "metadata.npy")}
        return augment(sample, g) if self.train else sample


def check_bracket_shapes(raws: Tensor, frames: int) -> None:
    """Bad input as one clear line: ``raws`` must be ``[B, frames, 4, h, w]`` packed RGGB."""
    if raws.dim() != 5 or raws.shape[1] != frames or raws.shape[2] != 4:
        raise ConfigError(
            f"brackets must be [B, {frames}, 4, h, w] (packed RGGB, {frames} exposures), got {tuple(raws.shape)}"
        )


class BracketDataModule(SuiteDataModule):
    """Exposure brackets; see the module docstring.

    Args:
        source: ``embedded`` (simulated from bundled photos) or ``real`` (the released folders).
        data_dir: root of the released dataset (``Train/`` and ``Test/`` inside).
        dataset: ``bracketire`` or ``bracketire_plus`` (x4 super-resolution).
        domain: ``synthetic`` (the paper's simulator settings) or ``shifted`` (the adaptation's "real" domain: its
            training split carries no ground truth).
        patch_size: side of the packed ground-truth patch (the paper: 128 for BracketIRE, 256 = 4 x 64 for
            BracketIRE+); the input is ``patch_size / 4`` for BracketIRE+.
        n_train, n_val, n_test: simulated brackets per split (real data: ``n_train`` random crops per epoch,
            ``n_val`` test frames for validation, every test frame for test).
        eval_patch: packed input side of the real val/test crops (``None``: whole frames).
        motion_scale: multiplies the domain's camera drift, shake and light travel (embedded data only; 1 = the
            domain's settings, 0 = a static scene: milder degradations for a task a small network can saturate).
        batch_size, num_workers, seed: see :class:`SuiteDataModule`.
    """

    def __init__(
        self,
        source: str = "embedded",
        data_dir: str = "data/bracketire",
        batch_size: int = 4,
        num_workers: int = 0,
        seed: int = 0,
        dataset: str = "bracketire",
        domain: str = "synthetic",
        patch_size: int = 16,
        n_train: int = 256,
        n_val: int = 16,
        n_test: int = 32,
        eval_patch: int | None = None,
        motion_scale: float = 1.0,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        if dataset not in DATASETS:
            raise ConfigError(f"data.dataset={dataset!r} must be one of {list(DATASETS)}")
        if domain not in DOMAINS:
            raise ConfigError(f"data.domain={domain!r} must be one of {list(DOMAINS)}")
        self.plus = dataset == "bracketire_plus"
        if patch_size < 4 or (self.plus and patch_size % 4):  # BracketIRE+: the x4-smaller input must pack evenly
            raise ConfigError(
                f"data.patch_size={patch_size} must be >= 4"
                + (" and divisible by 4 for bracketire_plus" if self.plus else "")
            )
        if min(n_train, n_val, n_test) < 1:
            raise ConfigError("data.n_train, data.n_val and data.n_test must be >= 1")
        if not (math.isfinite(motion_scale) and motion_scale >= 0):
            raise ConfigError(f"data.motion_scale={motion_scale} must be a finite number >= 0")
        self.motion_scale = float(motion_scale)
        self.dataset, self.domain, self.patch_size = dataset, domain, patch_size
        self.n_train, self.n_val, self.n_test, self.eval_patch = n_train, n_val, n_test, eval_patch
        self.scale = 4 if self.plus else 1

    def load_embedded(self) -> dict[str, Any]:
        dom = DOMAIN_SETTINGS[self.domain]
        if self.motion_scale != 1.0:
            m = self.motion_scale
            dom = replace(dom, camera_shift=dom.camera_shift * m, shake=dom.shake * m, light_shift=dom.light_shift * m)
        out = {}
        sizes = {"train": self.n_train, "val": self.n_val, "test": self.n_test}
        for k, (split, names) in enumerate(PHOTOS.items()):
            labelled = not (split == "train" and self.domain == "shifted")
            # training brackets follow the run's seed; validation and test brackets are the same for every seed
            # (EVAL_SEED), so that seeds differ only in training and comparisons are paired on the same brackets
            base = self.seed * 10 if split == "train" else EVAL_SEED
            seed = base + k + (5 if self.domain == "shifted" else 0)
            out[split] = SimulatedBrackets(
                names, sizes[split], 2 * self.patch_size, self.plus, dom, seed, labelled, train=split == "train"
            )
        return out

    def load_real(self) -> dict[str, Any]:
        root = Path(self.data_dir)
        require_files(root, ["Train", "Test"], HOW_TO_GET)
        splits = {}
        for name in ("Train", "Test"):
            frames = [
                root / name / scene / frame
                for scene in sorted(os.listdir(root / name))
                for frame in sorted(os.listdir(root / name / scene))
            ]
            if not frames:
                raise DataFormatError(f"{root / name}: no <scene>/<frame>/ folders")
            require_files(frames[0], [*RAW_FILES, "raw_gt.npy", "metadata.npy"], HOW_TO_GET)
            splits[name] = frames
        inp = self.patch_size // self.scale
        return {
            "train": ReleasedBrackets(splits["Train"], self.scale, inp, True, self.n_train, self.seed),
            "val": ReleasedBrackets(
                splits["Test"][:: max(1, len(splits["Test"]) // self.n_val)][: self.n_val],
                self.scale,
                self.eval_patch,
                False,
                None,
                self.seed,
            ),
            "test": ReleasedBrackets(splits["Test"], self.scale, self.eval_patch, False, None, self.seed),
        }
