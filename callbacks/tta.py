"""Test-time adaptation (TTA) for any classification LightningModule, as a callback.

During ``trainer.test`` the callback adapts the module on each unlabelled test batch *before* the module's
``test_step`` predicts it (adapt-then-predict, as SuMi reports its second forward pass), online over the stream
(``episodic=False``) or from the source weights for every batch (``episodic=True``). The objective is a strategy
from :mod:`callbacks.tta_methods` chosen by name (``source``, ``bn``, ``tent``, ``eata``, ``sar``, ``sumi``).

What the module must provide (the contract, :func:`callbacks.contracts.tta_problems`, checked at ``setup`` with
one :class:`~core.errors.ConfigError` line naming what is missing): batches ``(x, y, ...)`` with class labels ``y``
where ``x`` is whatever ``module(x)`` maps to logits ``[B, C]`` (a tensor or a tuple of modalities), a
``num_classes`` attribute (or pass ``num_classes``) and, for ``params=norm``, normalisation layers. SuMi also needs
``module.tta_forward(x)`` (see ``lightning_modules.sumi.SumiLitModule``). The callback scores every adapted batch:
with the ``{"preds": [B]}`` that ``test_step`` returns, or else its own ``module(x).argmax(-1)`` after the module's
``test_step`` (the same adapted weights), and logs accuracy per quarter of the stream (``tta/acc_q1`` ...
``tta/acc_q4``) to show collapse over time, plus ``tta/param_shift``, the relative L2 distance of the adapted
parameters from the source ones at the end of the stream; the history is written to
``<default_root_dir>/tta_history.csv``. Several test loaders (e.g. clean then triggered sets) form one stream, in
order; the history's ``loader`` column says which batch came from which.

Which parameters adapt (``params``): ``norm`` (affine weights and biases of every LayerNorm / BatchNorm /
GroupNorm / InstanceNorm, as Tent, EATA, SAR and SuMi) or ``all``. BatchNorm layers use test-batch statistics
(Tent) for every method but ``source``; ``bn`` (BN-adapt) does only that and adapts no parameter, so it needs no
normalisation layer (without BatchNorm it is the source model). A model without normalisation layers is a
:class:`~core.errors.ConfigError` at test start for the methods that take gradient steps.

Under DDP (``trainer=ddp``) the result differs from one process by design. Each rank adapts its own copy of the
model online on its own shard of the stream (the ranks' ``k``-th batches together are one process's ``k``-th
batch), with its own optimiser: no gradient is all-reduced, so the ranks' adapted weights drift apart, and a rank
sees each batch at half (1/W) the size, which changes BatchNorm's test-batch statistics (unless
``trainer.sync_batchnorm``, which ``conf/trainer/ddp.yaml`` sets: SyncBatchNorm layers then normalise with the whole
global batch's statistics, one all-reduce per forward on every rank in step), EATA / SAR's selection and SuMi's
per-batch terms. What is pooled over the ranks: ``tta/acc_q1..q4`` (the correct predictions and examples of
each quarter of every rank's stream, summed: the accuracy over the whole global stream), ``tta/selected`` (over
every rank's batches), ``tta/resets`` (summed), ``tta/param_shift`` (the mean of the ranks' shifts). Rank zero writes
every rank's rows to ``tta_history.csv`` (its ``rank`` column; ``shift`` is a rank's ``param_shift`` after each
batch). Episodic adaptation (``episodic=True``) still differs from one process through the smaller batches.
"""

from __future__ import annotations

import copy
import csv
import math
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from callbacks.contracts import NORM_TYPES, norm_parameters, refuse, tta_problems  # noqa: F401 (re-export)
from callbacks.distributed import sum_over_ranks
from callbacks.tta_methods import METHODS, Strategy, SuMi
from core.errors import ConfigError

PARAMS = ("norm", "all")
OPTIMIZERS = ("adam", "sgd")


