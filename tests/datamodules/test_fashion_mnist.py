"""Fashion-MNIST loader: IDX fixtures written by the test in the exact format (gz and raw), search order, errors."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

import datamodules.fashion_mnist as fm
from core.errors import ConfigError, DataFormatError, MissingDataError


def write_idx(path: Path, array: np.ndarray, gz: bool) -> None:
    """IDX: 0x0000, type 0x08 (uint8), ndim, big-endian uint32 dims, C-order payload."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(path.with_name(path.name + ".gz"), "wb") as fh:
            fh.write(payload)
    else:
        path.write_bytes(payload)


def make_fixture(root: Path, n_train: int = 30, n_test: int = 12, gz: bool = True, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    data = {
        "train": (rng.integers(0, 256, (n_train, 28, 28)), rng.integers(0, 10, n_train)),
        "test": (rng.integers(0, 256, (n_test, 28, 28)), rng.integers(0, 10, n_test)),
    }
    root.mkdir(parents=True, exist_ok=True)
    for split, (x, y) in data.items():
        img_stem, lab_stem = fm.FILES[split]
        write_idx(root / img_stem, x, gz)
        write_idx(root / lab_stem, y, gz)
    return data


@pytest.fixture
def no_debian(monkeypatch, tmp_path):
    monkeypatch.setattr(fm, "DEBIAN_DIRS", [str(tmp_path / "nowhere")])


@pytest.mark.parametrize("gz", [True, False])
def test_reads_idx_fixture_exactly(tmp_path, no_debian, gz):
    data = make_fixture(tmp_path, gz=gz)
    for split in ("train", "test"):
        x, y = fm.load_fashion_mnist(split, str(tmp_path))
        assert x.dtype == torch.uint8 and y.dtype == torch.int64
        assert x.shape == (len(data[split][1]), 28, 28)
        np.testing.assert_array_equal(x.numpy(), data[split][0])
        np.testing.assert_array_equal(y.numpy(), data[split][1])


def test_torchvision_layout_and_debian_dirs_are_found(tmp_path, monkeypatch):
    data = make_fixture(tmp_path / "tv" / "FashionMNIST" / "raw", gz=False, seed=1)
    monkeypatch.setattr(fm, "DEBIAN_DIRS", [str(tmp_path / "nowhere")])
    _, y = fm.load_fashion_mnist("test", str(tmp_path / "tv"))
    np.testing.assert_array_equal(y.numpy(), data["test"][1])
    # With no data_dir, the Debian list is searched (here pointed at a fixture folder).
    deb = make_fixture(tmp_path / "deb", seed=2)
    monkeypatch.setattr(fm, "DEBIAN_DIRS", [str(tmp_path / "nowhere"), str(tmp_path / "deb")])
    _, y = fm.load_fashion_mnist("train")
    np.testing.assert_array_equal(y.numpy(), deb["train"][1])


def test_missing_files_name_the_package(tmp_path, no_debian):
    with pytest.raises(MissingDataError, match="dataset-fashion-mnist") as err:
        fm.load_fashion_mnist("train", str(tmp_path))
    assert str(tmp_path) in str(err.value)
    with pytest.raises(ConfigError, match="split='val'"):
        fm.load_fashion_mnist("val", str(tmp_path))


def test_bad_idx_names_file_and_row(tmp_path, no_debian):
    make_fixture(tmp_path, gz=False)
    lab = tmp_path / "train-labels-idx1-ubyte"
    raw = bytearray(lab.read_bytes())
    raw[8 + 3] = 42  # row 3 gets label 42
    lab.write_bytes(bytes(raw))
    with pytest.raises(DataFormatError, match="row 3 has label 42"):
        fm.load_fashion_mnist("train", str(tmp_path))
    lab.write_bytes(bytes(raw[:-5]))  # truncated payload
    with pytest.raises(DataFormatError, match="payload has 25 bytes"):
        fm.load_fashion_mnist("train", str(tmp_path))
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(b"\x01\x02\x08\x03")
    with pytest.raises(DataFormatError, match="not an IDX file"):
        fm.load_fashion_mnist("test", str(tmp_path))


def test_digits_helper():
    x, y = fm.load_digits_images()
    assert x.shape == (1797, 8, 8) and x.dtype == torch.uint8
    assert int(x.max()) == 255 and int(x.min()) == 0
    assert sorted(torch.unique(y).tolist()) == list(range(10))


def test_digits_split_is_fixed_disjoint_and_complete():
    (xtr, ytr), (xte, yte) = fm.load_digits_split("train"), fm.load_digits_split("test")
    assert (len(ytr), len(yte)) == (1437, 360)
    x, _ = fm.load_digits_images()
    # the two splits partition the 1,797 images (compared as rows), and the split does not move between calls
    rows = {tuple(r.tolist()) for r in x.flatten(1)}
    assert {tuple(r.tolist()) for r in torch.cat([xtr, xte]).flatten(1)} == rows
    assert torch.equal(fm.load_digits_split("test")[0], xte)
    with pytest.raises(ConfigError, match="digits split='val'"):
        fm.load_digits_split("val")


def test_datamodule_digits_dataset(no_debian):
    dm = fm.FashionMNISTDataModule(dataset="digits", batch_size=16, val_fraction=0.1, seed=3)
    dm.setup("fit")
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [1293, 144, 360]
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 1, 8, 8) and float(x.max()) <= 1.0
    # the test split is the fixed one whatever the run seed; train/val move with it
    other = fm.FashionMNISTDataModule(dataset="digits", seed=4)
    other.setup("fit")
    assert torch.equal(other.datasets["test"].images, dm.datasets["test"].images)
    assert not torch.equal(other.datasets["val"].images, dm.datasets["val"].images)
    with pytest.raises(ConfigError, match="data.dataset='mnist'"):
        fm.FashionMNISTDataModule(dataset="mnist")


