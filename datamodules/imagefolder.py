"""Labelled images in class folders (torchvision ``ImageFolder``), for explaining pretrained classifiers.

The layout is ``<data_dir>/<class>/<image>``; classes are the sorted folder names, so an ImageNet validation set
arranged in its 1,000 ``nXXXXXXXX`` synset folders gets the standard ImageNet class indices that timm's pretrained
heads use. Images are resized (shorter side) and centre-cropped to ``image_size`` and normalised with ``mean`` /
``std`` (timm's ViT-B/16, ViT-Ti/16, ViT-B/32: 0.5 / 0.5, as the MDA paper). There is no embedded copy: the set is
the user's (``source=real``). The same images serve as the train/val/test splits (nothing is trained on them; the
``train`` split exists so that Lightning can be driven the usual way).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, Subset

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules._base import SuiteDataModule, seeded_permutation
from datamodules.corruptions import CorruptibleImages, corrupt


class _Normalised(Dataset):
    """``(x - mean) / std`` of a dataset of ``[0, 1]`` images, corrupted first by ``corrupt(x [1, C, H, W], i)``
    when given (item ``i`` seeded by its index, so the corrupted set does not depend on the loading order)."""

    def __init__(self, base: Dataset, mean: float, std: float, corrupt: Any = None) -> None:
        self.base, self.mean, self.std, self.corrupt = base, mean, std, corrupt

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        try:
            x, y = self.base[i]
        except OSError as err:  # an unreadable image file: name it
            raise DataFormatError(f"image {i} of the ImageFolder cannot be read ({err})") from None
        if self.corrupt is not None:
            x = self.corrupt(x[None], i)[0]
        return (x - self.mean) / self.std, y


class ImageFolderDataModule(CorruptibleImages, SuiteDataModule):
    """Class-folder images as ``x`` float ``[B, 3, S, S]`` (normalised), ``y`` the sorted-folder class index.

    Args:
        source: must be ``real`` (no embedded copy).
        data_dir: the root holding one folder per class.
        image_size: side ``S`` after resize + centre crop (224 for the paper's ViTs).
        mean, std: per-channel normalisation (ViT: 0.5 / 0.5).
        subset: keep this many images (seeded), e.g. the paper's 5,000 of ImageNet val; ``None`` keeps all.
        batch_size, num_workers, seed: see :class:`SuiteDataModule`.
        corruption, severity: corrupt the ``test`` split's images (before normalisation) with this CIFAR-10-C
            corruption at this severity (:mod:`datamodules.corruptions`, image by image as they load; ``None``:
            clean). The parameters are CIFAR-10-C's (32 px), milder than ImageNet-C's at 224 px.
        corruption_dir: not supported here (CIFAR-10-C files are 32x32 arrays, not class folders).
    """

    def __init__(
        self,
        source: str = "real",
        data_dir: str = "data/imagenet_val",
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
        image_size: int = 224,
        mean: float = 0.5,
        std: float = 0.5,
        subset: int | None = None,
        corruption: str | None = None,
        severity: int = 5,
        corruption_dir: str | None = None,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        self.init_corruption(corruption, severity, corruption_dir)
        if corruption_dir is not None:
            raise ConfigError(
                f"data.corruption_dir={corruption_dir}: data=imagefolder corrupts its own images (data.corruption); "
                "CIFAR-10-C folders are read by data=fashion_mnist|poisoned"
            )
        if image_size < 8:
            raise ConfigError(f"data.image_size={image_size} must be >= 8")
        if std <= 0:
            raise ConfigError(f"data.std={std} must be > 0")
        if subset is not None and subset < 1:
            raise ConfigError(f"data.subset={subset} must be >= 1 or null")
        self.image_size, self.mean, self.std, self.subset = image_size, mean, std, subset

    def load_embedded(self) -> dict[str, Any]:
        raise ConfigError("data=imagefolder has no embedded copy: set data.source=real data.data_dir=<class folders>")

    def load_real(self) -> dict[str, Any]:
        from torchvision import transforms
        from torchvision.datasets import ImageFolder

        root = Path(self.data_dir).expanduser()
        if not root.is_dir():
            raise MissingDataError(
                f"ImageFolder root {root} does not exist: put one folder per class in it (ImageNet val: the 1,000 "
                "synset folders, e.g. from ILSVRC2012_img_val.tar sorted with the devkit's labels)"
            )
        tf = transforms.Compose(
            [transforms.Resize(self.image_size), transforms.CenterCrop(self.image_size), transforms.ToTensor()]
        )
        try:
            ds = ImageFolder(str(root), transform=tf)
        except FileNotFoundError as err:
            raise MissingDataError(f"{root}: {err}") from None
        data: Dataset = _Normalised(ds, self.mean, self.std)
        test: Dataset = _Normalised(ds, self.mean, self.std, self._corrupt_item if self.corruption else None)
        if self.subset is not None and self.subset < len(ds):
            keep = seeded_permutation(len(ds), self.seed)[: self.subset].tolist()
            data, test = Subset(data, keep), Subset(test, keep)
        self.classes = ds.classes
        return {"train": data, "val": data, "test": test}

    def _corrupt_item(self, x: torch.Tensor, i: int) -> torch.Tensor:
        return corrupt(x, str(self.corruption), self.severity, seed=(self.seed * 1_000_003 + i) % 2**62)
