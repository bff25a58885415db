"""Evaluate a checkpoint: ``python -m evaluate ckpt_path=<file>``; the model is rebuilt from its saved config."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

import suite.resolvers  # noqa: F401 - registers the config resolvers
from suite.cli import run_main, user_errors


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
def main(cfg: DictConfig) -> None:
    from suite.run import evaluate

    with user_errors():
        evaluate(cfg)


if __name__ == "__main__":
    run_main(main)
