"""Outlier census over training, for any transformer in the suite (or any ``nn.Module``; see :func:`run_census`).

Every ``every_n_steps`` optimiser steps (and at the start and end of fit) the callback runs the model in eval mode on
a fixed probe batch (the first training batch, kept) with forward hooks on the modules whose qualified name matches
``activation_pattern`` (block outputs by default; ``capture=input`` reads their inputs instead; a CNN's feature maps
``[B, C, H, W]`` are read as pixels x channels), and measures (criteria in :mod:`ops.outliers.census`):

* activations: ``top1 / median`` |h| per layer and the share of tokens holding an entry above ``k * mean|h|`` for
  every ``k`` given (the paper's ``k = 1000``; smaller ``k`` for small models), plus the outlier channels;
* weights: ``max|W| / median|W|`` of every parameter-holding module whose name matches ``weight_pattern``;
* attention sinks: for modules exposing ``record_attention`` / ``last_attention`` (the
  :mod:`layers.attention.outlier_variants` mixers), the share of attention on the first token.

Logged (``census/...``): ``act_ratio_max``, ``act_token_frac_k<k>`` (max over layers), ``weight_ratio_max`` and
``sink_share`` (mean over layers and heads). Every per-layer number goes to ``outlier_census.csv`` in the run's log
folder, and at the end of fit ``outlier_census.png`` plots them over training.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn

from core.errors import ConfigError
from ops.outliers import activation_outlier_stats, as_tokens, attention_sink_share, weight_outlier_ratio

CAPTURES = ("output", "input")


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return getattr(out, "last_hidden_state", None)


@torch.no_grad()
def run_census(
    model: nn.Module,
    forward: Callable[[], Any],
    activation_pattern: str = r"^(net\.)?blocks\.\d+$",
    weight_pattern: str = r"(o_proj|down_proj)$",
    k: Sequence[float] = (1000.0, 100.0),
    top: int = 3,
    capture: str = "output",
) -> list[dict[str, Any]]:
    """One census of ``model`` while ``forward()`` runs it.

    Args:
        model: The module whose submodules are hooked (named by ``model.named_modules()``).
        forward: Runs the model once on the probe input (e.g. ``lambda: model(ids)``).
        activation_pattern: Regex on module names whose outputs (``[B, T, d]``; a feature map ``[B, C, H, W]`` or a
            flat ``[B, d]`` is read as tokens by :func:`ops.outliers.as_tokens`) are censused.
        weight_pattern: Regex on module names whose ``weight`` is censused.
        k: Outlier thresholds (multiples of the mean magnitude).
        top: Largest magnitudes kept per layer.
        capture: ``output`` (a block's output: the residual stream) or ``input`` (a layer's first input: what a
            per-token activation quantizer of that layer sees).

    Returns:
        Rows ``{"kind": "act" | "weight" | "attn", "name": module, "metric": ..., "value": float}``; the ``act``
        rows include ``top1..top<top>``, ``median``, ``ratio``, ``token_frac_k<k>`` and ``dims_k<k>`` (the outlier
        channels, a space-separated string).
    """
    for kk in k:
        if not kk > 0:
            raise ConfigError(f"outlier_census.k={list(k)} must hold positive thresholds")
    if capture not in CAPTURES:
        raise ConfigError(f"outlier_census.capture={capture!r} must be one of {list(CAPTURES)}")
    act_re, w_re = re.compile(activation_pattern), re.compile(weight_pattern)
    captured: dict[str, torch.Tensor] = {}
    handles, recorders = [], []
    for name, mod in model.named_modules():
        if act_re.search(name):
            handles.append(
                mod.register_forward_hook(
                    lambda m, i, o, n=name: captured.__setitem__(n, _first_tensor(i if capture == "input" else o))
                )
            )
        if hasattr(mod, "record_attention"):
            recorders.append((name, mod, mod.record_attention))
            mod.record_attention = True
    if not handles:
        raise ConfigError(f"outlier_census.activation_pattern={activation_pattern!r} matches no module of the model")
    try:
        forward()
    finally:
        for h in handles:
            h.remove()
        for _, mod, old in recorders:
            mod.record_attention = old
    rows: list[dict[str, Any]] = []
    for name, h in captured.items():
        if h is None or h.dim() not in (2, 3, 4):
            continue
        h = as_tokens(h)
        for kk in k:
            st = activation_outlier_stats(h, kk, top)
            rows.append(
                {"kind": "act", "name": name, "metric": f"token_frac_k{kk:g}", "value": float(st["token_frac"])}
            )
            dims = (st["per_dim"] > 0).nonzero().flatten().tolist()
            rows.append({"kind": "act", "name": name, "metric": f"dims_k{kk:g}", "value": " ".join(map(str, dims))})
        for i, v in enumerate(st["topk"].tolist()):
            rows.append({"kind": "act", "name": name, "metric": f"top{i + 1}", "value": v})
        rows.append({"kind": "act", "name": name, "metric": "median", "value": float(st["median"])})
        rows.append({"kind": "act", "name": name, "metric": "ratio", "value": float(st["ratio"])})
    for name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if w_re.search(name) and isinstance(w, torch.Tensor) and w.dim() >= 2:
            rows.append({"kind": "weight", "name": name, "metric": "ratio", "value": float(weight_outlier_ratio(w))})
    for name, mod, _ in recorders:
        attn = getattr(mod, "last_attention", None)
        if isinstance(attn, torch.Tensor):
            share = attention_sink_share(attn)
            rows.append({"kind": "attn", "name": name, "metric": "sink_share", "value": float(share.mean())})
            mod.last_attention = None
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Scalars to log: max act ratio, max token share per ``k``, max weight ratio, mean attention-sink share."""
    out: dict[str, float] = {}
    acts = [r for r in rows if r["kind"] == "act" and isinstance(r["value"], float)]
    ratios = [r["value"] for r in acts if r["metric"] == "ratio"]
    if ratios:
        out["census/act_ratio_max"] = max(ratios)
    for metric in sorted({r["metric"] for r in acts if r["metric"].startswith("token_frac")}):
        out[f"census/act_{metric}"] = max(r["value"] for r in acts if r["metric"] == metric)
    w = [r["value"] for r in rows if r["kind"] == "weight"]
    if w:
        out["census/weight_ratio_max"] = max(w)
    s = [r["value"] for r in rows if r["kind"] == "attn"]
    if s:
        out["census/sink_share"] = sum(s) / len(s)
    return out


