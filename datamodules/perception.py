"""Dense perception data for ADDP: monocular depth and referring segmentation.

Every item is a dict of tensors and strings (``S`` = ``image_size``, ``D`` = ``cond_dim``, ``M`` = objects per scene)::

    image     [3, S, S]  float in [0, 1]
    target    [1, S, S]  depth in metres (``task=depth``) or the referred object's mask in {0, 1} (``task=refseg``)
    valid     [1, S, S]  bool: pixels with a ground truth (depth 0 / NaN / inf are invalid; masks: all valid)
    cond      [D]        embedding of the referring expression (:func:`embed_expression`; zeros for depth)
    refined   [D]        embedding of a refined expression (the full description / a second sentence)
    text, refined_text   str: the two expressions as text ("" for depth), for a pretrained text encoder in the model
                         (``model.text_encoder=bert``); the hashed ``cond``/``refined`` are the embedded stand-in
    obj_masks [M, 1, S, S], obj_conds [M, D], obj_valid [M]: every object of the scene with its full description
              (the simulated user of the correction rounds names the wrong object it sees); row 0 is the target.
    obj_texts str: the M full descriptions as text, one per line (one string per item, so batches collate to a
              list of B strings)

Sources (``dataset``):

* ``scenes`` (embedded default, :func:`render_scenes`): procedurally rendered scenes, exact depth and masks.
* ``nyuv2``: the labelled NYU Depth v2 ``nyu_depth_v2_labeled.mat`` (MATLAB v7.3 = HDF5, read with h5py; ``images``
  ``[N, 3, W, H]`` uint8 and ``depths`` ``[N, W, H]`` metres), optional ``splits.mat`` (``testNdxs``, 1-based).
* ``kitti``: KITTI depth as listed by the BTS/Marigold split files: ``kitti_<split>.txt`` with lines
  ``<rgb path> <depth path> [focal]`` relative to ``data_dir``; depth PNGs are 16-bit, metres = value / 256, 0 = none.
* ``refcoco``: ``refcoco/refs(unc).p`` (pickle of refs: ``ref_id, ann_id, image_id, split, sentences``),
  ``refcoco/instances.json`` (COCO: ``images``, ``annotations`` with polygon or uncompressed-RLE ``segmentation``)
  and the COCO images ``images/train2014/<file_name>``.

Real images are resized to ``S x S`` (area for images, nearest for depth/masks) so the same small denoiser runs.
"""

from __future__ import annotations

import json
import pickle
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F
from torch.utils.data import Dataset

from core.errors import ConfigError, DataFormatError
from datamodules._base import SuiteDataModule, require_files, split_indices, unreadable_data_message

TASKS = ("depth", "refseg")
DATASETS = {"scenes": TASKS, "nyuv2": ("depth",), "kitti": ("depth",), "refcoco": ("refseg",)}
COLORS = {"red": (0.9, 0.15, 0.1), "green": (0.1, 0.8, 0.2), "blue": (0.15, 0.25, 0.95), "yellow": (0.95, 0.9, 0.1)}
SHAPES = ("square", "disc", "triangle")
HOW = {
    "nyuv2": "NYU Depth v2 labelled set: http://horatio.cs.nyu.edu/mit/silberman/nyu_depth_v2/nyu_depth_v2_labeled.mat",
    "kitti": "KITTI depth (https://www.cvlibs.net/datasets/kitti/eval_depth.php) with a BTS/Marigold split list "
    "kitti_<split>.txt ('<rgb> <depth> [focal]' per line, paths relative to data_dir)",
    "refcoco": "RefCOCO (https://github.com/lichengunc/refer: refs(unc).p, instances.json) under data_dir/refcoco and "
    "the COCO train2014 images under data_dir/images/train2014",
}


