"""The quant_outliers study: its report hook on synthetic runs, the census of a ViT's blocks and a CNN's feature maps
(a planted massive activation is found), the classifier-quantization prefix and the per-entry experiment of a claim
spec."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from callbacks.outlier_census import run_census, summarize
from reports import quant_outliers as qo
from suite import report as rep
from suite.claim import entry_command
from suite.compare import RunRecord


def _run(root: Path, name: str, seed: int, ratio: float, fp: float, drops: dict[str, float], w8: float) -> RunRecord:
    path = root / name / str(seed)
    path.mkdir(parents=True)
    res = {m: {"acc": fp - d, "acc_drop": d, "kl": 0.0} for m, d in {"fp": 0.0, **drops}.items()}
    (path / "quant_calibration.json").write_text(json.dumps({"w_bits": 4, "a_bits": 4, "results": res}))
    w8res = {"fp": {"acc": fp, "acc_drop": 0.0, "kl": 0.0}, "rtn": {"acc": fp - w8, "acc_drop": w8, "kl": 0.0}}
    (path / "quant_w8a8_calibration.json").write_text(json.dumps({"results": w8res}))
    with open(path / "outlier_census.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["step", "kind", "name", "metric", "value"])
        w.writeheader()
        w.writerow({"step": 10, "kind": "act", "name": "net.blocks.0", "metric": "ratio", "value": ratio})
    return RunRecord(path=path, name=name, seed=seed)


def _records(root: Path, vit_rtn: float, cnn_rtn: float, fp: float = 0.85) -> list[RunRecord]:
    out = []
    for s, jitter in enumerate((-0.002, 0.0, 0.002)):
        vit = {"rtn": vit_rtn + jitter, "smoothquant": 0.01, "quarot": 0.005 + jitter, "ostquant": 0.004}
        cnn = {"rtn": cnn_rtn + jitter, "smoothquant": 0.01, "quarot": 0.01 + jitter, "ostquant": 0.01}
        out.append(_run(root, "vit", s, 50.0 + s, fp, vit, 0.001))
        out.append(_run(root, "cnn", s, 8.0 + s, fp, cnn, 0.002))
    return out


def _words(records: list[RunRecord]) -> list[str]:
    return [v.verdict for v in qo.verdicts(qo.collect(records))]


def test_verdicts_follow_the_numbers(tmp_path: Path) -> None:
    # the high-outlier ViT loses more to RTN and the aware methods recover more there: both reproduced
    assert _words(_records(tmp_path / "a", vit_rtn=0.10, cnn_rtn=0.02)) == [rep.REPRODUCED] * 3
    # flipped: the CNN (smaller outliers) loses more; its recovery is larger too
    assert _words(_records(tmp_path / "b", vit_rtn=0.02, cnn_rtn=0.10))[:2] == [rep.NOT_REPRODUCED] * 2
    # equal drops: within noise
    assert _words(_records(tmp_path / "c", vit_rtn=0.05, cnn_rtn=0.05))[0] == rep.NOISE
    # near-chance classifiers: underfit
    assert _words(_records(tmp_path / "d", vit_rtn=0.10, cnn_rtn=0.02, fp=0.3))[:2] == [rep.UNDERFIT] * 2
    # an entry that has not plateaued (the sizing rule): underfit, the control is unaffected
    data = qo.collect(_records(tmp_path / "f", vit_rtn=0.10, cnn_rtn=0.02))
    words = [v.verdict for v in qo.verdicts(data, {"vit": False, "cnn": True})]
    assert words == [rep.UNDERFIT, rep.UNDERFIT, rep.REPRODUCED]
    page = qo.claim_report(_records(tmp_path / "e", vit_rtn=0.10, cnn_rtn=0.02), tmp_path)
    assert "| vit | 51.0 ± 1.0 |" in page and "RTN W4A4" in page


def test_overlapping_census_is_phenomenon_absent(tmp_path: Path) -> None:
    recs = _records(tmp_path, vit_rtn=0.10, cnn_rtn=0.02)
    for r in recs:  # the same census ratio for both architectures
        (Path(r.path) / "outlier_census.csv").write_text("step,kind,name,metric,value\n10,act,net.blocks.0,ratio,9.0\n")
    assert _words(recs)[:2] == [rep.ABSENT] * 2


def _plant(o: torch.Tensor, where: tuple[int, ...]) -> torch.Tensor:
    o = o.clone()
    o[where] = 1e4
    return o


def test_census_finds_a_planted_massive_activation_in_a_vit_and_a_cnn() -> None:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(img_size=8, patch_size=4, in_chans=1, num_classes=3, embed_dim=16, depth=2, num_heads=2)
    vit.eval()
    x = torch.randn(2, 1, 8, 8)
    base = summarize(run_census(vit, lambda: vit(x), r"^blocks\.\d+$", k=(20.0,)))["census/act_ratio_max"]
    hook = vit.blocks[1].register_forward_hook(lambda m, i, o: _plant(o, (0, 0, 5)))
    rows = run_census(vit, lambda: vit(x), r"^blocks\.\d+$", k=(20.0,))
    hook.remove()
    planted = {r["name"]: r["value"] for r in rows if r["metric"] == "ratio"}
    assert planted["blocks.1"] > 100 * base and planted["blocks.0"] <= base
    assert [r["value"] for r in rows if r["name"] == "blocks.1" and r["metric"] == "dims_k20"] == ["5"]

    cnn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 3))
    cnn.eval()
    hook = cnn[1].register_forward_hook(lambda m, i, o: _plant(o, (0, 2, 3, 3)))
    rows = run_census(cnn, lambda: cnn(x), r"^1$", k=(20.0,))
    hook.remove()
    ratio = [r["value"] for r in rows if r["metric"] == "ratio"][0]
    assert ratio > 1e3  # the feature map [B, C, H, W] was read (a 4-d output used to be skipped)
    assert [r["value"] for r in rows if r["metric"] == "dims_k20"] == ["2"]  # channel 2 holds it
    # capture=input: the head's input [B, 256] is read as tokens
    rows = run_census(cnn, lambda: cnn(x), r"^4$", k=(20.0,), capture="input")
    assert any(r["metric"] == "ratio" for r in rows)
    with pytest.raises(Exception, match="capture"):
        run_census(cnn, lambda: cnn(x), r"^4$", capture="weights")


def test_quant_prefix_and_per_entry_experiment() -> None:
    from callbacks.quant_classifier import ClassifierQuantCalibration

    assert ClassifierQuantCalibration(prefix="quant_w8a8", w_bits=8, a_bits=8).prefix == "quant_w8a8"
    with pytest.raises(Exception, match="prefix"):
        ClassifierQuantCalibration(prefix="a/b")
    spec = {"runs": [{"name": "vit", "experiment": "mda"}, {"name": "x"}], "seeds": [0]}
    assert "experiment=mda" in entry_command("quant_outliers", spec["runs"][0], spec, Path("out"), [])
    assert "experiment=quant_outliers" in entry_command("quant_outliers", spec["runs"][1], spec, Path("out"), [])
