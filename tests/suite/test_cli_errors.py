"""Bad input gives one clear line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import FIXTURE_CONF, ROOT, run_cli, run_entry


def _error_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def test_unknown_method_lists_valid_slugs():
    proc = subprocess.run(
        ["make", "-s", "--no-print-directory", "train", "METHOD=not_a_paper"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    out = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(out) == 1, f"expected one line, got {out}"
    assert "error: unknown METHOD 'not_a_paper'; valid: " in out[0] and " leaderbot " in out[0]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.lrr=1", "error: unknown config key 'model.lrr' (did you mean 'model.optimizer.lr'?)"),
        ("data.batch_size=0", "error: data.batch_size=0 must be >= 1"),
        ("model.optimizer.lr=-1", "error: model.optimizer: Invalid learning rate: -1"),
        ("trainer=nope", "error: In 'train': Could not find 'trainer/nope'"),
    ],
)
def test_bad_config_is_one_clear_line(override: str, expected: str, tmp_path):
    proc = run_cli(
        ["train", FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", f"paths.log_dir={tmp_path}", override],
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = _error_lines(proc)
    assert len(errors) == 1, proc.stderr[-2000:]
    assert errors[0].startswith(expected), errors[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.max_epochs=abc", "error: trainer.max_epochs='abc' must be int or null"),
        ("data.batch_size=1.5", "error: data.batch_size=1.5 must be int"),
        ("trainer.limit_val_batches=all", "error: trainer.limit_val_batches='all' must be int or float or null"),
    ],
)
def test_wrong_value_type_is_one_line_naming_the_key(override: str, expected: str, tmp_path, capsys):
    """Checked against the constructor's annotations (Lightning's own failure is a 75-line AssertionError)."""
    code = run_entry(
        "train", [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", f"paths.log_dir={tmp_path}", override]
    )
    err = capsys.readouterr().err
    assert code == 2 and [line for line in err.splitlines() if line.startswith("error:")] == [expected], err[-2000:]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("seed=abc", "error: seed='abc' must be int"),
        ("seed=1.5", "error: seed=1.5 must be int"),
        ("train=yes", "error: train='yes' must be true or false"),
        ("num_threads=two", "error: num_threads='two' must be int or null"),
        (
            "paths.data_dir=5",
            "error: paths.data_dir=5 must be a string (a folder; quote a numeric name: paths.data_dir='5')",
        ),
    ],
)
def test_wrong_root_value_type_is_one_line_naming_the_key(override: str, expected: str, tmp_path, capsys):
    """Typed values of the root config: `seed=abc` is one line naming the key, not a traceback."""
    code = run_entry(
        "train", [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", f"paths.log_dir={tmp_path}", override]
    )
    err = capsys.readouterr().err
    assert code == 2 and [line for line in err.splitlines() if line.startswith("error:")] == [expected], err[-2000:]
    assert "Traceback" not in err


def test_make_eval_root_values_are_checked_too(tmp_path, capsys):
    code = run_entry("evaluate", [f"ckpt_path={tmp_path / 'x.ckpt'}", f"paths.log_dir={tmp_path}", "seed=abc"])
    err = capsys.readouterr().err
    assert code == 2 and [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: seed='abc' must be int"
    ], err[-2000:]


def test_a_trainer_value_is_reported_under_the_key_the_user_typed(tmp_path, capsys):
    """bracketire's `model.scheduler.total_steps: ${trainer.max_steps}`: the error names trainer.max_steps."""
    code = run_entry(
        "train", ["experiment=bracketire", "logger=csv", f"paths.log_dir={tmp_path}", "trainer.max_steps=2.5"]
    )
    err = capsys.readouterr().err
    assert code == 2 and [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: trainer.max_steps=2.5 must be int"
    ], err[-2000:]


def test_an_interpolated_value_names_its_source_key():
    from omegaconf import OmegaConf

    from core.errors import ConfigError
    from suite.build import check_value_types

    cfg = OmegaConf.create(
        {
            "trainer": {"max_steps": 2.5},
            "model": {
                "scheduler": {
                    "_target_": "torch.optim.lr_scheduler.OneCycleLR",
                    "_partial_": True,
                    "max_lr": 0.1,
                    "total_steps": "${trainer.max_steps}",
                }
            },
        }
    )
    with pytest.raises(ConfigError) as err:
        check_value_types(cfg.model.scheduler, "model.scheduler")
    assert str(err.value) == "trainer.max_steps=2.5 must be int or null (it sets model.scheduler.total_steps)"


