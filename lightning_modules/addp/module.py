"""ADDP (Pang, Xu & Wang, ICLR 2025): a conditional diffusion model for dense perception, with the paper's three
insights as switchable components. No official code exists; the choices the paper leaves open are marked
*interpretation* here and in docs/methods/addp.md.

* Task: the denoiser D(x~, sigma~ | image, expression) generates a depth map (Marigold-style, image concatenated to
  the noisy target, pixel space at this scale) or the referred object's mask (InstructPix2Pix-style editing with an
  expression embedding). Targets live in [-1, 1]: depth ``2 (d - d_min)/(d_max - d_min) - 1`` with the fixed metric
  range ``depth_min..depth_max`` (the same for every image, no per-image normalisation), masks ``2 m - 1``.
* Depth metrics (:mod:`lightning_modules.addp.metrics`) compare the decoded metres with the metric ground truth:
  ``depth_protocol=pooled`` (the suite's, on the embedded scenes: every valid pixel of the split) or ``nyu_eigen``
  (the standard NYUv2 protocol of the paper's comparison: Eigen crop, 10 m cap, per-image means).
* Diffusion: discrete VP timesteps t in 1..T (:mod:`ops.addp.timesteps`), EDM preconditioning
  (:class:`layers.diffusion.EDMPrecond`), the x0 loss ``lambda(sigma~) |D(x0_in + sigma~ n) - x0|^2`` on valid pixels,
  sampled with the suite's ODE solvers (DDIM = ``euler``, or RX-DPM) on the K DDIM timesteps.
* Insight 1 (``timestep_dist``): ``uniform`` (vanilla DDPM), ``contribution`` (p_t from the measured per-step x0
  quality on validation batches, :func:`ops.addp.contribution_curve`, refreshed at every validation, uniform before
  the first; *interpretation*), ``power`` (a fixed early-favouring prior). ``timestep_use``: ``sample`` (t ~ p_t) or
  ``weight`` (t ~ U, weight T p_t[t]); both give the same expected loss.
* Insight 2 (``augment``): noise a drift-simulating perturbation of the target while regressing the clean target
  (:mod:`ops.addp.augment`; ``self`` uses the model's own detached x0-prediction ``self_gap`` timesteps noisier).
* Insight 3 (referring masks): classifier-free guidance trained by dropping the expression (``p_uncond``), and
  ``correction_rounds`` of correctional guidance at test time: a simulated user sees the mask, names the wrong object
  it covers most (a negative expression), then gives the refined expression; each round re-noises the previous mask
  to the DDIM step ``restart_step`` and denoises on with :func:`ops.addp.correctional_cfg` (*interpretation*).
* Expression encoder (``text_encoder``): ``hash``, the datamodule's signed bag-of-words hash (the embedded stand-in,
  no weights), or ``bert``, a pretrained transformers encoder of the expressions' text (BERT-style, loaded from
  ``text_encoder_path``, frozen unless ``text_encoder_trainable``) pooled and projected by a learned linear map to
  ``net.cond_dim`` (:class:`layers.vision_language.pretrained_text.PretrainedTextEncoder`): the paper's kind.
* Baseline ``mode=discriminative``: the same network in one step (x~ = 0, fixed noise input), trained by regression
  (depth, MSE) or segmentation (masks, BCE): same size, same budget.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from core.errors import ConfigError, NonFiniteLossError
from core.rng import fixed_draws
from core.smoke import smoke_test
from layers.diffusion.precond import EDMPrecond
from layers.vision_language.pretrained_text import PretrainedTextEncoder
from lightning_modules._base import OptimizerFactory, SchedulerFactory, SuiteLitModule
from lightning_modules.addp.metrics import DEPTH_PROTOCOLS, DepthMetrics, MaskMetrics, depth_errors, nyu_eigen_errors
from ops.addp import (
    contribution_curve,
    correctional_cfg,
    ddim_timesteps,
    loss_weight,
    mix_self,
    power_distribution,
    sample_timesteps,
    tailored_augment,
    vp_sigma_tilde,
)
from ops.samplers import SAMPLERS, recording, rx_sample, sample
from ops.samplers.rx import RX_SOLVERS

TASKS = ("depth", "refseg")
MODES = ("diffusion", "discriminative")
DISTS = ("uniform", "contribution", "power")
TEXT_ENCODERS = ("hash", "bert")
# condition key of the batch -> the key of its text (PerceptionDataModule): used when text_encoder != hash
TEXT_KEYS = {"cond": "text", "refined": "refined_text", "obj_conds": "obj_texts"}
TASK_AUGMENTS = {"depth": ("none", "self", "shift", "warp", "mix"), "refseg": ("none", "self", "morph", "shift", "mix")}


def pick_negative(pred: Tensor, obj_masks: Tensor, obj_valid: Tensor, obj_conds: Tensor) -> Tensor:
    """The simulated user's correction: the expression of the wrong object the predicted mask covers most.

    Args:
        pred: Predicted masks, bool [B, 1, H, W].
        obj_masks: Object masks [B, M, 1, H, W]; row 0 is the target (never a negative).
        obj_valid: [B, M] objects that exist. obj_conds: their expression embeddings [B, M, D].

    Returns:
        [B, D]: the negative expression, zeros where the mask covers no wrong object.
    """
    overlap = (pred[:, None].bool() & obj_masks.bool()).flatten(2).sum(2).float()  # [B, M]
    overlap[:, 0] = -1
    overlap[~obj_valid.bool()] = -1
    j = overlap.argmax(1)
    has = overlap.max(1).values > 0
    return obj_conds[torch.arange(len(j)), j].float() * has[:, None].float()


class AddpLitModule(SuiteLitModule):
    """ADDP perception diffusion model and its discriminative baseline (see the module docstring).

    Args:
        net: SmallUNet with ``in_channels=1``, ``cond_channels=3`` and ``cond_dim`` = the expression embedding size.
        task: ``depth`` or ``refseg``.
        mode: ``diffusion`` or ``discriminative`` (the one-step baseline of the same size).
        T: Training timesteps. n_steps: DDIM steps K. solver: an ``ops.samplers`` solver; rx: RX-DPM on it.
        beta_min, beta_max: Linear-beta VP schedule. sigma_data: EDM data std.
        timestep_dist, timestep_use, contribution_floor, contribution_smooth, contribution_ema, power_gamma: insight 1.
        augment, augment_prob, augment_strength, self_gap: insight 2 (``mix`` draws one kind of the task per batch).
        p_uncond: Probability of dropping the expression in training (CFG). guidance_w: CFG weight at sampling.
        correction_rounds, correction_w_neg, restart_step: insight 3 (refseg, test time).
        depth_min, depth_max: The fixed depth range (metres) mapped to [-1, 1], the same for every image.
        depth_protocol: ``pooled`` (every valid pixel of the split; the embedded scenes) or ``nyu_eigen`` (the
            standard NYUv2 protocol: Eigen crop, 10 m cap, per-image means) for the depth metrics.
        curve_batches: Validation/test batches whose per-step x0 quality is measured.
        text_encoder: ``hash`` (the batch's hashed ``cond`` / ``refined`` / ``obj_conds``; the embedded stand-in) or
            ``bert`` (a pretrained transformers encoder of the batch's ``text`` / ``refined_text`` / ``obj_texts``).
        text_encoder_path: ``bert``: a local folder (config, weights, tokenizer) or a hub name (bert-base-uncased).
        text_encoder_trainable: ``bert``: fine-tune the encoder too (default frozen; the projection always trains).
        text_pooling: ``bert``: ``mean`` | ``cls`` | ``pooler`` token-feature pooling before the projection.
        text_max_length: ``bert``: tokens kept per expression.
    """

    def __init__(
        self,
        net: nn.Module,
        task: str = "depth",
        mode: str = "diffusion",
        T: int = 100,
        n_steps: int = 10,
        solver: str = "euler",
        rx: bool = False,
        rx_k: int = 2,
        beta_min: float = 0.1,
        beta_max: float = 20.0,
        sigma_data: float = 0.5,
        timestep_dist: str = "uniform",
        timestep_use: str = "sample",
        contribution_floor: float = 0.2,
        contribution_smooth: float = 2.0,
        contribution_ema: float = 0.5,
        power_gamma: float = 1.0,
        augment: str = "none",
        augment_prob: float = 0.5,
        augment_strength: float = 0.5,
        self_gap: int = 10,
        p_uncond: float = 0.1,
        guidance_w: float = 1.0,
        correction_rounds: int = 3,
        correction_w_neg: float = 1.0,
        restart_step: int = 5,
        depth_min: float = 0.0,
        depth_max: float = 10.0,
        depth_protocol: str = "pooled",
        curve_batches: int = 2,
        text_encoder: str = "hash",
        text_encoder_path: str | None = None,
        text_encoder_trainable: bool = False,
        text_pooling: str = "mean",
        text_max_length: int = 64,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "step",
        monitor: str = "val/loss",
    ) -> None:
        super().__init__(optimizer, scheduler, scheduler_interval, monitor)
        choices = {
            "task": (task, TASKS),
            "mode": (mode, MODES),
            "timestep_dist": (timestep_dist, DISTS),
            "timestep_use": (timestep_use, ("sample", "weight")),
            "solver": (solver, tuple(SAMPLERS)),
            "depth_protocol": (depth_protocol, DEPTH_PROTOCOLS),
            "text_encoder": (text_encoder, TEXT_ENCODERS),
        }
        for key, (val, allowed) in choices.items():
            if val not in allowed:
                raise ConfigError(f"model.{key}={val!r} must be one of {list(allowed)}")
        if augment not in TASK_AUGMENTS[task]:
            raise ConfigError(f"model.augment={augment!r} must be one of {list(TASK_AUGMENTS[task])} for task={task}")
        if rx and solver not in RX_SOLVERS:
            raise ConfigError(f"model.rx=true needs model.solver in {list(RX_SOLVERS)}, got {solver!r}")
        if T < 2 or not 1 <= n_steps <= T or not 0 <= restart_step < n_steps:
            raise ConfigError(
                "need T >= 2, 1 <= n_steps <= T, 0 <= restart_step < n_steps "
                f"(T={T}, n_steps={n_steps}, restart_step={restart_step})"
            )
        if not (0 <= augment_prob <= 1 and 0 <= p_uncond < 1 and 0 <= contribution_ema < 1 and self_gap >= 0):
            raise ConfigError("need augment_prob in [0, 1], p_uncond and contribution_ema in [0, 1), self_gap >= 0")
        if depth_max <= depth_min or correction_rounds < 1 or curve_batches < 0:
            raise ConfigError("need depth_max > depth_min, correction_rounds >= 1, curve_batches >= 0")
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"])
        self.net = net
        self.cond_dim = int(getattr(net, "cond_dim", 0))
        self.text_encoder: nn.Module | None = None
        if text_encoder == "bert":
            if not text_encoder_path:
                raise ConfigError(
                    "model.text_encoder=bert needs model.text_encoder_path: a local folder or a hub name "
                    "(e.g. bert-base-uncased)"
                )
            if self.cond_dim < 1:
                raise ConfigError("model.text_encoder=bert needs a denoiser with model.net.cond_dim >= 1")

            self.text_encoder = PretrainedTextEncoder.from_pretrained(
                str(text_encoder_path),
                self.cond_dim,
                pooling=text_pooling,
                trainable=text_encoder_trainable,
                max_length=text_max_length,
            )
        self.precond = EDMPrecond(net, sigma_data)
        self.steps = ddim_timesteps(T, n_steps)
        p0 = power_distribution(T, power_gamma) if timestep_dist == "power" else torch.full((T,), 1.0 / T)
        self.register_buffer("p_t", p0.double())
        self._curve_sum: Tensor | None = None
        self._curve_n = 0
        self.metrics = nn.ModuleDict(
            {s: DepthMetrics(s, depth_protocol) if task == "depth" else MaskMetrics(s) for s in ("val", "test")}
        )
        self.round_metrics = nn.ModuleList([MaskMetrics("test") for _ in range(correction_rounds)])
        # control of the correction rounds: the same restarts with the original expression and no negative, so that
        # round r can be compared with what the re-noise + re-denoise alone does (test/iou_restart{r})
        self.restart_metrics = nn.ModuleList([MaskMetrics("test") for _ in range(correction_rounds - 1)])

    # -- data ------------------------------------------------------------------------------------------------------
    def expression(self, batch: dict[str, Any], key: str = "cond") -> Tensor:
        """The embedding of the batch's expressions, ``cond`` / ``refined`` ``[B, D]`` or ``obj_conds`` ``[B, M, D]``:
        the batch's hashed vectors (``text_encoder=hash``) or the text encoder of its strings (``obj_texts``: one
        line per object)."""
        if self.text_encoder is None:
            return batch[key].float()
        texts = batch.get(TEXT_KEYS[key])
        if texts is None:
            raise ConfigError(
                f"model.text_encoder={self.hparams.text_encoder} encodes the expressions' text, but the batch has no "
                f"{TEXT_KEYS[key]!r} (PerceptionDataModule provides it)"
            )
        if key != "obj_conds":
            return self.text_encoder(list(texts))
        rows = [t.split("\n") for t in texts]
        m = batch["obj_masks"].shape[1]
        if any(len(r) != m for r in rows):
            raise ConfigError(f"obj_texts must hold one line per object ({m}), got {[len(r) for r in rows]}")
        return self.text_encoder([t for r in rows for t in r]).view(len(rows), m, -1)

    def encode(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """(x0 [B, 1, H, W] in [-1, 1], valid [B, 1, H, W], conditions) of a batch; checks the embedding size."""
        h = self.hparams
        cond = self.expression(batch)
        if cond.ndim != 2 or cond.shape[1] != self.cond_dim:
            raise ConfigError(
                f"condition embedding has shape {tuple(cond.shape)}, the denoiser expects [B, {self.cond_dim}] "
                f"(set data.cond_dim and model.net.cond_dim to the same size)"
            )
        valid = batch["valid"].bool() & torch.isfinite(batch["target"])
        t = torch.nan_to_num(batch["target"].float(), nan=0.0, posinf=0.0, neginf=0.0)
        x0 = (2 * (t - h.depth_min) / (h.depth_max - h.depth_min) - 1).clamp(-1, 1) if h.task == "depth" else 2 * t - 1
        x0 = torch.where(valid, x0, torch.zeros_like(x0))
        return x0, valid, {"cond_image": batch["image"].float() * 2 - 1, "cond": cond}

    def decode(self, x: Tensor) -> Tensor:
        """Model space -> depth in metres, or a boolean mask."""
        h = self.hparams
        if h.task == "depth":
            return (x.clamp(-1, 1) + 1) / 2 * (h.depth_max - h.depth_min) + h.depth_min
        return x > 0

    # -- training --------------------------------------------------------------------------------------------------
    def sigma_of(self, t: Tensor) -> Tensor:
        return vp_sigma_tilde(t, self.hparams.T, self.hparams.beta_min, self.hparams.beta_max).float().to(self.device)

    def _augment(self, x0: Tensor, t: Tensor, c: dict[str, Tensor]) -> Tensor:
        h = self.hparams
        kind = h.augment
        if kind == "none" or h.augment_prob == 0:
            return x0
        if kind == "mix":
            opts = [k for k in TASK_AUGMENTS[h.task] if k not in ("none", "mix")]
            kind = opts[int(torch.randint(len(opts), (1,)))]
        if kind == "self":
            t_hi = (t + h.self_gap).clamp(max=h.T)
            s_hi = self.sigma_of(t_hi)
            with torch.no_grad():
                hat = self.precond(x0 + s_hi.view(-1, 1, 1, 1) * torch.randn_like(x0), s_hi, **c)
            aug = mix_self(x0, hat.clamp(-1, 1), h.augment_strength)
        else:
            aug = tailored_augment(x0, kind, h.augment_strength)
        pick = (torch.rand(x0.shape[0], device=x0.device) < h.augment_prob).view(-1, 1, 1, 1)
        return torch.where(pick, aug, x0)

    def diffusion_loss(self, batch: dict[str, Tensor], train: bool = True) -> Tensor:
        """E_t [w(t) lambda(sigma~_t) mean_valid |D(x0_in + sigma~_t n, sigma~_t) - x0|^2] (module docstring)."""
        h = self.hparams
        x0, valid, c = self.encode(batch)
        b = x0.shape[0]
        if train and h.p_uncond > 0 and h.task == "refseg":
            keep = (torch.rand(b, 1, device=x0.device) >= h.p_uncond).float()
            c = {**c, "cond": c["cond"] * keep}
        if h.timestep_use == "sample" or not train:
            t = sample_timesteps(self.p_t.cpu() if train else torch.full((h.T,), 1.0 / h.T, dtype=torch.float64), b)
            w = torch.ones(b, dtype=torch.float64)
        else:
            t = torch.randint(1, h.T + 1, (b,))
            w = loss_weight(self.p_t.cpu(), t)
        sigma = self.sigma_of(t)
        x_in = self._augment(x0, t, c) if train else x0
        y = x_in + sigma.view(-1, 1, 1, 1) * torch.randn_like(x0)
        err = ((self.precond(y, sigma, **c) - x0) ** 2 * valid).flatten(1).sum(1) / valid.flatten(1).sum(1).clamp_min(1)
        return (w.float().to(x0.device) * self.precond.loss_weight(sigma) * err).mean()

    def discriminative_loss(self, batch: dict[str, Tensor]) -> Tensor:
        x0, valid, c = self.encode(batch)
        out = self.one_step(c)
        if self.hparams.task == "depth":
            per = (out - x0) ** 2
        else:
            per = F.binary_cross_entropy_with_logits(out, (x0 > 0).float(), reduction="none")
        return (per * valid).sum() / valid.sum().clamp_min(1)

    def one_step(self, c: dict[str, Tensor]) -> Tensor:
        """The discriminative baseline's prediction: the same network F(0, c_noise = 0 | conditions)."""
        x = c["cond_image"].new_zeros(c["cond_image"].shape[0], 1, *c["cond_image"].shape[-2:])
        return self.net(x, x.new_zeros(x.shape[0]), **c)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        diff = self.hparams.mode == "diffusion"
        loss = self.diffusion_loss(batch) if diff else self.discriminative_loss(batch)
        if not torch.isfinite(loss):
            raise NonFiniteLossError(f"train/loss is {float(loss)} at step {self.global_step}")
        self.log("train/loss", loss, prog_bar=True)
        return loss

    # -- sampling --------------------------------------------------------------------------------------------------
    def guided(self, c: dict[str, Tensor], neg: Tensor | None = None, w_neg: float = 0.0):
        """Denoiser D(x, sigma) with the conditions bound, CFG weight ``guidance_w`` and an optional negative."""
        w = self.hparams.guidance_w

        def den(x: Tensor, sigma: Tensor) -> Tensor:
            d_c = self.precond(x, sigma.to(x.dtype), **c)
            if w == 1.0 and (neg is None or w_neg == 0.0):
                return d_c
            d_u = self.precond(x, sigma.to(x.dtype), **{**c, "cond": torch.zeros_like(c["cond"])})
            d_n = self.precond(x, sigma.to(x.dtype), **{**c, "cond": neg}) if neg is not None and w_neg else None
            return correctional_cfg(d_c, d_u, d_n, w, w_neg)

        return den

    def grid(self, start: int = 0) -> Tensor:
        """sigma~ of the DDIM timesteps from step ``start`` on, then 0 (the last step outputs the x0-prediction)."""
        s = vp_sigma_tilde(self.steps[start:], self.hparams.T, self.hparams.beta_min, self.hparams.beta_max)
        return torch.cat([s, s.new_zeros(1)])

    @torch.no_grad()
    def predict(self, c: dict[str, Tensor], x_start: Tensor | None = None, start: int = 0, **guide: Any):
        """Sample x0 from noise (or re-noise ``x_start`` to step ``start``); returns (x0 [B, 1, H, W], per-call x0)."""
        img = c["cond_image"]
        if self.hparams.mode == "discriminative":
            out = self.one_step(c)
            out = torch.tanh(out) if self.hparams.task == "refseg" else out
            return out, [(0.0, out)]
        sig = self.grid(start)
        base = x_start if x_start is not None else torch.zeros(img.shape[0], 1, *img.shape[-2:], device=img.device)
        x = base + float(sig[0]) * torch.randn_like(base)
        den, calls = recording(self.guided(c, **guide))
        if self.hparams.rx:
            out = rx_sample(den, x, sig, self.hparams.solver, self.hparams.rx_k)
        else:
            out = sample(den, x, sig, self.hparams.solver)
        return out.x, calls

    # -- evaluation ------------------------------------------------------------------------------------------------
    def x0_quality_curve(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Quality of the x0-prediction before the first step (x0 = 0) and after each denoiser call: {metric: [K+1]}
        (``absrel``, ``delta1`` for depth by ``depth_protocol``; ``iou`` (overall over the batch) for masks). Used by
        :class:`callbacks.x0_quality.X0QualityCurve` and by ``timestep_dist=contribution``."""
        x0, valid, c = self.encode(batch)
        _, calls = self.predict(c)
        preds = [torch.zeros_like(x0)] + [d for _, d in calls]
        out: dict[str, list[float]] = {}
        for p in preds:
            if self.hparams.task == "depth" and self.hparams.depth_protocol == "nyu_eigen":
                e = nyu_eigen_errors(self.decode(p), batch["target"], valid)  # per-image means, as the metrics
                out.setdefault("absrel", []).append(float(e["absrel"].mean()) if len(e["absrel"]) else 0.0)
                out.setdefault("delta1", []).append(float(e["delta1"].mean()) if len(e["delta1"]) else 0.0)
            elif self.hparams.task == "depth":
                e = depth_errors(self.decode(p), batch["target"], valid)
                n = float(e["n"].clamp_min(1))
                out.setdefault("absrel", []).append(float(e["absrel"]) / n)
                out.setdefault("delta1", []).append(float(e["delta1"]) / n)
            else:
                m, t = self.decode(p), batch["target"] > 0.5
                union = float((m | t).sum())
                out.setdefault("iou", []).append(float((m & t).sum()) / union if union else 1.0)
        return {k: torch.tensor(v, dtype=torch.float64) for k, v in out.items()}

    def _small(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Debug modes evaluate 8 items of a batch (sampling, curves and rounds are many network calls)."""
        if self._trainer is not None and smoke_test(self.trainer):
            return {k: v[:8] for k, v in batch.items()}
        return batch

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        # timesteps and noise of the loss and the samples: the same draws at every validation and in every run
        with fixed_draws(batch_idx, self.device):
            self._validate(self._small(batch), batch_idx)

    def _validate(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        diff = self.hparams.mode == "diffusion"
        loss = self.diffusion_loss(batch, train=False) if diff else self.discriminative_loss(batch)
        self.log("val/loss", loss, prog_bar=True, batch_size=batch["image"].shape[0])
        self._evaluate(batch, "val")
        if diff and self.hparams.timestep_dist == "contribution" and batch_idx < max(self.hparams.curve_batches, 1):
            key = "absrel" if self.hparams.task == "depth" else "iou"
            q = self.x0_quality_curve(batch)[key]
            self._curve_sum = q if self._curve_sum is None else self._curve_sum + q
            self._curve_n += 1

    def on_validation_epoch_end(self) -> None:
        if self._curve_sum is None or self.trainer.sanity_checking:
            self._curve_sum, self._curve_n = None, 0
            return
        self.refresh_p_t(self._curve_sum / self._curve_n)
        # mass of p_t on the noisier half of t (T/2..T-1): the early denoising steps
        self.log("train/p_t_mass_noisy_half", float(self.p_t[self.hparams.T // 2 :].sum()))
        self._curve_sum, self._curve_n = None, 0

    def refresh_p_t(self, quality: Tensor) -> None:
        """p_t <- ema p_t + (1 - ema) contribution_curve(quality [K+1]) (insight 1, ``timestep_dist=contribution``)."""
        h = self.hparams
        p_new = contribution_curve(
            quality, self.steps, h.T, h.task == "refseg", h.contribution_floor, h.contribution_smooth
        )
        p = h.contribution_ema * self.p_t.cpu() + (1 - h.contribution_ema) * p_new
        self.p_t.copy_((p / p.sum()).to(self.p_t))

    def _evaluate(self, batch: dict[str, Tensor], stage: str) -> None:
        x0, valid, c = self.encode(batch)
        pred, _ = self.predict(c)
        metrics = self.metrics[stage]
        if self.hparams.task == "depth":
            metrics.update(self.decode(pred), batch["target"], valid)
        else:
            metrics.update(self.decode(pred), batch["target"] > 0.5)
        for key, m in metrics.items().items():
            self.log(key, m, on_epoch=True, batch_size=x0.shape[0])
        if stage == "test" and self.hparams.task == "refseg":
            self._rounds(batch, c, pred)

    def _rounds(self, batch: dict[str, Tensor], c: dict[str, Tensor], pred: Tensor) -> None:
        """Correction rounds: 1 = the expression; 2 = + a negative naming the wrong object the mask covers most;
        3+ = the refined expression + that negative, each re-noised to ``restart_step`` (see the module docstring)."""
        h, target = self.hparams, batch["target"] > 0.5
        neg, w_neg, first, c0 = None, 0.0, pred, c
        for r, metric in enumerate(self.round_metrics):
            if r > 0 and h.mode == "diffusion":
                if r == 1:
                    objs = self.expression(batch, "obj_conds")
                    neg = pick_negative(self.decode(pred), batch["obj_masks"], batch["obj_valid"], objs)
                    w_neg = h.correction_w_neg
                if r >= 2:
                    c = {**c, "cond": self.expression(batch, "refined")}
                pred, _ = self.predict(c, x_start=pred.clamp(-1, 1), start=h.restart_step, neg=neg, w_neg=w_neg)
            metric.update(self.decode(pred), target)
            self.log(f"test/iou_round{r + 1}", metric.iou, on_epoch=True, batch_size=pred.shape[0])
        if h.mode != "diffusion":
            return
        ctrl = first
        for r, metric in enumerate(self.restart_metrics, start=2):
            ctrl, _ = self.predict(c0, x_start=ctrl.clamp(-1, 1), start=h.restart_step)
            metric.update(self.decode(ctrl), target)
            self.log(f"test/iou_restart{r}", metric.iou, on_epoch=True, batch_size=ctrl.shape[0])

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        with fixed_draws(batch_idx, self.device):  # paired across runs: every run samples from the same noise
            self._evaluate(self._small(batch), "test")
