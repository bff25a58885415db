"""TS-LIF forecasting system (Feng et al., ICLR 2025): spiking backbone + neuron chosen by config, MSE loss,
R^2 / RSE (and MAE/MSE) through torchmetrics, and the paper's missing-data mode.

* ``backbone``: ``gru`` (the paper's spiking GRU-cell encoder, ``ITSSNNGRU2D``), ``tcn`` (spiking TCN) or
  ``gru_ref`` (non-spiking ``nn.GRU`` reference; ignores ``neuron``).
* ``neuron``: ``ts_lif`` (the method), ``lif`` and ``tc_lif`` (baselines); ablations ``somatic_injection=false``
  (``d3 = 0``) and ``dendritic_spike=false`` (no ``s_d``).
* Missing data (the paper's ``introduce_missing_values``): each input entry is zeroed with probability
  ``missing_ratio`` in every stage (train, val, test; evaluation masks are seeded per batch so they repeat).
  ``test_missing_ratios`` additionally evaluates the trained model at other ratios, logged as
  ``test/r2_miss30`` (ratio 0.3) etc. Zeroing happens on the z-scored inputs, before instance normalisation.
* Metrics are computed on the z-scored scale of the data module over all ``(sample, step, variate)`` entries:
  ``R^2 = 1 - SSE / SST`` and ``RSE = sqrt(SSE) / sqrt(SST)`` (torchmetrics ``R2Score`` and
  ``RelativeSquaredError(squared=False)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
import torchmetrics
from torch import nn

from core.errors import ConfigError
from layers.spiking.backbones import Forecaster, GRUReferenceBackbone, SpikingGRUBackbone, SpikingTCNBackbone
from layers.spiking.neurons import NEURONS, TCLIFNeuron, TSLIFNeuron, make_neuron
from layers.spiking.stability import frequency_response, spectral_radius, system_matrix
from lightning_modules._base import OptimizerFactory, SchedulerFactory, SuiteLitModule

BACKBONES = ("gru", "tcn", "gru_ref")


def forecast_metrics(stage: str, suffix: str = "") -> torchmetrics.MetricCollection:
    """R^2, RSE, MAE, MSE with keys ``<stage>/<name><suffix>``."""
    return torchmetrics.MetricCollection(
        {
            f"r2{suffix}": torchmetrics.R2Score(),
            f"rse{suffix}": torchmetrics.RelativeSquaredError(squared=False),
            f"mae{suffix}": torchmetrics.MeanAbsoluteError(),
            f"mse{suffix}": torchmetrics.MeanSquaredError(),
        },
        prefix=f"{stage}/",
    )


def missing_suffix(ratio: float) -> str:
    """Metric-name suffix of a test-time missing ratio: ``0.3 -> "_miss30"`` (percent)."""
    return f"_miss{round(ratio * 100)}"


def introduce_missing_values(x: torch.Tensor, ratio: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Zero each entry of ``x`` independently with probability ``ratio`` (any shape; the paper's missing mode)."""
    if ratio <= 0:
        return x
    keep = torch.rand(x.shape, generator=generator, device="cpu").to(x.device) >= ratio
    return x * keep.to(x.dtype)


