"""Image / long-caption pairs for TULIP: rendered compositional scenes (embedded) and the paper's real formats.

Every item is a dict ``image`` ``[3, S, S]`` (float, CLIP-normalised), ``long`` ``[E]`` (BPE ids of the long caption,
``E = long_context``), ``short`` ``[L]`` (the first sentence, ``L = short_context``), ``length`` (BPE tokens of the
whole long caption, SOT and EOT included, before truncation) and ``group`` (scene family, ``-1`` for real data).
Tokens come from open_clip's ``SimpleTokenizer`` (CLIP's BPE, vocabulary shipped in the wheel): SOT ... EOT, zero
padded; a caption longer than ``E`` is truncated with its EOT kept in the last slot and one warning per split.

**Embedded default** (:func:`render_scene`, :func:`describe_scene`): images of 2-3 to 7 objects on a coloured
background; each object has a shape, colour, size, texture and one of nine grid positions. The long caption describes
the background and every object in varied natural-language templates; the short caption is its first sentence.
Scenes come in *families* of ``group_size``: one family shares the background and its first objects, whose
sentences are written identically and, by construction, end 2-8 tokens (``PREFIX_VISIBLE``; 2-3 at ``L = 32``, where
whole sentences allow no other length) before the last content slot of a caption cut at ``L``. Each member then
opens its own details with a different sentence template, so the members' captions cut at ``L`` differ, but only in
those last few tokens, which name at most one attribute of the first detail object (a size, or where it lies); all
the other details lie after token ``L``. A text encoder that reads ``L`` tokens (CLIP at its context) sees distinct
but nearly uninformative prefixes, so it is weak at telling family members apart for the paper's reason (the lost
detail), not zero by construction; one that reads the whole caption can tell them apart. Captions have 2-5 detail
sentences, so they are about 2-4x longer than ``L`` and retrieval can be scored by caption length. A batch holds
whole families (the loader draws families, :func:`collate_families`), so the in-batch negatives of the contrastive
loss include the hard ones.

**Real formats** (``source=real``, local files only):

* ``sharegpt4v``: ``<data_dir>/<sharegpt4v_file>`` (``share-captioner_coco_lcs_sam_1246k_1107.json``: a list of
  ``{"image": rel path, "conversations": [{"from": "human", ...}, {"from": "gpt", "value": caption}]}``), images
  under ``<data_dir>/<image>``; the first 1k items are validation (and test), the rest train (TULIP Sec. 4.1).
* ``urban1k``: ``<data_dir>/Urban1k/image/<i>.jpg`` + ``<data_dir>/Urban1k/caption/<i>.txt`` (Long-CLIP's release).
* ``long_dci``: ``<data_dir>/densely_captioned_images/splits.json`` (``{split: [annotation file, ...]}``),
  ``annotations/<file>`` (``image``, ``short_caption``, ``extra_caption``), ``photos/<image>``; the long caption is
  ``short_caption`` + newline + ``extra_caption`` (TULIP's Long-DCI).

``urban1k`` and ``long_dci`` are evaluation sets: with ``test_dataset`` they replace the test split of a
``sharegpt4v`` run; as ``dataset`` they give every split the same items (evaluation only).
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from core.errors import ConfigError, DataFormatError, MissingDataError, check
from datamodules._base import SuiteDataModule, require_files

SOT, EOT = 49406, 49407
MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(3, 1, 1)  # CLIP's normalisation
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(3, 1, 1)
DATASETS = ("sharegpt4v", "urban1k", "long_dci")
SHAREGPT4V_FILE = "share-captioner_coco_lcs_sam_1246k_1107.json"

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 215, 40),
    "purple": (140, 60, 180),
    "orange": (240, 140, 30),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
BACKGROUNDS = {
    "grey": (128, 128, 128),
    "beige": (225, 205, 165),
    "teal": (40, 128, 128),
    "pink": (235, 170, 190),
    "navy": (20, 30, 90),
    "olive": (110, 120, 40),
}
SHAPES = ("circle", "square", "triangle", "diamond", "cross")
SIZES = ("small", "large")
TEXTURES = ("solid", "striped", "dotted")
POSITIONS = ("top left", "top", "top right", "left", "centre", "right", "bottom left", "bottom", "bottom right")
WHERE = {
    "top left": "in the top left corner",
    "top": "at the top",
    "top right": "in the top right corner",
    "left": "on the left",
    "centre": "in the centre",
    "right": "on the right",
    "bottom left": "in the bottom left corner",
    "bottom": "at the bottom",
    "bottom right": "in the bottom right corner",
}
FIRST = (
    "A {size} {colour} {shape} with a {texture} fill lies {where} of a {bg} canvas.",
    "On a {bg} background there is a {size} {texture} {colour} {shape} {where}.",
    "This picture shows a {size} {colour} {shape}, {texture}, {where} on {bg}.",
)
OTHERS = (
    "There is also a {size} {colour} {shape} with a {texture} pattern {where}.",
    "{Where}, one can see a {texture} {colour} {shape} of {size} size.",
    "A {size} {texture} {colour} {shape} has been placed {where}.",
    "Next, {where}, the artist drew a {colour} {shape} that is {size} and {texture}.",
    "We can also notice a {colour} {size} {shape} {where}, filled in a {texture} way.",
)


class SentenceCachedTokenizer:
    """open_clip's ``SimpleTokenizer`` with a per-sentence cache: CLIP's BPE drops whitespace between words, so the
    ids of sentences joined by spaces are the ids of each sentence concatenated (tested), and the embedded captions
    reuse a few thousand sentences."""

    def __init__(self) -> None:
        from open_clip.tokenizer import SimpleTokenizer

        self.bpe = SimpleTokenizer()
        self.cache: dict[str, list[int]] = {}

    def encode_sentence(self, sentence: str) -> list[int]:
        if sentence not in self.cache:
            self.cache[sentence] = self.bpe.encode(sentence)
        return self.cache[sentence]

    def encode(self, text: str) -> list[int]:
        return [i for s in re.split(r"(?<=[.!?])\s+", text.strip()) for i in self.encode_sentence(s)]


@functools.lru_cache(maxsize=1)
def _tokenizer() -> SentenceCachedTokenizer:
    return SentenceCachedTokenizer()


def tokenize(texts: list[str], context: int, tokenizer: Any = None, warn_as: str | None = None) -> tuple:
    """BPE ids ``[N, context]`` (SOT ... EOT, zero padded) and the untruncated lengths ``[N]`` of ``texts``.

    A text longer than ``context`` is cut with its EOT kept in the last slot; ``warn_as`` names the split in the one
    warning issued per call when that happens.
    """
    tok = tokenizer or _tokenizer()
    out = torch.zeros(len(texts), context, dtype=torch.long)
    lengths = torch.zeros(len(texts), dtype=torch.long)
    cut = 0
    for i, text in enumerate(texts):
        check(bool(text and text.strip()), f"caption {i} of {warn_as or 'the batch'} is empty")
        ids = [SOT, *tok.encode(text), EOT]
        lengths[i] = len(ids)
        if len(ids) > context:
            ids, cut = [*ids[: context - 1], EOT], cut + 1
        out[i, : len(ids)] = torch.tensor(ids)
    if cut and warn_as:
        warnings.warn(
            f"{warn_as}: {cut} of {len(texts)} captions are longer than {context} tokens and were truncated",
            stacklevel=2,
        )
    return out, lengths


def truncate_tokens(tokens: torch.Tensor, context: int) -> torch.Tensor:
    """The first ``context`` ids of ``tokens`` ``[B, E]``, with EOT in the last slot of rows that were cut (what
    the tokenizer gives at ``context``)."""
    out = tokens[:, :context].clone()
    cut = ~(out == EOT).any(-1)
    out[cut, -1] = EOT
    return out


def first_sentence(text: str) -> str:
    """The short caption: the text up to the first sentence end (the official ``CsvDatasetShortLongCaps``)."""
    parts = re.split(r"(?<=[.!?])\s+|\n", text.strip(), maxsplit=1)
    return parts[0].strip()


# ---------------------------------------------------------------------------------------------------------------
# embedded: rendered scenes
# ---------------------------------------------------------------------------------------------------------------
def _random_object(rng: np.random.Generator, position: str) -> dict:
    return {
        "shape": SHAPES[rng.integers(len(SHAPES))],
        "colour": list(COLOURS)[rng.integers(len(COLOURS))],
        "size": SIZES[rng.integers(2)],
        "texture": TEXTURES[rng.integers(3)],
        "position": position,
    }


_SHAPE_MASKS = {
    "circle": lambda dy, dx: dy**2 + dx**2 <= 1,
    "square": lambda dy, dx: np.maximum(abs(dy), abs(dx)) <= 0.85,
    "triangle": lambda dy, dx: (dy <= 0.8) & (abs(dx) <= (dy + 1) / 2),
    "diamond": lambda dy, dx: abs(dy) + abs(dx) <= 1,
    "cross": lambda dy, dx: (np.maximum(abs(dy), abs(dx)) <= 1) & (np.minimum(abs(dy), abs(dx)) <= 0.3),
}


def render_scene(bg: str, objects: list[dict], size: int) -> np.ndarray:
    """Draw the scene: ``[size, size, 3]`` uint8; each object in its cell of a 3x3 grid."""
    img = np.empty((size, size, 3), np.uint8)
    img[:] = BACKGROUNDS[bg]
    cell = size / 3
    for obj in objects:
        r, c = divmod(POSITIONS.index(obj["position"]), 3)
        y0, y1, x0, x1 = int(r * cell), int((r + 1) * cell), int(c * cell), int((c + 1) * cell)
        yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)  # the object's cell only
        half = cell * (0.42 if obj["size"] == "large" else 0.24)
        dy, dx = (yy - (r + 0.5) * cell) / half, (xx - (c + 0.5) * cell) / half
        mask = _SHAPE_MASKS[obj["shape"]](dy, dx)
        if obj["texture"] == "striped":
            mask &= ((xx + yy) // max(size // 21, 1)) % 2 == 0
        elif obj["texture"] == "dotted":
            step = max(size // 16, 2)
            mask &= ((xx % step) < step / 2) & ((yy % step) < step / 2)
        img[y0:y1, x0:x1][mask] = COLOURS[obj["colour"]]
    return img


def _sentence(template: str, obj: dict, bg: str) -> str:
    where = WHERE[obj["position"]]
    return template.format(bg=bg, where=where, Where=where[0].upper() + where[1:], **obj)


def describe_scene(bg: str, objects: list[dict], templates: list[int]) -> str:
    """The long caption: the first sentence (background + first object), then one sentence per further object."""
    first = _sentence(FIRST[templates[0] % len(FIRST)], objects[0], bg)
    rest = [_sentence(OTHERS[t % len(OTHERS)], o, bg) for t, o in zip(templates[1:], objects[1:], strict=True)]
    return " ".join([first, *rest])


# Member-specific text tokens that fall inside the short context L (the rest of the members' details lie beyond it)
PREFIX_VISIBLE = (2, 8)


def _shared_prefix(
    rng: np.random.Generator, tok: Any, bg: str, short_context: int, reserve: int, tries: int = 256
) -> tuple[list[dict], list[int], list[int]]:
    """Shared objects (first sentence first) whose text ends ``PREFIX_VISIBLE`` tokens before the last content slot
    of a caption cut at ``short_context`` (SOT + ``L - 2`` tokens + EOT); whole sentences only, so it samples
    objects and templates until their lengths fit (``tries`` restarts). When even the first sentence is too long
    for ``L`` (tiny test contexts), the first sentence alone is shared. Returns the shared objects, their templates
    and the grid cells left for the members' details (at least ``reserve``)."""
    content = short_context - 2
    lo, hi = content - PREFIX_VISIBLE[1], content - PREFIX_VISIBLE[0]
    fallback = None
    for _ in range(tries):
        free = [int(c) for c in rng.permutation(len(POSITIONS))]  # grid cells, taken from the end
        shared, templates = [_random_object(rng, POSITIONS[free.pop()])], [int(rng.integers(15))]
        n = len(tok.encode(describe_scene(bg, shared, templates)))
        if fallback is None:
            fallback = (shared, templates, free, n)
        while n < lo and len(free) > reserve:
            for _ in range(16):  # a next sentence that still ends inside the window
                obj, t = _random_object(rng, POSITIONS[free[-1]]), int(rng.integers(15))
                n_new = len(tok.encode(describe_scene(bg, [*shared, obj], [*templates, t])))
                if n_new <= hi:
                    break
            if n_new > hi:
                break
            free.pop()
            shared, templates, n = [*shared, obj], [*templates, t], n_new
        if lo <= n <= hi:
            return shared, templates, free
        if fallback[3] > hi:
            break  # the first sentence alone overflows L: nothing member-specific can fall inside it
    return fallback[:3]


