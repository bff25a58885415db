"""Train/evaluate one experiment: ``python -m train experiment=<slug> [overrides]`` (``make train METHOD=<slug>``)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

import suite.resolvers  # noqa: F401 - registers the config resolvers
from suite.cli import run_main, user_errors


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from suite.run import train  # heavy imports after Hydra has parsed the command line

    with user_errors():
        metrics = train(cfg)
    # Returned for Hydra sweepers that optimise a metric.
    return metrics.get(cfg.get("optimized_metric", ""), None)


if __name__ == "__main__":
    run_main(main, resume=True)
