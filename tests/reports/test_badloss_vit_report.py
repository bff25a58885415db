"""The badloss_vit study: its report hook on synthetic loss matrices (the BaDLoss detector scores them, the verdicts
follow the AUCs), the shared detector functions the BaDLoss module calls, LossDynamics' ``save_attrs`` and the spec's
entries composing."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from lightning_modules.badloss import scoring
from reports import badloss_vit as bv
from suite import report as rep
from suite.claim import load_spec
from suite.compare import RunRecord

ROOT = Path(__file__).resolve().parents[2]
ATTACKS = ["patch", "blend_r"]


def _matrix(seed: int, sep: dict[str, float], n: int = 400, probes: int = 60, e: int = 8) -> dict:
    """A loss matrix: clean rows decay from ~1; poisons of attack ``a`` start ``sep[a]`` higher and fall to ~0 (a
    learned backdoor); ``sep = 0``: indistinguishable. Probe copies are clean rows; their originals are not trained."""
    g = torch.Generator().manual_seed(seed)
    decay = torch.linspace(1.0, 0.2, e)
    attack = torch.full((n,), -1, dtype=torch.long)
    attack[:30], attack[30:60] = 0, 1
    attack = torch.cat([attack, torch.full((probes,), -1)])
    traj = decay + 0.1 * torch.randn(n + probes, e, generator=g)
    for i, a in enumerate(ATTACKS):
        traj[attack == i] += sep[a] * torch.linspace(1.0, -0.2, e)
    traj[n:] = decay + 0.1 * torch.randn(probes, e, generator=g)
    kind = torch.cat([torch.zeros(n, dtype=torch.long), torch.ones(probes, dtype=torch.long)])
    rows = torch.cat([torch.arange(n - probes), torch.arange(n, n + probes)])  # originals 340..399 replaced
    return {
        "values": traj,
        "epochs": torch.arange(e),
        "data": {"poison_attack": attack, "probe_kind": kind,
                 "default_train_rows": rows, "num_original": n, "attack_names": ATTACKS},
    }  # fmt: skip


def _records(root: Path, cnn: dict[str, float], vit: dict[str, float], acc: float = 0.85) -> list[RunRecord]:
    out = []
    for name, sep in (("cnn", cnn), ("vit", vit)):
        for s in range(3):
            path = root / name / str(s)
            path.mkdir(parents=True)
            torch.save(_matrix(s + (10 if name == "vit" else 0), sep), path / "loss_dynamics.pt")
            metrics = {"test/acc": acc, "test/asr_patch": 0.9, "test/asr_blend_r": 0.8}
            out.append(RunRecord(path=path, name=name, seed=s, metrics=metrics))
    return out


def _words(records: list[RunRecord], converged: dict[str, bool] | None = None) -> dict[str, str]:
    return {v.claim: v.verdict for v in bv.verdicts(bv.collect(records), converged)}


def test_verdicts_follow_the_aucs(tmp_path: Path) -> None:
    strong = {"patch": 3.0, "blend_r": 3.0}
    # both architectures separate both attacks: the CNN detects them and the detection carries over
    words = _words(_records(tmp_path / "a", cnn=strong, vit=strong))
    assert list(words.values()) == [rep.REPRODUCED] * 5, words
    # the ViT's patch poisons look like clean ones (AUC ~0.5): that carry-over fails, blend_r's holds
    words = _words(_records(tmp_path / "b", cnn=strong, vit={"patch": 0.0, "blend_r": 3.0}))
    carry = [w for c, w in words.items() if "carries over" in c]
    assert carry[:2] == [rep.NOT_REPRODUCED, rep.REPRODUCED], words
    # the CNN does not detect blend_r: nothing to carry over (phenomenon absent), and its reference is not reproduced
    words = _words(_records(tmp_path / "c", cnn={"patch": 3.0, "blend_r": 0.0}, vit=strong))
    assert [w for c, w in words.items() if "blend_r" in c] == [rep.NOT_REPRODUCED, rep.ABSENT], words
    # an entry that has not plateaued, or a near-chance classifier: the verdicts that read it are underfit
    recs = _records(tmp_path / "d", cnn=strong, vit=strong)
    assert list(_words(recs, {"cnn": True, "vit": False}).values()) == [rep.REPRODUCED] * 2 + [rep.UNDERFIT] * 3
    assert set(_words(recs, {"cnn": False, "vit": True}).values()) == {rep.UNDERFIT}
    assert set(_words(_records(tmp_path / "e", cnn=strong, vit=strong, acc=0.2)).values()) == {rep.UNDERFIT}
    page = bv.claim_report(recs, tmp_path)
    assert "| cnn | 3 | 1.000 ± 0.000 |" in page and "Verdicts" in page and "0.85" not in page


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
