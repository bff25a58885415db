"""TULIP (Najdenkoska et al., ICLR 2025): relative-position distillation and expansion of a CLIP text tower.

One system, three stages chosen by ``stages`` (run in order, ``stage_steps[s]`` optimiser steps each):

* ``clip``: CLIP's InfoNCE with a learned temperature (Radford et al., 2021) on (image, long caption cut at ``L``);
  trains the teacher, which a pretrained CLIP would give (``model.net.model_name`` + ``checkpoint``).
* ``distill`` (stage 1, Sec. 3.2, Eq. 4): the RoPE student starts as a copy of the teacher's blocks, token embedding
  (frozen), final LayerNorm and projection; loss ``1 - cos(f_T(x), f_S(x))`` (``mse`` / ``l2`` selectable) on the
  first ``L`` tokens of the long captions; AdamW, weight decay 0 on gains and biases, warmup + cosine.
* ``expand`` (stage 2, Sec. 3.3): NTK-aware base ``theta'`` for the extended context ``E`` (Eq. 5), then CLIP's
  loss ``long_weight * L(image, long caption at E) + short_weight * L(image, short caption)``, the whole dual
  encoder trained; ``0.8 : 0.2`` by default, the released recipe (``train_one_epoch_long_short`` with gradient
  accumulation, as its scripts run it; its ``accum_freq = 1`` branch sums them 1:1, ``long_weight=1
  short_weight=1``).

``text_tower`` picks the model of the later stages, which gives the baselines: ``rope`` (TULIP; with
``require_distill=false`` and no ``distill`` stage, the RoPE student without distillation; ``ntk_scaling_factor=null``
the one without NTK), ``absolute`` (CLIP fine-tuned and evaluated at ``L``: long captions truncated) and
``longclip`` (Long-CLIP, Zhang et al., 2024: the teacher's positions stretched to ``E``, keep ``longclip_keep`` then
interpolate; the kept rows frozen in training (``longclip_freeze_kept``); its short-caption loss matches the short
captions with the image features filtered to their top ``longclip_pca_dim`` principal components).

A stage can start from an earlier run: ``init_from`` is its run folder (``<run>/checkpoints/last.ckpt``) or a
checkpoint file; the checkpoint records which stages it completed. The official code differs from the paper in ways
noted in ``docs/methods/tulip.md`` (full-size causal mask, a dataset that never yields short captions, L_new < L_old
with its default flags); this module implements the paper.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.checkpoint import load_checkpoint
from core.errors import CheckpointError, ConfigError, NonFiniteLossError, check
from core.smoke import smoke_test
from datamodules.captions import truncate_tokens
from layers.vision_language import DualEncoder, RoPETextTower, clip_loss, pca_features, stretch_positions
from layers.vision_language import distill_loss as distill_loss_fn
from lightning_modules._base import SuiteLitModule
from lightning_modules.tulip.metrics import r1_by_length, recall_at_k

STAGES = ("clip", "distill", "expand")
TOWERS = ("rope", "absolute", "longclip")
MAKE_STUDENT = 'make train METHOD=tulip ARGS="model.stages=[clip,distill]"'


def _no_decay(name: str, p: nn.Parameter) -> bool:
    """The official exclusion (``main_distill_rope.py`` / ``main_context_finetune_rope.py``, from open_clip):
    ``p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n``. Position tables are matrices,
    so they *are* decayed."""
    return p.ndim < 2 or any(s in name for s in ("bn", "ln", "bias", "logit_scale"))


def _param_groups(named: list[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """AdamW groups of the official code: ``weight_decay`` on the rest, none on :func:`_no_decay` parameters (gains,
    biases, LayerNorms, the temperature); position tables are decayed, as there."""
    decay = [p for n, p in named if not _no_decay(n, p)]
    rest = [p for n, p in named if _no_decay(n, p)]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def warmup_cosine(warmup: int, total: int):
    """LR factor: linear warmup for ``warmup`` steps, then cosine to 0 at ``total`` (official ``cosine_lr``)."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(step - warmup, total - warmup) / max(total - warmup, 1)))

    return factor


