"""ImageFolderDataModule reads a small class-folder fixture written by the test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from core.errors import ConfigError, MissingDataError
from datamodules.imagefolder import ImageFolderDataModule


def test_reads_class_folders(tmp_path: Path):
    for cls, value in (("n01440764", 0), ("n01443537", 255)):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.fromarray(np.full((20, 30, 3), value, dtype=np.uint8)).save(tmp_path / cls / f"{i}.png")
    dm = ImageFolderDataModule(source="real", data_dir=str(tmp_path), image_size=16, batch_size=4)
    dm.setup()
    x, y = next(iter(dm.test_dataloader()))
    assert x.shape == (4, 3, 16, 16) and sorted(y.tolist()) == [0, 0, 1, 1]
    # (0 - 0.5) / 0.5 = -1 for black, (1 - 0.5) / 0.5 = 1 for white
    assert torch.allclose(x[y == 0], torch.tensor(-1.0)) and torch.allclose(x[y == 1], torch.tensor(1.0))
    assert dm.classes == ["n01440764", "n01443537"]
    sub = ImageFolderDataModule(source="real", data_dir=str(tmp_path), image_size=16, subset=3)
    sub.setup()
    assert len(sub.datasets["test"]) == 3


def test_errors(tmp_path: Path):
    with pytest.raises(MissingDataError, match="does not exist"):
        ImageFolderDataModule(source="real", data_dir=str(tmp_path / "nope")).setup()
    with pytest.raises(ConfigError, match="no embedded copy"):
        ImageFolderDataModule(source="embedded", data_dir=str(tmp_path)).setup()
    with pytest.raises(ConfigError, match="std"):
        ImageFolderDataModule(std=0.0)
