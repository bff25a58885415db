"""The README's commands as a new user types them: `make train` -> `make eval CKPT=` -> `make compare`, what each
prints at the end, a quiet console, and `make compare` over a sweep mixed with failed and debug runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from suite.compare import RunRecord, plot_curves
from suite.compare import main as compare_main
from tests._helpers.make import run_make
from tests.conftest import FIXTURE_CONF, ROOT, run_entry

# Lines that are noise to a user; none may reach the console.
NOISE = (
    "💡 Tip",
    "LeafSpec",
    "was configured so 100%",
    "`srun` command",
    "anonymous setting",
    "weights_only",
    "Images sizes do not match",
    "dirpath has changed",
    "Received SIGTERM",
)


_make = run_make


@pytest.mark.slow
def test_make_train_then_make_eval_then_make_compare(tmp_path):
    logs = tmp_path / "logs"
    # log_every_n_steps above the number of batches: Lightning's (real) warning about it must still reach the user.
    args = f"ARGS=trainer.max_epochs=1 model.plots=false trainer.log_every_n_steps=1000 paths.log_dir={logs}"
    train = _make("train", "METHOD=leaderbot", args)
    assert train.returncode == 0, train.stderr[-3000:]
    (run,) = (logs / "train" / "leaderbot" / "runs").iterdir()
    out = train.stdout
    # Where the results went: folder, metrics file, checkpoint, leaderboard top, curves.
    assert f"run finished: {run}/" in out and f"metrics ({run}/metrics.json):" in out
    assert f"checkpoint: {run}/checkpoints/last.ckpt" in out and f"curves: {run}/csv/metrics.csv" in out
    assert f"leaderboard ({run}/leaderboard.csv), top 5:" in out and re.search(r"^\s+1\. \S+\s+\(score -?\d", out, re.M)
    trained = json.loads((run / "metrics.json").read_text())
    assert re.search(rf"^\s+test/kld\s+{trained['test/kld']:.6g}$", out, re.M)
    # A quiet console: each INFO line once, no noise; one named column of metrics, no "DataLoader 0".
    console = train.stdout + train.stderr
    assert console.count("GPU available") == 1, console[-3000:]
    assert [n for n in NOISE if n in console] == [] and "DataLoader 0" not in console
    assert "smaller than the logging interval Trainer(log_every_n_steps=1000)" in console  # real warnings stay

    # `make eval` on that checkpoint, by a relative path: own run folder, same test metrics.
    ckpt = os.path.relpath(run / "checkpoints" / "last.ckpt", ROOT)
    ev = _make("eval", f"CKPT={ckpt}", f"ARGS=paths.log_dir={logs}")
    assert ev.returncode == 0, ev.stderr[-3000:]
    (eval_run,) = (logs / "eval" / "leaderbot" / "runs").iterdir()
    evaluated = json.loads((eval_run / "metrics.json").read_text())
    for key in ("test/kld", "test/mae_all", "test/nll"):
        assert evaluated[key] == pytest.approx(trained[key], rel=1e-9), key
    assert f"finished: {eval_run}/" in ev.stdout and "leaderboard (" in ev.stdout
    assert "weights_only" not in ev.stdout + ev.stderr

    # `make compare`: by default the metrics the claim check reports (not all 27); METRICS= picks columns.
    cmp = _make("compare", "METHOD=leaderbot", f"LOGS={logs}")
    assert cmp.returncode == 0, cmp.stderr[-3000:]
    header = (logs / "compare" / "leaderbot" / "comparison.md").read_text().splitlines()[2]
    # the claim spec's metrics, in its order, that this run logged (train + eval runs are compared)
    spec_metrics = OmegaConf.load(ROOT / "conf" / "claim" / "leaderbot.yaml").metrics
    logged = set(trained) | set(evaluated)
    claim = [m for m in spec_metrics if m in logged]
    assert len(claim) >= 5 and len(claim) < len(logged)  # a selection, not every metric
    assert header == "| run | " + " | ".join(claim) + " |"
    assert "(one seed)" in cmp.stdout and "±" not in cmp.stdout  # no "mean ± std" over one seed
    cmp = _make("compare", "METHOD=leaderbot", f"LOGS={logs}", "METRICS=test/kld val/nll", f"OUT={tmp_path / 'c2'}")
    assert cmp.returncode == 0, cmp.stderr[-3000:]
    assert cmp.stdout.splitlines()[0] == "| run | test/kld | val/nll |"


def test_make_compare_unknown_method_lists_slugs():
    proc = _make("compare", "METHOD=nope")
    assert proc.returncode == 2
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and "error: unknown METHOD 'nope'; valid: " in lines[0], lines
    assert " leaderbot " in lines[0] and "make train METHOD=nope" not in lines[0]


def test_compare_labels_runs_by_what_differs_and_skips_failed_and_debug_runs(tmp_path, capsys):
    base = [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.max_epochs=1", f"paths.log_dir={tmp_path}"]
    assert run_entry("train", ["-m", *base, "model.optimizer.lr=0.05,0.01"]) == 0
    sweep = capsys.readouterr().out
    jobs = sorted((tmp_path / "train" / "spine_fixture" / "multiruns").glob("*/[0-9]"))
    assert len(jobs) == 2 and all(f"run finished: {job}/" in sweep for job in jobs)  # each sweep job says where
    # Run folders are named by the second they start in (conf/hydra/default.yaml): keep these runs a second apart so
    # that each gets its own folder (two runs started within one second share one).
    time.sleep(1.1)
    assert run_entry("train", [*base, "model.nan_at_step=2"]) == 2  # fails: a run folder without metrics.json
    time.sleep(1.1)
    assert run_entry("train", [*base, "debug=limit"]) == 0  # lands in <logs>/debug, never in <logs>/train
    time.sleep(1.1)
    assert run_entry("train", [*base, "debug=fdr", "task_name=train"]) == 0  # a debug run forced into train/
    assert len(list((tmp_path / "debug" / "spine_fixture" / "runs").iterdir())) == 1
    capsys.readouterr()
    compare_main(
        [
            "--runs",
            str(tmp_path / "train" / "spine_fixture"),
            "--metrics",
            "test/mse,test/r2",
            "--out",
            str(tmp_path / "cmp"),
        ]
    )
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert table[0] == "| run | test/mse | test/r2 |"
    assert [row.split(" | ")[0] for row in table[1:]] == ["| model.optimizer.lr=0.05", "| model.optimizer.lr=0.01"]
    assert all(row.count("(one seed)") == 2 for row in table[1:]), table
    assert "skipped 2 unfinished or debug run folder(s)" in out
    assert (tmp_path / "cmp" / "curves.png").stat().st_size > 1000


def test_one_point_curves_are_drawn_with_markers(tmp_path, monkeypatch):
    import matplotlib.axes

    calls = []
    real = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda self, *a, **k: calls.append(k) or real(self, *a, **k))
    curves = {"train/loss": [(i, 1.0) for i in range(50)], "val/loss": [(10, 0.5)]}
    rec = RunRecord(tmp_path, "model.neuron=lif", 0, curves=curves)
    plot_curves([rec], ["train/loss", "val/loss"], tmp_path / "c.png")
    assert [c["marker"] for c in calls] == [None, "o"]  # 50-point curve plain, one-point curve a visible dot
    assert calls[0]["label"] == "model.neuron=lif"  # the full label, never cut to a common prefix


def test_curves_are_small_multiples_of_the_shared_validation_metrics(tmp_path):
    """One row of panels per setting, one panel per metric the runs share (plus train/loss), one
    colour per method, a thin line per seed and a bold mean, the legend outside the panels, and no line going back
    in step (a run's CSV holding an earlier attempt's rows, as the nforgot page's did, is drawn as its last attempt)."""
    from matplotlib.lines import Line2D

    from suite.compare import curves_figure

    def curve(offset: float, steps=range(0, 40, 10)) -> list[tuple[int, float]]:
        return [(s, offset + s / 100) for s in steps]

    records = []
    for name in ("school_finetune", "school_ewc", "school_ci_finetune", "school_ci_ewc"):
        for seed in (0, 1):
            curves = {"train/loss": curve(1.0, range(40)), "val/acc": curve(0.1 * seed), "val/loss_epoch": curve(2.0)}
            records.append(RunRecord(tmp_path / f"{name}{seed}", name, seed, curves=curves))
    records[0].curves["val/only_here"] = curve(0.0)  # not shared: no panel
    records[1].curves["val/acc"] = curve(0.5, range(0, 50, 10)) + curve(0.6)  # an earlier attempt, then a rerun
    fig = curves_figure(records, ["train/loss"])
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.axison]
    expected = [f"{s}: {k}" for s in ("school", "school_ci") for k in ("train/loss", "val/acc", "val/loss")]
    assert [ax.get_title() for ax in panels] == expected
    for ax in panels:
        lines = [ln for ln in ax.get_lines() if isinstance(ln, Line2D)]
        for ln in lines:
            steps = list(ln.get_xdata())
            assert steps == sorted(set(steps)), (ax.get_title(), steps)  # never backwards, never repeated
        bold = [ln for ln in lines if ln.get_linewidth() == 2.0]
        thin = [ln for ln in lines if ln.get_linewidth() < 1.0]
        assert [ln.get_label() for ln in bold] == ["finetune", "ewc"] and len(thin) == 4, ax.get_title()
        assert len({ln.get_color() for ln in lines}) == 2  # one colour per method, seeds included
    first = panels[1].get_lines()  # school: val/acc, seed 0 of finetune: the rerun drawn as its own attempt
    assert list(first[1].get_ydata()) == pytest.approx([0.6, 0.7, 0.8, 0.9])
    colours = defaultdict(set)
    for ln in (ln for ax in panels for ln in ax.get_lines() if ln.get_linewidth() == 2.0):
        colours[ln.get_label()].add(ln.get_color())
    assert [len(c) for c in colours.values()] == [1, 1] and len(set.union(*colours.values())) == 2  # in every setting
    (legend,) = fig.legends
    box = legend.get_window_extent()
    assert all(box.x0 >= ax.get_window_extent().x1 for ax in panels)  # outside, right of every panel
    assert [t.get_text() for t in legend.get_texts()] == ["finetune", "ewc"]


