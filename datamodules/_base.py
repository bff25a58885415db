"""What every suite DataModule shares: embedded-vs-real switch, per-rank batches, seeded splits, resumable loaders.

A subclass implements ``load_embedded()`` (data that needs no network) and ``load_real()`` (the paper's own
format, read from ``data_dir``), each returning a dict of datasets (``train``/``val``/``test``, plus extras), and
uses :meth:`SuiteDataModule.loader` to build its loaders.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, Sampler

from core.errors import ConfigError, DataFormatError, MissingDataError, SuiteError

SOURCES = ("embedded", "real")


def world() -> tuple[int, int]:
    """(rank, world size) of the current process group, (0, 1) outside distributed runs."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def per_rank_batch_size(global_batch_size: int, world_size: int) -> int:
    """Split the global batch over ranks; a global batch that does not divide is a configuration error."""
    if global_batch_size < 1:
        raise ConfigError(f"data.batch_size={global_batch_size} must be >= 1")
    if global_batch_size % world_size:
        raise ConfigError(
            f"data.batch_size={global_batch_size} must be divisible by the world size ({world_size} processes)"
        )
    return global_batch_size // world_size


def require_files(root: str | Path, names: Sequence[str], how_to_get: str) -> list[Path]:
    """Return ``root/name`` for each name, or raise :class:`MissingDataError` listing every missing one."""
    root = Path(root)
    paths = [root / n for n in names]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise MissingDataError(f"missing data file(s): {', '.join(missing)}. {how_to_get}")
    return paths


def _file_of(err: BaseException, data_dir: str | Path) -> str | None:
    """The data file a reader failed on: the exception's ``filename``, else the innermost ``Path``/``str`` local of
    the traceback that names an existing file under ``data_dir``."""
    name = getattr(err, "filename", None)
    if name:
        return str(name)
    root = Path(data_dir).resolve()
    tb, found = err.__traceback__, None
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            if isinstance(value, (str, Path)) and len(str(value)) < 4096:
                try:
                    p = Path(value).resolve()
                    if p.is_file() and p.is_relative_to(root):
                        found = str(value)
                except (OSError, ValueError):
                    continue
        tb = tb.tb_next
    return found


def unreadable_data_message(owner: str, data_dir: str | Path, err: BaseException) -> str:
    """One line for a real-format file that exists but cannot be read: which file, why, and what to do."""
    reason = " ".join(str(err).split())[:200] or type(err).__name__
    where = _file_of(err, data_dir)
    what = f"data file {where}" if where else f"the dataset under data.data_dir={data_dir}"
    return (
        f"{owner}: cannot read {what} ({type(err).__name__}: {reason}); the file is corrupt or not in the "
        "expected format: download it again (see the method's docs page, Data) or use data.source=embedded"
    )


def seeded_permutation(n: int, seed: int) -> torch.Tensor:
    """A permutation of ``range(n)`` that depends only on ``seed``."""
    g = torch.Generator().manual_seed(int(seed))
    return torch.randperm(n, generator=g)


def split_indices(n: int, fractions: Sequence[float], seed: int) -> list[torch.Tensor]:
    """Seeded split of ``range(n)`` into parts of the given fractions (the last part takes the remainder)."""
    if any(f < 0 for f in fractions) or sum(fractions) > 1 + 1e-9:
        raise ConfigError(f"split fractions {list(fractions)} must be >= 0 and sum to <= 1")
    perm = seeded_permutation(n, seed)
    out, start = [], 0
    for i, f in enumerate(fractions):
        stop = n if i == len(fractions) - 1 and math.isclose(sum(fractions), 1.0) else start + int(round(f * n))
        out.append(perm[start:stop])
        start = stop
    return out


class ResumableSampler(Sampler[int]):
    """Seeded, rank-sharded sampler whose position can be saved and restored.

    The order of epoch ``e`` is ``randperm(n, seed + e)`` (or ``range(n)``), padded to a multiple of the world
    size and dealt round-robin to ranks, as ``DistributedSampler`` does. ``skip`` samples are dropped from the
    start of the next iteration (set when resuming mid-epoch).
    """

    def __init__(self, n: int, shuffle: bool, seed: int) -> None:
        self.n, self.shuffle, self.seed = n, shuffle, seed
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _indices(self) -> list[int]:
        rank, size = world()
        order = seeded_permutation(self.n, self.seed + self.epoch).tolist() if self.shuffle else list(range(self.n))
        if size > 1:
            total = math.ceil(self.n / size) * size
            order = (order + order[: total - self.n])[rank:total:size]
        return order

    def __iter__(self) -> Iterator[int]:
        order = self._indices()[self.skip :]
        self.skip = 0
        return iter(order)

    def __len__(self) -> int:
        rank, size = world()
        return math.ceil(self.n / size)


