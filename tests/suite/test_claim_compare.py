"""`make claim` machinery (multirun over seeds -> results page) and `make compare` (table + PNGs)."""

from __future__ import annotations

import json

import pytest

from suite.compare import compare, find_runs, read_run
from tests.conftest import ROOT, run_cli

FIXTURE_SPEC = str(ROOT / "tests/fixtures/conf/claim_spine_fixture.yaml")


def run_fixture_claim(tmp_path, page, *args, timeout=600):
    """``python -m suite.claim spine_fixture`` into ``tmp_path/runs`` with ``page``, plus ``args``; must succeed."""
    proc = run_cli(
        [
            "suite.claim",
            "spine_fixture",
            "--spec",
            FIXTURE_SPEC,
            "--out",
            str(tmp_path / "runs"),
            "--page",
            str(page),
            *args,
        ],
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_claim_runs_each_entry_over_seeds_and_writes_page(tmp_path):
    page = tmp_path / "page.md"
    # --jobs 2: the (entry, seed) pairs as two one-thread processes at once, each into its full-run folder
    run_fixture_claim(tmp_path, page, "trainer.max_epochs=1", "--jobs", "2", timeout=900)
    text = page.read_text()
    assert "| sgd_lr005 | `model.optimizer.lr=0.05` | ok |" in text
    assert "(n=2)" in text  # two seeds aggregated
    assert (tmp_path / "spine_fixture.png").stat().st_size > 1000
    assert "| steps | 2 epochs | 1 epoch |" in text and "## Convergence: has every entry converged?" in text
    assert "| sgd_lr005 | " in text.split("## Convergence")[1]  # one convergence line per entry
    # the declared claim leads the page, with the per-seed values it read (one common seed: no interval)
    assert text.index("## Verdicts") < text.index("## Runs")
    assert "| the higher learning rate fits better at an equal budget (`lr005_vs_lr001`, primary) |" in text
    assert "| `lr005_vs_lr001` | sgd_lr001 | test/mse | 1: " in text
    data = json.loads((tmp_path / "data" / "page.json").read_text())
    assert {(r["entry"], r["seed"]) for r in data["runs"]} == {("sgd_lr005", 0), ("sgd_lr005", 1), ("sgd_lr001", 1)}
    assert all(0 < len(r["curves"]["val/loss"]) <= 200 for r in data["runs"])
    assert data["claims"][0]["id"] == "lr005_vs_lr001" and data["status"]["sgd_lr005@seed=1"][0] == 0
    assert all("num_threads=1" in p.read_text() for p in (tmp_path / "runs").rglob("overrides.yaml"))
    # --plan: the seeds the claim needs, from the runs on disk; runs nothing
    plan = run_fixture_claim(tmp_path, page, "--plan").stdout
    assert "lr005_vs_lr001" in plan and "seeds needed" in plan
    runs = find_runs([tmp_path / "runs"])
    assert len(runs) == 3  # sgd_lr001 sets its own seeds: [1]
    records = [read_run(r) for r in runs]
    assert {r.seed for r in records} == {0, 1}
    assert [r.seed for r in records if "sgd_lr001" in str(r.path)] == [1]
    assert "| sgd_lr001 | `model.optimizer.lr=0.01` (seeds [1]) | ok |" in text
    # every entry recorded its start (eval_at_start): the weak-baseline rule reads the baseline against it
    assert "| sgd_lr001 | no | improves on its start: `val/loss`" in text
    # A higher learning rate fits this problem faster at an equal budget: the table must show it.
    lr05 = [r.metrics["test/mse"] for r in records if "sgd_lr005" in str(r.path)]
    lr01 = [r.metrics["test/mse"] for r in records if "sgd_lr001" in str(r.path)]
    assert max(lr05) < min(lr01)
    md = compare(records, tmp_path / "cmp", ["test/mse"])
    assert md.count("\n") == 3  # header, rule, 2 groups
    assert (tmp_path / "cmp" / "curves.png").exists()
    # Rebuilding the page from the finished runs keeps each run's status and wall time, and appends the
    # hand-written reading kept next to the page.
    page.unlink()
    (tmp_path / "page_notes.md").write_text("## Reading\n\nVerdict: a higher learning rate wins.\n")
    run_fixture_claim(tmp_path, page, "--report-only")
    rebuilt = page.read_text()
    assert "| sgd_lr005 | `model.optimizer.lr=0.05` | ok |" in rebuilt
    assert "reused" not in rebuilt and "(n=2)" in rebuilt
    assert rebuilt.rstrip().endswith("Verdict: a higher learning rate wins.")
    # on a clean clone the runs are gone: the page rebuilds from its data file alone, the same page
    (tmp_path / "runs").rename(tmp_path / "away")
    run_fixture_claim(tmp_path, page, "--report-only", "--no-wandb")  # with wandb its summary run would make runs/
    assert page.read_text() == rebuilt
    (tmp_path / "away").rename(tmp_path / "runs")
    # a run of another design (an override the spec now gives otherwise) never replaces the data file's page
    stale = next((tmp_path / "runs" / "sgd_lr005").rglob("overrides.yaml")).parent.parent
    saved = {f: f.read_text() for f in (stale / ".hydra" / "overrides.yaml", stale / "metrics.json")}
    (stale / ".hydra" / "overrides.yaml").write_text(saved[stale / ".hydra" / "overrides.yaml"].replace("0.05", "0.07"))
    (stale / "metrics.json").write_text(json.dumps({**json.loads(saved[stale / "metrics.json"]), "test/mse": 123.25}))
    proc = run_fixture_claim(tmp_path, page, "--report-only", "--no-wandb", "trainer.max_epochs=1")
    assert "123.2" not in page.read_text()
    assert "made under another design than the spec's" in proc.stdout and "model.optimizer.lr=0.07" in proc.stdout
    for f, text in saved.items():
        f.write_text(text)

    status_file = tmp_path / "runs" / "claim_status.json"
    after = json.loads(status_file.read_text())

    # `--seeds` reruns one seed of each selected entry, alone, into the folder the full run gave it: its index in
    # the entry's seeds (sgd_lr005: [0, 1] -> 1; sgd_lr001: [1] -> 0), and keeps the other seed's run.
    def metrics_files(entry, sub):
        found = (tmp_path / "runs" / entry / sub).rglob("metrics.json")
        return sorted(p for p in found if "wandb" not in p.parts)  # not the copy the run logged to wandb

    (seed0,), (seed1,), (own,) = (
        metrics_files("sgd_lr005", "0"),
        metrics_files("sgd_lr005", "1"),
        metrics_files("sgd_lr001", "0"),
    )
    t0, t1, t_own = seed0.stat().st_mtime_ns, seed1.stat().st_mtime_ns, own.stat().st_mtime_ns
    run_fixture_claim(tmp_path, page, "--only", "sgd_lr005,sgd_lr001", "--seeds", "1", "trainer.max_epochs=1")
    assert seed0.stat().st_mtime_ns == t0 and seed1.stat().st_mtime_ns != t1 and own.stat().st_mtime_ns != t_own
    assert read_run(seed1.parent).seed == 1 and read_run(own.parent).seed == 1
    assert len(find_runs([tmp_path / "runs"])) == 3  # no extra folder
    split = json.loads(status_file.read_text())
    # the other seed's status is kept beside the rerun one's, and the entry's is their sum
    assert split["sgd_lr005@seed=0"] == after["sgd_lr005@seed=0"] and split["sgd_lr005@seed=1"][0] == 0
    assert split["sgd_lr005"][1] == split["sgd_lr005@seed=0"][1] + split["sgd_lr005@seed=1"][1]
    # sgd_lr001 runs only seed 1: rerun alone, nothing of the earlier run is left
    assert "sgd_lr001@seed=*" not in split and split["sgd_lr001"] == split["sgd_lr001@seed=1"]
    assert "ok | " + f"{split['sgd_lr001'][1]:.0f} s (sum of one-seed runs of seed 1)" in page.read_text()
    assert "| sgd_lr005 | `model.optimizer.lr=0.05` | ok | " in page.read_text()
    assert "(sum of one-seed runs of seeds 0, 1)" in page.read_text()
    # `--only` reruns one entry and keeps the other entries' status (how a claim is split over processes); a
    # whole-entry run replaces the per-seed statuses
    run_fixture_claim(tmp_path, page, "--only", "sgd_lr001", "trainer.max_epochs=1")
    whole = json.loads(status_file.read_text())
    assert not any(k.startswith("sgd_lr001@") for k in whole) and "sgd_lr005@seed=1" in whole
    assert whole["sgd_lr005"] == split["sgd_lr005"] and whole["sgd_lr001"] != split["sgd_lr001"]
    assert "| sgd_lr005 | `model.optimizer.lr=0.05` | ok |" in page.read_text()


def _run_folder(path, overrides):
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return path


def test_stale_runs_are_the_runs_the_spec_would_not_make(tmp_path):
    """A redesigned claim's folders may still hold the former design's runs: a run is stale when its seed is not its
    entry's or an override the spec gives the entry is missing or set otherwise (compared as Hydra parses them)."""
    from suite.claim import stale_runs
    from suite.compare import RunRecord

    spec = {
        "runs": [{"name": "a", "overrides": "model.lr=0.05 data.task=overwrite"}, {"name": "b", "seeds": [3]}],
        "seeds": [0, 1],
        "overrides": "trainer.max_epochs=2 eval_at_start=true",
    }
    base = ["experiment=x", "eval_at_start=True", "trainer.max_epochs=2", "seed=0"]
    fresh = _run_folder(tmp_path / "fresh", [*base, "model.lr=0.05", "data.task=overwrite", "num_threads=1"])
    other = _run_folder(tmp_path / "other", [*base, "model.lr=0.5", "data.task=overwrite"])
    missing = _run_folder(tmp_path / "missing", [*base, "model.lr=0.05"])
    b = _run_folder(tmp_path / "b", ["experiment=x", "eval_at_start=true", "trainer.max_epochs=2", "seed=3"])
    records = [
        RunRecord(fresh, "a", 0),
        RunRecord(other, "a", 0),
        RunRecord(missing, "a", 1),
        RunRecord(tmp_path / "b", "b", 3),
        RunRecord(tmp_path / "b", "b", 0),
    ]
    stale = stale_runs("x", spec, records[:4], [])
    assert set(stale) == {other, missing}
    assert "model.lr=0.5" in stale[other] and "0.05" in stale[other] and "data.task" in stale[missing]
    assert "seed 0 is not one of the entry's seeds [3]" in stale_runs("x", spec, records[4:], [])[b]
    assert stale_runs("x", spec, records[:2], ["model.lr=0.5"]) == {}  # a key set on the command line is not checked
    assert stale_runs("y", spec, records[:1], []) == {fresh: "made with experiment='x', the spec gives 'y'"}


def test_claim_unknown_spec_is_one_line(tmp_path):
    proc = run_cli(["suite.claim", "no_such_paper", "--out", str(tmp_path)])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: no claim check for 'no_such_paper'")


def test_report_only_without_runs_leaves_the_page_alone(tmp_path):
    """A fresh clone has no run folders: `make claim METHOD=x ARGS=--report-only` must not blank a results page."""
    page = tmp_path / "page.md"
    page.write_text("# results that took an hour\n")
    proc = run_cli(
        [
            "suite.claim",
            "spine_fixture",
            "--spec",
            FIXTURE_SPEC,
            "--out",
            str(tmp_path / "runs"),
            "--page",
            str(page),
            "--report-only",
        ]
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --report-only found no runs under")
    assert page.read_text() == "# results that took an hour\n"


def test_claim_only_unknown_name_is_one_line(tmp_path):
    proc = run_cli(
        ["suite.claim", "spine_fixture", "--spec", FIXTURE_SPEC, "--out", str(tmp_path), "--only", "sgd_lr005,nope"],
    )
    assert proc.returncode == 2
    assert "--only names ['nope'] are not runs of spine_fixture" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "sgd_lr005").exists()  # nothing ran


def test_claim_seeds_errors_are_one_line(tmp_path):
    spec = FIXTURE_SPEC
    for args, message in [
        (["--only", "sgd_lr001", "--seeds", "0"], "--seeds [0] are not seeds of the selected runs of spine_fixture"),
        (["--seeds", "0", "launcher=slurm"], "--seeds splits local runs over processes; with launcher=slurm"),
    ]:
        proc = run_cli(["suite.claim", "spine_fixture", "--spec", spec, "--out", str(tmp_path), *args])
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert message in proc.stderr.strip().splitlines()[-1]
    assert not any(tmp_path.iterdir())  # nothing ran


def test_claim_exit_code_counts_only_the_runs_of_this_process(tmp_path):
    """Split over processes, each claim process fails on its own runs: a seed that failed in another process (its
    status in the shared file) does not fail this one, and a failed one-seed run is named with its seed."""
    import json

    spec = FIXTURE_SPEC
    out = tmp_path / "runs"
    out.mkdir()
    (out / "claim_status.json").write_text(json.dumps({"sgd_lr005@seed=1": [1, 3.0], "sgd_lr005": [1, 3.0]}))
    page = tmp_path / "page.md"
    proc = run_cli(
        [
            "suite.claim",
            "spine_fixture",
            "--spec",
            spec,
            "--out",
            str(out),
            "--page",
            str(page),
            "--only",
            "sgd_lr001",
            "trainer.max_epochs=1",
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| sgd_lr005 | `model.optimizer.lr=0.05` | FAILED (exit 1) |" in page.read_text()  # still shown
    proc = run_cli(
        [
            "suite.claim",
            "spine_fixture",
            "--spec",
            spec,
            "--out",
            str(out),
            "--page",
            str(page),
            "--only",
            "sgd_lr001",
            "--seeds",
            "1",
            "trainer.max_epochs=oops",
        ],
        timeout=600,
    )
    assert proc.returncode == 2
    assert "claim runs failed: sgd_lr001@seed=1" in proc.stderr.strip().splitlines()[-1]
    status = json.loads((out / "claim_status.json").read_text())
    assert status["sgd_lr001@seed=1"][0] != 0 and status["sgd_lr001"][0] != 0 and status["sgd_lr005"][0] == 1


def test_claim_only_runs_the_entries_in_the_order_given():
    from core.errors import ConfigError
    from suite.claim import select_entries

    spec = {"runs": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}
    assert [e["name"] for e in select_entries("x", spec, None)] == ["a", "b", "c"]
    # a queue split puts its slow entries first: the order of --only, not the spec's; repeats run once
    assert [e["name"] for e in select_entries("x", spec, " c, a,c ")] == ["c", "a"]
    with pytest.raises(ConfigError, match=r"--only names \['z'\] are not runs of x \(runs: a, b, c\)"):
        select_entries("x", spec, "a,z")


def test_claim_seeds_splits_an_entry_by_seed():
    from core.errors import ConfigError
    from suite.claim import entry_command, record_status, select_seeds

    spec = {"runs": [{"name": "a"}, {"name": "b", "seeds": [2]}], "seeds": [0, 1, 2], "overrides": ""}
    assert select_seeds("x", spec, spec["runs"], None) == {}
    # each entry runs the named seeds it has, in the order given; an entry with none of them is left out
    assert select_seeds("x", spec, spec["runs"], "2, 1") == {"a": [2, 1], "b": [2]}
    assert select_seeds("x", spec, spec["runs"], "1") == {"a": [1]}
    with pytest.raises(ConfigError, match=r"--seeds \[7\] are not seeds of the selected runs of x"):
        select_seeds("x", spec, spec["runs"], "1,7")
    with pytest.raises(ConfigError, match="comma-separated integers, got 'one'"):
        select_seeds("x", spec, spec["runs"], "one")
    with pytest.raises(ConfigError, match="--seeds names no seed"):
        select_seeds("x", spec, spec["runs"], " , ")
    # one seed goes to the subfolder a run of all the entry's seeds gives it: its index in the entry's seeds
    cmd = entry_command("x", spec["runs"][1], spec, ROOT / "out", [], seed=2)
    assert "seed=2" in cmd and "hydra.sweep.subdir=0" in cmd
    cmd = entry_command("x", spec["runs"][0], spec, ROOT / "out", ["hydra.sweep.subdir=9"], seed=2)
    assert "seed=2" in cmd and "hydra.sweep.subdir=2" in cmd and "hydra.sweep.subdir=9" not in cmd
    assert "seed=0,1,2" in entry_command("x", spec["runs"][0], spec, ROOT / "out", [])
    # the entry's status: the worst exit code and the summed wall time of its one-seed runs
    status = record_status({"b": (0, 5.0)}, "a", 0, (0, 10.0))
    status = record_status(status, "a", 2, (1, 4.0))
    assert status["a"] == (1, 14.0) and status["b"] == (0, 5.0)
    assert record_status(status, "a", 2, (0, 6.0))["a"] == (0, 16.0)  # a rerun of a seed replaces its status
    # a failed whole-entry run stays in the entry's status after one seed is rerun alone (its other seeds are
    # still that run's); a whole-entry run replaces every per-seed status
    status = record_status({"a": (1, 30.0)}, "a", 1, (0, 10.0))
    assert status == {"a": (1, 40.0), "a@seed=*": (1, 30.0), "a@seed=1": (0, 10.0)}
    assert record_status(status, "a", None, (0, 25.0)) == {"a": (0, 25.0)}
    # once every one of the entry's seeds has run alone, the earlier whole-entry run no longer counts
    status = record_status(status, "a", 0, (0, 7.0), seeds=[0, 1])
    assert status == {"a": (0, 17.0), "a@seed=0": (0, 7.0), "a@seed=1": (0, 10.0)}
    assert record_status({"a_long@seed=1": (0, 1.0)}, "a", 1, (0, 2.0))["a"] == (0, 2.0)  # another entry's seeds


def test_compare_no_runs_is_one_line(tmp_path):
    proc = run_cli(["suite.compare", "--method", "leaderbot", "--logs", str(tmp_path)])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: no runs of 'leaderbot'")


@pytest.mark.slow
def test_stopping_a_claim_stops_its_run(tmp_path):
    """SIGTERM to `suite.claim` must not orphan the `train -m` run, which would keep writing into the run folders."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    cmd = [
        sys.executable,
        "-m",
        "suite.claim",
        "spine_fixture",
        "--spec",
        FIXTURE_SPEC,
        "--out",
        str(tmp_path / "runs"),
        "--page",
        str(tmp_path / "page.md"),
        "trainer.max_epochs=100000",
    ]
    claim = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        children: list[psutil.Process] = []
        while not children and time.monotonic() < deadline and claim.poll() is None:
            time.sleep(0.5)
            children = psutil.Process(claim.pid).children()
        assert children, "the claim never started its run"
        time.sleep(2)
        claim.send_signal(signal.SIGTERM)
        assert claim.wait(timeout=60) != 0
        gone, alive = psutil.wait_procs(children, timeout=40)
        assert not alive, f"run still alive after the claim stopped: {alive}"
    finally:
        if claim.poll() is None:
            claim.kill()


def test_learning_rate_bookkeeping_stays_out_of_the_tables(tmp_path):
    """A run folder from before `lr-*` left metrics.json: the table never shows the learning-rate monitor's keys."""
    from suite.compare import aggregate, read_run

    (tmp_path / "metrics.json").write_text(json.dumps({"lr-Adam": 1e-3, "lr-AdamW/pg1": 2e-3, "val/acc": 0.5}))
    rec = read_run(tmp_path, name="a")
    assert rec.metrics == {"val/acc": 0.5}
    assert aggregate([rec])[1] == {"a": {"val/acc": (0.5, 0.0, 1)}}
