"""PreWorld (Li et al., ICLR 2025): a semi-supervised vision-centric 3D occupancy world model.

Two stages (Sec. 3.4), one module selected by ``stage``:

* ``pretrain``: self-supervised from 2D labels. The voxel volume of the current frame, and the forecast volume of
  each step k, are rendered along the rays of frame k (Sec. 3.2): SILog depth + class-weighted CE on rendered
  semantics + L1 colour (weight 1 each) + 0.01 background-transmittance entropy + 0.01 distortion, plus the
  trajectory loss on the ego waypoints (Sec. 3.3).
* ``finetune``: fully supervised with 3D occupancy labels on the OccHead outputs of the current and each forecast
  step (class-weighted focal CE, sem_scal, geo_scal, Lovasz-softmax, each x1) plus the trajectory loss. It starts
  from the pre-trained weights through ``init_from`` (a checkpoint of the pretrain run); without it, it is the
  no-pre-training baseline.

The forecast horizon follows the curriculum of each stage (:func:`ops.occupancy.schedule.horizon_schedule`).
Where the official code differs from the paper, the paper is the default and the official behaviour is a flag:
``depth_mode=official`` (rendered depth ``39 sum w s`` with s = t/(1+t) against metric ground truth; the default
``contracted`` is the metric distance to the contracted sample, :mod:`ops.occupancy.render`), ``roll_state=False``
(the ego state is re-embedded from the current state at every step, never rolled forward),
``official_label_offset`` (pre-train-only evaluation scores forecast step k against frame k+1: the +2 labels of the
non-fine-tuned branch of ``simple_test``; its fine-tuned branch uses +1, as here), and the official 3D-loss forms
``loss_camera_mask=false`` (unmasked), ``focal_form=sigmoid`` (``CustomFocalLoss``: sigmoid focal x100, free-class
weight 0, radial voxel weight) and ``lovasz_drop_free=true`` (Lovasz without free voxels). Official and not
switchable: bin-midpoint ray samples and the trajectory loss summed over forecast steps; official by default: the
background length ``(half-extent - radius) / radius`` (``bg_len=null``).

Baselines at the same budget: ``init_from=null`` (no pre-training), ``ego_conditioning=false``; copy-last (the current
prediction warped into each future ego frame by the known poses; ``*_copy_last``), with the ground-truth copy-last
(``*_copy_last_gt``, an upper reference) and the unwarped copy (``*_copy_last_unwarped``) beside it, and the
constant-velocity planner (``*_cv``) are scored in every evaluation beside the model, on the same predictions.
Evaluation conventions (:meth:`PreWorldLitModule.epoch_metrics`): current-frame mIoU camera-masked (Occ3D), 4D mIoU
unmasked (the official 4D evaluation; ``*_masked`` beside it), planning by the ST-P3 metric (L2 and ego-box
collisions averaged over the steps up to each horizon; the point form as ``col_point``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path

import torch
import torchmetrics

from core.errors import CheckpointError, ConfigError, NonFiniteLossError
from layers.occupancy.preworld import AttributeHeads, Forecaster, LiftSplat, OccHead, forecast
from lightning_modules._base import SuiteLitModule
from lightning_modules.preworld.metrics import (
    IGNORE,
    OccupancyIoU,
    collisions,
    horizon_average,
    stp3_collisions,
    warp_occupancy,
)
from ops.occupancy import losses as L
from ops.occupancy.render import DEPTH_MODES, render_rays
from ops.occupancy.schedule import horizon_schedule, ray_sampling_weights

log = logging.getLogger(__name__)
STAGES = ("pretrain", "finetune")
# forecasters scored unmasked per horizon: the model; copy-last warped into each future ego frame by the known poses
# (the standard baseline); the same with the ground-truth current occupancy (an upper reference, not a baseline);
# the model's current prediction copied without ego-motion compensation (what the warp adds to copy-last)
FORECASTERS = ("fore", "copy", "copy_gt", "copy_unwarped")
FORECAST_KEYS = {"fore": "", "copy": "_copy_last", "copy_gt": "_copy_last_gt", "copy_unwarped": "_copy_last_unwarped"}
# planning per step: L2 and ST-P3 ego-box collisions of the model and of constant velocity, and the point form
PLANNING = ("l2", "l2_cv", "col", "col_cv", "col_point", "col_point_cv")
FOCAL_FORMS = ("softmax", "sigmoid")


@dataclasses.dataclass(frozen=True)
class LossWeights:
    """The weight of each loss term (``model.loss.<term>``). Pre-training (Sec. 3.2): ``depth`` (SILog), ``sem``
    (class-weighted CE on rendered semantics), ``rgb`` (L1 colour), ``entropy`` (background transmittance),
    ``distortion``; fine-tuning (Sec. 3.4): ``focal``, ``sem_scal``, ``geo_scal``, ``lovasz``; both: ``traj``
    (Sec. 3.3). The defaults are the paper's."""

    depth: float = 1.0
    sem: float = 1.0
    rgb: float = 1.0
    entropy: float = 0.01
    distortion: float = 0.01
    traj: float = 1.0
    focal: float = 1.0
    sem_scal: float = 1.0
    geo_scal: float = 1.0
    lovasz: float = 1.0

    @classmethod
    def of(cls, weights: Mapping[str, float] | LossWeights | None) -> LossWeights:
        """``weights`` (the config's ``loss`` node; terms it leaves out keep their default) as :class:`LossWeights`."""
        if weights is None or isinstance(weights, cls):
            return weights or cls()
        terms = {f.name for f in dataclasses.fields(cls)}
        if unknown := sorted(set(weights) - terms):
            raise ConfigError(f"model.loss.{unknown[0]}: no such loss term (terms: {', '.join(sorted(terms))})")
        return cls(**{k: float(v) for k, v in weights.items()})