class ResumableLoader(DataLoader):
    """A :class:`DataLoader` with ``state_dict``/``load_state_dict``: Lightning saves how many batches of the
    current epoch were consumed and a restarted run skips exactly those (no replayed or lost batches)."""

    def __init__(self, dataset: Dataset, *, batch_size: int, shuffle: bool, seed: int, **kwargs: Any) -> None:
        # Lightning re-creates loaders with an injected sampler for `overfit_batches` (sequential order), passing
        # `shuffle=`/`sampler=` by keyword: the arguments after `dataset` are keyword-only so they cannot clash.
        injected = kwargs.pop("sampler", None)
        kwargs.pop("batch_sampler", None)
        if injected is not None and not isinstance(injected, ResumableSampler):
            shuffle = False
        self.shuffle, self.seed = shuffle, seed
        self.resumable_sampler = ResumableSampler(len(dataset), shuffle, seed)  # type: ignore[arg-type]
        super().__init__(dataset, batch_size=batch_size, sampler=self.resumable_sampler, **kwargs)
        self._consumed = 0

    def __iter__(self) -> Iterator[Any]:
        start = self._consumed if self.resumable_sampler.skip else 0
        self._consumed = start
        for batch in super().__iter__():
            self._consumed += 1
            yield batch
        self._consumed = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.resumable_sampler.epoch, "batches": self._consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resumable_sampler.epoch = int(state["epoch"])
        self._consumed = int(state["batches"])
        self.resumable_sampler.skip = self._consumed * int(self.batch_size or 1)


class SuiteDataModule(LightningDataModule):
    """Base DataModule: ``source`` picks the embedded default or the real-format loader.

    Args:
        source: ``embedded`` (ships with a dependency or is generated; no network) or ``real`` (reads ``data_dir``,
            downloading first where the ecosystem's loader can).
        data_dir: Folder of the real dataset.
        batch_size: Global batch size; each of the ``W`` ranks gets ``batch_size / W``.
        num_workers: DataLoader workers.
        seed: Seed of splits and shuffling.
    """

    def __init__(
        self,
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if source not in SOURCES:
            raise ConfigError(f"data.source={source!r} must be one of {list(SOURCES)}")
        if num_workers < 0:
            raise ConfigError(f"data.num_workers={num_workers} must be >= 0")
        per_rank_batch_size(batch_size, 1)
        self.source, self.data_dir = source, data_dir
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.datasets: dict[str, Any] = {}

    # -- to implement -------------------------------------------------------------------------------------------
    def load_embedded(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_real(self) -> dict[str, Any]:
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if not self.datasets:
            if self.source != "real":
                self.datasets = self.load_embedded()
                return
            try:
                self.datasets = self.load_real()
            except SuiteError:
                raise
            except Exception as err:  # noqa: BLE001 - any reader's failure on a bad file becomes one clear line
                raise DataFormatError(unreadable_data_message(type(self).__name__, self.data_dir, err)) from None

    @property
    def rank_batch_size(self) -> int:
        size = self.trainer.world_size if self.trainer is not None else world()[1]
        return per_rank_batch_size(self.batch_size, size)

    def loader(self, split: str, shuffle: bool | None = None, **kwargs: Any) -> DataLoader:
        """A resumable loader over ``self.datasets[split]`` (shuffled for ``train`` unless told otherwise)."""
        if split not in self.datasets:
            raise ConfigError(f"{type(self).__name__} has no {split!r} split (has {sorted(self.datasets)})")
        shuffle = split == "train" if shuffle is None else shuffle
        kwargs.setdefault("num_workers", self.num_workers)
        kwargs.setdefault("persistent_workers", self.num_workers > 0)
        return ResumableLoader(
            self.datasets[split], batch_size=self.rank_batch_size, shuffle=shuffle, seed=self.seed, **kwargs
        )

    def train_dataloader(self) -> DataLoader:
        return self.loader("train")

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test")
