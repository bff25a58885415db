"""Language-modelling corpus for the causal-LM system: byte-level by default, any ``tokenizers`` file optionally.

Embedded default (no network, real text): the Python standard library that ships with the interpreter, i.e. every
``.py`` source under ``sysconfig.get_paths()["stdlib"]`` (site-packages excluded) plus the ``pydoc_data`` help
topics (English prose; ``prose_only`` keeps the topics alone). Documents are shuffled with the seed, concatenated
(``\\n\\n`` between them), cut at ``max_bytes`` and split contiguously into train / val / test. Tokens are bytes
(``vocab_size = 256``).

Real format (``source=real``): every ``*.txt``, ``*.parquet`` and ``*.arrow`` file in ``data_dir`` (for example a
SlimPajama or FineWeb shard; parquet/arrow read the ``text_column``), tokenised with ``tokenizer_file`` (a
HuggingFace ``tokenizer.json``) when given, bytes otherwise.

Training windows are non-overlapping ``seq_len + 1`` slices (inputs ``[:-1]``, targets ``[1:]``). The test split is
evaluated at every length in ``test_lengths`` on the *same* test tokens, cut into windows of that length, so
perplexities at different lengths are comparable (the length-extrapolation protocol of the stick-breaking paper).
With ``bos_token`` set, every window starts with that token instead (inputs ``[BOS] + w[:-1]``, targets ``w`` for
``seq_len``-token slices ``w``): a fixed, low-information first token, the usual attention-sink position.
"""

from __future__ import annotations

import functools
import random
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules._base import ResumableLoader, SuiteDataModule

SUFFIXES = (".txt", ".parquet", ".arrow")