def embed_expression(text: str, dim: int) -> Tensor:
    """Signed feature hashing of the lower-cased words of ``text`` into ``[dim]``, unit norm (zeros for no words).

    Our interpretation: the paper conditions on a text encoder's embedding; no encoder weights exist offline, so a
    bag-of-words hash (stable crc32, sign from a second hash) stands in. Words of the scene vocabulary do not
    collide at ``dim >= 64`` (tested).
    """
    v = torch.zeros(dim)
    for word in text.lower().replace(",", " ").split():
        if word in ("the", "a", "an", "object"):
            continue
        h = zlib.crc32(word.encode())
        v[h % dim] += 1.0 if (zlib.crc32(word.encode()[::-1]) & 1) else -1.0
    n = v.norm()
    return v / n if n > 0 else v


def _shape_mask(shape: str, cy: float, cx: float, r: float, s: int) -> np.ndarray:
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float64) + 0.5
    if shape == "square":
        return (np.abs(yy - cy) <= r * 0.85) & (np.abs(xx - cx) <= r * 0.85)
    if shape == "disc":
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= r**2
    # upward triangle: apex at (cy - r), base at (cy + r)
    t = (yy - (cy - r)) / (2 * r)
    return (t >= 0) & (t <= 1) & (np.abs(xx - cx) <= t * r)


def render_scenes(n: int, size: int, seed: int, n_objects: int = 3, fog: float = 0.25) -> dict[str, np.ndarray]:
    """Render ``n`` scenes of ``size x size`` pixels with exact depth, object masks and descriptions.

    Model: a ground plane whose depth falls from ``far = 8`` m at the top row to ``2`` m at the bottom, and
    ``n_objects`` fronto-parallel objects (shape x colour, all distinct) at depths U(2, 6) m drawn far-to-near
    (painter's algorithm: nearer objects occlude). An object's image radius is ``k / depth`` (perspective), and
    the radiance is attenuated by atmospheric fog, ``c exp(-fog d) + h (1 - exp(-fog d))``, so depth is
    recoverable from size, vertical position, occlusion and shading: the cues a monocular depth model uses. The
    referring target is object 0; its full description ("the red disc") is unique in the scene, the partial ones
    ("the disc", "the red object") may be ambiguous: what the correction rounds resolve.

    Returns:
        ``image [n, 3, S, S]``, ``depth [n, 1, S, S]`` (metres), ``masks [n, M, S, S]`` (visible masks, object 0 the
        target), ``colors``/``shapes`` ``[n, M]`` indices.
    """
    rng = np.random.default_rng(seed)
    s, m = size, n_objects
    names = list(COLORS)
    if m > len(names) * len(SHAPES):
        raise ConfigError(f"data.n_objects={m} must be <= {len(names) * len(SHAPES)} (distinct colour x shape)")
    rows = (np.arange(s) + 0.5) / s
    img = np.empty((n, 3, s, s), np.float32)
    depth = np.empty((n, 1, s, s), np.float32)
    masks = np.zeros((n, m, s, s), bool)
    colors = np.empty((n, m), np.int64)
    shapes = np.empty((n, m), np.int64)
    haze = np.array([0.75, 0.78, 0.85])
    for i in range(n):
        combo = rng.choice(len(names) * len(SHAPES), size=m, replace=False)
        colors[i], shapes[i] = combo // len(SHAPES), combo % len(SHAPES)
        d = np.repeat((8.0 - 6.0 * rows)[:, None], s, axis=1)
        ground = 0.45 + 0.1 * rng.random() + 0.04 * rng.standard_normal((s, s))
        rgb = np.repeat(ground[None], 3, axis=0) * np.array([0.9, 0.85, 0.7])[:, None, None]
        z = rng.uniform(2.0, 6.0, size=m)
        owner = -np.ones((s, s), np.int64)
        for j in np.argsort(-z):  # far to near
            r = max(1.2, 0.55 * s / z[j])
            cy, cx = rng.uniform(r * 0.6, s - r * 0.6, size=2)
            mk = _shape_mask(SHAPES[shapes[i, j]], cy, cx, r, s)
            d[mk] = z[j]
            rgb[:, mk] = np.array(COLORS[names[colors[i, j]]])[:, None]
            owner[mk] = j
        att = np.exp(-fog * d)
        rgb = rgb * att[None] + haze[:, None, None] * (1 - att[None])
        img[i] = np.clip(rgb + 0.01 * rng.standard_normal(rgb.shape), 0, 1)
        depth[i, 0] = d
        for j in range(m):
            masks[i, j] = owner == j
    return {"image": img, "depth": depth, "masks": masks, "colors": colors, "shapes": shapes}