def _detach_from_inference(x: Any) -> Any:
    """Clone tensors created under ``torch.inference_mode`` so autograd may save them."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_detach_from_inference(v) for v in x)
    if isinstance(x, dict):
        return {k: _detach_from_inference(v) for k, v in x.items()}
    return x


class TestTimeAdaptation(Callback):
    """Adapt a classification module on the test stream.

    Args:
        method: Strategy name: ``source``, ``bn``, ``tent``, ``eata``, ``sar`` or ``sumi``.
        method_kwargs: Keyword arguments of the strategy (e.g. ``{lam: 0}`` for SuMi without MI sharing).
        params: ``norm`` or ``all``.
        optimizer: ``adam`` (SuMi, Tent on ViTs) or ``sgd`` (SAR, EATA on ResNets).
        lr: Learning rate.
        momentum: SGD momentum.
        weight_decay: Weight decay.
        betas: Adam betas.
        episodic: Reset model and optimiser to the source state before every batch.
        steps: Adaptation steps per batch.
        total_steps: Length ``T`` of the stream in batches (SuMi's schedules); ``None`` uses the test loader's.
        num_classes: ``C``; ``None`` reads ``module.num_classes``.
        restore_on_end: Put the source weights back after the test run.
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(
        self,
        method: str = "tent",
        method_kwargs: dict[str, Any] | None = None,
        params: str = "norm",
        optimizer: str = "adam",
        lr: float = 1e-4,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        episodic: bool = False,
        steps: int = 1,
        total_steps: int | None = None,
        num_classes: int | None = None,
        restore_on_end: bool = True,
    ) -> None:
        if method not in METHODS:
            raise ConfigError(f"callbacks.tta.method={method!r} must be one of {sorted(METHODS)}")
        if params not in PARAMS:
            raise ConfigError(f"callbacks.tta.params={params!r} must be one of {list(PARAMS)}")
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"callbacks.tta.optimizer={optimizer!r} must be one of {list(OPTIMIZERS)}")
        if not lr > 0:
            raise ConfigError(f"callbacks.tta.lr={lr} must be > 0")
        if steps < 1:
            raise ConfigError(f"callbacks.tta.steps={steps} must be >= 1")
        if total_steps is not None and total_steps < 1:
            raise ConfigError(f"callbacks.tta.total_steps={total_steps} must be >= 1 or null")
        try:
            self.strategy: Strategy = METHODS[method](**dict(method_kwargs or {}))
        except TypeError as err:
            raise ConfigError(f"callbacks.tta.method_kwargs for {method!r}: {err}") from None
        self.method, self.params_mode, self.optimizer_name = method, params, optimizer
        self.lr, self.momentum, self.weight_decay, self.betas = lr, momentum, weight_decay, tuple(betas)
        self.episodic, self.steps, self.total_steps_arg = episodic, steps, total_steps
        self.num_classes_arg, self.restore_on_end = num_classes, restore_on_end
        self.history: list[dict[str, float]] = []
        self.optimizer: torch.optim.Optimizer | None = None

    # -- the contract -----------------------------------------------------------------------------------------------
    def contract_problems(self, module: nn.Module, datamodule: Any = None, probe: bool = True) -> list[str]:
        """What ``module`` / ``datamodule`` lack for this configuration (empty: they meet the contract); no Trainer
        needed. See :func:`callbacks.contracts.tta_problems`."""
        return tta_problems(
            module,
            datamodule,
            params=self.params_mode if self.strategy.trains else "all",
            tta_forward=isinstance(self.strategy, SuMi),
            num_classes=self.num_classes_arg,
            probe=probe,
        )

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # The module's side is checked before fitting too (a long run is not wasted); the data at test time.
        refuse("callbacks.tta", self.contract_problems(pl_module, trainer.datamodule if stage == "test" else None))

    # -- set-up and reset --------------------------------------------------------------------------------------------
    def _select(self, module: nn.Module) -> list[nn.Parameter]:
        if self.params_mode == "all":
            return [p for p in module.parameters()]
        named = norm_parameters(module)
        if not named:
            raise ConfigError(
                f"callbacks.tta.params='norm': {type(module).__name__} has no normalisation layers to adapt "
                f"(use params=all or a model with LayerNorm/BatchNorm)"
            )
        return [p for _, p in named]

    def _make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
        return torch.optim.Adam(params, lr=self.lr, betas=self.betas, weight_decay=self.weight_decay)

    def _batchnorms(self, module: nn.Module) -> Iterator[_BatchNorm]:
        return (m for m in module.modules() if isinstance(m, _BatchNorm))

    def reset(self) -> None:
        """Back to the source weights and a fresh optimiser state (episodic mode, SAR's recovery)."""
        with torch.no_grad():
            for p, p0 in zip(self._params, self._source_params):
                p.copy_(p0)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._source_opt_state)

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        num_classes = self.num_classes_arg or getattr(pl_module, "num_classes", None)
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ConfigError(
                f"callbacks.tta.num_classes={self.num_classes_arg} is needed: {type(pl_module).__name__} has no "
                f"integer num_classes >= 2"
            )
        self._params = self._select(pl_module) if self.strategy.trains else []
        self._requires_grad = {id(p): p.requires_grad for p in pl_module.parameters()}
        self._state = copy.deepcopy(pl_module.state_dict()) if self.restore_on_end else None
        self._source_params = [p.detach().clone() for p in self._params]
        self._bn_state = []
        if self.strategy.adapts:
            pl_module.requires_grad_(False)
            for p in self._params:
                p.requires_grad_(True)
            for m in self._batchnorms(pl_module):  # Tent: normalise with test-batch statistics
                self._bn_state.append((m, m.track_running_stats, m.running_mean, m.running_var))
                m.track_running_stats, m.running_mean, m.running_var = False, None, None
        self.optimizer = self._make_optimizer(self._params) if self._params else None
        self._source_opt_state = copy.deepcopy(self.optimizer.state_dict()) if self.optimizer else None
        counts = trainer.num_test_batches if isinstance(trainer.num_test_batches, list) else [0]
        finite = [int(n) for n in counts if n is not None and math.isfinite(n)]
        self.total = self.total_steps_arg or max(sum(finite), 1)
        self.t = 0
        self.history = []
        source = None
        dm = trainer.datamodule
        if dm is not None and "val" in getattr(dm, "datasets", {}):

            def source() -> Iterator[Any]:
                with torch.inference_mode(False), torch.enable_grad():
                    for batch in dm.val_dataloader():
                        yield _detach_from_inference(pl_module.transfer_batch_to_device(batch[0], pl_module.device, 0))

        with torch.inference_mode(False), torch.enable_grad():
            self.strategy.setup(pl_module, self._params, self.optimizer, num_classes, self.reset, source)

    # -- the stream -------------------------------------------------------------------------------------------------
    def on_test_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        diag: dict[str, float] = {"step": float(self.t), "size": float(len(batch[1])), "loader": float(dataloader_idx)}
        if self.strategy.adapts:
            if self.episodic:
                self.reset()
            with torch.inference_mode(False), torch.enable_grad():
                x = _detach_from_inference(batch[0])
                for m in self._batchnorms(pl_module):
                    m.train()
                for _ in range(self.steps):
                    diag.update(self.strategy.adapt(x, min(self.t, self.total - 1), self.total))
            diag["shift"] = self.param_shift() if self._params else 0.0
        else:
            diag.update(self.strategy.adapt(batch[0], self.t, self.total))
        self.history.append(diag)
        self.t += 1

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not self.history:
            return
        preds = outputs.get("preds") if isinstance(outputs, dict) else None
        if not isinstance(preds, torch.Tensor):  # the module returns no predictions: score the adapted model itself
            with torch.no_grad():
                preds = pl_module(batch[0]).argmax(-1)
        correct = (preds.view(-1) == batch[1].view(-1)).float()
        self.history[-1]["acc"] = float(correct.mean())
        self.history[-1]["size"] = float(correct.numel())

    def quarter_counts(self) -> list[tuple[float, float]]:
        """``(correct, examples)`` over each quarter of this process's stream (empty before any scored batch)."""
        rows = [h for h in self.history if "acc" in h]
        if not rows:
            return []
        out = []
        for q in range(4):
            part = rows[len(rows) * q // 4 : max(len(rows) * (q + 1) // 4, len(rows) * q // 4 + 1)]
            out.append((sum(r["acc"] * r["size"] for r in part), sum(r["size"] for r in part)))
        return out

    def quarter_accuracies(self) -> list[float]:
        """Sample-weighted accuracy over each quarter of the stream (collapse shows as a falling sequence)."""
        return [correct / max(n, 1.0) for correct, n in self.quarter_counts()]

    def param_shift(self) -> float:
        """``||theta - theta_0|| / ||theta_0||`` over the adapted parameters (0: the stream changed nothing)."""
        with torch.no_grad():
            diff = sum(
                float((p.detach().cpu() - p0.cpu()).pow(2).sum()) for p, p0 in zip(self._params, self._source_params)
            )
            ref = sum(float(p0.pow(2).sum()) for p0 in self._source_params)
        return math.sqrt(diff) / max(math.sqrt(ref), 1e-12)

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # DDP: every rank has as many batches of the same size (the suite's sharding), so each sum below is taken on
        # every rank or on none, and the pooled values are the same on every rank.
        pool = partial(sum_over_ranks, trainer, device=pl_module.device)
        counts = self.quarter_counts()
        if counts:
            pooled = pool([v for pair in counts for v in pair])
            for q in range(len(counts)):
                pl_module.log(f"tta/acc_q{q + 1}", pooled[2 * q] / max(pooled[2 * q + 1], 1.0))
        sel = [h["selected"] for h in self.history if "selected" in h]
        if sel:
            total, n = pool([sum(sel), len(sel)])
            pl_module.log("tta/selected", total / n)
        if self.history and "resets" in self.history[-1]:
            pl_module.log("tta/resets", pool([self.history[-1]["resets"]])[0])
        if self._params:
            pl_module.log("tta/param_shift", pool([self.param_shift()])[0] / trainer.world_size)
        history = [{**h, "rank": float(trainer.global_rank)} for h in self.history]
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            everyone: list[Any] = [None] * trainer.world_size
            dist.all_gather_object(everyone, history)
            history = [h for rows in everyone for h in rows]
        if trainer.is_global_zero and history and trainer.default_root_dir:
            path = Path(trainer.default_root_dir) / "tta_history.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            keys = sorted({k for h in history for k in h})
            with path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=keys)
                writer.writeheader()
                writer.writerows(history)

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for m, track, mean, var in self._bn_state:
            m.track_running_stats, m.running_mean, m.running_var = track, mean, var
        if self._state is not None:
            pl_module.load_state_dict(self._state)
        for p in pl_module.parameters():
            p.requires_grad_(self._requires_grad.get(id(p), True))


