"""`make claim ... PROFILE=paper` checks what its entries need before any starts (a CUDA device, the real dataset's
folder, the packages of the config's classes) and never writes a page over docs/ from a failed run.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from suite.claim import main as claim_main
from suite.preflight import entry_problems
from tests.conftest import ROOT

SPEC = str(ROOT / "tests" / "fixtures" / "conf" / "claim_paper_spine_fixture.yaml")


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_no_gpu_stops_before_any_entry_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("suite.preflight.cuda_device_count", lambda: 0)
    out, page = tmp_path / "runs", tmp_path / "page.md"
    code = None
    try:
        claim_main(
            [
                "spine_fixture",
                "--profile",
                "paper",
                "--spec",
                SPEC,
                "--out",
                str(out),
                "--page",
                str(page),
                "trainer.accelerator=gpu",
            ]
        )  # the fixture experiment pins cpu; a paper profile's runs would not
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert _errors(capsys.readouterr().err) == [
        "error: not starting the spine_fixture claim: 2 entries (sgd_lr005, sgd_lr001) need a GPU "
        "(trainer.accelerator=gpu) but CUDA finds no device here (nothing was run)"
    ]
    assert not out.exists() and not page.exists()


def test_entry_problems_name_the_missing_dataset_folder_and_package(tmp_path):
    cfg = OmegaConf.create(
        {
            "trainer": {"accelerator": "gpu", "devices": 4},
            "data": {
                "_target_": "datamodules.arena.ArenaDataModule",
                "source": "real",
                "data_dir": str(tmp_path / "no"),
            },
            "model": {"_target_": "not_a_package_here.Model"},
        }
    )
    assert entry_problems(cfg, cuda_devices=2) == [
        "trainer.devices=4 GPUs but CUDA finds 2",
        f"its dataset folder data.data_dir={tmp_path / 'no'} (data.source=real), which does not exist",
        "the package 'not_a_package_here' (for not_a_package_here.Model), which is not installed",
    ]
    (tmp_path / "no").mkdir()
    cfg.model._target_ = "lightning_modules.leaderbot.LeaderbotLitModule"
    assert entry_problems(cfg, cuda_devices=4) == []


def test_a_failed_paper_run_writes_its_page_beside_the_runs_never_into_docs(tmp_path, capsys):
    out = tmp_path / "runs"
    docs_page = ROOT / "docs" / "results" / "paper" / "spine_fixture.md"
    assert not docs_page.exists()
    code = None
    try:  # on CPU (the extra override wins over the profile's trainer=gpu), one seed of one entry, failing at step 1
        claim_main(
            [
                "spine_fixture",
                "--profile",
                "paper",
                "--spec",
                SPEC,
                "--out",
                str(out),
                "--only",
                "sgd_lr005",
                "--seeds",
                "0",
                "trainer=cpu",
                "model.nan_at_step=1",
            ]
        )
    except SystemExit as exc:
        code = exc.code
    try:
        assert code == 2
        assert not docs_page.exists()
        assert (out / "spine_fixture.md").is_file()
        assert _errors(capsys.readouterr().err) == [
            f"error: claim runs failed: sgd_lr005@seed=0 (see {out / 'spine_fixture.md'})"
        ]
    finally:
        docs_page.unlink(missing_ok=True)


def test_smoke_of_a_paper_profile_runs_one_batch_on_cpu_into_logs(tmp_path, capsys):
    """`make claim METHOD=x PROFILE=paper ARGS=--smoke`: one seed of one entry, one batch on CPU, no page."""
    out = tmp_path / "smoke"
    claim_main(["spine_fixture", "--profile", "paper", "--spec", SPEC, "--smoke", "--out", str(out)])
    run = out / "sgd_lr005" / "0"
    assert "smoke of the paper profile of spine_fixture passed in " in capsys.readouterr().out
    config = (run / "config.yaml").read_text()
    assert (run / "metrics.json").is_file() and "smoke: true" in config and "fast_dev_run: true" in config
    assert [p.name for p in out.iterdir()] == ["sgd_lr005"] and not list(tmp_path.rglob("*.md"))


def test_claim_main_gives_back_the_callers_sigterm_handler(tmp_path, capsys):
    """main() in-process (as these tests call it) must not leave its exit-on-SIGTERM handler behind: a later test in
    the same worker that sends itself SIGTERM (the resume tests) would exit instead of checkpointing."""
    import signal

    def mine(*_):
        return None

    before = signal.signal(signal.SIGTERM, mine)
    try:
        claim_main(["spine_fixture", "--profile", "paper", "--spec", SPEC, "--smoke", "--out", str(tmp_path / "s")])
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
