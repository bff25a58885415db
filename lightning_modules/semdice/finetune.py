"""``DdpgFinetuneLitModule``: downstream adaptation of a pre-trained actor on the task reward (online DDPG).

SEMDICE's downstream protocol (paper, URLB): fine-tune with a standard DDPG-style critic on the extrinsic reward,
starting from the pre-trained actor (``init_ckpt`` = a ``semdice_deep`` checkpoint, SEMDICE or APT; or ``init_run`` = a
``semdice_deep`` run folder or multirun folder, whose run of seed ``init_seed`` gives its ``checkpoints/last.ckpt``, see
:func:`pretrained_checkpoint`), from an actor it pre-trains itself with SEMDICE before fine-tuning (neither given,
``pretrain_steps > 0``: reward-free updates of :class:`~lightning_modules.semdice.deep.DeepSemdiceLitModule` on the
generated offline dataset ``pretrain_data``, the default of ``make train METHOD=semdice_finetune``, so the default run
fine-tunes a SEMDICE actor) or from scratch (``pretrain_steps=0``). ``test/pretrain_steps`` is logged whenever the actor
started pre-trained (the in-process updates, or the checkpoint's ``global_step``). The module steps the environment of
:class:`~datamodules.gym_offline.GymOnlineDataModule` itself: each training step takes ``env_steps`` environment steps
with the noisy actor (``clip(N(0, noise), ±noise_clip)``; uniform random actions for the first ``warmup`` steps when
starting from scratch), stores them in a replay buffer, then makes one critic update (target ``r + gamma (1 - done)
Q'(s', pi'(s') + smoothing)``) and one actor update (``-Q(s, pi(s))``), with Polyak targets. ``train/episode_return`` is
logged at every episode end and ``val/return`` / ``test/return`` is the mean deterministic return over
``eval_episodes``.

The same module runs the **APT baseline as its paper and URLB run it: online, reward-free** (``reward=apt``): the
env's reward is ignored and each update's reward is APT's particle reward of the batch's next states,
``log(1 + mean of the k = 12 nearest-neighbour distances / their running mean)`` (Liu & Abbeel 2021, the
particle-based entropy reward; URLB ``PBE`` with ``knn_avg``, ``knn_rms``;
:func:`ops.semdice.deep.apt_particle_reward`), with URLB's double-Q critic
(``double_q``: two critics, the minimum in the target and in the actor's objective) and ``eval_metric=coverage`` (the
pre-training check's coverage roll-outs, :func:`lightning_modules.semdice.deep.state_coverage`). The kNN runs in the
raw state space: URLB's ICM trunk (a learnt 512-d representation for the kNN) is not built (PointMaze's state is
4-d, positions and velocities).

``save_replay=true`` writes the replay buffer (every transition collected, oldest first, at most ``buffer_size``) to
``<run>/replay.npz`` when fitting ends, in the format of :class:`~datamodules.gym_offline.GymOfflineDataModule`
(``obs``, ``action``, ``next_obs``, ``reward`` = the env's, ``terminated``), so that an offline learner trains on the
very transitions this run collected (``data.path=<run>/replay.npz``). With ``eval_metric=coverage`` the test also
logs ``test/data_cell_entropy`` / ``test/data_cells``: the coverage histogram of the buffer's next states.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from core.errors import CheckpointError, ConfigError
from core.smoke import smoke_test
from datamodules.gym_offline import ARRAYS, GymOfflineDataModule, cell_coverage, flat_obs
from lightning_modules._base import SuiteLitModule
from lightning_modules.semdice.deep import DeepSemdiceLitModule, mlp, state_coverage
from ops.semdice import deep as ops
from ops.semdice.tabular import check_gamma

log = logging.getLogger(__name__)


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


REPLAY_FILE = "replay.npz"
REWARDS = ("task", "apt")
EVAL_METRICS = ("return", "coverage")


class DdpgFinetuneLitModule(SuiteLitModule):
    """Online DDPG on the task reward, optionally initialised from a pre-trained SEMDICE / APT actor.

    Args:
        init_ckpt: A ``semdice_deep`` checkpoint whose ``actor.*`` weights initialise the actor (``null``: scratch).
        init_run: Instead of ``init_ckpt``: a ``semdice_deep`` run or multirun folder; the actor of its run of seed
            ``init_seed`` is loaded (:func:`pretrained_checkpoint`).
        init_seed: The pre-training seed to pick from ``init_run`` (the config sets it to the run's own seed); also
            the seed of the in-process pre-training's data and networks.
        pretrain_steps: With neither ``init_ckpt`` nor ``init_run``: SEMDICE pre-training updates (dual, critic and
            actor, reward-free) run in-process before fine-tuning; 0: fine-tune from scratch.
        pretrain_data: Keyword arguments of :class:`~datamodules.gym_offline.GymOfflineDataModule` for that
            pre-training (the reward-free offline dataset, generated and cached like ``semdice_deep``'s).
        save_replay: Write the replay buffer to ``<run>/replay.npz`` when fitting ends (:meth:`replay_arrays`).
        hidden: MLP width (must match the checkpoint's).
        lr: Adam learning rate; gamma: discount; tau: Polyak rate.
        noise: Exploration / smoothing noise std; noise_clip: its clip.
        buffer_size: Replay capacity; batch: update batch size.
        warmup: Environment steps before the first update (random actions only when starting from scratch).
        env_steps: Environment steps per training step.
        eval_episodes: Deterministic evaluation episodes per validation.
        reward: ``task`` (the env's reward, fine-tuning) or ``apt`` (reward-free: APT's particle reward).
        knn_k: APT's neighbours (12, URLB); knn_c: its ``c``; knn_rms: divide the distances by their running mean.
        double_q: Two critics, their minimum in the target and the actor's objective (URLB's DDPG critic).
        eval_metric: ``return`` (``val/return``) or ``coverage`` (``val/cell_entropy``, ``val/cells``, ``val/pbe``
            of ``eval_episodes`` roll-outs of ``eval_steps`` steps, squares of side ``cell``; the pre-training check's).
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
        reward: str = "task",
        knn_k: int = 12,
        knn_c: float = 1.0,
        knn_rms: bool = True,
        double_q: bool = False,
        eval_metric: str = "return",
        eval_steps: int | None = None,
        cell: float = 0.5,
        pretrain_steps: int = 0,
        pretrain_data: dict[str, Any] | None = None,
        save_replay: bool = False,
    ) -> None:
        super().__init__()
        check_gamma(gamma, "model.gamma")
        if reward not in REWARDS:
            raise ConfigError(f"model.reward={reward!r} must be one of {list(REWARDS)}")
        if eval_metric not in EVAL_METRICS:
            raise ConfigError(f"model.eval_metric={eval_metric!r} must be one of {list(EVAL_METRICS)}")
        if knn_k < 1 or cell <= 0 or knn_c <= 0:
            raise ConfigError(f"model: knn_k={knn_k} >= 1, knn_c={knn_c} > 0, cell={cell} > 0 required")
        if reward == "apt" and knn_k >= batch:
            raise ConfigError(f"model.knn_k={knn_k} must be smaller than model.batch={batch} (the kNN runs in a batch)")
        if min(hidden, buffer_size, batch, env_steps) < 1 or warmup < 0 or lr <= 0 or not 0 < tau <= 1:
            raise ConfigError(
                f"model: hidden={hidden}, buffer_size={buffer_size}, batch={batch}, env_steps={env_steps} must be "
                f">= 1, warmup={warmup} >= 0, lr={lr} > 0, tau={tau} in (0, 1]"
            )
        if init_ckpt is not None and init_run is not None:
            raise ConfigError("model.init_ckpt and model.init_run are exclusive: set one (or neither for scratch)")
        if pretrain_steps < 0:
            raise ConfigError(f"model.pretrain_steps={pretrain_steps} must be >= 0 (0: from scratch)")
        if init_run is not None:
            init_ckpt = pretrained_checkpoint(init_run, int(init_seed))
        if init_ckpt is not None and not Path(init_ckpt).is_file():
            raise CheckpointError(f"model.init_ckpt={init_ckpt}: no such checkpoint file")
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.init_ckpt, self.gamma, self.tau, self.lr = init_ckpt, gamma, tau, lr
        self.noise, self.noise_clip, self.batch, self.warmup = noise, noise_clip, batch, warmup
        self.buffer_size, self.env_steps, self.eval_episodes = buffer_size, env_steps, eval_episodes
        self.reward, self.knn_k, self.knn_c, self.double_q = reward, knn_k, knn_c, double_q
        self.eval_metric, self.eval_steps, self.cell = eval_metric, eval_steps, cell
        self.knn_rms, self.save_replay = knn_rms, bool(save_replay)
        # pre-training updates the actor starts from (None: scratch); in-process only without a checkpoint
        self.pretrain_steps = int(pretrain_steps) if init_ckpt is None and pretrain_steps > 0 else 0
        self.pretrained_steps: float | None = None
        self._built = False
        self.env: Any = None
        self.env_step = 0

    # -- set-up ------------------------------------------------------------------------------------------------------
    def _build(self, obs_dim: int, act_dim: int, pretrain: bool = True) -> None:
        h = self.hparams.hidden
        self.actor = nn.Sequential(mlp(obs_dim, act_dim, h), nn.Tanh()).double()
        self.critic = mlp(obs_dim + act_dim, 1, h).double()
        self.critic2 = mlp(obs_dim + act_dim, 1, h).double() if self.double_q else None
        if self.init_ckpt is not None:
            self._load_actor(self.init_ckpt)
        elif self.pretrain_steps and pretrain:
            self._pretrain(obs_dim, act_dim)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.critic2_target = copy.deepcopy(self.critic2).requires_grad_(False) if self.double_q else None
        # APT's running mean of kNN distances (mean, count), a buffer so that a resumed run keeps its reward scale
        self.register_buffer("rms_state", torch.tensor([0.0, 1e-4], dtype=torch.float64))
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
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
            state = ckpt["state_dict"]
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
        self.pretrained_steps = float(ckpt.get("global_step", 0)) if isinstance(ckpt, dict) else 0.0

    def _pretrain(self, obs_dim: int, act_dim: int) -> None:
        """SEMDICE pre-training in-process (``pretrain_steps`` updates on ``pretrain_data``), then copy its actor.

        The same updates as a ``semdice_deep`` run (:meth:`DeepSemdiceLitModule.update`), without a trainer: a
        smoke test (``debug=...``) runs 2 updates on a 2,000-transition dataset."""
        smoke = self._trainer is not None and smoke_test(self.trainer)
        kwargs = {"seed": int(self.hparams.init_seed), **(self.hparams.pretrain_data or {})}
        if smoke:
            kwargs["num_steps"] = min(int(kwargs.get("num_steps", 20000)), 2000)
        steps = min(self.pretrain_steps, 2) if smoke else self.pretrain_steps
        dm = GymOfflineDataModule(**kwargs)
        dm.setup("fit")
        if (dm.obs_dim, dm.act_dim) != (obs_dim, act_dim):
            raise ConfigError(
                f"model.pretrain_data: {dm.env_id} has states/actions of size {dm.obs_dim}/{dm.act_dim}, the "
                f"fine-tuning task {obs_dim}/{act_dim}"
            )
        with torch.random.fork_rng():
            torch.manual_seed(int(self.hparams.init_seed))
            pre = DeepSemdiceLitModule(
                obs_dim, act_dim, method="semdice", hidden=self.hparams.hidden, lr=self.lr, gamma=self.gamma
            )
            opts = pre.configure_optimizers()
            done = 0
            while done < steps:
                for batch in dm.train_dataloader():
                    losses = pre.update(batch, opts, backward=torch.Tensor.backward, step=done)
                    done += 1
                    if done >= steps:
                        break
        self.actor.load_state_dict(pre.actor.state_dict())
        self.pretrained_steps = float(done)
        log.info(
            "semdice_finetune: pre-trained the actor with SEMDICE for %d updates (dual loss %.4g) on %s",
            done,
            float(losses["dual"].detach()),
            dm.cache_path.name,
        )

    def setup(self, stage: str) -> None:
        if not self._built:
            dm = self.trainer.datamodule
            dm.setup(stage)
            # test-only (`make eval`): the checkpoint brings the actor and its pre-training count (below)
            self._build(dm.obs_dim, dm.act_dim, pretrain=stage == "fit")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["pretrained_steps"] = self.pretrained_steps
        if self._built:  # the replay and its counters: a resumed run keeps what it collected (and replay.npz holds it)
            checkpoint["replay"] = {k: torch.from_numpy(v.copy()) for k, v in self.buf.items()}
            checkpoint["replay_counts"] = torch.tensor([self.size, self.env_step], dtype=torch.int64)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.pretrained_steps = checkpoint.get("pretrained_steps", self.pretrained_steps)
        replay = checkpoint.get("replay")
        if replay is not None and self._built:
            for k, v in replay.items():
                if k in self.buf and tuple(v.shape) == self.buf[k].shape:
                    self.buf[k] = v.numpy().astype(self.buf[k].dtype, copy=True)
            self.size, self.env_step = (int(x) for x in checkpoint["replay_counts"])

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        critics = [*self.critic.parameters(), *(self.critic2.parameters() if self.double_q else [])]
        return [torch.optim.Adam(critics, lr=self.lr), torch.optim.Adam(self.actor.parameters(), lr=self.lr)]

    # -- acting ------------------------------------------------------------------------------------------------------
    def _reset(self, env: Any, seed: int | None = None) -> np.ndarray:
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

    def replay_arrays(self) -> dict[str, np.ndarray]:
        """The replay buffer's transitions, oldest first, as the offline format's float32 arrays :data:`ARRAYS`
        (``obs [N, D]``, ``action [N, A]``, ``next_obs [N, D]``, ``reward [N]``, ``terminated [N]``), ``N =
        min(collected, buffer_size)``."""
        n = min(self.size, self.buffer_size)
        order = (np.arange(n) + self.size) % self.buffer_size if self.size > self.buffer_size else np.arange(n)
        keys = dict(zip(ARRAYS, ("s", "a", "s2", "r", "d"), strict=True))
        return {name: self.buf[k][order].astype(np.float32) for name, k in keys.items()}

    def on_fit_end(self) -> None:
        if not (self.save_replay and self.trainer.is_global_zero and self.trainer.default_root_dir):
            return
        path = Path(self.trainer.default_root_dir) / REPLAY_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **self.replay_arrays())
        tmp.replace(path)  # atomic: a reader never sees a half-written buffer
        log.info("semdice_finetune: wrote the %d replay transitions to %s", min(self.size, self.buffer_size), path)

    def _collect(self) -> None:
        for _ in range(self.env_steps):
            scratch_warmup = self.pretrained_steps is None and self.env_step < self.warmup
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

    def q_min(self, s: torch.Tensor, a: torch.Tensor, target: bool = False) -> torch.Tensor:
        """``Q(s, a)``, or with ``double_q`` the minimum of the two critics (URLB's DDPG)."""
        q = self.q(self.critic_target if target else self.critic, s, a)
        if self.double_q:
            q = torch.minimum(q, self.q(self.critic2_target if target else self.critic2, s, a))
        return q

    def critic_loss(
        self, s: torch.Tensor, a: torch.Tensor, r: torch.Tensor, s2: torch.Tensor, d: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """TD loss of a replay batch and the reward it used: the env's ``r`` (``reward=task``) or APT's particle
        reward of ``s2`` (``reward=apt``, ``r`` ignored); target ``r + gamma (1 - d) Q'(s2, pi'(s2) + smoothing)``,
        ``Q'`` the minimum of the two target critics with ``double_q``, each critic regressed to it."""
        with torch.no_grad():
            if self.reward == "apt":
                r = self.intrinsic_reward(s2)
            eps = (torch.randn_like(a) * self.noise).clamp(-self.noise_clip, self.noise_clip)
            a2 = (self.actor_target(s2) + eps).clamp(-1, 1)
            target = r + self.gamma * (1 - d) * self.q_min(s2, a2, target=True)
        loss = ((self.q(self.critic, s, a) - target) ** 2).mean()
        if self.double_q:
            loss = loss + ((self.q(self.critic2, s, a) - target) ** 2).mean()
        return loss, r

    def intrinsic_reward(self, s2: torch.Tensor) -> torch.Tensor:
        """APT's particle reward of a batch of next states (``reward=apt``), updating the running mean (a smoke
        test's tiny batch uses fewer neighbours)."""
        if s2.shape[0] < 2:
            return torch.zeros(s2.shape[0], dtype=s2.dtype)
        rms = None
        if self.knn_rms:
            rms = ops.RunningMean()
            rms.mean, rms.count = (float(v) for v in self.rms_state)
        r = ops.apt_particle_reward(s2, min(self.knn_k, s2.shape[0] - 1), self.knn_c, rms)
        if rms is not None:
            self.rms_state.copy_(torch.tensor([rms.mean, rms.count], dtype=torch.float64))
        return r

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
        critic_loss, r = self.critic_loss(s, a, r, s2, d)
        if self.reward == "apt":
            self.log("train/intr_reward", r.mean())
        opt_critic.zero_grad()
        self.manual_backward(critic_loss)
        opt_critic.step()
        actor_loss = -self.q_min(s, self.actor(s)).mean()
        opt_actor.zero_grad()
        self.manual_backward(actor_loss)
        opt_actor.step()
        pairs = [(self.critic, self.critic_target), (self.actor, self.actor_target)]
        if self.double_q:
            pairs.append((self.critic2, self.critic2_target))
        with torch.no_grad():
            for net, tgt in pairs:
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
                    obs, r, terminated, truncated, _ = env.step(self.act(s, explore=False).astype(np.float32))
                    s, ret, done = flat_obs(obs).astype(np.float64), ret + float(r), terminated or truncated
                returns.append(ret)
        finally:
            env.close()
        return float(np.mean(returns))

    def coverage(self, episodes: int) -> dict[str, float]:
        """The pre-training check's coverage of the deterministic actor (``eval_metric=coverage``): roll-outs from
        ``env.reset(seed=10_000 + ep)`` with no reset options, as :class:`DeepSemdiceLitModule` scores its actors."""
        env = self.trainer.datamodule.make_env()
        try:
            return state_coverage(self.actor, env, episodes, self.eval_steps, 10_000, self.cell, 6, self.knn_c)
        finally:
            env.close()

    def _evaluate(self, stage: str) -> None:
        if self.eval_metric == "coverage":
            self.log_dict({f"{stage}/{k}": v for k, v in self.coverage(self.eval_episodes).items()}, batch_size=1)
            if stage == "test" and self.size:  # the collected data's own coverage (what an offline learner gets)
                entropy, n_cells = cell_coverage(self.replay_arrays()["next_obs"], self.cell)
                self.log_dict({"test/data_cell_entropy": entropy, "test/data_cells": float(n_cells)}, batch_size=1)
        else:
            self.log(f"{stage}/return", self.evaluate(self.eval_episodes), batch_size=1)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if not self.trainer.sanity_checking:
            self._evaluate("val")
            self.log("val/env_steps", float(self.env_step), batch_size=1)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate("test")
        if self.pretrained_steps is not None:  # the actor started pre-trained: the method's own run
            self.log("test/pretrain_steps", self.pretrained_steps, batch_size=1)
