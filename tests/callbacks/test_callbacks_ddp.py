"""The shared callbacks under 2-process CPU DDP (gloo, ``trainer=ddp_cpu``), against one process.

Two runs through the train entry point with ``debug=fdr``, each once with ``trainer=ddp_cpu`` (a subprocess: Lightning
relaunches the command for rank 1) and once with ``trainer=cpu`` (in this process), at the same global batch:

* the MDA subject (a ViT) with
  :class:`~callbacks.loss_dynamics.LossDynamics`, :class:`~callbacks.quant_classifier.ClassifierQuantCalibration`
  and :class:`~callbacks.tta.TestTimeAdaptation` (Tent);
* the OSTQuant LM with its own :class:`~callbacks.quant_calibration.QuantCalibration`.

Loss dynamics and quantization give the one-process numbers (every example's loss once, in its row; calibration on
the pooled batches, counts summed over the ranks). TTA adapts each rank on its own shard by design (its docstring):
the test checks the documented behaviour, both ranks' rows in ``tta_history.csv``, ranks that drifted apart, and
logged accuracies that pool every rank's stream.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli, run_entry

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

#: ``model.optimizer.lr=0``: the one training step of ``debug=fdr`` leaves the weights as they were on one process and
#: on two (float32 sums in another order would otherwise move a few weights across a 4-bit rounding boundary, and the
#: quantized numbers by ~1%, hiding what the test is after; the training itself under DDP is tests/suite/test_ddp.py's
#: and test_loss_dynamics.py's).
FROZEN = "model.optimizer.lr=0"
MDA = [
    FROZEN,
    "data.subset=1000",
    "data.test_subset=200",
    "++callbacks.loss_dynamics._target_=callbacks.loss_dynamics.LossDynamics",
    "++callbacks.loss_dynamics.capacity=2",
    "callbacks=quant_classifier",
    "callbacks.quant_calibration.methods=[fp,rtn,smoothquant,quarot,ostquant]",
    "callbacks.quant_calibration.calib_batches=1",
    "++callbacks.tta._target_=callbacks.tta.TestTimeAdaptation",
    "++callbacks.tta.method=tent",
    "++callbacks.tta.lr=0.01",
]
LM = [FROZEN, "callbacks.quant_calibration.calib_batches=1"]


def _runs(slug: str, extra: list[str], tmp_path: Path, capsys) -> dict[str, tuple[Path, dict[str, float]]]:  # noqa: ANN001
    """``{"one": (run folder, metrics), "ddp": ...}`` of the same ``debug=fdr`` command on one and two processes."""
    common = [f"experiment={slug}", "debug=fdr", "logger=csv", "trainer.enable_progress_bar=false", *extra]
    out = {}
    code = run_entry("train", [*common, "trainer=cpu", f"paths.log_dir={tmp_path / 'one'}"])
    assert code == 0, capsys.readouterr().err[-3000:]
    proc = run_cli(["train", *common, "trainer=ddp_cpu", f"paths.log_dir={tmp_path / 'ddp'}"], timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("one", "ddp"):
        (run,) = (tmp_path / name / "debug" / slug / "runs").iterdir()
        out[name] = run, json.loads((run / "metrics.json").read_text())
    return out


def test_classifier_callbacks_under_ddp(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    runs = _runs("mda", MDA, tmp_path, capsys)
    (one_dir, one), (ddp_dir, ddp) = runs["one"], runs["ddp"]

    # Loss dynamics: the ranks' shards gathered by example index give the one-process matrix, every row once.
    single = torch.load(one_dir / "loss_dynamics.pt", weights_only=True)["values"]
    both = torch.load(ddp_dir / "loss_dynamics.pt", weights_only=True)["values"]
    assert single.shape == both.shape and single.shape[1] == 1 and single.shape[0] >= 100, single.shape
    assert bool(torch.isfinite(both).all()), "rows no rank scored"
    assert float(single.std()) > 0
    torch.testing.assert_close(both, single, rtol=1e-5, atol=1e-6)

    # Classifier quantization: calibration on the pooled batches, counts summed: the one-process numbers.
    methods = ("fp", "rtn", "smoothquant", "quarot", "ostquant")
    for method in methods:
        assert ddp[f"quant/{method}_acc"] == pytest.approx(one[f"quant/{method}_acc"], abs=1e-9), method
        assert ddp[f"quant/{method}_kl"] == pytest.approx(one[f"quant/{method}_kl"], rel=1e-4, abs=1e-9), method
        if method != "fp":
            assert ddp[f"quant/{method}_kl"] > 1e-6, method  # quantized: not full precision
    (record,) = ddp_dir.rglob("quant_calibration.json")
    assert list(json.loads(record.read_text())["results"]) == list(methods)

    # TTA: each rank adapts on its own shard (documented): both ranks' rows, ranks that drifted apart, pooled metrics.
    with (ddp_dir / "tta_history.csv").open() as f:
        rows = list(csv.DictReader(f))
    by_rank = {r: [row for row in rows if float(row["rank"]) == r] for r in (0.0, 1.0)}
    assert len(by_rank[0.0]) == len(by_rank[1.0]) >= 2, {r: len(v) for r, v in by_rank.items()}
    with (one_dir / "tta_history.csv").open() as f:
        one_rows = list(csv.DictReader(f))
    assert len(one_rows) == len(by_rank[0.0])  # the same batches, each dealt half to each rank
    for r0, r1, row in zip(by_rank[0.0], by_rank[1.0], one_rows, strict=True):
        assert float(r0["size"]) + float(r1["size"]) == float(row["size"])
    shifts = [float(by_rank[r][-1]["shift"]) for r in (0.0, 1.0)]
    assert min(shifts) > 0 and not math.isclose(*shifts, rel_tol=1e-6), f"ranks adapted alike: {shifts}"
    assert ddp["tta/param_shift"] == pytest.approx(sum(shifts) / 2, rel=1e-5)
    n = len(by_rank[0.0])
    for q in range(4):  # tta/acc_q<q> pools the q-th quarter of both ranks' streams
        part = [row for r in (0.0, 1.0) for row in by_rank[r][n * q // 4 : max(n * (q + 1) // 4, n * q // 4 + 1)]]
        correct = sum(float(row["acc"]) * float(row["size"]) for row in part)
        assert ddp[f"tta/acc_q{q + 1}"] == pytest.approx(correct / sum(float(row["size"]) for row in part), abs=1e-6)


def test_lm_quantization_under_ddp(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    runs = _runs("ostquant", LM, tmp_path, capsys)
    (_, one), (ddp_dir, ddp) = runs["one"], runs["ddp"]
    quant = sorted(k for k in one if k.startswith("quant/"))
    assert "quant/fp_loss" in quant and len(quant) >= 8, quant
    assert quant == sorted(k for k in ddp if k.startswith("quant/"))
    for key in quant:
        if key.endswith("_log_qsur"):  # each rank's own first batch; rank zero's is logged (documented)
            assert math.isfinite(ddp[key]), key
        else:
            assert ddp[key] == pytest.approx(one[key], rel=1e-4, abs=1e-9), key
    learned = [k for k in quant if k.endswith("_kl") and not k.startswith("quant/fp")]
    assert learned and all(ddp[k] > 1e-4 for k in learned), {k: ddp[k] for k in learned}
    assert any(ddp_dir.rglob("quant_calibration.json"))
