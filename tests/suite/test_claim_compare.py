"""`make claim` machinery (multirun over seeds -> results page) and `make compare` (table + PNGs)."""

from __future__ import annotations

import pytest

from suite.compare import compare, find_runs, read_run
from tests.conftest import ROOT, run_cli


@pytest.mark.slow
def test_claim_runs_each_entry_over_seeds_and_writes_page(tmp_path):
    page = tmp_path / "page.md"
    proc = run_cli(
        ["suite.claim", "spine_fixture", "--spec", str(ROOT / "tests/fixtures/conf/claim_spine_fixture.yaml"),
         "--out", str(tmp_path / "runs"), "--page", str(page), "trainer.max_epochs=1"],
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = page.read_text()
    assert "| sgd_lr005 | `model.optimizer.lr=0.05` | ok |" in text
    assert "(n=2)" in text  # two seeds aggregated
    assert (tmp_path / "spine_fixture.png").stat().st_size > 1000
    assert "| steps | 2 epochs | 1 epoch |" in text and "## Sizing: has every entry plateaued?" in text
    assert "| sgd_lr005 | " in text.split("## Sizing")[1]  # one plateau line per entry
    runs = find_runs([tmp_path / "runs"])
    assert len(runs) == 3  # sgd_lr001 sets its own seeds: [1]
    records = [read_run(r) for r in runs]
    assert {r.seed for r in records} == {0, 1}
    assert [r.seed for r in records if "sgd_lr001" in str(r.path)] == [1]
    assert "| sgd_lr001 | `model.optimizer.lr=0.01` (seeds [1]) | ok |" in text
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
    proc = run_cli(
        ["suite.claim", "spine_fixture", "--spec", str(ROOT / "tests/fixtures/conf/claim_spine_fixture.yaml"),
         "--out", str(tmp_path / "runs"), "--page", str(page), "--report-only"],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rebuilt = page.read_text()
    assert "| sgd_lr005 | `model.optimizer.lr=0.05` | ok |" in rebuilt
    assert "reused" not in rebuilt and "(n=2)" in rebuilt
    assert rebuilt.rstrip().endswith("Verdict: a higher learning rate wins.")
    # `--only` reruns one entry and keeps the other entries' status (how a claim is split over processes).
    import json

    status_file = tmp_path / "runs" / "claim_status.json"
    before = json.loads(status_file.read_text())
    proc = run_cli(
        ["suite.claim", "spine_fixture", "--spec", str(ROOT / "tests/fixtures/conf/claim_spine_fixture.yaml"),
         "--out", str(tmp_path / "runs"), "--page", str(page), "--only", "sgd_lr001", "trainer.max_epochs=1"],
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = json.loads(status_file.read_text())
    assert after["sgd_lr005"] == before["sgd_lr005"] and after["sgd_lr001"] != before["sgd_lr001"]
    assert "| sgd_lr005 | `model.optimizer.lr=0.05` | ok |" in page.read_text()


def test_claim_unknown_spec_is_one_line(tmp_path):
    proc = run_cli(["suite.claim", "no_such_paper", "--out", str(tmp_path)])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: no claim check for 'no_such_paper'")


def test_claim_only_unknown_name_is_one_line(tmp_path):
    proc = run_cli(
        ["suite.claim", "spine_fixture", "--spec", str(ROOT / "tests/fixtures/conf/claim_spine_fixture.yaml"),
         "--out", str(tmp_path), "--only", "sgd_lr005,nope"],
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--only names ['nope'] are not runs of spine_fixture" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "sgd_lr005").exists()  # nothing ran


def test_claim_only_runs_the_entries_in_the_order_given():
    from suite.claim import select_entries
    from suite.errors import ConfigError

    spec = {"runs": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}
    assert [e["name"] for e in select_entries("x", spec, None)] == ["a", "b", "c"]
    # a queue split puts its slow entries first: the order of --only, not the spec's; repeats run once
    assert [e["name"] for e in select_entries("x", spec, " c, a,c ")] == ["c", "a"]
    with pytest.raises(ConfigError, match=r"--only names \['z'\] are not runs of x \(runs: a, b, c\)"):
        select_entries("x", spec, "a,z")


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

    cmd = [sys.executable, "-m", "suite.claim", "spine_fixture", "--spec",
           str(ROOT / "tests/fixtures/conf/claim_spine_fixture.yaml"), "--out", str(tmp_path / "runs"),
           "--page", str(tmp_path / "page.md"), "trainer.max_epochs=100000"]  # fmt: skip
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
