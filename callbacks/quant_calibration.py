"""Post-training quantization calibration (OSTQuant, ICLR 2025) as a shared callback for every causal LM of the suite.

At the start of ``trainer.test`` (after fit), for each method in ``methods`` the callback builds a transformed,
fake-quantized copy of ``pl_module.<net_attr>`` (:class:`layers.quant.ostquant.TransformedLM`), calibrates it on
``calib_batches`` training batches, quantizes the weights and evaluates it on the validation loader next to the
full-precision model. Methods (the paper's method and the baselines it compares against, same bits):

* ``fp``: no quantization (reference).
* ``rtn``: no transform, round-to-nearest weights.     ``gptq``: no transform, GPTQ weights.
* ``smoothquant``: SmoothQuant scales ``s = max|X|^a / max|W|^(1-a)`` (a = 0.5), RTN weights.
* ``quarot``: random Hadamard ``R_res`` + online Hadamard before down projections, ``w_quantizer`` weights.
* ``spinquant``: Hadamard init, ``R_res`` learned on the Stiefel manifold with the label cross-entropy (no scales).
* ``ostquant``: KLT x Hadamard init, ``R_res`` and the per-head ``R_ov`` (Cayley SGD on the Stiefel manifold) and all
  smoothing scales (``S_qk``, ``S_ov``, norm and up/down scales; Adam) learned for ``steps`` with ``loss``
  (``kl_top``: KL-Top, Eq. in Sec. 4.3; ``kl``; ``ce``), then ``w_quantizer``.
* ``ostquant_kl`` / ``ostquant_ce``: the same with the full-vocabulary KL / label cross-entropy loss (the paper's
  loss ablation, in one run).

:class:`MaskedLMQuantCalibration` does the same for the pretrained MiniLM masked LM (:mod:`layers.quant.minilm`;
losses at the masked positions).

Contract (:func:`callbacks.contracts.quant_calibration_problems`, checked at ``setup`` with one
:class:`~core.errors.ConfigError` line naming what is missing): ``pl_module.<net_attr>`` is a causal LM shaped like
:class:`layers.lm.CausalLM` (``embed``, ``blocks`` of ``norm1``/``mixer``/``norm2``/``mlp`` with linear layers,
``norm``, ``lm_head``; :class:`~callbacks.contracts.CausalLMNet`), and the datamodule's train (calibration) and val
(evaluation) batches are dicts with ``input_ids`` and ``labels``. Vision (and other) classifiers:
:class:`callbacks.quant_classifier.ClassifierQuantCalibration`.

Logged at the end of the test epoch (``quant/<method>_<metric>``): ``loss``, ``ppl``, ``ppl_gap`` (to ``fp``), ``kl``
(token-mean KL from the full-precision model) and ``log_qsur`` (mean log-QSUR of the inputs of the input-side
linears, :mod:`ops.quant.qsur`). Also written to ``quant_calibration.json`` in the run's log folder.

Under DDP (``trainer=ddp``) the result is the one-process result (:mod:`callbacks.distributed`): every rank
calibrates on the ranks' calibration batches pooled (the same transforms, Hessians and learned rotations on every
rank), evaluates its own shard of the validation batches, and the token sums are added over the ranks before loss,
perplexity and KL are formed; rank zero writes the json. Equal to one process up to float rounding. ``log_qsur`` is
the exception: each rank estimates it from its own first evaluation batch, and the logged value is rank zero's.
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningModule, Trainer

from callbacks.contracts import quant_calibration_problems, refuse
from callbacks.distributed import gather_batches, sum_over_ranks
from core.errors import ConfigError
from core.smoke import smoke_test
from layers.quant.minilm import QuantMiniLM
from layers.quant.ostquant import TransformedLM
from ops.quant import CayleySGD, check_bits, clip_ratios, kl_full, kl_top, log_qsur
from ops.quant.fake import SYM_SCALES

METHODS = ("fp", "rtn", "gptq", "smoothquant", "quarot", "spinquant", "ostquant", "ostquant_kl", "ostquant_ce")
# learned methods: (loss, learn the scales); loss None = the callback's ``loss``
LEARNED = {
    "spinquant": ("ce", False),
    "ostquant": (None, True),
    "ostquant_kl": ("kl", True),
    "ostquant_ce": ("ce", True),
}
LOSSES = ("kl_top", "kl", "ce")
IGNORE = -100


class QuantCalibration(Callback):
    """Calibrate and evaluate W/A/KV fake quantization of the trained LM (see module docstring).

    Args:
        methods: Subset of ``fp, rtn, gptq, smoothquant, quarot, spinquant, ostquant, ostquant_kl, ostquant_ce``.
        w_bits, a_bits, kv_bits: Bit widths (2..8, or 16 = full precision).
        w_group_size, a_group_size, kv_group_size: Group sizes (must divide the dimension) or ``None``.
        w_quantizer: ``gptq`` or ``rtn`` for the rotation methods (``rtn``/``smoothquant`` always use RTN).
        steps: Optimisation steps of the learned methods (official: 100).
        rotate_lr, smooth_lr: Learning rates of ``R_res`` (Cayley SGD) and the scales (Adam) (official values).
        loss: ``kl_top``, ``kl`` or ``ce`` for ``ostquant`` (the ablation).
        top_k: ``k`` of KL-Top (official 1000; capped at the vocabulary).
        calib_batches: Training batches used for calibration.
        eval_batches: Validation batches evaluated (``None``: all).
        net_attr: Attribute of the LightningModule holding the LM.
        online_hadamard: Hadamard before the down projections (QuaRot / OSTQuant default).
        seed: Seed of the random Hadamards.
        w_clip: Search each weight row's clip ratio when the weights are frozen (official ``w_clip``, on by default).
        w_clip_grid: ``official`` (80 ratios ``1.00 ... 0.21``) or ``coarse`` (``1.0 ... 0.5`` by 0.05).
        w_clip_norm: Error exponent of the clip search (official 2.4; 2 = squared error).
        klt_centered: KLT init of the OSTQuant methods from the centred weight-row covariance (default) or the
            uncentred ``W^T W / N``.
        w_sym_scale: Weight scale, ``signed`` (official ``max(-min/8, max/7)`` on ``[-8, 7]``) or ``absmax``
            (``max|w|/7``, symmetric).
    """

    def __init__(
        self,
        methods: list[str] | tuple[str, ...] = METHODS,
        w_bits: int = 4,
        a_bits: int = 4,
        kv_bits: int = 4,
        w_group_size: int | None = None,
        a_group_size: int | None = None,
        kv_group_size: int | None = None,
        w_quantizer: str = "gptq",
        steps: int = 100,
        rotate_lr: float = 0.016898,
        smooth_lr: float = 0.0017899,
        loss: str = "kl_top",
        top_k: int = 1000,
        calib_batches: int = 8,
        eval_batches: int | None = None,
        net_attr: str = "net",
        online_hadamard: bool = True,
        seed: int = 0,
        w_clip: bool = True,
        w_clip_grid: str = "official",
        w_clip_norm: float = 2.4,
        klt_centered: bool = True,
        w_sym_scale: str = "signed",
    ) -> None:
        if w_sym_scale not in SYM_SCALES:
            raise ConfigError(
                f"callbacks.quant_calibration.w_sym_scale={w_sym_scale!r} must be one of {list(SYM_SCALES)}"
            )

        clip_ratios(w_clip_grid)  # a bad grid name fails here, not after training
        if w_clip_norm <= 0:
            raise ConfigError(f"callbacks.quant_calibration.w_clip_norm={w_clip_norm!r} must be > 0")
        bad = [m for m in methods if m not in METHODS]
        if bad or not methods:
            raise ConfigError(
                f"callbacks.quant_calibration.methods={list(methods)} must be a non-empty subset of {list(METHODS)}"
            )
        for name, b in (("w_bits", w_bits), ("a_bits", a_bits), ("kv_bits", kv_bits)):
            if b != 16:
                check_bits(f"callbacks.quant_calibration.{name}", b)
        if w_quantizer not in ("gptq", "rtn"):
            raise ConfigError(f"callbacks.quant_calibration.w_quantizer={w_quantizer!r} must be 'gptq' or 'rtn'")
        if loss not in LOSSES:
            raise ConfigError(f"callbacks.quant_calibration.loss={loss!r} must be one of {list(LOSSES)}")
        if steps < 0 or calib_batches < 1:
            raise ConfigError(
                f"callbacks.quant_calibration: steps={steps} must be >= 0, calib_batches={calib_batches} >= 1"
            )
        self.methods = list(methods)
        self.bits = {"w_bits": w_bits, "a_bits": a_bits, "kv_bits": kv_bits}
        self.groups = {"w_group_size": w_group_size, "a_group_size": a_group_size, "kv_group_size": kv_group_size}
        self.w_quantizer, self.steps, self.loss, self.top_k = w_quantizer, steps, loss, top_k
        self.rotate_lr, self.smooth_lr = rotate_lr, smooth_lr
        self.calib_batches, self.eval_batches, self.net_attr = calib_batches, eval_batches, net_attr
        self.online_hadamard, self.seed = online_hadamard, seed
        self.clip = {"clip_search": w_clip, "clip_grid": w_clip_grid, "clip_norm": w_clip_norm}
        self.klt_centered, self.w_sym_scale = klt_centered, w_sym_scale
        self.results: dict[str, dict[str, float]] = {}
        self._smoke = False  # fast_dev_run: RTN weights only, no clip search
        self._pool = None  # DDP: sums [loss, kl, n] over the ranks (set by the Trainer hooks)

    # -- the calibration pipeline (usable without a Trainer) -------------------------------------------------------
    def build(self, net: torch.nn.Module, method: str, calib: list[dict[str, torch.Tensor]], steps: int):
        """Transformed + calibrated + weight-quantized copy of ``net`` for ``method`` (``fp``: ``None``)."""
        if method == "fp":
            return None
        init = {"quarot": "hadamard", "spinquant": "hadamard"}.get(method, "identity")
        init = "klt_hadamard" if method.startswith("ostquant") else init
        t = self.transformed(net, init).to(next(net.parameters()).device)
        ids = [b["input_ids"] for b in calib]
        if method == "smoothquant":
            t.smoothquant_scales(ids)
        if method in LEARNED and steps:
            loss, learn_scales = LEARNED[method]
            self._learn(net, t, calib, steps, learn_scales=learn_scales, loss=loss or self.loss)
        wq = "rtn" if method in ("rtn", "smoothquant") or self._smoke else self.w_quantizer
        if wq == "gptq" and self.bits["w_bits"] < 16:
            t.collect_hessians(ids)
        clip = {**self.clip, "clip_search": False} if self._smoke else self.clip  # smoke test: no search
        t.freeze(wq, **clip)
        return t

    def transformed(self, net: torch.nn.Module, init: str) -> torch.nn.Module:
        """The transformable, fake-quantized copy of ``net`` (a causal LM: :class:`~layers.quant.ostquant.
        TransformedLM`)."""
        return TransformedLM(
            net,
            init,
            **self.bits,
            **self.groups,
            online_hadamard=self.online_hadamard and init != "identity",
            seed=self.seed,
            klt_centered=self.klt_centered,
            w_sym_scale=self.w_sym_scale,
        )

    def logits(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits [..., V], labels [...])`` of ``model`` on ``batch`` (every position of a causal LM)."""
        return model(batch["input_ids"]), batch["labels"]

    def _learn(self, net, t, calib, steps: int, learn_scales: bool, loss: str) -> None:
        opt_r = CayleySGD(t.rotation_parameters(), lr=self.rotate_lr)
        opt_s = torch.optim.Adam(t.scale_parameters(), lr=self.smooth_lr) if learn_scales else None
        if not learn_scales:
            for s in t.scale_parameters():
                s.requires_grad_(False)
        net.eval()
        with torch.enable_grad():
            for step in range(steps):
                batch = calib[step % len(calib)]
                with torch.no_grad():
                    fp, _ = self.logits(net, batch)
                q, labels = self.logits(t, batch)
                if loss == "kl_top":
                    value = kl_top(fp, q, self.top_k)
                elif loss == "kl":
                    value = kl_full(fp, q)
                else:
                    value = F.cross_entropy(q.reshape(-1, q.shape[-1]).float(), labels.flatten(), ignore_index=IGNORE)
                opt_r.zero_grad()
                if opt_s:
                    opt_s.zero_grad()
                value.backward()
                opt_r.step()
                if opt_s:
                    opt_s.step()
                    with torch.no_grad():
                        for s in t.scale_parameters():
                            s.clamp_(min=1e-3)

    @torch.no_grad()
    def evaluate(self, net, t, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
        """Token-mean loss / ppl / KL-to-fp (and mean log-QSUR for transformed models) over ``batches``."""
        tot, kl, n = 0.0, 0.0, 0
        qsurs: list[float] = []
        hooks = []
        if t is not None:
            seen: dict[str, torch.Tensor] = {}
            for key, lin in t.linears.items():
                if lin.in_scale and key not in seen:
                    hooks.append(lin.register_forward_pre_hook(partial(_record_input, seen=seen, key=key, t=t)))
        for batch in batches:
            fp, labels = self.logits(net, batch)
            logits = fp if t is None else self.logits(t, batch)[0]
            mask = labels != IGNORE
            tot += F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), labels.flatten(), ignore_index=IGNORE, reduction="sum"
            ).item()
            kl += kl_full(fp[mask], logits[mask]).item() * int(mask.sum())
            n += int(mask.sum())
        for h in hooks:
            h.remove()
        if t is not None:
            for x in seen.values():
                if x.shape[0] > x.shape[1]:
                    x = x.double()
                    qsurs.append(
                        float(log_qsur(torch.cov(x.T) + 1e-8 * torch.eye(x.shape[1], dtype=x.dtype), x.mean(0)))
                    )
        if self._pool is not None:
            tot, kl, n = self._pool([tot, kl, n])
        loss = tot / max(n, 1)
        out = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "kl": kl / max(n, 1)}
        if qsurs:
            out["log_qsur"] = sum(qsurs) / len(qsurs)
        return out

    # -- the contract -----------------------------------------------------------------------------------------------
    masked = False  # the LM kind this callback transforms (MaskedLMQuantCalibration: True)

    def contract_problems(self, module: torch.nn.Module, datamodule: Any = None) -> list[str]:
        """What ``module`` / ``datamodule`` lack for this callback (empty: they meet the contract); no Trainer needed.
        See :func:`callbacks.contracts.quant_calibration_problems`."""
        return quant_calibration_problems(module, datamodule, net_attr=self.net_attr, masked=self.masked)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # the module before fitting (a long run is not wasted), its calibration / evaluation data at test time
        refuse(
            "callbacks.quant_calibration",
            self.contract_problems(pl_module, trainer.datamodule if stage == "test" else None),
        )

    # -- Lightning hooks -------------------------------------------------------------------------------------------
    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        with torch.inference_mode(False):  # the test loop runs in inference mode; calibration needs autograd
            self._run(trainer, pl_module)

    def _run(self, trainer: Trainer, pl_module: LightningModule) -> None:
        net = getattr(pl_module, self.net_attr, None)
        if net is None:
            raise ConfigError(
                f"callbacks.quant_calibration.net_attr={self.net_attr!r}: the module has no such attribute"
            )
        dm = trainer.datamodule
        fast = smoke_test(trainer)
        n_calib = 1 if fast else self.calib_batches
        calib = _take(dm.train_dataloader(), n_calib, pl_module.device)
        calib = gather_batches(trainer, pl_module, calib)  # DDP: every rank calibrates on the pooled batches
        evals = _take(dm.val_dataloader(), 1 if fast else self.eval_batches, pl_module.device)
        if fast:  # smoke test: calibrate on two sequences (the LM head over every token dominates the smoke run);
            calib = _first_rows(calib, SMOKE_ROWS)  # after the DDP pooling, so 2 processes calibrate as 1 does
        self._pool = partial(sum_over_ranks, trainer, device=pl_module.device)  # DDP: each rank scores its shard
        steps = min(self.steps, 2) if fast else self.steps
        self._smoke = fast
        was_training = pl_module.training
        pl_module.eval()
        torch.manual_seed(self.seed)
        self.results = {}
        # fast_dev_run: a smoke test of the pipeline (full precision and the last method, 2 steps)
        methods = list(dict.fromkeys(["fp", self.methods[-1]])) if fast else self.methods
        for method in methods:
            t = self.build(net, method, calib, steps)
            self.results[method] = self.evaluate(net, t, evals)
        fp = self.results.get("fp")
        if fp:
            for r in self.results.values():
                r["ppl_gap"] = r["ppl"] - fp["ppl"]
        pl_module.train(was_training)
        self._pool = None
        write_results(trainer, {"bits": self.bits, "results": self.results})

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        log_results(pl_module, self.results)