def resolve_run(path: str) -> Path:
    """A run folder (its ``checkpoints/last.ckpt``) or a checkpoint file."""
    p = Path(path)
    if p.is_dir():
        p = p / "checkpoints" / "last.ckpt"
    if not p.is_file():
        raise CheckpointError(f"model.init_from={path}: no checkpoint there (expected a run folder or a .ckpt file)")
    return p


class TulipLitModule(SuiteLitModule):
    """TULIP's staged training (see the module docstring).

    Args:
        net: An open_clip ``CLIP`` (:func:`layers.vision_language.build_open_clip`: tiny sizes, or ``model_name``
            + a local ``checkpoint``); its context is the original ``L``.
        long_context: ``E``, the expanded context.
        stages: Stages to run, in order (subset of ``clip, distill, expand``).
        stage_steps: Optimiser steps per stage.
        text_tower: ``rope`` | ``absolute`` | ``longclip`` (see above).
        ntk_scaling_factor: ``s`` of the NTK base (8); ``null``: keep ``theta`` (no-NTK ablation).
        ntk_lengths: ``[L_new, L_old]`` of the NTK ratio; ``null`` (the paper): ``[long_context, L]``. The official
            code's defaults are ``[231, 248]`` (its ratio ``8 * 231 / 248 - 7 < 1`` shrinks the base).
        theta: RoPE base of the student.
        distill_loss: ``cosine`` | ``mse`` | ``l2``.
        clip_lr: Peak learning rate of the ``clip`` stage.
        distill_lr: Of the ``distill`` stage (5e-4 in the paper).
        expand_lr: Of the ``expand`` stage (1e-5 in the paper, from a converged CLIP).
        weight_decay: AdamW decay of matrices (0.1).
        warmup_steps: Linear warmup of each stage.
        long_weight: Weight of the (image, long caption) loss in ``expand`` (0.8, official).
        short_weight: Weight of the (image, short caption) loss in ``expand`` (0.2, official; 1:1 is
            ``long_weight=1 short_weight=1``).
        lock_image: Freeze the image tower in ``expand`` (official ``--lock-image``).
        longclip_keep: Long-CLIP positions kept as they are.
        longclip_freeze_kept: Long-CLIP: the kept position rows stay frozen in ``expand`` (as Long-CLIP trains).
        longclip_pca_dim: Long-CLIP's short-caption loss on image features filtered to their top principal components
            (:func:`layers.vision_language.pca_features`; 32 of 512/768 in Long-CLIP); ``null``: the plain image
            features (the short-caption loss of TULIP).
        require_distill: A ``rope`` expansion needs a distilled student (else: the no-distillation baseline).
        expand_projection: Text projection of the ``rope`` tower in ``expand``: ``teacher`` (official: stage 2 swaps
            the student's blocks, token embedding and final LayerNorm into CLIP and keeps CLIP's own projection) or
            ``student`` (the projection distilled in stage 1).
        init_from: Run folder or checkpoint of the previous stage(s).
        length_bins: Caption-length bin edges (tokens) of the R@1-by-length metric.
        grad_clip: Gradient-norm clip of every stage (``null``: none, as the official scripts, which pass no
            ``--grad-clip-norm``).
        pretrained_teacher: ``net`` holds a pretrained CLIP (the paper): stages start at ``distill``.
    """

    def __init__(
        self,
        net: nn.Module,
        long_context: int = 128,
        stages: list[str] | tuple[str, ...] = STAGES,
        stage_steps: dict | None = None,
        text_tower: str = "rope",
        ntk_scaling_factor: float | None = 8.0,
        ntk_lengths: list[int] | None = None,
        theta: float = 10000.0,
        distill_loss: str = "cosine",
        clip_lr: float = 1e-3,
        distill_lr: float = 5e-4,
        expand_lr: float = 1e-4,
        weight_decay: float = 0.1,
        warmup_steps: int = 50,
        long_weight: float = 0.8,
        short_weight: float = 0.2,
        lock_image: bool = False,
        longclip_keep: int = 8,
        longclip_freeze_kept: bool = True,
        longclip_pca_dim: int | None = 32,
        require_distill: bool = True,
        expand_projection: str = "teacher",
        init_from: str | None = None,
        length_bins: list[int] | tuple[int, ...] = (80, 100, 120),
        grad_clip: float | None = None,
        pretrained_teacher: bool = False,
    ) -> None:
        super().__init__()
        stages = list(stages)
        check(bool(stages) and all(s in STAGES for s in stages), f"model.stages={stages} must be a subset of {STAGES}")
        check(
            stages == sorted(stages, key=STAGES.index) and len(set(stages)) == len(stages),
            f"model.stages={stages} must be in the order {list(STAGES)} without repeats",
        )
        check(text_tower in TOWERS, f"model.text_tower={text_tower!r} must be one of {list(TOWERS)}")
        check(distill_loss in ("cosine", "mse", "l2"), f"model.distill_loss={distill_loss!r} must be cosine/mse/l2")
        check(
            expand_projection in ("teacher", "student"),
            f"model.expand_projection={expand_projection!r} must be 'teacher' or 'student'",
        )
        steps = {s: int((stage_steps or {}).get(s, 100)) for s in stages}
        check(all(v > 0 for v in steps.values()), f"model.stage_steps={steps} must be > 0 for every stage")
        check("distill" not in stages or text_tower == "rope", "the distill stage needs model.text_tower=rope")
        self.save_hyperparameters(ignore=["net"])
        self.automatic_optimization = False
        self.stages, self.steps, self.text_tower = stages, steps, text_tower
        self.L, self.E = int(net.positional_embedding.shape[0]), int(long_context)
        check(self.L < self.E, f"model.long_context={long_context} must exceed net.context_length={self.L}")
        self.lrs = {"clip": clip_lr, "distill": distill_lr, "expand": expand_lr}
        check(
            ntk_lengths is None or (len(ntk_lengths) == 2 and all(int(n) > 0 for n in ntk_lengths)),
            f"model.ntk_lengths={ntk_lengths} must be null or [L_new, L_old] with positive lengths",
        )
        self.ntk_lengths = None if ntk_lengths is None else [int(n) for n in ntk_lengths]
        self.ntk_scaling_factor, self.theta, self.distill_kind = ntk_scaling_factor, theta, distill_loss
        check(
            long_weight >= 0 and short_weight >= 0 and long_weight + short_weight > 0,
            f"model.long_weight={long_weight}, model.short_weight={short_weight}: >= 0, not both 0",
        )
        self.weight_decay, self.warmup_steps = weight_decay, warmup_steps
        self.long_weight, self.short_weight = long_weight, short_weight
        self.lock_image, self.length_bins, self.grad_clip = lock_image, list(length_bins), grad_clip

        self.teacher = DualEncoder.from_open_clip(net)
        heads = int(net.transformer.resblocks[0].attn.num_heads)
        self.longclip_keep, self.require_distill = longclip_keep, require_distill
        self.expand_projection = expand_projection
        self.longclip_pca_dim = None if text_tower != "longclip" or longclip_pca_dim is None else int(longclip_pca_dim)
        embed = int(net.visual.output_dim)  # the joint embedding size
        check(
            self.longclip_pca_dim is None or 1 <= self.longclip_pca_dim < embed,
            f"model.longclip_pca_dim={longclip_pca_dim} must be null or in [1, {embed}) (embedding)",
        )
        if text_tower == "rope":
            self.student = RoPETextTower.from_teacher(self.teacher.text, heads=heads, theta=theta)
        elif text_tower == "longclip":
            check(
                0 <= longclip_keep < self.L - 1 and (self.E - longclip_keep) % (self.L - longclip_keep) == 0,
                f"model.longclip_keep={longclip_keep}: E - keep = {self.E - longclip_keep} must divide by "
                f"L - keep = {self.L - longclip_keep}",
            )
            self.student = copy.deepcopy(self.teacher.text)
            self.student.stretch(longclip_keep, self._longclip_factor, freeze_kept=longclip_freeze_kept)
        # saved in every checkpoint: the stages completed, and the latest stage entered (-1: none)
        self.register_buffer("done", torch.zeros(len(STAGES), dtype=torch.bool))
        self.register_buffer("phase", torch.tensor(-1))
        first = stages[0]
        if pretrained_teacher:  # a pretrained CLIP (net.checkpoint) is the teacher: stage `clip` is done
            check(first != "clip", "model.pretrained_teacher=true: model.stages must not include 'clip'")
            self.done[0] = True
        if first != "clip" and not (pretrained_teacher and init_from is None):
            if init_from is None:
                how = MAKE_STUDENT if first == "expand" else 'make train METHOD=tulip ARGS="model.stages=[clip]"'
                raise ConfigError(
                    f"model.stages starts at {first!r} but model.init_from is null: make the previous stage with "
                    f"`{how}` and pass its run folder as model.init_from"
                )
            self._load_previous(resolve_run(init_from), first)
        elif init_from is not None:
            raise ConfigError("model.init_from is only read when model.stages does not start with 'clip'")
        if text_tower == "rope" and "expand" in stages and "distill" not in stages and first == "clip":
            check(
                not require_distill,
                "a rope expansion without a distill stage needs model.require_distill=false "
                "(the no-distillation baseline)",
            )
        self._batches, self._active = 0, None

    @property
    def _longclip_factor(self) -> int:
        return (self.E - self.longclip_keep) // (self.L - self.longclip_keep)

    def _load_previous(self, path: Path, first: str) -> None:
        state = load_checkpoint(str(path))["state_dict"]
        done = state.get("done")
        if done is None or "phase" not in state:
            raise CheckpointError(f"model.init_from={path}: not a tulip checkpoint (no record of its stages)")
        if not bool(done[0]):
            raise CheckpointError(
                f'{path} holds no trained CLIP: make one with `make train METHOD=tulip ARGS="model.stages=[clip]"`'
            )
        if first == "expand" and self.text_tower == "rope" and self.require_distill and not bool(done[1]):
            raise CheckpointError(
                f"model.init_from={path} holds no distilled student (stage 1): make it with `{MAKE_STUDENT}`, "
                "or set model.require_distill=false for the no-distillation baseline"
            )
        own = self.state_dict()
        self.load_state_dict({k: v for k, v in state.items() if k in own and own[k].shape == v.shape}, strict=False)

    # -- stages ------------------------------------------------------------------------------------------------
    @property
    def current(self) -> str:
        """The stage of the next optimiser step (the last configured stage once the budget is spent)."""
        step = self._batches
        for s in self.stages:
            if step < self.steps[s]:
                return s
            step -= self.steps[s]
        return self.stages[-1]

    def _stage_start(self, stage: str) -> int:
        return sum(self.steps[s] for s in self.stages[: self.stages.index(stage)])

    def _sync_rope(self) -> None:
        """RoPE context and base for the latest stage entered (not weights: re-derived after a load/resume)."""
        if self.text_tower != "rope":
            return
        if int(self.phase) >= 2 and self.student.context_length != self.E:
            self.student.set_rope(self.L, self.theta)
            self.student.expand(self.E, self.L, self.ntk_scaling_factor, self.ntk_lengths)
        elif int(self.phase) < 2 and self.student.context_length != self.L:
            self.student.set_rope(self.L, self.theta)

    def _enter(self, stage: str) -> None:
        """Stage entry: copy the teacher into the student (distill; a rope expand without distillation), stretch the
        teacher's positions (Long-CLIP), or NTK-expand the student (expand)."""
        if stage == "distill" or (stage == "expand" and self.text_tower == "rope" and not self.done[1]):
            fresh = RoPETextTower.from_teacher(self.teacher.text, heads=self.student.heads, theta=self.theta)
            self.student.load_state_dict(fresh.state_dict())
        elif stage == "expand" and self.text_tower == "rope" and self.expand_projection == "teacher":
            self._copy_projection()  # official: CLIP keeps its own projection; the distilled one is dropped
        if stage == "expand" and self.text_tower == "longclip":
            with torch.no_grad():
                for name in ("token_embedding", "transformer", "ln_final"):
                    getattr(self.student, name).load_state_dict(getattr(self.teacher.text, name).state_dict())
                self.student.text_projection.copy_(self.teacher.text.text_projection)
                pos = stretch_positions(
                    self.teacher.text.positional_embedding, self.longclip_keep, self._longclip_factor
                )
                self.student.set_positions(pos)
        self.phase.fill_(STAGES.index(stage))
        self._sync_rope()

    @torch.no_grad()
    def _copy_projection(self) -> None:
        src, dst = self.teacher.text.text_projection, self.student.text_projection
        if isinstance(dst, nn.Module):
            dst.load_state_dict(src.state_dict())
        elif dst is not None:
            dst.copy_(src)

    def model_for(self, stage: str) -> tuple[DualEncoder, int]:
        """The dual encoder a stage trains (and evaluates) and its text context."""
        if stage == "clip" or self.text_tower == "absolute":
            return self.teacher, self.L
        return self.teacher.with_text(self.student), (self.L if stage == "distill" else self.E)

    def eval_model(self) -> tuple[DualEncoder, int]:
        """The model of the latest stage entered (the teacher before any)."""
        self._sync_rope()
        return self.model_for(STAGES[max(int(self.phase), 0)])

    # -- optimisation ------------------------------------------------------------------------------------------
    def _stage_parameters(self, stage: str) -> list[tuple[str, nn.Parameter]]:
        if stage == "clip":
            return list(self.teacher.named_parameters())
        if stage == "distill":  # token embedding frozen: "the rope specific part of the backbone" is trained
            return [(n, p) for n, p in self.student.named_parameters() if not n.startswith("token_embedding")]
        enc, _ = self.model_for("expand")
        return [(n, p) for n, p in enc.named_parameters() if not (self.lock_image and n.startswith("visual."))]

    def configure_optimizers(self) -> Any:
        opts, scheds = [], []
        for s in self.stages:
            groups = _param_groups(self._stage_parameters(s), self.weight_decay)
            opt = torch.optim.AdamW(groups, lr=self.lrs[s], betas=(0.9, 0.98), eps=1e-6)
            opts.append(opt)
            scheds.append(torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(self.warmup_steps, self.steps[s])))
        return opts, scheds

    def _loss(self, stage: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        images, long, short = batch["image"], batch["long"], batch["short"]
        if stage == "clip":
            f_i = self.teacher.encode_image(images)
            return clip_loss(f_i, self.teacher.encode_text(truncate_tokens(long, self.L)), self.teacher.scale())
        if stage == "distill":
            x = truncate_tokens(long, self.L)  # both towers read the same first L tokens of the long caption
            with torch.no_grad():
                f_t = self.teacher.text(x)
            return distill_loss_fn(f_t, self.student(x), self.distill_kind)
        enc, ctx = self.model_for("expand")
        f_i = enc.encode_image(images)
        loss_long = clip_loss(f_i, enc.encode_text(truncate_tokens(long, ctx)), enc.scale())
        f_short = f_i if self.longclip_pca_dim is None else pca_features(f_i, self.longclip_pca_dim)  # Long-CLIP
        loss_short = clip_loss(f_short, enc.encode_text(truncate_tokens(short, min(ctx, short.shape[1]))), enc.scale())
        return self.long_weight * loss_long + self.short_weight * loss_short

    def _step(self, stage: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        i = self.stages.index(stage)
        opts, scheds = self.optimizers(), self.lr_schedulers()
        opt = opts[i] if isinstance(opts, list) else opts
        sched = scheds[i] if isinstance(scheds, list) else scheds
        if self._active != stage:
            if self._batches == self._stage_start(stage) or smoke_test(self.trainer):
                self._enter(stage)
            self._active = stage
        self._sync_rope()
        loss = self._loss(stage, batch)
        if not torch.isfinite(loss):
            raise NonFiniteLossError(f"tulip {stage} loss is {loss.item()} at step {self._batches}")
        opt.zero_grad()
        self.manual_backward(loss)
        if self.grad_clip:
            torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], self.grad_clip)
        opt.step()
        self.teacher.clamp_logit_scale()  # every encoder shares it; official: the parameter, after the step
        sched.step()
        self.log(f"train/{stage}_loss", loss.detach(), prog_bar=True)
        self.log("train/loss", loss.detach())
        return loss

    def on_fit_start(self) -> None:
        self._batches, self._active = (0 if smoke_test(self.trainer) else int(self.trainer.global_step)), None
        self._sync_rope()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if smoke_test(self.trainer):  # debug modes: one step of every stage per batch, so the whole chain runs
            for s in self.stages:
                loss = self._step(s, batch)
                self.done[STAGES.index(s)] = True
            return loss
        stage = self.current
        if self._active is not None and self._active != stage:
            self.done[STAGES.index(self._active)] = True
        loss = self._step(stage, batch)
        self._batches += 1
        if self._batches >= sum(self.steps.values()):
            self.done[STAGES.index(stage)] = True
            self.trainer.should_stop = True  # the stage budget, not max_epochs, ends the run
        return loss

    # -- evaluation --------------------------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._outputs: list[dict[str, torch.Tensor]] = []

    on_test_epoch_start = on_validation_epoch_start

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        enc, ctx = self.eval_model()
        with torch.no_grad():
            self._outputs.append(
                {
                    "image": enc.encode_image(batch["image"]),
                    "long": enc.encode_text(truncate_tokens(batch["long"], ctx)),
                    "short": enc.encode_text(truncate_tokens(batch["short"], min(ctx, batch["short"].shape[1]))),
                    "length": batch["length"],
                    "group": batch["group"],
                }
            )

    test_step = validation_step

    def _retrieval(self, stage: str) -> None:
        if not self._outputs:
            return
        out = {k: torch.cat([o[k] for o in self._outputs]) for k in self._outputs[0]}
        long = recall_at_k(out["image"], out["long"])
        # short-caption retrieval: one scene per family (members share their first sentence)
        g = out["group"]
        first = torch.cat([g.new_ones(1, dtype=torch.bool), g[1:] != g[:-1]]) if (g >= 0).all() else g < 0
        short = recall_at_k(out["image"][first], out["short"][first])
        logs = {f"{stage}/long_{k}": v for k, v in long.items()}
        logs.update({f"{stage}/short_{k}": v for k, v in short.items()})
        for kind, rec in (("long", long), ("short", short)):  # ties at their expected credit; pessimistic beside
            logs[f"{stage}/{kind}_r1"] = (rec["i2t_r1"] + rec["t2i_r1"]) / 2
            logs[f"{stage}/{kind}_r1_pessimistic"] = (rec["i2t_r1_pessimistic"] + rec["t2i_r1_pessimistic"]) / 2
        if stage == "test":
            for name, (r1, _) in r1_by_length(out["image"], out["long"], out["length"], self.length_bins).items():
                logs[f"test/r1_len_{name}"] = r1
        self.log_dict(logs)

    def on_validation_epoch_end(self) -> None:
        self._retrieval("val")

    def on_test_epoch_end(self) -> None:
        self._retrieval("test")
