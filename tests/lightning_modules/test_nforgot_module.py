"""N-ForGOT system: the plug-in modules carry gradients unless ``detach_plugins`` (the released behaviour), the
continual schedule fills the accuracy matrix, and bad configurations fail in one line."""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from datamodules.temporal_graph import TemporalGraphDataModule
from lightning_modules.nforgot import NForGOTLitModule
from suite.errors import ConfigError


def write_stream(root, classes=(0, 1, 2, 3), n=40, e=600, seed=0, name="toy"):
    """A homophilous toy stream in the DyGLib layout: nodes 1..n, class = node % len(classes)."""
    rng = np.random.default_rng(seed)
    cls = {u: classes[u % len(classes)] for u in range(1, n + 1)}
    u = rng.integers(1, n + 1, e)
    i = np.array([rng.choice([w for w in range(1, n + 1) if cls[w] == cls[a] and w != a]) for a in u])
    ts = np.sort(rng.uniform(0, 100, e))
    lines = ["u,i,ts,label_u,label_i,idx"] + [f"{a},{b},{t},{cls[a]},{cls[b]},{k}" for k, (a, b, t) in
                                             enumerate(zip(u, i, ts))]  # fmt: skip
    (root / f"{name}.csv").write_text("\n".join(lines) + "\n")
    feats = np.stack([np.eye(len(classes))[classes.index(cls[w])] for w in range(1, n + 1)])
    noisy = feats + rng.normal(0, 0.3, feats.shape)
    np.save(root / f"{name}_node.npy", np.concatenate([np.zeros((1, len(classes))), noisy]))


def make(tmp_path, classes=(0, 1, 2, 3), cumulative=False, events=600, epochs_per_task=2, **model_kw):
    write_stream(tmp_path, classes, e=events)
    dm = TemporalGraphDataModule(
        source="real", data_dir=str(tmp_path), name="toy", node_features="file", classes_per_task=2,
        epochs_per_task=epochs_per_task, batch_size=40, cumulative=cumulative,
    )  # fmt: skip
    kw = dict(in_dim=len(classes), num_classes=2 * math.ceil(len(classes) / 2), classes_per_task=2, dim=16,
              time_dim=8, num_neighbors=4, head_hidden=16, dropout=0.0, head_dropout=0.0)  # fmt: skip
    kw |= model_kw
    model = NForGOTLitModule(optimizer=lambda p: torch.optim.Adam(p, lr=1e-2), **kw)
    trainer = L.Trainer(max_epochs=epochs_per_task * dm_tasks(classes), reload_dataloaders_every_n_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0)  # fmt: skip
    return dm, model, trainer


def dm_tasks(classes):
    return math.ceil(len(classes) / 2)


def plugin_grad(model, dm, task=1):
    """Gradient norm of alpha*class_loss*L_class + beta*mmd_loss*L_disc w.r.t. the encoder, on a task-1 batch."""
    b = dm.stream.examples[task]["train"].subset(torch.arange(20))
    h, S = model._embed(b.node, b.t, b.task, subtree=True)
    with torch.no_grad():
        h0 = model._embed(b.node, b.t, b.task, net=model.prev)
    loss, _ = model._plugins(h, h0, S, b.node, b.t, b.y, task, 0)
    model.zero_grad()
    if loss.requires_grad:
        loss.backward()
    return float(loss), sum(float(p.grad.abs().sum()) for p in model.encoder.parameters() if p.grad is not None)


@pytest.mark.parametrize("discrepancy", ["linear_mmd", "wl"])
def test_plugins_carry_gradients_unless_detached_as_released(tmp_path, discrepancy):
    dm, model, trainer = make(tmp_path, events=300, epochs_per_task=1, discrepancy=discrepancy, class_loss=1.0,
                              wl_neighbors=1)  # fmt: skip
    trainer.fit(model, datamodule=dm)
    assert model.finished == 2 and model.prototypes.shape == (4, 16)
    value, grad = plugin_grad(model, dm)
    # the linear-time MMD^2 estimate is unbiased, so it can be negative on a batch: only its gradient must be > 0
    assert math.isfinite(value) and value != 0.0 and grad > 0
    model.hparams.detach_plugins = True
    value_rel, grad_rel = plugin_grad(model, dm)
    assert value_rel == pytest.approx(value, rel=1e-5) and grad_rel == 0.0  # logged, but trains nothing


def test_continual_schedule_fills_the_accuracy_matrix_and_logs_ap_af(tmp_path):
    dm, model, trainer = make(tmp_path, method="finetune")
    trainer.fit(model, datamodule=dm)
    acc = model.acc
    assert not torch.isnan(acc[0, 0]) and not torch.isnan(acc[:, 1]).any() and torch.isnan(acc[1, 0])
    assert float(acc[1, 1]) > 0.6  # the toy stream is learnable
    trainer.test(model, datamodule=dm, verbose=False)
    m = trainer.callback_metrics
    assert float(m["test/ap"]) == pytest.approx(float(acc[:, 1].mean()), abs=1e-6)
    assert float(m["test/af"]) == pytest.approx(max(float(acc[0, 0] - acc[0, 1]), 0.0), abs=1e-6)


def test_single_class_task_and_joint_need_the_right_mode(tmp_path):
    dm, model, trainer = make(tmp_path, classes=(0, 1, 2))  # task 1 holds class 2 only
    with pytest.raises(ConfigError, match=r"task 1 has a single class \[2\].*model.multihead=false"):
        trainer.fit(model, datamodule=dm)
    dm, model, trainer = make(tmp_path, classes=(0, 1, 2), multihead=False, method="replay")
    trainer.fit(model, datamodule=dm)  # class-incremental: allowed
    assert model.finished == 2 and len(model.replay) == 3 * 20  # 20 per class, classes 0, 1, 2
    dm, model, trainer = make(tmp_path, method="joint")
    with pytest.raises(ConfigError, match="data.cumulative=true"):
        trainer.fit(model, datamodule=dm)
    with pytest.raises(ConfigError, match="model.method='nope'"):
        NForGOTLitModule(method="nope")


def test_tgn_encoder_trains_nforgot_in_time_order_with_gradients_everywhere(tmp_path):
    dm, model, trainer = make(tmp_path, events=300, epochs_per_task=1, encoder="tgn", memory_batch=25, class_loss=1.0)
    trainer.fit(model, datamodule=dm)
    assert dm.chronological and model.finished == 2 and not torch.isnan(model.acc[:, 1]).any()
    train = dm.stream.examples[1]["train"]
    assert torch.equal(dm.datasets["train"].t, train.t.sort().values)  # TGN is served in time order
    assert model.prev.encoder._histories is not model.encoder._histories  # the teacher keeps its own memory
    assert not model.prev.training  # and stays in eval mode when the student trains
    model.train()
    model.encoder.reset_memory()  # chunks computed now carry gradients to the memory modules
    b = train.subset(torch.arange(len(train) - 20, len(train)))  # late queries: many memory chunks before them
    h, S = model._embed(b.node, b.t, b.task, subtree=True)
    with torch.no_grad():
        h0 = model._embed(b.node, b.t, b.task, net=model.prev)
    plug, _ = model._plugins(h, h0, S, b.node, b.t, b.y, 1, 0)
    z, target = model._logits(model._raw_logits(h), b.task, b.y, 1)
    model.zero_grad()
    (F.cross_entropy(z, target) + plug).backward()
    for name, p in model.encoder.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    with pytest.raises(ConfigError, match="model.encoder='gru'"):
        NForGOTLitModule(encoder="gru")
