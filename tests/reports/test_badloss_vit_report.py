"""The badloss_vit study: its report hook on synthetic loss matrices (the BaDLoss detector scores them, the verdict
objects follow the AUCs, the numbers are kept for a rebuild from data), the shared detector functions the BaDLoss
module calls, LossDynamics' ``save_attrs`` and the spec's entries composing."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from lightning_modules.badloss import scoring
from reports import badloss_vit as bv
from suite import report as rep
from suite.claim import judge_page, load_spec
from suite.claims import ClaimSpec
from suite.compare import RunRecord

ROOT = Path(__file__).resolve().parents[2]
ATTACKS = ["patch", "blend_r"]


def _matrix(seed: int, sep: dict[str, float], n: int = 400, probes: int = 60, e: int = 8, hidden: int = 0) -> dict:
    """A loss matrix: clean rows decay from ~1; poisons of attack ``a`` start ``sep[a]`` higher and fall to ~0 (a
    learned backdoor); ``sep = 0``: indistinguishable. The first ``hidden`` poisons of each attack look clean (a few
    missed poisons, so the AUCs differ between seeds). Probe copies are clean rows; their originals are not trained."""
    g = torch.Generator().manual_seed(seed)
    decay = torch.linspace(1.0, 0.2, e)
    attack = torch.full((n,), -1, dtype=torch.long)
    attack[:30], attack[30:60] = 0, 1
    attack = torch.cat([attack, torch.full((probes,), -1)])
    traj = decay + 0.1 * torch.randn(n + probes, e, generator=g)
    for i, a in enumerate(ATTACKS):
        rows = (attack == i).nonzero().squeeze(1)[hidden:]
        traj[rows] += sep[a] * torch.linspace(1.0, -0.2, e)
    traj[n:] = decay + 0.1 * torch.randn(probes, e, generator=g)
    kind = torch.cat([torch.zeros(n, dtype=torch.long), torch.ones(probes, dtype=torch.long)])
    rows = torch.cat([torch.arange(n - probes), torch.arange(n, n + probes)])  # originals 340..399 replaced
    return {
        "values": traj,
        "epochs": torch.arange(e),
        "data": {
            "poison_attack": attack,
            "probe_kind": kind,
            "default_train_rows": rows,
            "num_original": n,
            "attack_names": ATTACKS,
        },
    }


CONVERGED = [(0, 2.0), (5, 0.5), (10, 0.5)]  # best-so-far val/loss flat over the last 20%
RISING = [(0, 2.0), (5, 1.0), (10, 0.5)]  # still improving


def _records(
    root: Path, cnn: dict[str, float], vit: dict[str, float], acc: float = 0.85, vit_curve: list | None = None
) -> list[RunRecord]:
    out = []
    for name, sep in (("cnn", cnn), ("vit", vit)):
        for s in range(3):
            path = root / name / str(s)
            path.mkdir(parents=True)
            # the CNN's seed s misses s poisons of each attack: its AUCs differ between seeds, paired differences spread
            hidden = s if name == "cnn" else 0
            torch.save(_matrix(s + (10 if name == "vit" else 0), sep, hidden=hidden), path / "loss_dynamics.pt")
            metrics = {"test/acc": acc, "test/asr_patch": 0.9, "test/asr_blend_r": 0.8}
            curves = {"val/loss": vit_curve if name == "vit" and vit_curve else CONVERGED}
            out.append(RunRecord(path, name, s, metrics, curves, config={"data": {"seed": s}}))
    return out


def _judge(records: list[RunRecord], tmp_path: Path) -> dict:
    spec = ClaimSpec.from_dict("badloss_vit", load_spec("badloss_vit"))
    verdicts, _, _, hook_md, _, _ = judge_page(spec, records, tmp_path)
    assert not hook_md  # the hook returns data, and did not fail
    return {v.id: v for v in verdicts}


def _words(records: list[RunRecord], tmp_path: Path) -> dict[str, str]:
    return {k: v.verdict for k, v in _judge(records, tmp_path).items()}


def test_verdicts_follow_the_aucs(tmp_path: Path) -> None:
    strong = {"patch": 3.0, "blend_r": 3.0}
    # both architectures separate both attacks: the CNN detects them and the detection carries over
    by_id = _judge(_records(tmp_path / "a", cnn=strong, vit=strong), tmp_path)
    # the page puts the primary claim first, then the hook's order
    assert list(by_id) == [
        "carry_detected",
        "cnn_detects_patch",
        "cnn_detects_blend_r",
        "carry_patch",
        "carry_blend_r",
        "carry_all",
    ]
    assert {v.verdict for v in by_id.values()} == {rep.REPRODUCED}, by_id
    pooled = by_id["carry_detected"]
    assert pooled.primary and pooled.paired and pooled.kind == "non_inferior" and pooled.delta == bv.MARGIN
    assert not by_id["carry_all"].primary
    assert pooled.entries == ("vit", "cnn") and set(pooled.values["vit"]) == {"0", "1", "2"}
    assert not by_id["carry_patch"].primary and by_id["cnn_detects_patch"].lo > 0  # above the bar on every seed
    # the ViT's patch poisons look like clean ones (AUC ~0.5): that carry-over fails, blend_r's holds
    by_id = _judge(_records(tmp_path / "b", cnn=strong, vit={"patch": 0.0, "blend_r": 3.0}), tmp_path)
    assert by_id["carry_patch"].verdict == rep.NOT_REPRODUCED and by_id["carry_patch"].hi < -bv.MARGIN
    assert by_id["carry_blend_r"].verdict == rep.REPRODUCED
    # the CNN does not detect blend_r: nothing to carry over (phenomenon absent), and its reference is not reproduced
    words = _words(_records(tmp_path / "c", cnn={"patch": 3.0, "blend_r": 0.0}, vit=strong), tmp_path)
    assert (words["cnn_detects_blend_r"], words["carry_blend_r"]) == (rep.NOT_REPRODUCED, rep.ABSENT), words


def test_the_headline_pools_only_the_attacks_the_cnn_detects(tmp_path: Path) -> None:
    # the CNN detects patch only; the ViT fails blend_r: the pooled-over-all verdict would charge the ViT with an
    # attack that has nothing to carry over, the headline pools patch alone (its values are carry_patch's)
    by_id = _judge(
        _records(tmp_path / "a", cnn={"patch": 3.0, "blend_r": 0.0}, vit={"patch": 3.0, "blend_r": 0.0}), tmp_path
    )
    head = by_id["carry_detected"]
    assert "(patch)" in head.text and head.verdict == rep.REPRODUCED, head
    for side, vals in by_id["carry_patch"].values.items():
        assert head.values[side] == pytest.approx(vals, abs=1e-12)
    # nothing detected: the headline is absent, not judged on undetectable attacks
    by_id = _judge(
        _records(tmp_path / "b", cnn={"patch": 0.0, "blend_r": 0.0}, vit={"patch": 3.0, "blend_r": 3.0}), tmp_path
    )
    assert by_id["carry_detected"].verdict == rep.ABSENT and by_id["carry_detected"].primary


def test_pooled_auc_is_the_auc_of_the_pooled_poisons(tmp_path: Path) -> None:
    # every attack pooled: the weighted per-attack AUCs give back the directly computed detect/auc, exactly
    torch.save(_matrix(3, {"patch": 0.3, "blend_r": 0.1}, hidden=4), tmp_path / "loss_dynamics.pt")
    got = bv.detect_run(tmp_path)
    aucs = {a: got[f"detect/auc_{a}"] for a in ATTACKS}
    assert got["n/patch"] == got["n/blend_r"] == 30
    assert bv.pooled_auc(aucs, {a: got[f"n/{a}"] for a in ATTACKS}) == pytest.approx(got["detect/auc"], abs=1e-12)
    # unequal counts weigh the attacks: an unweighted mean is not the pooled AUC
    assert bv.pooled_auc({"x": 1.0, "y": 0.5}, {"x": 3, "y": 1}) == pytest.approx(0.875)


def test_underfit_entries_and_the_page_tables(tmp_path: Path) -> None:
    strong = {"patch": 3.0, "blend_r": 3.0}
    # an entry still improving, or a near-chance classifier: the verdicts that read it are underfit
    words = _words(_records(tmp_path / "d", cnn=strong, vit=strong, vit_curve=RISING), tmp_path)
    assert [words[f"cnn_detects_{a}"] for a in ATTACKS] == [rep.REPRODUCED] * 2
    assert {words[c] for c in ("carry_patch", "carry_blend_r", "carry_all", "carry_detected")} == {rep.UNDERFIT}
    assert set(_words(_records(tmp_path / "e", cnn=strong, vit=strong, acc=0.2), tmp_path).values()) == {rep.UNDERFIT}
    recs = _records(tmp_path / "f", cnn=strong, vit=strong)
    spec = ClaimSpec.from_dict("badloss_vit", load_spec("badloss_vit"))
    result = bv.claim_report(recs, spec, tmp_path)
    auc, context, checks = result.tables
    assert auc.rows[0][:2] == ["cnn", 3] and auc.rows[1][:3] == ["vit", 3, "1 ± 0 (n=3)"]  # the CNN misses a few
    assert context.rows[0][1] == "85.0"
    assert [r[0] for r in checks.rows] == ["cnn", "vit"]
    # the detection numbers are kept beside each run: a page rebuilt without the binary matrix reads them
    for r in recs:
        (Path(r.path) / "loss_dynamics.pt").unlink()
        assert (Path(r.path) / bv.CACHE).is_file()
    again = bv.claim_report(recs, spec, tmp_path)
    assert again.tables[0].rows == auc.rows and [v.verdict for v in again.verdicts] == [rep.REPRODUCED] * 6
    for r in recs:
        (Path(r.path) / bv.CACHE).unlink()
    assert bv.claim_report(recs, spec, tmp_path).verdicts == []


def test_detect_run_is_the_module_detector(tmp_path: Path) -> None:
    """The hook scores with the functions BadlossLitModule.detection_scores / detect call: same scores, same rows,
    same AUCs as computing them by hand from the paper's recipe (filter, Eq. (1) to the probes, probe originals out)."""
    state = _matrix(0, {"patch": 0.2, "blend_r": 0.05})
    torch.save(state, tmp_path / "loss_dynamics.pt")
    got = bv.detect_run(tmp_path)
    traj, d = state["values"].double(), state["data"]
    t = traj[:, scoring.filter_epochs(traj)]
    score = scoring.anomaly_scores(t, t[d["probe_kind"] == 1], 50, 0.01, True)
    rows = torch.zeros(400, dtype=torch.bool)
    rows[:340] = True  # the probes' originals (340..399) are never trained on: not scored
    a = d["poison_attack"][:400][rows]
    assert got["detect/auc"] == pytest.approx(scoring.roc_auc(score[:400][rows], a >= 0), abs=1e-12)
    sel = (a == 0) | (a < 0)
    assert got["detect/auc_patch"] == pytest.approx(scoring.roc_auc(score[:400][rows][sel], a[sel] == 0), abs=1e-12)
    assert 0.5 < got["detect/auc_blend_r"] < got["detect/auc_patch"]
    assert torch.equal(scoring.scored_mask(400, d["default_train_rows"]), rows)
    with pytest.raises(Exception, match="clean probes"):
        scoring.badloss_scores(traj, torch.zeros(len(traj), dtype=torch.bool))