class TSLIFLitModule(SuiteLitModule):
    """Forecasting with a spiking backbone; the neuron is chosen by config.

    Args:
        backbone: ``gru``, ``tcn`` or ``gru_ref`` (see module docstring).
        neuron: ``ts_lif``, ``lif`` or ``tc_lif``.
        hidden: Channels ``H`` (paper: 128).
        horizon: Forecast length; must equal the data module's ``horizon``.
        num_steps: Repeats of the TCN input (rate coding; paper: 4). tcn_levels / tcn_kernel: TCN depth and kernel.
        theta: Firing threshold. surrogate_alpha: ATan sharpness (paper: 2).
        somatic_injection, dendritic_spike: TS-LIF ablation switches.
        instance_norm: Per-window normalisation of each variate (Eq. (14)).
        missing_ratio: Probability that an input entry is zeroed (train and evaluation).
        test_missing_ratios: Extra test-time ratios, each logged with suffix ``_miss<percent>``.
        optimizer, scheduler, scheduler_interval, monitor: see :class:`SuiteLitModule`.
    """

    def __init__(
        self,
        backbone: str = "gru",
        neuron: str = "ts_lif",
        hidden: int = 128,
        horizon: int = 6,
        num_steps: int = 4,
        tcn_levels: int = 2,
        tcn_kernel: int = 3,
        theta: float = 1.0,
        surrogate_alpha: float = 2.0,
        somatic_injection: bool = True,
        dendritic_spike: bool = True,
        instance_norm: bool = True,
        missing_ratio: float = 0.0,
        test_missing_ratios: Sequence[float] = (),
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "step",
        monitor: str = "val/loss",
    ) -> None:
        super().__init__(optimizer, scheduler, scheduler_interval, monitor)
        if backbone not in BACKBONES:
            raise ConfigError(f"model.backbone={backbone!r} must be one of {list(BACKBONES)}")
        if neuron not in NEURONS:
            raise ConfigError(f"model.neuron={neuron!r} must be one of {list(NEURONS)}")
        if hidden < 1 or horizon < 1:
            raise ConfigError(f"model.hidden={hidden} and model.horizon={horizon} must be >= 1")
        test_missing_ratios = [float(r) for r in test_missing_ratios]
        for key, r in [("missing_ratio", missing_ratio)] + [("test_missing_ratios", r) for r in test_missing_ratios]:
            if not 0.0 <= r < 1.0:
                raise ConfigError(f"model.{key} has {r}; a missing ratio must be in [0, 1)")
        if neuron != "ts_lif" and not (somatic_injection and dendritic_spike):
            raise ConfigError(
                f"model.somatic_injection/dendritic_spike ablations apply to neuron=ts_lif only, not {neuron!r}"
            )
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        factory = partial(make_neuron, neuron, hidden, theta, surrogate_alpha, somatic_injection, dendritic_spike)
        if backbone == "gru":
            net: nn.Module = SpikingGRUBackbone(hidden, factory(), theta=theta, alpha=surrogate_alpha)
        elif backbone == "tcn":
            net = SpikingTCNBackbone(hidden, factory, num_steps, tcn_levels, tcn_kernel, theta, surrogate_alpha)
        else:
            net = GRUReferenceBackbone(hidden)
        self.net = Forecaster(net, hidden, horizon, instance_norm)
        self.horizon, self.missing_ratio = horizon, float(missing_ratio)
        self.test_missing_ratios = test_missing_ratios
        self.loss_fn = nn.MSELoss()
        self.train_metrics = forecast_metrics("train")
        self.val_metrics = forecast_metrics("val")
        self.test_metrics = forecast_metrics("test")
        self.test_missing_metrics = nn.ModuleList(
            forecast_metrics("test", missing_suffix(r)) for r in test_missing_ratios
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, L, C] -> forecast [B, horizon, C]``."""
        return self.net(x)

    def _mask(self, x: torch.Tensor, ratio: float, stage: str, batch_idx: int) -> torch.Tensor:
        if ratio <= 0:
            return x
        gen = None if stage == "train" else torch.Generator().manual_seed(10_007 * batch_idx + int(ratio * 1000))
        return introduce_missing_values(x, ratio, gen)

    def _step(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if y.shape[1] != self.horizon:
            raise ConfigError(f"model.horizon={self.horizon} but the data gives horizon {y.shape[1]}: set both equal")
        pred = self(self._mask(x, self.missing_ratio, stage, batch_idx))
        loss = self.loss_fn(pred, y)
        metrics = getattr(self, f"{stage}_metrics")
        metrics.update(pred.detach().flatten(), y.flatten())
        self.log(f"{stage}/loss", loss, prog_bar=stage != "test", batch_size=len(x))
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=len(x))
        if stage == "test":
            for r, m in zip(self.test_missing_ratios, self.test_missing_metrics):
                with torch.no_grad():
                    m.update(self(self._mask(x, r, stage, batch_idx)).flatten(), y.flatten())
                self.log_dict(m, on_step=False, on_epoch=True, batch_size=len(x))
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train", batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val", batch_idx)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "test", batch_idx)

    def on_test_epoch_end(self) -> None:
        """Log the learned two-compartment coefficients and their stability/frequency summary (Eqs. (11)-(13))."""
        for name, value in neuron_summary(self.net).items():
            self.log(f"neuron/{name}", value)


def _two_compartment(net: nn.Module) -> nn.Module | None:
    for m in net.modules():
        if isinstance(m, TSLIFNeuron | TCLIFNeuron):
            return m
    return None


def neuron_summary(net: nn.Module) -> dict[str, float]:
    """Coefficients, spectral radius and gains at omega = 0, pi/8, pi/2, pi of the first two-compartment neuron."""
    neuron = _two_compartment(net)
    if neuron is None:
        return {}
    with torch.no_grad():
        c = {k: v.detach().double().cpu() for k, v in neuron.coefficients().items()}
        a, b = system_matrix(c["d"], c["kappa"], c["gamma_ds"])
        omegas = {"0": 0.0, "pi8": torch.pi / 8, "pi2": torch.pi / 2, "pi": torch.pi}
        h_d, h_s = frequency_response(a, b, torch.tensor(list(omegas.values()), dtype=torch.float64))
    out = {f"d{i}": float(c["d"][i]) for i in range(4)}
    out.update(kappa=float(c["kappa"]), gamma_ds=float(c["gamma_ds"]), spectral_radius=float(spectral_radius(a)))
    for i, key in enumerate(omegas):
        out[f"gain_dend_{key}"] = float(h_d[i].abs())
        out[f"gain_soma_{key}"] = float(h_s[i].abs())
    return out
