"""Reward-free offline datasets generated from gymnasium environments (PointMaze from gymnasium-robotics, MuJoCo).

No offline RL dataset ships with a package here (minari downloads from a hub, d4rl needs the old gym), so the
suite generates its own (DATA.md section 9): ``num_steps`` transitions of a behaviour policy, cached as an ``.npz``
in ``data_dir`` (arrays ``obs``, ``action``, ``next_obs``, ``reward``, ``terminated``; one row per transition).

* ``policy=random``: uniform actions in the action box;
* ``policy=sticky``: a scripted explorer that repeats one uniform random action for ``repeat`` steps (temporally
  correlated motion, so the data reach farther than white-noise actions do);
* ``policy=eps_sticky``: ``sticky`` with probability ``1 - epsilon``, uniform otherwise.

PointMaze observations are the ``observation`` entry of the dict (x, y, vx, vy); the goal entries are dropped
(pre-training is reward-free). Episodes are ``episode_steps`` long. ``source=real`` reads a user ``.npz`` with the
same arrays from ``data_dir/filename``. ``path`` reads one ``.npz`` in that format from anywhere instead: the replay
buffer an online run wrote (``<run>/replay.npz``, ``model.save_replay=true`` of
``lightning_modules/semdice/finetune.py``), so that an offline learner trains on exactly the transitions an online
one collected. :meth:`make_env` builds the environment for evaluation roll-outs. :func:`cell_coverage` is the
coverage of a set of states (the data's own, logged by the learners beside their actor's).
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules._base import SuiteDataModule, require_files, split_indices

POLICIES = ("random", "sticky", "eps_sticky")
ARRAYS = ("obs", "action", "next_obs", "reward", "terminated")


def make_env(env_id: str, **kwargs: Any) -> Any:
    """``gymnasium.make(env_id)`` with gymnasium-robotics registered for maze ids; a missing package or unknown id is
    one :class:`ConfigError` line naming what to install."""
    robotics = env_id.startswith(("PointMaze", "AntMaze", "Fetch", "Adroit", "HandManipulate"))
    try:
        import gymnasium as gym
    except ImportError:
        raise ConfigError("env_id needs gymnasium: pip install 'gymnasium[mujoco]==1.4.0'") from None
    if robotics:
        try:
            import gymnasium_robotics
        except ImportError:
            raise ConfigError(
                f"env_id={env_id!r} needs gymnasium-robotics: pip install gymnasium-robotics==1.4.2"
            ) from None
        gym.register_envs(gymnasium_robotics)
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as err:
        raise ConfigError(f"env_id={env_id!r}: {err} (pip install 'gymnasium[mujoco]==1.4.0')") from None
    except gym.error.Error as err:
        hint = "gymnasium-robotics==1.4.2" if robotics else "'gymnasium[mujoco]==1.4.0'"
        raise ConfigError(f"env_id={env_id!r} is not installed here ({err}); pip install {hint}") from None


def cell_coverage(states: np.ndarray, cell: float) -> tuple[float, int]:
    """Entropy (nats) and number of the visited ``cell``-sized squares of the first two coordinates of ``states``
    ``[N, D]`` (the (x, y) position in PointMaze): the histogram the coverage checks score."""
    cells = np.floor(np.asarray(states)[:, :2] / cell).astype(np.int64)
    _, counts = np.unique(cells, axis=0, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum()), int(len(counts))


def flat_obs(obs: Any) -> np.ndarray:
    """The state vector of an observation (the ``observation`` entry of goal-conditioned dict observations)."""
    return np.asarray(obs["observation"] if isinstance(obs, dict) else obs, dtype=np.float32)


class BehaviourPolicy:
    """The behaviour policy of the generated data (see the module docstring): ``act(t)`` is the action at step ``t``
    of the roll-out (``sticky`` draws a new uniform action every ``repeat`` steps and holds it)."""

    def __init__(
        self,
        policy: str,
        low: np.ndarray,
        high: np.ndarray,
        rng: np.random.Generator,
        repeat: int = 10,
        epsilon: float = 0.2,
    ) -> None:
        if policy not in POLICIES:
            raise ConfigError(f"data.policy={policy!r} must be one of {list(POLICIES)}")
        self.policy, self.low, self.high, self.rng, self.repeat, self.epsilon = policy, low, high, rng, repeat, epsilon
        self.held = rng.uniform(low, high)

    def act(self, t: int) -> np.ndarray:
        if self.policy == "random" or (self.policy == "eps_sticky" and self.rng.random() < self.epsilon):
            return self.rng.uniform(self.low, self.high)
        if t % self.repeat == 0:
            self.held = self.rng.uniform(self.low, self.high)
        return self.held


def generate(
    env_id: str, policy: str, num_steps: int, episode_steps: int, seed: int, repeat: int = 10, epsilon: float = 0.2
) -> dict[str, np.ndarray]:
    """Roll out ``num_steps`` transitions of the behaviour policy (see the module docstring)."""
    env = make_env(env_id, max_episode_steps=episode_steps)
    rng = np.random.default_rng(seed)
    behaviour = BehaviourPolicy(policy, env.action_space.low, env.action_space.high, rng, repeat, epsilon)
    out: dict[str, list] = {k: [] for k in ARRAYS}
    obs, _ = env.reset(seed=seed)
    for t in range(num_steps):
        action = behaviour.act(t)
        nxt, reward, terminated, truncated, _ = env.step(action.astype(np.float32))
        out["obs"].append(flat_obs(obs))
        out["action"].append(action.astype(np.float32))
        out["next_obs"].append(flat_obs(nxt))
        out["reward"].append(np.float32(reward))
        out["terminated"].append(np.float32(terminated))
        obs = nxt
        if terminated or truncated:
            obs, _ = env.reset(seed=int(rng.integers(2**31)))
    env.close()
    return {k: np.stack(v) for k, v in out.items()}


class GymOfflineDataModule(SuiteDataModule):
    """Transitions ``(obs, action, next_obs, reward, terminated)`` of a generated (or user) offline dataset.

    Args:
        env_id: A gymnasium id (``PointMaze_UMaze-v3``, ``HalfCheetah-v5``, ...).
        policy: Behaviour policy of the generated data, one of :data:`POLICIES`.
        num_steps: Transitions to generate.
        episode_steps: Episode length of the generated data (and of evaluation roll-outs).
        repeat: Steps an action is held by the ``sticky`` policies.
        epsilon: Uniform-action probability of ``eps_sticky``.
        val_fraction: Held-out transitions (validation loss).
        filename: ``source=real``: the ``.npz`` under ``data_dir``; ``embedded``: ``null`` = an automatic cache name.
        path: An ``.npz`` of transitions (the arrays :data:`ARRAYS`) to read instead of generating or reading
            ``data_dir``, e.g. an online run's ``<run>/replay.npz``; ``null``: off. A missing file is a
            :class:`MissingDataError`, a malformed one a :class:`DataFormatError` (one line each).
        source, data_dir, batch_size, num_workers, seed: see :class:`SuiteDataModule`.
    """

    def __init__(
        self,
        env_id: str = "PointMaze_UMaze-v3",
        policy: str = "sticky",
        num_steps: int = 20000,
        episode_steps: int = 500,
        repeat: int = 10,
        epsilon: float = 0.2,
        val_fraction: float = 0.05,
        filename: str | None = None,
        path: str | None = None,
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 1024,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(source=source, data_dir=data_dir, batch_size=batch_size, num_workers=num_workers, seed=seed)
        if policy not in POLICIES:
            raise ConfigError(f"data.policy={policy!r} must be one of {list(POLICIES)}")
        if num_steps < 2 or episode_steps < 1 or repeat < 1 or not 0 <= epsilon <= 1 or not 0 < val_fraction < 1:
            raise ConfigError(
                f"data.num_steps={num_steps} (>= 2), episode_steps={episode_steps} (>= 1), repeat={repeat} (>= 1), "
                f"epsilon={epsilon} (in [0, 1]), val_fraction={val_fraction} (in (0, 1)) out of range"
            )
        if source == "real" and not filename and not path:
            raise ConfigError("data.filename must name the .npz under data.data_dir when data.source=real")
        self.env_id, self.policy, self.num_steps, self.episode_steps = env_id, policy, num_steps, episode_steps
        self.repeat, self.epsilon, self.val_fraction, self.filename = repeat, epsilon, val_fraction, filename
        self.path = str(path) if path else None
        self.obs_dim = self.act_dim = 0
        self.states: np.ndarray | None = None  # every transition's next state [N, D], once read (the data's coverage)

    def make_env(self) -> Any:
        return make_env(self.env_id, max_episode_steps=self.episode_steps)

    def behaviour_policy(self, env: Any, seed: int) -> BehaviourPolicy:
        """The data's behaviour policy acting in ``env`` (the ``data`` floor of the coverage check)."""
        if self.path:
            raise ConfigError(
                f"data.path={self.path}: read transitions have no behaviour policy to roll out "
                "(model.eval_policy=behaviour needs generated data: data.path=null)"
            )
        rng = np.random.default_rng(seed)
        return BehaviourPolicy(self.policy, env.action_space.low, env.action_space.high, rng, self.repeat, self.epsilon)

    @property
    def cache_path(self) -> Path:
        name = self.filename or f"{self.env_id}_{self.policy}_{self.num_steps}_r{self.repeat}_s{self.seed}.npz"
        return Path(self.data_dir) / name

    def prepare_data(self) -> None:
        if self.source == "embedded" and not self.path and not self.cache_path.exists():
            arrays = generate(
                self.env_id, self.policy, self.num_steps, self.episode_steps, self.seed, self.repeat, self.epsilon
            )
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_path.with_suffix(".tmp.npz")
            np.savez(tmp, **arrays)
            tmp.replace(self.cache_path)  # atomic: a killed run never leaves a truncated cache

    def _read(self, path: Path) -> dict[str, Any]:
        try:
            with np.load(path) as f:
                missing = [k for k in ARRAYS if k not in f.files]
                if missing:
                    raise DataFormatError(f"{path}: missing array(s) {missing} (needs {list(ARRAYS)})")
                arrays = {k: torch.from_numpy(np.asarray(f[k], dtype=np.float32)) for k in ARRAYS}
        except DataFormatError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError) as err:
            msg = " ".join(str(err).split())[:200]
            raise DataFormatError(f"{path}: not a readable .npz ({type(err).__name__}: {msg})") from None
        flat = any(a.ndim == 0 for a in arrays.values())
        if flat or arrays["obs"].ndim != 2 or arrays["action"].ndim != 2 or arrays["obs"].shape[0] < 2:
            raise DataFormatError(
                f"{path}: needs >= 2 transitions with obs [N, D] and action [N, A] (got obs "
                f"{list(arrays['obs'].shape)}, action {list(arrays['action'].shape)})"
            )
        n = arrays["obs"].shape[0]
        bad = [k for k in ARRAYS if arrays[k].shape[0] != n]
        if bad or arrays["obs"].shape != arrays["next_obs"].shape:
            raise DataFormatError(f"{path}: arrays {bad or ['next_obs']} do not have one row per transition ({n})")
        if not all(torch.isfinite(a).all() for a in arrays.values()):
            raise DataFormatError(f"{path}: non-finite values")
        self.obs_dim, self.act_dim = int(arrays["obs"].shape[1]), int(arrays["action"].shape[1])
        self.states = arrays["next_obs"].numpy()
        ds = TensorDataset(*(arrays[k] for k in ARRAYS))
        val_idx, train_idx = split_indices(n, [self.val_fraction, 1 - self.val_fraction], self.seed)
        sub = lambda idx: TensorDataset(*(t[idx] for t in ds.tensors))  # noqa: E731
        return {"train": sub(train_idx), "val": sub(val_idx), "test": sub(val_idx)}

    def _read_path(self) -> dict[str, Any]:
        path = Path(self.path)
        if not path.is_file():
            raise MissingDataError(
                f"data.path={self.path}: no such file (an online run with model.save_replay=true writes "
                "<run>/replay.npz when it ends: run it first)"
            )
        return self._read(path)

    def load_embedded(self) -> dict[str, Any]:
        if self.path:
            return self._read_path()
        self.prepare_data()
        return self._read(self.cache_path)

    def load_real(self) -> dict[str, Any]:
        if self.path:
            return self._read_path()
        (path,) = require_files(self.data_dir, [self.filename], f"Write an .npz with arrays {list(ARRAYS)}.")
        return self._read(path)


