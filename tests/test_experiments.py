"""Every experiment runs every debug mode (``debug=fdr|limit|overfit``) on its embedded data through the train
entry point, writes its results into ``logs/debug/<slug>/``, and its checkpoint loads without executing pickled code.

Parametrised over ``conf/experiment/*.yaml`` x ``conf/debug/*.yaml``: a new paper (or debug mode) is covered by
adding its config file.
"""

from __future__ import annotations

import json
import math
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests._helpers.make import run_make
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
        "train",
        [
            f"experiment={slug}",
            f"debug={mode}",
            "logger=csv",
            "trainer.enable_progress_bar=false",
            f"paths.log_dir={tmp_path}",
        ],
    )
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    (run,) = (tmp_path / "debug" / slug / "runs").iterdir()  # debug runs never land in logs/train (compare)
    assert f"experiment_slug: {slug}" in (run / "config.yaml").read_text()
    metrics = json.loads((run / "metrics.json").read_text())
    assert any(k.startswith("test/") for k in metrics), f"{slug}/{mode}: no test metric in {sorted(metrics)}"
    assert all(math.isfinite(v) for k, v in metrics.items() if k.startswith("test/")), metrics
    assert f"debug run finished: {run}" in out.out or f"debug run finished: {run.resolve()}" in out.out
    if mode == "overfit":  # says whether its batch was memorised, against the stated criterion (suite/debug.py)
        line = out.out.strip().splitlines()[-1]
        entry = OmegaConf.load(ROOT / "conf" / "debug" / "overfit.yaml").overfit_check.experiments.get(slug, {})
        if entry.get("applies", True) is False:
            assert line.startswith(f"overfit check: does not apply to {slug}: "), line
        elif "epochs" in entry:  # given a budget of its own: it memorises its batch within it
            assert line.startswith("overfit check: PASSED: "), line
        else:
            assert line.startswith(("overfit check: PASSED: ", "overfit check: NOT MEMORISED: ")), line
    if mode == "fdr":  # fast_dev_run writes no checkpoint (README, `make help`)
        assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir()), slug
        # the method itself ran: its own metrics are logged, finite, and no "measured nothing" line
        for pattern in METHOD_ON[slug][1]:
            hits = [k for k, v in metrics.items() if fnmatchcase(k, pattern) and math.isfinite(v)]
            assert hits, f"{slug}: the default's debug=fdr run logged no finite {pattern} in {sorted(metrics)}"
        # ... and the run says it measured nothing exactly when none of the experiment's own method_metrics is there
        # (a one-batch subject can leave MDA no usable image and LiCE no valid counterfactual: they say so)
        from suite.measured import measured_nothing

        saved = OmegaConf.load(run / "config.yaml")
        silent = measured_nothing(slug, saved.method_metrics, metrics, saved.method_predicted) is not None
        assert ("the method measured nothing" in out.out) == silent, (saved.method_metrics, out.out[-2000:])
    else:  # the others do, weights-only loadable
        state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
        assert f"experiment_slug: {slug}" in state["suite_config_yaml"]
        assert state["state_dict"], f"{slug}: empty state_dict"
        # batches x epochs of conf/debug/<mode>.yaml, times the optimizers a manually optimised module steps per batch
        # (Lightning counts each optimizer step: semdice_deep steps nu/mu, critic and actor)
        epochs = OmegaConf.load(run / "config.yaml").trainer.max_epochs  # overfit: per experiment (overfit_check)
        budget = {"limit": 2 * 2, "overfit": 1 * epochs}[mode] * max(len(state.get("optimizer_states", [])), 1)
        assert 0 < state["global_step"] <= budget, state["global_step"]


# -- the default run of every method exercises the method it is named after ---------------------------------------
class OneOf(tuple):
    """A config value that must be one of these (a list value: must contain one of them)."""


class Positive:
    """A config value that must be a number > 0."""

    def __repr__(self) -> str:
        return "a number > 0"


