"""Store the composed Hydra config inside every checkpoint, so evaluation rebuilds the run without guessing."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

CONFIG_KEY = "suite_config_yaml"


class ConfigInCheckpoint(Callback):
    """Adds ``checkpoint["suite_config_yaml"]`` (plain YAML text: safe under ``torch.load(weights_only=True)``).

    The runner (:func:`suite.run.build`) sets :attr:`config_yaml` after composing the config.
    """

    def __init__(self) -> None:
        self.config_yaml: str = ""

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[CONFIG_KEY] = self.config_yaml
