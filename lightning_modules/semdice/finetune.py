"""``DdpgFinetuneLitModule``: downstream adaptation of a pre-trained actor on the task reward (online DDPG).

SEMDICE's downstream protocol (paper, URLB): fine-tune with a standard DDPG-style critic on the extrinsic reward,
starting from the pre-trained actor (``init_ckpt`` = a ``semdice_deep`` checkpoint, SEMDICE or APT; or ``init_run`` =
a ``semdice_deep`` run folder or multirun folder, whose run of seed ``init_seed`` gives its ``checkpoints/last.ckpt``,
see :func:`pretrained_checkpoint`) or from scratch (both ``null``). The module steps the environment of
:class:`~datamodules.gym_offline.GymOnlineDataModule` itself: each training step takes ``env_steps`` environment steps
with the noisy actor (``clip(N(0, noise), ±noise_clip)``; uniform random actions for the first ``warmup`` steps when
starting from scratch), stores them in a replay buffer, then makes one critic update (target ``r + gamma (1 - done)
Q'(s', pi'(s') + smoothing)``) and one actor update (``-Q(s, pi(s))``), with Polyak targets. ``train/episode_return``
is logged at every episode end and ``val/return`` / ``test/return`` is the mean deterministic return over
``eval_episodes``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lightning_modules._base import SuiteLitModule
from lightning_modules.semdice.deep import mlp
from ops.semdice.tabular import check_gamma
from suite.debug import smoke_test
from suite.errors import CheckpointError, ConfigError


def _run_seed(run: Path) -> int | None:
    """The ``seed`` of a run folder's saved config (``config.yaml``, else ``.hydra/config.yaml``); ``None``: none."""
    from omegaconf import OmegaConf

    for cfg in (run / "config.yaml", run / ".hydra" / "config.yaml"):
        if cfg.is_file():
            try:
                seed = OmegaConf.load(cfg).get("seed")
            except Exception:  # noqa: BLE001 - an unreadable config is reported as "no run of this seed" below
                return None
            return None if seed is None else int(seed)
    return None


def pretrained_checkpoint(init_run: str, seed: int) -> str:
    """``<run>/checkpoints/last.ckpt`` of the pre-training run of ``seed`` under ``init_run``: either one run folder
    (its config's seed must be ``seed``) or a multirun / claim-entry folder (``logs/claim/semdice_deep/semdice``)
    whose sub-folders are runs; the pre-training of the same seed is picked, so a claim over seeds fine-tunes each
    seed's own pre-trained actor. A missing folder, run or checkpoint is one :class:`CheckpointError` line."""
    root = Path(init_run)
    if not root.is_dir():
        raise CheckpointError(
            f"model.init_run={init_run}: no such run folder (run the pre-training first, e.g. "
            "`make claim METHOD=semdice_deep`)"
        )
    runs = [root] if _run_seed(root) is not None else sorted(p for p in root.iterdir() if p.is_dir())
    match = [r for r in runs if _run_seed(r) == seed]
    if not match:
        seeds = sorted({s for s in map(_run_seed, runs) if s is not None})
        raise CheckpointError(f"model.init_run={init_run}: no pre-training run of seed {seed} (seeds there: {seeds})")
    ckpt = match[-1] / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        raise CheckpointError(
            f"model.init_run={init_run}: run {match[-1].name} of seed {seed} has no checkpoints/last.ckpt "
            "(pre-train with checkpointing on)"
        )
    return str(ckpt)


