"""Test-time adaptation strategies used by :class:`callbacks.tta.TestTimeAdaptation`.

Each strategy performs one adaptation step on an unlabelled test batch ``x`` of a classification module. The
callback owns the plumbing (which parameters adapt, the optimiser, episodic resets, restoring at the end); a
strategy owns the objective. The math lives in :mod:`ops.tta`.

* :class:`Tent` (Wang et al. 2021): minimise the mean prediction entropy.
* :class:`EATA` (Niu et al. 2022): entropy below ``E0 = 0.4 ln C`` and not redundant with the running mean
  prediction (cosine ``< d_margin``), weighted by ``exp(-(H - E0))``, plus a Fisher (EWC) anchor to the source
  weights estimated on the datamodule's clean validation split.
* :class:`SAR` (Niu et al. 2023): reliable-entropy filter, sharpness-aware minimisation (SAM) and a model reset
  when the moving average of the entropy falls below ``reset_ema`` (collapse detection).
* :class:`SuMi` (Guo & Jin 2025): IQR smoothing, unimodal assistance, MI sharing, balance and EATA weighting
  (:func:`ops.tta.sumi_objective`); needs a module with ``tta_forward`` (e.g. ``SumiLitModule``).
* :class:`BNAdapt` (Schneider et al. 2020; Nado et al. 2020; the "BN" row of Tent's tables): BatchNorm normalises
  with the test batch's statistics, and nothing else changes: no objective, no gradient step. On a model without
  BatchNorm (a ViT with LayerNorm) it is the source model.
* :class:`SourceOnly`: no adaptation (the reference row).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import ConfigError
from ops.tta import eata_weights, softmax_entropy, sumi_objective
from ops.tta.entropy import default_margin
from ops.tta.sumi import OFFICIAL_GAMMA_U, OFFICIAL_MARGIN, QUARTILES

log = logging.getLogger(__name__)


class Strategy:
    """Base class: one adaptation step per call.

    The callback calls :meth:`setup` once at test start and :meth:`adapt` once per step. ``adapt`` returns a dict
    of floats (``loss``, ``selected``: fraction of the batch the update used, ...) for the stream history.

    ``adapts``: the model changes on the stream (BatchNorm then normalises with test-batch statistics);
    ``trains``: the strategy takes gradient steps on the adapted parameters (an optimiser is built for them).
    """

    adapts = True
    trains = True

    def setup(
        self,
        module: nn.Module,
        params: list[nn.Parameter],
        optimizer: torch.optim.Optimizer | None,
        num_classes: int,
        reset: Callable[[], None],
        source_batches: Callable[[], Any] | None = None,
    ) -> None:
        self.module, self.params, self.optimizer = module, params, optimizer
        self.num_classes, self.reset = num_classes, reset

    def adapt(self, x: Any, t: int, total: int) -> dict[str, float]:
        raise NotImplementedError

    def _step(self, loss: torch.Tensor) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class SourceOnly(Strategy):
    """No adaptation: the source model predicts the stream as is."""

    adapts = False
    trains = False

    def adapt(self, x: Any, t: int, total: int) -> dict[str, float]:
        return {"loss": float("nan"), "selected": 0.0}


class BNAdapt(Strategy):
    """Test-batch BatchNorm statistics alone: the callback switches every BatchNorm to the statistics of the batch it
    normalises, and :meth:`adapt` does nothing more (no loss, no gradient, no parameter changes). Tent's gain over
    this arm is what its entropy steps add."""

    trains = False

    def adapt(self, x: Any, t: int, total: int) -> dict[str, float]:
        return {"loss": float("nan"), "selected": 0.0}


class Tent(Strategy):
    """Tent: ``min mean_i H(p_i)`` over the normalisation affine parameters (Wang et al. 2021, Eq. (1))."""

    def adapt(self, x: Any, t: int, total: int) -> dict[str, float]:
        loss = softmax_entropy(self.module(x)).mean()
        self._step(loss)
        return {"loss": float(loss.detach()), "selected": 1.0}


class EATA(Strategy):
    """EATA: sample-efficient entropy minimisation with anti-forgetting (Niu et al. 2022).

    Args:
        e_margin: Entropy bound ``E0``; ``None`` is ``0.4 ln C`` (EATA Eq. (6)).
        d_margin: Redundancy bound on ``|cos(p_i, p_bar)|`` (EATA: 0.05 on ImageNet-C, 0.4 on CIFAR-10-C).
        fisher_alpha: Weight of the Fisher (EWC) anchor, EATA Eq. (9); ``0`` gives ETA.
        fisher_batches: Clean validation batches used to estimate the Fisher diagonal (pseudo-labels, as EATA).
    """

    def __init__(
        self,
        e_margin: float | None = None,
        d_margin: float = 0.4,
        fisher_alpha: float = 2000.0,
        fisher_batches: int = 4,
    ) -> None:
        if d_margin <= 0:
            raise ConfigError(f"callbacks.tta.method_kwargs.d_margin={d_margin} must be > 0")
        if fisher_alpha < 0 or fisher_batches < 1:
            raise ConfigError(
                f"callbacks.tta.method_kwargs fisher_alpha={fisher_alpha} must be >= 0 and fisher_batches="
                f"{fisher_batches} >= 1"
            )
        self.e_margin_arg, self.d_margin = e_margin, d_margin
        self.fisher_alpha, self.fisher_batches = fisher_alpha, fisher_batches
        self.mean_probs: torch.Tensor | None = None
        self.fishers: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def setup(self, module, params, optimizer, num_classes, reset, source_batches=None) -> None:  # noqa: ANN001
        super().setup(module, params, optimizer, num_classes, reset, source_batches)
        self.e_margin = self.e_margin_arg if self.e_margin_arg is not None else default_margin(num_classes)
        self.mean_probs = None
        self.fishers = None
        if self.fisher_alpha > 0:
            if source_batches is None:
                log.warning("EATA: no clean validation split to estimate the Fisher anchor; running without it (ETA)")
            else:
                self.fishers = self._fisher(source_batches())

    def _fisher(self, batches: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Diagonal Fisher of the pseudo-label cross-entropy on clean data, EATA Eq. (9)."""
        sq = [torch.zeros_like(p) for p in self.params]
        n = 0
        for i, x in enumerate(batches):
            if i >= self.fisher_batches:
                break
            logits = self.module(x)
            loss = F.cross_entropy(logits, logits.argmax(-1))
            grads = torch.autograd.grad(loss, self.params, allow_unused=True)
            for s, g in zip(sq, grads):
                if g is not None:
                    s += g.detach() ** 2
            n += 1
        return [(s / max(n, 1), p.detach().clone()) for s, p in zip(sq, self.params)]

    def adapt(self, x: Any, t: int, total: int) -> dict[str, float]:
        logits = self.module(x)
        ent = softmax_entropy(logits)
        keep = ent.detach() < self.e_margin
        probs = logits.detach().softmax(-1)
        if self.mean_probs is not None:
            cos = F.cosine_similarity(self.mean_probs[None], probs, dim=-1)
            keep = keep & (cos.abs() < self.d_margin)
        idx = torch.nonzero(keep).flatten()
        if idx.numel():
            new = probs[idx].mean(0)
            self.mean_probs = new if self.mean_probs is None else 0.9 * self.mean_probs + 0.1 * new
            loss = (ent[idx] * eata_weights(ent[idx], self.e_margin)).mean()
            if self.fishers is not None:
                ewc = sum((f * (p - p0) ** 2).sum() for (f, p0), p in zip(self.fishers, self.params))
                loss = loss + self.fisher_alpha * ewc
            self._step(loss)
            value = float(loss.detach())
        else:
            value = float("nan")
        return {"loss": value, "selected": idx.numel() / len(ent)}


