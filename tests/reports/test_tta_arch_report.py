"""The tta_arch study: its report hook's verdicts on the spec's declared claims (through the page's judge) on
synthetic runs, the spec (every entry composes, the test-only entries load their training entry's best-validation
checkpoint, the label-shifted stream is the gaussian_noise one sorted by class) and TTAComparison on a datamodule
with several test loaders (the poisoned datamodule's case)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

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
from tests._helpers.tta import TinyClassifier, cpu_trainer

SEEDS = (0, 1, 2)
JITTER = (-1.0, 0.0, 1.0)  # times `jitter`: a seed effect the two architectures share (the same test images)
CONVERGED = [(0, 2.0), (50, 0.5), (100, 0.5)]  # the training entry's best-so-far val/loss stopped improving


def _metrics(accs: dict[str, float], quarters: dict[str, tuple[float, float]] | None = None) -> dict[str, float]:
    """``tta/<m>/acc`` with flat quarters, except ``quarters[m] = (q1, q4)``."""
    out = {}
    for m, a in accs.items():
        out[f"tta/{m}/acc"] = a
        q1, q4 = (quarters or {}).get(m, (a, a))
        out.update({f"tta/{m}/acc_q1": q1, f"tta/{m}/acc_q2": a, f"tta/{m}/acc_q3": a, f"tta/{m}/acc_q4": q4})
    return out


def _records(
    cnn_steps: float,
    vit_steps: float,
    *,
    bn_gain: float = 0.2,
    clean: float = 0.9,
    corrupted: float = 0.6,
    jitter: float = 0.002,
    shared: float = 0.5,
    collapse: float = 0.0,
    streams: tuple[str, ...] = ta.CORRUPTIONS + ta.WILD_STREAMS,
    vit_curve: list | None = None,
) -> list[RunRecord]:
    """Per seed and stream: source at ``corrupted``, BN-adapt ``bn_gain`` above it on the CNN (equal to source on the
    ViT), Tent ``<arch>_steps`` above BN-adapt plus the seed's jitter (the ViT's ``shared`` times the CNN's), EATA
    and SAR equal to BN-adapt. On the label-shifted stream Tent's gain over BN-adapt falls by ``collapse`` (plus the
    seed's jitter) from Q1 to Q4 (BN-adapt's quarters are flat)."""
    out = []
    for arch, steps in (("cnn", cnn_steps), ("vit", vit_steps)):
        bn = bn_gain if arch == "cnn" else 0.0
        for s, j in zip(SEEDS, JITTER, strict=True):
            j = jitter * j * (1.0 if arch == "cnn" else shared)
            cfg = {"data": {"seed": s}}
            curves = {"val/loss": vit_curve if arch == "vit" and vit_curve else CONVERGED}
            base = dict.fromkeys(ta.METHODS, clean)
            out.append(RunRecord(Path("."), arch, s, _metrics(base), curves, config=cfg))
            for stream in streams:
                b = corrupted + bn
                accs = {"source": corrupted, "bn": b, "tent": b + steps + j, "eata": b, "sar": b}
                t = accs["tent"]
                quarters = {"tent": (t + collapse / 2 + j, t - collapse / 2)} if stream in ta.WILD_STREAMS else {}
                out.append(RunRecord(Path("."), f"{arch}_{stream}", s, _metrics(accs, quarters), config=cfg))
    return out


def _spec() -> ClaimSpec:
    return ClaimSpec.from_dict("tta_arch", load_spec("tta_arch"))


def _judge(records: list[RunRecord], tmp_path: Path, spec: ClaimSpec | None = None) -> dict:
    verdicts, _, _, hook_md, _, _ = judge_page(spec or _spec(), records, tmp_path)
    assert not hook_md  # the hook returns data, and did not fail
    return {v.id: v for v in verdicts}


def test_claims_are_declared_in_the_spec_paired_with_a_delta() -> None:
    spec = _spec()
    arch = spec.claim("tent_steps_cnn_vs_vit")
    assert arch.primary and arch.paired is True and arch.delta == 0.01 and arch.delta_why
    assert arch.entries == ("cnn", "vit") and arch.metric == "tta/tent/acc - tta/bn/acc"
    for c in spec.claims:
        assert c.paired is True and c.delta > 0 and c.delta_why, c.id
        if ta.is_collapse(c):  # collapse is only ever read on a stream where it can occur
            assert all(ta.split_name(e)[1] in ta.WILD_STREAMS for e in c.entries), c.id


def test_architecture_verdict_reads_tent_minus_bn_adapt(tmp_path: Path) -> None:
    # the CNN's whole gain over source is BatchNorm's re-estimation (+0.2); Tent's steps add nothing there and one
    # point on the ViT: Tent does NOT gain more on the CNN, although its gain over source is 20x larger there
    by_id = _judge(_records(cnn_steps=0.0, vit_steps=0.02), tmp_path)
    arch = by_id["tent_steps_cnn_vs_vit"]
    assert arch.verdict == rep.NOT_REPRODUCED and arch.diff == pytest.approx(-0.02) and arch.hi < 0
    assert arch.values["cnn"]["0"] == pytest.approx(-0.002)  # per seed: Tent - BN-adapt, mean over the corruptions
    assert by_id["tent_cnn"].verdict == rep.REPRODUCED and by_id["tent_cnn"].diff == pytest.approx(0.2)
    assert by_id["bn_cnn"].diff == pytest.approx(0.2) and "sign test" in by_id["bn_cnn"].why  # +0.2 on every seed
    assert by_id["tent_vs_bn_cnn"].verdict == rep.NOT_REPRODUCED  # no effect as large as delta
    assert by_id["tent_vit"].verdict == rep.REPRODUCED and by_id["tent_vit"].diff == pytest.approx(0.02)
    # the steps gain more on the CNN: reproduced
    arch = _judge(_records(cnn_steps=0.03, vit_steps=0.0), tmp_path)["tent_steps_cnn_vs_vit"]
    assert arch.verdict == rep.REPRODUCED and arch.diff == pytest.approx(0.03)


def test_architecture_verdict_is_paired_by_seed(tmp_path: Path) -> None:
    # both architectures' Tent - BN-adapt move with the seed (+-2 points; 0.9 of that on the ViT): the paired
    # differences are 0.02 +- 0.002, decided; unpaired (Welch) the seed effect swamps them
    records = _records(cnn_steps=0.02, vit_steps=0.0, jitter=0.02, shared=0.9)
    arch = _judge(records, tmp_path)["tent_steps_cnn_vs_vit"]
    assert arch.paired and arch.n == (3, 3)
    assert arch.verdict == rep.REPRODUCED and arch.lo > 0.01, arch.why
    unpaired = replace(_spec().claim("tent_steps_cnn_vs_vit"), paired=False)
    welch = ta.judge_claim(unpaired, ta.collect(records), {})
    assert welch.verdict == rep.NOISE and welch.lo < 0  # what throwing the pairing away would read


def test_collapse_only_on_a_stream_where_it_can_occur(tmp_path: Path) -> None:
    by_id = _judge(_records(cnn_steps=0.0, vit_steps=0.0, collapse=0.06), tmp_path)
    assert by_id["collapse_cnn"].verdict == rep.REPRODUCED == by_id["collapse_vit"].verdict
    assert by_id["collapse_cnn"].diff == pytest.approx(0.06)  # Tent - BN-adapt: Q1 +0.03, Q4 -0.03
    flat = _judge(_records(cnn_steps=0.0, vit_steps=0.0), tmp_path)
    assert flat["collapse_cnn"].verdict == rep.NOT_REPRODUCED  # flat quarters: no collapse as large as delta
    # the same claim read on an i.i.d. corruption stream: phenomenon absent, whatever its quarters say
    iid = replace(_spec().claim("collapse_cnn"), entries=("cnn_gaussian_noise", "cnn_gaussian_noise"))
    res = ta.judge_claim(iid, ta.collect(_records(cnn_steps=0.0, vit_steps=0.0, collapse=0.06)), {})
    assert res.verdict == rep.ABSENT and "i.i.d." in res.why and "label_shift" in res.why


def test_gates_underfit_and_absent(tmp_path: Path) -> None:
    # near-chance clean source model: underfit on every verdict
    by_id = _judge(_records(0.02, 0.02, clean=0.3, corrupted=0.2), tmp_path)
    assert {v.verdict for v in by_id.values()} == {rep.UNDERFIT}
    # the corruptions cost the source model < MIN_SHIFT: nothing to recover on the mean-of-corruptions claims; the
    # collapse claims read the label-shifted stream and keep their verdicts
    by_id = _judge(_records(0.02, 0.02, clean=0.62, corrupted=0.6), tmp_path)
    assert by_id["tent_vit"].verdict == rep.ABSENT == by_id["tent_steps_cnn_vs_vit"].verdict
    assert by_id["collapse_vit"].verdict == rep.NOT_REPRODUCED
    # an entry still improving is underfit, the other architecture keeps its verdicts
    by_id = _judge(_records(0.02, 0.02, vit_curve=[(0, 2.0), (50, 1.0), (100, 0.5)]), tmp_path)
    assert by_id["tent_vs_bn_cnn"].verdict == rep.REPRODUCED and by_id["tent_vit"].verdict == rep.UNDERFIT
    assert by_id["tent_steps_cnn_vs_vit"].verdict == rep.UNDERFIT and "vit:" in by_id["tent_vit"].why
    assert by_id["collapse_vit"].verdict == rep.UNDERFIT  # its `converge: [vit]`
    # a missing corruption: no mean over the four, so no verdict from the hook rather than a mean over fewer
    by_id = _judge(_records(0.02, 0.02, streams=ta.CORRUPTIONS[:3]), tmp_path)
    missing = by_id["tent_vit"]  # not the engine's reading of the training entry's clean stream
    assert missing.verdict == rep.NOISE and missing.diff is None and "no seed with all of" in missing.why


def test_page_tables_per_corruption_and_chance_streams(tmp_path: Path) -> None:
    records = _records(cnn_steps=0.0, vit_steps=0.02)
    for r in records:  # the ViT's source model near chance on fog (12%); every arm there too
        if r.name == "vit_fog":
            r.metrics.update({f"tta/{m}/acc": 0.12 for m in ta.METHODS})
    result = ta.claim_report(records, _spec(), tmp_path)
    top1, quarters = result.tables
    rows = {(r[0], r[1].split(" ")[0]): r for r in top1.rows}
    assert [r[1] for r in top1.rows if r[0] == "cnn"][1:5] == list(ta.CORRUPTIONS)  # one row per corruption
    assert rows["cnn", "gaussian_noise"][2:7] == [
        "60 ± 0 (n=3)",
        "80 ± 0 (n=3)",
        "80 ± 0.2 (n=3)",
        "80 ± 0 (n=3)",
        "80 ± 0 (n=3)",
    ]
    assert rows["cnn", "gaussian_noise"][7] == "+0.00 [-0.50, +0.50] (n=3)"  # Tent - BN-adapt, points, paired
    assert rows["vit", "fog"][1] == "fog (source near chance: 12.0%, chance 10%)"
    assert rows["cnn", "fog"][1] == "fog" and ("vit", "label_shift") in rows
    assert rows["cnn", "**mean"][1] == "**mean of 4 corruptions**"
    assert quarters.rows[0][:3] == ["cnn", "mean of 4 corruptions", "source"]
    assert any(r[1] == "label_shift" for r in quarters.rows)
    assert result.notes[0].endswith("none.")
    # BN-adapt differing from source on the ViT (no BatchNorm there) is flagged, as is a method far below source
    for r in records:
        if r.name == "vit_defocus_blur" and r.seed == 1:
            r.metrics["tta/bn/acc"] = 0.5
        if r.name == "cnn_contrast" and r.seed == 0:
            r.metrics["tta/sar/acc"] = 0.3
    notes = ta.claim_report(records, _spec(), tmp_path).notes[0]
    assert "vit defocus_blur seed 1: BN-adapt 0.5000 differs from source 0.6000" in notes
    assert "cnn contrast seed 0: SAR 0.300 vs source 0.600" in notes


def test_spec_entries_compose_and_chain_to_their_training_entry(tmp_path: Path) -> None:
    spec = load_spec("tta_arch")
    names = [e["name"] for e in spec["runs"]]
    assert names[:2] == ["cnn", "vit"]  # the training entries run first: the others load their checkpoints
    assert {(a, c) for a in ta.ARCHS for c in ta.STREAMS} == {ta.split_name(n) for n in names}
    assert set(ta.CORRUPTIONS) <= set(CORRUPTIONS)
    for entry in spec["runs"]:
        arch, stream = ta.split_name(entry["name"])
        cfg = compose_run("tta_arch", entry_command("tta_arch", entry, spec, tmp_path / "tta", [])[4:])
        assert cfg.experiment_slug == {"cnn": "badloss", "vit": "mda"}[arch]
        assert list(cfg.data.attacks) == [] and cfg.data.severity == 5  # clean training data
        variants = cfg.callbacks.tta_compare.variants
        assert list(variants) == list(ta.METHODS) and variants.bn.method == "bn"
        assert {v.get("lr", 1e-3) for k, v in variants.items() if k not in ("source", "bn")} == {1e-3}
        if stream == "clean":  # trains, tests its best-validation weights and keeps them as best.ckpt
            assert cfg.train and cfg.data.corruption is None and cfg.test_weights == "best"
            assert cfg.callbacks.model_checkpoint.monitor == "val/loss" and cfg.callbacks.model_checkpoint.mode == "min"
            assert cfg.callbacks.model_checkpoint.filename == "best"
            assert cfg.model.scheduler.T_max in (cfg.trainer.max_epochs, "${trainer.max_epochs}")
        else:
            assert not cfg.train
            assert cfg.data.corruption == (stream if stream in ta.CORRUPTIONS else "gaussian_noise")
            assert cfg.data.test_order == ("by_class" if stream in ta.WILD_STREAMS else None)
            ckpt = cfg._get_node("ckpt_path")._value()  # unresolved: ${hydra:...} exists only inside the job
            assert f"/../{arch}/${{hydra:sweep.subdir}}/checkpoints/best.ckpt" in ckpt
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
    trainer = cpu_trainer(tmp_path, [cmp])
    trainer.test(TwoLoaderClassifier(), dataloaders=loaders, verbose=False)
    plain = TinyClassifier()
    with torch.no_grad():
        expected = float((plain(x).argmax(-1) == y).float().mean())
    assert cmp.results["src"]["acc"] == pytest.approx(expected)  # all 48 examples, both loaders
    rows = (tmp_path / "tta_compare.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 6  # 4 + 2 batches per variant
    assert cmp.variants["tent"].total == 6
