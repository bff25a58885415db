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
        if cfg.get("print_config"):
            from suite.config_tree import print_config_tree

            print_config_tree(cfg)
        if cfg.get("optimized_metric"):
            from suite.sweeps import in_search, run_trial

            if in_search(cfg):  # a trial of `hparams_search=...`: its objective, None when it failed
                return run_trial(cfg, train)
        metrics = train(cfg)
    # Returned for Hydra sweepers that optimise a metric.
    return metrics.get(cfg.get("optimized_metric", ""), None)


if __name__ == "__main__":
    from suite.sweeps import no_completed_trial_is_one_line

    with no_completed_trial_is_one_line():
        run_main(main, resume=True)
