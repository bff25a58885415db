"""datamodules/bracket.py: simulated brackets (bundled photos) and the released BracketIRE / BracketIRE+ layout."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules.bracket import (
    RAW_FILES,
    BracketDataModule,
    Domain,
    augment,
    load_metadata,
    simulate_sample,
)


def test_embedded_samples_have_the_bracket_fields_and_are_seeded():
    dm = BracketDataModule(patch_size=8, n_train=3, n_val=1, n_test=2, seed=3)
    dm.setup()
    s = dm.datasets["test"][1]
    assert s["raws"].shape == (5, 4, 8, 8) and s["gt"].shape == (4, 8, 8) and s["flow"].shape == (5, 2)
    codes = s["raws"] * 1023
    assert (
        torch.allclose(codes, codes.round(), atol=1e-4) and 0 <= float(s["raws"].min()) <= float(s["raws"].max()) <= 1
    )
    means = s["raws"].mean((1, 2, 3))
    assert (means[1:] >= means[:-1]).all()  # longer exposures are brighter
    again = BracketDataModule(patch_size=8, n_train=3, n_val=1, n_test=2, seed=3)
    again.setup()
    assert torch.equal(again.datasets["test"][1]["raws"], s["raws"])
    other = BracketDataModule(patch_size=8, n_train=3, n_val=1, n_test=2, seed=4)
    other.setup()
    # another seed draws other training brackets but scores on the same validation / test brackets (paired seeds)
    assert not torch.equal(other.datasets["train"][0]["raws"], again.datasets["train"][0]["raws"])
    assert torch.equal(other.datasets["test"][1]["raws"], s["raws"])
    assert torch.equal(other.datasets["val"][0]["raws"], again.datasets["val"][0]["raws"])


def test_shifted_domain_train_split_has_no_ground_truth_and_plus_is_x4():
    dm = BracketDataModule(domain="shifted", patch_size=8, n_train=2, n_val=1, n_test=1)
    dm.setup()
    assert "gt" not in dm.datasets["train"][0] and "gt" in dm.datasets["test"][0]
    plus = BracketDataModule(dataset="bracketire_plus", patch_size=16, n_train=1, n_val=1, n_test=1)
    plus.setup()
    s = plus.datasets["test"][0]
    assert s["raws"].shape == (5, 4, 4, 4) and s["gt"].shape == (4, 16, 16) and plus.scale == 4


def test_the_shifted_domain_is_noisier():
    photo = torch.rand(3, 80, 80) * 0.3
    dark = Domain(gain_range=(1.0, 1.0), light_max=1.0, camera_shift=0.0, shake=0.0, light_shift=0.0)
    noisy = Domain(**{**dark.__dict__, "shot_range": (0.01, 0.02)})

    def err(d):
        s = simulate_sample(photo, 16, False, d, torch.Generator().manual_seed(0))
        return float((s["raws"][0] * 16 - s["gt"]).abs().mean())

    assert err(noisy) > 1.5 * err(dark)


def test_motion_scale_scales_the_camera_motion_and_zero_is_static():
    def flow(m):
        dm = BracketDataModule(motion_scale=m, patch_size=8, n_train=2, n_val=1, n_test=1)
        return dm.load_embedded()["train"].sample(1)["flow"]

    full, half, none = flow(1.0), flow(0.5), flow(0.0)
    assert float(full.abs().max()) > 0.1 and torch.equal(none, torch.zeros_like(none))
    assert torch.allclose(2 * half, full, atol=1e-6)  # the same draws, the camera path scaled


def test_bad_configuration_and_small_photo():
    with pytest.raises(ConfigError, match="data.motion_scale"):
        BracketDataModule(motion_scale=float("nan"))
    with pytest.raises(ConfigError, match="data.dataset"):
        BracketDataModule(dataset="hdr")
    with pytest.raises(ConfigError, match="divisible by 4"):
        BracketDataModule(dataset="bracketire_plus", patch_size=10)
    with pytest.raises(ConfigError, match="too small"):
        simulate_sample(torch.rand(3, 20, 20), 32, False, Domain(), torch.Generator())


def test_augmentation_transforms_the_oracle_flow_with_the_images():
    s = {
        "raws": torch.rand(5, 4, 6, 6),
        "gt": torch.rand(4, 6, 6),
        "flow": torch.tensor([[0.0, 0.0], [1.0, 2.0]] * 2 + [[3.0, -1.0]]),
    }
    for seed in range(8):
        a = augment(s, torch.Generator().manual_seed(seed))
        flips = torch.rand(3, generator=torch.Generator().manual_seed(seed)) < 0.5
        fl = s["flow"].clone()
        fl[:, 0] *= -1 if flips[0] else 1
        fl[:, 1] *= -1 if flips[1] else 1
        assert torch.equal(a["flow"], fl.flip(-1) if flips[2] else fl)
        assert torch.allclose(a["raws"].sum(), s["raws"].sum()) and a["gt"].shape == (4, 6, 6)


def write_released(root: Path, scale: int = 1, frames: int = 2, hw: int = 8, meta_obj=None) -> None:
    """A tiny BracketIRE(+) tree: Train/ and Test/ with <scene>/<frame>/raw_*.npy, raw_gt.npy, metadata.npy."""
    rng = np.random.default_rng(0)
    for split in ("Train", "Test"):
        for f in range(frames):
            d = root / split / "scene_a" / f"{f:04d}"
            d.mkdir(parents=True)
            for name in RAW_FILES:
                np.save(d / name, rng.integers(0, 1024, (hw, hw, 4)).astype(np.uint16))
            np.save(d / "raw_gt.npy", (rng.random((hw * scale, hw * scale, 4)) * 4).astype(np.float32))
            meta = meta_obj or {
                "red_gain": np.float32([1.9]),
                "blue_gain": np.float32([1.5]),
                "cam2rgb": np.eye(3, dtype=np.float32),
                "rgb2cam": np.eye(3, dtype=np.float32),
            }
            np.save(d / "metadata.npy", meta, allow_pickle=True)


@pytest.mark.parametrize(("dataset", "scale"), [("bracketire", 1), ("bracketire_plus", 4)])
def test_released_layout_is_read(tmp_path, dataset, scale):
    write_released(tmp_path, scale)
    dm = BracketDataModule(
        source="real", data_dir=str(tmp_path), dataset=dataset, patch_size=4 * scale, n_train=5, n_val=1
    )
    dm.setup()
    assert len(dm.datasets["train"]) == 5 and len(dm.datasets["test"]) == 2 and len(dm.datasets["val"]) == 1
    tr = dm.datasets["train"][0]
    assert tr["raws"].shape == (5, 4, 4, 4) and tr["gt"].shape == (4, 4 * scale, 4 * scale)
    te = dm.datasets["test"][0]
    raw1 = np.load(tmp_path / "Test" / "scene_a" / "0000" / "raw_1.npy")
    assert torch.allclose(te["raws"][0], torch.from_numpy(raw1.astype(np.float32)).permute(2, 0, 1) / 1023)
    assert float(te["meta"]["red_gain"]) == pytest.approx(1.9) and te["meta"]["cam2rgb"].shape == (3, 3)


def test_released_layout_errors(tmp_path):
    with pytest.raises(MissingDataError, match="Train"):
        BracketDataModule(source="real", data_dir=str(tmp_path)).setup()

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    write_released(tmp_path / "evil", meta_obj={"red_gain": Evil()})
    with pytest.raises(pickle.UnpicklingError, match="numpy arrays only"):
        load_metadata(tmp_path / "evil" / "Test" / "scene_a" / "0000" / "metadata.npy")
    write_released(tmp_path / "bad", scale=2)  # ground truth x2: neither BracketIRE nor BracketIRE+
    dm = BracketDataModule(source="real", data_dir=str(tmp_path / "bad"), patch_size=4)
    dm.setup()
    with pytest.raises(DataFormatError, match="is not x1"):
        dm.datasets["test"][0]
