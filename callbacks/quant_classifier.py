"""W4A4 / W8A8 post-training quantization calibration of a classifier (OSTQuant, ICLR 2025).

The classifier sibling of :class:`callbacks.quant_calibration.QuantCalibration`. At the start of ``trainer.test``
(after fit), for each method in ``methods`` the callback swaps the module's ``nn.Linear`` / ``nn.Conv2d`` layers for
fake-quantized ones with the method's equivalent input transforms (:class:`layers.quant.classifier.
QuantizedClassifier`: weights symmetric RTN per output channel, activations asymmetric), calibrates them on
``calib_batches`` batches of the ``calib_split`` loader, scores top-1 accuracy on the test loader next to full
precision, and puts the original layers back. Activation scales (``act_scale``): ``token``, dynamic per token (a row of
a linear's input, a pixel of a convolution's input channels; OSTQuant's LLM setting, under which a large entry coarsens
only its own token's grid), or ``tensor``, static per tensor: one range per layer input, the min / max of its
(transformed) input over the calibration batches, fixed before the test images are seen (SmoothQuant's static
setting, where one outlier coarsens every input's grid). ``fold_bn`` first folds every eval-mode BatchNorm into the
convolution that feeds it (:class:`layers.quant.fold.FoldedBatchNorm`), so the weight quantizer sees the weight a
deployed integer convolution holds, and restores the model afterwards. With ``act_scale=tensor`` the OSTQuant
transforms are learned under each input's own per-tensor range and the ranges are calibrated after the weights are
frozen.

* ``fp``: no quantization (reference).   ``rtn``: no transform.
* ``smoothquant``: ``s = max|X|^a / max|W|^(1-a)`` (``alpha``, 0.5) per input channel of every layer (convolutions
  with ``groups > 1`` excepted), an explicit online scale ``x / s`` on the input, ``W diag(s)``.
* ``quarot``: a random Hadamard ``R`` of each layer's input space, ``x R`` online and ``W R``.
* ``ostquant``: linear layers learn ``R`` (Hadamard init; Cayley SGD, ``rotate_lr``) and smoothing ``s`` (init 1;
  Adam, ``smooth_lr``) for ``steps`` on the calibration batches, minimising ``KL(p_fp || p_quant)`` of the logits
  with the weights fake-quantized (straight-through); convolutions keep QuaRot's fixed Hadamard.

Contract (:func:`callbacks.contracts.classifier_quant_problems`, checked at ``setup``): ``module(x) -> logits [B,
C]`` with at least one ``nn.Linear`` / ``nn.Conv2d``, train and test batches ``(x, y, ...)`` with integer labels.

Logged at the end of the test epoch: ``quant/<method>_acc`` (top-1), ``quant/<method>_acc_drop`` (``fp`` accuracy
minus it) and ``quant/<method>_kl`` (mean KL of the logits from full precision); also ``quant_calibration.json`` in
the run's log folder. Added to a run by ``callbacks=quant_classifier`` (``conf/callbacks/quant_classifier.yaml``,
keys ``callbacks.quant_calibration.*``). Under ``debug=`` / ``fast_dev_run``: one calibration and one test batch, at
most 2 steps.

Under DDP (``trainer=ddp``) the result is the one-process result (:mod:`callbacks.distributed`): every rank
calibrates on the ranks' calibration batches pooled (the same transforms, scales and learned rotations on every
rank), scores its own shard of the test batches, and the counts are summed over the ranks before the accuracies and
KL are formed; rank zero writes the json. Equal to one process up to float rounding (and the examples a padded last
shard repeats).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch import Callback, LightningModule, Trainer

from callbacks.contracts import classifier_quant_problems, first_loader, refuse
from callbacks.distributed import gather_batches, sum_over_ranks
from callbacks.quant_calibration import log_results, write_results
from core.errors import ConfigError
from core.smoke import smoke_test
from layers.quant.classifier import QuantizedClassifier
from layers.quant.fold import FoldedBatchNorm
from ops.quant import CayleySGD, check_bits, kl_full
from ops.quant.fake import SYM_SCALES

METHODS = ("fp", "rtn", "smoothquant", "quarot", "ostquant")
ACT_SCALES = ("token", "tensor")
CALIB_SPLITS = ("train", "val")
WHAT = "callbacks.quant_calibration"


class ClassifierQuantCalibration(Callback):
    """Calibrate and score W/A fake quantization of the trained classifier (see module docstring).

    Args:
        methods: Subset of ``fp, rtn, smoothquant, quarot, ostquant``.
        w_bits, a_bits: Bit widths (2..8, or 16 = full precision): 4/4 (W4A4) or 8/8 (W8A8).
        steps: Optimisation steps of ``ostquant``.
        rotate_lr, smooth_lr: Learning rates of the rotations (Cayley SGD) and the scales (Adam).
        alpha: SmoothQuant migration strength.
        calib_batches: Training batches used for calibration.
        eval_batches: Test batches scored (``None``: all).
        seed: Seed of the random Hadamards.
        w_clip: Search each weight row's clip ratio (the official ``w_clip``) when freezing.
        w_sym_scale: Symmetric weight scale, ``signed`` or ``absmax`` (:mod:`ops.quant.fake`).
        act_scale: ``token`` (dynamic per token) or ``tensor`` (static per tensor, calibrated; module docstring).
        fold_bn: Fold BatchNorm into the preceding convolution before quantizing the weights.
        calib_split: The loader calibration batches come from, ``train`` or ``val`` (a clean held-out split where
            the training set is poisoned, as in the suite's backdoor data).
        prefix: Metric prefix and file stem: ``<prefix>/<method>_acc`` and ``<prefix>_calibration.json`` (default
            ``quant``); a second instance with another prefix (e.g. ``quant_w8a8``) scores other bit widths in the
            same run.
    """

    def __init__(
        self,
        methods: list[str] | tuple[str, ...] = METHODS,
        w_bits: int = 4,
        a_bits: int = 4,
        steps: int = 100,
        rotate_lr: float = 0.01,
        smooth_lr: float = 0.01,
        alpha: float = 0.5,
        calib_batches: int = 8,
        eval_batches: int | None = None,
        seed: int = 0,
        w_clip: bool = False,
        w_sym_scale: str = "signed",
        prefix: str = "quant",
        act_scale: str = "token",
        fold_bn: bool = False,
        calib_split: str = "train",
    ) -> None:
        bad = [m for m in methods if m not in METHODS]
        if bad or not methods:
            raise ConfigError(f"{WHAT}.methods={list(methods)} must be a non-empty subset of {list(METHODS)}")
        for name, b in (("w_bits", w_bits), ("a_bits", a_bits)):
            if b != 16:
                check_bits(f"{WHAT}.{name}", b)
        if steps < 0 or calib_batches < 1 or (eval_batches is not None and eval_batches < 1):
            raise ConfigError(
                f"{WHAT}: steps={steps} must be >= 0, calib_batches={calib_batches} >= 1, eval_batches={eval_batches} "
                ">= 1 or null"
            )
        if not 0 <= alpha <= 1:
            raise ConfigError(f"{WHAT}.alpha={alpha!r} must be in [0, 1]")
        if w_sym_scale not in SYM_SCALES:
            raise ConfigError(f"{WHAT}.w_sym_scale={w_sym_scale!r} must be one of {list(SYM_SCALES)}")
        self.methods, self.w_bits, self.a_bits = list(methods), w_bits, a_bits
        self.steps, self.rotate_lr, self.smooth_lr, self.alpha = steps, rotate_lr, smooth_lr, alpha
        self.calib_batches, self.eval_batches, self.seed = calib_batches, eval_batches, seed
        if not isinstance(prefix, str) or not prefix.replace("_", "").isalnum():
            raise ConfigError(f"{WHAT}.prefix={prefix!r} must be a non-empty word (letters, digits, underscores)")
        self.w_clip, self.w_sym_scale, self.prefix = w_clip, w_sym_scale, prefix
        if act_scale not in ACT_SCALES:
            raise ConfigError(f"{WHAT}.act_scale={act_scale!r} must be one of {list(ACT_SCALES)}")
        if calib_split not in CALIB_SPLITS:
            raise ConfigError(f"{WHAT}.calib_split={calib_split!r} must be one of {list(CALIB_SPLITS)}")
        self.act_scale, self.fold_bn, self.calib_split = act_scale, bool(fold_bn), calib_split
        self.results: dict[str, dict[str, float]] = {}

    # -- the calibration pipeline (usable without a Trainer) -------------------------------------------------------
    def build(self, model: torch.nn.Module, method: str, calib: list[Any], steps: int, freeze: bool = True):
        """Attach ``method``'s quantized layers to ``model`` (in place), calibrated on the inputs ``calib``; returns
        the :class:`~layers.quant.classifier.QuantizedClassifier` (call ``detach()`` to restore), ``None`` for
        ``fp``. ``freeze=False`` leaves the weights unfolded (to inspect the learned transforms)."""
        if method == "fp":
            return None
        fp_logits = []
        if method == "ostquant" and steps:
            with torch.no_grad():
                fp_logits = [model(x) for x in calib]
        q = QuantizedClassifier(
            model,
            self.w_bits,
            self.a_bits,
            rotation="hadamard" if method in ("quarot", "ostquant") else "none",
            learn=method == "ostquant",
            seed=self.seed,
            w_sym_scale=self.w_sym_scale,
            act_scale=self.act_scale,
        )
        try:
            if method == "smoothquant":
                q.smoothquant(model, calib, self.alpha)
            if method == "ostquant" and steps:
                self._learn(model, q, calib, fp_logits, steps)
            if freeze:
                q.freeze(self.w_clip)
                q.calibrate_activations(model, calib)  # static per-tensor ranges (act_scale=tensor), else a no-op
        except BaseException:
            q.detach()
            raise
        return q

    def fold(self, model: torch.nn.Module, calib: list[Any]):
        """Fold ``model``'s BatchNorms into their convolutions (in place, eval mode) when ``fold_bn``; returns the
        :class:`~layers.quant.fold.FoldedBatchNorm` (call ``restore()``), or ``None``."""
        if not self.fold_bn:
            return None

        try:
            return FoldedBatchNorm(model, lambda: model(calib[0]))
        except ValueError as err:
            raise ConfigError(f"{WHAT}.fold_bn=true: {err}") from None

    def _learn(self, model, q, calib: list[Any], fp_logits: list[torch.Tensor], steps: int) -> None:
        rot, scales = q.rotation_parameters(), q.scale_parameters()
        if not rot:
            return
        opt_r = CayleySGD(rot, lr=self.rotate_lr)
        opt_s = torch.optim.Adam(scales, lr=self.smooth_lr) if scales else None
        mine = {id(p) for p in rot + scales}
        frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in mine]
        for p in frozen:  # only the transforms learn
            p.requires_grad_(False)
        try:
            with torch.enable_grad():
                for step in range(steps):
                    i = step % len(calib)
                    loss = kl_full(fp_logits[i], model(calib[i]))
                    opt_r.zero_grad()
                    if opt_s:
                        opt_s.zero_grad()
                    loss.backward()
                    opt_r.step()
                    if opt_s:
                        opt_s.step()
                        with torch.no_grad():
                            for s in scales:
                                s.clamp_(min=1e-3)
        finally:
            for p in frozen:
                p.requires_grad_(True)

    @torch.no_grad()
    def evaluate(self, model, batches: list[tuple[Any, torch.Tensor]], fp_logits: list[torch.Tensor], pool=None):
        """``{acc, kl}`` of ``model`` (as it is now) on ``(x, y)`` ``batches``; ``kl`` from ``fp_logits``. ``pool``
        maps the counts ``[correct, kl sum, n]`` to their sums over the ranks (DDP)."""
        correct, kl, n = 0, 0.0, 0
        for (x, y), fp in zip(batches, fp_logits, strict=True):
            logits = model(x)
            correct += int((logits.argmax(-1) == y).sum())
            kl += float(kl_full(fp, logits)) * len(y)
            n += len(y)
        if pool is not None:
            correct, kl, n = pool([correct, kl, n])
        return {"acc": correct / max(n, 1), "kl": kl / max(n, 1)}

    # -- the contract -----------------------------------------------------------------------------------------------
    def contract_problems(self, module: torch.nn.Module, datamodule: Any = None) -> list[str]:
        """What ``module`` / ``datamodule`` lack (empty: nothing); see
        :func:`callbacks.contracts.classifier_quant_problems`."""
        return classifier_quant_problems(module, datamodule)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        refuse(WHAT, self.contract_problems(pl_module, trainer.datamodule if stage == "test" else None))

    # -- Lightning hooks -------------------------------------------------------------------------------------------
    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        with torch.inference_mode(False):  # the test loop runs in inference mode; ostquant needs autograd
            self._run(trainer, pl_module)

    def _run(self, trainer: Trainer, pl_module: LightningModule) -> None:
        dm, fast = trainer.datamodule, smoke_test(trainer)
        loader = dm.val_dataloader() if self.calib_split == "val" else dm.train_dataloader()
        calib = [x for x, _ in _take(loader, 1 if fast else self.calib_batches, pl_module.device)]
        calib = gather_batches(trainer, pl_module, calib)  # DDP: every rank calibrates on the pooled batches
        evals = _take(dm.test_dataloader(), 1 if fast else self.eval_batches, pl_module.device)
        pool = partial(sum_over_ranks, trainer, device=pl_module.device)  # DDP: each rank scores its own shard
        steps = min(self.steps, 2) if fast else self.steps
        was_training = pl_module.training
        pl_module.eval()
        torch.manual_seed(self.seed)
        with torch.no_grad():
            fp_logits = [pl_module(x) for x, _ in evals]
        self.results = {}
        folded = None
        try:
            folded = self.fold(pl_module, calib)
            for method in self.methods:
                q = self.build(pl_module, method, calib, steps)
                try:
                    self.results[method] = self.evaluate(pl_module, evals, fp_logits, pool)
                finally:
                    if q is not None:
                        q.detach()
        finally:
            if folded is not None:
                folded.restore()
            pl_module.train(was_training)
        fp = self.results.get("fp") or self.evaluate(pl_module, evals, fp_logits, pool)
        for r in self.results.values():
            r["acc_drop"] = fp["acc"] - r["acc"]
        payload = {
            "w_bits": self.w_bits,
            "a_bits": self.a_bits,
            "act_scale": self.act_scale,
            "fold_bn": self.fold_bn,
            "calib_split": self.calib_split,
            "results": self.results,
        }
        if self.prefix == "quant":
            write_results(trainer, payload)
        else:  # the same folder, the instance's own file
            folder = Path(trainer.log_dir or trainer.default_root_dir)
            if trainer.is_global_zero:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{self.prefix}_calibration.json").write_text(json.dumps(payload, indent=2))

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.prefix == "quant":
            log_results(pl_module, self.results)
            return
        for method, r in self.results.items():
            for k, v in r.items():
                pl_module.log(f"{self.prefix}/{method}_{k}", float(v), add_dataloader_idx=False)


def _take(loader: Any, n: int | None, device: torch.device) -> list[tuple[Any, torch.Tensor]]:
    """The first ``n`` batches ``(x, y)`` of ``loader`` (the first of several) on ``device``."""
    out = []
    for batch in first_loader(loader):
        if not isinstance(batch, (list, tuple)) or len(batch) < 2:
            raise ConfigError(f"{WHAT} needs batches (x, y, ...) with class labels y")
        out.append(move_data_to_device((batch[0], batch[1]), device))
        if n is not None and len(out) >= n:
            break
    return out
