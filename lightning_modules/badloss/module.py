"""BaDLoss (Alex et al., "BaDLoss: Backdoor Detection via Loss Dynamics", ICLR 2025) and its baselines.

One ``fit`` runs the whole defence:

1. **Detection phase** (``detect_epochs``, paper: 30): train the model on the attacked training set, which also
   holds the defender's clean-probe copies (in place of their originals,
   as in the official code: each probe image is trained on once per epoch). After each epoch
   :class:`callbacks.loss_dynamics.LossDynamics` records every example's loss on the un-augmented training set
   (trajectories ``L in R^{N x E}``).
2. **Detection**: depending on ``defence``

   * ``badloss``: epoch filter, Eq. (1) kNN (``k = 50``) distance to the clean-probe trajectories, log scores,
     ranks, reject the top ``reject_frac`` (paper: 40%); probe copies are dropped, the probes' originals kept;
   * ``badloss_two_class``: the older variant, kNN (``k = 20``) vote between clean and backdoor probes; rows whose
     backdoor share exceeds 1/2 are rejected;
   * ``spectral`` / ``activation_clustering``: penultimate features of the detection model, per class;
   * ``abl``: the detection phase trains with the LGA loss, the ``abl_isolation`` lowest-loss examples go;
   * ``none``: no detection phase; the model trains on everything.

3. **Retraining** from scratch (re-initialised weights and optimiser) on the kept rows for the remaining
   ``max_epochs - detect_epochs`` epochs.

Logged: ``detect/auc`` (scores vs the true poison mask, originals only), ``detect/auc_<attack>``,
``detect/poison_removed``, ``detect/clean_removed``; ``test/acc`` (clean) and ``test/asr_<attack>`` (accuracy on the
attack's triggered non-target test images), ``test/asr_mean``.

Deviation from the official code: the official script trains twice in separate processes; here both phases share
one Lightning ``fit`` (``trainer.reload_dataloaders_every_n_epochs=1`` picks up the kept set).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import torchmetrics

from callbacks.loss_dynamics import LossDynamics
from core.errors import ConfigError
from core.smoke import smoke_test
from lightning_modules._base import (
    OptimizerFactory,
    SchedulerFactory,
    SuiteLitModule,
    classification_metrics,
    metric_inputs,
)
from lightning_modules.badloss import baselines, scoring
from lightning_modules.badloss.nets import build_net, reset_parameters

log = logging.getLogger(__name__)

DEFENCES = ("none", "badloss", "badloss_two_class", "spectral", "activation_clustering", "abl")


class BadlossLitModule(SuiteLitModule):
    """Classifier trained under simultaneous backdoor attacks, with a detect-then-retrain defence.

    Args:
        net: ``small_cnn`` or ``resnet18``.
        in_channels: Image channels (must match the data).
        num_classes: Classes (must match the data).
        width: Base width of the network.
        defence: One of :data:`DEFENCES`.
        detect_epochs: Epochs of the detection phase (paper: 30; ABL: 10).
        reject_frac: Share of examples BaDLoss rejects (paper default 0.4).
        k: Neighbours of the one-class kNN score (paper: 50).
        eps: Offset of the log score (paper: 0.01).
        log_scores: ``log(eps + d)`` scores (paper) or linear ``d``.
        filter_epochs: Apply the loss-spike epoch filter.
        two_class_k: Neighbours of the two-class kNN vote (MAP-D: 20).
        ss_eps: Spectral-signature poison-rate guess (removes ``1.5 * ss_eps`` of each class).
        ac_size_threshold: Activation clustering flags a cluster smaller than this share of its class.
        abl_gamma: ABL flooding level of the LGA loss.
        abl_isolation: Share of lowest-loss examples ABL isolates.
        save_trajectories: Write ``badloss_detection.npz`` (trajectories, scores, masks) into the run folder.
        optimizer, scheduler, scheduler_interval: see :class:`SuiteLitModule`.
    """

    def __init__(
        self,
        net: str = "small_cnn",
        in_channels: int = 1,
        num_classes: int = 10,
        width: int = 32,
        defence: str = "badloss",
        detect_epochs: int = 30,
        reject_frac: float = 0.4,
        k: int = 50,
        eps: float = 0.01,
        log_scores: bool = True,
        filter_epochs: bool = True,
        two_class_k: int = 20,
        ss_eps: float = 0.1,
        ac_size_threshold: float = 0.35,
        abl_gamma: float = 0.5,
        abl_isolation: float = 0.15,
        save_trajectories: bool = True,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "epoch",
    ) -> None:
        super().__init__(optimizer, scheduler, scheduler_interval, monitor="val/loss")
        if defence not in DEFENCES:
            raise ConfigError(f"model.defence={defence!r} must be one of {list(DEFENCES)}")
        if detect_epochs < 1:
            raise ConfigError(f"model.detect_epochs={detect_epochs} must be >= 1")
        if not 0.0 <= reject_frac < 1.0:
            raise ConfigError(f"model.reject_frac={reject_frac} must be in [0, 1)")
        for key, v in (("k", k), ("two_class_k", two_class_k)):
            if v < 1:
                raise ConfigError(f"model.{key}={v} must be >= 1")
        if eps <= 0:
            raise ConfigError(f"model.eps={eps} must be > 0")
        if not 0.0 <= abl_isolation < 1.0:
            raise ConfigError(f"model.abl_isolation={abl_isolation} must be in [0, 1)")
        if not 0.0 < ss_eps * 1.5 <= 1.0:
            raise ConfigError(f"model.ss_eps={ss_eps}: 1.5 * ss_eps must be in (0, 1]")
        if not 0.0 < ac_size_threshold <= 0.5:
            raise ConfigError(f"model.ac_size_threshold={ac_size_threshold} must be in (0, 0.5]")
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        self.net = build_net(net, in_channels, num_classes, width)
        self.defence, self.detect_epochs, self.reject_frac = defence, detect_epochs, reject_frac
        self.k, self.eps, self.log_scores, self.use_filter = k, eps, log_scores, filter_epochs
        self.two_class_k, self.ss_eps, self.ac_size_threshold = two_class_k, ss_eps, ac_size_threshold
        self.abl_gamma, self.abl_isolation, self.save_trajectories = abl_gamma, abl_isolation, save_trajectories
        self.num_classes, self.in_channels = num_classes, in_channels
        self.phase = "detect" if defence != "none" else "train"
        self.keep: torch.Tensor | None = None
        self._own_recorder: LossDynamics | None = None
        self.val_metrics = classification_metrics(num_classes, "val")
        self.test_names: list[str] = []
        self.test_metrics = torch.nn.ModuleList()

    # -- plumbing ---------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, K]`` of images ``[B, C, H, W]``."""
        return self.net(x)

    @property
    def dm(self) -> Any:
        return self.trainer.datamodule

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule if self._trainer is not None else None
        if dm is None:
            return
        shape, classes = getattr(dm, "image_shape", None), getattr(dm, "num_classes", None)
        if shape is not None and shape[0] != self.in_channels:
            raise ConfigError(f"model.in_channels={self.in_channels} but the data has {shape[0]} channels")
        if classes is not None and classes != self.num_classes:
            raise ConfigError(f"model.num_classes={self.num_classes} but the data has {classes} classes")
        if not len(self.test_metrics):
            dm.setup(stage)
            self.test_names = list(getattr(dm, "test_names", ["clean"]))
            for _ in self.test_names:
                self.test_metrics.append(torchmetrics.Accuracy(task="multiclass", num_classes=self.num_classes))

    def recorder(self) -> LossDynamics:
        """The run's :class:`LossDynamics` callback, or a private one when the config has none."""
        for cb in self.trainer.callbacks:
            if isinstance(cb, LossDynamics):
                return cb
        if self._own_recorder is None:
            self._own_recorder = LossDynamics(metric="loss", capacity=self.detect_epochs)
        return self._own_recorder

    def on_fit_start(self) -> None:
        if self.defence == "none":
            return
        if not hasattr(self.dm, "set_train_keep"):
            raise ConfigError(f"model.defence={self.defence!r} needs a datamodule with set_train_keep (poisoned)")
        if self.trainer.reload_dataloaders_every_n_epochs != 1:
            raise ConfigError(
                f"model.defence={self.defence!r} retrains on the kept set: "
                "set trainer.reload_dataloaders_every_n_epochs=1"
            )
        if self.defence == "badloss" and self.dm.num_probes < self.k:
            raise ConfigError(f"model.k={self.k} needs data.num_probes >= k (got {self.dm.num_probes})")
        if self.defence == "badloss_two_class" and self.dm.num_backdoor_probes < 1:
            raise ConfigError("model.defence=badloss_two_class needs data.num_backdoor_probes >= 1")
        rec = self.recorder()
        rec.enabled = self.phase == "detect" and self.defence in ("badloss", "badloss_two_class", "abl")
        if self.phase == "retrain" and self.keep is not None:
            self.dm.set_train_keep(self.keep)

    # -- steps ------------------------------------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch[0], batch[1]
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss, prog_bar=True)
        if self.defence == "abl" and self.phase == "detect":
            loss = baselines.abl_lga_loss(loss, self.abl_gamma)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch[0], batch[1]
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits, y), prog_bar=True)
        self.val_metrics.update(metric_inputs(logits, self.num_classes), y)
        self.log_dict(self.val_metrics)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch[0], batch[1]
        logits = self(x)
        metric = self.test_metrics[dataloader_idx]
        metric.update(metric_inputs(logits, self.num_classes), y)
        name = "test/acc" if dataloader_idx == 0 else f"test/asr_{self.test_names[dataloader_idx]}"
        self.log(name, metric, add_dataloader_idx=False)
        if dataloader_idx == 0:
            self.log("test/loss", F.cross_entropy(logits, y), add_dataloader_idx=False)

    def on_test_epoch_end(self) -> None:
        if len(self.test_metrics) > 1:
            asr = torch.stack([m.compute() for m in list(self.test_metrics)[1:]]).mean()
            self.log("test/asr_mean", asr, add_dataloader_idx=False)

    # -- the defence ------------------------------------------------------------------------------------------
    def on_train_epoch_end(self) -> None:
        rec = self.recorder()
        if rec is self._own_recorder:
            rec.on_train_epoch_end(self.trainer, self)
        last = self.current_epoch + 1 == self.detect_epochs or smoke_test(self.trainer)
        if self.phase == "detect" and last:
            self.detect()

    @torch.no_grad()
    def features(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Penultimate features ``[N, D]`` and labels ``[N]`` of the full training set (row = example index)."""
        was = self.training
        self.eval()
        feats: torch.Tensor | None = None
        labels = self.dm.train_full.labels
        for x, _, idx in self.dm.dynamics_dataloader():
            f = self.net.features(x.to(self.device)).float()
            i = idx.to(self.device)
            if self.trainer.world_size > 1:
                f, i = self.all_gather(f).flatten(0, 1), self.all_gather(i).reshape(-1)
            if feats is None:
                feats = torch.zeros(len(labels), f.shape[1])
            feats[i.cpu()] = f.cpu()
        self.train(was)
        return feats, labels

    def scored_rows(self) -> torch.Tensor:
        """Mask ``[N_orig]`` of the originals the detection phase trained on (ranked, and counted in the detection
        metrics): all of them, less the clean probes' originals when their copies replaced them
        (the official code leaves those never-visited rows out of the ranking too)."""
        return scoring.scored_mask(self.dm.num_original, getattr(self.dm, "default_train_rows", None))

    def detection_scores(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """(score ``[N_all]``, keep-mask over originals ``[N_orig]``, extras to save) for the current defence."""
        dm = self.dm
        n = dm.num_original
        kind = dm.probe_kind
        scored = torch.nonzero(self.scored_rows()).squeeze(1)
        extras: dict[str, Any] = {}
        if self.defence in ("badloss", "badloss_two_class", "abl"):
            traj = self.recorder().trajectories
            if traj is None:
                raise ConfigError("loss dynamics were not recorded (callbacks.loss_dynamics.enabled=false?)")
            traj = traj.double()
            epochs = scoring.filter_epochs(traj) if self.use_filter else list(range(traj.shape[1]))
            extras.update(trajectories=traj.numpy(), kept_epochs=np.array(epochs))
            t = traj[:, epochs]
        if self.defence == "badloss":
            score, _ = scoring.badloss_scores(traj, kind == 1, self.k, self.eps, self.log_scores, self.use_filter)
            keep = torch.zeros(n, dtype=torch.bool)
            keep[scored[scoring.select_keep(scoring.scores_to_ranks(score[scored]), self.reject_frac)]] = True
        elif self.defence == "badloss_two_class":
            score = scoring.two_class_scores(t, t[kind == 1], t[kind == 2], self.two_class_k)
            keep = score[:n] <= 0.5
        elif self.defence == "abl":
            score, remove = baselines.abl_isolation(traj[:n, -1], self.abl_isolation)
            keep = ~remove
        else:
            feats, labels = self.features()
            extras["features_dim"] = feats.shape[1]
            if self.defence == "spectral":
                score, remove = baselines.spectral_signatures(feats[:n], labels[:n], self.ss_eps)
            else:
                score, remove = baselines.activation_clustering(
                    feats[:n],
                    labels[:n],
                    size_threshold=self.ac_size_threshold,
                    seed=self.trainer.current_epoch,
                )
            keep = ~remove
        # The defender's own probes are known clean: their originals always stay, their copies always go.
        src = dm.probe_source[kind == 1]
        keep[src] = True
        return score, keep, extras

    def detect(self) -> None:
        """Score, log detection quality, shrink the training set and restart from scratch (phase 3)."""
        dm = self.dm
        n = dm.num_original
        score, keep_mask, extras = self.detection_scores()
        scored = self.scored_rows()
        poison = dm.poison_attack[:n][scored]
        s = score[:n].double()[scored]
        kept = keep_mask[scored]
        logs = {
            **scoring.detection_aucs(s, poison, dm.attack_names),
            "detect/poison_removed": float((~kept[poison >= 0]).float().mean()) if (poison >= 0).any() else 0.0,
            "detect/clean_removed": float((~kept[poison < 0]).float().mean()),
            "detect/kept": float(keep_mask.sum()),
        }
        for a_id, name in enumerate(dm.attack_names):
            if (poison == a_id).any():
                logs[f"detect/removed_{name}"] = float((~kept[poison == a_id]).float().mean())
        for key, v in logs.items():
            if np.isfinite(v):
                self.log(key, float(v), rank_zero_only=True, sync_dist=False)
        log.info("detection (%s): %s", self.defence, {k: round(v, 4) for k, v in logs.items()})
        if self.save_trajectories and self.trainer.is_global_zero:
            out = Path(self.trainer.default_root_dir) / "badloss_detection.npz"
            out.parent.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(
                out,
                scores=score.double().numpy(),
                keep=keep_mask.numpy(),
                poison_attack=dm.poison_attack.numpy(),
                probe_kind=dm.probe_kind.numpy(),
                probe_source=dm.probe_source.numpy(),
                attack_names=np.array(dm.attack_names),
                **{k: v for k, v in extras.items() if isinstance(v, np.ndarray)},
            )
        self.keep = torch.nonzero(keep_mask).squeeze(1)
        dm.set_train_keep(self.keep)
        self.recorder().enabled = False
        self.phase = "retrain"
        # Fresh weights for retraining from scratch: differ per run seed (torch.initial_seed() is the seed that
        # seed_everything set) and per detection length, identical across DDP ranks.
        reset_parameters(self.net, seed=(torch.initial_seed() + int(self.trainer.current_epoch) + 7919) % 2**63)
        if self.optimizer_factory is not None:
            self.trainer.strategy.setup_optimizers(self.trainer)

    # -- checkpoints ------------------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["badloss"] = {"phase": self.phase, "keep": self.keep}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("badloss", {})
        self.phase = state.get("phase", self.phase)
        self.keep = state.get("keep")
