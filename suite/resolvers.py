"""OmegaConf resolvers used by the configs (registered on import of ``train``/``evaluate``)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from suite.loggers import run_name, run_tags, task_overrides


def gpus_per_node(accelerator: str, devices: int | str) -> int:
    """SLURM GPUs per node: one per Lightning device on GPU runs, none on CPU runs."""
    return int(devices) if str(accelerator) in ("gpu", "cuda") else 0


def checkpoint_slug(ckpt_path: str | None) -> str:
    """The experiment slug of a checkpoint, for ``make eval``'s run folder (``logs/eval/<slug>/runs/...``).

    Read from the ``config.yaml`` of the run folder the checkpoint lives in (``<run>/checkpoints/x.ckpt``), else
    from the config stored inside the checkpoint (loaded weights-only); ``checkpoint`` when neither can be read
    (the evaluation itself then reports what is wrong with the file, in one line).
    """
    import yaml

    if not ckpt_path or str(ckpt_path) in ("???", "null", "None"):
        return "checkpoint"
    path = Path(str(ckpt_path))
    for folder in list(path.parents)[:2]:
        cfg_file = folder / "config.yaml"
        if cfg_file.is_file():
            try:
                slug = (yaml.safe_load(cfg_file.read_text()) or {}).get("experiment_slug")
            except (OSError, yaml.YAMLError):
                slug = None
            if slug:
                return str(slug)
    try:
        import torch

        saved = torch.load(path, map_location="cpu", weights_only=True).get("suite_config_yaml", "")
        slug = (yaml.safe_load(saved) or {}).get("experiment_slug")
        return str(slug) if slug else "checkpoint"
    except Exception:  # noqa: BLE001 - only names a folder; evaluate() reports a bad file properly
        return "checkpoint"


def wandb_run_name(slug: str, seed: object) -> str:
    """``run_name``: ``<slug>-<overrides that change the run>-s<seed>`` (:func:`suite.loggers.run_name`)."""
    return run_name(slug, seed, task_overrides())


def wandb_run_tags(slug: str, experiment_tags: object, tags: object) -> list[str]:
    """``run_tags``: slug, experiment tags, override tags and the user's ``tags`` (:func:`suite.loggers.run_tags`)."""
    return run_tags(slug, experiment_tags, task_overrides(), tags)


def register() -> None:
    if not OmegaConf.has_resolver("wandb_run_name"):
        OmegaConf.register_new_resolver("wandb_run_name", wandb_run_name)
    if not OmegaConf.has_resolver("wandb_run_tags"):
        OmegaConf.register_new_resolver("wandb_run_tags", wandb_run_tags)
    if not OmegaConf.has_resolver("gpus_per_node"):
        OmegaConf.register_new_resolver("gpus_per_node", gpus_per_node)
    if not OmegaConf.has_resolver("checkpoint_slug"):
        OmegaConf.register_new_resolver("checkpoint_slug", checkpoint_slug)


register()