def test_make_train_with_a_mistyped_seed_is_one_line(tmp_path):
    """`make train ARGS="seed=abc"` as a user types it: one line, exit 2, and no run folder left behind."""
    proc = subprocess.run(
        ["make", "-s", "--no-print-directory", "train", f"ARGS=seed=abc paths.log_dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    # make's own trailer (`make: *** [Makefile:..: train] Error 2`; `make[1]: ***` when this test runs under
    # `make test`) is the only other line
    trailer = re.compile(r"^make(\[\d+\])?: \*\*\* ")
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip() and not trailer.match(line)]
    assert lines == ["error: seed='abc' must be int"], lines
    assert not list(tmp_path.rglob("runs/*")), "a run that failed at config time left its folder"


def test_random_bytes_checkpoint_is_one_line_that_never_suggests_unsafe_loading(tmp_path, capsys):
    bad = tmp_path / "random.ckpt"
    bad.write_bytes(bytes(range(256)) * 64)
    code = run_entry("evaluate", [f"ckpt_path={bad}", f"paths.log_dir={tmp_path}"])
    out = capsys.readouterr()
    assert code == 2, out.err[-2000:]
    assert [line for line in out.err.splitlines() if line.startswith("error:")] == [
        f"error: checkpoint {bad} is truncated, corrupt or not weights-only loadable (not a PyTorch checkpoint "
        "file); use a checkpoint the suite wrote (<run>/checkpoints/last.ckpt)"
    ], out.err[-2000:]
    assert "weights_only=False" not in out.out + out.err


def test_corrupt_metr_la_h5_is_one_line_naming_the_file(tmp_path, capsys):
    (tmp_path / "metr-la.h5").write_bytes(bytes(range(256)) * 64)
    code = run_entry(
        "train",
        [
            "experiment=ts_lif",
            "logger=csv",
            "data.source=real",
            "data.dataset=metr_la",
            f"data.data_dir={tmp_path}",
            f"paths.log_dir={tmp_path / 'logs'}",
        ],
    )
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, errors
    assert errors[0].startswith(f"error: {tmp_path / 'metr-la.h5'}: not a readable pandas HDF5 store"), errors[0]
    assert "download the file again" in errors[0]


def _one_error(code: int, err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    return errors[0]


def test_leaderbot_mistyped_learning_rate_is_one_line(tmp_path, capsys):
    """`model.lr=abc` on leaderbot sets its solver's settings (a plain dict, no `_target_`): checked against the
    solver's annotations at construction, as preworld's `model.optimizer.lr` is (was a 70-line TypeError in fit)."""
    code = run_entry("train", ["experiment=leaderbot", "logger=csv", f"paths.log_dir={tmp_path}", "model.lr=abc"])
    assert _one_error(code, capsys.readouterr().err) == "error: model.newton.lr='abc' must be float"
    code = run_entry("train", ["experiment=leaderbot", "logger=csv", f"paths.log_dir={tmp_path}", "model.lr=5"])
    assert _one_error(code, capsys.readouterr().err).startswith("error: newton: max_iter=5, max_ls=30")


def test_another_papers_model_on_this_experiments_data_is_one_line(tmp_path, capsys):
    """`model=grass` under the leaderbot experiment (grass reads molecule graphs, the Arena yields vote counts: was a
    79-line AttributeError inside the first validation step)."""
    code = run_entry("train", ["experiment=leaderbot", "logger=csv", f"paths.log_dir={tmp_path}", "model=grass"])
    assert _one_error(code, capsys.readouterr().err) == (
        "error: model=grass does not run on data=arena (experiment=leaderbot); model grass trains on data=molecules: "
        "use experiment=grass"
    )


def test_make_slurm_without_slurm_is_one_line(tmp_path):
    """`make slurm` on a machine without SLURM: one line and no sweep folder (was submitit's 50-line RuntimeError
    "Could not detect srun"). PATH holds only what the Makefile runs, so an srun installed here is not found."""
    import os
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("make", "bash", "sh", "grep", "env"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    logs = tmp_path / "logs"
    proc = subprocess.run(
        [
            str(bin_dir / "make"),
            "-s",
            "--no-print-directory",
            "slurm",
            "METHOD=leaderbot",
            f"ARGS=trainer.max_epochs=1 paths.log_dir={logs}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": str(bin_dir)},
    )
    trailer = re.compile(r"^make(\[\d+\])?: \*\*\* ")
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip() and not trailer.match(line)]
    assert proc.returncode == 2 and lines == [
        "error: launcher=slurm: no SLURM on this machine (srun is not on PATH); run `make slurm` on a SLURM login "
        "node, or here without SLURM: make train / make sweep METHOD=<slug> ARGS=..."
    ], proc.stdout + proc.stderr
    assert not logs.exists()


def test_a_missing_data_dir_is_an_error_never_the_system_copy(tmp_path, capsys):
    """`data.source=real data.data_dir=<missing folder>` on badloss trained on the system's Fashion-MNIST copy and
    said nothing."""
    missing = tmp_path / "no_such_folder"
    code = run_entry(
        "train",
        [
            "experiment=badloss",
            "logger=csv",
            f"paths.log_dir={tmp_path / 'logs'}",
            "debug=fdr",
            "data.source=real",
            f"data.data_dir={missing}",
        ],
    )
    assert _one_error(code, capsys.readouterr().err).startswith(
        f"error: Fashion-MNIST data_dir {missing} does not exist (data.source=embedded uses the system copy"
    )


def test_model_and_data_variants_of_one_family_stay_the_users_choice():
    """Only another paper's model on data no experiment trains its LightningModule on is refused: the data and model
    swaps the docs and claim specs use pass."""
    from core.errors import ConfigError
    from suite.build import check_model_fits_data

    conf = ROOT / "conf"
    for experiment, model, data in [
        ("gated_deltanet", "gated_deltanet", "text"),  # its paper profile's FineWeb-Edu LM
        ("stickbreaking", "stickbreaking", "recall"),
        ("stickbreaking", "gated_deltanet", "text"),  # causal LMs: one LightningModule
        ("semdice_deep", "semdice_finetune", "gym_online"),  # the online APT baseline of its claim
        ("rx_dpm", "rx_dpm_unet", "fashion_mnist"),
        ("ts_lif", "ts_lif", "electricity"),
    ]:
        check_model_fits_data({"experiment": experiment, "model": model, "data": data}, conf)
    with pytest.raises(ConfigError, match="model=leaderbot does not run on data=poisoned"):
        check_model_fits_data({"experiment": "badloss", "model": "leaderbot", "data": "poisoned"}, conf)
