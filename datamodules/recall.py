"""Synthetic associative-recall tasks for causal LMs: MQAR, key-overwrite recall, S-NIAH-style needle.

Vocabulary layout (``V = vocab_size``): ``0`` filler, ``1`` needle/query marker, keys ``[2, 2 + K)`` and values
``[2 + K, V)`` with ``K = (V - 2) // 2``. Each example is ``input_ids [T]`` with ``labels [T]`` already shifted for
next-token prediction: ``labels[t]`` is the token the model must emit after reading ``input_ids[: t + 1]``, and
``-100`` everywhere except at the recall positions, so token accuracy on labelled positions is recall accuracy.

* ``mqar`` (multi-query associative recall, Arora et al. 2024 "Zoology"; the recall probe of Gated DeltaNet §4):
  ``k_1 v_1 ... k_N v_N`` with distinct keys, then the N keys queried in random order at random later positions
  (``k -> v``), filler elsewhere.
* ``overwrite``: N bindings drawn from a pool of ``num_keys < N`` keys, so keys are re-bound; each query asks for
  the *latest* value. Tests what the delta rule (erase before write) and the gate (forget stale bindings) add.
* ``niah`` (RULER S-NIAH-style single needle): a haystack of random key/value tokens, one needle
  ``1 k v_1 .. v_m`` at a random depth, and the query ``1 k`` at the end; the model must emit ``v_1 .. v_m``.

Every split and every test length is generated from its own seed. ``source=real`` reads ``{train,val,test}.jsonl``
(one ``{"input_ids": [...], "labels": [...]}`` per line) from ``data_dir``; :func:`write_jsonl` writes that format.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from core.errors import ConfigError, DataFormatError
from datamodules._base import SuiteDataModule, require_files

TASKS = ("mqar", "overwrite", "niah")
IGNORE = -100


class TokenDataset(Dataset):
    """``input_ids`` / ``labels`` pairs, both ``[N, T]`` long tensors."""

    def __init__(self, input_ids: torch.Tensor, labels: torch.Tensor) -> None:
        self.input_ids, self.labels = input_ids, labels

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[i], "labels": self.labels[i]}


def _queries(x, y, gen, keys, answers, start):
    """Place each ``(key, answer)`` at a random free 2-token slot after ``start``: ``x[p]=key, x[p+1]=ans``."""
    n, t = x.shape[0], x.shape[1]
    n_q = keys.shape[1]
    slots = (t - start) // 2
    pos = torch.argsort(torch.rand(n, slots, generator=gen), dim=1)[:, :n_q] * 2 + start  # [n, n_q]
    rows = torch.arange(n)[:, None].expand(n, n_q)
    x[rows, pos], x[rows, pos + 1], y[rows, pos] = keys, answers, answers


def generate(
    task: str,
    n: int,
    seq_len: int,
    vocab_size: int,
    num_kv: int,
    seed: int,
    num_keys: int | None = None,
    needle_len: int = 2,
) -> TokenDataset:
    """Generate ``n`` examples of ``task`` (see module docstring) of length ``seq_len``."""
    gen = torch.Generator().manual_seed(int(seed))
    k_count = (vocab_size - 2) // 2
    key_lo, val_lo, val_count = 2, 2 + k_count, vocab_size - 2 - k_count
    x = torch.zeros(n, seq_len, dtype=torch.long)
    y = torch.full((n, seq_len), IGNORE, dtype=torch.long)
    if task in ("mqar", "overwrite"):
        pool = num_kv if task == "mqar" else (num_keys or max(1, num_kv // 2))
        key_ids = torch.argsort(torch.rand(n, k_count, generator=gen), dim=1)[:, :pool] + key_lo  # distinct keys
        if task == "mqar":
            keys = key_ids
        else:
            keys = torch.gather(key_ids, 1, torch.randint(0, pool, (n, num_kv), generator=gen))
        vals = torch.randint(0, val_count, (n, num_kv), generator=gen) + val_lo
        x[:, 0 : 2 * num_kv : 2], x[:, 1 : 2 * num_kv : 2] = keys, vals
        if task == "mqar":
            order = torch.argsort(torch.rand(n, num_kv, generator=gen), dim=1)
            q_keys, q_vals = torch.gather(keys, 1, order), torch.gather(vals, 1, order)
        else:  # query every distinct key that occurs; answer = its latest value
            latest = torch.zeros(n, vocab_size, dtype=torch.long)
            rows = torch.arange(n)
            for j in range(num_kv):
                latest[rows, keys[:, j]] = vals[:, j]
            q_keys = key_ids[:, torch.randperm(pool, generator=gen)]
            present = (keys[:, :, None] == q_keys[:, None, :]).any(1)  # [n, pool]
            # absent keys are re-queried with a present one (key 0 of the sequence always exists)
            q_keys = torch.where(present, q_keys, keys[:, :1])
            q_vals = torch.gather(latest, 1, q_keys)
        _queries(x, y, gen, q_keys, q_vals, 2 * num_kv)
    elif task == "niah":
        x = torch.randint(2, vocab_size, (n, seq_len), generator=gen)
        key = torch.randint(0, k_count, (n,), generator=gen) + key_lo
        val = torch.randint(0, val_count, (n, needle_len), generator=gen) + val_lo
        needle = torch.cat([torch.ones(n, 1, dtype=torch.long), key[:, None], val], dim=1)  # [n, 2 + m]
        query_at = seq_len - needle_len - 2
        depth = (torch.rand(n, generator=gen) * (query_at - needle.shape[1] + 1)).long()
        for i in range(n):
            d = int(depth[i])
            x[i, d : d + needle.shape[1]] = needle[i]
        x[:, query_at], x[:, query_at + 1] = 1, key
        x[:, query_at + 2 :] = val
        y[:, query_at + 1 : query_at + 1 + needle_len] = val
        x[:, -1] = 0  # last target is never read
    else:
        raise ConfigError(f"data.task={task!r} must be one of {list(TASKS)}")
    return TokenDataset(x, y)


def write_jsonl(path: str | Path, ds: TokenDataset) -> None:
    """Write a dataset in the ``source=real`` format (one JSON object per line)."""
    with open(path, "w") as fh:
        for i in range(len(ds)):
            fh.write(json.dumps({"input_ids": ds.input_ids[i].tolist(), "labels": ds.labels[i].tolist()}) + "\n")


def read_jsonl(path: Path, vocab_size: int) -> TokenDataset:
    """Read ``{"input_ids", "labels"}`` lines of equal length; :class:`DataFormatError` names file and row."""
    xs, ys = [], []
    with open(path) as fh:
        for row, line in enumerate(fh, start=1):
            try:
                obj = json.loads(line)
                x, y = obj["input_ids"], obj["labels"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DataFormatError(f"{path}: row {row} is not a JSON object with input_ids and labels") from None
            if len(x) != len(y) or (xs and len(x) != len(xs[0])):
                raise DataFormatError(f"{path}: row {row} has lengths {len(x)}/{len(y)}; all rows must be equal")
            if any(not isinstance(t, int) or not 0 <= t < vocab_size for t in x):
                raise DataFormatError(f"{path}: row {row} has a token outside [0, {vocab_size})")
            xs.append(x)
            ys.append(y)
    if not xs:
        raise DataFormatError(f"{path}: no rows")
    return TokenDataset(torch.tensor(xs), torch.tensor(ys))


class RecallDataModule(SuiteDataModule):
    """MQAR / key-overwrite / S-NIAH recall data for the causal-LM system.

    Args:
        task: ``mqar``, ``overwrite`` or ``niah``.
        vocab_size: ``V`` (keys and values split the non-special tokens).
        seq_len: Training / validation length ``T``.
        num_kv: Bindings per sequence (mqar, overwrite).
        num_keys: Distinct keys per sequence in ``overwrite`` (default ``num_kv // 2``).
        needle_len: Value tokens of the needle (niah).
        n_train: Training examples.
        n_val: Validation examples.
        n_test: Test examples per test length.
        test_lengths: Lengths the test split is generated at (default ``[seq_len]``).
        source, data_dir, batch_size, num_workers, seed: see :class:`SuiteDataModule`.
    """

    def __init__(
        self,
        task: str = "mqar",
        vocab_size: int = 64,
        seq_len: int = 64,
        num_kv: int = 8,
        num_keys: int | None = None,
        needle_len: int = 2,
        n_train: int = 2000,
        n_val: int = 200,
        n_test: int = 200,
        test_lengths: Sequence[int] | None = None,
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        if task not in TASKS:
            raise ConfigError(f"data.task={task!r} must be one of {list(TASKS)}")
        if vocab_size < 6:
            raise ConfigError(f"data.vocab_size={vocab_size} must be >= 6 (filler, marker, keys, values)")
        lengths = list(test_lengths) if test_lengths else [seq_len]
        k_count = (vocab_size - 2) // 2
        for name, t in [("seq_len", seq_len)] + [("test_lengths", t) for t in lengths]:
            if task in ("mqar", "overwrite") and t < 4 * num_kv:
                raise ConfigError(f"data.{name}={t} must be >= 4 * num_kv = {4 * num_kv} (bindings + queries)")
            if task == "niah" and t < 2 * needle_len + 6:
                raise ConfigError(f"data.{name}={t} must be >= 2 * needle_len + 6 = {2 * needle_len + 6}")
        if task == "mqar" and num_kv > k_count:
            raise ConfigError(f"data.num_kv={num_kv} must be <= the {k_count} keys of vocab_size={vocab_size}")
        if task == "overwrite" and num_keys is not None and not 1 <= num_keys <= min(num_kv, k_count):
            raise ConfigError(f"data.num_keys={num_keys} must be in [1, min(num_kv, {k_count})]")
        for name, n in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
            if n < 1:
                raise ConfigError(f"data.{name}={n} must be >= 1")
        self.task, self.vocab_size, self.seq_len, self.num_kv = task, vocab_size, seq_len, num_kv
        self.num_keys, self.needle_len = num_keys, needle_len
        self.n_train, self.n_val, self.n_test = n_train, n_val, n_test
        self.test_lengths = lengths

    def _gen(self, n: int, t: int, seed: int) -> TokenDataset:
        return generate(self.task, n, t, self.vocab_size, self.num_kv, seed, self.num_keys, self.needle_len)

    def load_embedded(self) -> dict[str, Any]:
        s = self.seed * 1000
        return {
            "train": self._gen(self.n_train, self.seq_len, s + 1),
            "val": self._gen(self.n_val, self.seq_len, s + 2),
            "test": [self._gen(self.n_test, t, s + 3 + i) for i, t in enumerate(self.test_lengths)],
        }

    def load_real(self) -> dict[str, Any]:
        names = ["train.jsonl", "val.jsonl", "test.jsonl"]
        how = "Write them with datamodules.recall.write_jsonl (one {input_ids, labels} object per line)."
        paths = require_files(self.data_dir, names, how)
        out = {split: read_jsonl(p, self.vocab_size) for split, p in zip(("train", "val", "test"), paths)}
        out["test"] = [out["test"]]
        self.test_lengths = [out["test"][0].input_ids.shape[1]]
        return out

    def test_dataloader(self) -> list[DataLoader]:
        return [self._loader_for(ds) for ds in self.datasets["test"]]

    def _loader_for(self, ds: Dataset) -> DataLoader:
        self.datasets["_test_one"] = ds
        loader = self.loader("_test_one", shuffle=False)
        del self.datasets["_test_one"]
        return loader