def test_settings_and_methods_split_the_claim_entry_names():
    from suite.compare import settings_and_methods

    spec = OmegaConf.load(ROOT / "conf" / "claim" / "nforgot.yaml")
    split = settings_and_methods([e.name for e in spec.runs])
    assert {s for s, _ in split.values()} == {"school4d", "school4d_tgn", "school", "school_ci", "pubmed"}
    assert split["school_ci_lwf"] == ("school_ci", "lwf") and split["school4d_tgn_nforgot_released"] == (
        "school4d_tgn",
        "nforgot_released",
    )
    assert split["school4d_nforgot_wl"] == ("school4d", "nforgot_wl")
    assert settings_and_methods(["model.neuron=lif", "model.neuron=gru"]) == {
        "model.neuron=lif": ("", "model.neuron=lif"),
        "model.neuron=gru": ("", "model.neuron=gru"),
    }


def test_quiet_console_drops_named_noise_and_keeps_real_messages(capsys):
    import logging
    import warnings

    from suite.quiet import quiet_console

    root = logging.getLogger()
    handler = logging.StreamHandler()  # stands in for Hydra's console handler
    root.addHandler(handler)
    try:
        quiet_console()
        lightning = logging.getLogger("lightning.pytorch.utilities.rank_zero")
        logging.warning("Images sizes do not match. This will causes images to be display incorrectly in the UI.")
        lightning.warning("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]")
        lightning.warning("a real Lightning warning")
        with warnings.catch_warnings(record=True) as caught:
            quiet_console()  # the warning filters are installed inside catch_warnings' fresh state
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", stacklevel=1)
            warnings.warn("a real user warning", stacklevel=1)
    finally:
        root.removeHandler(handler)
    err = capsys.readouterr().err
    assert "Images sizes" not in err and "Tip" not in err and "a real Lightning warning" in err
    assert [str(w.message) for w in caught] == ["a real user warning"]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "lr_key"), [("leaderbot", "newton"), ("semdice", "optimizer")])
