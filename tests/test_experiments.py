"""Every experiment runs every debug mode (``debug=fdr|limit|overfit``) on its embedded data through the train
entry point, writes its results into ``logs/debug/<slug>/``, and its checkpoint loads without executing pickled code.

Parametrised over ``conf/experiment/*.yaml`` x ``conf/debug/*.yaml``: a new paper (or debug mode) is covered by
adding its config file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, run_entry

SLUGS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
DEBUG_MODES = sorted(p.stem for p in (ROOT / "conf" / "debug").glob("*.yaml"))


def test_there_are_experiments():
    assert "leaderbot" in SLUGS, "leaderbot is the default experiment and must exist"


@pytest.mark.parametrize("mode", DEBUG_MODES)
@pytest.mark.parametrize("slug", SLUGS)
def test_every_debug_mode_runs_through_the_train_entry_point(slug: str, mode: str, tmp_path: Path, capsys):
    """`make train METHOD=<slug> ARGS="debug=<mode>"` as a user types it (the same entry point, in this process)."""
    code = run_entry(
        "train", [f"experiment={slug}", f"debug={mode}", "logger=csv", "trainer.enable_progress_bar=false",
                  f"paths.log_dir={tmp_path}"]
    )  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    (run,) = (tmp_path / "debug" / slug / "runs").iterdir()  # debug runs never land in logs/train (compare)
    assert f"experiment_slug: {slug}" in (run / "config.yaml").read_text()
    metrics = json.loads((run / "metrics.json").read_text())
    assert any(k.startswith("test/") for k in metrics), f"{slug}/{mode}: no test metric in {sorted(metrics)}"
    assert all(math.isfinite(v) for k, v in metrics.items() if k.startswith("test/")), metrics
    assert f"debug run finished: {run}" in out.out or f"debug run finished: {run.resolve()}" in out.out
    if mode == "overfit":  # says whether its batch was overfitted, against the stated threshold (suite/debug.py)
        assert "overfit check: PASSED: " in out.out or "overfit check: FAILED " in out.out, out.out[-2000:]
    if mode == "fdr":  # fast_dev_run writes no checkpoint (README, `make help`)
        assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir()), slug
    else:  # the others do, weights-only loadable
        state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
        assert f"experiment_slug: {slug}" in state["suite_config_yaml"]
        assert state["state_dict"], f"{slug}: empty state_dict"
        # batches x epochs of conf/debug/<mode>.yaml, times the optimizers a manually optimised module steps per batch
        # (Lightning counts each optimizer step: semdice_deep steps nu/mu, critic and actor)
        budget = {"limit": 2 * 2, "overfit": 1 * 10}[mode] * max(len(state.get("optimizer_states", [])), 1)
        assert 0 < state["global_step"] <= budget, state["global_step"]
