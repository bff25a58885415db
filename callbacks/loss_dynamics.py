"""Per-example training-loss trajectories ("loss dynamics"), for any classification LightningModule.

After every ``every_n_epochs``-th training epoch the callback runs the model in eval mode over the *un-augmented*
training set and stores each example's cross-entropy loss (or its correct-class probability) in a preallocated
``[N, capacity]`` matrix: memory is bounded by ``N * capacity`` numbers whatever the run length (recording stops
when the matrix is full). Under DDP each rank scores its shard and the ``(index, value)`` pairs are all-gathered
and scattered by example index, so every rank holds the same full matrix, the one-process matrix up to float
rounding (a row the padded last shard scores twice is written twice with the same value); rank zero writes the file
(``tests/callbacks/test_callbacks_ddp.py``, ``tests/callbacks/test_loss_dynamics.py``).

Contract (:func:`callbacks.contracts.loss_dynamics_problems`, checked at ``setup`` with one
:class:`~core.errors.ConfigError` line naming what is missing): the model's ``forward(x)`` returns logits
``[B, K]``; the datamodule provides ``dynamics_dataloader()`` with batches ``(x, y, index)``, ``index`` the example's
row in ``[0, N)`` (preferred: it can name rows the training loader leaves out, as ``PoisonedDataModule`` does), or
else a map-style ``train`` split with items ``(x, y)``, which is scored in its fixed order with each item's row as its
index (as the dataset returns it: a dataset that augments in ``__getitem__`` should provide ``dynamics_dataloader``).
With ``save`` the matrix is written to ``<default_root_dir>/loss_dynamics.pt`` at the end of fitting
(``{"values": [N, E], "epochs": [E]}``, loadable with ``torch.load(..., weights_only=True)``); ``save_attrs`` adds
the named datamodule attributes under ``"data"`` (tensors, lists, numbers: e.g. a poisoned set's ``poison_attack``,
``probe_kind``, so that a detector can score the matrix offline without rebuilding the data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader

from callbacks.contracts import dynamics_loader, loss_dynamics_problems, refuse
from core.errors import ConfigError, DataFormatError

METRICS = ("loss", "prob")


def example_values(logits: torch.Tensor, y: torch.Tensor, metric: str) -> torch.Tensor:
    """Per-example cross-entropy (``loss``) or softmax probability of the label (``prob``). ``[B, K], [B] -> [B]``."""
    if metric == "loss":
        return F.cross_entropy(logits.float(), y, reduction="none")
    return torch.softmax(logits.float(), dim=-1).gather(1, y[:, None]).squeeze(1)


def _plain(v: Any) -> Any:
    """A value ``torch.load(weights_only=True)`` can read back: tensors (on CPU), lists, numbers, strings."""
    if isinstance(v, torch.Tensor):
        return v.detach().cpu()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


class LossDynamics(Callback):
    """Record every training example's loss (or correct-class probability) each epoch.

    Args:
        metric: ``loss`` (cross-entropy) or ``prob`` (probability of the labelled class).
        capacity: Most epochs kept (columns of the matrix); later epochs are not recorded.
        every_n_epochs: Record after every n-th epoch.
        enabled: Start recording (a module may switch it off, e.g. once a defence has what it needs).
        dtype: Storage dtype (``float32`` or ``float16`` to halve memory).
        save: Write the recorded matrix to ``<default_root_dir>/loss_dynamics.pt`` when fitting ends.
        save_attrs: Datamodule attributes written beside it (``"data"``: name -> value); a missing one is a
            :class:`~core.errors.ConfigError` at the end of fit.

    Attributes:
        trajectories: ``[N, recorded]`` values, row = example index (``None`` before the first record).
        epochs: the training epoch of each recorded column.
    """

    def __init__(
        self,
        metric: str = "loss",
        capacity: int = 100,
        every_n_epochs: int = 1,
        enabled: bool = True,
        dtype: str = "float32",
        save: bool = True,
        save_attrs: list[str] | tuple[str, ...] = (),
    ) -> None:
        if metric not in METRICS:
            raise ConfigError(f"callbacks.loss_dynamics.metric={metric!r} must be one of {list(METRICS)}")
        if capacity < 1:
            raise ConfigError(f"callbacks.loss_dynamics.capacity={capacity} must be >= 1")
        if every_n_epochs < 1:
            raise ConfigError(f"callbacks.loss_dynamics.every_n_epochs={every_n_epochs} must be >= 1")
        if dtype not in ("float32", "float16"):
            raise ConfigError(f"callbacks.loss_dynamics.dtype={dtype!r} must be 'float32' or 'float16'")
        self.metric, self.capacity, self.every_n_epochs, self.enabled = metric, capacity, every_n_epochs, enabled
        self.dtype, self.save, self.save_attrs = getattr(torch, dtype), save, tuple(save_attrs)
        self._values: torch.Tensor | None = None
        self.epochs: list[int] = []

    @property
    def trajectories(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, : len(self.epochs)]

    def reset(self) -> None:
        self._values, self.epochs = None, []

    @staticmethod
    def contract_problems(module: nn.Module, datamodule: Any = None, probe: bool = True) -> list[str]:
        """What ``module`` / ``datamodule`` lack for loss dynamics (empty: they meet the contract); no Trainer needed.
        See :func:`callbacks.contracts.loss_dynamics_problems`."""
        return loss_dynamics_problems(module, datamodule, probe=probe)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit" and self.enabled:
            refuse("callbacks.loss_dynamics", self.contract_problems(pl_module, trainer.datamodule))

    @staticmethod
    def _loader(trainer: Trainer) -> DataLoader:
        if trainer.datamodule is None:
            raise ConfigError("callbacks.loss_dynamics needs a datamodule (dynamics_dataloader() or a train split)")
        return dynamics_loader(trainer.datamodule)

    @torch.no_grad()
    def record(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Score the whole training set with the current model and append one column."""
        loader = self._loader(trainer)
        n = len(loader.dataset)
        if self._values is None:
            self._values = torch.full((n, self.capacity), float("nan"), dtype=self.dtype)
        elif self._values.shape[0] != n:
            raise DataFormatError(f"LossDynamics: training set has {n} rows, {self._values.shape[0]} before")
        was_training = pl_module.training
        pl_module.eval()
        idx_parts, val_parts = [], []
        for batch in loader:
            if len(batch) < 3:
                raise DataFormatError("LossDynamics: batches must be (x, y, index); the dataset returns no index")
            x, y, idx = batch[0], batch[1], batch[2]
            x, y = move_data_to_device(x, pl_module.device), y.to(pl_module.device)
            val_parts.append(example_values(pl_module(x), y, self.metric))
            idx_parts.append(torch.as_tensor(idx, device=pl_module.device).long())
        pl_module.train(was_training)
        idx = torch.cat(idx_parts) if idx_parts else torch.zeros(0, dtype=torch.long, device=pl_module.device)
        val = torch.cat(val_parts) if val_parts else torch.zeros(0, device=pl_module.device)
        if trainer.world_size > 1:
            # Shards have equal length (the sampler pads), so all_gather stacks [W, n_local].
            idx = pl_module.all_gather(idx).reshape(-1)
            val = pl_module.all_gather(val).reshape(-1)
        col = len(self.epochs)
        self._values[idx.cpu(), col] = val.cpu().to(self.dtype)
        self.epochs.append(trainer.current_epoch)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.enabled or trainer.sanity_checking or len(self.epochs) >= self.capacity:
            return
        if (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self.record(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.save and self._values is not None and trainer.is_global_zero and trainer.default_root_dir:
            path = Path(trainer.default_root_dir) / "loss_dynamics.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            state = self.state_dict()
            if self.save_attrs:
                missing = [a for a in self.save_attrs if not hasattr(trainer.datamodule, a)]
                if missing:
                    raise ConfigError(f"callbacks.loss_dynamics.save_attrs: the datamodule has no {missing}")
                state["data"] = {a: _plain(getattr(trainer.datamodule, a)) for a in self.save_attrs}
            torch.save(state, path)

    def state_dict(self) -> dict[str, Any]:
        return {"values": self.trajectories, "epochs": torch.tensor(self.epochs, dtype=torch.long)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        values, self.epochs = state_dict.get("values"), [int(e) for e in state_dict.get("epochs", [])]
        if values is None:
            self._values = None
            return
        self._values = torch.full((values.shape[0], self.capacity), float("nan"), dtype=self.dtype)
        self._values[:, : values.shape[1]] = values.to(self.dtype)