class WindowDataset(Dataset):
    """Non-overlapping windows of ``seq_len + 1`` tokens from a 1-D token tensor (``seq_len`` tokens after a
    ``bos_token`` when one is given)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, bos_token: int | None = None) -> None:
        self.tokens, self.seq_len, self.bos_token = tokens, seq_len, bos_token
        self.n = (tokens.numel() - 1) // seq_len

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.bos_token is not None:
            w = self.tokens[i * self.seq_len : (i + 1) * self.seq_len].long()
            return {"input_ids": torch.cat([w.new_full((1,), self.bos_token), w[:-1]]), "labels": w}
        w = self.tokens[i * self.seq_len : (i + 1) * self.seq_len + 1].long()
        return {"input_ids": w[:-1], "labels": w[1:]}


@functools.cache
def _stdlib_files(root: Path) -> tuple[str, ...]:
    return tuple(sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "site-packages" not in p.parts))


def stdlib_documents(seed: int, max_bytes: int, prose_only: bool = False) -> list[bytes]:
    """Python's own stdlib sources and pydoc topics, shuffled by ``seed``, until ``max_bytes`` are collected
    (``prose_only``: the pydoc topics alone, about 0.47 MB of English prose)."""
    from pydoc_data.topics import topics

    root = Path(sysconfig.get_paths()["stdlib"])
    files = () if prose_only else _stdlib_files(root)
    docs: list[Any] = [("topic", k) for k in sorted(topics)] + [("file", f) for f in files]
    random.Random(seed).shuffle(docs)
    out, total = [], 0
    for kind, name in docs:
        data = topics[name].encode() if kind == "topic" else (root / name).read_bytes()
        out.append(data)
        total += len(data) + 2
        if total >= max_bytes:
            break
    return out


def read_documents(path: Path, text_column: str) -> list[str | bytes]:
    """Documents of one ``.txt`` / ``.parquet`` / ``.arrow`` file (``DataFormatError`` names file and row)."""
    if path.suffix == ".txt":
        return [path.read_bytes()]
    import pyarrow as pa

    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        else:  # HF datasets write the IPC stream format; plain Arrow files use the file format
            try:
                with pa.memory_map(str(path)) as src:
                    table = pa.ipc.open_stream(src).read_all()
            except pa.ArrowInvalid:
                with pa.memory_map(str(path)) as src:
                    table = pa.ipc.open_file(src).read_all()
    except (pa.ArrowInvalid, OSError) as err:
        raise DataFormatError(f"{path}: not a readable {path.suffix[1:]} file ({err})") from None
    if text_column not in table.column_names:
        raise DataFormatError(f"{path}: no column {text_column!r} (columns: {table.column_names})")
    texts = table.column(text_column).to_pylist()
    for row, t in enumerate(texts):
        if not isinstance(t, str):
            raise DataFormatError(f"{path}: row {row} of column {text_column!r} is {type(t).__name__}, not text")
    return texts


class TextDataModule(SuiteDataModule):
    """Causal-LM text corpus (byte-level stdlib text by default).

    Args:
        seq_len: Training / validation context ``T``.
        test_lengths: Contexts the test split is evaluated at (default ``[seq_len]``).
        vocab_size: Model vocabulary; must cover the tokenizer (256 for bytes).
        max_bytes: Corpus size cap (``None``: everything, real source only).
        val_fraction: Fraction of tokens for validation.
        test_fraction: Fraction of tokens for test.
        tokenizer_file: ``tokenizer.json`` for the real source (``None``: bytes).
        text_column: Text column of parquet/arrow files.
        bos_token: Token id put first in every window (``None``: plain windows); must be ``< vocab_size`` and, for
            bytes, ``>= 256`` (e.g. ``256`` with ``vocab_size: 257``) so that it never occurs in the text.
        prose_only: Embedded source: the ``pydoc_data`` help topics alone (English prose, about 0.47 MB) instead of
            stdlib sources + topics.
        source, data_dir, batch_size, num_workers, seed: see :class:`SuiteDataModule`.
    """

    def __init__(
        self,
        seq_len: int = 128,
        test_lengths: Sequence[int] | None = None,
        vocab_size: int = 256,
        max_bytes: int | None = 2_000_000,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        tokenizer_file: str | None = None,
        text_column: str = "text",
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
        bos_token: int | None = None,
        prose_only: bool = False,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        if prose_only and source != "embedded":
            raise ConfigError("data.prose_only=true selects the embedded corpus's prose; it needs data.source=embedded")
        self.prose_only = bool(prose_only)
        if seq_len < 1:
            raise ConfigError(f"data.seq_len={seq_len} must be >= 1")
        self.test_lengths = list(test_lengths) if test_lengths else [seq_len]
        if any(t < 1 for t in self.test_lengths):
            raise ConfigError(f"data.test_lengths={self.test_lengths} must all be >= 1")
        if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ConfigError(
                f"data.val_fraction={val_fraction}, test_fraction={test_fraction}: each in (0, 1), sum < 1"
            )
        if max_bytes is not None and max_bytes < 1000:
            raise ConfigError(f"data.max_bytes={max_bytes} must be >= 1000 (or null)")
        if tokenizer_file is None and vocab_size < 256:
            raise ConfigError(f"data.vocab_size={vocab_size} must be >= 256 for byte-level tokens")
        self.seq_len, self.vocab_size, self.max_bytes = seq_len, vocab_size, max_bytes
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.tokenizer_file, self.text_column = tokenizer_file, text_column
        if bos_token is not None and not (isinstance(bos_token, int) and 0 <= bos_token < vocab_size):
            raise ConfigError(f"data.bos_token={bos_token!r} must be an integer id below data.vocab_size={vocab_size}")
        if bos_token is not None and tokenizer_file is None and bos_token < 256:
            raise ConfigError(f"data.bos_token={bos_token} is a byte value; use 256 (with data.vocab_size >= 257)")
        self.bos_token = bos_token

    def _splits(self, tokens: torch.Tensor) -> dict[str, Any]:
        n = tokens.numel()
        n_val, n_test = int(n * self.val_fraction), int(n * self.test_fraction)
        train, val, test = tokens[: n - n_val - n_test], tokens[n - n_val - n_test : n - n_test], tokens[n - n_test :]
        need = max([self.seq_len, *self.test_lengths]) + 1
        for name, part in (("train", train), ("val", val), ("test", test)):
            if part.numel() < need:
                raise ConfigError(
                    f"the {name} split has {part.numel()} tokens, fewer than one window of {need}: raise data.max_bytes"
                )
        return {
            "train": WindowDataset(train, self.seq_len, self.bos_token),
            "val": WindowDataset(val, self.seq_len, self.bos_token),
            "test": [WindowDataset(test, t, self.bos_token) for t in self.test_lengths],
        }

    def load_embedded(self) -> dict[str, Any]:
        docs = stdlib_documents(self.seed, self.max_bytes or 2_000_000, self.prose_only)
        data = b"\n\n".join(docs)[: self.max_bytes]
        return self._splits(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def load_real(self) -> dict[str, Any]:
        root = Path(self.data_dir)
        files = sorted(p for p in root.glob("*") if p.suffix in SUFFIXES) if root.is_dir() else []
        if not files:
            raise MissingDataError(
                f"no *.txt / *.parquet / *.arrow files in {root}: put a corpus shard there (e.g. a FineWeb-Edu or "
                "SlimPajama parquet file from the HuggingFace hub)"
            )
        docs: list[str | bytes] = []
        for f in files:
            docs.extend(read_documents(f, self.text_column))
        if self.tokenizer_file is None:
            data = b"\n\n".join(d if isinstance(d, bytes) else d.encode() for d in docs)
            data = data[: self.max_bytes] if self.max_bytes else data
            return self._splits(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        tok_path = Path(self.tokenizer_file)
        if not tok_path.is_file():
            raise MissingDataError(f"tokenizer file {tok_path} not found (a HuggingFace tokenizer.json)")
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_path))
        if tok.get_vocab_size() > self.vocab_size:
            raise ConfigError(f"data.vocab_size={self.vocab_size} < tokenizer vocabulary {tok.get_vocab_size()}")
        texts = [d.decode("utf-8", errors="replace") if isinstance(d, bytes) else d for d in docs]
        ids: list[int] = []
        for enc in tok.encode_batch(texts):
            ids.extend(enc.ids)
        return self._splits(torch.tensor(ids, dtype=torch.long))

    def test_dataloader(self) -> list[DataLoader]:
        """One loader per test length; batches hold a constant number of tokens (``batch_size * seq_len / T``)."""
        loaders = []
        for ds in self.datasets["test"]:
            bs = max(1, self.rank_batch_size * self.seq_len // ds.seq_len)
            loaders.append(
                ResumableLoader(ds, batch_size=bs, shuffle=False, seed=self.seed, num_workers=self.num_workers)
            )
        return loaders
