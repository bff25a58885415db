"""OmegaConf resolvers used by the configs (registered on import of ``train``/``evaluate``)."""

from __future__ import annotations

from omegaconf import OmegaConf


def gpus_per_node(accelerator: str, devices: int | str) -> int:
    """SLURM GPUs per node: one per Lightning device on GPU runs, none on CPU runs."""
    return int(devices) if str(accelerator) in ("gpu", "cuda") else 0


def register() -> None:
    if not OmegaConf.has_resolver("gpus_per_node"):
        OmegaConf.register_new_resolver("gpus_per_node", gpus_per_node)


register()
