"""A tabular MDP whose dataset grows online: trajectories collected by the learner's own (epsilon-soft) policy.

The embedded default is the SEMDICE paper's random MDP (generated, no network): ``S = 20`` states, ``A = 4``
actions, each ``(s, a)`` moves to ``K = 4`` random successors with ``Dirichlet(1)`` probabilities, ``p0`` =
one-hot(state 0), ``gamma = 0.95``. It tests the paper's claim directly: the paper's tabular study runs on exactly
this family of MDPs. ``source=real`` reads any tabular MDP from ``<data_dir>/<filename>``, an ``.npz`` with ``T``
``[S, A, S]`` and ``p0`` ``[S]``.

The dataset is the transition-count tensor ``N [S, A, S]`` of the trajectories collected so far (the sufficient
statistic of every method here: the MLE model, ``d_D(s, a)``, state counts). :meth:`collect` rolls out one
trajectory of ``horizon`` steps from ``p0`` in the TRUE MDP with the given policy (the data-collection callback
calls it). The counts are part of the checkpoint (:meth:`state_dict`), so a resumed run continues the same data.

Loaders: one training "batch" per trajectory round (``trajectories_per_epoch`` per epoch), each a dummy index;
the learner reads the counts, not the batch. Validation and test are one dummy batch each.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from core.errors import ConfigError, DataFormatError
from datamodules._base import SuiteDataModule, require_files
from ops.semdice import tabular as tb


class TabularMDPDataModule(SuiteDataModule):
    """Random tabular MDP (embedded) or an ``.npz`` MDP (real) plus the online trajectory counts.

    Args:
        num_states: ``S`` of the generated MDP (the real file sets its own).
        num_actions: ``A`` of the generated MDP.
        num_successors: ``K`` successor states per ``(s, a)``.
        concentration: Dirichlet concentration of the successor probabilities.
        gamma: Discount in (0, 1) (the learners read it from here).
        horizon: Steps per collected trajectory (100 in the paper).
        trajectories_per_epoch: Trajectory rounds (training steps) per epoch; validation runs after each epoch.
        filename: The real MDP file under ``data_dir``.
        source, data_dir, batch_size, num_workers, seed: see :class:`SuiteDataModule` (``seed`` also picks the
            random MDP and the roll-out randomness).
    """

    def __init__(
        self,
        num_states: int = 20,
        num_actions: int = 4,
        num_successors: int = 4,
        concentration: float = 1.0,
        gamma: float = 0.95,
        horizon: int = 100,
        trajectories_per_epoch: int = 10,
        filename: str = "mdp.npz",
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 1,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(source=source, data_dir=data_dir, batch_size=batch_size, num_workers=num_workers, seed=seed)
        tb.check_gamma(gamma, "data.gamma")
        if horizon < 1 or trajectories_per_epoch < 1:
            raise ConfigError(
                f"data.horizon={horizon} and data.trajectories_per_epoch={trajectories_per_epoch} must be >= 1"
            )
        if concentration <= 0:
            raise ConfigError(f"data.concentration={concentration} must be > 0")
        self.num_states, self.num_actions = num_states, num_actions
        self.num_successors, self.concentration = num_successors, concentration
        self.gamma, self.horizon, self.trajectories_per_epoch = gamma, horizon, trajectories_per_epoch
        self.filename = filename
        self.T: torch.Tensor | None = None
        self.p0: torch.Tensor | None = None
        self.counts: torch.Tensor | None = None
        # the same transitions weighted by gamma^t (t = step within its trajectory): the official baselines' p_s
        self.discounted_counts: torch.Tensor | None = None
        self.num_collected = 0

    # -- the MDP ---------------------------------------------------------------------------------------------------
    def _load_mdp(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.source == "embedded":
            return tb.random_mdp(self.num_states, self.num_actions, self.num_successors, self.concentration, self.seed)
        (path,) = require_files(
            self.data_dir, [self.filename], "Write an .npz with arrays T [S, A, S] and p0 [S] (numpy.savez)."
        )
        try:
            with np.load(path) as f:
                missing = [k for k in ("T", "p0") if k not in f.files]
                if missing:
                    raise DataFormatError(f"{path}: missing array(s) {missing} (needs T [S, A, S] and p0 [S])")
                T, p0 = torch.from_numpy(f["T"]).double(), torch.from_numpy(f["p0"]).double()
        except DataFormatError:
            raise
        except (OSError, ValueError) as err:
            raise DataFormatError(f"{path}: not a readable .npz ({err})") from None
        try:
            tb.check_transition(T, name=f"{path}: T")
            tb.check_distribution(p0, name=f"{path}: p0")
        except ConfigError as err:
            raise DataFormatError(str(err)) from None
        if p0.shape[0] != T.shape[0]:
            raise DataFormatError(f"{path}: p0 has {p0.shape[0]} states, T has {T.shape[0]}")
        return T, p0

    def _datasets(self) -> dict[str, Any]:
        self.T, self.p0 = self._load_mdp()
        self.num_states, self.num_actions = int(self.T.shape[0]), int(self.T.shape[1])
        if self.counts is None or self.counts.shape != self.T.shape:
            self.counts = torch.zeros_like(self.T)
        if self.discounted_counts is None or self.discounted_counts.shape != self.T.shape:
            self.discounted_counts = torch.zeros_like(self.T)
        rounds = TensorDataset(torch.arange(self.trajectories_per_epoch))
        one = TensorDataset(torch.zeros(1))
        return {"train": rounds, "val": one, "test": one}

    def load_embedded(self) -> dict[str, Any]:
        return self._datasets()

    def load_real(self) -> dict[str, Any]:
        return self._datasets()

    # -- online data -----------------------------------------------------------------------------------------------
    def collect(self, policy: torch.Tensor, epsilon: float) -> None:
        """Roll out one ``horizon``-step trajectory from ``p0`` in the true MDP with ``(1 - eps) pi + eps / A`` and add
        its transitions to :attr:`counts`. The randomness depends only on ``(seed, trajectory index)``."""
        if self.T is None:
            self.setup("fit")
        assert self.T is not None and self.p0 is not None and self.counts is not None
        behaviour = tb.epsilon_soft(policy.detach().double().cpu(), epsilon).numpy()
        behaviour = behaviour / behaviour.sum(1, keepdims=True)
        T, p0 = self.T.numpy(), self.p0.numpy()
        rng = np.random.default_rng([int(self.seed), self.num_collected])
        cum_pi, cum_T = np.cumsum(behaviour, 1), np.cumsum(T, 2)
        S, A = self.num_states, self.num_actions
        u = rng.random((self.horizon, 2))
        s = int(min(np.searchsorted(np.cumsum(p0), rng.random(), side="right"), S - 1))
        add, add_discounted = np.zeros((S, A, S)), np.zeros((S, A, S))
        for t in range(self.horizon):
            a = int(min(np.searchsorted(cum_pi[s], u[t, 0], side="right"), A - 1))
            s2 = int(min(np.searchsorted(cum_T[s, a], u[t, 1], side="right"), S - 1))
            add[s, a, s2] += 1
            add_discounted[s, a, s2] += self.gamma**t
            s = s2
        self.counts += torch.from_numpy(add)
        if self.discounted_counts is None:
            self.discounted_counts = torch.zeros_like(self.counts)
        self.discounted_counts += torch.from_numpy(add_discounted)
        self.num_collected += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "counts": None if self.counts is None else self.counts.clone(),
            "discounted_counts": None if self.discounted_counts is None else self.discounted_counts.clone(),
            "num_collected": self.num_collected,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = state.get("counts")
        self.discounted_counts = state.get("discounted_counts")
        self.num_collected = int(state.get("num_collected", 0))
