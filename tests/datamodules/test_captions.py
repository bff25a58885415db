"""Captions data of TULIP: the rendered scene families (a shared prefix, siblings differing in the last few tokens
of L and mostly after it), the BPE tokenisation and its truncation warning, and the three real formats read from
fixtures written here."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules.captions import (
    EOT,
    PREFIX_VISIBLE,
    SOT,
    CaptionsDataModule,
    _tokenizer,
    first_sentence,
    load_image,
    render_scene,
    scene_families,
    tokenize,
    truncate_tokens,
)

CAPTIONS = [
    "A red bus waits at a stop. Behind it, three people with umbrellas walk past a bakery whose sign is green.",
    "Two dogs run on a beach. The larger one carries a stick; the sea is calm and the sky has a few clouds.",
    "A kitchen table. On it lie a bowl of apples, a knife, and a newspaper folded twice.",
]


def _jpg(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rgb = np.random.default_rng(seed).integers(0, 255, (20, 24, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(path)


def write_sharegpt4v(root: Path, n: int = 3) -> None:
    """ShareGPT4V's share-captioner JSON: image paths relative to the root, caption in the gpt turn."""
    items = []
    for i in range(n):
        rel = f"coco/train2017/{i:012d}.jpg"
        _jpg(root / rel, i)
        items.append(
            {
                "id": str(i),
                "image": rel,
                "conversations": [
                    {"from": "human", "value": "<image>\nWhat do you see happening in this image?"},
                    {"from": "gpt", "value": CAPTIONS[i % len(CAPTIONS)]},
                ],
            }
        )
    (root / "share-captioner_coco_lcs_sam_1246k_1107.json").write_text(json.dumps(items))


def write_urban1k(root: Path) -> None:
    for i, cap in enumerate(CAPTIONS, start=1):
        _jpg(root / "Urban1k" / "image" / f"{i}.jpg", i)
        (root / "Urban1k" / "caption").mkdir(parents=True, exist_ok=True)
        (root / "Urban1k" / "caption" / f"{i}.txt").write_text(cap + "\n")


def write_long_dci(root: Path) -> None:
    base = root / "densely_captioned_images"
    (base / "annotations").mkdir(parents=True, exist_ok=True)
    names = []
    for i, cap in enumerate(CAPTIONS):
        _jpg(base / "photos" / f"sa_{i}.jpg", i)
        short, _, extra = cap.partition(". ")
        anno = {"image": f"sa_{i}.jpg", "short_caption": short + ".", "extra_caption": extra, "mask_data": {}}
        (base / "annotations" / f"sa_{i}.json").write_text(json.dumps(anno))
        names.append(f"sa_{i}.json")
    (base / "splits.json").write_text(json.dumps({"train": names[:2], "test": names[2:]}))


def test_scene_families_share_a_prefix_and_differ_in_part_within_L():
    scenes = scene_families(16, 4, 32, 2, 5, seed=0)
    long, lengths = tokenize([s["caption"] for s in scenes], 160)
    cut = truncate_tokens(long, 32)  # what a CLIP-style encoder with context L = 32 reads
    lo, hi = PREFIX_VISIBLE
    for f in range(16):
        rows = cut[4 * f : 4 * f + 4]
        assert len({tuple(r.tolist()) for r in rows}) == 4, "siblings must differ within their first L tokens"
        shared = int((rows == rows[:1]).all(0).long().cumprod(0).sum())  # common prefix, SOT included
        assert 31 - hi <= shared <= 31 - lo, f"family {f}: siblings differ in only the last {lo}-{hi} slots of L"
        full = long[4 * f : 4 * f + 4]
        assert int((full != full[:1]).any(0).sum()) > 3 * hi, "and mostly after L"
    assert lengths.min() >= 48 and lengths.float().mean() > 2.5 * 32  # long captions, several times L
    assert all(first_sentence(s["caption"]).endswith(".") for s in scenes)
    assert len({first_sentence(s["caption"]) for s in scenes[:4]}) == 1  # the short caption is shared
    img = render_scene(scenes[0]["bg"], scenes[0]["objects"], 32)
    assert img.shape == (32, 32, 3) and len(np.unique(img.reshape(-1, 3), axis=0)) >= 3
    tiny = scene_families(2, 4, 12, 1, 2, seed=0)  # L too short for any shared sentence: the first one is shared
    assert len(tiny) == 8 and len({first_sentence(s["caption"]) for s in tiny[:4]}) == 1


