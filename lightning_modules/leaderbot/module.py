"""``LeaderbotLitModule``: full-batch maximum likelihood of the paper's ranking models, and the Elo baseline.

Ameli, Zhuang, Stoica, Mahoney, "A Statistical Framework for Ranking LLM-Based Chatbots", ICLR 2025.

* ``kind`` = ``bradley_terry`` | ``rao_kupper`` | ``davidson`` with ``k_cov`` (Thurstonian covariance: ``None``,
  diagonal ``0``, diagonal + rank-k) and ``k_tie`` (tie threshold: scalar ``0`` or factored rank-k), see
  :mod:`lightning_modules.leaderbot.likelihoods`. ``bradley_terry`` with ``k_cov=None`` is the Arena's own
  method (plain Bradley-Terry); ``kind=elo`` is the online Elo baseline (no gradients).
* Fitting: manual optimisation, ONE batch = all training pairs; each ``training_step`` is one optimiser step of
  up to ``max_iter`` iterations, so ``max_epochs`` bounds the total number of iterations. ``optimizer=newton``
  (default): damped Newton with the exact Hessian (:mod:`~lightning_modules.leaderbot.newton`), which reaches the
  minimum to machine precision in a few tens of iterations; ``optimizer=lbfgs``: torch L-BFGS with a strong-Wolfe
  line search. The run stops as soon as a step reports convergence (gradient or loss change below tolerance).
  The optimiser's state (L-BFGS memory, Newton damping) lives in the optimizer, so checkpoints resume exactly.
  The package fits with scipy BFGS instead (same objective: mean NLL + identifiability penalties).
* ``val/*``: goodness of fit on the training pairs (NLL, AIC, BIC, MAE, KLD, JSD); ``test/*``: the same on the
  held-out pairs (generalisation). At the end of the run the leaderboard (score, standard error from the observed
  Fisher information) and PNG plots are written into the run folder and logged to wandb when present.

Single process only: the problem is a few hundred parameters on a few thousand pairs; a data-parallel run
raises :class:`~core.errors.ConfigError`.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import torch

from core.errors import ConfigError
from core.smoke import smoke_test
from core.typecheck import check_kwargs
from lightning_modules._base import SuiteLitModule
from lightning_modules.leaderbot import elo as elo_lib
from lightning_modules.leaderbot import likelihoods as lk
from lightning_modules.leaderbot import plots as leaderboard_plots
from lightning_modules.leaderbot.fit import lbfgs_converged
from lightning_modules.leaderbot.metrics import PairOutcomeMetrics, information_criteria
from lightning_modules.leaderbot.newton import DampedNewton

log = logging.getLogger(__name__)
ALL_KINDS = (*lk.KINDS, "elo")
SOLVERS = ("newton", "lbfgs")
#: Settings of the two named solvers (``model.newton`` / ``model.lbfgs`` override them key by key).
NEWTON_DEFAULTS: dict[str, Any] = dict(max_iter=5, tolerance_grad=1e-10, tolerance_change=1e-15, damping=1.0, lr=1.0)
LBFGS_DEFAULTS: dict[str, Any] = dict(
    lr=1.0,
    max_iter=20,
    max_eval=40,
    history_size=50,
    tolerance_grad=1e-10,
    tolerance_change=1e-14,
    line_search_fn="strong_wolfe",
)


class LeaderbotLitModule(SuiteLitModule):
    """Paired-comparison ranking model fitted full batch.

    Args:
        kind: ``bradley_terry``, ``rao_kupper``, ``davidson`` or ``elo``.
        k_cov: Covariance structure: ``None`` (none), ``0`` (diagonal), ``k`` (diagonal + rank k).
        k_tie: Tie model: ``0`` (scalar threshold) or rank of the factored tie model (0 for Bradley-Terry).
        constraint: Add the identifiability penalties to the objective (the paper's constraints).
        optimizer: ``newton`` (default: damped Newton, exact Hessian), ``lbfgs`` (torch L-BFGS, strong Wolfe) or a
            partial of a ``torch.optim`` optimiser (stepped with a closure).
        newton: Overrides of :data:`NEWTON_DEFAULTS` (``max_iter`` = Newton iterations per training step).
        lbfgs: Overrides of :data:`LBFGS_DEFAULTS` (``max_iter`` = L-BFGS iterations per training step).
        elo_k: Elo K factor.
        elo_base: Elo base (10).
        elo_scale: Elo scale (400).
        elo_init: Initial Elo rating.
        elo_passes: Passes over the shuffled battles (one per epoch); the run stops after them.
        plots: Write PNG plots at the end of the run.
        plot_top: Competitors shown in the match-matrix and map plots.
        standard_errors: Compute standard errors from the observed Fisher information (one Hessian).
        min_improvement: L-BFGS: stop when one training step (``max_iter`` iterations) lowers the objective by less
            than this, relative (the MLE of a competitor that won or lost every game lies at infinity, so the
            gradient tolerance alone may never be met).
        precondition: Optimise ``u = w / s`` with the per-competitor vote-share scaling ``s`` of
            :func:`~lightning_modules.leaderbot.likelihoods.preconditioner` (same objective, faster L-BFGS).
    """

    def __init__(
        self,
        kind: str = "davidson",
        k_cov: int | None = 0,
        k_tie: int = 1,
        constraint: bool = True,
        optimizer: Any = "newton",
        newton: dict[str, Any] | None = None,
        lbfgs: dict[str, Any] | None = None,
        elo_k: float = 4.0,
        elo_base: float = 10.0,
        elo_scale: float = 400.0,
        elo_init: float = 1000.0,
        elo_passes: int = 1,
        plots: bool = True,
        plot_top: int = 20,
        standard_errors: bool = True,
        min_improvement: float = 1e-9,
        precondition: bool = True,
    ) -> None:
        if kind not in ALL_KINDS:
            raise ConfigError(f"model.kind={kind!r} must be one of {list(ALL_KINDS)}")
        if kind in ("bradley_terry", "elo") and k_tie != 0:
            raise ConfigError(f"model.k_tie={k_tie} must be 0 for kind={kind} (it has no tie model)")
        if kind == "elo" and k_cov is not None:
            raise ConfigError(f"model.k_cov={k_cov} must be null for kind=elo")
        if k_cov is not None and (not isinstance(k_cov, int) or k_cov < 0):
            raise ConfigError(f"model.k_cov={k_cov!r} must be null or an integer >= 0")
        if not isinstance(k_tie, int) or k_tie < 0:
            raise ConfigError(f"model.k_tie={k_tie!r} must be an integer >= 0")
        if elo_k <= 0 or elo_base <= 1 or elo_scale <= 0 or elo_passes < 1:
            raise ConfigError(
                f"model.elo_k={elo_k}, elo_base={elo_base}, elo_scale={elo_scale}, elo_passes={elo_passes} must "
                "satisfy elo_k > 0, elo_base > 1, elo_scale > 0, elo_passes >= 1"
            )
        if min_improvement < 0:
            raise ConfigError(f"model.min_improvement={min_improvement} must be >= 0")
        if plot_top < 2:
            raise ConfigError(f"model.plot_top={plot_top} must be >= 2")
        named = optimizer is None or isinstance(optimizer, str)
        if named:
            name = optimizer or "newton"
            if name not in SOLVERS:
                raise ConfigError(f"model.optimizer={name!r} must be one of {list(SOLVERS)} or a partial")
            if name == "newton":
                cls, base, extra = DampedNewton, NEWTON_DEFAULTS, newton
            else:
                cls, base, extra = torch.optim.LBFGS, LBFGS_DEFAULTS, lbfgs
            unknown = set(extra or {}) - set(base)
            if unknown:
                raise ConfigError(f"model.{name} has unknown keys {sorted(unknown)}; valid: {sorted(base)}")
            settings = {**base, **dict(extra or {})}
            # checked here, not when fit calls configure_optimizers: a mistyped or out-of-range setting
            # (`model.lr=abc`) is one line naming the key before the run starts
            check_kwargs(cls, settings, f"model.{name}")
            try:
                cls([torch.zeros(1, dtype=torch.float64, requires_grad=True)], **settings)
            except ConfigError:
                raise
            except (TypeError, ValueError) as err:
                raise ConfigError(f"model.{name}: {err}") from None
            optimizer = functools.partial(cls, **settings)
        super().__init__(optimizer=optimizer)
        self.save_hyperparameters(ignore=["optimizer"])  # a partial is not weights-only loadable
        self.kind, self.k_cov, self.k_tie, self.constraint = kind, k_cov, k_tie, constraint
        self.elo = dict(k=elo_k, base=elo_base, scale=elo_scale)
        self.elo_init, self.elo_passes = elo_init, elo_passes
        self.plots, self.plot_top, self.standard_errors = plots, plot_top, standard_errors
        self.min_improvement, self.precondition = min_improvement, precondition
        self._prev_loss = float("inf")
        self.automatic_optimization = False
        self.layout: lk.Layout | None = None
        self.model_names: list[str] = []
        self.w: torch.nn.Parameter | None = None
        has_tie = kind in ("rao_kupper", "davidson")
        self.val_metrics = PairOutcomeMetrics(has_tie)
        self.test_metrics = PairOutcomeMetrics(has_tie)
        self._eval_pairs = {"val": 0, "test": 0}
        self._artifacts_written = False

    # -- parameters -----------------------------------------------------------------------------------------------
    @property
    def score_layout(self) -> lk.Layout:
        """Layout used for predictions (Elo is scored as Bradley-Terry without covariance)."""
        assert self.layout is not None, "call build() / setup() first"
        return self.layout

    def build(self, model_names: list[str], pairs: torch.Tensor, counts: torch.Tensor) -> None:
        """Create the float64 parameters for ``m = len(model_names)`` competitors at the package's initial point."""
        m = len(model_names)
        self.model_names = list(model_names)
        if self.kind == "elo":
            self.layout = lk.Layout("bradley_terry", m, None, 0)
            self.register_buffer("ratings", torch.full((m,), float(self.elo_init), dtype=torch.float64))
            w0 = torch.zeros(m, dtype=torch.float64)
        else:
            self.layout = lk.Layout(self.kind, m, self.k_cov, self.k_tie)
            w0 = lk.initial_params(self.layout, pairs, counts)
        scale = torch.ones_like(w0)
        if self.precondition and self.kind != "elo":
            scale = lk.preconditioner(self.layout, pairs, counts)
        self.register_buffer("precond", scale)
        # The optimiser's variable: u = w / s (the model's parameters are params() = s * u).
        self.w = torch.nn.Parameter(w0 / scale, requires_grad=self.kind != "elo")
        self.register_buffer("basis", lk.dct_basis(m, self.layout.k_tie), persistent=False)

    def setup(self, stage: str) -> None:
        if self.trainer is not None and self.trainer.world_size > 1:
            raise ConfigError(
                f"leaderbot fits one full batch in a single process; trainer world size {self.trainer.world_size} "
                "is not supported (use trainer.devices=1)"
            )
        if self.w is not None:
            return
        dm = self.trainer.datamodule if self.trainer is not None else None
        if dm is None or not getattr(dm, "model_names", None):
            raise ConfigError("LeaderbotLitModule needs a datamodule with model_names (data=arena)")
        train = dm.datasets["train"]
        self.build(dm.model_names, train.pairs, train.counts)

    def params(self) -> torch.Tensor:
        """``[n_param]`` model parameters in the package's layout (``s * u``)."""
        return self.w * self.precond

    def scores_vector(self) -> torch.Tensor:
        """Flat parameter vector used for prediction (Elo: its Bradley-Terry-equivalent scores)."""
        if self.kind == "elo":
            return elo_lib.elo_to_scores(self.ratings, self.elo["base"], self.elo["scale"])
        return self.params()

    def probabilities(self, pairs: torch.Tensor) -> torch.Tensor:
        """``[n, 3]`` predicted ``[win, loss, tie]`` for ``pairs [n, 2]``."""
        return lk.probabilities(self.scores_vector(), pairs, self.score_layout, self.basis)

    def objective(self, w: torch.Tensor, pairs: torch.Tensor, counts: torch.Tensor, constraint: bool) -> torch.Tensor:
        """Mean NLL per vote of ``pairs`` (+ penalties)."""
        total = counts.sum().clamp_min(1.0)
        return lk.objective(w, pairs, counts, self.score_layout, self.basis, total, constraint)

    # -- training -------------------------------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        if self.kind == "elo":
            return None
        return self.optimizer_factory([self.w])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        pairs, counts = batch["pairs"], batch["counts"].to(torch.float64)
        if self.kind == "elo":
            self._elo_pass(pairs, counts)
            with torch.no_grad():
                loss = self.objective(self.scores_vector(), pairs, counts, False)
            self.log("train/loss", loss, prog_bar=True, batch_size=1)
            if self.current_epoch + 1 >= self.elo_passes:
                self.trainer.should_stop = True
            return
        opt = self.optimizers()
        inner = opt.optimizer
        state = inner.state[self.w]
        before = (int(state.get("n_iter", 0)), int(state.get("func_evals", 0)))

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = self.objective(self.params(), pairs, counts, self.constraint)
            self.manual_backward(loss)
            return loss

        if isinstance(inner, DampedNewton):
            opt.step(closure=closure, hessian_closure=lambda: self.hessian_u(pairs, counts))
        else:
            opt.step(closure=closure)
        iters = int(inner.state[self.w].get("n_iter", 0)) - before[0]
        evals = int(inner.state[self.w].get("func_evals", 0)) - before[1]
        with torch.enable_grad():  # stationarity at the step's end: max abs d objective / d w (w: the optimised
            # variable, scores over their preconditioner; the solvers' own test)
            loss = self.objective(self.params(), pairs, counts, self.constraint)
            (grad,) = torch.autograd.grad(loss, self.w)
        with torch.no_grad():
            nll = self.objective(self.params(), pairs, counts, False)
        loss = loss.detach()
        self.log("train/loss", loss, prog_bar=True, batch_size=1)
        self.log("train/nll", nll, batch_size=1)
        self.log("train/opt_iters", float(iters), batch_size=1)
        self.log("train/grad_max", grad.abs().max(), batch_size=1)
        stalled = self._prev_loss - float(loss) < self.min_improvement * max(1.0, abs(float(loss)))
        self._prev_loss = float(loss)
        if isinstance(inner, DampedNewton):  # its own tolerance_change is the (far tighter) stall test
            stalled = False
            converged = bool(inner.state[self.w].get("converged", False))
        else:
            converged = isinstance(inner, torch.optim.LBFGS) and lbfgs_converged(iters, evals, inner)
        if stalled or converged:
            log.info("%s converged at epoch %d (loss %.12f)", type(inner).__name__, self.current_epoch, float(loss))
            self.trainer.should_stop = True

    def hessian_u(self, pairs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Exact Hessian of the training objective with respect to the optimiser's variable ``u = w / s``:
        ``diag(s) H_w diag(s)``."""
        total = counts.sum().clamp_min(1.0)
        h = lk.hessian(self.params().detach(), pairs, counts, self.score_layout, self.basis, total, self.constraint)
        return self.precond[:, None] * h * self.precond[None, :]

    def _elo_pass(self, pairs: torch.Tensor, counts: torch.Tensor) -> None:
        a, b, s = elo_lib.expand_battles(pairs, counts, seed=int(self.trainer.datamodule.seed) + self.current_epoch)
        new = elo_lib.online_elo(self.ratings.tolist(), a, b, s, **self.elo)
        self.ratings.copy_(torch.tensor(new, dtype=torch.float64))

    # -- evaluation -----------------------------------------------------------------------------------------------
    def _eval_step(self, batch: dict[str, torch.Tensor], stage: str) -> None:
        metrics = self.val_metrics if stage == "val" else self.test_metrics
        with torch.no_grad():
            metrics.update(self.probabilities(batch["pairs"]), batch["counts"])
        self._eval_pairs[stage] += int(batch["pairs"].shape[0])

    def _eval_end(self, stage: str) -> None:
        metrics = self.val_metrics if stage == "val" else self.test_metrics
        values = {k: float(v) for k, v in metrics.compute().items()}
        n_param = self.score_layout.n_param
        values.update(information_criteria(values["nll"], n_param, self._eval_pairs[stage]))
        values["n_param"] = float(n_param)
        self.log_dict({f"{stage}/{k}": torch.tensor(v, dtype=torch.float64) for k, v in values.items()}, batch_size=1)
        metrics.reset()
        self._eval_pairs[stage] = 0

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._eval_end("val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")

    # -- leaderboard and artefacts --------------------------------------------------------------------------------
    def standard_errors_of_scores(self, pairs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Standard errors of the scores ``x`` from the observed Fisher information ``N * Hessian`` of the
        fitted objective (mean NLL + identifiability penalties, which make it invertible). ``[m]``; NaN where the
        information is singular (e.g. ``constraint=False``) or for Elo."""
        m = self.score_layout.m
        if self.kind == "elo":
            return torch.full((m,), float("nan"), dtype=torch.float64)
        w = self.params().detach().clone()
        total = counts.sum().clamp_min(1.0)

        hess = lk.hessian(w, pairs, counts, self.score_layout, self.basis, total, self.constraint) * total
        try:
            cov = torch.linalg.inv(0.5 * (hess + hess.T))
        except RuntimeError:
            return torch.full((m,), float("nan"), dtype=torch.float64)
        var = torch.diagonal(cov)[:m]
        return torch.where(var > 0, var.clamp_min(0).sqrt(), torch.full_like(var, float("nan")))

    def write_artifacts(self) -> None:
        """Leaderboard CSV and PNG plots into the run folder; images also go to any wandb logger."""
        if self._artifacts_written or self.trainer is None or not self.trainer.is_global_zero or self.w is None:
            return
        self._artifacts_written = True

        out = Path(self.trainer.default_root_dir)
        out.mkdir(parents=True, exist_ok=True)
        train = self.trainer.datamodule.datasets["train"]
        pairs, counts = train.pairs.to(self.device), train.counts.to(self.device)
        # fast_dev_run is a smoke test: the leaderboard, but no Hessian and no plots (seconds, not tens of them).
        quick = smoke_test(self.trainer)
        with torch.no_grad():
            probs = self.probabilities(pairs)
        se = self.standard_errors_of_scores(pairs, counts) if self.standard_errors and not quick else None
        x = self.scores_vector().detach()[: self.score_layout.m]
        rows = leaderboard_plots.leaderboard_rows(self.model_names, x, se, pairs, counts, probs)
        leaderboard_plots.write_leaderboard_csv(rows, out / "leaderboard.csv")
        images = []
        if self.plots and not quick:
            with torch.no_grad():
                w = self.scores_vector().detach().cpu()
            cov = None if self.kind == "elo" else lk.covariance(w, self.score_layout, centered=True)
            images = leaderboard_plots.make_plots(
                out,
                rows,
                self.model_names,
                w,
                self.score_layout,
                self.basis.cpu(),
                pairs.cpu(),
                counts.cpu(),
                cov,
                self.plot_top,
            )
        for logger in self.loggers:
            if type(logger).__name__ == "WandbLogger" and images:
                try:
                    logger.log_image(key="leaderbot", images=[str(p) for p in images], caption=[p.stem for p in images])
                except Exception as err:  # noqa: BLE001 - a logging failure must not fail the run
                    log.warning("could not log images to wandb: %s", err)

    def on_fit_end(self) -> None:
        self.write_artifacts()

    def on_test_end(self) -> None:
        # `make eval` reaches here without a fit: the standard errors need autograd, which the test loop disables.
        with torch.inference_mode(False), torch.enable_grad():
            self.write_artifacts()
