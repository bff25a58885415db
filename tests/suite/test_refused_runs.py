"""A refused run leaves nothing: no run folder, no wandb run, no CSV log (`make compare` would count it as an
unfinished run), for `make train` and `make eval` alike."""

from __future__ import annotations

import pytest

from tests.conftest import run_entry


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["experiment=leaderbot", "trainer.max_epochs=-5"], "error: trainer: MisconfigurationException: `max_epochs`"),
        (["experiment=leaderbot", "model.lr=abc"], "error: model.newton.lr='abc' must be float"),
        (
            ["experiment=badloss", "debug=fdr", "data.source=real", "data.data_dir=/nonexistent/fmnist"],
            "error: Fashion-MNIST data_dir /nonexistent/fmnist does not exist",
        ),
        (
            ["experiment=ts_lif", "data.source=real", "data.dataset=metr_la", "data.data_dir=CORRUPT"],
            "error: CORRUPT/metr-la.h5: not a readable pandas HDF5 store",
        ),
    ],
)
def test_a_refused_training_run_leaves_nothing(args: list[str], expected: str, tmp_path, capsys):
    """With the default loggers (wandb offline + CSV): the trainer's settings and the data are checked before any
    logger starts its run."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "metr-la.h5").write_bytes(bytes(range(256)) * 64)
    args = [a.replace("CORRUPT", str(tmp_path / "data")) for a in args]
    expected = expected.replace("CORRUPT", str(tmp_path / "data"))
    logs = tmp_path / "logs"
    code = run_entry("train", [*args, f"paths.log_dir={logs}"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and errors[0].startswith(expected), errors
    assert sorted(p.relative_to(logs) for p in logs.rglob("*")) == [], "a refused run left files behind"


@pytest.mark.parametrize("kind", ["missing", "corrupt"])
def test_make_eval_of_a_missing_or_corrupt_checkpoint_leaves_no_folder(kind: str, tmp_path, capsys):
    """`make eval CKPT=<missing or corrupt>` left `logs/eval/checkpoint/runs/<time>/` (a slug made up from the
    file name)."""
    ckpt = tmp_path / "checkpoint.ckpt"
    if kind == "corrupt":
        ckpt.write_bytes(bytes(range(256)) * 64)
    logs = tmp_path / "logs"
    code = run_entry("evaluate", [f"ckpt_path={ckpt}", f"paths.log_dir={logs}"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    expected = f"error: checkpoint {ckpt} is truncated" if kind == "corrupt" else f"error: checkpoint not found: {ckpt}"
    assert code == 2 and len(errors) == 1 and errors[0].startswith(expected), errors
    assert sorted(p.relative_to(logs) for p in logs.rglob("*")) == [], "a refused evaluation left files behind"
