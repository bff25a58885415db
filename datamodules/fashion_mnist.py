"""Fashion-MNIST (Xiao et al., 2017) and sklearn's digits: small labelled grey-scale images, found offline.

Where the files come from, in order:

1. ``data_dir`` when given: the four IDX files (``.gz`` or not) directly in it, or torchvision's
   ``<data_dir>/FashionMNIST/raw`` layout;
2. the Debian package ``dataset-fashion-mnist`` (``apt-get install -y dataset-fashion-mnist``), which installs the
   four original gzipped IDX files into ``/usr/share/datasets/fashion-mnist`` (:data:`DEBIAN_DIRS`);
3. ``torchvision.datasets.FashionMNIST(data_dir, download=True)`` when ``download=True`` and a network exists.

Otherwise :class:`~core.errors.MissingDataError` says how to get the files. Images are ``uint8 [N, 28, 28]`` and
labels ``int64 [N]``; the DataModule turns them into ``float [1, 28, 28]`` in ``[0, 1]``.
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules._base import SuiteDataModule, seeded_permutation, split_indices
from datamodules.corruptions import CorruptibleImages

# Where the Debian package `dataset-fashion-mnist` puts its files (the first is Debian's install path; the others
# cover a local `dpkg-deb -x` into /usr/local or the home folder).
DEBIAN_DIRS: list[str] = [
    "/usr/share/datasets/fashion-mnist",
    "/usr/local/share/datasets/fashion-mnist",
    "~/.local/share/datasets/fashion-mnist",
]

FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
SIZES = {"train": 60000, "test": 10000}
CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
HOW_TO_GET = (
    "Install the Debian package (`apt-get update && apt-get install -y dataset-fashion-mnist`, files land in "
    "/usr/share/datasets/fashion-mnist), or put the four IDX files (train-images-idx3-ubyte[.gz], "
    "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]) into data_dir, "
    "or pass download=True with a network (torchvision)."
)
_IDX_DTYPE = {0x08: np.uint8}
log = logging.getLogger(__name__)
DATASETS = ("fashion_mnist", "digits")


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (LeCun's MNIST format, gzipped or not) into a uint8 array.

    Format: two zero bytes, a type byte (0x08 = unsigned byte), the number of dimensions ``d``, ``d`` big-endian
    uint32 sizes, then the data in C order.

    Raises:
        DataFormatError: bad magic number, unsupported type, or a payload whose size does not match the header.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except OSError as err:
        raise DataFormatError(f"{path}: cannot read IDX file ({err})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataFormatError(f"{path}: not an IDX file (magic bytes {raw[:4].hex()!r}, expected 0000TTDD)")
    if raw[2] not in _IDX_DTYPE:
        raise DataFormatError(f"{path}: IDX type byte 0x{raw[2]:02x} unsupported (expected 0x08 = uint8)")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise DataFormatError(f"{path}: truncated IDX header ({ndim} dimensions declared)")
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims)) if dims else 0
    if len(raw) - offset != expected:
        raise DataFormatError(
            f"{path}: IDX payload has {len(raw) - offset} bytes but the header {dims} needs {expected}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(dims).copy()


def _find(directory: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def _candidate_dirs(data_dir: str | None, system: bool | None = None) -> list[Path]:
    """Folders searched: ``data_dir``'s layouts, then (``system``, default: only when no ``data_dir`` was given)
    the system copy's :data:`DEBIAN_DIRS`. A ``data_dir`` the user named is never silently replaced by another copy."""
    dirs: list[Path] = []
    if data_dir is not None:
        root = Path(data_dir).expanduser()
        dirs += [root, root / "FashionMNIST" / "raw", root / "fashion-mnist"]
    if data_dir is None if system is None else system:
        dirs += [Path(d).expanduser() for d in DEBIAN_DIRS]
    return dirs


_SAID: set[Path] = set()


def find_fashion_mnist(split: str, data_dir: str | None = None, system: bool | None = None) -> tuple[Path, Path] | None:
    """The (images, labels) IDX paths of ``split`` in the first folder that holds both, or ``None``; ``system``: also
    search the system copy (default: only when ``data_dir`` is None)."""
    images_stem, labels_stem = FILES[split]
    for d in _candidate_dirs(data_dir, system):
        images, labels = _find(d, images_stem), _find(d, labels_stem)
        if images is not None and labels is not None:
            return images, labels
    return None


