"""The quant_outliers study: its report hook's verdict objects on synthetic runs, the census of a ViT's blocks and a
CNN's feature maps (a planted massive activation is found), the classifier-quantization prefix and the per-entry
experiment of a claim spec."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from callbacks.outlier_census import run_census, summarize
from reports import quant_outliers as qo
from suite import stats
from suite.claim import entry_command, judge_page, load_spec
from suite.claims import ClaimResult, ClaimSpec
from suite.compare import RunRecord

FLAT = [(50, 1.0), (100, 0.8), (150, 0.7), (200, 0.7)]  # converged by the best-so-far rule
FALLING = [(50, 1.0), (100, 0.9), (150, 0.8), (200, 0.6)]  # still improving at the end


def _run(
    root: Path, name: str, seed: int, ratio: float, fp: float, drops: dict[str, float], w8: float, curve=FLAT
) -> RunRecord:
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
    return RunRecord(path, name, seed, curves={"val/loss": curve}, config={"data": {"seed": seed}})


def _records(
    root: Path,
    vit_rtn: float,
    cnn_rtn: float,
    fp: float = 0.85,
    w8: float = 0.001,
    jitter: float = 0.002,
    vit_curve=FLAT,
    vit_ratio: float = 150.0,
) -> list[RunRecord]:
    """Three seeds of each architecture; the seeds' RTN drops move in opposite directions on the two (so the
    difference has a spread of its own), and the W8A8 drop grows a little with the seed (so has the control's). The
    ViT's census ratio (``vit_ratio`` + seed) is massive by default (>= 100), the CNN's (8 + seed) is not."""
    out = []
    for s, j in enumerate((-jitter, 0.0, jitter)):
        vit = {"rtn": vit_rtn + j, "smoothquant": 0.01, "quarot": 0.005 + j / 2, "ostquant": 0.004}
        cnn = {"rtn": cnn_rtn - j, "smoothquant": 0.01, "quarot": 0.01 - j / 2, "ostquant": 0.01}
        w8s = w8 + 0.0005 * s * s
        out.append(_run(root, "vit", s, vit_ratio + s, fp, vit, w8s, vit_curve))
        out.append(_run(root, "cnn", s, 8.0 + s, fp, cnn, 2 * w8s))
    return out


def _verdicts(records: list[RunRecord], out: Path) -> dict[str, ClaimResult]:
    spec = ClaimSpec.from_dict("quant_outliers", load_spec("quant_outliers"))
    verdicts, _, result, hook_md, _, _ = judge_page(spec, records, out)
    assert not hook_md, hook_md  # the hook returns data, and did not fail
    assert result.tables[0].rows[0][0] == "vit"
    return {v.id: v for v in verdicts}


def _words(records: list[RunRecord], out: Path) -> list[str]:
    by_id = _verdicts(records, out)
    return [by_id[k].verdict for k in ("larger_outliers_lose_more", "aware_recover_more", "w8a8_control_vit")]


def test_verdicts_follow_the_numbers(tmp_path: Path) -> None:
    # the high-outlier ViT loses more to RTN and the aware methods recover more there: both reproduced, paired
    recs = _records(tmp_path / "a", vit_rtn=0.10, cnn_rtn=0.02)
    assert qo.table(qo.collect(recs)).rows[0][:3] == ["vit", "151 ± 1 (n=3)", "85 ± 0 (n=3) (0 ± 0 (n=3))"]
    by_id = _verdicts(recs, tmp_path)
    lose = by_id["larger_outliers_lose_more"]
    assert lose.verdict == stats.REPRODUCED and lose.paired and lose.entries == ("vit", "cnn") and lose.primary
    assert lose.diff == pytest.approx(0.08) and lose.lo > 0
    assert by_id["aware_recover_more"].verdict == stats.REPRODUCED
    assert by_id["w8a8_control_vit"].verdict == by_id["w8a8_control_cnn"].verdict == stats.REPRODUCED
    # flipped: the CNN (smaller outliers) loses more; its recovery is larger too
    assert _words(_records(tmp_path / "b", vit_rtn=0.02, cnn_rtn=0.10), tmp_path)[:2] == [stats.NOT_REPRODUCED] * 2
    # equal drops, seeds 3 points apart in opposite directions: within noise
    equal = _records(tmp_path / "c", vit_rtn=0.05, cnn_rtn=0.05, jitter=0.03)
    assert _words(equal, tmp_path)[0] == stats.NOISE
    # near-chance classifiers: underfit; the W8A8 control (a quantizer check) is unaffected
    assert _words(_records(tmp_path / "d", vit_rtn=0.10, cnn_rtn=0.02, fp=0.3), tmp_path) == [stats.UNDERFIT] * 2 + [
        stats.REPRODUCED
    ]
    # an entry still improving at the end (the convergence rule): underfit, the control is unaffected
    falling = _records(tmp_path / "f", vit_rtn=0.10, cnn_rtn=0.02, vit_curve=FALLING)
    assert _words(falling, tmp_path) == [stats.UNDERFIT, stats.UNDERFIT, stats.REPRODUCED]
    # W8A8 costing 3 points: the control fails (non-inferiority margin one point)
    assert _words(_records(tmp_path / "g", vit_rtn=0.10, cnn_rtn=0.02, w8=0.03), tmp_path)[2] == stats.NOT_REPRODUCED


def test_pairing_by_seed_decides(tmp_path: Path) -> None:
    """Drops that move with the seed on both architectures (the seed's data) but differ by 2 points on every seed:
    paired by seed the difference is decided, which a Welch interval over the seed-to-seed spread would not."""
    recs = []
    for s in range(3):
        recs.append(
            _run(tmp_path, "vit", s, 150.0 + s, 0.85, {"rtn": 0.10 + 0.05 * s + 0.001 * s, "quarot": 0.01}, 0.0)
        )
        recs.append(_run(tmp_path, "cnn", s, 8.0 + s, 0.85, {"rtn": 0.08 + 0.05 * s, "quarot": 0.01}, 0.0))
    lose = _verdicts(recs, tmp_path)["larger_outliers_lose_more"]
    assert lose.paired and lose.verdict == stats.REPRODUCED
    welch = qo.judge_values(
        qo.Claim("x", "x", "m", ("vit", "cnn"), True, delta=qo.DELTA), *lose.values.values(), paired=False
    )
    assert welch.verdict == stats.NOISE


def test_overlapping_census_is_phenomenon_absent(tmp_path: Path) -> None:
    recs = _records(tmp_path, vit_rtn=0.10, cnn_rtn=0.02)
    for r in recs:  # the same census ratio for both architectures
        (Path(r.path) / "outlier_census.csv").write_text("step,kind,name,metric,value\n10,act,net.blocks.0,ratio,151\n")
    by_id = _verdicts(recs, tmp_path)
    assert by_id["larger_outliers_lose_more"].verdict == by_id["aware_recover_more"].verdict == stats.ABSENT
    assert "overlap" in by_id["larger_outliers_lose_more"].why


def test_no_massive_activations_is_phenomenon_absent(tmp_path: Path) -> None:
    """Census ratios apart (ViT 50-52, CNN 8-10) but neither reaching the census's massive criterion (>= 100):
    the primary claims read `phenomenon absent` whatever the drops say; the W8A8 control is still judged."""
    recs = _records(tmp_path / "a", vit_rtn=0.10, cnn_rtn=0.02, vit_ratio=50.0)
    by_id = _verdicts(recs, tmp_path)
    for cid in ("larger_outliers_lose_more", "aware_recover_more"):
        assert by_id[cid].verdict == stats.ABSENT
        assert "massive" in by_id[cid].why and "criterion >= 100" in by_id[cid].why and "vit 51.0" in by_id[cid].why
    assert by_id["w8a8_control_vit"].verdict == stats.REPRODUCED
    # one ViT seed at the criterion is not enough: the mean over seeds decides (99, 100, 101 -> 100: present)
    present = _records(tmp_path / "b", vit_rtn=0.10, cnn_rtn=0.02, vit_ratio=99.0)
    assert qo.massive_absent(qo.collect(present)) is None
    assert _verdicts(present, tmp_path)["larger_outliers_lose_more"].verdict == stats.REPRODUCED
    low = _records(tmp_path / "c", vit_rtn=0.10, cnn_rtn=0.02, vit_ratio=98.0)  # 98, 99, 100 -> 99: absent
    assert "massive" in qo.massive_absent(qo.collect(low))


def test_quantizer_note_names_the_static_setting(tmp_path: Path) -> None:
    recs = _records(tmp_path, vit_rtn=0.10, cnn_rtn=0.02)
    assert qo.quantizer_note(recs) == (
        "Quantizer: activations dynamic per token, BatchNorm not folded, calibration on the train split; weights RTN "
        "per output channel."
    )
    for r in recs:
        f = Path(r.path) / "quant_calibration.json"
        p = json.loads(f.read_text())
        f.write_text(json.dumps({**p, "act_scale": "tensor", "fold_bn": True, "calib_split": "val"}))
    assert "static per tensor" in qo.quantizer_note(recs) and "folded into its convolution" in qo.quantizer_note(recs)


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
    assert ratio > 1e3  # the feature map [B, C, H, W] is read, not skipped as a 4-d output
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