def test_loss_dynamics_saves_datamodule_attrs(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from callbacks.loss_dynamics import LossDynamics

    cb = LossDynamics(capacity=2, save_attrs=["poison_attack", "attack_names"])
    cb.load_state_dict({"values": torch.zeros(3, 1), "epochs": torch.tensor([0])})
    dm = SimpleNamespace(poison_attack=torch.tensor([-1, 0, 1]), attack_names=("patch", "blend_r"))
    trainer = SimpleNamespace(is_global_zero=True, default_root_dir=str(tmp_path), datamodule=dm)
    cb.on_train_end(trainer, None)
    saved = torch.load(tmp_path / "loss_dynamics.pt", weights_only=True)
    assert saved["data"]["attack_names"] == ["patch", "blend_r"]
    assert saved["data"]["poison_attack"].tolist() == [-1, 0, 1]
    missing = LossDynamics(save_attrs=["probe_kind"])
    missing.load_state_dict({"values": torch.zeros(3, 1), "epochs": torch.tensor([0])})
    with pytest.raises(Exception, match="probe_kind"):
        missing.on_train_end(trainer, None)


def test_every_entry_composes_with_the_same_data() -> None:
    spec = load_spec("badloss_vit")
    assert spec.get("study") and {e["name"]: e["experiment"] for e in spec["runs"]} == {"cnn": "badloss", "vit": "mda"}
    cfgs = {}
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for e in spec["runs"]:
            ov = [*shlex.split(spec["overrides"]), *shlex.split(e["overrides"])]
            cfgs[e["name"]] = compose("train", overrides=[f"experiment={e['experiment']}", "seed=0", *ov])
    for name, cfg in cfgs.items():
        assert cfg.callbacks.loss_dynamics._target_ == "callbacks.loss_dynamics.LossDynamics", name
        assert cfg.callbacks.loss_dynamics.capacity >= cfg.trainer.max_epochs, name
        assert "poison_attack" in cfg.callbacks.loss_dynamics.save_attrs, name
    cnn, vit = cfgs["cnn"], cfgs["vit"]
    assert cnn.model.defence == "none" and vit.model.attribution.enabled is False
    assert cnn.data == vit.data and len(cnn.data.attacks) >= 2  # one protocol: same poisoned data, same probes
    assert cnn.trainer.max_epochs == vit.trainer.max_epochs
    assert cnn.data.num_probes >= 50  # k = 50 neighbours among the clean probes
