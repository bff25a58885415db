"""Poisoned datamodule: each trigger keeps range/shape and changes only what it should; poisoning bookkeeping;
bad configuration; real-format loaders (CIFAR-10 pickles, GTSRB torchvision layout, Imagenette ImageFolder)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.fft import dct

import datamodules.poisoned as P
from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules.poisoned_sources import load_cifar10, load_gtsrb, load_imagenette


def img(c: int = 1, h: int = 28, w: int = 28, seed: int = 0) -> torch.Tensor:
    # Values in [0.1, 0.9] so that setting a pixel to 1 is always a change.
    return 0.1 + 0.8 * torch.rand(c, h, w, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def changed(a: torch.Tensor, b: torch.Tensor) -> set[tuple[int, int]]:
    diff = (a != b).any(0)
    return {tuple(int(v) for v in p) for p in torch.nonzero(diff)}


@pytest.mark.parametrize("c,h,w", [(1, 28, 28), (3, 32, 32), (1, 8, 8)])
def test_patch_and_single_pixel_change_only_their_pixels(c, h, w):
    x = img(c, h, w)
    before = x.clone()
    y = P.patch(x)
    assert torch.equal(x, before), "triggers must not modify their input"
    assert y.shape == x.shape
    assert changed(x, y) == {(h - 2, w - 2), (h - 4, w - 2), (h - 2, w - 4), (h - 3, w - 3)}
    assert all(float(y[:, i, j].min()) == 1.0 for i, j in changed(x, y))
    s = P.single_pix(x)
    assert changed(x, s) == {(h - 2, w - 2)} and float(s[:, h - 2, w - 2].min()) == 1.0


def test_triggers_scale_with_image_size():
    x = img(3, 64, 64)
    y = P.patch(x)
    assert P.trigger_scale(64, 64) == 2
    assert len(changed(x, y)) == 4 * 4  # four 2x2 squares
    assert changed(x, P.single_pix(x)) == {(60, 60), (60, 61), (61, 60), (61, 61)}
    assert P.trigger_scale(224, 224) == 7


def test_reversed_patch_is_the_mirrored_patch():
    x = img(1, 16, 16)
    assert changed(x, P.reversed_patch(x)) == {(1, 1), (3, 1), (1, 3), (2, 2)}


def test_blends_match_formula_and_range():
    x = img(1, 28, 28)
    for pattern in (
        P.random_pattern(1, 28, 28, seed=3),
        P.checkerboard_pattern(1, 28, 28),
        P.sinusoid_pattern(1, 28, 28),
    ):
        assert pattern.shape == (1, 28, 28) and float(pattern.min()) >= 0.0 and float(pattern.max()) <= 2.0
        y = P.blend(x, pattern, 0.075)
        torch.testing.assert_close(y, (0.925 * x + 0.075 * pattern.double()).clamp(0, 1), rtol=0, atol=1e-12)
        assert float(y.min()) >= 0.0 and float(y.max()) <= 1.0
    board = P.checkerboard_pattern(1, 4, 4)[0]
    assert board.tolist() == [[1, 0, 1, 0], [0, 0, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]
    sin = P.sinusoid_pattern(1, 5, 24)[0]
    assert torch.equal(sin[0], sin[4]), "the sinusoid is constant down each column"
    np.testing.assert_allclose(sin[0].numpy(), (1 - np.cos(2 * np.pi * np.arange(24) * 6 / 24)), atol=1e-6)
    assert float(sin.max()) == pytest.approx(2.0), "official range [0, 2], not halved"
    # Clamped: a saturated image stays in range.
    assert float(P.blend(torch.ones(1, 4, 4), torch.ones(1, 4, 4), 0.5).max()) == 1.0


def test_dct_matrix_is_scipy_ortho_dct():
    v = torch.randn(32, dtype=torch.float64)
    np.testing.assert_allclose((P.dct_matrix(32) @ v).numpy(), dct(v.numpy(), norm="ortho"), atol=1e-12)


@pytest.mark.parametrize("h,w", [(28, 28), (8, 8), (40, 33)])
def test_frequency_trigger_matches_blockwise_scipy_twin(h, w):
    x = img(1, h, w)
    fast = P.frequency_trigger(x, magnitude=0.2)
    naive = P.frequency_trigger_naive(x, magnitude=0.2)
    torch.testing.assert_close(fast, naive, rtol=0, atol=1e-12)
    assert fast.shape == x.shape and float((fast - x).abs().max()) > 1e-3
    if w % min(32, h, w):  # pixels outside the full blocks are untouched
        assert torch.equal(fast[..., :, -1], x[..., :, -1])


def test_frequency_alpha_is_the_dct_magnitude():
    x = img(1, 28, 28).double() * 0.5 + 0.25  # away from the clamp
    default = P.Trigger("frequency", 1, 28, 28, seed=0)
    strong = P.Trigger("frequency", 1, 28, 28, seed=0, alpha=3 * P.FREQUENCY_MAGNITUDE)
    torch.testing.assert_close(default(x), P.frequency_trigger(x), rtol=0, atol=0)
    # The trigger is linear in the magnitude: three times the offset, three times the pixel change.
    torch.testing.assert_close(strong(x) - x, 3 * (default(x) - x), rtol=0, atol=1e-12)


def test_frequency_trigger_rgb_keeps_luma_and_range():
    x = img(3, 32, 32)
    y = P.frequency_trigger(x)
    assert float(y.min()) >= 0.0 and float(y.max()) <= 1.0
    torch.testing.assert_close(P.rgb_to_ycrcb(y)[0], P.rgb_to_ycrcb(x)[0], rtol=0, atol=1e-9)
    assert float((P.rgb_to_ycrcb(y)[1:] - P.rgb_to_ycrcb(x)[1:]).abs().max()) > 1e-3
    torch.testing.assert_close(P.ycrcb_to_rgb(P.rgb_to_ycrcb(x)), x, rtol=0, atol=1e-9)


def test_too_small_images_are_config_errors():
    with pytest.raises(ConfigError, match="'patch' needs images of at least 4x4, got 3x3"):
        P.patch(torch.zeros(1, 3, 3))
    with pytest.raises(ConfigError, match="'frequency' needs images of at least 8x8"):
        P.PoisonedDataModule(source="real", dataset="imagenette", image_size=6, attacks=["frequency"])


def digits_dm(**kw) -> P.PoisonedDataModule:
    args = dict(
        dataset="digits",
        attacks=["patch", "single_pix", "blend_r", "blend_p", "sinusoid"],
        poison_ratios={"patch": 0.05, "single_pix": 0.05, "blend_r": 0.05, "blend_p": 0.05, "sinusoid": 0.3},
        num_probes=40,
        num_backdoor_probes=10,
        batch_size=32,
        seed=3,
    )
    args.update(kw)
    dm = P.PoisonedDataModule(**args)
    dm.setup()
    return dm


def test_poisoning_bookkeeping():
    dm = digits_dm()
    n = dm.num_original
    clean_x, clean_y = P.load_source("digits", "train", None)
    assert n == int(round(0.9 * len(clean_y))) and len(dm.train_full) == n + 50
    assert len(set(dm.targets.values())) == 5, "targets are distinct while classes last"
    imgs, labels = dm.train_full.images, dm.train_full.labels
    for k, a in enumerate(dm.attack_names):
        rows = torch.nonzero(dm.poison_attack == k).squeeze(1)
        t = dm.targets[a]
        assert bool((labels[rows] == t).all()), f"{a}: poisons carry the target label"
        if a == "sinusoid":  # clean label: 30% of the target class
            n_target = int((labels[:n][dm.poison_attack[:n] != k] == t).sum()) + len(rows)
            assert len(rows) == int(round(0.3 * n_target))
        else:
            assert len(rows) == int(round(0.05 * n))
    # No image is poisoned twice (one attack id per row) and probes are disjoint from poisons.
    src = dm.probe_source[dm.probe_kind > 0]
    assert bool((dm.poison_attack[src] == -1).all()) and len(set(src.tolist())) == 50
    probes = dm.probe_kind == 1
    assert torch.equal(imgs[probes], imgs[dm.probe_source[probes]])
    bd = dm.probe_kind == 2
    assert bool((labels[bd] == dm.backdoor_probe_label).all())
    assert torch.equal(imgs[bd], P.reversed_patch(imgs[dm.probe_source[bd]]))
    # Poisoned rows are the trigger applied to some clean image; clean rows are untouched images.
    row = int(torch.nonzero(dm.poison_attack == 0)[0])
    assert changed(imgs[row], P.patch(imgs[row])) == set(), "a patched image is a fixed point of the patch"
    assert float(imgs.min()) >= 0.0 and float(imgs.max()) <= 1.0
    # Triggered test sets: non-target images, label = target.
    assert dm.test_names == ["clean", *dm.attack_names]
    for a, ds in zip(dm.attack_names, dm.datasets["tests"][1:]):
        assert bool((ds.labels == dm.targets[a]).all())
        assert len(ds) == int((dm.datasets["tests"][0].labels != dm.targets[a]).sum())


def test_narcissus_is_additive_clean_label_from_a_noise_file(tmp_path):
    noise = 0.06 * torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(0))  # official [1, C, H, W]
    np.save(tmp_path / "noise.npy", noise.numpy())
    x = img(1, 8, 8)
    torch.testing.assert_close(P.additive(x, noise[0]), (x + noise[0].double()).clamp(0, 1), rtol=0, atol=1e-7)
    assert float(P.additive(torch.ones(1, 8, 8), torch.ones(1, 8, 8)).max()) == 1.0
    dm = digits_dm(
        attacks=["patch", "narcissus"],
        poison_ratios={"patch": 0.05, "narcissus": 0.2},
        narcissus_noise=str(tmp_path / "noise.npy"),
        num_backdoor_probes=0,
    )
    k = dm.attack_names.index("narcissus")
    rows = torch.nonzero(dm.poison_attack == k).squeeze(1)
    t = dm.targets["narcissus"]
    assert len(rows) > 0 and bool((dm.train_full.labels[rows] == t).all()), "clean label: poisons keep their label"
    n_target = int((dm.train_full.labels[: dm.num_original] == t).sum())
    assert len(rows) == int(round(0.2 * n_target))
    ds = dm.datasets["tests"][1 + k]
    assert bool((ds.labels == t).all()) and float(ds.images.min()) >= 0.0 and float(ds.images.max()) <= 1.0
    with pytest.raises(ConfigError, match="set data.narcissus_noise"):
        digits_dm(attacks=["narcissus"], poison_ratios=None)
    with pytest.raises(MissingDataError, match="no such file"):
        digits_dm(attacks=["narcissus"], poison_ratios=None, narcissus_noise=str(tmp_path / "missing.npy"))
    np.save(tmp_path / "wrong.npy", np.zeros((3, 8, 8), dtype=np.float32))
    with pytest.raises(DataFormatError, match=r"shape \[3, 8, 8\] != image shape \[1, 8, 8\]"):
        digits_dm(attacks=["narcissus"], poison_ratios=None, narcissus_noise=str(tmp_path / "wrong.npy"))


def test_train_keep_and_dynamics_loader_keep_full_indices():
    dm = digits_dm(num_backdoor_probes=0)
    keep = torch.arange(0, len(dm.train_full), 3)
    dm.set_train_keep(keep)
    seen = torch.cat([b[2] for b in dm.train_dataloader()])
    assert sorted(seen.tolist()) == keep.tolist()
    seen = torch.cat([b[2] for b in dm.dynamics_dataloader()])
    assert seen.tolist() == list(range(len(dm.train_full)))


def test_probe_copies_replace_their_originals():
    """In one epoch of the training loader every clean-probe image is seen exactly once (through its copy; its
    original's row is not visited), every other row once."""
    dm = digits_dm(num_backdoor_probes=5)
    probes = torch.nonzero(dm.probe_kind == 1).squeeze(1)
    src = dm.probe_source[probes]
    seen = torch.cat([b[2] for b in dm.train_dataloader()])
    counts = torch.bincount(seen, minlength=len(dm.train_full))
    assert counts[probes].tolist() == [1] * len(probes) and counts[src].tolist() == [0] * len(src)
    others = torch.ones(len(dm.train_full), dtype=torch.bool)
    others[src] = False
    assert bool((counts[others] == 1).all())
    # by content: each probe image occurs once among the images of the epoch
    imgs = dm.train_full.images[seen].flatten(1)
    for row in probes[:5]:
        target = dm.train_full.images[row].flatten()
        assert int((imgs == target).all(1).sum()) == 1
    # the dynamics loader still scores every row (the originals' trajectories are computed, not trained on)
    assert torch.cat([b[2] for b in dm.dynamics_dataloader()]).tolist() == list(range(len(dm.train_full)))
    dm.set_train_keep(None)
    assert torch.equal(torch.sort(torch.cat([b[2] for b in dm.train_dataloader()])).values, torch.nonzero(others)[:, 0])


def test_seeded_and_reproducible():
    a, b = digits_dm(), digits_dm()
    assert torch.equal(a.poison_attack, b.poison_attack) and a.targets == b.targets
    c = digits_dm(seed=4)
    assert not torch.equal(a.poison_attack, c.poison_attack)


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"poison_ratios": {"patch": 0.6, "single_pix": 0.5}}, r"sum to 1.1, which is over 1"),
        ({"targets": {"patch": 10}}, r"data.targets.patch=10: dataset 'digits' has classes 0..9"),
        ({"attacks": ["patch", "trojan"]}, r"unknown attack 'trojan'"),
        ({"attacks": ["patch", "patch"]}, r"lists an attack twice"),
        ({"poison_ratios": {"blend_r": 0.1}}, r"'blend_r', which is not in data.attacks"),
        ({"dataset": "cifar10"}, r"data.dataset='cifar10' must be one of"),
        ({"num_probes": -1}, r"data.num_probes=-1 must be >= 0"),
    ],
)
def test_bad_config(kw, msg):
    args = {"dataset": "digits", "attacks": ["patch", "single_pix"], **kw}
    with pytest.raises(ConfigError, match=msg):
        P.PoisonedDataModule(**args)


