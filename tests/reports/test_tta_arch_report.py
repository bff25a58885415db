"""The tta_arch study: its report hook's pre-registered verdicts on synthetic runs, the spec (every entry composes, the
test entries load their training entry's checkpoint and name a corruption the hook reads) and TTAComparison on a
datamodule with several test loaders (the poisoned datamodule's case)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks.tta import TTAComparison
from datamodules.corruptions import CORRUPTIONS
from reports import tta_arch as ta
from suite import report as rep
from suite.claim import entry_command, load_spec
from suite.compare import RunRecord
from suite.preflight import compose_run
from tests.callbacks.test_tta import TinyClassifier

JITTER = (-0.004, 0.0, 0.004)


def _metrics(accs: dict[str, float], q_drop: dict[str, float] | None = None, jitter: float = 0.0) -> dict[str, float]:
    """``tta/<m>/acc`` and flat quarters, except ``q_drop[m]``: Q1 that much above acc and Q4 that much below."""
    out = {}
    for m, a in accs.items():
        a = a + (jitter if m != "source" else 0.0)
        d = (q_drop or {}).get(m, 0.0)
        out[f"tta/{m}/acc"] = a
        out.update({f"tta/{m}/acc_q{q}": a for q in (2, 3)})
        out[f"tta/{m}/acc_q1"], out[f"tta/{m}/acc_q4"] = a + d, a - d
    return out


def _records(
    cnn_gain: float,
    vit_gain: float,
    clean: float = 0.9,
    corrupted: float = 0.6,
    tent_q_drop: float = 0.0,
    corruptions: tuple[str, ...] = ta.CORRUPTIONS,
) -> list[RunRecord]:
    out = []
    for arch, gain in (("cnn", cnn_gain), ("vit", vit_gain)):
        for s, j in enumerate(JITTER):
            accs = {"source": clean, "tent": clean, "eata": clean, "sar": clean}
            curves = {"val/loss": [(0, 2.0), (50, 0.5), (100, 0.5 + j / 10)]}  # the training entry plateaued
            out.append(RunRecord(path=Path("."), name=arch, seed=s, metrics=_metrics(accs), curves=curves))
            for c in corruptions:
                accs = {"source": corrupted, "tent": corrupted + gain, "eata": corrupted + gain, "sar": corrupted}
                m = _metrics(accs, {"tent": tent_q_drop}, jitter=j)
                out.append(RunRecord(path=Path("."), name=f"{arch}_{c}", seed=s, metrics=m))
    return out


def _words(records: list[RunRecord], converged: dict[str, bool] | None = None) -> dict[str, str]:
    return {v.claim: v.verdict for v in ta.verdicts(ta.collect(records), converged)}


def _tent(words: dict[str, str], arch: str) -> str:
    (word,) = [w for c, w in words.items() if c.startswith("Tent beats source") and ta.ARCHS[arch] in c]
    return word


def _collapse(words: dict[str, str], arch: str) -> str:
    (word,) = [w for c, w in words.items() if c.startswith("Tent collapses") and ta.ARCHS[arch] in c]
    return word


def test_verdicts_follow_the_numbers() -> None:
    words = _words(_records(cnn_gain=0.10, vit_gain=0.0))
    assert len(words) == 9
    assert _tent(words, "cnn") == rep.REPRODUCED and _tent(words, "vit") == rep.NOISE
    assert words["Tent gains more on the CNN (BatchNorm) than on the ViT (LayerNorm)"] == rep.REPRODUCED
    assert _collapse(words, "cnn") == rep.NOISE == _collapse(words, "vit")  # flat quarters: no collapse
    # a method losing to source beyond the seed noise
    words = _words(_records(cnn_gain=0.10, vit_gain=-0.05))
    assert _tent(words, "vit") == rep.NOT_REPRODUCED
    # collapse: Tent's gain over source falls from Q1 to Q4 (source's quarters are flat)
    words = _words(_records(cnn_gain=0.10, vit_gain=0.05, tent_q_drop=0.05))
    assert _collapse(words, "cnn") == rep.REPRODUCED == _collapse(words, "vit")


def test_gates_underfit_and_absent() -> None:
    # near-chance clean source model: underfit on every verdict of that architecture and the cross-arch one
    words = _words(_records(cnn_gain=0.10, vit_gain=0.10, clean=0.3, corrupted=0.2))
    assert set(words.values()) == {rep.UNDERFIT}
    # the corruptions cost the source model < MIN_SHIFT: nothing to recover
    words = _words(_records(cnn_gain=0.10, vit_gain=0.10, clean=0.62, corrupted=0.6))
    assert set(words.values()) == {rep.ABSENT}
    # the sizing rule: an entry that has not plateaued is underfit, the other architecture keeps its verdicts
    words = _words(_records(cnn_gain=0.10, vit_gain=0.10), {"cnn": True, "vit": False})
    assert _tent(words, "cnn") == rep.REPRODUCED and _tent(words, "vit") == rep.UNDERFIT
    # a missing corruption: no mean over the four, so no verdict rather than a mean over fewer
    assert _words(_records(0.1, 0.1, corruptions=ta.CORRUPTIONS[:3])) == {}


def test_page_tables_and_sanity_notes(tmp_path: Path) -> None:
    records = _records(cnn_gain=0.10, vit_gain=0.0)
    page = ta.claim_report(records, tmp_path, spec={"sizing_metric": "val/loss", "sizing_higher_is_better": False})
    assert "| cnn | gaussian_noise | 60.0 ± 0.0 | 70.0 ± 0.4 | 70.0 ± 0.4 | 60.0 ± 0.4 |" in page
    assert "| cnn | **mean of 4** | 60.0 ± 0.0 | 70.0 ± 0.4 |" in page
    assert "Sanity" in page and "none." in page and page.count("| **reproduced** |") == 3  # CNN: Tent, EATA; CNN > ViT
    assert "training not plateaued" not in page
    bad = _records(cnn_gain=-0.2, vit_gain=0.0)
    assert "cnn fog seed 0: Tent 0.396 vs source 0.600" in ta.claim_report(bad, tmp_path, spec={})


def test_spec_entries_compose_and_chain_to_their_training_entry(tmp_path: Path) -> None:
    spec = load_spec("tta_arch")
    names = [e["name"] for e in spec["runs"]]
    assert names[:2] == ["cnn", "vit"]  # the training entries run first: the others load their checkpoints
    assert {(a, c) for a in ta.ARCHS for c in ta.CORRUPTIONS} <= {ta.split_name(n) for n in names}
    assert set(ta.CORRUPTIONS) <= set(CORRUPTIONS)
    for entry in spec["runs"]:
        arch, corruption = ta.split_name(entry["name"])
        cfg = compose_run("tta_arch", entry_command("tta_arch", entry, spec, tmp_path / "tta", [])[4:])
        assert cfg.experiment_slug == {"cnn": "badloss", "vit": "mda"}[arch]
        assert list(cfg.data.attacks) == [] and cfg.data.severity == 5  # clean training data
        assert set(cfg.callbacks.tta_compare.variants) == set(ta.METHODS)
        assert {v.get("lr", 1e-3) for k, v in cfg.callbacks.tta_compare.variants.items() if k != "source"} == {1e-3}
        if corruption == "clean":
            assert cfg.train and cfg.data.corruption is None
        else:
            assert not cfg.train and cfg.data.corruption == corruption
            ckpt = cfg._get_node("ckpt_path")._value()  # unresolved: ${hydra:...} exists only inside the job
            assert f"/../{arch}/${{hydra:sweep.subdir}}/checkpoints/last.ckpt" in ckpt
        if arch == "cnn":
            assert cfg.model.defence == "none" and "loss_dynamics" not in cfg.callbacks
        else:
            assert cfg.model.attribution.enabled is False


class TwoLoaderClassifier(TinyClassifier):
    def test_step(self, batch, batch_idx, dataloader_idx=0):  # noqa: ANN001, ANN201
        return super().test_step(batch, batch_idx)


def test_comparison_streams_every_test_loader(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 6, generator=g), torch.randint(0, 4, (48,), generator=g)
    loaders = [DataLoader(TensorDataset(x[:32], y[:32]), batch_size=8), DataLoader(TensorDataset(x[32:], y[32:]), 8)]
    cmp = TTAComparison({"src": {"method": "source"}, "tent": {"method": "tent", "lr": 0.05}})
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path), callbacks=[cmp])  # fmt: skip
    trainer.test(TwoLoaderClassifier(), dataloaders=loaders, verbose=False)
    plain = TinyClassifier()
    with torch.no_grad():
        expected = float((plain(x).argmax(-1) == y).float().mean())
    assert cmp.results["src"]["acc"] == pytest.approx(expected)  # all 48 examples, both loaders
    rows = (tmp_path / "tta_compare.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 6  # 4 + 2 batches per variant
    assert cmp.variants["tent"].total == 6