class DdpgFinetuneLitModule(SuiteLitModule):
    """Online DDPG on the task reward, optionally initialised from a pre-trained SEMDICE / APT actor.

    Args:
        init_ckpt: A ``semdice_deep`` checkpoint whose ``actor.*`` weights initialise the actor (``null``: scratch).
        init_run: Instead of ``init_ckpt``: a ``semdice_deep`` run or multirun folder; the actor of its run of seed
            ``init_seed`` is loaded (:func:`pretrained_checkpoint`).
        init_seed: The pre-training seed to pick from ``init_run`` (the config sets it to the run's own seed).
        hidden: MLP width (must match the checkpoint's).
        lr: Adam learning rate; gamma: discount; tau: Polyak rate.
        noise: Exploration / smoothing noise std; noise_clip: its clip.
        buffer_size: Replay capacity; batch: update batch size.
        warmup: Environment steps before the first update (random actions only when starting from scratch).
        env_steps: Environment steps per training step.
        eval_episodes: Deterministic evaluation episodes per validation.
    """

    def __init__(
        self,
        init_ckpt: str | None = None,
        init_run: str | None = None,
        init_seed: int = 0,
        hidden: int = 256,
        lr: float = 1e-4,
        gamma: float = 0.99,
        tau: float = 0.01,
        noise: float = 0.2,
        noise_clip: float = 0.3,
        buffer_size: int = 100_000,
        batch: int = 256,
        warmup: int = 1000,
        env_steps: int = 1,
        eval_episodes: int = 2,
    ) -> None:
        super().__init__()
        check_gamma(gamma, "model.gamma")
        if min(hidden, buffer_size, batch, env_steps) < 1 or warmup < 0 or lr <= 0 or not 0 < tau <= 1:
            raise ConfigError(
                f"model: hidden={hidden}, buffer_size={buffer_size}, batch={batch}, env_steps={env_steps} must be "
                f">= 1, warmup={warmup} >= 0, lr={lr} > 0, tau={tau} in (0, 1]"
            )
        if init_ckpt is not None and init_run is not None:
            raise ConfigError("model.init_ckpt and model.init_run are exclusive: set one (or neither for scratch)")
        if init_run is not None:
            init_ckpt = pretrained_checkpoint(init_run, int(init_seed))
        if init_ckpt is not None and not Path(init_ckpt).is_file():
            raise CheckpointError(f"model.init_ckpt={init_ckpt}: no such checkpoint file")
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.init_ckpt, self.gamma, self.tau, self.lr = init_ckpt, gamma, tau, lr
        self.noise, self.noise_clip, self.batch, self.warmup = noise, noise_clip, batch, warmup
        self.buffer_size, self.env_steps, self.eval_episodes = buffer_size, env_steps, eval_episodes
        self._built = False
        self.env: Any = None
        self.env_step = 0

    # -- set-up ------------------------------------------------------------------------------------------------------
    def _build(self, obs_dim: int, act_dim: int) -> None:
        h = self.hparams.hidden
        self.actor = nn.Sequential(mlp(obs_dim, act_dim, h), nn.Tanh()).double()
        self.critic = mlp(obs_dim + act_dim, 1, h).double()
        if self.init_ckpt is not None:
            self._load_actor(self.init_ckpt)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.obs_dim, self.act_dim, self._built = obs_dim, act_dim, True
        self.buf = {
            "s": np.zeros((self.buffer_size, obs_dim)),
            "a": np.zeros((self.buffer_size, act_dim)),
            "r": np.zeros(self.buffer_size),
            "s2": np.zeros((self.buffer_size, obs_dim)),
            "d": np.zeros(self.buffer_size),
        }
        self.size = 0

    def _load_actor(self, path: str) -> None:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
        except (OSError, KeyError, RuntimeError) as err:
            raise CheckpointError(f"model.init_ckpt={path}: not a readable Lightning checkpoint ({err})") from None
        actor = {k[len("actor.") :]: v for k, v in state.items() if k.startswith("actor.")}
        if not actor:
            raise CheckpointError(f"model.init_ckpt={path}: has no actor.* weights (not a semdice_deep checkpoint)")
        try:
            self.actor.load_state_dict(actor)
        except RuntimeError as err:
            msg = " ".join(str(err).split())[:200]
            raise CheckpointError(f"model.init_ckpt={path}: actor does not fit this task/width ({msg})") from None

    def setup(self, stage: str) -> None:
        if not self._built:
            dm = self.trainer.datamodule
            dm.setup(stage)
            self._build(dm.obs_dim, dm.act_dim)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.Adam(self.critic.parameters(), lr=self.lr),
            torch.optim.Adam(self.actor.parameters(), lr=self.lr),
        ]

    # -- acting ------------------------------------------------------------------------------------------------------
    def _reset(self, env: Any, seed: int | None = None) -> np.ndarray:
        from datamodules.gym_offline import flat_obs

        obs, _ = env.reset(seed=seed, options=self.trainer.datamodule.reset_options or None)
        return flat_obs(obs).astype(np.float64)

    @torch.no_grad()
    def act(self, s: np.ndarray, explore: bool) -> np.ndarray:
        a = self.actor(torch.from_numpy(s)[None])[0].numpy()
        if explore:
            a = a + np.clip(self._rng.normal(0, self.noise, a.shape), -self.noise_clip, self.noise_clip)
        return np.clip(a, -1, 1)

    def on_train_start(self) -> None:
        self.env = self.trainer.datamodule.make_env()
        self._rng = np.random.default_rng(int(self.trainer.datamodule.seed))
        self._obs, self._ret = self._reset(self.env, seed=int(self.trainer.datamodule.seed)), 0.0

    def on_train_end(self) -> None:
        if self.env is not None:
            self.env.close()

    def _collect(self) -> None:
        from datamodules.gym_offline import flat_obs

        for _ in range(self.env_steps):
            scratch_warmup = self.init_ckpt is None and self.env_step < self.warmup
            a = self._rng.uniform(-1, 1, self.act_dim) if scratch_warmup else self.act(self._obs, explore=True)
            obs, r, terminated, truncated, _ = self.env.step(a.astype(np.float32))
            s2 = flat_obs(obs).astype(np.float64)
            i = self.size % self.buffer_size
            for k, v in (("s", self._obs), ("a", a), ("r", r), ("s2", s2), ("d", float(terminated))):
                self.buf[k][i] = v
            self.size, self.env_step, self._ret = self.size + 1, self.env_step + 1, self._ret + float(r)
            self._obs = s2
            if terminated or truncated:
                self.log("train/episode_return", self._ret, on_step=True, batch_size=1)
                self._obs, self._ret = self._reset(self.env), 0.0

    # -- learning ----------------------------------------------------------------------------------------------------
    def q(self, net: nn.Module, s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return net(torch.cat([s, a], -1)).squeeze(-1)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        self._collect()
        n = min(self.size, self.buffer_size)
        # A smoke test (fast_dev_run, debug=...) runs a handful of steps: update from the first transition on, with
        # the whole buffer as the batch, so that the pipeline's learning step is exercised too.
        smoke = smoke_test(self.trainer)
        warmup, batch = (0, min(self.batch, n)) if smoke else (self.warmup, self.batch)
        if self.env_step < warmup or n < max(batch, 1):
            return None
        idx = self._rng.integers(0, n, batch)
        s, a, r, s2, d = (torch.from_numpy(self.buf[k][idx]) for k in ("s", "a", "r", "s2", "d"))
        opt_critic, opt_actor = self.optimizers()
        with torch.no_grad():
            eps = (torch.randn_like(a) * self.noise).clamp(-self.noise_clip, self.noise_clip)
            a2 = (self.actor_target(s2) + eps).clamp(-1, 1)
            target = r + self.gamma * (1 - d) * self.q(self.critic_target, s2, a2)
        critic_loss = ((self.q(self.critic, s, a) - target) ** 2).mean()
        opt_critic.zero_grad()
        self.manual_backward(critic_loss)
        opt_critic.step()
        actor_loss = -self.q(self.critic, s, self.actor(s)).mean()
        opt_actor.zero_grad()
        self.manual_backward(actor_loss)
        opt_actor.step()
        with torch.no_grad():
            for net, tgt in ((self.critic, self.critic_target), (self.actor, self.actor_target)):
                for p, pt in zip(net.parameters(), tgt.parameters()):
                    pt.lerp_(p, self.tau)
        self.log("train/loss", critic_loss, prog_bar=True)
        self.log("train/actor_loss", actor_loss)
        return None

    # -- evaluation --------------------------------------------------------------------------------------------------
    def evaluate(self, episodes: int) -> float:
        """Mean undiscounted return of the deterministic actor over ``episodes`` episodes (fixed seeds)."""
        env = self.trainer.datamodule.make_env()
        returns = []
        try:
            for ep in range(episodes):
                s, done, ret = self._reset(env, seed=10_000 + ep), False, 0.0
                while not done:
                    from datamodules.gym_offline import flat_obs

                    obs, r, terminated, truncated, _ = env.step(self.act(s, explore=False).astype(np.float32))
                    s, ret, done = flat_obs(obs).astype(np.float64), ret + float(r), terminated or truncated
                returns.append(ret)
        finally:
            env.close()
        return float(np.mean(returns))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if not self.trainer.sanity_checking:
            self.log("val/return", self.evaluate(self.eval_episodes), batch_size=1)
            self.log("val/env_steps", float(self.env_step), batch_size=1)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test/return", self.evaluate(self.eval_episodes), batch_size=1)
