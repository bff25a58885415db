"""Smoke mode: a run that tests the pipeline (``fast_dev_run`` or any ``debug=`` mode), in which modules and
callbacks with heavy post-hoc work (quantization calibration, counterfactual search, Hessians) run it in a reduced
form.

A ``debug=`` mode says so with a callback: the runner adds ``suite.plumbing.smoke.SmokeMode`` (a
:class:`SmokeMarker`) to the trainer's callbacks when the config sets ``smoke: true`` (every ``conf/debug/*.yaml``
does). Modules and callbacks ask :func:`smoke_test`, never the trainer directly.
"""

from __future__ import annotations

from typing import Any


class SmokeMarker:
    """Marks a trainer as running in smoke mode when it is one of the trainer's callbacks."""


def smoke_test(trainer: Any) -> bool:
    """Whether ``trainer`` runs a smoke test of the pipeline: ``fast_dev_run``, or a :class:`SmokeMarker` among its
    callbacks (any ``debug=`` mode)."""
    if bool(getattr(trainer, "fast_dev_run", False)):
        return True
    return any(isinstance(cb, SmokeMarker) for cb in getattr(trainer, "callbacks", None) or ())
