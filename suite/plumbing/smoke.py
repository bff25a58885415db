"""Smoke mode as a callback: the runner adds :class:`SmokeMode` for a ``debug=`` run (``smoke: true``), and
:func:`core.smoke.smoke_test` finds it among the trainer's callbacks."""

from __future__ import annotations

from lightning.pytorch import Callback

from core.smoke import SmokeMarker


class SmokeMode(SmokeMarker, Callback):
    """Marks its trainer as a smoke test of the pipeline (:func:`core.smoke.smoke_test`); it does nothing else."""