class SAR(Strategy):
    """SAR: sharpness-aware and reliable entropy minimisation with model recovery (Niu et al. 2023).

    Args:
        e_margin: Reliable-entropy bound; ``None`` is ``0.4 ln C``.
        rho: SAM neighbourhood radius.
        reset_ema: Reset the model when the moving average of the entropy drops below this (collapse).
    """

    def __init__(self, e_margin: float | None = None, rho: float = 0.05, reset_ema: float = 0.2) -> None:
        if rho <= 0:
            raise ConfigError(f"callbacks.tta.method_kwargs.rho={rho} must be > 0")
        self.e_margin_arg, self.rho, self.reset_ema = e_margin, rho, reset_ema
        self.ema: float | None = None
        self.resets = 0

    def setup(self, module, params, optimizer, num_classes, reset, source_batches=None) -> None:  # noqa: ANN001
        super().setup(module, params, optimizer, num_classes, reset, source_batches)
        self.e_margin = self.e_margin_arg if self.e_margin_arg is not None else default_margin(num_classes)
        self.ema, self.resets = None, 0

    def adapt(self, x: Any, t: int, total: int) -> dict[str, float]:
        assert self.optimizer is not None
        ent = softmax_entropy(self.module(x))
        idx = torch.nonzero(ent.detach() < self.e_margin).flatten()
        if idx.numel() == 0:
            return {"loss": float("nan"), "selected": 0.0, "resets": float(self.resets)}
        self.optimizer.zero_grad(set_to_none=True)
        ent[idx].mean().backward()
        # SAM ascent: theta + rho g / ||g||.
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        norm = torch.norm(torch.stack([g.norm(2) for g in grads]), 2)
        eps = [g * (self.rho / (norm + 1e-12)) for g in grads]
        with torch.no_grad():
            for p, e in zip(self.params, eps):
                p.add_(e)
        self.optimizer.zero_grad(set_to_none=True)
        ent2 = softmax_entropy(self.module(x))[idx]
        value = float(ent2.detach().mean())
        idx2 = torch.nonzero(ent2.detach() < self.e_margin).flatten()
        if idx2.numel():
            ent2[idx2].mean().backward()
        with torch.no_grad():
            for p, e in zip(self.params, eps):
                p.sub_(e)
        if idx2.numel():
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.ema = value if self.ema is None else 0.9 * self.ema + 0.1 * value
        if self.ema < self.reset_ema:
            self.reset()
            self.ema = None
            self.resets += 1
        return {"loss": value, "selected": idx.numel() / len(ent), "resets": float(self.resets)}