class GymOnlineDataModule(SuiteDataModule):
    """An environment for online RL (downstream fine-tuning): the learner steps it itself; the loaders only pace
    training (``steps_per_epoch`` dummy batches per epoch, one dummy validation/test batch).

    Args:
        env_id: A gymnasium id with a task reward (``PointMaze_UMazeDense-v3``: dense ``exp(-distance to goal)``).
        episode_steps: Episode length.
        steps_per_epoch: Training steps (each ``env_steps`` environment steps + one update) per epoch.
        goal_cell: Fixed goal cell ``[row, col]`` of a maze (the reward-free pre-trained actor sees no goal, so the
            downstream task fixes it); ``null`` for non-maze tasks.
        reset_cell: Fixed start cell of a maze, or ``null``.
        source, data_dir, batch_size, num_workers, seed: see :class:`SuiteDataModule` (``source`` must be
            ``embedded``: the environment is the data).
    """

    def __init__(
        self,
        env_id: str = "PointMaze_UMazeDense-v3",
        episode_steps: int = 300,
        steps_per_epoch: int = 500,
        goal_cell: list[int] | None = None,
        reset_cell: list[int] | None = None,
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 1,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(source=source, data_dir=data_dir, batch_size=batch_size, num_workers=num_workers, seed=seed)
        if source != "embedded":
            raise ConfigError(f"data.source={source!r}: an online environment has no real-format files (use embedded)")
        if episode_steps < 1 or steps_per_epoch < 1:
            raise ConfigError(f"data.episode_steps={episode_steps}, steps_per_epoch={steps_per_epoch} must be >= 1")
        self.env_id, self.episode_steps, self.steps_per_epoch = env_id, episode_steps, steps_per_epoch
        self.reset_options = {
            k: np.asarray(v) for k, v in (("goal_cell", goal_cell), ("reset_cell", reset_cell)) if v is not None
        }
        self.obs_dim = self.act_dim = 0

    def make_env(self) -> Any:
        return make_env(self.env_id, max_episode_steps=self.episode_steps)

    def load_embedded(self) -> dict[str, Any]:
        env = self.make_env()
        obs, _ = env.reset(seed=self.seed, options=self.reset_options or None)
        self.obs_dim, self.act_dim = int(flat_obs(obs).shape[0]), int(env.action_space.shape[0])
        env.close()
        one = TensorDataset(torch.zeros(1))
        return {"train": TensorDataset(torch.zeros(self.steps_per_epoch)), "val": one, "test": one}