def describe(color: int, shape: int, part: str = "full") -> str:
    """``full`` "the red disc", ``shape`` "the disc", ``color`` "the red object"."""
    c, s = list(COLORS)[color], SHAPES[shape]
    return {"full": f"the {c} {s}", "shape": f"the {s}", "color": f"the {c} object"}[part]


class PerceptionDataset(Dataset):
    """Tensors of one split (see the module docstring); ``partial_prob`` of the training expressions are partial
    descriptions (fixed per item by the seed), the rest full; evaluation splits use ``partial`` for ``cond``."""

    def __init__(self, items: dict[str, Tensor]) -> None:
        self.items = items

    def __len__(self) -> int:
        return int(self.items["image"].shape[0])

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {k: v[i] for k, v in self.items.items()}


def _resize(x: Tensor, size: int, mode: str) -> Tensor:
    """[N, C, H, W] -> [N, C, size, size] (``area`` for images, ``nearest`` for depth and masks)."""
    if x.shape[-2:] == (size, size):
        return x
    return F.interpolate(x.float(), size=(size, size), mode=mode)


def _pack(image: Tensor, target: Tensor, valid: Tensor, conds: dict[str, Tensor], obj: dict[str, Tensor]) -> dict:
    return {"image": image, "target": target, "valid": valid, **conds, **obj}


def _texts(first: list[str], refined: list[str], objects: list[list[str]]) -> dict[str, list[str]]:
    """The expressions as text (``text``, ``refined_text``, ``obj_texts`` with one line per object); whitespace runs
    become one space so that a line break only separates objects."""
    one = lambda t: " ".join(str(t).split())  # noqa: E731
    return {
        "text": [one(t) for t in first],
        "refined_text": [one(t) for t in refined],
        "obj_texts": ["\n".join(one(t) for t in row) for row in objects],
    }