def test_too_many_probes_is_reported_at_setup():
    with pytest.raises(ConfigError, match="exceeds the"):
        digits_dm(num_probes=5000)


# -- real-format fixtures ---------------------------------------------------------------------------------------
def write_cifar(root: Path, n: int = 6) -> dict[str, np.ndarray]:
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    out = {}
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, n).tolist()
        with open(d / name, "wb") as fh:
            pickle.dump({"batch_label": name, "data": data, "labels": labels}, fh)
        out[name] = data
    return out


def test_cifar10_pickles(tmp_path):
    written = write_cifar(tmp_path)
    x, y = load_cifar10("train", str(tmp_path))
    assert x.shape == (30, 3, 32, 32) and y.shape == (30,)
    np.testing.assert_array_equal(x[:6].reshape(6, -1).numpy(), written["data_batch_1"])
    dm = P.PoisonedDataModule(
        source="real",
        dataset="cifar10",
        data_dir=str(tmp_path),
        attacks=["patch", "frequency"],
        poison_ratios={"patch": 0.1, "frequency": 0.1},
        num_probes=2,
        batch_size=4,
    )
    dm.setup()
    assert dm.image_shape == (3, 32, 32) and len(dm.datasets["tests"]) == 3
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DataFormatError, match="test_batch: not a CIFAR-10 python batch"):
        load_cifar10("test", str(tmp_path))
    with pytest.raises(MissingDataError, match="data_batch_1"):
        load_cifar10("train", str(tmp_path / "nowhere"))


