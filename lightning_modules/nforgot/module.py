"""N-ForGOT and its continual-learning baselines on a TGAT backbone, in one system selected by ``method``.

Open-set class-incremental node classification on a temporal graph (``datamodules/temporal_graph.py``): tasks of
new classes arrive one after another; after each task the model is tested on every task so far, filling the
accuracy matrix ``a[j][i]`` from which AP / AF / BWT are computed (:mod:`ops.continual.metrics`).

Model (the official default): TGAT encoder -> ``features = Linear(D, 100) + ReLU + Dropout(0.3)`` -> one linear
head per task. ``multihead=true`` (official default): the head is chosen by the *true* label's task (an oracle
task id, i.e. task-incremental); ``multihead=false``: one head over all classes seen so far (class-incremental).

``method``:
* ``finetune`` - CE on the current task only (lower bound).
* ``joint`` - CE on all tasks so far (upper bound; needs ``data.cumulative=true``).
* ``ewc`` - CE + online EWC, ``lambda/2 sum_i F_i (theta_i - theta*_i)^2`` (Kirkpatrick et al. 2017; Fisher summed
  over tasks, anchor = parameters after the last task).
* ``lwf`` - CE + L_KD (Li & Hoiem 2017), i.e. N-ForGOT "as released" in effect (its other terms carry no gradient).
* ``replay`` - CE on the batch + CE on a batch drawn from a buffer of ``replay_per_class`` training examples per
  old class (experience replay).
* ``nforgot`` - ``L = CE + alpha (distill_loss L_KD + class_loss L_class) + beta mmd_loss L_disc``:
  L_KD (:func:`~ops.nforgot.losses.kd_loss`, T = 2); L_class (:func:`~ops.nforgot.losses.prototype_distance_loss`,
  prototypes saved at the end of each task); L_disc the distribution discrepancy between depth-1 temporal
  subtrees of the batch and of a batch of the previous task's raw training events (its own temporal graph),
  ``discrepancy=linear_mmd`` (released default), ``mk_mmd`` or ``wl`` (temporal-WL product-kernel MMD).
  ``detach_plugins=true`` reproduces the released code, where L_class and L_disc are computed without gradient
  (they are logged but do not train anything); the default follows the paper (they carry gradients).

Validation covers every task seen so far: ``val/acc`` is the current task's accuracy, ``val/acc_seen`` the mean over
the seen tasks of each one's accuracy (the validation counterpart of AP), ``val/task`` the current task; the test
logs ``test/acc_own_task<j>``, task ``j``'s accuracy right after its own training (was it learned at all?).

KD heads: in multi-head mode the old heads are distilled on the new data (LwF); ``kd_official_head=true``
distils the current task's head instead, as the released code does (that head of the old model was never
trained). At each task end the temporal-WL shift between the task's and the previous task's training subtrees
(:func:`~ops.nforgot.losses.wl_histogram_mmd`) is logged as a diagnostic (``test/wl_shift_<i>``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
import torchmetrics
from torch import Tensor, nn

from core.errors import ConfigError
from layers.temporal_graph.continual import Examples
from layers.temporal_graph.tgat import TGAT
from layers.temporal_graph.tgn import TGN
from lightning_modules._base import OptimizerFactory, SchedulerFactory, SuiteLitModule
from ops.continual.metrics import average_forgetting, average_performance, backward_transfer
from ops.nforgot.losses import (
    kd_loss,
    linear_time_mmd,
    multi_kernel_mmd,
    prototype_distance_loss,
    wl_histogram_mmd,
    wl_kernel_mmd,
)
from ops.nforgot.wl import temporal_wl_labels

METHODS = ("finetune", "joint", "ewc", "lwf", "replay", "nforgot")
ENCODERS = ("tgat", "tgn")
DISCREPANCIES = ("linear_mmd", "mk_mmd", "wl", "none")
SUBTREE_NEIGHBOURS = ("states", "reembed")
MEMORY_SAMPLES = ("auto", "window", "random")
PROTOTYPE_SETS = ("previous", "all")


class NForGOTLitModule(SuiteLitModule):
    """Continual TGAT node classifier; see the module docstring for ``method`` and the loss terms.

    Args:
        method: one of ``finetune | joint | ewc | lwf | replay | nforgot``.
        in_dim: node feature width; ``None`` takes it from the data in ``setup`` (e.g. a real ``.npy``).
        num_classes, classes_per_task: must match the datamodule (checked in ``setup``).
        multihead: per-task heads chosen by the true label's task (official) or one class-incremental head.
        encoder: ``tgat`` (``layers/temporal_graph/tgat.py``) or ``tgn`` (GRU memory + the same graph attention,
            ``layers/temporal_graph/tgn.py``; it makes the datamodule serve training queries in time order).
        dim, time_dim, num_layers, heads, num_neighbors, dropout: the encoder's attention (both encoders).
        memory_batch: TGN's memory chunk (events per memory update).
        head_hidden, head_dropout: the ``features`` block before the heads (100, 0.3 officially).
        alpha, beta, distill_loss, class_loss, mmd_loss, temperature: N-ForGOT loss weights (official defaults).
        discrepancy: ``linear_mmd | mk_mmd | wl | none``.
        detach_plugins: the released no-gradient L_class / L_disc (ablation).
        kd_official_head: distil the current head (released code) instead of the old heads.
        lwf_warmup_epochs: LwF's warm-up step (Li & Hoiem 2017, Algorithm 1): for this many of each new task's
            epochs (out of ``data.epochs_per_task``, so the budget stays equal) only the new task's head trains,
            on CE, with the encoder, the shared ``features`` block and the old heads frozen; the joint step
            (CE + L_KD) follows. ``lwf`` and ``nforgot``; multi-head only. 0: no warm-up (the released code).
        subtree_neighbours: the discrepancy's subtree rows, ``states`` (official: the neighbours' layer-(L-1)
            states, no gradient) or ``reembed`` (each neighbour re-embedded with gradient); see
            :meth:`layers.temporal_graph.tgat.TGAT.subtree`.
        memory_sample: the previous task's events paired with the batch in L_disc: ``auto`` (the batch's own
            structure: an iid sample when training queries are shuffled, the same index window when they are
            served in time order, as the official loop does), ``window`` (always the index window) or ``random``.
        class_prototypes: the stored prototypes L_class compares with: ``previous`` (the previous task's classes,
            as the official ``class_loss``) or ``all`` (every earlier class).
        log_grad_norms: every this many training steps (0: never), log the gradient norm of each weighted loss
            term over the model's parameters (``train/gradnorm_<term>``); costs one extra backward per term.
        ewc_lambda, ewc_batches: EWC strength and batches used for the Fisher.
        replay_per_class: buffer size per old class for ``replay``.
        wl_neighbors, wl_iterations, wl_time_scale, wl_time_buckets: temporal WL relabelling (``ops/nforgot/wl.py``;
            coarse by default: with 10 neighbours and 2 rounds almost every subtree is its own pattern).
        eval_batch_size: batch size of the end-of-task evaluations.
    """

    def __init__(
        self,
        method: str = "nforgot",
        in_dim: int | None = 16,
        num_classes: int = 10,
        classes_per_task: int = 2,
        multihead: bool = True,
        encoder: str = "tgat",
        dim: int = 64,
        time_dim: int = 32,
        num_layers: int = 1,
        heads: int = 2,
        num_neighbors: int = 10,
        dropout: float = 0.1,
        memory_batch: int = 200,
        head_hidden: int = 100,
        head_dropout: float = 0.3,
        alpha: float = 1.0,
        beta: float = 1.0,
        distill_loss: float = 1.0,
        class_loss: float = 0.01,
        mmd_loss: float = 1.0,
        temperature: float = 2.0,
        discrepancy: str = "linear_mmd",
        detach_plugins: bool = False,
        kd_official_head: bool = False,
        lwf_warmup_epochs: int = 0,
        subtree_neighbours: str = "states",
        memory_sample: str = "auto",
        class_prototypes: str = "previous",
        log_grad_norms: int = 0,
        ewc_lambda: float = 5000.0,
        ewc_batches: int = 10,
        replay_per_class: int = 20,
        wl_neighbors: int = 3,
        wl_iterations: int = 1,
        wl_time_scale: float = 1.0,
        wl_time_buckets: int = 4,
        eval_batch_size: int = 1000,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "epoch",
        monitor: str = "val/loss",
    ) -> None:
        super().__init__(optimizer, scheduler, scheduler_interval, monitor)
        if method not in METHODS:
            raise ConfigError(f"model.method={method!r} must be one of {list(METHODS)}")
        if encoder not in ENCODERS:
            raise ConfigError(f"model.encoder={encoder!r} must be one of {list(ENCODERS)}")
        if memory_batch < 1:
            raise ConfigError(f"model.memory_batch={memory_batch} must be >= 1")
        if discrepancy not in DISCREPANCIES:
            raise ConfigError(f"model.discrepancy={discrepancy!r} must be one of {list(DISCREPANCIES)}")
        for key, value, allowed in (
            ("subtree_neighbours", subtree_neighbours, SUBTREE_NEIGHBOURS),
            ("memory_sample", memory_sample, MEMORY_SAMPLES),
            ("class_prototypes", class_prototypes, PROTOTYPE_SETS),
        ):
            if value not in allowed:
                raise ConfigError(f"model.{key}={value!r} must be one of {list(allowed)}")
        if log_grad_norms < 0:
            raise ConfigError(f"model.log_grad_norms={log_grad_norms} must be >= 0")
        if lwf_warmup_epochs < 0 or (lwf_warmup_epochs and not multihead):
            raise ConfigError(
                f"model.lwf_warmup_epochs={lwf_warmup_epochs} must be >= 0, and 0 with model.multihead=false "
                "(the warm-up trains the new task's own head)"
            )
        if classes_per_task < 1 or num_classes % classes_per_task:
            raise ConfigError(
                f"model.num_classes={num_classes} must be a multiple of model.classes_per_task={classes_per_task}"
            )
        if (dim + time_dim) % heads:
            raise ConfigError(f"model.dim + model.time_dim = {dim + time_dim} must be divisible by model.heads={heads}")
        if temperature <= 0 or min(ewc_lambda, replay_per_class, wl_time_scale) < 0 or wl_time_scale == 0:
            raise ConfigError(
                "model.temperature and model.wl_time_scale must be > 0; ewc_lambda, replay_per_class >= 0"
            )
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.method, self.multihead, self.C = method, multihead, classes_per_task
        self.num_classes, self.num_tasks = num_classes, num_classes // classes_per_task
        if encoder == "tgn":
            self.encoder = TGN(in_dim or 1, dim, time_dim, num_layers, heads, num_neighbors, dropout, memory_batch)
        else:
            self.encoder = TGAT(in_dim or 1, dim, time_dim, num_layers, heads, num_neighbors, dropout)
        self.features = nn.Sequential(nn.Linear(dim, head_hidden), nn.ReLU(), nn.Dropout(head_dropout))
        self.head = nn.Linear(head_hidden, num_classes)  # task k's head = columns k*C .. (k+1)*C - 1
        self.val_acc = torchmetrics.MeanMetric()  # the current task's validation accuracy
        self.val_task_acc = nn.ModuleList(torchmetrics.MeanMetric() for _ in range(self.num_tasks))
        self.val_seen: int | None = None  # the current task of the validation epoch under way
        self.test_acc = torchmetrics.MeanMetric()
        self.stream: Any = None
        self.reset_continual_state()

    # -- continual state ---------------------------------------------------------------------------------------
    def reset_continual_state(self) -> None:
        t = self.num_tasks
        self.acc = torch.full((t, t), float("nan"), dtype=torch.float64)  # acc[j, i]
        self.wl_shift = torch.full((t,), float("nan"), dtype=torch.float64)
        self.finished = 0  # tasks whose end-of-task bookkeeping is done
        self.current_task = 0
        self.prototypes = torch.zeros(0, self.hparams.dim)
        self.prototype_task = torch.zeros(0, dtype=torch.long)  # the task each prototype row belongs to
        self.prev: nn.Module | None = None
        self.fisher: dict[str, Tensor] = {}
        self.anchor: dict[str, Tensor] = {}
        self.replay = Examples(*(torch.zeros(0, dtype=d) for d in (torch.long, torch.float64, torch.long, torch.long)))

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule if self.trainer is not None else None
        stream = getattr(dm, "stream", None)
        if stream is None:
            raise ConfigError("NForGOTLitModule needs datamodules.temporal_graph.TemporalGraphDataModule (no .stream)")
        self.stream = stream
        x = stream.graph.x
        if self.hparams.in_dim is None:  # sized from the data; saved in the hparams so checkpoints rebuild it
            self.encoder.inp = nn.Linear(x.shape[1], self.hparams.dim).to(self.device)
            self.hparams.in_dim = int(x.shape[1])
        if x.shape[1] != self.hparams.in_dim:
            raise ConfigError(f"model.in_dim={self.hparams.in_dim} but the node features have {x.shape[1]} columns")
        if stream.num_classes != self.num_classes or stream.classes_per_task != self.C:
            raise ConfigError(
                f"model.num_classes={self.num_classes}, classes_per_task={self.C} but the data has "
                f"{stream.num_tasks} tasks x {stream.classes_per_task} classes"
            )
        if self.multihead:
            for k, cls in enumerate(stream.task_classes):
                if len(cls) < 2:
                    raise ConfigError(
                        f"task {k} has a single class {cls}: its multi-head accuracy would be trivially 1; "
                        "use model.multihead=false (class-incremental) or another data.classes_per_task"
                    )
        if self.hparams.encoder == "tgn":
            dm.chronological = True  # TGN's memory learns from the events between consecutive (time-ordered) batches
        if self.method == "joint" and not getattr(dm, "cumulative", False):
            raise ConfigError("model.method=joint needs data.cumulative=true (train on all tasks so far)")
        self.x = x

    # -- model ----------------------------------------------------------------------------------------------------
    def _embed(self, nodes: Tensor, times: Tensor, tasks: Tensor, subtree: bool = False, net: Any = None) -> Any:
        """Embeddings ``[B, D]`` (and subtrees ``[B, k+1, D]``), each example on its own task's temporal graph."""
        enc = (net or self).encoder
        x = self.x.to(self.device)
        h = S = None
        for k in tasks.unique().tolist():
            sel = tasks == k
            sampler = self.stream.samplers[int(k)]
            if subtree:
                hk, sk = enc.subtree(x, sampler, nodes[sel], times[sel], self.hparams.subtree_neighbours)
                S = sk.new_zeros(nodes.numel(), *sk.shape[1:]) if S is None else S
                S[sel] = sk
            else:
                hk = enc(x, sampler, nodes[sel], times[sel])
            h = hk.new_zeros(nodes.numel(), hk.shape[1]) if h is None else h
            h[sel] = hk
        return (h, S) if subtree else h

    def _raw_logits(self, h: Tensor, net: Any = None) -> Tensor:
        net = net or self
        return net.head(net.features(h))

    def _logits(self, z: Tensor, tasks: Tensor, y: Tensor, seen: int) -> tuple[Tensor, Tensor]:
        """Head selection: multi-head -> ``[B, C]`` of each label's task; single-head -> classes of tasks <= seen."""
        if self.multihead:
            z = z.view(z.shape[0], self.num_tasks, self.C)[torch.arange(z.shape[0], device=z.device), tasks]
            return z, y - tasks * self.C
        mask = torch.arange(self.num_classes, device=z.device) >= (seen + 1) * self.C
        return z.masked_fill(mask, float("-inf")), y

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        return self._raw_logits(self._embed(batch["node"], batch["t"], batch["task"]))

    # -- training -------------------------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        nodes, t, tasks, y = batch["node"], batch["t"], batch["task"], batch["y"]
        task = int(tasks.max())
        self.current_task = task
        if self._warming_up(task):
            return self._warmup_step(nodes, t, tasks, y, task)
        use_disc = self.method == "nforgot" and task > 0 and self.hparams.discrepancy != "none"
        use_disc = use_disc and self.hparams.mmd_loss * self.hparams.beta != 0
        out = self._embed(nodes, t, tasks, subtree=use_disc)
        h, S = out if use_disc else (out, None)
        z_all = self._raw_logits(h)
        z, target = self._logits(z_all, tasks, y, task)
        ce = F.cross_entropy(z, target)
        loss, n = ce, y.numel()
        parts = {"ce": ce}  # weighted loss terms, for the gradient-norm diagnostic
        self.log("train/ce", ce, batch_size=n)
        if task > 0 and self.prev is not None and self.method in ("lwf", "nforgot"):
            with torch.no_grad():
                h0 = self._embed(nodes, t, tasks, net=self.prev)
                z0_all = self._raw_logits(h0, net=self.prev)
            l_kd = self._kd(z_all, z0_all, tasks, task)
            with torch.no_grad():  # L_KD = H(targets) + KL(targets || student): only the KL part can move
                target_entropy = self._kd(z0_all, z0_all, tasks, task)
            self.log_dict(
                {
                    "train/l_kd": l_kd,
                    "train/kd_target_entropy": target_entropy,
                    "train/kd_kl": l_kd.detach() - target_entropy,
                },
                batch_size=n,
            )
            w_kd = self.hparams.alpha * (self.hparams.distill_loss if self.method == "nforgot" else 1.0)
            loss = loss + w_kd * l_kd
            parts["kd"] = w_kd * l_kd
            if self.method == "nforgot":
                weighted, terms = self._plugins(h, h0, S, nodes, t, y, task, batch_idx)
                self.log_dict({f"train/{k}": v for k, v in terms.items()}, batch_size=n)
                for k, v in weighted.items():
                    loss = loss + v
                    parts[k] = v
        if task > 0 and self.method == "ewc" and self.fisher:
            pen = sum(
                (self.fisher[k] * (p - self.anchor[k]).pow(2)).sum()
                for k, p in self.named_parameters()
                if k in self.fisher
            )
            self.log("train/ewc", pen, batch_size=n)
            loss = loss + self.hparams.ewc_lambda / 2 * pen
        if task > 0 and self.method == "replay" and len(self.replay):
            g = torch.Generator().manual_seed(int(self.global_step) + 1000003 * self.trainer.current_epoch)
            idx = torch.randperm(len(self.replay), generator=g)[: min(n, len(self.replay))]
            r = self.replay.subset(idx)
            rt, ry = r.task.to(self.device), r.y.to(self.device)
            zr, tr = self._logits(self._raw_logits(self._embed(r.node, r.t, rt)), rt, ry, task)
            ce_r = F.cross_entropy(zr, tr)
            self.log("train/replay_ce", ce_r, batch_size=n)
            loss = loss + ce_r
        every = self.hparams.log_grad_norms
        if every and task > 0 and batch_idx % every == 0:
            self._log_grad_norms(parts, n)
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        return loss

    def _warming_up(self, task: int) -> bool:
        """Inside the first ``lwf_warmup_epochs`` epochs of a task after the first (``lwf``/``nforgot``)."""
        warm = self.hparams.get("lwf_warmup_epochs", 0)
        if not warm or task == 0 or self.method not in ("lwf", "nforgot") or self._trainer is None:
            return False
        return self.trainer.current_epoch - task * self.trainer.datamodule.epochs_per_task < warm

    def _warmup_step(self, nodes: Tensor, t: Tensor, tasks: Tensor, y: Tensor, task: int) -> Tensor:
        """LwF's warm-up: CE on the new task's head over frozen shared features (no gradient reaches the encoder,
        ``features`` or the other heads: in multi-head mode the CE reads the batch's own task's columns only)."""
        with torch.no_grad():
            f = self.features(self._embed(nodes, t, tasks))
        z, target = self._logits(self.head(f), tasks, y, task)
        ce = F.cross_entropy(z, target)
        self.log("train/ce", ce, batch_size=y.numel())
        self.log("train/loss", ce, prog_bar=True, batch_size=y.numel())
        return ce

    def _log_grad_norms(self, parts: dict[str, Tensor], n: int) -> None:
        """``train/gradnorm_<term>``: the L2 norm over all parameters of each weighted term's gradient."""
        params = [p for p in self.parameters() if p.requires_grad]
        for name, term in parts.items():
            if not term.requires_grad:
                continue
            grads = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
            sq = sum(g.detach().pow(2).sum() for g in grads if g is not None)
            self.log(f"train/gradnorm_{name}", torch.as_tensor(sq, dtype=torch.float32).sqrt(), batch_size=n)

    def _kd(self, z: Tensor, z0: Tensor, tasks: Tensor, task: int) -> Tensor:
        C = self.C
        if not self.multihead:
            return kd_loss(z[:, : task * C], z0[:, : task * C], self.hparams.temperature)
        if self.hparams.kd_official_head:
            zc, _ = self._logits(z, tasks, tasks, task)
            z0c, _ = self._logits(z0, tasks, tasks, task)
            return kd_loss(zc, z0c, self.hparams.temperature)
        return torch.stack(
            [
                kd_loss(z[:, j * C : (j + 1) * C], z0[:, j * C : (j + 1) * C], self.hparams.temperature)
                for j in range(task)
            ]
        ).mean()

    def _plugins(
        self, h: Tensor, h0: Tensor, S: Tensor | None, nodes: Tensor, t: Tensor, y: Tensor, task: int, b: int
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Weighted ``alpha class_loss L_class`` and ``beta mmd_loss L_disc`` (detached in the released code's
        behaviour) by name, and their unweighted values for logging."""
        hp = self.hparams
        detach = hp.detach_plugins
        weighted, terms = {}, {}
        # official class_loss: the previous task's classes only; "all": every class of an earlier task
        keep = self.prototype_task == task - 1 if hp.class_prototypes == "previous" else self.prototype_task < task
        protos = self.prototypes[keep.to(self.prototypes.device)]
        if hp.class_loss and protos.numel():
            l_cls = prototype_distance_loss(h.detach() if detach else h, h0, y, protos.to(h))
            terms["l_class"] = l_cls.detach()
            weighted["class"] = hp.alpha * hp.class_loss * l_cls
        if S is not None:
            mem = self._memory_batch(task - 1, y.numel(), b)
            mt = mem.task.to(self.device)
            _, S_mem = self._embed(mem.node, mem.t, mt, subtree=True)
            X, Y = (S.detach(), S_mem.detach()) if detach else (S, S_mem)
            if hp.discrepancy == "linear_mmd":
                l_disc = linear_time_mmd(X, Y)
            elif hp.discrepancy == "mk_mmd":
                l_disc = multi_kernel_mmd(X, Y)
            else:
                lx = self._wl_labels(nodes, t, task)
                ly = self._wl_labels(mem.node, mem.t, task - 1)
                l_disc = wl_kernel_mmd(X, Y, lx.to(X.device), ly.to(X.device))
            terms["l_disc"] = l_disc.detach()
            weighted["disc"] = hp.beta * hp.mmd_loss * l_disc
        return weighted, terms

    def _memory_batch(self, task: int, n: int, batch_idx: int) -> Examples:
        """The previous task's raw training events paired with the batch in L_disc (``model.memory_sample``).

        The linear-time MMD pairs consecutive rows, so both samples need the same structure: two samples of one
        distribution then average to 0. ``auto`` follows the batch: shuffled training queries (TGAT) get an iid
        sample of the previous task's events; time-ordered ones (TGN) get the same index window as the batch
        (``Memory.pre_batch`` of the released code), or a seeded random sample when the window runs past the end.
        A time-ordered window paired with a shuffled batch leaves a floor of 0.2-0.3 between two samples of the
        same task (adjacent events are dependent), which the optimiser can only lower by moving old subtrees.
        """
        ex = self.stream.examples[task]["train"]
        n = max(2, n)
        lo = batch_idx * n
        mode = self.hparams.memory_sample
        if mode == "auto":
            dm = self.trainer.datamodule if self._trainer is not None else None
            mode = "window" if getattr(dm, "chronological", False) else "random"
        g = torch.Generator().manual_seed(int(self.global_step) + 7919 * task + 104729 * batch_idx)
        if mode == "window" and lo + n <= len(ex):
            return ex.subset(torch.arange(lo, lo + n))
        return ex.subset(torch.randint(0, len(ex), (n,), generator=g))

    def _wl_labels(self, nodes: Tensor, times: Tensor, task: int) -> Tensor:
        hp = self.hparams
        return temporal_wl_labels(
            self.stream.samplers[task],
            nodes.cpu(),
            times.cpu(),
            hp.wl_neighbors,
            hp.wl_iterations,
            hp.wl_time_scale,
            hp.wl_time_buckets,
        )

    # -- end of task bookkeeping ----------------------------------------------------------------------------------
    def on_train_epoch_end(self) -> None:
        dm, epoch = self.trainer.datamodule, self.trainer.current_epoch
        task = dm.task_of_epoch(epoch)
        last_of_task = (epoch + 1) % dm.epochs_per_task == 0
        last_of_fit = epoch + 1 >= (self.trainer.max_epochs or 0) or bool(self.trainer.fast_dev_run)
        if self.finished <= task and (last_of_task or last_of_fit):
            self.finish_task(task)

    def _batches(self, ex: Examples, size: int):
        for lo in range(0, len(ex), size):
            yield ex.subset(torch.arange(lo, min(lo + size, len(ex))))

    @torch.no_grad()
    def task_accuracy(self, task: int, seen: int, split: str = "test") -> float:
        """Accuracy on ``task``'s ``split`` (multi-head: its own head; single-head: classes of tasks <= seen)."""
        correct = total = 0
        for b in self._batches(self.stream.examples[task][split], self.hparams.eval_batch_size):
            bt, by = b.task.to(self.device), b.y.to(self.device)
            z, target = self._logits(self._raw_logits(self._embed(b.node, b.t, bt)), bt, by, seen)
            correct += int((z.argmax(-1) == target).sum())
            total += len(b)
        return correct / max(total, 1)

    @torch.no_grad()
    def finish_task(self, task: int) -> None:
        """Accuracy row a[:, task]; prototypes; previous-model snapshot; Fisher; replay buffer; WL shift."""
        was_training = self.training
        self.eval()
        for j in range(task + 1):
            self.acc[j, task] = self.task_accuracy(j, task)
        train = self.stream.examples[task]["train"]
        g = torch.Generator().manual_seed(torch.initial_seed() % 2**31 * 131 + task)  # follows the run seed
        sample = train.subset(torch.randperm(len(train), generator=g)[:2000].sort().values)
        h = torch.cat([self._embed(b.node, b.t, b.task.to(self.device)) for b in self._batches(sample, 1000)])
        for c in self.stream.task_classes[task]:
            self.prototypes = torch.cat([self.prototypes.to(h), h[sample.y.to(h.device) == c].mean(0, keepdim=True)])
            self.prototype_task = torch.cat([self.prototype_task, torch.tensor([task])])
        if task > 0:
            prev = self.stream.examples[task - 1]["train"]
            a = sample.subset(torch.randperm(len(sample), generator=g)[:512])  # random, not the earliest events
            b = prev.subset(torch.randperm(len(prev), generator=g)[:512])
            self.wl_shift[task] = float(
                wl_histogram_mmd(self._wl_labels(a.node, a.t, task), self._wl_labels(b.node, b.t, task - 1))
            )
        if self.method == "replay" and self.hparams.replay_per_class:
            keep = [torch.nonzero(train.y == c).view(-1) for c in self.stream.task_classes[task]]
            keep = [k[torch.randperm(k.numel(), generator=g)[: self.hparams.replay_per_class]] for k in keep]
            self.replay = Examples.cat([self.replay, train.subset(torch.cat(keep))])
        self._set_prev(self._snapshot())
        if was_training:
            self.train()
        if self.method == "ewc":
            self._update_fisher(train, g)
        self.finished = task + 1
        self.log(f"cl/ap_after_{task}", float(average_performance(self.acc[: task + 1, : task + 1])[-1]))

    def _set_prev(self, prev: nn.Module) -> None:
        """Keep the previous-task model unregistered: ``self.train()`` must not switch the frozen teacher back to
        training mode (dropout in the KD targets), and it is not part of the state dict (saved by
        ``on_save_checkpoint``)."""
        object.__setattr__(self, "prev", prev)

    def _snapshot(self) -> nn.Module:
        prev = nn.ModuleDict({"encoder": self.encoder, "features": self.features, "head": self.head})
        prev = copy.deepcopy(prev).eval()
        for p in prev.parameters():
            p.requires_grad_(False)
        return prev

    def _update_fisher(self, train: Examples, g: torch.Generator) -> None:
        """Online EWC: add the empirical Fisher (mean squared batch gradient of CE) of this task; re-anchor."""
        params = {k: p for k, p in self.named_parameters() if p.requires_grad}
        fisher = {k: torch.zeros_like(p) for k, p in params.items()}
        size = self.trainer.datamodule.batch_size
        perm = torch.randperm(len(train), generator=g)
        nb = 0
        with torch.enable_grad():
            for i in range(min(self.hparams.ewc_batches, max(1, len(train) // size))):
                b = train.subset(perm[i * size : (i + 1) * size].sort().values)
                bt, by = b.task.to(self.device), b.y.to(self.device)
                z, target = self._logits(self._raw_logits(self._embed(b.node, b.t, bt)), bt, by, int(bt.max()))
                grads = torch.autograd.grad(F.cross_entropy(z, target), list(params.values()), allow_unused=True)
                for (k, _), gr in zip(params.items(), grads):
                    if gr is not None:
                        fisher[k] += gr.detach().pow(2)
                nb += 1
        for k in fisher:
            self.fisher[k] = self.fisher.get(k, torch.zeros_like(fisher[k])) + fisher[k] / max(nb, 1)
            self.anchor[k] = params[k].detach().clone()

    # -- evaluation -----------------------------------------------------------------------------------------------
    def _seen_task(self, batch: dict[str, Tensor]) -> int:
        """The task being trained (the datamodule's schedule; the batch's largest task without one)."""
        dm = self.trainer.datamodule if self._trainer is not None else None
        current = getattr(dm, "current_task", None)
        return int(current()) if callable(current) else int(batch["task"].max())

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        """The validation batches hold every task seen so far (the datamodule serves tasks ``0..t``)."""
        seen = self._seen_task(batch)
        correct = self._eval_step(batch, "val", seen)
        tasks = batch["task"]
        for k in tasks.unique().tolist():
            self.val_task_acc[int(k)].update(correct[tasks == k])
        if (tasks == seen).any():
            self.val_acc.update(correct[tasks == seen])
        self.val_seen = seen if self.val_seen is None else max(self.val_seen, seen)

    def on_validation_epoch_end(self) -> None:
        """``val/acc``: the current task's accuracy; ``val/acc_seen``: the mean over the tasks seen so far of each
        task's accuracy (the validation counterpart of AP, the curve the claim's convergence rule reads);
        ``val/task``: the current task, so a reader can cut the curves by task."""
        seen = self.val_seen
        if seen is not None:
            accs = [self.val_task_acc[k].compute() for k in range(seen + 1) if self.val_task_acc[k].update_count]
            self.log("val/acc", self.val_acc.compute())
            self.log("val/acc_seen", torch.stack(accs).mean() if accs else torch.tensor(float("nan")))
            self.log("val/task", float(seen))
        self.val_acc.reset()
        for m in self.val_task_acc:
            m.reset()
        self.val_seen = None

    def _eval_step(self, batch: dict[str, Tensor], stage: str, seen: int, metric: torchmetrics.Metric | None = None):
        """Log ``<stage>/loss``; return the per-example correctness (and add it to ``metric``)."""
        z, target = self._logits(self(batch), batch["task"], batch["y"], seen)
        self.log(f"{stage}/loss", F.cross_entropy(z, target), batch_size=target.numel())
        correct = (z.argmax(-1) == target).float()
        if metric is not None:
            metric.update(correct)
        return correct

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        keep = batch["task"] < max(self.finished, 1)  # tasks trained so far
        if keep.any():
            self._eval_step({k: v[keep] for k, v in batch.items()}, "test", max(self.finished, 1) - 1, self.test_acc)

    def on_test_epoch_end(self) -> None:
        """test/acc (final model, all trained tasks), and from the accuracy matrix: AP / AF / BWT after each task."""
        self.log("test/acc", self.test_acc.compute())
        self.test_acc.reset()
        n = self.finished
        if n == 0:
            return
        a = self.acc[:n, :n].numpy()
        ap = average_performance(a)
        metrics = {f"test/ap_after_{i}": float(v) for i, v in enumerate(ap)}
        metrics["test/ap"] = float(ap[-1])
        metrics |= {f"test/acc_task{j}": float(a[j, -1]) for j in range(n)}
        metrics |= {f"test/acc_own_task{j}": float(a[j, j]) for j in range(n)}  # right after its own training
        if n > 1:
            af, bwt = average_forgetting(a), backward_transfer(a)
            metrics |= {f"test/af_after_{i + 1}": float(v) for i, v in enumerate(af)}
            metrics |= {"test/af": float(af[-1]), "test/bwt": float(bwt[-1])}
            metrics |= {f"test/wl_shift_{i}": float(self.wl_shift[i]) for i in range(1, n)}
        metrics["test/tasks"] = float(n)
        self.log_dict(metrics)

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["continual"] = {
            "acc": self.acc,
            "wl_shift": self.wl_shift,
            "finished": self.finished,
            "prototypes": self.prototypes.cpu(),
            "prototype_task": self.prototype_task,
            "prev": None if self.prev is None else {k: v.cpu() for k, v in self.prev.state_dict().items()},
            "fisher": self.fisher,
            "anchor": self.anchor,
            "replay": {f: getattr(self.replay, f) for f in ("node", "t", "task", "y")},
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("continual")
        if state is None:
            return
        self.acc, self.wl_shift, self.finished = state["acc"], state["wl_shift"], int(state["finished"])
        self.prototypes, self.fisher, self.anchor = state["prototypes"], state["fisher"], state["anchor"]
        default_tasks = torch.arange(self.prototypes.shape[0]) // self.C  # checkpoints from before the field
        self.prototype_task = state.get("prototype_task", default_tasks)
        self.replay = Examples(**state["replay"])
        if state["prev"] is not None:
            self._set_prev(self._snapshot())
            self.prev.load_state_dict(state["prev"])