class PerceptionDataModule(SuiteDataModule):
    """Depth / referring-segmentation data: embedded rendered scenes or NYUv2, KITTI, RefCOCO files.

    Args:
        task: ``depth`` or ``refseg``.
        dataset: ``scenes`` (embedded) or, with ``source=real``, ``nyuv2`` | ``kitti`` (depth), ``refcoco`` (refseg).
        image_size: Side ``S`` of the (square) images the model sees; even.
        cond_dim: Expression-embedding size ``D``.
        n_train, n_val, n_test: Scenes per split (embedded).
        n_objects: Objects per rendered scene.
        partial_prob: Share of partial (possibly ambiguous) descriptions among the expressions (train and test).
        refs_file: RefCOCO refs pickle name (``refs(unc).p``; ``refs(google).p`` for RefCOCOg).
        max_items: Cap on the items read per real split (None: all).
        source, data_dir, batch_size, num_workers, seed: see :class:`SuiteDataModule`.
    """

    def __init__(
        self,
        task: str = "depth",
        dataset: str = "scenes",
        image_size: int = 32,
        cond_dim: int = 64,
        n_train: int = 2048,
        n_val: int = 256,
        n_test: int = 256,
        n_objects: int = 3,
        partial_prob: float = 0.5,
        refs_file: str = "refs(unc).p",
        max_items: int | None = None,
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        if task not in TASKS:
            raise ConfigError(f"data.task={task!r} must be one of {list(TASKS)}")
        if dataset not in DATASETS:
            raise ConfigError(f"data.dataset={dataset!r} must be one of {list(DATASETS)}")
        if task not in DATASETS[dataset]:
            raise ConfigError(f"data.dataset={dataset!r} has no {task!r} labels (it has {list(DATASETS[dataset])})")
        if source == "real" and dataset == "scenes":
            raise ConfigError("data.source=real needs data.dataset in nyuv2 | kitti | refcoco")
        if image_size < 4 or image_size % 2:
            raise ConfigError(f"data.image_size={image_size} must be even and >= 4")
        if cond_dim < 1:
            raise ConfigError(f"data.cond_dim={cond_dim} must be >= 1")
        if min(n_train, n_val, n_test) < 1 or not 0 <= partial_prob <= 1:
            raise ConfigError("data.n_train/n_val/n_test must be >= 1 and data.partial_prob in [0, 1]")
        self.task, self.dataset, self.image_size, self.cond_dim = task, dataset, image_size, cond_dim
        self.sizes = {"train": n_train, "val": n_val, "test": n_test}
        self.n_objects, self.partial_prob = n_objects, partial_prob
        self.refs_file, self.max_items = refs_file, max_items

    # -- embedded ------------------------------------------------------------------------------------------------
    def load_embedded(self) -> dict[str, Any]:
        out = {}
        for k, (split, n) in enumerate(self.sizes.items()):
            sc = render_scenes(n, self.image_size, seed=1000 * self.seed + k, n_objects=self.n_objects)
            rng = np.random.default_rng(7 + 1000 * self.seed + k)
            d = self.cond_dim
            full = [[describe(c, s) for c, s in zip(cs, ss)] for cs, ss in zip(sc["colors"], sc["shapes"])]
            parts = rng.choice(["shape", "color"], size=n)
            partial = rng.random(n) < self.partial_prob
            first = [
                describe(sc["colors"][i, 0], sc["shapes"][i, 0], parts[i]) if partial[i] else full[i][0]
                for i in range(n)
            ]
            obj_conds = torch.stack([torch.stack([embed_expression(t, d) for t in row]) for row in full])
            depth = torch.from_numpy(sc["depth"])
            masks = torch.from_numpy(sc["masks"])
            target = depth if self.task == "depth" else masks[:, :1].float()
            cond = torch.stack([embed_expression(t, d) for t in first]) if self.task == "refseg" else torch.zeros(n, d)
            out[split] = PerceptionDataset(
                _pack(
                    torch.from_numpy(sc["image"]),
                    target,
                    torch.ones_like(target, dtype=torch.bool),
                    {"cond": cond, "refined": obj_conds[:, 0].clone()},
                    {
                        "obj_masks": masks[:, :, None],
                        "obj_conds": obj_conds,
                        "obj_valid": torch.ones(n, masks.shape[1], dtype=torch.bool),
                        **_texts(first if self.task == "refseg" else [""] * n, [r[0] for r in full], full),
                    },
                )
            )
        return out

    # -- real ------------------------------------------------------------------------------------------------------
    def load_real(self) -> dict[str, Any]:
        return {"nyuv2": self._nyuv2, "kitti": self._kitti, "refcoco": self._refcoco}[self.dataset]()

    def _depth_items(self, image: Tensor, depth: Tensor) -> PerceptionDataset:
        """image [N, 3, H, W] in [0, 1], depth [N, 1, H, W] metres (0 / NaN = invalid) -> a dataset at size S."""
        s, d, n = self.image_size, self.cond_dim, image.shape[0]
        image = _resize(image, s, "area")
        depth = _resize(depth, s, "nearest")
        valid = torch.isfinite(depth) & (depth > 0)
        depth = torch.where(valid, depth, torch.zeros_like(depth))
        z = torch.zeros(n, d)
        return PerceptionDataset(
            _pack(
                image,
                depth,
                valid,
                {"cond": z, "refined": z.clone()},
                {
                    "obj_masks": torch.zeros(n, 1, 1, s, s),
                    "obj_conds": torch.zeros(n, 1, d),
                    "obj_valid": torch.zeros(n, 1, dtype=torch.bool),
                    **_texts([""] * n, [""] * n, [[""]] * n),
                },
            )
        )

    def _splits(self, n: int, test_idx: np.ndarray | None) -> dict[str, np.ndarray]:
        if test_idx is None:
            tr, va, te = split_indices(n, [0.8, 0.1, 0.1], self.seed)
            out = {"train": tr.numpy(), "val": va.numpy(), "test": te.numpy()}
        else:
            rest = np.setdiff1d(np.arange(n), test_idx)
            perm = np.random.default_rng(self.seed).permutation(rest)
            nv = max(1, len(rest) // 10)
            out = {"train": np.sort(perm[nv:]), "val": np.sort(perm[:nv]), "test": np.sort(test_idx)}
        if self.max_items is not None:
            out = {k: v[: self.max_items] for k, v in out.items()}
        return out

    def _nyuv2(self) -> dict[str, Any]:
        import h5py

        root = Path(self.data_dir)
        (mat,) = require_files(root, ["nyu_depth_v2_labeled.mat"], HOW["nyuv2"])
        with _read(mat, lambda p: h5py.File(p, "r")) as f:
            if "images" not in f or "depths" not in f:
                raise DataFormatError(f"{mat}: needs the HDF5 datasets 'images' and 'depths' (has {sorted(f)})")
            n = f["images"].shape[0]
            test_idx = None
            split_file = root / "splits.mat"
            if split_file.exists():
                with h5py.File(split_file, "r") as sf:
                    test_idx = np.asarray(sf["testNdxs"]).astype(np.int64).ravel() - 1
            out = {}
            for split, idx in self._splits(n, test_idx).items():
                # MATLAB stores column-major: [N, 3, W, H] and [N, W, H]; transpose to [N, 3, H, W].
                img = torch.from_numpy(np.asarray(f["images"][np.sort(idx)])).permute(0, 1, 3, 2).float() / 255
                dep = torch.from_numpy(np.asarray(f["depths"][np.sort(idx)], np.float32)).permute(0, 2, 1)[:, None]
                out[split] = self._depth_items(img, dep)
        return out

    def _kitti(self) -> dict[str, Any]:
        from PIL import Image

        root = Path(self.data_dir)
        lists = require_files(root, ["kitti_train.txt", "kitti_test.txt"], HOW["kitti"])
        pairs = {}
        for split, path in zip(("train", "test"), lists):
            rows = []
            for k, line in enumerate(_read(path, lambda p: p.read_text(encoding="utf-8")).splitlines()):
                if not line.strip():
                    continue
                parts = line.split()
                if len(parts) < 2:
                    raise DataFormatError(f"{path} line {k + 1}: expected '<rgb> <depth> [focal]', got {line!r}")
                rows.append((root / parts[0], root / parts[1]))
            pairs[split] = rows[: self.max_items] if self.max_items else rows
        nv = max(1, len(pairs["train"]) // 10)
        pairs["val"], pairs["train"] = pairs["train"][:nv], pairs["train"][nv:] or pairs["train"][:nv]
        out = {}
        for split, rows in pairs.items():
            missing = [str(p) for r in rows for p in r if not p.exists()]
            if missing:
                require_files(root, [str(Path(m).relative_to(root)) for m in missing[:5]], HOW["kitti"])
            imgs, deps = [], []
            for rgb, dep in rows:
                im = np.asarray(Image.open(rgb).convert("RGB"), np.float32) / 255
                dm = np.asarray(Image.open(dep))
                if dm.dtype not in (np.uint16, np.int32, np.uint8) or dm.ndim != 2:
                    raise DataFormatError(
                        f"{dep}: expected a 16-bit single-channel depth PNG, got {dm.dtype} {dm.shape}"
                    )
                t_im = _resize(torch.from_numpy(im).permute(2, 0, 1)[None], self.image_size, "area")
                t_d = _resize(torch.from_numpy(dm.astype(np.float32) / 256.0)[None, None], self.image_size, "nearest")
                imgs.append(t_im)
                deps.append(t_d)
            out[split] = self._depth_items(torch.cat(imgs), torch.cat(deps))
        return out

    def _refcoco(self) -> dict[str, Any]:
        from PIL import Image

        root = Path(self.data_dir)
        refs_path, inst_path = require_files(
            root, [f"refcoco/{self.refs_file}", "refcoco/instances.json"], HOW["refcoco"]
        )
        refs = _read(refs_path, lambda p: pickle.loads(p.read_bytes()))
        inst = _read(inst_path, lambda p: json.loads(p.read_text(encoding="utf-8")))
        images = {im["id"]: im for im in inst["images"]}
        anns = {a["id"]: a for a in inst["annotations"]}
        by_split: dict[str, list] = {"train": [], "val": [], "test": []}
        for ref in refs:
            split = {"testA": "test", "testB": "test"}.get(ref["split"], ref["split"])
            if split in by_split:
                by_split[split].append(ref)
        s, d = self.image_size, self.cond_dim
        out = {}
        for split, rows in by_split.items():
            rows = rows[: self.max_items] if self.max_items else rows
            if not rows:
                raise DataFormatError(f"{refs_path}: no refs of split {split!r}")
            imgs, masks, conds, refined, texts = [], [], [], [], []
            for ref in rows:
                info, ann = images[ref["image_id"]], anns[ref["ann_id"]]
                path = root / "images" / "train2014" / info["file_name"]
                require_files(root, [str(path.relative_to(root))], HOW["refcoco"])
                im = np.asarray(Image.open(path).convert("RGB"), np.float32) / 255
                h, w = im.shape[:2]
                mk = coco_mask(ann["segmentation"], h, w, str(inst_path))
                imgs.append(_resize(torch.from_numpy(im).permute(2, 0, 1)[None], s, "area"))
                masks.append(_resize(torch.from_numpy(mk)[None, None], s, "nearest"))
                sents = [x["sent"] for x in ref["sentences"]] or [""]
                texts.append((sents[0], sents[-1]))
                conds.append(embed_expression(sents[0], d))
                refined.append(embed_expression(sents[-1], d))
            target = torch.cat(masks)
            n = target.shape[0]
            out[split] = PerceptionDataset(
                _pack(
                    torch.cat(imgs),
                    target,
                    torch.ones_like(target, dtype=torch.bool),
                    {"cond": torch.stack(conds), "refined": torch.stack(refined)},
                    {
                        "obj_masks": target[:, None].clone(),
                        "obj_conds": torch.stack(refined)[:, None],
                        "obj_valid": torch.zeros(n, 1, dtype=torch.bool),
                        **_texts([a for a, _ in texts], [b for _, b in texts], [[b] for _, b in texts]),
                    },
                )
            )
        return out


def _read(path: Path, reader: Any) -> Any:
    """``reader(path)``, or a one-line :class:`DataFormatError` naming ``path`` when the file cannot be parsed."""
    try:
        return reader(path)
    except Exception as err:  # noqa: BLE001 - any parser's failure on a corrupt file becomes one line naming it
        raise DataFormatError(unreadable_data_message("PerceptionDataModule", path, err)) from None


def coco_mask(seg: Any, h: int, w: int, where: str = "instances.json") -> np.ndarray:
    """A COCO ``segmentation`` (polygons ``[[x1, y1, ...], ...]`` or uncompressed RLE ``{"counts": [...], "size":
    [h, w]}``) -> a float32 ``[h, w]`` mask. Compressed (string) RLE needs pycocotools and is refused by name."""
    from PIL import Image, ImageDraw

    if isinstance(seg, list):
        canvas = Image.new("L", (w, h), 0)
        draw = ImageDraw.Draw(canvas)
        for poly in seg:
            if len(poly) >= 6:
                draw.polygon([(poly[i], poly[i + 1]) for i in range(0, len(poly) - 1, 2)], fill=1)
        return np.asarray(canvas, np.float32)
    if isinstance(seg, dict) and isinstance(seg.get("counts"), list):
        rh, rw = seg["size"]
        flat = np.zeros(rh * rw, np.float32)
        pos, val = 0, 0
        for c in seg["counts"]:
            flat[pos : pos + c] = val
            pos, val = pos + c, 1 - val
        return flat.reshape(rw, rh).T.copy()  # column-major
    raise DataFormatError(f"{where}: unsupported segmentation {type(seg).__name__} (compressed RLE needs pycocotools)")