class MaskedLMQuantCalibration(QuantCalibration):
    """:class:`QuantCalibration` for a masked LM (:class:`layers.quant.minilm.MaskedLM`, the pretrained MiniLM).

    Same methods, bits, calibration and logged keys; the transformed copy is a :class:`layers.quant.minilm.
    QuantMiniLM` (post-LN BERT: online input rotations instead of ``R_res``, see that module), and every loss (the
    calibration loss, the evaluation loss and KL) is taken at the masked positions only (``labels != -100``): the MLM
    distribution there is what the head was fitted for, and KL-Top ranks the 30,522-token vocabulary. ``log_qsur``
    is not computed. Contract: ``pl_module.<net_attr>`` is a :class:`~callbacks.contracts.MaskedLMNet` (a BERT
    ``encoder`` and an MLM ``head``), batches as for :class:`QuantCalibration`.
    """

    masked = True

    def transformed(self, net: torch.nn.Module, init: str) -> torch.nn.Module:
        return QuantMiniLM(
            net,
            init,
            **self.bits,
            **self.groups,
            online_hadamard=self.online_hadamard and init != "identity",
            seed=self.seed,
            klt_centered=self.klt_centered,
            w_sym_scale=self.w_sym_scale,
        )

    def logits(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits [N, V], labels [N])`` at the ``N`` masked positions of ``batch``."""
        mask = batch["labels"] != IGNORE
        return model(batch["input_ids"], mask), batch["labels"][mask]


def write_results(trainer: Trainer, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``quant_calibration.json`` in the run's log folder (rank zero).

    Every rank must call it: ``trainer.log_dir`` is a broadcast from rank zero under DDP (asked on rank zero alone,
    it waits for the other ranks forever)."""
    folder = Path(trainer.log_dir or trainer.default_root_dir)
    if trainer.is_global_zero:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "quant_calibration.json").write_text(json.dumps(payload, indent=2))


