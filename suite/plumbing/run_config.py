"""Store the composed Hydra config inside every checkpoint, so evaluation rebuilds the run without guessing."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from omegaconf import DictConfig, ListConfig, OmegaConf

CONFIG_KEY = "suite_config_yaml"
_PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def weights_only_safe(value: Any) -> Any:
    """``value`` with OmegaConf containers turned into plain dicts/lists and any other object (a partial, a module)
    into its ``repr``, so ``torch.load(weights_only=True)`` can read it."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {str(k): weights_only_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return (
            type(value)(weights_only_safe(v) for v in value)
            if isinstance(value, list)
            else [weights_only_safe(v) for v in value]
        )
    return value if isinstance(value, _PLAIN) else repr(value)


def without_omegaconf(value: Any) -> Any:
    """``value`` with every OmegaConf container (at any depth) turned into a plain dict/list; nothing else changes."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {k: without_omegaconf(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(without_omegaconf(v) for v in value)
    return value


class ConfigInCheckpoint(Callback):
    """Adds ``checkpoint["suite_config_yaml"]`` (plain YAML text) and makes the saved hyper-parameters plain data,
    so every suite checkpoint loads with ``torch.load(weights_only=True)`` whatever a module passed to
    ``save_hyperparameters``.

    The runner (:func:`suite.build.build`) sets :attr:`config_yaml` after composing the config.
    """

    def __init__(self) -> None:
        self.config_yaml: str = ""

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[CONFIG_KEY] = self.config_yaml
        for key in list(checkpoint):  # e.g. a module's own on_save_checkpoint state holding a ListConfig
            if key != "state_dict":
                checkpoint[key] = without_omegaconf(checkpoint[key])
        for key in ("hyper_parameters", "datamodule_hyper_parameters"):
            if key in checkpoint:
                checkpoint[key] = weights_only_safe(checkpoint[key])