# slug -> ({config key: value that turns the method on}, [metric patterns only the method's own run logs]).
# The config half fails when someone switches a method off by default (or points the default at a baseline); the
# metric half is checked on each experiment's `debug=fdr` run above. Every slug of conf/experiment/ must be here.
METHOD_ON: dict[str, tuple[dict[str, object], list[str]]] = {
    "addp": (
        {"model.mode": "diffusion", "model.timestep_dist": "contribution", "model.augment": OneOf(("mix", "self"))},
        ["test/absrel", "test/curve/absrel/*"],
    ),
    "badloss": ({"model.defence": "badloss"}, ["detect/auc", "test/asr_mean"]),
    "bracketire": (
        {
            "model.arch": "tmrnet",
            "model.mode": "supervised",
            "train": True,
            "model.net.alpha_init": 0.0,  # temporal modulation: alpha starts at 0 and is learned
            "model.net.alpha_learnable": True,
        },
        ["test/psnr", "test/ssim"],
    ),
    "gated_deltanet": (
        {
            "model.net.mixer.0.kind": "gated_deltanet",
            "model.net.mixer.0.use_gate": True,
            "model.net.mixer.0.use_delta": True,
        },
        ["test/acc*"],
    ),
    "grass": (
        {"model.arch": "grass", "model.net.encoding": "rrwp", "model.net.added_edges_per_node": Positive()},
        ["test/mae"],
    ),
    "leaderbot": ({"model.kind": "davidson", "model.k_cov": 0, "model.k_tie": 1}, ["test/nll", "test/mae_tie"]),
    "lice": (
        {"model.methods": OneOf(("lice_optimize",)), "model.num_counterfactuals": Positive()},
        ["test/lice_optimize/found", "test/lice_threshold/found"],
    ),
    "mda": ({"model.attribution.enabled": True, "model.attribution.methods": OneOf(("mda",))}, ["attr/n_images"]),
    "nforgot": ({"model.method": "nforgot"}, ["test/ap"]),
    "ostquant": ({"callbacks.quant_calibration.methods": OneOf(("ostquant",))}, ["quant/ostquant_ppl"]),
    "ostquant_minilm": ({"callbacks.quant_calibration.methods": OneOf(("ostquant",))}, ["quant/ostquant_loss"]),
    "preworld": (
        {"model.stage": "pretrain", "model.loss.rgb": Positive(), "model.loss.depth": Positive()},
        ["test/miou"],
    ),
    "rx_dpm": ({"model.rx": True, "model.analytic": False}, ["test/w2"]),
    "semdice": ({"model.kind": "semdice"}, ["test/normalized_entropy"]),
    "semdice_deep": ({"model.method": "semdice"}, ["test/cell_entropy"]),
    "semdice_finetune": (
        {"model.pretrain_steps": Positive(), "model.init_ckpt": None, "model.init_run": None},
        ["test/pretrain_steps"],
    ),
    "sgm_lipschitz": (
        {"model.lipschitz_sigmas": OneOf((0.05, 0.2, 0.5, 1.0, 2.0))},
        ["test/lip_learned_0", "test/lip_exact_0"],
    ),
    "stickbreaking": ({"model.net.mixer.0.kind": "stickbreaking"}, ["test/ppl_len*"]),
    "sumi": ({"callbacks.tta.method": "sumi"}, ["tta/acc_q*"]),
    "systematic_outliers": (
        {"callbacks.outlier_census._target_": "callbacks.outlier_census.OutlierCensus"},
        ["census/sink_share"],
    ),
    "ts_lif": ({"model.neuron": "ts_lif", "model.backbone": "gru"}, ["test/r2"]),
    "tulip": ({"model.stages": ["clip", "distill", "expand"], "model.text_tower": "rope"}, ["test/long_r1"]),
}


def _method_value_ok(value: object, want: object) -> bool:
    if isinstance(want, OneOf):
        return any(v in want for v in value) if isinstance(value, list) else value in want
    if isinstance(want, Positive):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return value == want


def test_every_experiment_is_in_the_method_table():
    assert sorted(METHOD_ON) == SLUGS, "add the new experiment's method switch and metrics to METHOD_ON"


@pytest.mark.parametrize("slug", SLUGS)
def test_the_default_run_enables_the_method(slug: str, tmp_path: Path):
    """`make train METHOD=<slug>` with no ARGS runs the paper's method, not a baseline or a switched-off default."""
    from omegaconf import OmegaConf

    from tests.conftest import compose_train

    cfg = compose_train([f"experiment={slug}"], tmp_path)
    keys, _ = METHOD_ON[slug]
    for key, want in keys.items():
        value = OmegaConf.select(cfg, key, default="<missing>")
        value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        assert _method_value_ok(value, want), f"{slug}: default {key}={value!r}, the method needs {want!r}"
    assert list(cfg.method_metrics), f"{slug}: the experiment names no method_metrics (suite/measured.py)"