def scene_families(
    n_families: int,
    group_size: int,
    short_context: int,
    min_details: int,
    max_details: int,
    seed: int,
    tokenizer: Any = None,
) -> list[dict]:
    """Scene specs, ``group_size`` per family: shared background + objects whose text ends 2-8 tokens
    (``PREFIX_VISIBLE``) before the end of a caption cut at ``short_context``, then ``min_details`` ..
    ``max_details`` objects per member. Each member opens its details with a different sentence template (the
    family's members cycle through ``OTHERS``), so the members' captions cut at ``L`` differ, in their last 2-8
    tokens, where only a word or two can name an attribute of the first detail object; the rest of their
    details lies beyond ``L``."""
    tok = tokenizer or _tokenizer()
    rng = np.random.default_rng(seed)
    scenes = []
    for family in range(n_families):
        bg = list(BACKGROUNDS)[rng.integers(len(BACKGROUNDS))]
        shared, templates, free = _shared_prefix(rng, tok, bg, short_context, reserve=min_details)
        openers = [int(t) for t in rng.permutation(len(OTHERS))]
        for member in range(group_size):
            n = int(rng.integers(min_details, min(max_details, len(free)) + 1))
            picks = rng.permutation(free)[:n]
            details = [_random_object(rng, POSITIONS[p]) for p in picks]
            detail_t = [openers[member % len(OTHERS)], *(int(rng.integers(15)) for _ in details[1:])]
            objects = shared + details
            scenes.append(
                {
                    "bg": bg,
                    "objects": objects,
                    "caption": describe_scene(bg, objects, templates + detail_t),
                    "group": family,
                }
            )
    return scenes


