"""The shared CIFAR-10-C corruptions (datamodules/corruptions.py): range, shape, severity, seeds, grey images, SuMi's
table, the datamodule option and the real CIFAR-10-C ``.npy`` layout."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules import corruptions as C
from datamodules.av_corruptions import corrupt_video
from datamodules.fashion_mnist import FashionMNISTDataModule
from datamodules.imagefolder import ImageFolderDataModule
from datamodules.poisoned import PoisonedDataModule
from tests.conftest import compose_train

pytestmark = pytest.mark.usefixtures("one_thread")

RANDOM = ("gaussian_noise", "shot_noise", "impulse_noise", "glass_blur", "motion_blur", "snow", "frost", "fog")
RANDOM += ("elastic_transform",)
# Mean absolute change grows with severity for these. The rest, and why (the reference tables behave the same):
# glass_blur: more blur before the swaps smooths them (1 pass at severities 1-3, 2 passes at 4-5: checked below);
# frost: the scene's weight falls as the texture's grows and the two partly cancel (structure loss checked below);
# elastic_transform: the affine jitter (the bigger change) shrinks as the local field grows, so the change falls;
# pixelate: int(32 f) = 30, 28, 27, 24, 20 px resample grids alias unevenly (resolution checked below);
# snow: severities 2 and 3 tie on average (3 zooms its flakes 1.75x, fewer but larger; checked 1 < 3 < 5 and 2 < 4).
MONOTONE = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "motion_blur",
    "zoom_blur",
    "fog",
    "brightness",
    "contrast",
    "jpeg_compression",
)


def scene(n: int, c: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    """Smooth colour fields with one sharp-edged rectangle each, values in [0.2, 0.8] (room both ways)."""
    g = torch.Generator().manual_seed(seed)
    x = 0.2 + 0.6 * F.interpolate(torch.rand(n, c, 4, 4, generator=g), size=(h, w), mode="bilinear")
    x[:, :, h // 4 : h // 2, w // 4 : 3 * w // 4] = 0.2 + 0.6 * torch.rand(n, c, 1, 1, generator=g)
    return x


RGB, GREY = scene(24, 3, 32, 32), scene(24, 1, 28, 28, seed=1)


def damage(name: str, x: torch.Tensor) -> list[float]:
    return [float((C.corrupt(x, name, s, seed=3) - x).abs().mean()) for s in C.SEVERITIES]


@pytest.mark.parametrize("name", C.CORRUPTIONS)
def test_each_corruption_changes_the_image_and_keeps_shape_dtype_range(name):
    for x in (RGB[:4], GREY[:4], scene(3, 1, 8, 8), RGB[:2].double()):
        before = x.clone()
        for s in (1, 5):
            y = C.corrupt(x, name, s, seed=0)
            assert y.shape == x.shape and y.dtype == x.dtype
            assert float(y.min()) >= 0.0 and float(y.max()) <= 1.0
            assert float((y - x).abs().amax()) > 0.01, f"{name} severity {s} left {list(x.shape)} unchanged"
        assert torch.equal(x, before), "corruptions must not modify their input"


@pytest.mark.parametrize("name", MONOTONE)
def test_damage_grows_with_severity(name):
    for x in (RGB, GREY):
        d = damage(name, x)
        if name == "motion_blur":  # severities 3 and 4 differ only in the streak length, (6, 2) vs (8, 2), and a
            d[3] += 1e-6  # Gaussian of sigma 2 is below 1e-4 past 6 px: the same blur (the reference's table too)
        assert all(a < b for a, b in zip(d, d[1:])), f"{name}: {d}"


def test_documented_exceptions_to_monotone_damage():
    for x in (RGB, GREY):
        g = damage("glass_blur", x)
        assert min(g[3:]) > max(g[:3]), g  # the second swap pass
        e = damage("elastic_transform", x)
        assert e[0] > e[-1] > 0, e
        s = damage("snow", x)
        assert s[0] < s[2] < s[4] and s[1] < s[3], s
        # frost: the corrupted image correlates less and less with the clean one
        flat = x.flatten(1) - x.flatten(1).mean(1, keepdim=True)
        corr = []
        for sev in C.SEVERITIES:
            y = C.corrupt(x, "frost", sev, seed=3).flatten(1)
            y = y - y.mean(1, keepdim=True)
            corr.append(float(((flat * y).sum(1) / (flat.norm(dim=1) * y.norm(dim=1))).mean()))
        assert all(a > b for a, b in zip(corr, corr[1:])), corr
    # pixelate: the image keeps int(f * side) distinct rows, fewer at each severity
    x = torch.rand(1, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    rows = [len(torch.unique(C.corrupt(x, "pixelate", s)[0, 0], dim=0)) for s in C.SEVERITIES]
    assert rows == [30, 28, 27, 24, 20]


def test_pixelate_is_pillows_box_resampling():
    from PIL import Image

    x = torch.randint(0, 256, (28, 28, 3), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    for s, f in zip(C.SEVERITIES, C.CIFAR10_C["pixelate"]):
        small = Image.fromarray(x.numpy()).resize((int(28 * f), int(28 * f)), Image.BOX)
        ref = torch.from_numpy(np.array(small.resize((28, 28), Image.BOX))).permute(2, 0, 1).float() / 255
        got = C.corrupt(x.permute(2, 0, 1)[None].float() / 255, "pixelate", s)[0]
        assert float((got - ref).abs().max()) <= 1 / 255 + 1e-6


def test_values_of_the_simple_ones():
    x = RGB[:2]
    g = torch.Generator().manual_seed(7)
    noise = torch.randn(x.shape, generator=g)
    torch.testing.assert_close(C.corrupt(x, "gaussian_noise", 4, seed=7), (x + 0.09 * noise).clamp(0, 1))
    mean = x.mean(dim=(2, 3), keepdim=True)
    torch.testing.assert_close(C.corrupt(x, "contrast", 5), (x - mean) * 0.15 + mean)
    # brightness: HSV value + 0.3 keeps hue and saturation (channel ratios) where the value does not saturate
    y = C.corrupt(x, "brightness", 5)
    v = x.amax(1)
    torch.testing.assert_close(y.amax(1), (v + 0.3).clamp(max=1))
    ok = (v + 0.3) <= 1
    torch.testing.assert_close((y[:, 0] / y[:, 1])[ok], (x[:, 0] / x[:, 1])[ok])
    torch.testing.assert_close(C.corrupt(GREY[:2], "brightness", 2), (GREY[:2] + 0.1).clamp(0, 1))
    k = C.disk_kernel(1.5, 0.1)
    assert abs(float(k.sum()) - 1) < 1e-12 and k.shape == (5, 5) and float(k[2, 2]) > float(k[0, 0])
    p = C.plasma_fractal(2, 32, 2.0, torch.Generator().manual_seed(0))
    assert p.shape == (2, 32, 32) and float(p.min()) == 0.0 and float(p.max()) == 1.0


@pytest.mark.parametrize("name", C.CORRUPTIONS)
def test_deterministic_given_the_seed(name):
    x = GREY[:3]
    a, b = C.corrupt(x, name, 3, seed=11), C.corrupt(x, name, 3, seed=11)
    assert torch.equal(a, b)
    other = C.corrupt(x, name, 3, seed=12)
    assert torch.equal(a, other) != (name in RANDOM), "random corruptions depend on the seed, the others do not"


def read_sumi_video_formulas(x: torch.Tensor, kind: str, s: int, gen: torch.Generator) -> torch.Tensor:
    """SuMi's video corruptions as they were written before the shared module (grey frames): the reference its
    pinned results came from."""
    if kind == "contrast":
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        return ((x - mean) * [0.4, 0.3, 0.2, 0.1, 0.05][s - 1] + mean).clamp(0, 1)
    if kind == "brightness":
        return (x + [0.1, 0.2, 0.3, 0.4, 0.5][s - 1]).clamp(0, 1)
    sigma = [0.6, 0.9, 1.2, 1.6, 2.2][s - 1]
    r = int(np.ceil(2 * sigma))
    k = torch.exp(-(torch.arange(-r, r + 1, dtype=x.dtype) ** 2) / (2 * sigma**2))
    k = k / k.sum()
    x = F.conv2d(F.pad(x, (r, r, 0, 0), mode="reflect"), k.view(1, 1, 1, -1))
    return F.conv2d(F.pad(x, (0, 0, r, r), mode="reflect"), k.view(1, 1, -1, 1)).clamp(0, 1)


def test_sumi_video_table_is_unchanged_on_grey_frames():
    x = GREY[:4]
    for kind in ("contrast", "brightness", "defocus_blur"):
        for s in C.SEVERITIES:
            gen = torch.Generator().manual_seed(0)
            assert torch.equal(corrupt_video(x, kind, s, gen), read_sumi_video_formulas(x, kind, s, gen)), (kind, s)
    gen = torch.Generator().manual_seed(5)
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    assert torch.equal(corrupt_video(x, "gaussian_noise", 5, gen), (x + noise * 0.38).clamp(0, 1))


# -- configuration ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"corruption": "fogg"}, r"data.corruption='fogg' must be null or one of \['gaussian_noise'"),
        ({"corruption": "fog", "severity": 6}, r"data.severity=6 must be one of \[1, 2, 3, 4, 5\]"),
        ({"corruption": "fog", "severity": 0}, r"data.severity=0 must be one of"),
        ({"corruption": "fog", "severity": 2.5}, r"data.severity=2.5 must be one of"),
        ({"corruption_dir": "/x"}, r"data.corruption_dir=/x needs data.corruption"),
    ],
)
def test_bad_config_is_one_line(kw, msg):
    for cls in (FashionMNISTDataModule, PoisonedDataModule, ImageFolderDataModule):
        with pytest.raises(ConfigError, match=msg) as err:
            cls(**kw)
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="data.corruption_dir=/c: data=imagefolder corrupts its own"):
        ImageFolderDataModule(corruption="fog", corruption_dir="/c")


# -- datamodules -----------------------------------------------------------------------------------------------------
def test_fashion_mnist_module_corrupts_only_the_test_split():
    clean = FashionMNISTDataModule(dataset="digits")
    noisy = FashionMNISTDataModule(dataset="digits", corruption="impulse_noise", severity=5)
    again = FashionMNISTDataModule(dataset="digits", corruption="impulse_noise", severity=5)
    other = FashionMNISTDataModule(dataset="digits", corruption="impulse_noise", severity=5, seed=1)
    for dm in (clean, noisy, again, other):
        dm.setup()
    assert torch.equal(clean.datasets["train"].images, noisy.datasets["train"].images)
    xc, xn = clean.datasets["test"].images.float() / 255, noisy.datasets["test"].images
    assert xn.shape == xc.shape and xn.dtype == torch.float32
    flipped = ((xn - xc).abs() > 1e-6) & ((xn == 0) | (xn == 1))
    assert 0.03 < float(flipped.float().mean()) < 0.07  # about 7% of values set to 0 or 1, less the ones already so
    assert torch.equal(xn, again.datasets["test"].images)
    assert not torch.equal(xn, other.datasets["test"].images)
    x, y = noisy.datasets["test"][0]
    assert x.shape == (1, 8, 8) and torch.equal(y, clean.datasets["test"][0][1])


def test_poisoned_module_corrupts_clean_and_triggered_test_sets():
    kw = dict(dataset="digits", attacks=["patch"], num_probes=0)
    clean, foggy = PoisonedDataModule(**kw), PoisonedDataModule(**kw, corruption="fog", severity=4)
    clean.setup()
    foggy.setup()
    assert torch.equal(clean.datasets["train"].images, foggy.datasets["train"].images)
    for a, b in zip(clean.datasets["tests"], foggy.datasets["tests"]):
        assert float((a.images - b.images).abs().mean()) > 0.05
    # the trigger is stamped on the corrupted image: its pixels are 1 in the fogged triggered set too
    assert float(foggy.datasets["tests"][1].images[:, :, 6, 6].min()) == 1.0


def test_poisoned_module_streams_the_test_set_by_class():
    kw = dict(dataset="digits", attacks=[], num_probes=0, corruption="gaussian_noise", seed=3)
    iid, shifted = PoisonedDataModule(**kw), PoisonedDataModule(**kw, test_order="by_class")
    iid.setup()
    shifted.setup()
    a, b = iid.datasets["test"], shifted.datasets["test"]
    assert torch.equal(b.labels, torch.sort(a.labels).values)  # sorted by class: a label shift over the stream
    assert not torch.equal(a.labels, b.labels)
    # the same corrupted images (same seed, same noise), only reordered; within a class in the i.i.d. order
    idx = torch.sort(a.labels, stable=True).indices
    assert torch.equal(b.images, a.images[idx])
    assert torch.equal(iid.datasets["train"].images, shifted.datasets["train"].images)
    with pytest.raises(ConfigError, match=r"data.test_order='shuffled' must be null or one of \['by_class'\]"):
        PoisonedDataModule(test_order="shuffled")


def test_experiment_with_corruption_yields_corrupted_test_batches(tmp_path):
    base = ["experiment=mda", "data.dataset=digits", "data.batch_size=16", "data.num_probes=0"]
    batches = []
    for extra in ([], ["data.corruption=gaussian_noise", "data.severity=5"]):
        cfg = compose_train(base + extra, tmp_path)
        dm = instantiate(cfg.data)
        dm.setup("test")
        loader = dm.test_dataloader()
        batches.append(next(iter(loader[0] if isinstance(loader, list) else loader)))
    (xc, yc, ic), (xn, yn, i_n) = batches
    assert torch.equal(yc, yn) and torch.equal(ic, i_n) and xn.shape == xc.shape
    diff = xn - xc
    assert 0.05 < float(diff.abs().mean()) < 0.12  # N(0, 0.1^2) noise, clamped at 0 and 1
    assert float(xn.min()) >= 0 and float(xn.max()) <= 1


# -- the real CIFAR-10-C layout ----------------------------------------------------------------------------------------
def write_cifar_c(root: Path, n: int = 4, shape: tuple[int, ...] = (32, 32, 3)) -> np.ndarray:
    """A fake CIFAR-10-C folder: gaussian_noise.npy ``[5 n, *shape]`` whose severity-s rows are filled with 10 s +
    the image index, and labels.npy (uint8, 5 n, as the real file)."""
    root.mkdir(parents=True, exist_ok=True)
    rows = np.array([10 * s + i for s in C.SEVERITIES for i in range(n)], dtype=np.uint8)
    images = np.broadcast_to(rows.reshape(-1, *[1] * len(shape)), (5 * n, *shape)).copy()
    images[:, 0, 0] = 200  # a marker pixel at the top-left of the first channel... and the others
    np.save(root / "gaussian_noise.npy", images)
    np.save(root / "labels.npy", np.tile(np.arange(n) % 10, 5).astype(np.uint8))
    return images


def write_cifar_batches(root: Path, n: int = 10) -> None:
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in (*(f"data_batch_{i}" for i in range(1, 6)),):
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": rng.integers(0, 10, n).tolist()}
        with open(d / name, "wb") as fh:
            pickle.dump(batch, fh)


def test_reads_severity_rows_of_the_cifar10_c_layout(tmp_path):
    write_cifar_c(tmp_path / "c")
    for s in C.SEVERITIES:
        x, y = C.load_cifar_c(tmp_path / "c", "gaussian_noise", s, (3, 32, 32))
        assert x.shape == (4, 3, 32, 32) and x.dtype == torch.uint8
        assert x[:, :, 5, 5].tolist() == [[10 * s + i] * 3 for i in range(4)]
        assert x[:, :, 0, 0].tolist() == [[200] * 3] * 4  # HWC -> CHW, not a reshape
        assert y.tolist() == [0, 1, 2, 3] and y.dtype == torch.int64
    # through the CIFAR-10 datamodule: the files replace its test set (the clean test batch is never read)
    write_cifar_batches(tmp_path)
    dm = PoisonedDataModule(
        source="real",
        dataset="cifar10",
        data_dir=str(tmp_path),
        attacks=["patch"],
        num_probes=0,
        corruption="gaussian_noise",
        severity=3,
        corruption_dir=str(tmp_path / "c"),
    )
    dm.setup()
    test = dm.datasets["test"]
    assert test.images.shape == (4, 3, 32, 32)
    assert torch.allclose(test.images[:, 0, 5, 5] * 255, torch.tensor([30.0, 31, 32, 33]))
    # a grey datamodule reads grey files ([5n, H, W]) of its own shape
    write_cifar_c(tmp_path / "g", shape=(8, 8))
    fm = FashionMNISTDataModule(
        dataset="digits", corruption="gaussian_noise", severity=2, corruption_dir=str(tmp_path / "g")
    )
    fm.setup()
    assert fm.datasets["test"].images[:, 0, 5, 5].tolist() == [20, 21, 22, 23]


def test_cifar10_c_errors_name_the_file(tmp_path):
    root = tmp_path / "c"
    write_cifar_c(root)
    with pytest.raises(MissingDataError, match=r"missing CIFAR-10-C file\(s\): .*c/fog.npy\. CIFAR-10-C: https"):
        C.load_cifar_c(root, "fog", 1)
    with pytest.raises(DataFormatError, match=r"gaussian_noise.npy: images are \[3, 32, 32\].*datamodule's are"):
        C.load_cifar_c(root, "gaussian_noise", 1, (1, 28, 28))
    dm = FashionMNISTDataModule(dataset="digits", corruption="gaussian_noise", corruption_dir=str(root))
    with pytest.raises(
        DataFormatError, match=r"images are \[3, 32, 32\] \(C, H, W\), the datamodule's are \[1, 8, 8\]"
    ):
        dm.setup()
    np.save(root / "gaussian_noise.npy", np.zeros((19, 32, 32, 3), np.uint8))
    with pytest.raises(DataFormatError, match=r"uint8 \[19, 32, 32, 3\], expected uint8 \[5n, H, W, C\]"):
        C.load_cifar_c(root, "gaussian_noise", 1)
    np.save(root / "gaussian_noise.npy", np.zeros((20, 32, 32, 3), np.float32))
    with pytest.raises(DataFormatError, match=r"float32 \[20, 32, 32, 3\], expected uint8"):
        C.load_cifar_c(root, "gaussian_noise", 1)
    np.save(root / "gaussian_noise.npy", np.zeros((20, 32, 32, 3), np.uint8))
    np.save(root / "labels.npy", np.zeros(7, np.uint8))
    with pytest.raises(DataFormatError, match=r"labels.npy: uint8 \[7\], expected 20 \(or 4\) integers"):
        C.load_cifar_c(root, "gaussian_noise", 1)
    (root / "labels.npy").write_bytes(b"not numpy")
    with pytest.raises(DataFormatError, match=r"labels.npy: not a .npy array") as err:
        C.load_cifar_c(root, "gaussian_noise", 1)
    assert "\n" not in str(err.value)