def log_results(pl_module: LightningModule, results: dict[str, dict[str, float]]) -> None:
    """Log ``results[method][metric]`` as ``quant/<method>_<metric>``."""
    for method, r in results.items():
        for k, v in r.items():
            pl_module.log(f"quant/{method}_{k}", float(v), add_dataloader_idx=False)


def _record_input(m: Any, inputs: tuple, seen: dict, key: str, t: Any) -> None:
    """Keep the first (scaled) input of an input-side linear for the QSUR estimate (returns None: input unchanged)."""
    if key not in seen:
        x = inputs[0] / t.scales[m.in_scale]
        seen[key] = x.reshape(-1, x.shape[-1])


SMOKE_ROWS = 2  # sequences of the calibration batch in a smoke test (debug modes)


def _first_rows(batches: list[dict[str, torch.Tensor]], n: int) -> list[dict[str, torch.Tensor]]:
    """The first ``n`` sequences of every batch (same keys)."""
    return [{k: v[:n] for k, v in b.items()} for b in batches]


def _take(loader: Any, n: int | None, device: torch.device) -> list[dict[str, torch.Tensor]]:
    loaders = loader if isinstance(loader, (list, tuple)) else [loader]
    out = []
    for batch in loaders[0]:
        if not isinstance(batch, dict) or "input_ids" not in batch or "labels" not in batch:
            raise ConfigError("callbacks.quant_calibration needs LM batches with 'input_ids' and 'labels'")
        out.append({k: v.to(device).clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
        if n is not None and len(out) >= n:
            break
    return out