def load_fashion_mnist(
    split: str, data_dir: str | None = None, download: bool = False, system: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one split of Fashion-MNIST.

    Args:
        split: ``train`` (60,000 images) or ``test`` (10,000).
        data_dir: Optional folder searched first (flat IDX files or torchvision's ``FashionMNIST/raw``); the
            download target when ``download=True``.
        download: Let torchvision download the files into ``data_dir`` when no local copy is found.
        system: Also search the system copy (:data:`DEBIAN_DIRS`, the embedded default). Default: only when no
            ``data_dir`` was given; a named ``data_dir`` without the files is an error, never a silent fallback.

    Returns:
        ``images`` uint8 ``[N, 28, 28]`` and ``labels`` int64 ``[N]``.

    Raises:
        ConfigError: unknown split.
        MissingDataError: no local copy (and no download asked for, or the download failed).
        DataFormatError: a file is not valid IDX, or images and labels disagree.
    """
    if split not in FILES:
        raise ConfigError(f"Fashion-MNIST split={split!r} must be one of {sorted(FILES)}")
    found = find_fashion_mnist(split, data_dir, system)
    if found is None and data_dir is not None and not download and not Path(data_dir).expanduser().is_dir():
        raise MissingDataError(
            f"Fashion-MNIST data_dir {data_dir} does not exist (data.source=embedded uses the system copy, "
            f"{DEBIAN_DIRS[0]}). {HOW_TO_GET}"
        )
    if found is None and download:
        if data_dir is None:
            raise ConfigError("Fashion-MNIST download=True needs a data_dir to download into")
        try:
            from torchvision.datasets import FashionMNIST

            FashionMNIST(root=str(data_dir), train=split == "train", download=True)
        except Exception as err:  # noqa: BLE001 - any network/IO failure becomes the same user-facing error
            raise MissingDataError(f"Fashion-MNIST download into {data_dir} failed ({err}). {HOW_TO_GET}") from None
        found = find_fashion_mnist(split, data_dir, system)
    if found is None:
        searched = ", ".join(str(d) for d in _candidate_dirs(data_dir, system))
        raise MissingDataError(f"Fashion-MNIST {split} IDX files not found in: {searched}. {HOW_TO_GET}")
    images_path, labels_path = found
    if images_path.parent not in _SAID and (data_dir is None or Path(data_dir).expanduser() not in images_path.parents):
        _SAID.add(images_path.parent)  # said once per process, not once per split
        log.info("Fashion-MNIST: the embedded copy in %s (no data_dir holds the files)", images_path.parent)
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3:
        raise DataFormatError(f"{images_path}: images must have 3 IDX dimensions [N, H, W], got {list(images.shape)}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataFormatError(
            f"{labels_path}: labels shape {list(labels.shape)} does not match {len(images)} images in {images_path}"
        )
    bad = np.nonzero(labels > 9)[0]
    if len(bad):
        raise DataFormatError(f"{labels_path}: row {int(bad[0])} has label {int(labels[bad[0]])}, expected 0..9")
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


def load_digits_images() -> tuple[torch.Tensor, torch.Tensor]:
    """sklearn's bundled digits (UCI optdigits, 1,797 images, offline) as Fashion-MNIST-like tensors.

    Returns:
        ``images`` uint8 ``[1797, 8, 8]`` (the 0..16 grey levels rescaled to 0..255) and ``labels`` int64 ``[1797]``.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.rint(d.images * (255.0 / 16.0)).astype(np.uint8)
    return torch.from_numpy(images), torch.from_numpy(d.target.astype(np.int64))


DIGITS_SPLIT_SEED = 1234


def load_digits_split(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One split of sklearn's digits: sklearn ships a single set, so a fixed seeded 80/20 split (1,437 / 360 images,
    the same for every run seed) plays ``train`` / ``test``.

    Returns:
        ``images`` uint8 ``[N, 8, 8]`` and ``labels`` int64 ``[N]``.

    Raises:
        ConfigError: unknown split.
    """
    if split not in FILES:
        raise ConfigError(f"digits split={split!r} must be one of {sorted(FILES)}")
    x, y = load_digits_images()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(DIGITS_SPLIT_SEED))
    cut = int(0.8 * len(y))
    idx = perm[:cut] if split == "train" else perm[cut:]
    return x[idx], y[idx]


class ImageTensorDataset(Dataset):
    """``uint8 [N, H, W]`` or ``[N, C, H, W]`` images as float ``[C, H, W]`` in ``[0, 1]``.

    Items are ``(x, y)``, or ``(x, y, i)`` with the dataset index ``i`` when ``return_index`` (what
    :class:`callbacks.loss_dynamics.LossDynamics` needs to gather per-example losses).
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, return_index: bool = False) -> None:
        if images.dim() == 3:
            images = images.unsqueeze(1)
        if images.dim() != 4 or len(images) != len(labels):
            raise DataFormatError(f"images {list(images.shape)} / labels {list(labels.shape)}: need [N,(C,)H,W] / [N]")
        self.images, self.labels, self.return_index = images, labels.long(), return_index

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        x = self.images[i]
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        return (x, self.labels[i], i) if self.return_index else (x, self.labels[i])


class FashionMNISTDataModule(CorruptibleImages, SuiteDataModule):
    """Plain Fashion-MNIST classification: 10 classes, ``x`` float ``[B, 1, 28, 28]`` in ``[0, 1]``.

    ``source=embedded`` reads the Debian package's files (or ``data_dir`` if it holds them); ``source=real`` reads
    ``data_dir`` and downloads through torchvision when ``download=True``. The validation split is a seeded
    ``val_fraction`` of the training set. ``dataset=digits`` swaps in sklearn's 8x8 digits (bundled with sklearn,
    either source; :func:`load_digits_split`), a smaller image task of the same shape family.

    Args:
        source, data_dir, batch_size, num_workers, seed: see :class:`SuiteDataModule`.
        dataset: ``fashion_mnist`` (28x28) or ``digits`` (8x8).
        val_fraction: Share of the training images held out for validation, in ``[0, 1)``.
        subset: Keep only this many training images (seeded), e.g. for quick runs; ``None`` keeps all.
        download: Allow torchvision to download (``source=real`` only).
        return_index: Items are ``(x, y, index)`` instead of ``(x, y)``.
        corruption: Corrupt the test images with this CIFAR-10-C corruption (:mod:`datamodules.corruptions`);
            ``None`` keeps them clean.
        severity: Its severity, 1..5.
        corruption_dir: A CIFAR-10-C-style folder (``<corruption>.npy``, ``labels.npy``) whose images of the
            datamodule's shape replace the test set instead of corrupting it here.
    """

    num_classes = 10

    def __init__(
        self,
        source: str = "embedded",
        data_dir: str = "data/fashion_mnist",
        batch_size: int = 128,
        num_workers: int = 0,
        seed: int = 0,
        val_fraction: float = 0.1,
        subset: int | None = None,
        download: bool = False,
        return_index: bool = False,
        dataset: str = "fashion_mnist",
        corruption: str | None = None,
        severity: int = 5,
        corruption_dir: str | None = None,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        self.init_corruption(corruption, severity, corruption_dir)
        if dataset not in DATASETS:
            raise ConfigError(f"data.dataset={dataset!r} must be one of {list(DATASETS)}")
        self.dataset = dataset
        if not 0.0 <= val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction={val_fraction} must be in [0, 1)")
        if subset is not None and subset < 2:
            raise ConfigError(f"data.subset={subset} must be >= 2 or null")
        self.val_fraction, self.subset, self.download, self.return_index = val_fraction, subset, download, return_index

    def _load(self, data_dir: str | None, download: bool, system: bool | None = None) -> dict[str, Any]:
        if self.dataset == "digits":
            (xtr, ytr), (xte, yte) = load_digits_split("train"), load_digits_split("test")
        else:
            xtr, ytr = load_fashion_mnist("train", data_dir, download, system)
            xte, yte = load_fashion_mnist("test", data_dir, download, system)
        xte, yte = self.read_corrupted_test((1, *xte.shape[-2:])) or (xte, yte)
        xte = self.corrupt_test(xte)
        return split_train_val(xtr, ytr, xte, yte, self.val_fraction, self.subset, self.seed, self.return_index)

    def load_embedded(self) -> dict[str, Any]:
        return self._load(self.data_dir if Path(self.data_dir).is_dir() else None, False, system=True)

    def load_real(self) -> dict[str, Any]:
        return self._load(self.data_dir, self.download)


def split_train_val(
    xtr: torch.Tensor,
    ytr: torch.Tensor,
    xte: torch.Tensor,
    yte: torch.Tensor,
    val_fraction: float,
    subset: int | None,
    seed: int,
    return_index: bool = False,
) -> dict[str, Dataset]:
    """Seeded train/val split of ``(xtr, ytr)`` (after an optional seeded ``subset``) plus the test set."""
    if subset is not None and subset < len(ytr):
        keep = seeded_permutation(len(ytr), seed)[:subset]
        xtr, ytr = xtr[keep], ytr[keep]
    fractions: Sequence[float] = [1 - val_fraction, val_fraction]
    tr, va = split_indices(len(ytr), fractions, seed + 1)
    return {
        "train": ImageTensorDataset(xtr[tr], ytr[tr], return_index),
        "val": ImageTensorDataset(xtr[va], ytr[va], return_index),
        "test": ImageTensorDataset(xte, yte, return_index),
    }
