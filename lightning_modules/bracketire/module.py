"""BracketIRE / BracketIRE+ restoration from exposure brackets (Zhang et al., ICLR 2025) and its baselines.

``arch`` picks the network (one experiment covers the method and its baselines):

* ``tmrnet`` -- TMRNet (:class:`~layers.vision.tmrnet.TMRNet`): aligned features, temporally modulated recurrence
  (a shared block plus frame-specific blocks scaled by ``alpha``, initialised to 0), reconstruction (+ the x4
  head with ``beta`` initialised to 0 for BracketIRE+);
* ``shared`` -- the same recurrence with the shared block only (no frame-specific blocks, no ``alpha``);
* ``single`` -- a network on the reference frame alone; ``early`` -- early fusion of all frames, no alignment;
* ``average`` -- exposure-normalised frame averaging (no parameters: evaluate with ``train=false``).

``mode``:

* ``supervised`` -- the synthetic loss ``|| mu(y / 16) - mu(clip(gt / 16, 0, 1)) ||_1`` (:func:`ops.isp.losses.
  synthetic_loss`), AdamW with cosine warm-up (``conf/model/bracketire.yaml``).
* ``adapt`` -- self-supervised adaptation to unlabelled brackets of another domain (paper Sec. 5.2; the official
  ``real_model.py``): the student starts from ``init_ckpt`` (a supervised run), the teacher is its copy updated as an
  EMA of the student after every step (decay 0.999), and the loss is the EMA term plus ``w_self`` times the
  temporally unbalanced term with ``t ~ U{0, .., self_frames - 1}`` (:func:`ops.isp.losses.self_adapt_loss`). The
  ground truth is never read in training; validation / test use it for scoring only. The official settings
  (AdamW lr 7.5e-5, cosine to 1e-6, no warm-up: ``real_bash/train_real.sh``) are ``conf/model/bracketire_adapt.yaml``.

Inputs are exposure-normalised (``x_i 4^(2 - i)``) and only the first ``frames`` exposures are used (the ablation
of the number of frames). Metrics: PSNR and SSIM (torchmetrics) on the 16-bit mu-tonemapped linear sRGB of the
output and ground truth (white balance, half-resolution demosaic, CCM from the sample's metadata), with a border
of ``crop`` pixels removed, as the official evaluation (``syn_metrics.py``).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torchmetrics
from torch import Tensor, nn

from core.errors import CheckpointError, ConfigError
from core.smoke import smoke_test
from core.typecheck import check_kwargs
from layers.vision.burst_baselines import EarlyFusionNet, FrameAverage, SingleFrameNet
from layers.vision.tmrnet import DCN_IMPLS, FLOWS, TMRNet
from lightning_modules._base import OptimizerFactory, SchedulerFactory, SuiteLitModule
from lightning_modules.bracketire.examples import save_examples
from ops.isp.losses import ema_, self_adapt_loss, synthetic_loss
from ops.isp.process import tonemapped_srgb
from ops.isp.simulate import exposure_normalize

ARCHS = ("tmrnet", "shared", "single", "early", "average")
MODES = ("supervised", "adapt")


#: TMRNet arguments that ``model.net`` does not set: the frame count, the arch and the scale are the module's own
#: (``model.frames`` slices the inputs, ``model.arch`` picks the network, ``model.scale`` is checked against the data).
MODULE_OWNED = {"num_frames": "model.frames", "specific": "model.arch", "scale": "model.scale"}


def net_args(net: Mapping[str, Any] | None) -> dict[str, Any]:
    """``model.net`` over :class:`~layers.vision.tmrnet.TMRNet`'s own defaults: every width / alignment argument.

    Raises:
        ConfigError: a key that is not a TMRNet argument (or is one of :data:`MODULE_OWNED`), or a value of the wrong
            type, named ``model.net.<key>``.
    """
    params = inspect.signature(TMRNet).parameters
    given = dict(net or {})
    owned = sorted(k for k in given if k in MODULE_OWNED)
    if owned:
        raise ConfigError(f"model.net.{owned[0]} is set by {MODULE_OWNED[owned[0]]}, not model.net")
    valid = [k for k in params if k not in MODULE_OWNED]
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ConfigError(f"model.net has unknown keys {unknown}; valid: {valid}")
    check_kwargs(TMRNet, given, "model.net")
    return {k: given.get(k, params[k].default) for k in valid}


def build_net(arch: str, frames: int, scale: int, **net: Any) -> nn.Module:
    """The network of ``arch`` from the TMRNet arguments ``net`` (:func:`net_args`); the baselines take its width,
    feature and reconstruction blocks, and ``n_common + n_specific`` blocks as their body."""
    a = net_args(net)
    if arch in ("tmrnet", "shared"):
        return TMRNet(frames, specific=arch == "tmrnet", scale=scale, **a)
    body = a["n_common"] + a["n_specific"]
    if arch == "single":
        return SingleFrameNet(a["channels"], a["n_feat"], body, a["n_recon"], scale)
    if arch == "early":
        return EarlyFusionNet(frames, a["channels"], a["n_feat"], body, a["n_recon"], scale)
    return FrameAverage(scale)


def _metrics(stage: str, kernel: int) -> torchmetrics.MetricCollection:
    return torchmetrics.MetricCollection(
        {
            # per-image PSNR averaged over the split, as the official evaluation (pooling the squared error over
            # the split would let a few bad brackets dominate)
            "psnr": torchmetrics.image.PeakSignalNoiseRatio(data_range=1.0, dim=(1, 2, 3)),
            # torchmetrics sizes a Gaussian window from sigma alone (kernel_size is ignored): sigma = 1.5 k / 11 gives
            # a k x k window with the standard 11 / 1.5 shape (Wang et al. 2004) for every odd k
            "ssim": torchmetrics.image.StructuralSimilarityIndexMeasure(
                data_range=1.0, kernel_size=kernel, sigma=1.5 * kernel / 11
            ),
        },
        prefix=f"{stage}/",
    )


class BracketIRELitModule(SuiteLitModule):
    """Exposure-bracket restoration; see the module docstring.

    Args:
        net: :class:`~layers.vision.tmrnet.TMRNet` arguments (``model.net`` in the config; missing keys: TMRNet's
            defaults): ``channels``, ``n_feat``/``n_common``/``n_specific``/``n_recon`` (paper: 64, 5/16/24/5),
            ``alpha_init``/``alpha_learnable``, ``flow`` (``zero | oracle | learned``), ``dcn_groups``,
            ``max_offset``, ``dcn_impl`` (``batched``: the fast CPU twin). The baselines take its width and blocks.
        arch: ``tmrnet | shared | single | early | average``.
        mode: ``supervised | adapt``.
        frames: exposures used (the first ``frames`` of 5).
        scale: 1 (BracketIRE) or 4 (BracketIRE+); must match the data.
        w_self, ema_decay, self_frames: adaptation: weight of the self term, teacher decay, ``t`` range.
        init_ckpt: checkpoint whose network initialises this one (required by ``mode=adapt``).
        crop: border (output pixels) removed before scoring; ssim_kernel: SSIM's Gaussian window.
        examples: at the end of testing (not in debug runs), save ``bracketire_examples.png`` with this many test
            brackets (input frames, output, ground truth); 0 disables.
        optimizer, scheduler, scheduler_interval, monitor: see :class:`SuiteLitModule`.
    """

    def __init__(
        self,
        net: Mapping[str, Any] | None = None,
        arch: str = "tmrnet",
        mode: str = "supervised",
        frames: int = 5,
        scale: int = 1,
        w_self: float = 1.0,
        ema_decay: float = 0.999,
        self_frames: int = 3,
        init_ckpt: str | None = None,
        crop: int = 2,
        ssim_kernel: int = 7,
        examples: int = 4,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "step",
        monitor: str = "val/loss",
    ) -> None:
        super().__init__(optimizer, scheduler, scheduler_interval, monitor)
        net_kwargs = net_args(net)
        flow, dcn_impl = net_kwargs["flow"], net_kwargs["dcn_impl"]
        channels, dcn_groups = net_kwargs["channels"], net_kwargs["dcn_groups"]
        checks = [
            (arch in ARCHS, f"model.arch={arch!r} must be one of {list(ARCHS)}"),
            (mode in MODES, f"model.mode={mode!r} must be one of {list(MODES)}"),
            (flow in FLOWS, f"model.net.flow={flow!r} must be one of {list(FLOWS)}"),
            (dcn_impl in DCN_IMPLS, f"model.net.dcn_impl={dcn_impl!r} must be one of {list(DCN_IMPLS)}"),
            (1 <= frames <= 5, f"model.frames={frames} must be in 1..5"),
            (scale in (1, 4), f"model.scale={scale} must be 1 (BracketIRE) or 4 (BracketIRE+)"),
            (
                channels >= 1 and dcn_groups >= 1 and channels % dcn_groups == 0,
                f"model.net.channels={channels} must be a positive multiple of model.net.dcn_groups={dcn_groups}",
            ),
            (0.0 <= ema_decay < 1.0, f"model.ema_decay={ema_decay} must be in [0, 1)"),
            (
                1 <= self_frames < frames or mode != "adapt",
                f"model.self_frames={self_frames} must be in 1..frames-1 ({frames - 1}) for mode=adapt",
            ),
            (mode != "adapt" or init_ckpt, "model.mode=adapt needs model.init_ckpt (a supervised checkpoint)"),
            (crop >= 0 and ssim_kernel % 2 == 1, "model.crop must be >= 0, model.ssim_kernel odd"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"])
        self.hparams["net"] = net_kwargs  # every argument the network was built with, defaults included
        self.arch, self.mode, self.frames, self.scale, self.crop = arch, mode, frames, scale, crop
        self.net = build_net(arch, frames, scale, **net_kwargs)
        if init_ckpt:
            self._load_init(Path(init_ckpt))
        self.teacher = copy.deepcopy(self.net).requires_grad_(False) if mode == "adapt" else None
        if not any(p.requires_grad for p in self.net.parameters()):
            self.automatic_optimization = False  # frame averaging: nothing to train
        self.val_metrics, self.test_metrics = _metrics("val", ssim_kernel), _metrics("test", ssim_kernel)
        self._example_batch: dict[str, Any] | None = None

    def _load_init(self, path: Path) -> None:
        if not path.is_file():
            raise CheckpointError(f"model.init_ckpt={path}: no such checkpoint (train the supervised run first)")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
        except Exception as err:  # noqa: BLE001 - a truncated / foreign file becomes one line
            raise CheckpointError(f"model.init_ckpt={path}: cannot be read ({type(err).__name__}: {err})") from None
        net_state = {k[len("net.") :]: v for k, v in state.items() if k.startswith("net.")}
        missing, unexpected = self.net.load_state_dict(net_state, strict=False)
        if missing or unexpected:
            raise CheckpointError(
                f"model.init_ckpt={path} does not fit model.arch={self.arch} at this width "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
            )

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.net.parameters() if p.requires_grad]

    def configure_optimizers(self) -> Any:
        return super().configure_optimizers() if self.trainable_parameters() else None

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule if self.trainer is not None else None
        data_scale = getattr(dm, "scale", self.scale)
        if data_scale != self.scale:
            raise ConfigError(f"model.scale={self.scale} but the data is x{data_scale} (data.dataset)")

    # -- forward -----------------------------------------------------------------------------------------------
    def _inputs(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        raws = batch["raws"]
        if raws.dim() != 5 or raws.shape[2] != 4 or raws.shape[1] < self.frames:
            raise ConfigError(
                f"brackets must be [B, T >= {self.frames}, 4, h, w] (packed RGGB exposures), got {tuple(raws.shape)}"
            )
        return exposure_normalize(raws[:, : self.frames]), batch["flow"][:, : self.frames]

    def forward(self, raws: Tensor, flow: Tensor | None = None) -> Tensor:
        """``raws`` ``[B, T, 4, h, w]`` exposure-normalised -> HDR RAW ``[B, 4, s h, s w]``."""
        return self.net(raws, flow)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        raws, flow = self._inputs(batch)
        if self.mode == "adapt":
            outs = self.net(raws, flow, return_all=True)
            with torch.no_grad():
                teacher = self.teacher(raws, flow)
            t = int(torch.randint(0, self.hparams.self_frames, (1,)))
            loss, self_term = self_adapt_loss(outs, teacher, t, self.hparams.w_self)
            self.log("train/self_term", self_term)
        else:
            if "gt" not in batch:
                raise ConfigError("mode=supervised needs ground truth: the shifted domain's training split has none")
            loss = synthetic_loss(self.net(raws, flow), batch["gt"])
        self.log("train/loss", loss, prog_bar=True)
        return loss if self.automatic_optimization else None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.teacher is not None:  # mean teacher: EMA of the student after every step
            ema_(self.teacher, self.net, self.hparams.ema_decay)

    def _score(self, batch: dict[str, Any], stage: str) -> None:
        raws, flow = self._inputs(batch)
        out = self.net(raws, flow)
        gt = batch["gt"]
        if out.shape != gt.shape:
            raise ConfigError(f"output {tuple(out.shape)} and ground truth {tuple(gt.shape)} differ (model.scale?)")
        self.log(f"{stage}/loss", synthetic_loss(out, gt), batch_size=gt.shape[0])
        c = self.crop
        pred, target = tonemapped_srgb(out, batch["meta"]), tonemapped_srgb(gt, batch["meta"])
        if c:
            pred, target = pred[..., c:-c, c:-c], target[..., c:-c, c:-c]
        k = self.hparams.ssim_kernel
        if min(pred.shape[-2:]) < k:  # SSIM's reflect padding needs the scored area at least one window wide
            raise ConfigError(
                f"the scored area {tuple(pred.shape[-2:])} (output {tuple(out.shape[-2:])} less model.crop={c} per "
                f"border) is smaller than model.ssim_kernel={k}: raise data.patch_size or lower model.crop / "
                "model.ssim_kernel"
            )
        metrics = self.val_metrics if stage == "val" else self.test_metrics
        metrics.update(pred, target)
        self.log_dict(metrics, batch_size=gt.shape[0])
        if stage == "test" and self._example_batch is None:
            n = self.hparams.examples
            meta = {k: v[:n] for k, v in batch["meta"].items()}
            self._example_batch = {"raws": raws[:n], "out": out[:n], "gt": gt[:n], "meta": meta}

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._score(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._score(batch, "test")

    def on_test_epoch_end(self) -> None:
        alpha = getattr(self.net, "alpha", None)
        if isinstance(alpha, Tensor):  # how far the frame-specific branches switched on
            self.log("test/alpha_abs", alpha.detach().abs().mean())
        self.log("test/params", float(sum(p.numel() for p in self.net.parameters())))  # capacity beside the score
        batch, trainer = self._example_batch, self.trainer
        wanted = batch is not None and self.hparams.examples and not smoke_test(trainer)
        if wanted and trainer.is_global_zero and trainer.default_root_dir:
            save_examples(batch, Path(trainer.default_root_dir) / "bracketire_examples.png")
        self._example_batch = None
