"""Every real-format loader, given files of random bytes where its dataset should be, fails with one line that
names the file and says what to do (never a library traceback). Parametrised over the experiments, with the
network blocked: the loaders' own "missing file" messages tell the test which files to corrupt."""

from __future__ import annotations

import random
import re
import socket
from pathlib import Path

import hydra
import pytest

from core.errors import SuiteError
from tests.conftest import ROOT, compose_train

SLUGS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
# The real dataset each experiment reads, where its config offers several.
REAL = {
    "ts_lif": ["data.dataset=metr_la"],
    "badloss": ["data.dataset=cifar10"],
    "mda": ["data.dataset=cifar10"],  # its Fashion-MNIST may be found in the Debian dataset package
    "lice": ["data.dataset=german"],
    "nforgot": ["data.name=yelp_clear"],
    "semdice_deep": ["data.filename=pointmaze.npz"],
    "addp": ["data.dataset=nyuv2"],  # its KITTI and RefCOCO readers: tests/datamodules/test_perception.py
    "bracketire": ["data.dataset=bracketire"],
    "tulip": ["data.dataset=sharegpt4v"],  # its ShareGPT4V annotation JSON (Urban-1k / Long-DCI: test_captions.py)
    "preworld": ["data.version=v1.0-mini"],  # the nuScenes tables, read through nuscenes-devkit
}
# Experiments whose data are produced online (an environment), with no real-format file to read.
NO_FILES = {"semdice_finetune": "online DDPG in a gymnasium environment"}
# Loaders that read every file of a folder (a text corpus): the test names the shard it corrupts.
SHARD = "corpus.parquet"


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _setup(slug: str, data_dir: Path, out: Path) -> None:
    cfg = compose_train(
        [f"experiment={slug}", "data.source=real", f"data.data_dir={data_dir}", *REAL.get(slug, [])], out
    )
    hydra.utils.instantiate(cfg.data).setup("fit")


@pytest.mark.parametrize("slug", SLUGS)
def test_unreadable_real_data_file_is_one_line_naming_it(slug: str, tmp_path: Path, no_network):
    if slug in NO_FILES:
        pytest.skip(f"{slug}: no real-format file ({NO_FILES[slug]})")
    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(SuiteError) as missing:
        _setup(slug, data, tmp_path / "out")
    named = sorted({p.rstrip(".") for p in re.findall(re.escape(str(data)) + r"/[^\s,;:)'\"]+", str(missing.value))})
    files = [Path(p) for p in named] or [data / SHARD]
    rng = random.Random(0)
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(bytes([0x80, 0xFF]) + rng.randbytes(4094))  # invalid UTF-8, pickle, JSON, HDF5, parquet
    with pytest.raises(SuiteError) as bad:
        _setup(slug, data, tmp_path / "out")
    message = str(bad.value)
    assert "\n" not in message and "Traceback" not in message, message
    assert "missing" not in message.split(":")[0], f"{slug}: random bytes reported as missing: {message}"
    assert any(str(f) in message for f in files) or str(data) in message, f"{slug}: names no file: {message}"
