"""The subject ViT of MDA's experiments and the attribution benchmark run on it.

MDA (Walker, Jha & Ewetz, ICLR 2025) explains a *trained* vision transformer; it trains nothing. The suite's
experiment therefore trains the subject, a timm ``VisionTransformer`` shrunk to the embedded 28x28 Fashion-MNIST
images (patch 4, 49 tokens, 3 blocks), on the poisoned datamodule with one planted ``patch`` backdoor (its trigger
location is the ground truth of the held-out localisation metric), and, when ``attribution.enabled``, runs
:func:`lightning_modules.mda.evaluation.evaluate_attributions` at the end of ``test`` and logs its
``attr/<method>/<metric>`` values.

``subject_ckpt`` loads the subject's weights from a file instead: a suite checkpoint of this experiment (the
``net.*`` entries of its ``state_dict``) or a plain timm state dict (e.g. real ViT-B/16, ViT-Ti/16 or ViT-B/32
ImageNet weights saved with ``torch.save(model.state_dict(), path)``, with ``model.net`` set to the matching
``timm.create_model`` call). ``train=false model.subject_ckpt=...`` is the attribution-only run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import CheckpointError, ConfigError
from lightning_modules._base import (
    OptimizerFactory,
    SchedulerFactory,
    SuiteLitModule,
    classification_metrics,
    metric_inputs,
)
from lightning_modules.mda.baselines import get_baseline
from lightning_modules.mda.evaluation import check_mono_neg_substrate, evaluate_attributions

log = logging.getLogger(__name__)


def load_subject(net: nn.Module, path: str) -> None:
    """Load ``net``'s weights from a suite checkpoint (``net.*`` keys) or a plain state dict; clear errors."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise CheckpointError(f"model.subject_ckpt={path}: no such file")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - truncated/unsafe file: one user-facing line
        raise CheckpointError(f"model.subject_ckpt={path}: cannot read ({type(err).__name__}: {err})") from None
    if isinstance(state, dict) and "state_dict" in state:
        state = {k[4:]: v for k, v in state["state_dict"].items() if k.startswith("net.")}
    if not isinstance(state, dict) or not state:
        raise CheckpointError(f"model.subject_ckpt={path}: no weights found (expected a state dict)")
    try:
        net.load_state_dict(state)
    except RuntimeError as err:
        first = str(err).splitlines()[0] if str(err) else "shape/key mismatch"
        raise CheckpointError(f"model.subject_ckpt={path} does not fit model.net: {first}") from None