def test_datamodule_splits_subset_and_index(tmp_path, no_debian):
    make_fixture(tmp_path, n_train=40, n_test=12)
    dm = fm.FashionMNISTDataModule(
        data_dir=str(tmp_path), batch_size=8, val_fraction=0.25, subset=20, return_index=True
    )
    dm.setup("fit")
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [15, 5, 12]
    x, y, i = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 1, 28, 28) and x.dtype == torch.float32
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    assert i.shape == (8,) and int(i.max()) < 15
    with pytest.raises(ConfigError, match="val_fraction=1.0"):
        fm.FashionMNISTDataModule(val_fraction=1.0)


@pytest.mark.dataset
@pytest.mark.skipif(fm.find_fashion_mnist("test") is None, reason="dataset-fashion-mnist not installed")
def test_debian_package_if_installed():
    x, y = fm.load_fashion_mnist("test")
    assert x.shape == (10000, 28, 28) and torch.bincount(y).tolist() == [1000] * 10


def test_a_named_data_dir_never_falls_back_to_the_system_copy(tmp_path, monkeypatch, caplog):
    """The system copy (the embedded default) is read only when no data_dir was given, and said once."""
    import logging

    make_fixture(tmp_path / "deb", seed=2)
    monkeypatch.setattr(fm, "DEBIAN_DIRS", [str(tmp_path / "deb")])
    monkeypatch.setattr(fm, "_SAID", set())
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingDataError, match="not found in") as err:
        fm.load_fashion_mnist("train", str(tmp_path / "empty"))
    assert str(tmp_path / "deb") not in str(err.value)
    with pytest.raises(MissingDataError, match="does not exist"):
        fm.load_fashion_mnist("train", str(tmp_path / "missing"))
    with caplog.at_level(logging.INFO, logger="datamodules.fashion_mnist"):
        fm.load_fashion_mnist("train")
        fm.load_fashion_mnist("test")
        fm.load_fashion_mnist("train", str(tmp_path / "empty"), system=True)  # source=embedded with data_dir
    said = [r.getMessage() for r in caplog.records if "embedded copy" in r.getMessage()]
    assert said == [f"Fashion-MNIST: the embedded copy in {tmp_path / 'deb'} (no data_dir holds the files)"]
