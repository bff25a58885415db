"""Logger factories: wandb that never blocks or fails a run."""

from __future__ import annotations

import netrc
import os
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger


def wandb_mode(mode: str = "auto") -> str:
    """Resolve the wandb mode: ``online`` only if asked for or the user is logged in, else ``offline``.

    ``WANDB_MODE`` wins when set; ``mode='auto'`` looks for an API key (``WANDB_API_KEY`` or a netrc entry).
    """
    env = os.environ.get("WANDB_MODE")
    if env:
        return env
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        rc = netrc.netrc(os.environ.get("NETRC", str(Path.home() / ".netrc")))
        if rc.authenticators("api.wandb.ai"):
            return "online"
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        pass
    return "offline"


def make_wandb_logger(
    save_dir: str,
    project: str,
    group: str | None = None,
    name: str | None = None,
    tags: list[str] | None = None,
    mode: str = "auto",
    **kwargs: Any,
) -> Logger | None:
    """Build a :class:`WandbLogger`; on any failure warn and return ``None`` (the CSV logger still records).

    Args:
        save_dir: Run folder; wandb writes ``<save_dir>/wandb/offline-run-*/run-*.wandb`` there.
        project: wandb project.
        group: Run group (the paper's slug), so dashboards compare a paper's methods side by side.
        name: Run name.
        tags: Run tags.
        mode: ``auto`` (see :func:`wandb_mode`), ``online``, ``offline`` or ``disabled``.
    """
    resolved = wandb_mode(mode)
    if resolved == "disabled":
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    # Offline never touches the network; online failures must not kill a run.
    os.environ.setdefault("WANDB_INIT_TIMEOUT", "30")
    try:
        from lightning.pytorch.loggers import WandbLogger

        Path(save_dir).mkdir(parents=True, exist_ok=True)
        logger = WandbLogger(
            save_dir=save_dir,
            project=project,
            group=group,
            name=name,
            tags=list(tags or []),
            offline=resolved == "offline",
            **kwargs,
        )
        _ = logger.experiment  # start the run now, so a failure is caught here
        return logger
    except Exception as err:  # noqa: BLE001 - wandb must never fail a run
        message = f"wandb disabled for this run ({type(err).__name__}: {err}); CSV logs are still written."
        warnings.warn(message, stacklevel=2)
        return None
