"""Byte-level text corpus: embedded stdlib text and the txt / parquet / arrow (+ tokenizer) real-format loader."""

from __future__ import annotations

import pytest
import torch

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules.text import TextDataModule, stdlib_documents


def test_stdlib_documents_are_real_python_and_prose():
    docs = stdlib_documents(seed=0, max_bytes=300_000)
    text = b"".join(docs)
    assert len(text) >= 300_000 and b"def " in text and b"import " in text
    assert docs == stdlib_documents(seed=0, max_bytes=300_000)  # deterministic


def test_prose_only_corpus_is_the_pydoc_topics():
    from pydoc_data.topics import topics

    docs = stdlib_documents(seed=0, max_bytes=10**9, prose_only=True)
    assert sorted(docs) == sorted(v.encode() for v in topics.values())  # every topic, no stdlib source file
    dm = TextDataModule(seq_len=64, max_bytes=None, prose_only=True, batch_size=4)
    dm.setup()
    n = sum(len(d) + 2 for d in docs) - 2
    assert sum(dm.datasets[k].tokens.numel() for k in ("train", "val")) + dm.datasets["test"][0].tokens.numel() == n
    with pytest.raises(ConfigError, match="data.prose_only=true .* needs data.source=embedded"):
        TextDataModule(source="real", prose_only=True)


def test_embedded_windows_and_lengths():
    dm = TextDataModule(seq_len=64, test_lengths=[64, 128], max_bytes=200_000, batch_size=4)
    dm.setup()
    item = dm.datasets["train"][0]
    assert item["input_ids"].shape == (64,) and torch.equal(item["input_ids"][1:], item["labels"][:-1])
    t64, t128 = dm.datasets["test"]
    assert len(t64) == (t64.tokens.numel() - 1) // 64 and len(t128) == (t128.tokens.numel() - 1) // 128
    assert torch.equal(t64.tokens, t128.tokens)  # the same test text at every length
    assert dm.datasets["train"].tokens.numel() > 0.85 * 200_000
    loaders = dm.test_dataloader()
    assert [ld.batch_size for ld in loaders] == [4, 2]  # constant tokens per test batch


def test_bos_token_windows_and_errors():
    dm = TextDataModule(seq_len=16, max_bytes=20_000, batch_size=4, vocab_size=257, bos_token=256)
    dm.setup()
    plain = TextDataModule(seq_len=16, max_bytes=20_000, batch_size=4)
    plain.setup()
    item, ref = dm.datasets["train"][1], plain.datasets["train"][1]
    assert item["input_ids"][0] == 256 and (item["input_ids"][1:] < 256).all()
    assert torch.equal(item["input_ids"][1:], item["labels"][:-1]) and item["labels"].shape == (16,)
    assert torch.equal(item["labels"], ref["input_ids"])  # the same 16-token slices, shifted behind the BOS
    with pytest.raises(ConfigError, match="bos_token"):
        TextDataModule(seq_len=16, bos_token=256)  # vocab_size 256 has no room for it
    with pytest.raises(ConfigError, match="byte value"):
        TextDataModule(seq_len=16, bos_token=10)


def _write_shards(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"document {i}: the quick brown fox jumps over the lazy dog. " * 20 for i in range(40)]
    pq.write_table(pa.table({"text": texts[:20]}), tmp_path / "a.parquet")
    with (
        pa.OSFile(str(tmp_path / "b.arrow"), "wb") as sink,
        pa.ipc.new_stream(sink, pa.schema([("text", pa.string())])) as w,
    ):
        w.write_table(pa.table({"text": texts[20:]}))
    (tmp_path / "c.txt").write_text("plain text file " * 100)
    return texts


def test_real_parquet_arrow_txt_bytes(tmp_path):
    texts = _write_shards(tmp_path)
    dm = TextDataModule(source="real", data_dir=str(tmp_path), seq_len=32, max_bytes=None, batch_size=2)
    dm.setup()
    total = sum(len(t) for t in texts) + len("plain text file " * 100) + 2 * 40
    n = sum(d.tokens.numel() for d in (dm.datasets["train"], dm.datasets["val"], dm.datasets["test"][0]))
    assert n == total
    assert bytes(dm.datasets["train"].tokens[:10].tolist()) == b"document 0"


def test_real_with_tokenizer_file(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    texts = _write_shards(tmp_path)
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    dm = TextDataModule(
        source="real",
        data_dir=str(tmp_path),
        seq_len=16,
        vocab_size=100,
        tokenizer_file=str(tmp_path / "tokenizer.json"),
        max_bytes=None,
        batch_size=2,
    )
    dm.setup()
    first = dm.datasets["train"].tokens[:3].tolist()
    assert first == tok.encode("document 0:").ids
    assert int(dm.datasets["train"].tokens.max()) < tok.get_vocab_size()
    small = TextDataModule(
        source="real", data_dir=str(tmp_path), vocab_size=3, tokenizer_file=str(tmp_path / "tokenizer.json")
    )
    with pytest.raises(ConfigError, match="tokenizer vocabulary"):
        small.setup()


def test_real_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pytest.raises(MissingDataError, match="no \\*.txt"):
        TextDataModule(source="real", data_dir=str(tmp_path)).setup()
    pq.write_table(pa.table({"text": ["ok", None]}), tmp_path / "bad.parquet")
    with pytest.raises(DataFormatError, match=r"bad.parquet: row 1"):
        TextDataModule(source="real", data_dir=str(tmp_path)).setup()
    pq.write_table(pa.table({"content": ["ok"]}), tmp_path / "bad.parquet")
    with pytest.raises(DataFormatError, match="no column 'text'"):
        TextDataModule(source="real", data_dir=str(tmp_path)).setup()
    with pytest.raises(ConfigError, match="val_fraction"):
        TextDataModule(val_fraction=0.6, test_fraction=0.5)