def test_measured_nothing_names_the_missing_metrics():
    from suite.measured import measured_nothing

    pats = ["quant/ostquant_*", "test/lip_exact_0"]
    assert measured_nothing("x", pats, {"quant/ostquant_ppl": 9.1, "test/acc": 0.5}) is None
    assert measured_nothing("x", pats, {"test/lip_exact_0": 2.0}) is None
    assert measured_nothing("x", [], {}) is None  # an experiment that declares nothing is not judged
    line = measured_nothing("x", pats, {"test/acc": 0.5, "quant/ostquant_ppl": float("nan"), "quant/fp_ppl": 3.0})
    assert line == (
        "note: x: the method measured nothing: none of its metrics (quant/ostquant_*, test/lip_exact_0) was logged "
        "with a finite value (switched off, or no test data it could use?)"
    )


def test_make_train_with_the_method_switched_off_says_it_measured_nothing(tmp_path):
    """`make train METHOD=sgm_lipschitz ARGS="... model.lipschitz_sigmas=null"`, as a user types it: the Lipschitz
    study does not run, the run still succeeds, and its last line says that the method measured nothing."""
    args = f"ARGS=debug=fdr logger=csv model.lipschitz_sigmas=null paths.log_dir={tmp_path}"
    proc = run_make("train", "METHOD=sgm_lipschitz", args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == (
        "note: sgm_lipschitz: the method measured nothing: none of its metrics (test/lip_learned_*, test/lip_exact_*) "
        "was logged with a finite value (switched off, or no test data it could use?)"
    ), proc.stdout[-2000:]


def test_a_method_that_predicted_nothing_says_it_measured_nothing(tmp_path):
    """`make train METHOD=preworld` ended with test/miou 0 and no note: 0 is finite, but after pre-training alone no
    voxel's density exceeded model.density_threshold, so the IoUs scored an empty prediction. A threshold no density
    reaches makes that certain here; the last line says so."""
    args = f"ARGS=trainer.max_epochs=1 model.density_threshold=1e9 logger=csv paths.log_dir={tmp_path}"
    proc = run_make("train", "METHOD=preworld", args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "train" / "preworld" / "runs").iterdir()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test/occupied"] == 0 and metrics["test/miou"] == 0, metrics
    assert proc.stdout.splitlines()[-1].startswith(
        "note: preworld: the method measured nothing: test/occupied is 0 (it predicted nothing), so its metrics "
        "(test/miou, test/miou_forecast) score an empty prediction"
    ), proc.stdout[-2000:]


@pytest.mark.slow
def test_the_preworld_default_run_measures_something(tmp_path):
    """`make train METHOD=preworld` as typed (4 epochs, its largest density near 1) predicted no occupied voxel:
    test/miou and every copy-last IoU were 0. Its default budget now trains the densities past the official
    threshold: the run predicts occupancy, scores it and ends without the 'measured nothing' note."""
    proc = run_make(
        "train", "METHOD=preworld", f"ARGS=logger=csv paths.log_dir={tmp_path}", timeout=900, one_thread=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "train" / "preworld" / "runs").iterdir()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test/occupied"] > 0 and metrics["test/miou"] > 0 and metrics["test/miou_forecast"] > 0, metrics
    copy_last = {k: v for k, v in metrics.items() if k.startswith("test/miou_copy_last_h")}
    assert len(copy_last) == 3 and all(v > 0 for v in copy_last.values()), copy_last
    assert "measured nothing" not in proc.stdout, proc.stdout[-2000:]


def test_the_ostquant_default_run_uses_one_thread_as_its_twin(tmp_path):
    """Two intra-op threads fight on the 2-core machine: the default ostquant run took 6 min 56 s, 32 s on one
    thread, the setting of its twin systematic_outliers."""
    import torch

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        args = ["experiment=ostquant", "debug=fdr", "logger=csv", f"paths.log_dir={tmp_path}"]
        assert run_entry("train", args) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    for slug in ("ostquant", "systematic_outliers"):
        assert OmegaConf.load(ROOT / "conf" / "experiment" / f"{slug}.yaml").num_threads == 1, slug