class SuMi(Strategy):
    """SuMi: IQR smoothing + unimodal assistance + MI sharing (Guo & Jin 2025), Eqs. (3)-(7).

    Args:
        thresholds: ``paper`` (``gamma_m = E0 = 0.4 ln C``) or ``code`` (``ln(1000)/2 - 1 = 2.454``, the official
            default for every dataset). ``gamma_m``/``e_margin`` override either.
        gamma_m: Upper bound on the multimodal entropy, Eq. (4).
        e_margin: ``E0`` of the weights, Eq. (7).
        gamma_u: Lower bound on the unimodal entropy, Eq. (4) (code: ``e/10``).
        mu: Video weight in the unimodal entropy.
        lam: MI-sharing weight ``lambda`` (``0`` ablates MI sharing).
        k, min_keep, quartiles: IQR smoothing, Eq. (3); ``quartiles="minmax"`` is the official code's.
        use_iqr, use_unimodal, use_balance: Ablation switches.
        detach_mi_targets: Stop gradients through the MI mixtures (the code does not).
        faithful_second_half: The official code's switch-off of MI sharing for ``t >= T/2``.
    """

    def __init__(
        self,
        thresholds: str = "paper",
        gamma_m: float | None = None,
        e_margin: float | None = None,
        gamma_u: float = OFFICIAL_GAMMA_U,
        mu: float = 1.0,
        lam: float = 5.0,
        k: float = 1.5,
        min_keep: float = 0.6,
        quartiles: str = "quantile",
        use_iqr: bool = True,
        use_unimodal: bool = True,
        use_balance: bool = True,
        detach_mi_targets: bool = False,
        faithful_second_half: bool = False,
    ) -> None:
        pre = "callbacks.tta.method_kwargs"
        if thresholds not in ("paper", "code"):
            raise ConfigError(f"{pre}.thresholds={thresholds!r} must be 'paper' or 'code'")
        if quartiles not in QUARTILES:
            raise ConfigError(f"{pre}.quartiles={quartiles!r} must be one of {list(QUARTILES)}")
        if not 0.0 <= min_keep <= 1.0:
            raise ConfigError(f"{pre}.min_keep={min_keep} must be in [0, 1]")
        if lam < 0 or mu < 0 or k < 0:
            raise ConfigError(f"{pre}: lam={lam}, mu={mu} and k={k} must be >= 0")
        self.thresholds, self.gamma_m_arg, self.e_margin_arg = thresholds, gamma_m, e_margin
        self.kwargs = dict(
            gamma_u=gamma_u,
            mu=mu,
            lam=lam,
            k=k,
            min_keep=min_keep,
            quartiles=quartiles,
            use_iqr=use_iqr,
            use_unimodal=use_unimodal,
            use_balance=use_balance,
            detach_mi_targets=detach_mi_targets,
            faithful_second_half=faithful_second_half,
        )
        self.skipped = 0

    def setup(self, module, params, optimizer, num_classes, reset, source_batches=None) -> None:  # noqa: ANN001
        if not callable(getattr(module, "tta_forward", None)):
            raise ConfigError(
                f"callbacks.tta.method='sumi' needs a multimodal module with tta_forward(x) (audio/video logits and "
                f"features); {type(module).__name__} has none"
            )
        super().setup(module, params, optimizer, num_classes, reset, source_batches)
        base = default_margin(num_classes) if self.thresholds == "paper" else OFFICIAL_MARGIN
        self.gamma_m = self.gamma_m_arg if self.gamma_m_arg is not None else base
        self.e_margin = self.e_margin_arg if self.e_margin_arg is not None else base
        self.skipped = 0

    def adapt(self, x: Any, t: int, total: int) -> dict[str, float]:
        out = self.module.tta_forward(x)
        if out["logits_a"] is None or out["logits_v"] is None:
            # A modality is missing for the whole batch: SuMi's unimodal terms are undefined; predict without adapting.
            if self.skipped == 0:
                log.warning("SuMi: a batch lacks a modality entirely; it is predicted without adaptation")
            self.skipped += 1
            return {"loss": float("nan"), "selected": 0.0, "iqr": math.nan, "unimodal": math.nan}
        feat = torch.cat([out["feat_a"], out["feat_v"]], -1).detach()
        step = sumi_objective(
            out["logits_a"],
            out["logits_v"],
            out["logits"],
            feat,
            t,
            total,
            gamma_m=self.gamma_m,
            e_margin=self.e_margin,
            **self.kwargs,
        )
        b = feat.shape[0]
        info = {
            "selected": step.selected.numel() / b,
            "iqr": float(step.iqr_mask.float().mean()),
            "unimodal": float(step.entropy_mask.float().mean()),
        }
        if step.loss is None:
            return {"loss": float("nan"), **info}
        self._step(step.loss)
        return {"loss": float(step.loss.detach()), **info}


METHODS: dict[str, type[Strategy]] = {
    "source": SourceOnly,
    "bn": BNAdapt,
    "tent": Tent,
    "eata": EATA,
    "sar": SAR,
    "sumi": SuMi,
}
