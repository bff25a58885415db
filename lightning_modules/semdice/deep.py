"""``DeepSemdiceLitModule``: deep SEMDICE pre-training from a reward-free offline dataset, and the APT baseline.

Lee et al., "SEMDICE", ICLR 2025, deep version (the official ``urlb/agent/semdice.py`` on top of OptiDICE):

* ``nu(s)``, ``mu(s)``: MLPs (``hidden`` units, two layers), trained on the dual
  :func:`ops.semdice.deep.semdice_deep_dual` with the soft-chi^2 ``f`` and ``log p_D(s) = -D * PBE(s)`` from the
  particle-based kNN estimate (``k = 6``) on the batch (:func:`ops.semdice.deep.pbe_log_density`).
* critic ``Q(s, a)``: regressed to ``mu(s) + gamma nu(s')`` (so ``Q(s, a) - nu(s)`` estimates the residual ``e``).
* deterministic actor ``pi(s)`` (tanh): maximises ``log (f')^{-1}((Q(s, a~) - nu(s)) / alpha)`` at
  ``a~ = clip(pi(s) + clip(N(0, noise), -noise_clip, noise_clip), -1, 1)`` (noise 0.2, clip 0.3), i.e. it
  imitates the density ratio ``w(s, a) = d*(s, a) / d_D(s, a)`` of the entropy-maximising stationary distribution.

Baseline ``method=apt`` (same networks, data and steps): DDPG on the intrinsic APT reward ``r(s') = PBE(s') =
log(c + r_k(s'))`` (kNN particle entropy within the batch), target critic (Polyak ``tau``), the same noisy actor.

Evaluation (``val``/``test``): ``eval_episodes`` roll-outs of the deterministic actor in ``data.make_env()``;
``*/cell_entropy`` = entropy of the histogram of visited ``cell``-sized squares of the first two state
coordinates (the (x, y) position in PointMaze), ``*/cells`` = number of those squares visited, ``*/pbe`` =
mean kNN particle entropy of the visited states. ``val/loss`` is the method's own loss on held-out transitions.
``eval_policy=behaviour`` rolls out the data's behaviour policy instead of the actor (the coverage of the data
itself, the floor a pre-trained actor should beat; train it for 0 epochs). ``test/data_cell_entropy`` and
``test/data_cells`` are the same histogram over every next state of the training data (generated, or an online run's
replay buffer read through ``data.path``): how far the data themselves reach.

Downstream fine-tuning on the task reward: :mod:`lightning_modules.semdice.finetune`.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from core.errors import ConfigError, NonFiniteLossError
from datamodules.gym_offline import cell_coverage, flat_obs  # the env protocol only; no paper code in datamodules
from lightning_modules._base import SuiteLitModule
from ops.semdice import deep as ops
from ops.semdice.tabular import check_alpha, check_gamma

METHODS = ("semdice", "apt")
EVAL_POLICIES = ("actor", "behaviour")


def mlp(inp: int, out: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inp, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out)
    )


class DeepSemdiceLitModule(SuiteLitModule):
    """Deep SEMDICE (``method=semdice``) or APT (``method=apt``) pre-training on ``(s, a, s', r, done)`` batches.

    Args:
        obs_dim: State dimension (``null``: read from the datamodule).
        act_dim: Action dimension (``null``: from the datamodule).
        method: ``semdice`` or ``apt``.
        hidden: MLP width (256 in the paper).
        lr: Adam learning rate of every network (1e-4 in the paper).
        gamma: Discount (0.99).
        alpha: f-divergence weight (0.5).
        knn_k: Neighbours of the particle-based entropy (6).
        knn_c: Constant ``c`` of ``log(c + r_k)``.
        noise: Actor noise std (0.2); noise_clip: its clip (0.3).
        tau: APT target-critic Polyak rate.
        eval_episodes: Roll-outs per evaluation; eval_steps: their length (``null``: the env's limit).
        cell: Side of the coverage squares.
        eval_policy: ``actor`` (the pre-trained deterministic actor) or ``behaviour`` (the data's behaviour policy,
            ``datamodule.behaviour_policy``) in the coverage roll-outs.
    """

    def __init__(
        self,
        obs_dim: int | None = None,
        act_dim: int | None = None,
        method: str = "semdice",
        hidden: int = 256,
        lr: float = 1e-4,
        gamma: float = 0.99,
        alpha: float = 0.5,
        knn_k: int = 6,
        knn_c: float = 1.0,
        noise: float = 0.2,
        noise_clip: float = 0.3,
        tau: float = 0.01,
        eval_episodes: int = 2,
        eval_steps: int | None = None,
        cell: float = 0.5,
        eval_policy: str = "actor",
    ) -> None:
        super().__init__()
        if method not in METHODS:
            raise ConfigError(f"model.method={method!r} must be one of {list(METHODS)}")
        if eval_policy not in EVAL_POLICIES:
            raise ConfigError(f"model.eval_policy={eval_policy!r} must be one of {list(EVAL_POLICIES)}")
        check_gamma(gamma, "model.gamma")
        check_alpha(alpha, "model.alpha")
        if knn_k < 1 or hidden < 1 or lr <= 0 or noise < 0 or noise_clip < 0 or not 0 < tau <= 1 or cell <= 0:
            raise ConfigError(
                f"model: knn_k={knn_k} >= 1, hidden={hidden} >= 1, lr={lr} > 0, noise={noise} >= 0, "
                f"noise_clip={noise_clip} >= 0, tau={tau} in (0, 1], cell={cell} > 0 required"
            )
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.method, self.gamma, self.alpha, self.k, self.c = method, gamma, alpha, knn_k, knn_c
        self.noise, self.noise_clip, self.tau, self.lr = noise, noise_clip, tau, lr
        self.eval_episodes, self.eval_steps, self.cell = eval_episodes, eval_steps, cell
        self.eval_policy = eval_policy
        self._built = False
        if obs_dim and act_dim:
            self._build(obs_dim, act_dim)

    def _build(self, obs_dim: int, act_dim: int) -> None:
        h = self.hparams.hidden
        self.nu = mlp(obs_dim, 1, h).double()
        self.mu = mlp(obs_dim, 1, h).double()
        self.critic = mlp(obs_dim + act_dim, 1, h).double()
        self.actor = nn.Sequential(mlp(obs_dim, act_dim, h), nn.Tanh()).double()
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.obs_dim, self.act_dim, self._built = obs_dim, act_dim, True

    def setup(self, stage: str) -> None:
        if not self._built:
            dm = self.trainer.datamodule
            dm.setup(stage)
            self._build(dm.obs_dim, dm.act_dim)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        adam = lambda *mods: torch.optim.Adam([p for m in mods for p in m.parameters()], lr=self.lr)  # noqa: E731
        return [adam(self.nu, self.mu), adam(self.critic), adam(self.actor)]

    # -- losses ------------------------------------------------------------------------------------------------------
    def q(self, s: torch.Tensor, a: torch.Tensor, target: bool = False) -> torch.Tensor:
        return (self.critic_target if target else self.critic)(torch.cat([s, a], -1)).squeeze(-1)

    def noisy_action(self, s: torch.Tensor) -> torch.Tensor:
        eps = (torch.randn(s.shape[0], self.act_dim, dtype=s.dtype, device=s.device) * self.noise).clamp(
            -self.noise_clip, self.noise_clip
        )
        return (self.actor(s) + eps).clamp(-1, 1)

    def losses(self, batch: list[torch.Tensor], actor: bool = True) -> dict[str, torch.Tensor]:
        """``dual`` (SEMDICE), ``critic`` and (``actor=True``) ``actor`` losses of one batch, in float64."""
        s, a, s2, _, done = (t.double() for t in batch)
        not_done = 1.0 - done
        out = {}
        if self.method == "semdice":
            log_p = ops.pbe_log_density(s, self.k, self.c).detach()
            nu_s, nu_next, mu_s = self.nu(s).squeeze(-1), self.nu(s2).squeeze(-1), self.mu(s).squeeze(-1)
            out["dual"] = ops.semdice_deep_dual(nu_s, nu_next, mu_s, log_p, not_done, self.gamma, self.alpha)
            target = (mu_s + self.gamma * not_done * nu_next).detach()
        else:
            reward = torch.log(self.c + ops.knn_mean_distance(s2, self.k))  # APT particle reward r(s')
            with torch.no_grad():
                target = reward + self.gamma * not_done * self.q(s2, self.noisy_action(s2), target=True)
        out["critic"] = ((self.q(s, a) - target) ** 2).mean()
        if actor:
            out["actor"] = self.actor_loss(s)
        return out

    def actor_loss(self, s: torch.Tensor) -> torch.Tensor:
        """SEMDICE: ``-E log (f')^{-1}((Q(s, a~) - nu(s)) / alpha)``; APT: ``-E Q(s, a~)`` (``a~`` noisy actor)."""
        q = self.q(s, self.noisy_action(s))
        if self.method == "semdice":
            return -ops.log_soft_chisq_f_prime_inv((q - self.nu(s).squeeze(-1).detach()) / self.alpha).mean()
        return -q.mean()

    def update(
        self, batch: list[torch.Tensor], optimizers: Any, backward: Any = None, step: int | None = None
    ) -> dict[str, torch.Tensor]:
        """One update of every network on ``batch`` with ``optimizers`` (those of :meth:`configure_optimizers`);
        ``backward(loss)`` defaults to Lightning's ``manual_backward`` (the downstream module's in-process
        pre-training passes ``Tensor.backward``, no trainer). Returns the losses."""
        backward = backward or self.manual_backward
        opt_dual, opt_critic, opt_actor = optimizers

        def take(opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
            opt.zero_grad()
            backward(loss)
            opt.step()

        losses = self.losses(batch, actor=False)
        for name, opt in (("dual", opt_dual), ("critic", opt_critic)):
            if name in losses:  # each loss reaches only its own networks (targets are detached)
                take(opt, losses[name])
        # the actor is updated against the updated critic; the critic gradients it leaves are zeroed next step
        losses["actor"] = self.actor_loss(batch[0].double())
        take(opt_actor, losses["actor"])
        bad = {k: float(v) for k, v in losses.items() if not torch.isfinite(v)}
        if bad:
            where = self.global_step if step is None else step
            raise NonFiniteLossError(f"{self.method} losses became {bad} at step {where}")
        if self.method == "apt":
            with torch.no_grad():
                for p, pt in zip(self.critic.parameters(), self.critic_target.parameters()):
                    pt.lerp_(p, self.tau)
        return losses

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        losses = self.update(batch, self.optimizers())
        self.log("train/loss", losses.get("dual", losses["critic"]), prog_bar=True)
        self.log_dict({f"train/{k}": v.detach() for k, v in losses.items()})

    # -- evaluation --------------------------------------------------------------------------------------------------
    def coverage(
        self, env: Any, episodes: int, steps: int | None, seed: int, behaviour: Any = None
    ) -> dict[str, float]:
        """Roll out the deterministic actor (or ``behaviour.act(t)``, a behaviour policy): :func:`state_coverage`."""
        return state_coverage(self.actor, env, episodes, steps, seed, self.cell, self.k, self.c, behaviour)

    def _eval_step(self, batch: list[torch.Tensor], stage: str) -> None:
        losses = self.losses(batch, actor=False)
        key = "dual" if self.method == "semdice" else "critic"
        self.log(f"{stage}/loss", losses[key], batch_size=batch[0].shape[0])

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def _log_coverage(self, stage: str) -> None:
        if self.trainer.sanity_checking or self.eval_episodes < 1:
            return
        dm = self.trainer.datamodule
        env = dm.make_env()
        try:
            behaviour = dm.behaviour_policy(env, seed=10_000 + dm.seed) if self.eval_policy == "behaviour" else None
            cov = self.coverage(env, self.eval_episodes, self.eval_steps, seed=10_000, behaviour=behaviour)
        finally:
            env.close()
        self.log_dict({f"{stage}/{k}": v for k, v in cov.items()})
        states = getattr(dm, "states", None)
        if stage == "test" and states is not None:  # the training data's own coverage, beside the actor's
            entropy, n_cells = cell_coverage(states, self.cell)
            self.log_dict({"test/data_cell_entropy": entropy, "test/data_cells": float(n_cells)})

    def on_validation_epoch_end(self) -> None:
        self._log_coverage("val")

    def on_test_epoch_end(self) -> None:
        self._log_coverage("test")


@torch.no_grad()
def state_coverage(
    actor: nn.Module,
    env: Any,
    episodes: int,
    steps: int | None,
    seed: int,
    cell: float,
    k: int = 6,
    c: float = 1.0,
    behaviour: Any = None,
) -> dict[str, float]:
    """Roll out the deterministic ``actor`` (float64 states in, tanh actions out; or ``behaviour.act(t)``, a behaviour
    policy) for ``episodes`` episodes from ``env.reset(seed=seed + ep)``: entropy and count of the visited
    ``cell``-sized squares of the first two state coordinates, and the mean kNN particle entropy of the visited states.
    Shared by the pre-training (:class:`DeepSemdiceLitModule`) and the online APT (``finetune.DdpgFinetuneLitModule``
    with ``eval_metric=coverage``), so both are scored by the same roll-outs."""
    states = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        for t in range(steps or 10**9):
            if behaviour is not None:
                action = np.asarray(behaviour.act(t), dtype=np.float32)
            else:
                action = actor(torch.from_numpy(flat_obs(obs)).double()[None])[0].float().numpy()
            obs, _, terminated, truncated, _ = env.step(action)
            states.append(flat_obs(obs))
            if terminated or truncated:
                break
    x = np.stack(states)
    entropy, n_cells = cell_coverage(x, cell)
    xs = torch.from_numpy(x).double()
    pbe = float(torch.log(c + ops.knn_mean_distance(xs, min(k, len(xs) - 1))).mean())
    return {"cell_entropy": entropy, "cells": float(n_cells), "pbe": pbe}
