"""ADDP data: the rendered scenes (exact depth, masks, expressions) and the real-format loaders on fixtures written in
their exact formats (NYUv2 labelled .mat = HDF5, KITTI 16-bit depth PNG + split list, RefCOCO refs pickle +
instances JSON + images)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules.perception import COLORS, SHAPES, PerceptionDataModule, coco_mask, embed_expression, render_scenes


def write_nyuv2(root: Path, n: int = 6, w: int = 40, h: int = 30) -> np.ndarray:
    """The labelled NYUv2 .mat (v7.3 = HDF5, MATLAB column-major: images [N, 3, W, H], depths [N, W, H])."""
    rng = np.random.default_rng(0)
    depth_hw = rng.uniform(0.5, 9.0, (n, h, w)).astype(np.float32)
    depth_hw[:, 0, :] = 0.0  # a row without ground truth
    depth_hw[:, 1, :3] = np.nan
    with h5py.File(root / "nyu_depth_v2_labeled.mat", "w") as f:
        f["images"] = rng.integers(0, 256, (n, 3, w, h), dtype=np.uint8)
        f["depths"] = depth_hw.transpose(0, 2, 1)
    return depth_hw


def write_kitti(root: Path, n: int = 4, w: int = 24, h: int = 12) -> None:
    """BTS/Marigold split lists and KITTI 16-bit depth PNGs (metres * 256, 0 = no LiDAR point)."""
    rng = np.random.default_rng(1)
    for split in ("train", "test"):
        lines = []
        for i in range(n):
            rgb, dep = f"raw/{split}_{i}.png", f"gt/{split}_{i}.png"
            (root / "raw").mkdir(exist_ok=True)
            (root / "gt").mkdir(exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / rgb)
            d = (rng.uniform(1, 80, (h, w)) * 256).astype(np.uint16)
            d[: h // 2] = 0  # sparse LiDAR: the top is empty
            Image.fromarray(d).save(root / dep)
            lines.append(f"{rgb} {dep} 721.5377")
        (root / f"kitti_{split}.txt").write_text("\n".join(lines) + "\n")


def write_refcoco(root: Path) -> None:
    """refs(unc).p, instances.json (a polygon and an uncompressed RLE) and two COCO images."""
    (root / "refcoco").mkdir()
    (root / "images" / "train2014").mkdir(parents=True)
    images, anns, refs = [], [], []
    for i, split in enumerate(("train", "val", "testA", "train")):
        name = f"COCO_train2014_{i:012d}.jpg"
        Image.fromarray(np.full((20, 30, 3), 40 * i, np.uint8)).save(root / "images" / "train2014" / name)
        images.append({"id": i, "file_name": name, "height": 20, "width": 30})
        if i % 2 == 0:
            seg = [[5.0, 5.0, 15.0, 5.0, 15.0, 15.0, 5.0, 15.0]]  # a 10x10 square polygon
        else:
            seg = {"counts": [20 * 10, 20 * 5, 20 * 15], "size": [20, 30]}  # columns 10..14 set (column-major)
        anns.append({"id": 100 + i, "image_id": i, "segmentation": seg, "bbox": [0, 0, 1, 1], "category_id": 1})
        refs.append(
            {
                "ref_id": i,
                "ann_id": 100 + i,
                "image_id": i,
                "split": split,
                "category_id": 1,
                "sentences": [{"sent": "man on the left"}, {"sent": "left man in red"}],
            }
        )
    (root / "refcoco" / "instances.json").write_text(json.dumps({"images": images, "annotations": anns}))
    with open(root / "refcoco" / "refs(unc).p", "wb") as f:
        pickle.dump(refs, f)


def test_scenes_exact_depth_masks_and_determinism():
    a, b = render_scenes(16, 16, seed=3), render_scenes(16, 16, seed=3)
    assert np.array_equal(a["image"], b["image"]) and not np.array_equal(a["image"], render_scenes(16, 16, 4)["image"])
    assert a["depth"].min() >= 2.0 and a["depth"].max() <= 8.0
    m = a["masks"]
    assert m.sum(1).max() <= 1  # visible masks are disjoint
    for i in range(16):
        for j in range(3):
            if m[i, j].any():  # every visible pixel of an object carries that object's single depth
                assert np.ptp(a["depth"][i, 0][m[i, j]]) < 1e-6
    # pixels no object covers are the ground plane, whose depth falls with the row
    ground = ~m.any(1)
    rows = np.broadcast_to(np.arange(16)[:, None], (16, 16))
    i = int(np.argmax(ground.sum((1, 2))))
    top, bottom = a["depth"][i, 0][ground[i] & (rows < 4)], a["depth"][i, 0][ground[i] & (rows > 12)]
    assert top.min() > bottom.max()


def test_expression_embedding_unit_norm_and_no_collisions():
    words = list(COLORS) + list(SHAPES)
    idx = {w: int(embed_expression(w, 64).abs().argmax()) for w in words}
    assert len(set(idx.values())) == len(words)
    v = embed_expression("the red disc", 64)
    assert float(v.norm()) == pytest.approx(1.0) and int((v != 0).sum()) == 2
    assert float(embed_expression("the object", 64).norm()) == 0.0


def test_embedded_refseg_items_and_partial_expressions():
    dm = PerceptionDataModule(task="refseg", image_size=16, n_train=64, n_val=8, n_test=8, partial_prob=1.0)
    dm.setup()
    item = dm.datasets["train"][0]
    assert item["image"].shape == (3, 16, 16) and item["obj_masks"].shape == (3, 1, 16, 16)
    assert torch.equal(item["target"], item["obj_masks"][0].float())
    cond, refined = dm.datasets["train"].items["cond"], dm.datasets["train"].items["refined"]
    assert (cond != refined).any(1).all()  # partial_prob=1: every first expression is partial
    dm0 = PerceptionDataModule(task="depth", image_size=16, n_train=8, n_val=8, n_test=8)
    dm0.setup()
    assert float(dm0.datasets["train"].items["cond"].abs().sum()) == 0.0


def test_nyuv2_mat_reader_transposes_and_masks_invalid(tmp_path: Path):
    depth = write_nyuv2(tmp_path)
    dm = PerceptionDataModule(task="depth", dataset="nyuv2", source="real", data_dir=str(tmp_path), image_size=30)
    dm.setup()
    ds = dm.datasets["test"]
    assert ds.items["image"].shape[1:] == (3, 30, 30) and ds.items["target"].shape[1:] == (1, 30, 30)
    assert sum(len(dm.datasets[s]) for s in ("train", "val", "test")) == 6
    assert not ds.items["valid"][:, 0, 0].any()  # the zero row (nearest resize keeps it at row 0)
    assert torch.isfinite(ds.items["target"]).all()
    # an unresized file round-trips exactly: [N, W, H] on disk -> [N, 1, H, W]
    dm2 = PerceptionDataModule(task="depth", dataset="nyuv2", source="real", data_dir=str(tmp_path), image_size=4)
    with h5py.File(tmp_path / "nyu_depth_v2_labeled.mat", "r") as f:
        assert f["depths"].shape == (6, 40, 30)
    dm2.setup()
    assert dm2.datasets["train"].items["target"].shape[-2:] == (4, 4)
    assert float(np.nanmax(depth)) >= float(dm2.datasets["train"].items["target"].max())


def test_kitti_16bit_png_and_split_list(tmp_path: Path):
    write_kitti(tmp_path)
    dm = PerceptionDataModule(task="depth", dataset="kitti", source="real", data_dir=str(tmp_path), image_size=12)
    dm.setup()
    ds = dm.datasets["test"]
    assert len(ds) == 4 and len(dm.datasets["train"]) + len(dm.datasets["val"]) == 4
    t, v = ds.items["target"], ds.items["valid"]
    assert not v[:, :, :6].any() and v[:, :, 6:].all()  # 0 in the PNG = no ground truth
    assert float(t[v].min()) >= 1.0 and float(t[v].max()) <= 80.0  # value / 256 = metres
    (tmp_path / "kitti_test.txt").write_text("only_one_column\n")
    dm = PerceptionDataModule(task="depth", dataset="kitti", source="real", data_dir=str(tmp_path))
    with pytest.raises(DataFormatError, match="kitti_test.txt line 1"):
        dm.setup()


def test_refcoco_refs_instances_images(tmp_path: Path):
    write_refcoco(tmp_path)
    dm = PerceptionDataModule(task="refseg", dataset="refcoco", source="real", data_dir=str(tmp_path), image_size=10)
    dm.setup()
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [2, 1, 1]
    assert torch.allclose(dm.datasets["train"].items["cond"][0], embed_expression("man on the left", 64))
    assert torch.allclose(dm.datasets["train"].items["refined"][0], embed_expression("left man in red", 64))
    items = dm.datasets["train"].items  # the text for a pretrained encoder (model.text_encoder=bert)
    assert items["text"][0] == "man on the left"
    assert items["refined_text"][0] == items["obj_texts"][0] == "left man in red"
    square = coco_mask([[5.0, 5.0, 15.0, 5.0, 15.0, 15.0, 5.0, 15.0]], 20, 30)
    assert 100 <= square.sum() <= 121
    rle = coco_mask({"counts": [200, 100, 300], "size": [20, 30]}, 20, 30)
    assert rle.sum() == 100 and rle[:, 10:15].all() and not rle[:, :10].any()
    with pytest.raises(DataFormatError, match="compressed RLE"):
        coco_mask({"counts": "abc", "size": [20, 30]}, 20, 30)


def test_missing_and_corrupt_files_are_one_line(tmp_path: Path):
    dm = PerceptionDataModule(task="refseg", dataset="refcoco", source="real", data_dir=str(tmp_path))
    with pytest.raises(MissingDataError, match="instances.json"):
        dm.setup()
    write_refcoco(tmp_path)
    (tmp_path / "refcoco" / "refs(unc).p").write_bytes(b"\x80\xff" + bytes(range(200)))
    with pytest.raises(DataFormatError) as err:
        PerceptionDataModule(task="refseg", dataset="refcoco", source="real", data_dir=str(tmp_path)).setup()
    assert "refs(unc).p" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "kwargs",
    [{"task": "pose"}, {"dataset": "kitti", "task": "refseg"}, {"image_size": 15}, {"source": "real"}],
)
def test_bad_config_is_a_config_error(kwargs):
    with pytest.raises(ConfigError):
        PerceptionDataModule(**kwargs)
