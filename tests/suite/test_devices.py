"""Devices are what the user asked: an experiment picks its default device through the defaults list
(``override /trainer: cpu``), never by pinning ``trainer.accelerator``, so ``trainer=gpu`` / ``trainer=ddp`` on the
command line win; a GPU asked for on a machine without one is a one-line error, not a silent CPU run; a method that
runs only on the CPU (``cpu_only``) refuses a GPU in one line naming why; every run records what it ran on
(``devices.json``) and ``make compare`` labels runs by that, never by the ``trainer=`` they were given."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from core.errors import ConfigError
from suite import build
from suite.compare import main as compare_main
from tests.conftest import FIXTURE_CONF, ROOT, compose_train, run_cli, run_entry

SLUGS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("slug", SLUGS)
def test_trainer_group_on_the_command_line_picks_the_device(slug, tmp_path):
    raw = yaml.safe_load((ROOT / "conf" / "experiment" / f"{slug}.yaml").read_text()) or {}
    assert "accelerator" not in (raw.get("trainer") or {}), f"{slug} pins trainer.accelerator (use the defaults list)"
    gpu = compose_train([f"experiment={slug}", "trainer=gpu"], tmp_path).trainer
    assert gpu.accelerator == "gpu" and gpu.devices == 1, slug
    ddp = compose_train([f"experiment={slug}", "trainer=ddp", "trainer.devices=8"], tmp_path).trainer
    assert (ddp.accelerator, ddp.strategy, ddp.devices) == ("gpu", "ddp", 8), slug


def test_cpu_defaults_stay_on_the_cpu(tmp_path):
    for slug in ("leaderbot", "semdice", "semdice_deep", "semdice_finetune", "tulip"):
        assert compose_train([f"experiment={slug}"], tmp_path).trainer.accelerator == "cpu", slug


def test_a_gpu_asked_for_on_a_cpu_machine_is_one_line_and_leaves_no_folder(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: trainer=gpu runs")
    proc = run_cli(["train", "experiment=tulip", "trainer=gpu", "debug=fdr", "logger=csv", f"paths.log_dir={tmp_path}"])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "gpu" in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not any(tmp_path.rglob("config.yaml")), "a refused run left a run folder"


CPU_ONLY = ("semdice", "semdice_deep", "semdice_finetune")


def test_only_the_methods_that_cannot_use_a_gpu_declare_cpu_only(tmp_path):
    declared = {s: compose_train([f"experiment={s}"], tmp_path).get("cpu_only") for s in SLUGS}
    assert sorted(s for s, why in declared.items() if why) == sorted(CPU_ONLY), declared
    for slug in CPU_ONLY:
        assert compose_train([f"experiment={slug}"], tmp_path).trainer.accelerator == "cpu", slug


@pytest.mark.parametrize(
    ("asked", "named"), [(["trainer=gpu"], "trainer=gpu"), (["trainer=ddp", "trainer.devices=2"], "trainer=ddp")]
)
def test_a_cpu_only_method_refuses_a_gpu_in_one_line_naming_why(asked, named, tmp_path, capsys):
    code = run_entry("train", ["experiment=semdice", *asked, "debug=fdr", "logger=csv", f"paths.log_dir={tmp_path}"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err[-2000:]
    assert errors[0].startswith(f"error: {named}: semdice runs only on the CPU (its gradient steps run in numpy")
    assert errors[0].endswith("use trainer=cpu (one process)") and "Traceback" not in err
    assert not any(tmp_path.rglob("config.yaml")), "a refused run left a run folder"


def test_cpu_only_reads_the_accelerator_auto_picks_on_this_machine(tmp_path, monkeypatch):
    cfg = compose_train(["experiment=semdice_deep", "trainer=default"], tmp_path)  # accelerator: auto
    monkeypatch.setattr(build, "_auto_picks_an_accelerator", lambda: False)
    build.check_cpu_only(cfg, {"trainer": "default"})  # a CPU machine: auto is the CPU
    monkeypatch.setattr(build, "_auto_picks_an_accelerator", lambda: True)
    with pytest.raises(ConfigError, match=r"^trainer.accelerator=auto: semdice_deep runs only on the CPU \(its eval"):
        build.check_cpu_only(cfg, {"trainer": "default"})
    build.check_cpu_only(compose_train(["experiment=semdice_deep"], tmp_path), {"trainer": "cpu"})
    build.check_cpu_only(compose_train(["experiment=tulip", "trainer=gpu"], tmp_path), {"trainer": "gpu"})


def _tiny_run(logs, *extra: str) -> None:
    args = [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.max_epochs=1", f"paths.log_dir={logs}"]
    assert run_entry("train", [*args, *extra]) == 0


def test_compare_labels_runs_by_what_they_ran_on_not_by_the_trainer_asked_for(tmp_path, capsys):
    """The fixture's experiment pins the CPU: ``trainer=gpu`` ran on the CPU, and was labelled ``trainer=gpu``."""
    logs = tmp_path / "logs"
    _tiny_run(logs, "trainer=gpu")
    _tiny_run(logs, "trainer=cpu")
    runs = sorted((logs / "train" / "spine_fixture" / "runs").iterdir())
    for run in runs:
        (ran,) = json.loads((run / "devices.json").read_text())
        assert ran == {
            "from_step": 0,
            "accelerator": "cpu",
            "devices": 1,
            "num_nodes": 1,
            "world_size": 1,
            "strategy": "single_device",
        }
    capsys.readouterr()
    compare_main(["--runs", str(logs / "train"), "--out", str(tmp_path / "cmp")])
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| run ")]
    assert "trainer=" not in table and len(rows) == 1 and "device=cpu" in rows[0], table  # one configuration
    assert "2 repeats of seed 0" in rows[0], table
    # the same run as a GPU machine's 4-process DDP run records it: its own group, named by what it ran on
    gpu = runs[0].parent / "zz_gpu"
    shutil.copytree(runs[0], gpu)
    ran = {"from_step": 0, "accelerator": "gpu", "devices": 4, "num_nodes": 1, "world_size": 4, "strategy": "ddp"}
    (gpu / "devices.json").write_text(json.dumps([ran]))
    compare_main(["--runs", str(logs / "train"), "--out", str(tmp_path / "cmp")])
    table = capsys.readouterr().out
    names = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| device=")]
    assert names == ["device=cpu", "device=gpu×4 ddp"], table