def _model_input(batch: Any) -> Any:
    if isinstance(batch, dict):
        return batch.get("input_ids", next(iter(batch.values())))
    if isinstance(batch, (tuple, list)):
        return batch[0]
    return batch


class OutlierCensus(Callback):
    """Track activation / weight / attention outliers of any model over training.

    Args:
        every_n_steps: Census period in optimiser steps.
        k: Outlier thresholds, multiples of the mean |h| (paper: 1000).
        activation_pattern: Regex on ``pl_module.named_modules()`` names whose outputs are censused.
        weight_pattern: Regex on module names whose weights are censused.
        probe_batches: Training batches kept as the fixed probe (concatenated).
        plot: Write ``outlier_census.png`` at the end of fit.
        capture: Census the matched modules' ``output`` (default) or ``input`` (see :func:`run_census`).

    Attributes:
        history: All rows recorded so far, each with its ``step``.
    """

    def __init__(
        self,
        every_n_steps: int = 100,
        k: Sequence[float] = (1000.0, 100.0),
        activation_pattern: str = r"^(net\.)?blocks\.\d+$",
        weight_pattern: str = r"(o_proj|down_proj)$",
        probe_batches: int = 1,
        plot: bool = True,
        capture: str = "output",
    ) -> None:
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ConfigError(f"callbacks.outlier_census.every_n_steps={every_n_steps!r} must be a positive int")
        if not isinstance(probe_batches, int) or probe_batches < 1:
            raise ConfigError(f"callbacks.outlier_census.probe_batches={probe_batches!r} must be a positive int")
        if not k or any(not float(x) > 0 for x in k):
            raise ConfigError(f"callbacks.outlier_census.k={k!r} must be a non-empty list of positive numbers")
        for key, pat in (("activation_pattern", activation_pattern), ("weight_pattern", weight_pattern)):
            try:
                re.compile(pat)
            except re.error as err:
                raise ConfigError(f"callbacks.outlier_census.{key}={pat!r} is not a valid regex ({err})") from None
        if capture not in CAPTURES:
            raise ConfigError(f"callbacks.outlier_census.capture={capture!r} must be one of {list(CAPTURES)}")
        self.every_n_steps, self.k, self.capture = every_n_steps, [float(x) for x in k], capture
        self.activation_pattern, self.weight_pattern = activation_pattern, weight_pattern
        self.probe_batches, self.plot = probe_batches, plot
        self.probe: list[Any] = []
        self.history: list[dict[str, Any]] = []
        self._last_step = -1

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if len(self.probe) < self.probe_batches:
            x = _model_input(batch)
            self.probe.append(x.detach().clone() if isinstance(x, torch.Tensor) else x)
        if trainer.global_step == 0 and self._last_step < 0 and len(self.probe) == self.probe_batches:
            self._census(trainer, pl_module)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, i: int):
        if trainer.global_step % self.every_n_steps == 0 and trainer.global_step != self._last_step:
            self._census(trainer, pl_module)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_step != self._last_step and self.probe:
            self._census(trainer, pl_module, log=False)
        if trainer.is_global_zero and self.history:
            self._write(trainer)

    def _census(self, trainer: Trainer, pl_module: LightningModule, log: bool = True) -> None:
        x = torch.cat(self.probe) if isinstance(self.probe[0], torch.Tensor) else self.probe[0]
        x = x.to(pl_module.device) if isinstance(x, torch.Tensor) else x
        was_training = pl_module.training
        pl_module.eval()
        try:
            rows = run_census(
                pl_module,
                lambda: pl_module(x),
                self.activation_pattern,
                self.weight_pattern,
                self.k,
                capture=self.capture,
            )
        finally:
            pl_module.train(was_training)
        self._last_step = trainer.global_step
        for r in rows:
            r["step"] = trainer.global_step
        self.history.extend(rows)
        if log:
            for key, v in summarize(rows).items():
                pl_module.log(key, v, on_step=True, on_epoch=False)

    def state_dict(self) -> dict[str, Any]:
        """The fixed probe batch, every census row so far and the step of the last census, so that a resumed run
        censuses the same inputs (its first batches after the resume are other batches) and writes one history."""
        return {"probe": list(self.probe), "history": [dict(r) for r in self.history], "last_step": self._last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.probe = list(state_dict.get("probe", []))
        self.history = [dict(r) for r in state_dict.get("history", [])]
        self._last_step = int(state_dict.get("last_step", -1))

    def _folder(self, trainer: Trainer) -> Path:
        return Path(trainer.log_dir or trainer.default_root_dir)

    def _write(self, trainer: Trainer) -> None:
        folder = self._folder(trainer)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "outlier_census.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["step", "kind", "name", "metric", "value"])
            w.writeheader()
            w.writerows(self.history)
        if self.plot:
            plot_history(self.history, folder / "outlier_census.png")


def plot_history(history: list[dict[str, Any]], path: Path) -> None:
    """Activation top1/median per layer, weight ratio and sink share against the training step (one PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("act", "ratio", "activation top1 / median"), ("weight", "ratio", "weight max / median")]
    panels.append(("attn", "sink_share", "attention share on token 0"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    for ax, (kind, metric, title) in zip(axes, panels):
        names = sorted({r["name"] for r in history if r["kind"] == kind and r["metric"] == metric})
        for n in names:
            pts = [
                (r["step"], r["value"])
                for r in history
                if r["kind"] == kind and r["metric"] == metric and r["name"] == n
            ]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=n)
        ax.set_title(title)
        ax.set_xlabel("step")
        if names and len(names) <= 8:
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
