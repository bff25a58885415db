"""``LiceLitModule``: the ReLU MLP classifier and, at test time, LiCE counterfactuals against its baselines.

Fit trains the classifier (``[20, 10]`` ReLU MLP, AdamW, BCE-with-logits, as in the paper's experiments) on the
one-hot encoding of :class:`datamodules.tabular.TabularDataModule`. Test reports the classifier's metrics, then
learns a LearnSPN on the training table plus label, and for ``num_counterfactuals`` test rows (target class = the
opposite of the prediction) runs each method in ``methods``:

* ``mio``: the MIO without the SPN (distance only);
* ``lice_threshold``: LiCE with the constraint ``SPN(x', y') >= tau`` (``tau`` = median training LL by default);
* ``lice_optimize``: LiCE minimising ``distance - alpha * SPN(x', y')`` (``alpha = 0.1``);
* ``dice``: the DiCE-style random search (:mod:`lightning_modules.lice.dice`).

Per method it logs ``test/<method>/{found,valid,spn_ll,distance,sparsity,seconds,plausible,timeouts}`` (means over
valid counterfactuals; ``seconds`` is the median) and, on data with a known density, ``true_ll``; LiCE variants also
log ``mio_gap`` (exact SPN LL minus the MIO's max-approximated root). Every counterfactual is written to
``<run dir>/counterfactuals.json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from core.errors import ConfigError
from core.smoke import smoke_test
from lightning_modules._base import OptimizerFactory, SchedulerFactory, SuiteLitModule, classification_metrics
from lightning_modules.lice.dice import DiceRandomSearch
from lightning_modules.lice.mio import (
    BACKENDS,
    CounterfactualResult,
    LiceMIO,
    distance,
    feature_costs,
    mlp_forward,
    sparsity,
)
from lightning_modules.lice.spn import SPN, LearnSPN

METHODS = ("mio", "lice_threshold", "lice_optimize", "dice")


def relu_mlp(input_dim: int, hidden_sizes: Sequence[int]) -> nn.Sequential:
    """``Linear -> ReLU -> ... -> Linear(1)``: the classifier the MIO encodes exactly."""
    layers: list[nn.Module] = []
    prev = input_dim
    for h in hidden_sizes:
        layers += [nn.Linear(prev, h), nn.ReLU()]
        prev = h
    layers.append(nn.Linear(prev, 1))
    return nn.Sequential(*layers)


class LiceLitModule(SuiteLitModule):
    """Classifier + counterfactual evaluation (see the module docstring).

    Args:
        optimizer: Partial optimiser (AdamW in the paper).
        scheduler: Optional partial scheduler.
        hidden_sizes: Hidden widths of the ReLU MLP.
        methods: Counterfactual methods run at test time (subset of ``mio``, ``lice_threshold``, ``lice_optimize``,
            ``dice``).
        num_counterfactuals: Test rows explained.
        time_limit: Solver time limit per counterfactual (seconds).
        alpha: SPN weight of ``lice_optimize``.
        threshold: ``median`` / ``quartile`` of the training log-likelihoods, or a number (``lice_threshold``).
        spn_bins: Histogram bins of the SPN's continuous leaves.
        spn_min_instances: LearnSPN's ``min_instances_slice``.
        spn_max_depth: LearnSPN depth limit.
        spn_alpha: Significance level of LearnSPN's independence tests.
        spn_max_rows: Training rows the SPN is learned on (seeded subset).
        mad_floor: Floor of the MAD in the inverse-MAD costs.
        bin_gap: Upper-bin gap of the MIO's histogram leaves (normalised units; official 1e-6, see ``LiceMIO``).
        warm_start: Start LiCE-optimise from the plain MIO's counterfactual (a MIP start; the official code has none).
        mio_backend: ``highspy`` (the plain MIO as a matrix passed to HiGHS directly) or ``pyomo`` (the Pyomo model
            translated by ``appsi_highs``, the naive twin); same MIO (``LiceMIO``, benchmarks/lice_mio_speed.py).
        dice_samples: Candidates of the DiCE-style search.
        fast_dev_counterfactuals: Rows explained in a smoke test (``fast_dev_run`` or any ``debug=`` mode).
        fast_dev_time_limit: Solver limit in a smoke test.
        seed: Seed of the factual choice, the SPN clustering and the DiCE sampler.
    """

    def __init__(
        self,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        hidden_sizes: Sequence[int] = (20, 10),
        methods: Sequence[str] = METHODS,
        num_counterfactuals: int = 20,
        time_limit: float = 60.0,
        alpha: float = 0.1,
        threshold: str | float = "median",
        spn_bins: int = 10,
        spn_min_instances: int = 200,
        spn_max_depth: int = 4,
        spn_alpha: float = 0.001,
        spn_max_rows: int = 5000,
        mad_floor: float = 1e-4,
        bin_gap: float = 1e-6,
        warm_start: bool = True,
        mio_backend: str = "highspy",
        dice_samples: int = 2000,
        fast_dev_counterfactuals: int = 1,
        fast_dev_time_limit: float = 5.0,
        seed: int = 0,
    ) -> None:
        super().__init__(optimizer, scheduler)
        bad = [m for m in methods if m not in METHODS]
        if bad or not methods:
            raise ConfigError(f"model.methods={list(methods)} must be a non-empty subset of {list(METHODS)}")
        if not hidden_sizes or min(hidden_sizes) < 1:
            raise ConfigError(f"model.hidden_sizes={list(hidden_sizes)} must be non-empty positive widths")
        if num_counterfactuals < 0:
            raise ConfigError(f"model.num_counterfactuals={num_counterfactuals} must be >= 0")
        if time_limit <= 0 or fast_dev_time_limit <= 0:
            raise ConfigError(f"model.time_limit={time_limit} and fast_dev_time_limit must be > 0")
        if alpha < 0:
            raise ConfigError(f"model.alpha={alpha} must be >= 0")
        if not (isinstance(threshold, (int, float)) or threshold in ("median", "quartile")):
            raise ConfigError(f"model.threshold={threshold!r} must be 'median', 'quartile' or a number")
        if spn_max_rows < 10:
            raise ConfigError(f"model.spn_max_rows={spn_max_rows} must be >= 10")
        if mad_floor <= 0:
            raise ConfigError(f"model.mad_floor={mad_floor} must be > 0")
        if not 0 < bin_gap < 0.5:
            raise ConfigError(f"model.bin_gap={bin_gap} must be in (0, 0.5) (normalised units)")
        if mio_backend not in BACKENDS:
            raise ConfigError(f"model.mio_backend={mio_backend!r} must be one of {list(BACKENDS)}")
        # Fail on bad SPN settings now rather than at test time.
        LearnSPN(["binary"], [2], spn_bins, spn_min_instances, spn_max_depth, spn_alpha)
        # plain Python values only (Hydra passes ListConfig, which a weights_only checkpoint load rejects)
        self.save_hyperparameters(
            {
                "hidden_sizes": [int(h) for h in hidden_sizes],
                "methods": [str(m) for m in methods],
                "num_counterfactuals": int(num_counterfactuals),
                "time_limit": float(time_limit),
                "alpha": float(alpha),
                "threshold": threshold if isinstance(threshold, str) else float(threshold),
                "spn_bins": int(spn_bins),
                "spn_min_instances": int(spn_min_instances),
                "spn_max_depth": int(spn_max_depth),
                "spn_alpha": float(spn_alpha),
                "spn_max_rows": int(spn_max_rows),
                "mad_floor": float(mad_floor),
                "bin_gap": float(bin_gap),
                "warm_start": bool(warm_start),
                "mio_backend": str(mio_backend),
                "dice_samples": int(dice_samples),
                "seed": int(seed),
            }
        )
        self.hidden_sizes, self.methods = list(hidden_sizes), list(methods)
        self.num_counterfactuals, self.time_limit, self.alpha, self.threshold = (
            num_counterfactuals,
            time_limit,
            alpha,
            threshold,
        )
        self.spn_kwargs = {
            "n_bins": spn_bins,
            "min_instances_slice": spn_min_instances,
            "max_depth": spn_max_depth,
            "alpha": spn_alpha,
            "seed": seed,
        }
        self.spn_max_rows, self.mad_floor, self.dice_samples = spn_max_rows, mad_floor, dice_samples
        self.bin_gap, self.warm_start, self.mio_backend = bin_gap, bool(warm_start), str(mio_backend)
        self.fast_dev_counterfactuals, self.fast_dev_time_limit, self.seed = (
            fast_dev_counterfactuals,
            fast_dev_time_limit,
            seed,
        )
        self.net: nn.Sequential | None = None
        self.train_metrics = classification_metrics(2, "train")
        self.val_metrics = classification_metrics(2, "val")
        self.test_metrics = classification_metrics(2, "test")
        self.records: list[dict[str, Any]] = []
        self.spn: SPN | None = None

    # -- classifier -------------------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if self.net is None:
            dm = self.trainer.datamodule
            if dm is None or not hasattr(dm, "features"):
                raise ConfigError("LiceLitModule needs a TabularDataModule (data=tabular)")
            dm.setup(stage)
            self.net = relu_mlp(dm.input_dim, self.hidden_sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[B]`` of inputs ``[B, D]``."""
        assert self.net is not None
        return self.net(x)[:, 0]

    def _step(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.binary_cross_entropy_with_logits(logits, y)
        metrics = getattr(self, f"{stage}_metrics")
        metrics.update(torch.sigmoid(logits), y.long())
        self.log(f"{stage}/loss", loss, prog_bar=stage == "train", batch_size=len(y))
        self.log_dict(metrics, batch_size=len(y))
        return loss

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def mlp_layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The classifier as ``[(W [out, in], b [out]), ...]`` in float64 (what the MIO encodes)."""
        assert self.net is not None
        return [
            (m.weight.detach().double().cpu().numpy(), m.bias.detach().double().cpu().numpy())
            for m in self.net
            if isinstance(m, nn.Linear)
        ]

    # -- counterfactuals --------------------------------------------------------------------------------------------
    def on_test_epoch_end(self) -> None:
        dm = self.trainer.datamodule
        fast = smoke_test(self.trainer)
        n = min(self.num_counterfactuals, self.fast_dev_counterfactuals) if fast else self.num_counterfactuals
        if n == 0:
            return
        summary = self.explain(dm, n, self.fast_dev_time_limit if fast else self.time_limit, 500 if fast else None)
        for key, value in summary.items():
            self.log(key, value)
        out_dir = Path(self.trainer.default_root_dir or ".")
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "counterfactuals.json").write_text(json.dumps(self.records, indent=1))

    def fit_spn(self, features: Sequence[Any], table: np.ndarray, labels: np.ndarray, max_rows: int) -> SPN:
        """LearnSPN over ``(x, y)`` on at most ``max_rows`` seeded training rows."""
        data = np.concatenate([table, labels[:, None]], axis=1)
        if len(data) > max_rows:
            data = data[np.random.default_rng(self.seed).permutation(len(data))[:max_rows]]
        kinds = [f.kind for f in features] + ["binary"]
        cats = [f.n_categories for f in features] + [2]
        self.spn_data = data
        return LearnSPN(kinds, cats, **self.spn_kwargs).fit(data)

    def resolve_threshold(self, spn: SPN, data: np.ndarray) -> float:
        if isinstance(self.threshold, (int, float)):
            return float(self.threshold)
        lls = spn.log_likelihood(data)
        return float(np.median(lls) if self.threshold == "median" else np.quantile(lls, 0.25))

    def explain(self, dm: Any, n: int, time_limit: float, spn_rows: int | None = None) -> dict[str, float]:
        """Counterfactuals for ``n`` test rows with every method; returns the ``test/<method>/<metric>`` summary."""
        features = dm.features
        train, labels = dm.tables["train"], dm.labels["train"]
        spn = self.fit_spn(features, train, labels, min(self.spn_max_rows, spn_rows or self.spn_max_rows))
        self.spn = spn
        tau = self.resolve_threshold(spn, self.spn_data)
        costs = feature_costs(features, train, self.mad_floor)
        layers = self.mlp_layers()

        def logit(rows: np.ndarray) -> np.ndarray:
            return mlp_forward(layers, dm.encode(np.atleast_2d(rows)))

        common = {"time_limit": time_limit, "bin_gap": self.bin_gap, "alpha": self.alpha, "threshold": tau}
        solvers: dict[str, Any] = {
            "mio": LiceMIO(features, layers, costs, None, "mio", backend=self.mio_backend, **common),
            "lice_threshold": LiceMIO(features, layers, costs, spn, "threshold", **common),
            "lice_optimize": LiceMIO(features, layers, costs, spn, "optimize", **common),
            "dice": DiceRandomSearch(features, logit, costs, self.dice_samples, seed=self.seed),
        }
        test = dm.tables["test"]
        rows = np.sort(np.random.default_rng(self.seed).permutation(len(test))[: min(n, len(test))])
        self.records = []
        for r in rows:
            x0 = test[r]
            desired = int(logit(x0)[0] < 0)
            mio_res = None  # the plain MIO's CE is LiCE-optimise's MIP start (model.warm_start, LiceMIO.generate)
            for name in self.methods:
                if name == "lice_optimize" and self.warm_start:
                    extra = 0.0
                    if mio_res is None:  # "mio" not among the methods: solve it here, its time counts for LiCE
                        mio_res = solvers["mio"].generate(x0, desired)
                        extra = mio_res.seconds
                    res = solvers[name].generate(x0, desired, mio_res.x)
                    res.seconds += extra
                else:
                    res = solvers[name].generate(x0, desired)
                if name == "mio":
                    mio_res = res
                self.records.append(self._record(int(r), name, x0, desired, res, spn, costs, logit, dm, features))
        summary = summarise(self.records, self.methods, tau)
        summary["test/spn_nodes"] = float(len(spn))
        summary["test/threshold"] = tau
        return summary

    def _record(
        self,
        row: int,
        method: str,
        x0: np.ndarray,
        desired: int,
        res: CounterfactualResult,
        spn: SPN,
        costs: np.ndarray,
        logit: Any,
        dm: Any,
        features: Sequence[Any],
    ) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "row": row,
            "method": method,
            "desired": desired,
            "status": res.status,
            "seconds": res.seconds,
            "found": res.found,
        }
        if res.x is None:
            return rec
        z = np.r_[res.x, desired][None]
        sign = 1.0 if desired == 1 else -1.0
        rec.update(
            x=res.x.tolist(),
            valid=bool(sign * logit(res.x)[0] > 0),
            spn_ll=float(spn.log_likelihood(z)[0]),
            spn_max=float(spn.max_approx(z)[0]),
            distance=distance(x0, res.x, features, costs),
            sparsity=sparsity(x0, res.x, features),
        )
        if res.spn_value is not None:
            rec["mio_value"] = res.spn_value
        if getattr(dm, "true_log_density", None) is not None:
            rec["true_ll"] = float(dm.true_log_density(res.x[None])[0])
            rec["factual_true_ll"] = float(dm.true_log_density(x0[None])[0])
        return rec


def summarise(records: list[dict[str, Any]], methods: Sequence[str], tau: float) -> dict[str, float]:
    """Per-method means over valid counterfactuals (``seconds``: median over all attempts)."""
    out: dict[str, float] = {}
    for m in methods:
        recs = [r for r in records if r["method"] == m]
        valid = [r for r in recs if r.get("valid")]
        out[f"test/{m}/found"] = float(np.mean([r["found"] for r in recs])) if recs else 0.0
        out[f"test/{m}/valid"] = len(valid) / len(recs) if recs else 0.0
        out[f"test/{m}/timeouts"] = float(sum(r["status"].startswith("time_limit") for r in recs))
        out[f"test/{m}/seconds"] = float(np.median([r["seconds"] for r in recs])) if recs else 0.0
        if not valid:
            continue
        for key in ("spn_ll", "distance", "sparsity", "true_ll"):
            if key in valid[0]:
                out[f"test/{m}/{key}"] = float(np.mean([r[key] for r in valid]))
        out[f"test/{m}/plausible"] = float(np.mean([r["spn_ll"] >= tau for r in valid]))
        gaps = [r["spn_ll"] - r["mio_value"] for r in valid if "mio_value" in r]
        if gaps and m == "lice_optimize":
            out[f"test/{m}/mio_gap"] = float(np.mean(gaps))
    return out
