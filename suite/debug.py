"""Debug modes (``debug=fdr|limit|overfit``): what a module or callback may skip to keep them quick."""

from __future__ import annotations

from typing import Any


def smoke_test(trainer: Any) -> bool:
    """Whether this run is a smoke test of the pipeline: ``fast_dev_run`` or any ``debug=`` mode.

    Modules and callbacks with heavy post-hoc work (quantization calibration, counterfactual search, Hessians) run
    it in a reduced form then. ``suite.run.build`` sets ``trainer.suite_smoke`` from the config key ``smoke``,
    which every ``conf/debug/*.yaml`` sets.
    """
    return bool(getattr(trainer, "fast_dev_run", False)) or bool(getattr(trainer, "suite_smoke", False))
