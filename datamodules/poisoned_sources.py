"""Base image-classification sets for :mod:`datamodules.poisoned`, all as ``uint8 [N, C, H, W]`` + ``int64 [N]``.

* ``fashion_mnist`` (embedded: Debian ``dataset-fashion-mnist``; see :mod:`datamodules.fashion_mnist`), ``digits``
  (sklearn, 8x8, for fast tests);
* real formats: CIFAR-10 (the ``cifar-10-batches-py`` pickles; torchvision downloads them), GTSRB (torchvision's
  ``gtsrb/GTSRB`` layout, resized to 32x32 as in the paper), Imagenette (an ImageFolder root with ``train/`` and
  ``val/`` class folders, resized to ``image_size``).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from core.errors import DataFormatError, MissingDataError
from datamodules.fashion_mnist import load_digits_split, load_fashion_mnist

# name -> (channels, height, width, classes) of what the loader returns (Imagenette: height/width = image_size).
SOURCES: dict[str, tuple[int, int, int, int]] = {
    "fashion_mnist": (1, 28, 28, 10),
    "digits": (1, 8, 8, 10),
    "cifar10": (3, 32, 32, 10),
    "gtsrb": (3, 32, 32, 43),
    "imagenette": (3, 224, 224, 10),
}
EMBEDDED = ("fashion_mnist", "digits")
CIFAR_FILES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}


def load_source(
    name: str, split: str, data_dir: str | None, download: bool = False, image_size: int = 224
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images uint8 [N, C, H, W], labels int64 [N])`` of ``split`` (``train``/``test``) of source ``name``."""
    if name == "fashion_mnist":
        x, y = load_fashion_mnist(split, data_dir, download)
        return x.unsqueeze(1), y
    if name == "digits":
        x, y = load_digits_split(split)
        return x.unsqueeze(1), y
    if data_dir is None:
        raise MissingDataError(f"source {name!r} needs data.data_dir")
    if name == "cifar10":
        return load_cifar10(split, data_dir, download)
    if name == "gtsrb":
        return load_gtsrb(split, data_dir, download)
    if name == "imagenette":
        return load_imagenette(split, data_dir, image_size)
    raise MissingDataError(f"unknown source {name!r}; known: {sorted(SOURCES)}")


def load_cifar10(split: str, data_dir: str, download: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-10 from ``<data_dir>/cifar-10-batches-py`` (python pickles: ``data`` uint8 [n, 3072], ``labels``)."""
    root = Path(data_dir) / "cifar-10-batches-py"
    if download and not all((root / f).is_file() for f in CIFAR_FILES[split]):
        try:
            from torchvision.datasets import CIFAR10

            CIFAR10(root=str(data_dir), train=split == "train", download=True)
        except Exception as err:  # noqa: BLE001 - any network failure becomes one user-facing error
            raise MissingDataError(f"CIFAR-10 download into {data_dir} failed ({err})") from None
    xs, ys = [], []
    for fname in CIFAR_FILES[split]:
        path = root / fname
        if not path.is_file():
            raise MissingDataError(
                f"missing CIFAR-10 file {path}: pass data.download=true (torchvision) or unpack "
                "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz into data_dir"
            )
        try:
            with open(path, "rb") as fh:
                batch = pickle.load(fh, encoding="latin1")
            data, labels = np.asarray(batch["data"], dtype=np.uint8), np.asarray(batch["labels"], dtype=np.int64)
        except Exception as err:  # noqa: BLE001
            raise DataFormatError(f"{path}: not a CIFAR-10 python batch ({err})") from None
        if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
            raise DataFormatError(f"{path}: data {list(data.shape)} / labels {len(labels)}: need [n, 3072] / n")
        bad = np.nonzero((labels < 0) | (labels > 9))[0]
        if len(bad):
            raise DataFormatError(f"{path}: row {int(bad[0])} has label {int(labels[bad[0]])}, expected 0..9")
        xs.append(data.reshape(-1, 3, 32, 32))
        ys.append(labels)
    return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))


def _pil_stack(samples: list[tuple[str, int]], size: int, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    from PIL import Image

    if not samples:
        raise MissingDataError(f"no images found under {where}")
    xs = np.empty((len(samples), 3, size, size), dtype=np.uint8)
    for i, (path, _) in enumerate(samples):
        try:
            img = Image.open(path).convert("RGB").resize((size, size), Image.BILINEAR)
        except Exception as err:  # noqa: BLE001
            raise DataFormatError(f"{path}: unreadable image ({err})") from None
        xs[i] = np.asarray(img).transpose(2, 0, 1)
    return torch.from_numpy(xs), torch.tensor([t for _, t in samples], dtype=torch.int64)


def load_gtsrb(split: str, data_dir: str, download: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """GTSRB through ``torchvision.datasets.GTSRB`` (``<data_dir>/gtsrb/GTSRB/...``), resized to 32x32."""
    from torchvision.datasets import GTSRB

    try:
        ds = GTSRB(root=str(data_dir), split=split, download=download)
    except RuntimeError as err:
        raise MissingDataError(
            f"GTSRB {split} not found under {Path(data_dir) / 'gtsrb'} ({err}); pass data.download=true"
        ) from None
    except FileNotFoundError as err:
        raise MissingDataError(f"GTSRB {split}: {err}") from None
    except (KeyError, ValueError) as err:
        raise DataFormatError(f"{Path(data_dir) / 'gtsrb' / 'GT-final_test.csv'}: bad GTSRB test CSV ({err})") from None
    samples = ds._samples
    if split == "train":  # the class id is the folder name (torchvision's folder rank shifts if one is missing)
        try:
            samples = [(p, int(Path(p).parent.name)) for p, _ in samples]
        except ValueError as err:
            raise DataFormatError(f"GTSRB training folder names must be class ids like 00042 ({err})") from None
    return _pil_stack(samples, 32, str(Path(data_dir) / "gtsrb"))


def load_imagenette(split: str, data_dir: str, image_size: int = 224) -> tuple[torch.Tensor, torch.Tensor]:
    """Imagenette from an ImageFolder root: ``<data_dir>/train/<class>/*`` and ``<data_dir>/val/<class>/*``."""
    from torchvision.datasets import ImageFolder

    folder = Path(data_dir) / ("train" if split == "train" else "val")
    if not folder.is_dir():
        raise MissingDataError(
            f"missing Imagenette folder {folder}: unpack https://s3.amazonaws.com/fast-ai-imageclas/imagenette2.tgz "
            "into data_dir (it holds train/ and val/)"
        )
    try:
        ds = ImageFolder(str(folder))
    except FileNotFoundError as err:
        raise MissingDataError(f"{folder}: {err}") from None
    return _pil_stack(ds.samples, image_size, str(folder))