def test_readme_sweep_line_as_typed(method: str, lr_key: str, tmp_path):
    """`make sweep METHOD=x ARGS="seed=0,1,2 model.lr=1e-3,1e-4"` (README, `make help`): `model.lr` is every
    experiment's learning rate; debug=fdr keeps the six jobs to a batch each."""
    args = f"ARGS=seed=0,1,2 model.lr=1e-3,1e-4 debug=fdr logger=csv paths.log_dir={tmp_path}"
    proc = _make("sweep", f"METHOD={method}", args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"note: model.lr sets model.{lr_key}.lr (this experiment's learning rate)" in proc.stderr
    jobs = sorted((tmp_path / "debug" / method / "multiruns").glob("*/[0-9]"))
    assert len(jobs) == 6, jobs
    ran = sorted(
        (c["seed"], c["model"][lr_key]["lr"]) for c in (yaml.safe_load((j / "config.yaml").read_text()) for j in jobs)
    )
    assert ran == [(s, lr) for s in (0, 1, 2) for lr in (1e-4, 1e-3)]


def test_model_lr_names_every_experiments_learning_rate():
    """Every experiment's `model.lr` resolves; where one rate sets several keys (grass: OneCycleLR's max_lr
    overrides the optimiser's lr; tulip: three stage rates) they follow one value, so a sweep stays one axis."""
    from hydra import compose, initialize_config_dir

    from suite.cli import learning_rate_alias

    slugs = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
    for slug in slugs:
        argv = learning_rate_alias(["train.py", f"experiment={slug}", "model.lr=0.00123"])
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            model = compose("train", overrides=argv[1:]).model
        rates = {
            k: OmegaConf.select(model, k)
            for k in ("lr", "optimizer.lr", "scheduler.max_lr", "newton.lr", "clip_lr", "distill_lr", "expand_lr")
        }
        assert 0.00123 in rates.values(), (slug, rates)
        if slug == "grass":
            assert rates["optimizer.lr"] == rates["scheduler.max_lr"] == 0.00123
        if slug == "tulip":
            assert rates["clip_lr"] == rates["distill_lr"] == rates["expand_lr"] == 0.00123
    argv = learning_rate_alias(["train.py", "-m", "experiment=grass", "model.lr=1e-3,1e-4"])
    assert argv[3:] == ["model.optimizer.lr=1e-3,1e-4", "model.scheduler.max_lr=${model.optimizer.lr}"]


def test_overfit_verdict_asks_for_a_memorised_batch(tmp_path, capsys):
    """debug=overfit passes only when its one batch is memorised: the training loss driven near zero (the mean of
    its last 3 values at most 10% of its first), not merely lower; says why the check does not apply where the
    experiment's entry in conf/debug/overfit.yaml says so."""
    from suite.debug import overfit_verdict

    def curve(name: str, values: list[float], key: str = "train/loss_step") -> Path:
        f = tmp_path / name
        f.write_text(f"epoch,step,{key},val/loss\n" + "".join(f"{i},{i},{v},\n" for i, v in enumerate(values)))
        return f

    rule = "memorised: the mean of the last 3 train/loss values at most 10% of the first"
    assert (
        overfit_verdict(curve("a.csv", [2.0, 1.0, 0.5, 0.2, 0.1, 0.0]))
        == f"overfit check: PASSED: train/loss 2 -> 0.1 (5.0% of its start) in 6 steps; {rule}"
    )
    # a loss that fell by 40% (4.207 -> 2.654 was "PASSED" under a rule that asked only for a fall) is not memorised
    line = overfit_verdict(curve("b.csv", [4.2, 3.6, 3.0, 2.7, 2.6, 2.6]))
    assert line == (
        f"overfit check: NOT MEMORISED: train/loss 4.2 -> 2.633 (62.7% of its start) in 6 steps; {rule}; train "
        'longer to see whether it can: ARGS="debug=overfit overfit_check.run_epochs=60"'
    )
    check = {
        "fraction": 0.1,
        "experiments": {"x": {"fraction": 0.7, "why": "a noisy loss"}, "y": {"applies": False, "why": "a convex  fit"}},
    }
    assert overfit_verdict(curve("c.csv", [4.2, 3.6, 3.0, 2.7, 2.6, 2.6]), check, "x").startswith(
        "overfit check: PASSED: train/loss 4.2 -> 2.633 (62.7% of its start) in 6 steps; memorised: the mean of the "
        "last 3 train/loss values at most 70% of the first (a noisy loss)"
    )
    assert overfit_verdict(curve("d.csv", [1.0, 0.0]), check, "y") == "overfit check: does not apply to y: a convex fit"
    assert overfit_verdict(curve("e.csv", [-1.0, -2.0, -3, -4, -5])).startswith("overfit check: cannot judge: ")
    assert overfit_verdict(tmp_path / "none.csv").startswith("overfit check: no train/loss curve to judge")
    # through the entry point: the line closes the run's summary
    base = [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.enable_progress_bar=false"]
    assert run_entry("train", [*base, "debug=overfit", f"paths.log_dir={tmp_path / 'logs'}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("overfit check: ") and rule in out[-1], out[-3:]


def test_a_run_whose_test_measured_nothing_says_so(tmp_path, capsys):
    base = [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.max_epochs=1", f"paths.log_dir={tmp_path}"]
    assert run_entry("train", [*base, "trainer.limit_test_batches=0"]) == 0
    note = "note: the test measured nothing (no test/* metric was logged: no test batch ran?)"
    assert capsys.readouterr().out.splitlines()[-1] == note
    assert run_entry("train", base) == 0
    assert note not in capsys.readouterr().out


def test_torch_geometric_jit_deprecation_stays_off_the_console():
    """torch_geometric scripts its helpers with `torch.jit.script` at import (a FutureWarning about its own code that
    would reach every graph run's console); the entry points' filter drops exactly that message."""
    code = "from suite.quiet import quiet_console; quiet_console(); import torch_geometric.nn"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torch.jit.script" not in proc.stderr, proc.stderr[-2000:]


def _fake_runs(root: Path, seeds: list[int], value: float = 0.5) -> Path:
    """Finished run folders as `make train` leaves them (config.yaml with the seed, metrics.json)."""
    for i, seed in enumerate(seeds):
        run = root / f"run{i}"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(f"seed: {seed}\n")
        (run / "metrics.json").write_text(
            json.dumps({"test/nll": value + 0.1 * i * (len(set(seeds)) > 1), "test/mae_tie": 0.1})
        )
    return root


def test_make_compare_refuses_an_unknown_metric_naming_close_ones(tmp_path):
    runs = _fake_runs(tmp_path / "runs", [0, 1])
    proc = _make("compare", f"RUNS={runs}", "METRICS=test/nlll", f"OUT={tmp_path / 'out'}")
    trailer = re.compile(r"^make(\[\d+\])?: \*\*\* ")
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip() and not trailer.match(line)]
    assert proc.returncode == 2 and lines == [
        "error: unknown metric 'test/nlll': no run logged it (did you mean test/nll?)"
    ], lines
    assert not (tmp_path / "out").exists()


def test_compare_labels_same_seed_runs_as_repeats(tmp_path, capsys):
    """Three runs of seed 0 are repeats (`± 0 (3 repeats of seed 0)`), not three seeds (`± 0 (n=3)`)."""
    compare_main(
        ["--runs", str(_fake_runs(tmp_path / "same", [0, 0, 0])), "--metrics", "test/nll", "--out", str(tmp_path / "a")]
    )
    assert "| 0.5 ± 0 (3 repeats of seed 0) |" in capsys.readouterr().out
    compare_main(
        [
            "--runs",
            str(_fake_runs(tmp_path / "mixed", [0, 0, 1])),
            "--metrics",
            "test/nll",
            "--out",
            str(tmp_path / "b"),
        ]
    )
    assert "(n=3: 2 seeds, repeats included) |" in capsys.readouterr().out
    compare_main(
        [
            "--runs",
            str(_fake_runs(tmp_path / "seeds", [0, 1, 2])),
            "--metrics",
            "test/nll",
            "--out",
            str(tmp_path / "c"),
        ]
    )
    assert "| 0.6 ± 0.1 (n=3) |" in capsys.readouterr().out
