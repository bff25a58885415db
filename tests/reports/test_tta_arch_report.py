"""The tta_arch study: its report hook's pre-registered verdicts (verdict objects through the page's judge) on
synthetic runs, the spec (every entry composes, the
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
from suite.claim import entry_command, judge_page, load_spec
from suite.claims import ClaimSpec
from suite.compare import RunRecord
from suite.preflight import compose_run
from tests.callbacks.test_tta import TinyClassifier

JITTER = (-0.004, 0.0, 0.004)
CONVERGED = [(0, 2.0), (50, 0.5), (100, 0.5)]  # the training entry's best-so-far val/loss stopped improving


def _metrics(accs: dict[str, float], q_drop: dict[str, float] | None = None, jitter: float = 0.0) -> dict[str, float]:
    """``tta/<m>/acc`` and flat quarters, except ``q_drop[m]``: Q1 that much above acc and Q4 that much below; the
    adapting methods (not source) move with ``jitter``, their Q1 by half as much again (so a gain's Q1 - Q4 spreads)."""
    out = {}
    for m, a in accs.items():
        j = jitter if m != "source" else 0.0
        a = a + j
        d = (q_drop or {}).get(m, 0.0)
        out[f"tta/{m}/acc"] = a
        out.update({f"tta/{m}/acc_q{q}": a for q in (2, 3)})
        out[f"tta/{m}/acc_q1"], out[f"tta/{m}/acc_q4"] = a + d + j / 2, a - d
    return out


def _records(
    cnn_gain: float,
    vit_gain: float,
    clean: float = 0.9,
    corrupted: float = 0.6,
    tent_q_drop: float = 0.0,
    corruptions: tuple[str, ...] = ta.CORRUPTIONS,
    vit_curve: list | None = None,
) -> list[RunRecord]:
    out = []
    for arch, gain in (("cnn", cnn_gain), ("vit", vit_gain)):
        for s, j in enumerate(JITTER):
            j = j if arch == "cnn" else -j / 2  # the architectures' seeds vary differently: a paired interval
            accs = {"source": clean, "tent": clean, "eata": clean, "sar": clean}
            curves = {"val/loss": vit_curve if arch == "vit" and vit_curve else CONVERGED}
            cfg = {"data": {"seed": s}}
            out.append(RunRecord(Path("."), arch, s, _metrics(accs), curves, config=cfg))
            for c in corruptions:
                accs = {"source": corrupted, "tent": corrupted + gain, "eata": corrupted + gain, "sar": corrupted}
                m = _metrics(accs, {"tent": tent_q_drop}, jitter=j)
                out.append(RunRecord(Path("."), f"{arch}_{c}", s, m, config=cfg))
    return out


def _judge(records: list[RunRecord], tmp_path: Path) -> dict:
    spec = ClaimSpec.from_dict("tta_arch", load_spec("tta_arch"))
    verdicts, _, result, hook_md, _, _ = judge_page(spec, records, tmp_path)
    assert not hook_md  # the hook returns data, and did not fail
    return {v.id: v for v in verdicts}


def _words(records: list[RunRecord], tmp_path: Path) -> dict[str, str]:
    return {k: v.verdict for k, v in _judge(records, tmp_path).items()}


def test_verdicts_follow_the_numbers(tmp_path: Path) -> None:
    by_id = _judge(_records(cnn_gain=0.10, vit_gain=0.0), tmp_path)
    assert list(by_id) == [cid for cid, _, _ in ta.CLAIMS]
    tent = by_id["tent_cnn"]
    assert tent.verdict == rep.REPRODUCED and tent.paired and tent.primary and tent.p_holm is not None
    assert tent.diff == pytest.approx(0.10) and tent.lo > 0.0 and tent.n == (3, 3)
    assert tent.values["cnn: Tent"]["0"] == pytest.approx(0.696)  # per-seed mean over the four corruptions
    # no gain on the ViT: the interval lies inside +-delta, no effect as large as delta (its p against delta, Holm)
    tent_vit = by_id["tent_vit"]
    assert tent_vit.verdict == rep.NOT_REPRODUCED and "no effect as large as delta" in tent_vit.why
    assert tent_vit.p_against == "delta" and tent_vit.p_holm < 0.05
    assert by_id["tent_cnn_vs_vit"].verdict == rep.REPRODUCED and by_id["tent_cnn_vs_vit"].paired
    # flat quarters: no collapse as large as one point, decided by the interval
    assert by_id["collapse_cnn"].verdict == rep.NOT_REPRODUCED == by_id["collapse_vit"].verdict
    assert "no effect as large as delta" in by_id["collapse_cnn"].why
    assert by_id["sar_cnn"].verdict == rep.NOT_REPRODUCED and not by_id["sar_cnn"].primary  # SAR = source here
    # a method losing to source beyond the seed noise
    words = _words(_records(cnn_gain=0.10, vit_gain=-0.05), tmp_path)
    assert words["tent_vit"] == rep.NOT_REPRODUCED
    # collapse: Tent's gain over source falls from Q1 to Q4 (source's quarters are flat)
    by_id = _judge(_records(cnn_gain=0.10, vit_gain=0.05, tent_q_drop=0.05), tmp_path)
    assert by_id["collapse_cnn"].verdict == rep.REPRODUCED == by_id["collapse_vit"].verdict
    assert by_id["collapse_cnn"].diff == pytest.approx(0.10, abs=0.01)  # Q1 gain +0.05, Q4 gain -0.05


def test_gates_underfit_and_absent(tmp_path: Path) -> None:
    # near-chance clean source model: underfit on every verdict of that architecture and the cross-arch one
    words = _words(_records(cnn_gain=0.10, vit_gain=0.10, clean=0.3, corrupted=0.2), tmp_path)
    assert set(words.values()) == {rep.UNDERFIT}
    # the corruptions cost the source model < MIN_SHIFT: nothing to recover
    words = _words(_records(cnn_gain=0.10, vit_gain=0.10, clean=0.62, corrupted=0.6), tmp_path)
    assert set(words.values()) == {rep.ABSENT}
    # the convergence rule: an entry still improving is underfit, the other architecture keeps its verdicts
    rising = [(0, 2.0), (50, 1.0), (100, 0.5)]
    by_id = _judge(_records(cnn_gain=0.10, vit_gain=0.10, vit_curve=rising), tmp_path)
    assert by_id["tent_cnn"].verdict == rep.REPRODUCED and by_id["tent_vit"].verdict == rep.UNDERFIT
    assert by_id["tent_cnn_vs_vit"].verdict == rep.UNDERFIT and "vit:" in by_id["tent_vit"].why
    # a missing corruption: no mean over the four, so no verdict rather than a mean over fewer
    assert _words(_records(0.1, 0.1, corruptions=ta.CORRUPTIONS[:3]), tmp_path) == {}


def test_page_tables_and_sanity_notes(tmp_path: Path) -> None:
    records = _records(cnn_gain=0.10, vit_gain=0.0)
    spec = ClaimSpec.from_dict("tta_arch", load_spec("tta_arch"))
    result = ta.claim_report(records, spec, tmp_path)
    top1, quarters = result.tables
    assert (top1.rows[1][:6]) == [
        "cnn",
        "gaussian_noise",
        "60 ± 0 (n=3)",
        "70 ± 0.4 (n=3)",
        "70 ± 0.4 (n=3)",
        "60 ± 0.4 (n=3)",
    ]
    assert top1.rows[5][:4] == ["cnn", "**mean of 4**", "60 ± 0 (n=3)", "70 ± 0.4 (n=3)"]
    assert quarters.rows[0][:2] == ["cnn", "source"]
    assert result.notes == [result.notes[0]] and result.notes[0].endswith("none.")
    bad = ta.claim_report(_records(cnn_gain=-0.2, vit_gain=0.0), spec, tmp_path)
    assert "cnn fog seed 0: Tent 0.396 vs source 0.600" in bad.notes[0]


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