class PairDataset(Dataset):
    """Items of ``group_size`` pairs each (one family), stacked: ``image [G, 3, S, S]``, ``long [G, E]``, ..."""

    def __init__(
        self,
        images: torch.Tensor | list,
        long: torch.Tensor,
        short: torch.Tensor,
        lengths: torch.Tensor,
        groups: torch.Tensor,
        group_size: int = 1,
        image_size: int = 64,
    ) -> None:
        self.images, self.long, self.short, self.lengths, self.groups = images, long, short, lengths, groups
        self.group_size, self.image_size = group_size, image_size

    def __len__(self) -> int:
        return len(self.long) // self.group_size

    def _image(self, i: int) -> torch.Tensor:
        img = self.images[i]
        if isinstance(img, torch.Tensor):
            return img
        return load_image(img, self.image_size)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        rows = range(idx * self.group_size, (idx + 1) * self.group_size)
        return {
            "image": torch.stack([self._image(i) for i in rows]),
            "long": self.long[list(rows)],
            "short": self.short[list(rows)],
            "length": self.lengths[list(rows)],
            "group": self.groups[list(rows)],
        }


def collate_families(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Concatenate families into one batch of ``sum(G)`` pairs."""
    return {k: torch.cat([it[k] for it in items]) for k in items[0]}


def load_image(path: str | Path, size: int) -> torch.Tensor:
    """Read an image file, resize it to ``size x size`` and normalise it (CLIP): ``[3, size, size]``."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im = im.convert("RGB").resize((size, size), Image.BICUBIC)
            arr = np.asarray(im, dtype=np.float32) / 255.0
    except FileNotFoundError:
        raise MissingDataError(f"missing image file {path}") from None
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise DataFormatError(f"cannot read image file {path} ({type(err).__name__}: {err})") from None
    return (torch.from_numpy(arr).permute(2, 0, 1) - MEAN) / STD


def _to_tensor(img: np.ndarray) -> torch.Tensor:
    return (torch.from_numpy(img).float().permute(2, 0, 1) / 255.0 - MEAN) / STD


# ---------------------------------------------------------------------------------------------------------------
# real formats
# ---------------------------------------------------------------------------------------------------------------
def read_sharegpt4v(root: Path, filename: str) -> list[tuple[Path, str]]:
    """``(image path, caption)`` of a ShareGPT4V annotation file (the gpt turn of each item)."""
    (path,) = require_files(
        root, [filename], "Get it from the ShareGPT4V release (Lin-Chen/ShareGPT4V) and the images it names."
    )
    items = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for row, item in enumerate(items):
        try:
            caption = next(t["value"] for t in item["conversations"] if t["from"] == "gpt")
            out.append((root / item["image"], caption))
        except (KeyError, TypeError, StopIteration):
            raise DataFormatError(f"{path}: item {row} has no image or gpt caption") from None
    return out


def read_urban1k(root: Path) -> list[tuple[Path, str]]:
    """``(image, caption)`` of Urban-1k: ``Urban1k/image/<i>.jpg`` with ``Urban1k/caption/<i>.txt``."""
    base = root / "Urban1k"
    require_files(root, ["Urban1k/image", "Urban1k/caption"], "Get Urban-1k from the Long-CLIP release.")
    out = []
    for cap in sorted((base / "caption").glob("*.txt")):
        image = base / "image" / f"{cap.stem}.jpg"
        out.append((image, cap.read_text(encoding="utf-8").strip()))
    if not out:
        raise MissingDataError(f"missing data file(s): no caption files {base / 'caption'}/<i>.txt")
    return out


def read_long_dci(root: Path) -> list[tuple[Path, str]]:
    """``(photo, short + newline + extra caption)`` of every split of DCI (TULIP's Long-DCI)."""
    base = root / "densely_captioned_images"
    (splits,) = require_files(root, ["densely_captioned_images/splits.json"], "Get DCI (facebookresearch/DCI).")
    names = [n for files in json.loads(splits.read_text(encoding="utf-8")).values() for n in files]
    out = []
    for name in names:
        anno_file = base / "annotations" / name
        if not anno_file.is_file():
            raise MissingDataError(f"missing data file(s): {anno_file}")
        anno = json.loads(anno_file.read_text(encoding="utf-8"))
        try:
            out.append((base / "photos" / anno["image"], f"{anno['short_caption']}\n{anno['extra_caption']}"))
        except KeyError as err:
            raise DataFormatError(f"{anno_file}: no {err} field") from None
    return out


class CaptionsDataModule(SuiteDataModule):
    """Long/short caption pairs for TULIP (see the module docstring for the data).

    Args:
        source: ``embedded`` (rendered scenes) or ``real``.
        data_dir: Root of the real files.
        batch_size: Pairs per global batch (a multiple of ``group_size``: whole families per batch).
        num_workers: Loader workers.
        seed: Seed of the scenes, splits and shuffling.
        long_context: ``E``, tokens of the long caption (the expanded context).
        short_context: ``L``, the original CLIP context (short caption and distillation length).
        image_size: Image side in pixels.
        group_size: Scenes per family (embedded).
        train_families: Families in the train split (embedded).
        val_families: Families in the validation split (embedded).
        test_families: Families in the test split (embedded).
        min_details: Fewest detail objects after the shared prefix (embedded).
        max_details: Most detail objects (embedded).
        dataset: Real training/validation set (``sharegpt4v``, ``urban1k``, ``long_dci``).
        test_dataset: Real test set (default: ``dataset``).
        sharegpt4v_file: ShareGPT4V annotation file name.
        val_size: ShareGPT4V items held out for validation/test (the first 1k).
    """

    def __init__(
        self,
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
        long_context: int = 128,
        short_context: int = 32,
        image_size: int = 64,
        group_size: int = 4,
        train_families: int = 512,
        val_families: int = 32,
        test_families: int = 64,
        min_details: int = 2,
        max_details: int = 5,
        dataset: str = "sharegpt4v",
        test_dataset: str | None = None,
        sharegpt4v_file: str = SHAREGPT4V_FILE,
        val_size: int = 1000,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        check(dataset in DATASETS, f"data.dataset={dataset!r} must be one of {list(DATASETS)}")
        check(
            test_dataset in (None, *DATASETS), f"data.test_dataset={test_dataset!r} must be null or in {list(DATASETS)}"
        )
        check(2 <= short_context < long_context, f"data.short_context={short_context} must be in [2, long_context)")
        check(group_size >= 1, f"data.group_size={group_size} must be >= 1")
        check(1 <= min_details <= max_details, f"data.min_details={min_details} must be in [1, max_details]")
        if source == "embedded":
            check(batch_size % group_size == 0, f"data.batch_size={batch_size} must divide by group_size={group_size}")
        self.long_context, self.short_context, self.image_size = long_context, short_context, image_size
        self.group_size, self.min_details, self.max_details = group_size, min_details, max_details
        self.families = {"train": train_families, "val": val_families, "test": test_families}
        self.dataset, self.test_dataset, self.sharegpt4v_file, self.val_size = (
            dataset,
            test_dataset,
            sharegpt4v_file,
            val_size,
        )

    @property
    def items_per_sample(self) -> int:
        return self.group_size if self.source == "embedded" else 1

    def _pairs(
        self, images: list, captions: list[str], name: str, groups: torch.Tensor | None = None, group_size: int = 1
    ) -> PairDataset:
        tok = _tokenizer()
        long, lengths = tokenize(captions, self.long_context, tok, warn_as=name)
        short, _ = tokenize([first_sentence(c) for c in captions], self.short_context, tok)
        groups = torch.full((len(captions),), -1) if groups is None else groups
        return PairDataset(images, long, short, lengths, groups, group_size, self.image_size)

    def load_embedded(self) -> dict[str, Any]:
        out, tok = {}, _tokenizer()
        for offset, (split, n) in enumerate(self.families.items()):
            scenes = scene_families(
                n,
                self.group_size,
                self.short_context,
                self.min_details,
                self.max_details,
                self.seed * 1000 + offset,
                tok,
            )
            images = torch.stack([_to_tensor(render_scene(s["bg"], s["objects"], self.image_size)) for s in scenes])
            groups = torch.tensor([s["group"] for s in scenes])
            out[split] = self._pairs(
                images, [s["caption"] for s in scenes], f"embedded {split}", groups, self.group_size
            )
        return out

    def _read(self, name: str) -> list[tuple[Path, str]]:
        root = Path(self.data_dir)
        if name == "sharegpt4v":
            return read_sharegpt4v(root, self.sharegpt4v_file)
        return read_urban1k(root) if name == "urban1k" else read_long_dci(root)

    def load_real(self) -> dict[str, Any]:
        items = self._read(self.dataset)
        if self.dataset == "sharegpt4v":
            held, train = items[: self.val_size], items[self.val_size :]
            if not train:
                raise ConfigError(f"data.val_size={self.val_size} leaves no training item of {len(items)}")
        else:
            held = train = items
        test = held if self.test_dataset in (None, self.dataset) else self._read(self.test_dataset)
        out = {}
        for split, rows in (("train", train), ("val", held), ("test", test)):
            for image, _ in rows[:1]:
                if not Path(image).is_file():
                    raise MissingDataError(f"missing image file {image}")
            out[split] = self._pairs([p for p, _ in rows], [c for _, c in rows], f"{split} captions")
        return out

    def loader(self, split: str, shuffle: bool | None = None, **kwargs: Any):
        kwargs.setdefault("collate_fn", collate_families)
        return super().loader(split, shuffle, **kwargs)

    @property
    def rank_batch_size(self) -> int:
        per_rank = super().rank_batch_size
        if per_rank % self.items_per_sample:
            raise ConfigError(f"per-rank batch {per_rank} must divide by group_size={self.items_per_sample}")
        return per_rank // self.items_per_sample