class PreWorldLitModule(SuiteLitModule):
    """PreWorld and its baselines.

    Args:
        stage: ``pretrain`` (2D rendering + trajectory) or ``finetune`` (3D labels + trajectory).
        init_from: Checkpoint whose network weights start this run (stage 2 reads stage 1's ``last.ckpt``).
        num_classes: Occupancy classes, the last one free.
        grid, pc_range: Voxel grid (X, Y, Z) and its metres (x0, y0, z0, x1, y1, z1); must match the data.
        channels: Voxel feature width (official 32).
        context, depth_bins, depth_range, encoder_width, stride, backbone, timm_index: image encoder / lift-splat
            (``backbone=timm:<name>`` for a timm backbone).
        horizon: Largest forecast step K; ``curriculum`` follows the stage's schedule up to it.
        n_rays: Rays per frame per item drawn (class-balanced, without replacement) for the rendering losses.
        n_inner, interval, center, radius, bg_len: ray sampling and raw2alpha (official: radius 39 of a 40 m
            grid, centre z 2.2, interval 0.5; ``bg_len=None``: the official ``(half-extent - radius) / radius``).
        depth_mode: rendered-depth convention, ``contracted`` | ``official``.
        loss: loss weights, one per term (:class:`LossWeights`; a mapping, terms left out keep the paper's
            weight). focal_gamma: focal exponent. camera_mask: metrics on camera-visible voxels only
            (Occ3D's mask_camera). loss_camera_mask: the 3D losses on camera-visible voxels only (official: false).
        focal_form: ``softmax`` (class-weighted focal CE) or ``sigmoid`` (official ``CustomFocalLoss``);
            focal_alpha: its alpha. lovasz_drop_free: Lovasz term without free voxels (official).
        density_threshold: pretrain-only prediction: occupied iff density > it (official 8.5).
        ego_conditioning, roll_state, official_label_offset: see the module docstring.
    """

    def __init__(
        self,
        stage: str = "pretrain",
        init_from: str | None = None,
        num_classes: int = 5,
        grid: tuple[int, int, int] = (16, 16, 4),
        pc_range: tuple[float, ...] = (-8.0, -8.0, -1.0, 8.0, 8.0, 3.0),
        channels: int = 16,
        context: int = 16,
        depth_bins: int = 16,
        depth_range: tuple[float, float] = (1.0, 12.0),
        encoder_width: int = 32,
        stride: int = 2,
        backbone: str = "cnn",
        timm_index: int = 2,
        state_dim: int = 21,
        horizon: int = 3,
        curriculum: bool = True,
        n_rays: int = 256,
        n_inner: int = 32,
        interval: float = 0.5,
        center: tuple[float, float, float] = (0.0, 0.0, 1.0),
        radius: float = 7.8,
        bg_len: float | None = None,
        depth_mode: str = "contracted",
        loss: Mapping[str, float] | LossWeights | None = None,
        focal_gamma: float = 2.0,
        camera_mask: bool = True,
        loss_camera_mask: bool = True,
        focal_form: str = "softmax",
        focal_alpha: float = 0.25,
        lovasz_drop_free: bool = False,
        density_threshold: float = 8.5,
        ego_conditioning: bool = True,
        roll_state: bool = True,
        official_label_offset: bool = False,
        optimizer=None,
        scheduler=None,
        scheduler_interval: str = "step",
    ) -> None:
        super().__init__(optimizer, scheduler, scheduler_interval, monitor="val/loss")
        if stage not in STAGES:
            raise ConfigError(f"model.stage={stage!r} must be one of {list(STAGES)}")
        if horizon < 0 or n_rays < 1 or num_classes < 2:
            raise ConfigError("model.horizon must be >= 0, model.n_rays >= 1 and model.num_classes >= 2")
        for key, val, ok in (("depth_mode", depth_mode, DEPTH_MODES), ("focal_form", focal_form, FOCAL_FORMS)):
            if val not in ok:
                raise ConfigError(f"model.{key}={val!r} must be one of {list(ok)}")
        if bg_len is None and not (pc_range[3] - pc_range[0]) / 2 > radius > 0:
            raise ConfigError(f"model.radius={radius} must be below the grid's half-extent for bg_len=null")
        self.loss_weights = LossWeights.of(loss)
        self.save_hyperparameters(ignore=["optimizer", "scheduler", "loss"])
        self.hparams["loss"] = dataclasses.asdict(self.loss_weights)  # plain data in the checkpoint
        self.stage, self.init_from = stage, init_from
        self.grid, self.pc_range, self.num_classes, self.horizon = tuple(grid), tuple(pc_range), num_classes, horizon
        self.lift = LiftSplat(
            grid, pc_range, depth_range, depth_bins, context, channels, encoder_width, stride, backbone, timm_index
        )
        self.attrs = AttributeHeads(channels, num_classes - 1)
        self.occ_head = OccHead(channels, num_classes)
        self.forecaster = Forecaster(channels, state_dim)
        self.register_buffer("class_w", torch.ones(num_classes))
        self.register_buffer("ray_class_w", torch.ones(num_classes - 1))
        self.metrics = torch.nn.ModuleDict()
        for split in ("val", "test"):
            for k in range(horizon + 1):
                self.metrics[f"{split}_occ_{k}"] = OccupancyIoU(num_classes)  # camera-masked (if camera_mask)
                if k:
                    for name in FORECASTERS:  # unmasked: the official 4D evaluation
                        self.metrics[f"{split}_{name}_{k}"] = OccupancyIoU(num_classes)
                    self.metrics[f"{split}_copy_masked_{k}"] = OccupancyIoU(num_classes)
                    for name in PLANNING:  # per step; horizon-averaged (ST-P3) at the end of the epoch
                        self.metrics[f"{split}_{name}_{k}"] = torchmetrics.MeanMetric()
            self.metrics[f"{split}_occupied"] = torchmetrics.MeanMetric()
            self.metrics[f"{split}_density_max"] = torchmetrics.MaxMetric()

    # -- set-up ---------------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        train = getattr(dm, "datasets", {}).get("train") if dm is not None else None
        if train is not None and len(train):
            counts = torch.zeros(self.num_classes, dtype=torch.float64)
            for it in list(train)[:200]:
                counts += torch.bincount(it["occ"][0].reshape(-1), minlength=self.num_classes)[: self.num_classes]
            self.class_w.copy_(L.class_weights(counts.clamp_min(1.0)).float())
            self.ray_class_w.copy_(L.class_weights(counts[:-1].clamp_min(1.0)).float())
        if self.init_from and stage == "fit":
            self._load_init(self.init_from)

    def _load_init(self, path: str) -> None:
        p = Path(path)
        if not p.is_file():
            raise CheckpointError(f"model.init_from={path}: no such checkpoint (run the pretrain stage first)")
        try:
            state = torch.load(p, map_location="cpu", weights_only=True)["state_dict"]
        except Exception as err:  # noqa: BLE001 - a truncated or foreign file becomes one line
            msg = f"model.init_from={path}: cannot read the checkpoint ({type(err).__name__})"
            raise CheckpointError(msg) from None
        own = self.state_dict()
        keep = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape and not k.startswith("metrics")}
        if not any(k.startswith("lift.") for k in keep):
            raise CheckpointError(f"model.init_from={path}: not a PreWorld checkpoint of this grid/width")
        self.load_state_dict(keep, strict=False)

    # -- forward --------------------------------------------------------------------------------------------
    def steps(self) -> int:
        if not self.hparams.curriculum:
            return self.horizon
        return horizon_schedule(self.current_epoch + 1, self.stage, self.horizon)

    def volumes(self, batch: dict, steps: int):
        v = self.lift(batch["img"], batch["intrins"], batch["cam2ego"])
        vols, offsets = forecast(
            v, batch["ego_state"], self.forecaster, steps, self.hparams.roll_state, self.hparams.ego_conditioning
        )
        return [v, *vols], offsets

    def _draw_rays(self, batch: dict, k: int) -> dict:
        """``n_rays`` rays of frame k per item, class-balanced (official weighted sampling) among valid rays."""
        valid, sem = batch["ray_valid"][:, k], batch["ray_sem"][:, k]
        idx = []
        for b in range(valid.shape[0]):
            w = ray_sampling_weights(sem[b], torch.zeros_like(sem[b]), ()) * valid[b]
            if w.sum() <= 0:
                w = torch.ones_like(w)
            n = min(self.hparams.n_rays, int((w > 0).sum()))
            pick = torch.multinomial(w.float(), n, replacement=False)
            idx.append(torch.cat([pick, pick[:1].expand(self.hparams.n_rays - n)]))
        idx = torch.stack(idx)

        def take(x: torch.Tensor) -> torch.Tensor:
            return torch.gather(
                x[:, k], 1, idx.view(*idx.shape, *([1] * (x.dim() - 3))).expand(*idx.shape, *x.shape[3:])
            )

        return {key: take(batch[key]) for key in ("rays_o", "rays_d", "ray_depth", "ray_sem", "ray_rgb", "ray_valid")}

    def render(self, v: torch.Tensor, rays: dict) -> dict[str, torch.Tensor]:
        """Volume rendering (Sec. 3.2, Eq. 5) of the attributes of V along ``rays`` (``rays_o``/``rays_d`` [B, R, 3]):
        :func:`ops.occupancy.render.render_rays` with this module's sampling and depth convention."""
        h = self.hparams
        return render_rays(
            self.attrs(v),
            rays["rays_o"],
            rays["rays_d"],
            self.pc_range,
            tuple(h.center),
            h.radius,
            h.bg_len,
            h.n_inner,
            h.interval,
            0.0,
            h.depth_mode,
        )

    def render_loss(self, v: torch.Tensor, rays: dict) -> dict[str, torch.Tensor]:
        """Sec. 3.2 losses of one frame's rays rendered from the volume V."""
        out = self.render(v, rays)
        ok = rays["ray_valid"]
        losses = {
            "depth": L.silog(out["depth"][ok], rays["ray_depth"][ok]),
            "sem": L.weighted_ce(out["semantic"][ok], rays["ray_sem"][ok], self.ray_class_w, IGNORE),
            "rgb": L.l1_color(out["rgb"].flatten(0, 1), rays["ray_rgb"].flatten(0, 1)),
            "entropy": L.background_entropy(out["t_last"]),
        }
        losses["distortion"] = L.distortion_loss(out["weights"].flatten(0, 1), out["s"][None], out["s_interval"])
        return losses

    def occ_loss(self, logits: torch.Tensor, occ: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Sec. 3.4 losses: logits [B, C, X, Y, Z] vs occ [B, X, Y, Z] (camera-visible voxels if loss_camera_mask;
        the official ``loss_voxel`` passes ``camera_mask=None``). ``focal_form=sigmoid`` and ``lovasz_drop_free``
        select the official focal and Lovasz forms (:func:`ops.occupancy.losses.sigmoid_focal`)."""
        h, free = self.hparams, self.num_classes - 1
        y = torch.where(mask, occ, torch.full_like(occ, IGNORE)) if h.loss_camera_mask else occ
        z, y = logits.permute(0, 2, 3, 4, 1).reshape(-1, self.num_classes), y.reshape(-1)
        if h.focal_form == "sigmoid":  # official: class weights with 0 for free, radial weight, x100
            cw = torch.cat([self.class_w[:free], self.class_w.new_zeros(1)])
            b, _, x, yy, zz = logits.shape
            rw = L.radial_weight(x, yy, logits.device, logits.dtype)[None, :, :, None].expand(b, x, yy, zz)
            focal = L.sigmoid_focal(z, y, cw, rw.reshape(-1), h.focal_gamma, h.focal_alpha, ignore_index=IGNORE)
        else:
            focal = L.focal_ce(z, y, self.class_w, h.focal_gamma, IGNORE)
        return {
            "focal": focal,
            "sem_scal": L.sem_scal(z, y, IGNORE),
            "geo_scal": L.geo_scal(z, y, free, IGNORE),
            "lovasz": L.lovasz_softmax(z, y, IGNORE, drop_class=free if h.lovasz_drop_free else None),
        }

    def losses(self, batch: dict, steps: int) -> dict[str, torch.Tensor]:
        """The loss terms and their weighted sum (``loss``) of a forward pass over ``steps`` forecast steps."""
        vols, offsets = self.volumes(batch, min(steps, batch["waypoints"].shape[1]))
        return self.losses_of(batch, vols, offsets)

    def losses_of(self, batch: dict, vols: list[torch.Tensor], offsets: torch.Tensor) -> dict[str, torch.Tensor]:
        """The loss terms of the volumes ``vols`` (current frame first) and waypoint offsets [B, K, 2] of one
        forward pass (:meth:`volumes`), weighted by :attr:`loss_weights`."""
        w, steps = self.loss_weights, offsets.shape[1]
        total, parts = 0.0, {}
        for k, v in enumerate(vols):
            if self.stage == "pretrain":
                part = self.render_loss(v, self._draw_rays(batch, k))
            else:
                lab = batch["labelled"]
                if not lab.any():
                    continue
                part = self.occ_loss(self.occ_head(v[lab]), batch["occ"][lab, k], batch["mask_camera"][lab, k])
            for name, val in part.items():
                parts[name] = parts.get(name, 0.0) + val.detach()
                total = total + getattr(w, name) * val
        if steps:
            gt = batch["waypoints"][:, :steps]
            gt_off = torch.cat([gt[:, :1], gt[:, 1:] - gt[:, :-1]], 1)
            traj = L.trajectory_loss(offsets, gt_off)  # Sec. 3.3, per step
            parts["traj"] = traj.detach()
            total = total + w.traj * traj
        parts["loss"] = total if torch.is_tensor(total) else torch.zeros((), device=self.device, requires_grad=True)
        return parts

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        parts = self.losses(batch, self.steps())
        if not torch.isfinite(parts["loss"]):
            raise NonFiniteLossError(f"preworld: training loss is {float(parts['loss'])} at step {self.global_step}")
        bs = batch["img"].shape[0]
        self.log("train/horizon", float(self.steps()), batch_size=bs)
        for k, v in parts.items():
            self.log(f"train/{k}", v, prog_bar=k == "loss", batch_size=bs)
        return parts["loss"]

    # -- evaluation -----------------------------------------------------------------------------------------
    def predict_occ(self, v: torch.Tensor) -> torch.Tensor:
        """Labels [B, X, Y, Z]: OccHead argmax after fine-tuning; after pre-training only, density > threshold
        gives occupied voxels with the semantic head's class (official ``test_threshold``)."""
        if self.stage == "finetune":
            return self.occ_head(v).argmax(1)
        a = self.attrs(v)
        occupied = a[:, 0] > self.hparams.density_threshold
        free = torch.full_like(occupied, self.num_classes - 1, dtype=torch.long)
        return torch.where(occupied, a[:, 1:-3].argmax(1), free)

    def _eval(self, batch: dict, split: str) -> None:
        bs, kmax = batch["img"].shape[0], batch["waypoints"].shape[1]
        with torch.no_grad():  # one forward pass feeds the loss and the metrics
            vols, offsets = self.volumes(batch, min(self.horizon, kmax))
            parts = self.losses_of(batch, vols, offsets)
        self.log(f"{split}/loss", parts["loss"], batch_size=bs, prog_bar=split == "val")
        with torch.no_grad():
            self.score(batch, split, [self.predict_occ(v) for v in vols], offsets)
            if self.stage == "pretrain":
                self.metrics[f"{split}_density_max"].update(self.attrs(vols[0])[:, 0].max())

    def score(self, batch: dict, split: str, preds: list[torch.Tensor], offsets: torch.Tensor) -> None:
        """Update the metrics of one batch: occupancy labels ``preds`` [1 + K] x [B, X, Y, Z] (current frame first)
        and waypoint offsets [B, K, 2], with every baseline on the same batch."""
        kmax, free = batch["waypoints"].shape[1], self.num_classes - 1
        mask = batch["mask_camera"] if self.hparams.camera_mask else None
        # official +2 labels: only simple_test's non-fine-tuned (density threshold) branch; the fine-tuned one is +1
        shift = 1 if self.hparams.official_label_offset and self.stage == "pretrain" else 0
        self.metrics[f"{split}_occupied"].update((preds[0] != free).float().mean())
        for k, p in enumerate(preds):
            t = k + shift if k else 0
            if t > kmax:
                continue
            m, target = None if mask is None else mask[:, t], batch["occ"][:, t]
            self.metrics[f"{split}_occ_{k}"].update(p, target, m)
            if not k:
                continue
            pose = batch["ego_poses"][:, t]
            copy = warp_occupancy(preds[0], pose, self.pc_range, free)
            fore = {
                "fore": p,
                "copy": copy,
                "copy_gt": warp_occupancy(batch["occ"][:, 0], pose, self.pc_range, free),
                "copy_unwarped": preds[0],
            }
            for name, pred in fore.items():
                self.metrics[f"{split}_{name}_{k}"].update(pred, target)
            self.metrics[f"{split}_copy_masked_{k}"].update(copy, target, m)
        if not offsets.shape[1]:
            return
        wps = offsets.cumsum(1)
        steps = torch.arange(1, wps.shape[1] + 1, device=wps.device, dtype=wps.dtype)
        cv = batch["ego_state"][:, None, :2] * steps[None, :, None]  # constant velocity: k x the last displacement
        gt = batch["waypoints"][:, : wps.shape[1]]
        obst = batch["obstacles"][:, : wps.shape[1]]
        vals = {
            "l2": (wps - gt).norm(dim=-1),
            "l2_cv": (cv - gt).norm(dim=-1),
            "col_point": collisions(wps, obst, self.pc_range),
            "col_point_cv": collisions(cv, obst, self.pc_range),
        }
        if "agents" in batch:
            agents, ext = batch["agents"][:, : wps.shape[1]], batch["agents_range"]
            vals["col"], vals["col_cv"] = stp3_collisions(wps, gt, agents, ext), stp3_collisions(cv, gt, agents, ext)
        for name, v in vals.items():
            for k in range(wps.shape[1]):
                self.metrics[f"{split}_{name}_{k + 1}"].update(v[:, k])

    def epoch_metrics(self, split: str) -> dict[str, torch.Tensor]:
        """Compute and reset the split's metrics. Occupancy: ``miou``/``iou`` of the current frame (camera-masked
        if ``camera_mask``, Occ3D's 3D convention); per horizon ``miou_h{k}`` unmasked (the official 4D
        evaluation) beside ``miou_masked_h{k}``, and the baselines ``miou_copy_last*_h{k}``; their means over the
        horizons ``miou_forecast*``. Planning (ST-P3): ``l2_h{k}``, ``col_h{k}`` averaged over steps 1..k, and
        the mean over the horizons (``l2``, ``col``, the table's Avg.)."""
        out: dict[str, torch.Tensor] = {}
        means: dict[str, list[torch.Tensor]] = {}
        for k in range(self.horizon + 1):
            m = self.metrics[f"{split}_occ_{k}"]
            if not m.cm.update_called:
                continue
            res = m.compute()
            if k == 0:
                out["miou"], out["iou"] = res["miou"], res["iou"]
                continue
            copy_masked = self.metrics[f"{split}_copy_masked_{k}"].compute()["miou"]
            named = {"_masked": res["miou"], "_copy_last_masked": copy_masked}
            for name in FORECASTERS:
                r = self.metrics[f"{split}_{name}_{k}"].compute()
                named[FORECAST_KEYS[name]] = r["miou"]
                if name == "fore":
                    out[f"iou_h{k}"] = r["iou"]
            for suffix, v in named.items():
                out[f"miou{suffix}_h{k}"] = v
                means.setdefault(suffix, []).append(v)
        for suffix, vs in means.items():
            out[f"miou_forecast{suffix}"] = torch.stack(vs).mean()
        for name in PLANNING:
            per_step = [self.metrics[f"{split}_{name}_{k}"] for k in range(1, self.horizon + 1)]
            per_step = [mm.compute() for mm in per_step if mm.update_called]
            if per_step:
                hz = horizon_average(torch.stack(per_step))
                for k, v in enumerate(hz, 1):
                    out[f"{name}_h{k}"] = v
                out[name] = hz.mean()
        for key in ("occupied", "density_max"):
            mm = self.metrics[f"{split}_{key}"]
            if mm.update_called:
                out[key] = mm.compute()
        for mm in self.metrics.values():
            if isinstance(mm, torchmetrics.Metric) and mm.update_called:
                mm.reset()
        return out

    def _log_epoch(self, split: str) -> None:
        out = self.epoch_metrics(split)
        for key, v in out.items():
            self.log(f"{split}/{key}", v)
        warned = self.__dict__.setdefault("_zero_iou_warned", set())  # once per split, not at every validation
        if self.stage == "pretrain" and "occupied" in out and float(out["occupied"]) == 0.0 and split not in warned:
            warned.add(split)
            dmax = float(out.get("density_max", torch.tensor(float("nan"))))
            log.warning(
                "preworld: %s/iou and %s/miou are 0 because no voxel is predicted occupied: after pre-training alone "
                "a voxel is occupied iff its density exceeds model.density_threshold=%s (the official test_threshold), "
                "and the largest density is %.2f. Rendering trains densities up slowly; the 3D occupancy is scored "
                "after stage 2 (model.stage=finetune), or lower model.density_threshold to read these densities.",
                split,
                split,
                self.hparams.density_threshold,
                dmax,
            )

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval(batch, "test")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")