class TTAComparison(Callback):
    """Run several TTA variants on the same trained model and test stream, one after the other (claim checks).

    At the end of ``trainer.test`` every variant starts from the source weights, adapts online over the whole test
    loader (adapt-then-predict with ``module(x)``; several test loaders are one stream, in order, with the history's
    ``loader`` column) and is scored; the source weights are restored after each. Logged
    per variant ``<name>``: ``tta/<name>/acc`` (online accuracy over the stream), ``tta/<name>/acc_q1`` ...
    ``acc_q4`` and ``tta/<name>/selected``; the per-batch history goes to ``<default_root_dir>/tta_compare.csv``.
    Training once and comparing methods on one model keeps a multi-method, multi-seed check cheap.

    Args:
        variants: ``name -> keyword arguments of TestTimeAdaptation`` (``method``, ``method_kwargs``, ``lr``, ...).
    """

    def __init__(self, variants: dict[str, dict[str, Any]]) -> None:
        if not variants:
            raise ConfigError("callbacks.tta_compare.variants must name at least one variant")
        self.variants = {name: TestTimeAdaptation(**dict(kw)) for name, kw in variants.items()}
        self.results: dict[str, dict[str, float]] = {}
        self._source: dict[str, torch.Tensor] | None = None

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Snapshot before any other callback adapts the model on the stream.
        self._source = copy.deepcopy(pl_module.state_dict())

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loader = trainer.datamodule.test_dataloader() if trainer.datamodule is not None else trainer.test_dataloaders
        # Several test loaders (e.g. a clean then triggered sets) form one stream, in order, as in the test loop.
        loaders = list(loader) if isinstance(loader, (list, tuple)) else [loader]
        counts = trainer.num_test_batches if isinstance(trainer.num_test_batches, list) else []
        limits = [  # fast_dev_run / limit_*: the test loop's own batch count per loader
            min(int(counts[j]), len(dl)) if j < len(counts) and math.isfinite(counts[j]) else len(dl)
            for j, dl in enumerate(loaders)
        ]
        rows: list[dict[str, Any]] = []
        was_training = pl_module.training
        current = copy.deepcopy(pl_module.state_dict())
        if self._source is not None:
            pl_module.load_state_dict(self._source)
        for name, cb in self.variants.items():
            pl_module.eval()  # an earlier variant left its BatchNorm layers in training mode (test-batch statistics)
            cb.total_steps_arg = cb.total_steps_arg or max(sum(limits), 1)
            cb.restore_on_end = True
            cb.on_test_start(trainer, pl_module)
            correct = total = 0
            for j, (dl, limit) in enumerate(zip(loaders, limits)):
                for i, batch in enumerate(dl):
                    if i >= limit:
                        break
                    batch = pl_module.transfer_batch_to_device(batch, pl_module.device, j)
                    cb.on_test_batch_start(trainer, pl_module, batch, i, j)
                    with torch.no_grad():
                        preds = pl_module(batch[0]).argmax(-1)
                    cb.on_test_batch_end(trainer, pl_module, {"preds": preds}, batch, i, j)
                    correct += int((preds == batch[1]).sum())
                    total += len(batch[1])
            cb.on_test_end(trainer, pl_module)
            res = {"acc": correct / max(total, 1)}
            res.update({f"acc_q{q}": a for q, a in enumerate(cb.quarter_accuracies(), start=1)})
            sel = [h["selected"] for h in cb.history if "selected" in h]
            res["selected"] = sum(sel) / max(len(sel), 1)
            self.results[name] = res
            rows += [{"variant": name, **h} for h in cb.history]
            for key, value in res.items():
                pl_module.log(f"tta/{name}/{key}", value)
        pl_module.load_state_dict(current)
        pl_module.train(was_training)
        if trainer.is_global_zero and rows and trainer.default_root_dir:
            path = Path(trainer.default_root_dir) / "tta_compare.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            keys = sorted({k for r in rows for k in r})
            with path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=keys)
                writer.writeheader()
                writer.writerows(rows)


def comparison(enabled: bool = False, variants: dict[str, dict[str, Any]] | None = None) -> TTAComparison | None:
    """Hydra factory: a :class:`TTAComparison` when ``enabled`` (the claim check turns it on), else nothing."""
    return TTAComparison(dict(variants or {})) if enabled else None