def test_tokens_match_open_clip_and_truncation_warns_once():
    import open_clip

    tok = _tokenizer()
    text = CAPTIONS[0] + " " + CAPTIONS[1]
    assert tok.encode(text) == tok.bpe.encode(text)  # the per-sentence cache changes nothing
    ids, lengths = tokenize(CAPTIONS, 77)
    torch.testing.assert_close(ids, open_clip.tokenize(CAPTIONS, context_length=77))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        short, _ = tokenize(CAPTIONS, 12, warn_as="test split")
    assert len(caught) == 1 and "3 of 3 captions are longer than 12 tokens" in str(caught[0].message)
    assert (short[:, 0] == SOT).all() and (short[:, -1] == EOT).all()
    torch.testing.assert_close(truncate_tokens(ids, 12), short)
    with pytest.raises(ConfigError, match="caption 1 of test split is empty"):
        tokenize(["fine.", "  "], 12, warn_as="test split")


@pytest.mark.parametrize("dataset", ["sharegpt4v", "urban1k", "long_dci"])
def test_real_formats_read_from_fixtures(dataset, tmp_path):
    {"sharegpt4v": write_sharegpt4v, "urban1k": write_urban1k, "long_dci": write_long_dci}[dataset](tmp_path)
    dm = CaptionsDataModule(
        source="real",
        data_dir=str(tmp_path),
        dataset=dataset,
        batch_size=2,
        image_size=16,
        val_size=1,
        long_context=40,
        short_context=12,
    )
    dm.setup()
    split = "val" if dataset == "sharegpt4v" else "test"
    ds = dm.datasets[split]
    item = ds[0]
    assert item["image"].shape == (1, 3, 16, 16) and item["long"].shape == (1, 40) and item["short"].shape == (1, 12)
    want = CAPTIONS[0] if dataset != "long_dci" else CAPTIONS[0].replace(". ", ".\n", 1)
    ids, length = tokenize([want], 40)
    torch.testing.assert_close(item["long"], ids)
    assert item["length"].item() == length.item() > 12
    short_ids, _ = tokenize([first_sentence(want)], 12)
    torch.testing.assert_close(item["short"], short_ids)
    if dataset == "sharegpt4v":
        assert len(dm.datasets["train"]) == 2 and len(ds) == 1  # the first val_size items are held out
    batch = next(iter(dm.train_dataloader()))
    assert batch["image"].shape == (2, 3, 16, 16)


def test_missing_and_corrupt_files_are_named(tmp_path):
    with pytest.raises(MissingDataError, match="share-captioner_coco_lcs_sam_1246k_1107.json"):
        CaptionsDataModule(source="real", data_dir=str(tmp_path)).setup()
    write_urban1k(tmp_path)
    (tmp_path / "Urban1k" / "image" / "2.jpg").unlink()
    dm = CaptionsDataModule(source="real", data_dir=str(tmp_path), dataset="urban1k", batch_size=1, image_size=16)
    dm.setup()
    with pytest.raises(MissingDataError, match=r"missing image file .*Urban1k/image/2.jpg"):
        dm.datasets["test"][1]
    (tmp_path / "Urban1k" / "image" / "3.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DataFormatError, match=r"cannot read image file .*3.jpg"):
        load_image(tmp_path / "Urban1k" / "image" / "3.jpg", 16)
    with pytest.raises(ConfigError, match="data.dataset='coco'"):
        CaptionsDataModule(dataset="coco")
