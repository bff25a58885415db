"""N-ForGOT system: the plug-in modules carry gradients unless ``detach_plugins`` (the released behaviour), the
continual schedule fills the accuracy matrix, and bad configurations fail in one line."""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from core.errors import ConfigError
from datamodules.temporal_graph import TemporalGraphDataModule
from lightning_modules.nforgot import NForGOTLitModule


def write_stream(root, classes=(0, 1, 2, 3), n=40, e=600, seed=0, name="toy"):
    """A homophilous toy stream in the DyGLib layout: nodes 1..n, class = node % len(classes)."""
    rng = np.random.default_rng(seed)
    cls = {u: classes[u % len(classes)] for u in range(1, n + 1)}
    u = rng.integers(1, n + 1, e)
    i = np.array([rng.choice([w for w in range(1, n + 1) if cls[w] == cls[a] and w != a]) for a in u])
    ts = np.sort(rng.uniform(0, 100, e))
    lines = ["u,i,ts,label_u,label_i,idx"] + [
        f"{a},{b},{t},{cls[a]},{cls[b]},{k}" for k, (a, b, t) in enumerate(zip(u, i, ts))
    ]
    (root / f"{name}.csv").write_text("\n".join(lines) + "\n")
    feats = np.stack([np.eye(len(classes))[classes.index(cls[w])] for w in range(1, n + 1)])
    noisy = feats + rng.normal(0, 0.3, feats.shape)
    np.save(root / f"{name}_node.npy", np.concatenate([np.zeros((1, len(classes))), noisy]))


