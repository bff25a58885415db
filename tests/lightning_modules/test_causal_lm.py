"""CausalLMLitModule: loss/ppl/acc metrics, multi-length test, parameter groups, learning on recall."""

from __future__ import annotations

import functools
import math

import lightning.pytorch as pl
import pytest
import torch

from datamodules.recall import RecallDataModule
from layers.lm import CausalLM
from lightning_modules import gated_deltanet, ostquant, stickbreaking, systematic_outliers
from lightning_modules._shared.causal_lm import CausalLMLitModule


def tiny_system(mixer, vocab=24, lr=1e-2):
    net = CausalLM(vocab, 32, 2, mixer=mixer)
    opt = functools.partial(torch.optim.AdamW, lr=lr, weight_decay=0.1)
    return CausalLMLitModule(net, optimizer=opt)


def trainer(**kw):
    kw.setdefault("max_steps", 5)
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


def test_the_language_model_papers_share_one_system():
    for paper in (gated_deltanet, stickbreaking, systematic_outliers, ostquant):
        assert paper.CausalLMLitModule is CausalLMLitModule, f"{paper.__name__} exports another causal-LM system"


def test_parameter_groups_exclude_gates_and_norms():
    model = tiny_system({"kind": "gated_deltanet", "num_heads": 2, "chunk_size": 8})
    decay, no_decay = model.trainable_parameters()
    ids = {id(p) for p in no_decay["params"]}
    gdn = model.net.blocks[0].mixer
    assert id(gdn.A_log) in ids and id(gdn.dt_bias) in ids and id(model.net.norm.weight) in ids
    assert id(gdn.q_proj.weight) not in ids and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_multi_length_test_metrics_and_ppl():
    torch.manual_seed(0)
    dm = RecallDataModule(
        "mqar",
        vocab_size=24,
        seq_len=16,
        num_kv=2,
        n_train=32,
        n_val=16,
        n_test=16,
        test_lengths=[16, 32],
        batch_size=8,
    )
    model = tiny_system({"kind": "softmax", "num_heads": 2, "position": "nope"})
    t = trainer(max_steps=2, limit_val_batches=1)
    t.fit(model, datamodule=dm)
    out = t.test(model, datamodule=dm)
    metrics = {k: v for d in out for k, v in d.items()}
    for length in (16, 32):
        assert math.isclose(metrics[f"test/ppl_len{length}"], math.exp(metrics[f"test/loss_len{length}"]), rel_tol=1e-5)
        assert 0.0 <= metrics[f"test/acc_len{length}"] <= 1.0
    assert metrics["test/loss"] == metrics["test/loss_len16"]
    assert metrics["test/loss_len16"] != metrics["test/loss_len32"]
    # an untrained model is near uniform over the vocabulary
    assert 0.5 * math.log(24) < metrics["test/loss_len16"] < 2 * math.log(24)


def test_val_metrics_match_manual_computation():
    torch.manual_seed(0)
    dm = RecallDataModule("mqar", vocab_size=24, seq_len=16, num_kv=2, n_train=8, n_val=16, n_test=8, batch_size=8)
    model = tiny_system({"kind": "gated_deltanet", "num_heads": 2, "chunk_size": 8})
    t = trainer(max_steps=0, limit_val_batches=2)
    out = t.validate(model, datamodule=dm)[0]
    batch = dm.datasets["val"][:]
    with torch.no_grad():
        logits = model(batch["input_ids"])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    mask = batch["labels"] != -100
    acc = ((logits.argmax(-1) == batch["labels"]) & mask).sum() / mask.sum()
    assert out["val/loss"] == pytest.approx(float(loss), rel=1e-5)
    assert out["val/acc"] == pytest.approx(float(acc), rel=1e-5)


@pytest.mark.slow
def test_gdn_learns_recall():
    """A tiny GDN learns MQAR well above chance (1/11 values) in 150 steps (~10 s of CPU)."""
    torch.manual_seed(0)
    dm = RecallDataModule("mqar", vocab_size=24, seq_len=16, num_kv=2, n_train=512, n_val=64, n_test=128, batch_size=32)
    model = tiny_system({"kind": "gated_deltanet", "num_heads": 2, "chunk_size": 8}, lr=1e-2)
    t = trainer(max_steps=150, max_epochs=100, limit_val_batches=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread is faster than two contended ones
    try:
        t.fit(model, datamodule=dm)
        out = t.test(model, datamodule=dm)[0]
    finally:
        torch.set_num_threads(threads)
    assert out["test/acc"] > 0.3, out  # chance is 1/11; a plain-torch run of this setup reaches 0.51
