"""SEMDICE's policy-gradient baselines improve their own objective: every training step (one
collected trajectory, then ``inner_steps`` updates) raises the baseline's normalised return ``J`` of its reward under
the MLE model it was given, for both update rules. A sign flip or a no-op update fails this; "the logits moved"
(``test_semdice.py``) does not.

Why it must rise: the official update ``theta += lr p_s(s) Q(s, .)`` is policy mirror descent with state-dependent
step sizes, which improves ``V(s)`` in every state for any step size; the exact update is gradient ascent on ``J``
with a small step."""

from __future__ import annotations

from pathlib import Path

import pytest

from suite.build import build
from tests.conftest import compose_train


def _fit_recording_j(tmp_path: Path, kind: str, update: str):
    cfg = compose_train(
        [
            "experiment=semdice",
            "logger=none",
            "callbacks=none",
            "trainer.max_epochs=1",
            "trainer.enable_progress_bar=false",
            "data.trajectories_per_epoch=5",
            f"model.kind={kind}",
            f"model.baseline_update={update}",
        ],
        tmp_path,
    )
    objs = build(cfg)
    model, steps = objs["model"], []
    inner = model.training_step

    def recording(batch, batch_idx):  # the data of this step is in place: the callback ran on_train_batch_start
        before = -float(model.objective())
        out = inner(batch, batch_idx)
        steps.append((before, -float(model.objective())))
        return out

    model.training_step = recording
    objs["trainer"].fit(model, datamodule=objs["datamodule"])
    return steps


@pytest.mark.parametrize("update", ["official", "exact"])
@pytest.mark.parametrize("kind", ["pb_s", "cb_s", "cb_sa"])
def test_every_baseline_step_raises_its_own_return(tmp_path, kind, update):
    steps = _fit_recording_j(tmp_path, kind, update)
    assert len(steps) == 5
    gains = [after - before for before, after in steps]
    assert all(g > 1e-6 for g in gains), gains  # a no-op gives 0, a sign flip a loss
    assert max(gains) > 1e-4, gains  # the exact update is slow early (module docstring): ~3e-4 to 9e-4 per step
