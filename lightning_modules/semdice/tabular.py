"""``SemdiceLitModule``: tabular SEMDICE and its baselines, learning from a dataset that grows online.

Lee, Kim, Kim, Kim, Kim, Lee, "SEMDICE: Off-policy State Entropy Maximization via Stationary Distribution
Correction Estimation", ICLR 2025.

* ``kind=semdice``: the parameters are the dual variables ``(nu, mu) [S]``; ``training_step`` runs ``inner_steps``
  plain gradient-descent steps (SGD, lr 0.01, 100 per trajectory in the paper) on the dual ``L(nu, mu)`` (Sec. 3,
  :func:`ops.semdice.tabular.semdice_dual`, chi^2 conjugate) under the MLE model of the data, warm-started across
  trajectories; the policy is recovered by ``pi(a|s) ∝ d_b(s, a) max(0, e / alpha + 1)``.
  ``d_b`` is the weight of the f-divergence:

  - ``d_b=data`` (the paper): the data distribution ``d_D(s, a) = N(s, a) / N``;
  - ``d_b=official`` (the official code): the stationary distribution of the current policy under the MLE model,
    ``d^pi_{T_hat}``, recomputed after every trajectory.

* Baselines (same data collection, same number of update steps): ``uniform`` (no learning); ``pb_s``: a
  state-density bonus; ``cb_s`` / ``cb_sa``: the count bonus ``(N + 1e-4)^{-1/2}`` (min-max normalised) of states /
  state-actions. ``maxent``: the MaxEnt-optimal policy of the true MDP from the convex program (reference,
  :func:`ops.semdice.maxent.maxent_optimal`). How the baselines' softmax logits move (``baseline_update``):

  - ``official`` (default; the official ``tabular_mdp.py``): ``inner_steps`` ascent steps
    ``theta += lr p_s(s) Q^pi(s, a)`` with ``p_s`` the *discounted* data state distribution (counts weighted by
    ``gamma^t``, initialised at 1e-10) and ``Q`` the unnormalised action value under the MLE model, then the logits
    reset to ``log(pi + 1e-100)`` (:func:`ops.semdice.tabular.official_pg_ascent`); ``pb_s``'s reward is ``-log p_s``
    min-max normalised to [0, 1] (:func:`ops.semdice.tabular.official_density_reward`).
  - ``exact``: SGD on the exact policy gradient of the normalised return ``J(theta) = sum d^{pi_theta}_{T_hat}(s, a)
    r(s, a)`` (autograd through the linear solve), with ``pb_s``'s reward the unscaled ``-log p_D(s)`` of the
    undiscounted state counts smoothed by 1e-4. A legitimate policy-gradient baseline: on the claim it is much
    slower than the official update early but ends level with it at 1,000 trajectories, where the official one
    oscillates.
* Data: the :class:`~callbacks.online_collection.OnlineDataCollection` callback rolls out one trajectory with the
  epsilon-soft policy (``epsilon = 1 / (i + 1)``) before each training step and calls :meth:`refresh_data`.
* Metrics (every validation): ``val/entropy`` = ``H(d^pi_s)`` of the current policy in the TRUE MDP,
  ``val/normalized_entropy`` = ``(H - H_unif) / (H_opt - H_unif)``, ``val/trajectories``, ``val/h_opt``; for
  SEMDICE also ``val/recovery_gap`` = ``|| d_recovered - d^pi_{T_hat} ||_1`` (0 when the dual has converged: the
  recovered distribution is that of the single stationary policy ``pi``).
* ``global_step`` counts optimiser steps: 100 per trajectory with ``fused=false``, 1 per trajectory with
  ``fused=true`` or the ``official`` baseline update (a gradient-free ``opt.step()`` after the loop), 0 for
  ``uniform``/``maxent``; the metrics' x-axis is ``val/trajectories``. ``train/loss`` of a baseline is ``-J`` (the
  normalised return of its reward under the MLE model) whichever update moved it.

The official code also reads ``gamma`` and ``p0`` of the true MDP inside the objective; here they come from the
datamodule, which is the same (both are known to the learner in the paper's setting).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn

from core.errors import ConfigError, NonFiniteLossError
from lightning_modules._base import SuiteLitModule
from ops.semdice import fused as fused_ops
from ops.semdice import tabular as tb
from ops.semdice.maxent import maxent_optimal

KINDS = ("semdice", "uniform", "pb_s", "cb_s", "cb_sa", "maxent")
D_B = ("data", "official")
BASELINE_UPDATES = ("official", "exact")
UNDISCOUNTED_WARNING = (
    "semdice: the datamodule holds no discounted state counts, so the official baseline update weighs states by the "
    "undiscounted counts instead of the gamma^t-weighted ones (warned once per run)"
)


class SemdiceLitModule(SuiteLitModule):
    """Tabular SEMDICE (``kind=semdice``) and the paper's baselines.

    Args:
        num_states: ``S`` (``${data.num_states}``).
        num_actions: ``A`` (``${data.num_actions}``).
        kind: One of :data:`KINDS`.
        alpha: f-divergence weight ``alpha > 0`` (0.1 in the paper).
        d_b: ``data`` (paper: ``d_D``) or ``official`` (``d^pi`` under the MLE model).
        inner_steps: Gradient steps per trajectory (100 in the paper).
        optimizer: Partial of the optimiser of the dual variables / policy logits (SGD lr 0.01 in the paper).
        fused: Run the ``inner_steps`` steps in numpy with closed-form gradients (:mod:`ops.semdice.fused`, the
            same iterates as ``torch.optim.SGD`` + autograd, tested; ~50x faster on these tiny tensors). Needs
            plain SGD (no momentum, no weight decay); ``false`` steps the configured torch optimiser on autograd
            (the ``official`` baseline update then runs its torch twin).
        baseline_update: ``official`` (default) or ``exact`` (module docstring); the baselines' step size is the
            optimiser's lr either way (0.01, the official value).
    """

    def __init__(
        self,
        num_states: int = 20,
        num_actions: int = 4,
        kind: str = "semdice",
        alpha: float = 0.1,
        d_b: str = "data",
        inner_steps: int = 100,
        optimizer: Any = None,
        fused: bool = True,
        baseline_update: str = "official",
    ) -> None:
        if baseline_update not in BASELINE_UPDATES:
            raise ConfigError(f"model.baseline_update={baseline_update!r} must be one of {list(BASELINE_UPDATES)}")
        if kind not in KINDS:
            raise ConfigError(f"model.kind={kind!r} must be one of {list(KINDS)}")
        if d_b not in D_B:
            raise ConfigError(f"model.d_b={d_b!r} must be one of {list(D_B)}")
        tb.check_alpha(alpha, "model.alpha")
        if inner_steps < 1 or num_states < 1 or num_actions < 1:
            raise ConfigError(
                f"model.inner_steps={inner_steps}, num_states={num_states}, num_actions={num_actions} must be >= 1"
            )
        learns = kind in ("semdice", "pb_s", "cb_s", "cb_sa")
        if learns and optimizer is None:
            optimizer = lambda params: torch.optim.SGD(params, lr=0.01)  # noqa: E731 - the paper's plain GD
        super().__init__(optimizer=optimizer if learns else None)
        self.save_hyperparameters(ignore=["optimizer"])
        self.automatic_optimization = False
        self.kind, self.alpha, self.d_b_mode, self.inner_steps = kind, alpha, d_b, inner_steps
        self.fused = fused
        self.baseline_update = baseline_update
        S, A = num_states, num_actions
        self.nu = torch.nn.Parameter(torch.zeros(S, dtype=torch.float64))
        self.mu = torch.nn.Parameter(torch.zeros(S, dtype=torch.float64))
        self.logits = torch.nn.Parameter(torch.zeros(S, A, dtype=torch.float64))
        self.register_buffer("policy", torch.full((S, A), 1.0 / A, dtype=torch.float64))
        self.T_true: torch.Tensor | None = None
        self.p0: torch.Tensor | None = None
        self.gamma = 0.95
        self.T_hat: torch.Tensor | None = None
        self.d_b: torch.Tensor | None = None
        self.reward: torch.Tensor | None = None
        self.p_s: torch.Tensor | None = None  # discounted data state distribution (official baseline update)
        self._warned_undiscounted = False  # the undiscounted stand-in below is announced once per run
        self.h_opt = self.h_unif = float("nan")
        self.pi_opt: torch.Tensor | None = None

    # -- set-up ----------------------------------------------------------------------------------------------------
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [self.nu, self.mu] if self.kind == "semdice" else [self.logits]

    def configure_optimizers(self) -> Any:
        opt = super().configure_optimizers()
        if self.fused and opt is not None:
            groups = opt.param_groups
            plain = isinstance(opt, torch.optim.SGD) and all(
                g["momentum"] == 0 and g["weight_decay"] == 0 and not g["nesterov"] and not g.get("maximize")
                for g in groups
            )
            if not plain:
                raise ConfigError(
                    f"model.fused=true runs plain gradient descent; model.optimizer={type(opt).__name__} "
                    f"({groups[0]}) is not SGD without momentum/weight decay (set model.fused=false)"
                )
        return opt

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule
        dm.setup(stage)
        if (dm.num_states, dm.num_actions) != tuple(self.policy.shape):
            raise ConfigError(
                f"model.num_states/num_actions={tuple(self.policy.shape)} do not match the MDP "
                f"({dm.num_states}, {dm.num_actions})"
            )
        tb.check_transition(dm.T)
        tb.check_gamma(dm.gamma, "data.gamma")
        self.T_true, self.p0, self.gamma = dm.T, dm.p0, float(dm.gamma)
        S, A = self.policy.shape
        self.pi_opt, _, self.h_opt = maxent_optimal(self.T_true, self.p0, self.gamma)
        uniform = torch.full((S, A), 1.0 / A, dtype=torch.float64)
        self.h_unif = float(
            tb.state_entropy(tb.stationary_distribution(self.T_true, self.p0, uniform, self.gamma).sum(1))
        )
        if self.kind == "maxent":
            self.policy.copy_(self.pi_opt)
        if dm.counts is not None and dm.counts.sum() > 0:  # resumed: rebuild the data-derived tensors
            self.refresh_data(dm)

    # -- data protocol of callbacks.online_collection --------------------------------------------------------------
    def behaviour_policy(self) -> torch.Tensor:
        """The current policy ``[S, A]`` (the callback makes it epsilon-soft)."""
        return self.policy.detach().clone()

    @torch.no_grad()
    def refresh_data(self, dm: Any) -> None:
        """Rebuild the MLE model, ``d_b`` and the baselines' rewards from the datamodule's counts."""
        counts = dm.counts.to(self.policy)
        self.T_hat = tb.mle_model(counts)
        n_sa = counts.sum(-1)
        if self.d_b_mode == "data":
            self.d_b = n_sa / n_sa.sum()
        else:
            self.d_b = tb.stationary_distribution(self.T_hat, self.p0.to(self.policy), self.policy, self.gamma)
        if self.baseline_update == "official":
            discounted = dm.discounted_counts
            if discounted is None or discounted.sum() == 0:  # e.g. a checkpoint that kept no discounted counts
                if not self._warned_undiscounted:
                    rank_zero_warn(UNDISCOUNTED_WARNING, category=UserWarning)
                    self._warned_undiscounted = True
                discounted = counts
            self.p_s = tb.discounted_state_distribution(discounted.to(self.policy))
        if self.kind == "pb_s":
            if self.baseline_update == "official":
                self.reward = tb.official_density_reward(self.p_s)
            else:
                self.reward = tb.state_density_reward(n_sa.sum(1))
        elif self.kind == "cb_s":
            self.reward = tb.count_bonus(n_sa.sum(1))
        elif self.kind == "cb_sa":
            self.reward = tb.count_bonus(n_sa)

    # -- training ----------------------------------------------------------------------------------------------------
    def objective(self) -> torch.Tensor:
        """The loss minimised by one gradient step: the SEMDICE dual, or ``-J(theta)`` for the PG baselines."""
        p0 = self.p0.to(self.policy)
        if self.kind == "semdice":
            return tb.semdice_dual(self.nu, self.mu, self.d_b, self.T_hat, p0, self.gamma, self.alpha)
        return -tb.expected_reward(self.logits, self.T_hat, p0, self.gamma, self.reward)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        if self.T_hat is None:
            raise ConfigError("SemdiceLitModule needs callbacks.online_collection (no data was collected)")
        if self.kind in ("uniform", "maxent"):
            return None
        opt = self.optimizers()
        if self.kind != "semdice" and self.baseline_update == "official":
            self._official_steps(float(opt.param_groups[0]["lr"]))
            opt.zero_grad(set_to_none=True)
            opt.step()  # no gradients: global_step counts trajectories
            with torch.no_grad():
                self.policy.copy_(torch.softmax(self.logits, 1))
                final = self.objective()
            self.log("train/loss", final, on_step=True, prog_bar=True)
            return None
        if self.fused:
            self._fused_steps(float(opt.param_groups[0]["lr"]))
            opt.zero_grad(set_to_none=True)
            opt.step()  # no gradients: a no-op update that makes global_step count trajectories
        for _ in range(0 if self.fused else self.inner_steps):
            loss = self.objective()
            if not torch.isfinite(loss):
                raise NonFiniteLossError(f"{self.kind} objective became {float(loss)} at step {self.global_step}")
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        with torch.no_grad():
            final = self.objective()
            if self.kind == "semdice":
                pi, _ = tb.semdice_policy(self.nu, self.mu, self.d_b, self.T_hat, self.gamma, self.alpha)
            else:
                pi = torch.softmax(self.logits, 1)
            self.policy.copy_(pi)
        self.log("train/loss", final, on_step=True, prog_bar=True)
        return None

    @torch.no_grad()
    def _official_steps(self, lr: float) -> None:
        """``inner_steps`` steps of the official baselines' update, then its logit reset (numpy when ``fused``)."""
        if self.fused:
            logits = fused_ops.official_pg_ascent(
                self.logits.numpy(),
                self.T_hat.numpy(),
                self.gamma,
                self.reward.numpy(),
                self.p_s.numpy(),
                lr,
                self.inner_steps,
            )
            self.logits.copy_(torch.from_numpy(logits))
        else:
            self.logits.copy_(
                tb.official_pg_ascent(self.logits, self.T_hat, self.gamma, self.reward, self.p_s, lr, self.inner_steps)
            )

    @torch.no_grad()
    def _fused_steps(self, lr: float) -> None:
        """``inner_steps`` plain GD steps in numpy (:mod:`ops.semdice.fused`), written back into the parameters."""
        T_hat, p0 = self.T_hat.numpy(), self.p0.double().numpy()
        if self.kind == "semdice":
            nu, mu = fused_ops.dual_gradient_descent(
                self.nu.numpy(),
                self.mu.numpy(),
                self.d_b.numpy(),
                T_hat,
                p0,
                self.gamma,
                self.alpha,
                lr,
                self.inner_steps,
            )
            self.nu.copy_(torch.from_numpy(nu))
            self.mu.copy_(torch.from_numpy(mu))
        else:
            logits = fused_ops.policy_gradient_ascent(
                self.logits.numpy(), T_hat, p0, self.gamma, self.reward.numpy(), lr, self.inner_steps
            )
            self.logits.copy_(torch.from_numpy(logits))

    # -- evaluation --------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _evaluate(self, stage: str) -> None:
        d = tb.stationary_distribution(self.T_true.to(self.policy), self.p0.to(self.policy), self.policy, self.gamma)
        h = float(tb.state_entropy(d.sum(1)))
        n = float(self.trainer.datamodule.num_collected)
        metrics = {
            f"{stage}/entropy": h,
            f"{stage}/normalized_entropy": tb.normalized_entropy(h, self.h_unif, self.h_opt),
            f"{stage}/h_opt": self.h_opt,
            f"{stage}/trajectories": n,
        }
        if self.kind == "semdice" and self.T_hat is not None:
            # one stationary Markov policy: the recovered d should be pi's own stationary distribution (model T_hat)
            pi, d = tb.semdice_policy(self.nu, self.mu, self.d_b, self.T_hat, self.gamma, self.alpha)
            d_pi = tb.stationary_distribution(self.T_hat, self.p0.to(self.policy), pi, self.gamma)
            metrics[f"{stage}/recovery_gap"] = float((d - d_pi).abs().sum())
        self.log_dict(metrics, batch_size=1)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate("val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate("test")