def make(tmp_path, classes=(0, 1, 2, 3), cumulative=False, events=600, epochs_per_task=2, **model_kw):
    write_stream(tmp_path, classes, e=events)
    dm = TemporalGraphDataModule(
        source="real",
        data_dir=str(tmp_path),
        name="toy",
        node_features="file",
        classes_per_task=2,
        epochs_per_task=epochs_per_task,
        batch_size=40,
        cumulative=cumulative,
    )
    kw = dict(
        in_dim=len(classes),
        num_classes=2 * math.ceil(len(classes) / 2),
        classes_per_task=2,
        dim=16,
        time_dim=8,
        num_neighbors=4,
        head_hidden=16,
        dropout=0.0,
        head_dropout=0.0,
    )
    kw |= model_kw
    model = NForGOTLitModule(optimizer=lambda p: torch.optim.Adam(p, lr=1e-2), **kw)
    trainer = L.Trainer(
        max_epochs=epochs_per_task * dm_tasks(classes),
        reload_dataloaders_every_n_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    return dm, model, trainer


def dm_tasks(classes):
    return math.ceil(len(classes) / 2)


def plugin_grad(model, dm, task=1):
    """Gradient norm of alpha*class_loss*L_class + beta*mmd_loss*L_disc w.r.t. the encoder, on a task-1 batch."""
    b = dm.stream.examples[task]["train"].subset(torch.arange(20))
    h, S = model._embed(b.node, b.t, b.task, subtree=True)
    with torch.no_grad():
        h0 = model._embed(b.node, b.t, b.task, net=model.prev)
    weighted, _ = model._plugins(h, h0, S, b.node, b.t, b.y, task, 0)
    loss = sum(weighted.values())
    model.zero_grad()
    if loss.requires_grad:
        loss.backward()
    return float(loss), sum(float(p.grad.abs().sum()) for p in model.encoder.parameters() if p.grad is not None)


@pytest.mark.parametrize("discrepancy", ["linear_mmd", "wl"])
def test_plugins_carry_gradients_unless_detached_as_released(tmp_path, discrepancy):
    dm, model, trainer = make(
        tmp_path, events=300, epochs_per_task=1, discrepancy=discrepancy, class_loss=1.0, wl_neighbors=1
    )
    trainer.fit(model, datamodule=dm)
    assert model.finished == 2 and model.prototypes.shape == (4, 16)
    value, grad = plugin_grad(model, dm)
    # the linear-time MMD^2 estimate is unbiased, so it can be negative on a batch: only its gradient must be > 0
    assert math.isfinite(value) and value != 0.0 and grad > 0
    model.hparams.detach_plugins = True
    value_rel, grad_rel = plugin_grad(model, dm)
    assert value_rel == pytest.approx(value, rel=1e-5) and grad_rel == 0.0  # logged, but trains nothing


def test_continual_schedule_fills_the_accuracy_matrix_and_logs_ap_af(tmp_path):
    L.seed_everything(0)  # one split and initialisation of the toy: the learnability bar below reads a fixed run
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
    weighted, _ = model._plugins(h, h0, S, b.node, b.t, b.y, 1, 0)
    plug = sum(weighted.values())
    z, target = model._logits(model._raw_logits(h), b.task, b.y, 1)
    model.zero_grad()
    (F.cross_entropy(z, target) + plug).backward()
    for name, p in model.encoder.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    with pytest.raises(ConfigError, match="model.encoder='gru'"):
        NForGOTLitModule(encoder="gru")


# -- the discrepancy is wired as the official model (subtree rows, pairing, prototypes) -------------------------


def neighbour_row_grad(model, b):
    """Parameter-gradient norm that flows *through the neighbour rows* of the subtrees, and through the own row,
    when the discrepancy between two halves of ``b`` is backpropagated."""
    from ops.nforgot.losses import linear_time_mmd

    h, S = model._embed(b.node, b.t, b.task, subtree=True)
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for rows in (slice(0, -1), slice(-1, None)):
        part = torch.zeros_like(S)
        part[:, rows] = 1.0
        x = S * part + (S * (1 - part)).detach()  # gradient only through the chosen rows
        loss = linear_time_mmd(x[: len(b) // 2], x[len(b) // 2 :])
        grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
        out.append(sum(float(g.abs().sum()) for g in grads if g is not None))
    return out


@pytest.mark.parametrize("encoder", ["tgat", "tgn"])
def test_discrepancy_neighbour_rows_carry_no_gradient_as_the_official_subtree(tmp_path, encoder):
    dm, model, trainer = make(tmp_path, events=300, epochs_per_task=1, encoder=encoder, memory_batch=25)
    dm.setup()
    model.stream, model.x = dm.stream, dm.stream.graph.x
    train = dm.stream.examples[1]["train"]
    b = train.subset(torch.arange(len(train) - 40, len(train)))  # late queries: every row has neighbours
    nbr, own = neighbour_row_grad(model, b)
    assert nbr == 0.0 and own > 0  # official: only the node's own embedding moves
    model.hparams.subtree_neighbours = "reembed"  # every row trainable: the whole neighbourhood moves
    nbr, own = neighbour_row_grad(model, b)
    assert nbr > 0 and own > 0


def test_memory_sample_has_the_batch_structure_so_one_task_scores_zero():
    """Two samples of the *same* task's events, built as the module builds them (a shuffled training batch and
    ``_memory_batch``), give a linear-time MMD that averages to about 0; the time-ordered window paired with a
    shuffled batch leaves the positive floor the optimiser could only remove by moving old subtrees."""
    from ops.nforgot.losses import linear_time_mmd

    dm = TemporalGraphDataModule(max_train_examples_per_task=2000, max_eval_examples_per_task=100)
    dm.setup()
    torch.manual_seed(0)
    model = NForGOTLitModule(dim=32, time_dim=16, head_hidden=16, dropout=0.0)
    model.stream, model.x = dm.stream, dm.stream.graph.x
    model.eval()
    train = dm.stream.examples[0]["train"]
    g = torch.Generator().manual_seed(1)

    def mean_mmd(mode):
        model.hparams.memory_sample = mode
        vals = []
        with torch.no_grad():
            for step, idx in enumerate(torch.randperm(len(train), generator=g)[:1600].split(200)):
                batch = train.subset(idx)  # what the shuffled loader serves
                mem = model._memory_batch(0, 200, step)
                _, X = model._embed(batch.node, batch.t, batch.task, subtree=True)
                _, Y = model._embed(mem.node, mem.t, mem.task, subtree=True)
                vals.append(float(linear_time_mmd(X, Y)))
        return float(np.mean(vals))

    auto, window = mean_mmd("auto"), mean_mmd("window")  # no trainer: auto = shuffled batches = iid sample
    assert abs(auto) < 0.05, auto
    assert window > 0.1, window


def test_class_loss_compares_with_the_previous_task_prototypes_only(tmp_path):
    from ops.nforgot.losses import prototype_distance_loss

    dm, model, trainer = make(
        tmp_path, classes=(0, 1, 2, 3, 4, 5), events=450, epochs_per_task=1, class_loss=1.0, discrepancy="none"
    )
    trainer.fit(model, datamodule=dm)
    assert model.finished == 3 and model.prototype_task.tolist() == [0, 0, 1, 1, 2, 2]
    b = dm.stream.examples[2]["train"].subset(torch.arange(20))
    with torch.no_grad():
        for p in model.encoder.parameters():  # the student has moved away from the previous-task teacher
            p.add_(0.1 * torch.randn_like(p))
        h = model._embed(b.node, b.t, b.task)
        h0 = model._embed(b.node, b.t, b.task, net=model.prev)
        prev_only = prototype_distance_loss(h, h0, b.y, model.prototypes[2:4])
        every = prototype_distance_loss(h, h0, b.y, model.prototypes[:4])
        _, terms = model._plugins(h, h0, None, b.node, b.t, b.y, 2, 0)
        assert float(terms["l_class"]) == pytest.approx(float(prev_only), rel=1e-6)
        assert float(every) != pytest.approx(float(prev_only), rel=1e-3)
        model.hparams.class_prototypes = "all"
        _, terms = model._plugins(h, h0, None, b.node, b.t, b.y, 2, 0)
        assert float(terms["l_class"]) == pytest.approx(float(every), rel=1e-6)


def test_gradient_norms_of_each_term_are_logged(tmp_path):
    dm, model, trainer = make(tmp_path, events=300, epochs_per_task=1, class_loss=1.0, log_grad_norms=1)
    trainer.fit(model, datamodule=dm)
    m = trainer.callback_metrics
    for term in ("ce", "kd", "class", "disc"):
        assert float(m[f"train/gradnorm_{term}"]) > 0, term
    for key, value in (("subtree_neighbours", "all"), ("memory_sample", "iid"), ("class_prototypes", "last")):
        with pytest.raises(ConfigError, match=f"model.{key}='{value}'"):
            NForGOTLitModule(**{key: value})


def test_lwf_warmup_trains_only_the_new_head_then_everything(tmp_path):
    """Li & Hoiem's warm-up: in the first epoch of task 1 only task 1's head rows get gradient (encoder, features
    and task 0's head untouched); in the joint epoch that follows the encoder trains again (CE + L_KD)."""
    dm, model, trainer = make(tmp_path, epochs_per_task=2, method="lwf", lwf_warmup_epochs=1)
    seen: dict[int, dict[str, float]] = {}
    start: dict[str, torch.Tensor] = {}

    class Grads(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 2:
                start.update({k: v.detach().clone() for k, v in pl_module.encoder.state_dict().items()})

        def on_after_backward(self, trainer, pl_module):
            g = seen.setdefault(trainer.current_epoch, {"encoder": 0.0, "features": 0.0, "head0": 0.0, "head1": 0.0})
            for part in ("encoder", "features"):
                g[part] += sum(
                    float(p.grad.abs().sum()) for p in getattr(pl_module, part).parameters() if p.grad is not None
                )
            hg = pl_module.head.weight.grad
            g["head0"] += float(hg[:2].abs().sum())
            g["head1"] += float(hg[2:].abs().sum())

        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch == 2:
                for k, v in pl_module.encoder.state_dict().items():
                    assert torch.equal(v, start[k]), k

    trainer.callbacks.append(Grads())
    trainer.fit(model, datamodule=dm)
    warm, joint = seen[2], seen[3]
    assert warm["encoder"] == 0 and warm["features"] == 0 and warm["head0"] == 0 and warm["head1"] > 0
    assert joint["encoder"] > 0 and joint["features"] > 0 and joint["head0"] > 0  # L_KD trains the old head
    with pytest.raises(ConfigError, match="lwf_warmup_epochs"):
        NForGOTLitModule(multihead=False, lwf_warmup_epochs=1)


@pytest.mark.parametrize("multihead", [True, False])
def test_validation_covers_the_seen_tasks_and_logs_their_mean_accuracy(tmp_path, multihead):
    L.seed_everything(0)
    dm, model, trainer = make(
        tmp_path, classes=(0, 1, 2, 3, 4, 5), epochs_per_task=1, method="finetune", multihead=multihead
    )
    if multihead:  # features without the class: each task's accuracy sits near chance, a different value per task
        np.save(tmp_path / "toy_node.npy", np.random.default_rng(1).normal(size=(41, 6)))
    # single-head: the class features; finetuning learns the newest task and forgets the older ones
    trainer.fit(model, datamodule=dm)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    model.eval()
    per_task = [model.task_accuracy(j, 2, split="val") for j in range(3)]  # the final weights, after task 2
    sizes = [len(dm.stream.examples[j]["val"]) for j in range(3)]
    pooled = sum(a * n for a, n in zip(per_task, sizes, strict=True)) / sum(sizes)
    assert m["val/task"] == 2.0 and m["val/acc"] == pytest.approx(per_task[2], abs=1e-6)  # the current task's
    assert m["val/acc_seen"] == pytest.approx(sum(per_task) / 3, abs=1e-6)  # the mean of the tasks' accuracies
    # the values discriminate: the mean over tasks is neither the current task's nor the pooled accuracy
    assert abs(sum(per_task) / 3 - per_task[2]) > 1e-3 and abs(sum(per_task) / 3 - pooled) > 1e-4
    trainer.test(model, datamodule=dm, verbose=False)
    for j in range(3):  # each task's accuracy right after its own training
        assert float(trainer.callback_metrics[f"test/acc_own_task{j}"]) == pytest.approx(float(model.acc[j, j]))
