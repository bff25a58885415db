"""Devices are what the user asked: an experiment picks its default device through the defaults list
(``override /trainer: cpu``), never by pinning ``trainer.accelerator``, so ``trainer=gpu`` / ``trainer=ddp`` on the
command line win; a GPU asked for on a machine without one is a one-line error, not a silent CPU run."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import ROOT, compose_train, run_cli

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
