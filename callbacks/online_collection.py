"""Online data collection for learners that refresh their dataset between optimisation rounds (tabular RL).

Before every training batch the callback asks the module for its current policy, has the datamodule roll out
one more trajectory with the epsilon-soft version of it (``epsilon = 1 / (i + 1)`` before trajectory ``i``, so the
first one is uniform), then tells the module that the data changed. It needs only this duck-typed protocol, no
paper's module:

* datamodule: ``collect(policy, epsilon)`` and ``num_collected`` (trajectories so far);
* module: ``behaviour_policy() -> Tensor [S, A]`` and ``refresh_data(datamodule)``.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from core.errors import ConfigError


class OnlineDataCollection(Callback):
    """Collect one trajectory per training batch with the module's epsilon-soft policy, then refresh its data.

    Args:
        epsilon_power: ``epsilon_i = 1 / (i + 1) ** epsilon_power`` (1: the paper's schedule).
    """

    def __init__(self, epsilon_power: float = 1.0) -> None:
        if epsilon_power < 0:
            raise ConfigError(f"callbacks.online_collection.epsilon_power={epsilon_power} must be >= 0")
        self.epsilon_power = epsilon_power

    def epsilon(self, i: int) -> float:
        return 1.0 / (i + 1) ** self.epsilon_power

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        dm = trainer.datamodule
        if not hasattr(dm, "collect") or not hasattr(pl_module, "behaviour_policy"):
            raise ConfigError(
                "callbacks.online_collection needs a datamodule with collect() and a module with behaviour_policy()"
            )
        dm.collect(pl_module.behaviour_policy(), self.epsilon(dm.num_collected))
        pl_module.refresh_data(dm)