def test_gtsrb_torchvision_layout(tmp_path):
    base = tmp_path / "gtsrb"
    for cls in (0, 42):
        d = base / "GTSRB" / "Training" / f"{cls:05d}"
        d.mkdir(parents=True)
        for i in range(2):
            Image.fromarray(np.full((40, 37, 3), 10 * i + cls, np.uint8)).save(d / f"{i:05d}_00000.ppm")
    test = base / "GTSRB" / "Final_Test" / "Images"
    test.mkdir(parents=True)
    rows = ["Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId"]
    for i, cls in enumerate((3, 41, 7)):
        Image.fromarray(np.full((30, 31, 3), i, np.uint8)).save(test / f"{i:05d}.ppm")
        rows.append(f"{i:05d}.ppm;31;30;5;5;25;25;{cls}")
    (base / "GT-final_test.csv").write_text("\n".join(rows) + "\n")
    x, y = load_gtsrb("train", str(tmp_path))
    assert x.shape == (4, 3, 32, 32) and sorted(y.tolist()) == [0, 0, 42, 42]
    x, y = load_gtsrb("test", str(tmp_path))
    assert y.tolist() == [3, 41, 7] and int(x[1].max()) == 1
    with pytest.raises(MissingDataError, match="GTSRB train not found"):
        load_gtsrb("train", str(tmp_path / "nowhere"))


def test_imagenette_image_folder(tmp_path):
    for split in ("train", "val"):
        for cls in ("n01440764", "n02102040"):
            d = tmp_path / split / cls
            d.mkdir(parents=True)
            Image.fromarray(np.full((50, 60, 3), 200, np.uint8)).save(d / "a.JPEG")
    x, y = load_imagenette("val", str(tmp_path), image_size=16)
    assert x.shape == (2, 3, 16, 16) and y.tolist() == [0, 1] and int(x.min()) == 200
    with pytest.raises(MissingDataError, match="imagenette2.tgz"):
        load_imagenette("train", str(tmp_path / "nowhere"))
