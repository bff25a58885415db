"""Per-step x0-prediction quality along the sampler's trajectory, for any diffusion module of the suite (ADDP's
insight 1: which denoising steps contribute to the final quality, and whether quality drops at late steps).

Contract: the module has ``x0_quality_curve(batch) -> {metric: Tensor [K + 1]}``: the quality of the prediction
before the first denoiser call (step 0) and after each call of its sampler, on one batch.
:class:`lightning_modules._shared.diffusion.DiffusionLitModule` measures the distance of each step's x0-prediction to
the final sample (``mse_to_final``); :class:`lightning_modules.addp.AddpLitModule` scores it against the ground truth
(AbsRel / delta1 for depth, IoU for masks).

At the end of the test epoch the callback logs ``test/curve/<metric>/step<k>`` (the mean over the first
``n_batches`` test batches), ``test/curve/<metric>/best_step`` and, when ``plot``, writes ``x0_quality.json`` and
``x0_quality.png`` into the run folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from core.errors import ConfigError
from core.rng import fixed_draws
from core.smoke import smoke_test

LOWER_IS_BETTER = ("absrel", "rmse", "mse_to_final")


class X0QualityCurve(Callback):
    """Measure the per-step x0 quality curve on the test split (see the module docstring).

    Args:
        n_batches: Test batches measured.
        plot: Write the JSON and PNG into the run folder.
    """

    def __init__(self, n_batches: int = 2, plot: bool = True) -> None:
        if n_batches < 1:
            raise ConfigError(f"callbacks.x0_quality.n_batches={n_batches} must be >= 1")
        self.n_batches, self.plot = n_batches, plot
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not hasattr(pl_module, "x0_quality_curve"):
            raise ConfigError(
                f"callbacks.x0_quality needs a module with x0_quality_curve(batch); {type(pl_module).__name__} has none"
            )
        self.sums, self.count = {}, 0

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # noqa: E501
        if self.count >= self.n_batches:
            return
        if smoke_test(trainer) and isinstance(batch, dict):  # debug modes: 8 items (a curve is K sampler calls)
            batch = {k: v[:8] for k, v in batch.items()}
        # seeded draws (restored afterwards): every run's curve is measured from the same sampler noise
        with torch.inference_mode(False), torch.no_grad(), fixed_draws(batch_idx, getattr(pl_module, "device", None)):
            curve = pl_module.x0_quality_curve(batch)
        for k, v in curve.items():
            self.sums[k] = self.sums.get(k, 0) + v.double().cpu()
        self.count += 1

    def curves(self) -> dict[str, list[float]]:
        """{metric: mean curve [K + 1]} measured so far."""
        return {k: (v / max(self.count, 1)).tolist() for k, v in self.sums.items()}

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        curves = self.curves()
        for name, vals in curves.items():
            for k, v in enumerate(vals):
                pl_module.log(f"test/curve/{name}/step{k}", float(v))
            sign = -1 if name in LOWER_IS_BETTER else 1
            best = max(range(1, len(vals)), key=lambda k: sign * vals[k]) if len(vals) > 1 else 0
            pl_module.log(f"test/curve/{name}/best_step", float(best))
        out = Path(trainer.log_dir or trainer.default_root_dir) if self.plot and trainer.is_global_zero else None
        if out is None or not curves:
            return
        out.mkdir(parents=True, exist_ok=True)
        (out / "x0_quality.json").write_text(json.dumps(curves, indent=1))
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(curves), figsize=(4 * len(curves), 3), squeeze=False)
        for ax, (name, vals) in zip(axes[0], curves.items()):
            ax.plot(range(len(vals)), vals, marker="o")
            ax.set_xlabel("denoising step (0 = before the first)")
            ax.set_ylabel(name)
        fig.tight_layout()
        fig.savefig(out / "x0_quality.png", dpi=80)
        plt.close(fig)