class MdaLitModule(SuiteLitModule):
    """Classifier training for the subject ViT, plus MDA's attribution benchmark after testing.

    Args:
        net: the subject, a timm ``VisionTransformer`` (config ``model.net``).
        num_classes: classes of the data.
        subject_ckpt: weights file to load into ``net`` (see module docstring), or ``None``.
        attribution: the benchmark's settings (``enabled``, ``n_images``, ``n_triggered``, ``methods``,
            ``mda_variants``, ``mda``, ``prior``, ``patch_count``, ``min_confidence``, ``topk``,
            ``mono_neg_substrate``); see
            ``conf/model/mda.yaml``.
        optimizer, scheduler, scheduler_interval: see :class:`SuiteLitModule`.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int = 10,
        subject_ckpt: str | None = None,
        attribution: dict | None = None,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "step",
    ) -> None:
        super().__init__(optimizer, scheduler, scheduler_interval)
        if getattr(net, "num_classes", num_classes) != num_classes:
            raise ConfigError(f"model.net has {net.num_classes} classes but model.num_classes={num_classes}")
        self.net, self.num_classes = net, num_classes
        self.attribution = dict(attribution or {})
        if self.attribution.get("enabled"):
            methods = list(self.attribution.get("methods", []))
            variants = dict(self.attribution.get("mda_variants") or {})
            for m in methods:
                if m not in variants:
                    get_baseline(m)  # unknown names fail at construction
            prior = self.attribution.get("prior", "bidirectional")
            get_baseline(prior)
            pc = int(self.attribution.get("patch_count", 49))
            if pc < 2:
                raise ConfigError(f"model.attribution.patch_count={pc} must be >= 2")

            check_mono_neg_substrate(self.attribution.get("mono_neg_substrate", "blur"))
        if subject_ckpt:
            load_subject(self.net, subject_ckpt)
        self.train_metrics = classification_metrics(num_classes, "train")
        self.val_metrics = classification_metrics(num_classes, "val")
        self.test_metrics = nn.ModuleList([classification_metrics(num_classes, "test")])
        self._test_images: dict[int, list[torch.Tensor]] = {}
        self._test_labels: dict[int, list[torch.Tensor]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, K]`` of images ``[B, C, H, W]``."""
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch[0], batch[1]
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.train_metrics.update(metric_inputs(logits, self.num_classes), y)
        self.log("train/loss", loss, prog_bar=True)
        self.log_dict(self.train_metrics, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch[0], batch[1]
        logits = self(x)
        self.val_metrics.update(metric_inputs(logits, self.num_classes), y)
        self.log("val/loss", F.cross_entropy(logits, y), prog_bar=True)
        self.log_dict(self.val_metrics)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch[0], batch[1]
        logits = self(x)
        if dataloader_idx == 0:
            self.test_metrics[0].update(metric_inputs(logits, self.num_classes), y)
            self.log("test/loss", F.cross_entropy(logits, y), add_dataloader_idx=False)
            self.log_dict(self.test_metrics[0], add_dataloader_idx=False)
        else:
            asr = (logits.argmax(1) == y).float().mean()
            names = getattr(getattr(self.trainer, "datamodule", None), "test_names", None)
            name = names[dataloader_idx] if names and dataloader_idx < len(names) else str(dataloader_idx)
            self.log(f"test/asr_{name}", asr, add_dataloader_idx=False)
        keep = int(self.attribution.get("n_images" if dataloader_idx == 0 else "n_triggered", 0))
        have = sum(len(t) for t in self._test_images.get(dataloader_idx, []))
        if self.attribution.get("enabled") and have < keep:
            self._test_images.setdefault(dataloader_idx, []).append(x[: keep - have].detach().cpu())
            self._test_labels.setdefault(dataloader_idx, []).append(y[: keep - have].detach().cpu())

    def on_test_epoch_end(self) -> None:
        if not self.attribution.get("enabled"):
            log.warning("mda: model.attribution.enabled=false: this run tested the subject ViT only, no attribution")
            return
        if 0 not in self._test_images:
            log.warning("mda: attribution measured nothing: the test set gave no clean image (attr/n_images 0)")
            return

        cfg = self.attribution
        images, labels = torch.cat(self._test_images[0]), torch.cat(self._test_labels[0])
        triggered = gt_mask = trigger_target = None
        dm = getattr(self.trainer, "datamodule", None)
        triggers = getattr(dm, "triggers", None)
        if 1 in self._test_images and triggers and "patch" in triggers:
            triggered = torch.cat(self._test_images[1])
            trigger_target = int(dm.targets["patch"])
            zero = torch.zeros_like(triggered[0])
            trig = (triggers["patch"](zero) != zero).any(0).double()
            # ground truth at the ViT's resolution: every patch token the trigger touches
            ps = int(self.net.patch_embed.patch_size[0])
            gt_mask = F.interpolate(F.max_pool2d(trig[None, None], ps), scale_factor=ps)[0, 0] > 0
        out_dir = Path(self.trainer.default_root_dir) if cfg.get("save_examples", True) else None
        variants = {k: dict(v or {}) for k, v in dict(cfg.get("mda_variants") or {}).items()}
        mda_kwargs = dict(cfg.get("mda") or {})
        if "blur_klen" in mda_kwargs:
            mda_kwargs["blur_klen"] = tuple(mda_kwargs["blur_klen"])
        self.net.eval()
        with torch.inference_mode(False), torch.enable_grad():
            images = images.clone()  # tensors captured in test_step are inference tensors: copy them out
            triggered = None if triggered is None else triggered.clone()
            results = evaluate_attributions(
                self.net,
                images.to(self.device),
                labels,
                list(cfg.get("methods", [])),
                variants,
                mda_kwargs,
                patch=int(self.net.patch_embed.patch_size[0]),
                patch_count=int(cfg.get("patch_count", 49)),
                prior=cfg.get("prior", "bidirectional"),
                min_confidence=float(cfg.get("min_confidence", 0.6)),
                triggered=None if triggered is None else triggered.to(self.device),
                trigger_target=trigger_target,
                gt_mask=gt_mask,
                topk=int(cfg.get("topk", 1)),
                example_dir=out_dir,
                mono_neg_substrate=str(cfg.get("mono_neg_substrate", "blur")),
            )
        for k, v in results.items():
            self.log(k, float(v), add_dataloader_idx=False)
        self._test_images, self._test_labels = {}, {}
        for line in measured_nothing(results, len(images), None if triggered is None else len(triggered), cfg):
            log.warning(line)


def measured_nothing(results: dict[str, float], tried: int, triggered: int | None, cfg: dict) -> list[str]:
    """One line per part of the benchmark that measured nothing: no clean image passed the paper's filters
    (``attr/n_images`` 0), or the backdoor fired on none of the triggered images (``attr/n_localisation`` 0)."""
    lines = []
    if int(results.get("attr/n_images", 0)) == 0:
        lines.append(
            f"mda: attribution measured nothing: 0 of {tried} clean test images usable "
            f"({int(results.get('attr/skipped_wrong', 0))} misclassified, {int(results.get('attr/skipped_lowconf', 0))}"
            f" below min_confidence={cfg.get('min_confidence', 0.6)}, {int(results.get('attr/skipped_blur', 0))} "
            "without a blur calibration); train the subject longer or raise model.attribution.n_images"
        )
    if triggered and int(results.get("attr/n_localisation", 0)) == 0:
        lines.append(
            f"mda: localisation measured nothing: the backdoor fired on none of {triggered} triggered test images "
            "(attr/n_localisation 0)"
        )
    return lines
