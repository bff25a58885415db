"""A claim's runs and its verdict table reach wandb (offline), read back from the offline files with the suite's
reader; ``--no-wandb`` keeps a claim on CSV alone."""

from __future__ import annotations

import json

from suite.claim import WANDB, entry_command
from suite.loggers import claim_tables
from suite.wandb_reader import find_wandb_files, wait_for_wandb_run
from tests.conftest import ROOT, run_cli

FIXTURE_SPEC = str(ROOT / "tests/fixtures/conf/claim_spine_fixture.yaml")
ENTRY = {"name": "sgd_lr001", "overrides": "model.optimizer.lr=0.01"}


def test_wandb_switches_the_claim_runs_logger(tmp_path):
    on = entry_command("spine_fixture", ENTRY, {WANDB: True, "logger": "csv"}, tmp_path, [])
    assert {"logger=wandb", "group=spine_fixture", "logger.wandb.job_type=sgd_lr001"} <= set(on)
    assert "logger.wandb.system_metadata=false" in on  # many short runs: no per-run machine probe
    assert "run_name=spine_fixture-sgd_lr001-s${seed}" in on and "logger=csv" not in on
    for spec in ({WANDB: False, "logger": "csv"}, {}):  # --no-wandb; a caller that never set it
        off = entry_command("spine_fixture", ENTRY, spec, tmp_path, [])
        assert "logger=csv" in off and not any(o.startswith(("group=", "logger.wandb", "run_name=")) for o in off)


def test_a_claim_logs_its_runs_and_a_summary_with_its_verdict_table(tmp_path):
    """`python -m suite.claim spine_fixture --only sgd_lr001` (one entry, one seed, one epoch): its run in wandb
    (grouped by claim and entry, CSV kept), then a summary run holding the data file's tables and verdicts."""
    out, page = tmp_path / "runs", tmp_path / "page.md"
    args = ["suite.claim", "spine_fixture", "--spec", FIXTURE_SPEC, "--out", str(out), "--page", str(page)]
    proc = run_cli([*args, "--only", "sgd_lr001", "trainer.max_epochs=1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = out / "sgd_lr001" / "0"
    assert (folder / "csv" / "metrics.csv").is_file()  # the pages are built from the CSV
    (file,) = find_wandb_files(folder)
    run = wait_for_wandb_run(file)
    assert (run.name, run.group, run.job_type) == ("spine_fixture-sgd_lr001-s1", "spine_fixture", "sgd_lr001")
    assert "metrics.json" in run.files

    (file,) = find_wandb_files(out / "summary")
    summary = wait_for_wandb_run(file)
    assert summary.complete and "wandb summary run: " in proc.stdout
    assert (summary.name, summary.group, summary.job_type) == ("spine_fixture-claims", "spine_fixture", "summary")
    data = json.loads((tmp_path / "data" / "page.json").read_text())
    tables = claim_tables(data)
    claims = summary.table("claims")
    assert claims["columns"] == tables["claims"][0] and len(claims["data"]) == 1
    row = dict(zip(claims["columns"], claims["data"][0], strict=True))
    assert (row["claim"], row["verdict"]) == ("lr005_vs_lr001", data["claims"][0]["verdict"])
    assert summary.summary["verdict/lr005_vs_lr001"] == data["claims"][0]["verdict"]
    runs = summary.table("runs")
    mse = runs["columns"].index("test/mse")
    assert [(r[0], r[1]) for r in runs["data"]] == [("sgd_lr001", 1)]
    assert runs["data"][0][mse] == data["runs"][0]["metrics"]["test/mse"]
    assert summary.media("plots/spine_fixture")  # the page's plot

    # --no-wandb: the page is rebuilt, no summary run is made
    again = run_cli([*args, "--report-only", "--no-wandb"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "wandb summary run" not in again.stdout and find_wandb_files(out / "summary") == [file]
