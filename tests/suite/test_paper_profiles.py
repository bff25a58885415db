"""Paper-scale profiles (``conf/claim/paper/<slug>.yaml``): every one loads and composes, its model instantiates at the
paper's full size on the meta device with the parameter count compared to the paper's, and one training step runs at
reduced width on the real-format fixture of its datamodule (the writers of tests/datamodules).

Parametrised over ``conf/claim/paper/*.yaml``, so a paper added later is covered by adding its profile. Every claim
spec ``conf/claim/<slug>.yaml`` must have one.

Parameter counts: the meta-device count of ``params_of`` (default ``model``) of ``params_entry`` (default the first
entry) must lie within ``params_tolerance``
(default 10%, relative) of ``paper_params``; a profile whose count cannot match (a different backbone, parameters
built from the data) says why in ``params_note`` and then the count is only reported. ``paper_params: null`` (not in
the paper) is reported too.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import hydra
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import suite.resolvers  # noqa: F401 - the suite's resolvers, as in tests/conftest.py
from suite.build import build
from suite.claim import PAPER_KEYS, load_spec, merge_overrides
from tests.conftest import ROOT, compose_train

PAPER = ROOT / "conf" / "claim" / "paper"
SLUGS = sorted(p.stem for p in PAPER.glob("*.yaml"))
#: Claim specs of papers; a cross-paper study (``study:`` in its spec, e.g. quant_outliers) has no paper profile.
CLAIMS = sorted(p.stem for p in (ROOT / "conf" / "claim").glob("*.yaml") if "study" not in OmegaConf.load(p))
DEFAULT_TOLERANCE = 0.10


# -- real-format fixtures, reusing the datamodule tests' writers ------------------------------------------------------
def _text_shards(root: Path) -> None:
    from tests.datamodules.test_text import _write_shards

    _write_shards(root)


def _plain_text(root: Path) -> None:
    (root / "a.txt").write_text("The quick brown fox jumps over the lazy dog. " * 200)


def _zinc_raw(root: Path) -> None:
    from tests.datamodules.test_molecules import write_zinc_raw

    write_zinc_raw(root)


def _arena_battles(root: Path) -> None:
    from tests.datamodules.test_arena import BATTLES

    (root / "arena.jsonl").write_text("\n".join(json.dumps(b) for b in BATTLES))


def _german_credit(root: Path) -> None:
    from tests.datamodules.test_tabular import GERMAN_ROWS, _write

    _write(root / "german.data", GERMAN_ROWS * 10)


def _fashion_mnist_idx(root: Path) -> None:
    from tests.datamodules.test_fashion_mnist import make_fixture

    make_fixture(root, n_train=40, n_test=12)


def _read_layout(root: Path) -> None:
    from tests.datamodules.test_multimodal import write_read_layout

    write_read_layout(root, [{"video_id": f"v{i}", "labels": "/m/a" if i % 2 else "/m/b"} for i in range(8)])


def _metr_la_h5(root: Path) -> None:
    pytest.importorskip("tables")
    import pandas as pd

    from tests.datamodules.test_timeseries import _series

    index = pd.date_range("2012-03-01", periods=200, freq="5min")
    pd.DataFrame(_series(200, 4), index=index, columns=["773869", "767541", "767542", "717447"]).to_hdf(
        root / "metr-la.h5", key="df"
    )


def _cifar10_batches(root: Path) -> None:
    from tests.datamodules.test_poisoned import write_cifar

    write_cifar(root, n=20)


def _temporal_graph_csv(root: Path) -> None:
    from tests.lightning_modules.test_nforgot_module import write_stream

    write_stream(root, name="yelp_clear")


def _imagefolder(root: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("n01440764", "n01443537", "n01484850"):  # ImageNet-val synset folders
        (root / cls).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(root / cls / f"{i}.png")


def _nyuv2_mat(root: Path) -> None:
    from tests.datamodules.test_perception import write_nyuv2

    write_nyuv2(root, n=10)


def _bracketire_npy(root: Path) -> None:
    from tests.datamodules.test_bracket import write_released

    write_released(root)


def _sharegpt4v(root: Path) -> None:
    from tests.datamodules.test_captions import write_sharegpt4v

    write_sharegpt4v(root)


def _nuscenes_occ3d(root: Path) -> None:
    from tests.datamodules.test_nuscenes import write_nuscenes

    write_nuscenes(root, n_samples=3, version="v1.0-trainval")


FIXTURES = {
    "bracketire_npy": _bracketire_npy,
    "nuscenes_occ3d": _nuscenes_occ3d,
    "imagefolder": _imagefolder,
    "nyuv2_mat": _nyuv2_mat,
    "text_shards": _text_shards,
    "plain_text": _plain_text,
    "zinc_raw": _zinc_raw,
    "arena_battles": _arena_battles,
    "german_credit": _german_credit,
    "fashion_mnist_idx": _fashion_mnist_idx,
    "read_layout": _read_layout,
    "metr_la_h5": _metr_la_h5,
    "cifar10_batches": _cifar10_batches,
    "temporal_graph_csv": _temporal_graph_csv,
    "sharegpt4v": _sharegpt4v,
    "none": lambda root: None,  # an embedded generator (a theory paper): nothing to write
}


def _entry_overrides(spec: dict, entry: dict, *more: list[str]) -> list[str]:
    return merge_overrides(shlex.split(spec.get("overrides", "")), shlex.split(entry.get("overrides", "")), *more)


def test_every_claim_has_a_paper_profile():
    assert sorted(set(CLAIMS) - set(SLUGS)) == [], "each conf/claim/<slug>.yaml needs conf/claim/paper/<slug>.yaml"
    assert sorted(set(SLUGS) - set(CLAIMS)) == [], "a paper profile without a CPU claim spec"


@pytest.mark.parametrize("slug", SLUGS)
def test_profile_composes_and_counts_parameters_at_paper_size(slug: str, tmp_path: Path):
    spec = load_spec(slug, profile="paper")
    assert all(k in spec for k in PAPER_KEYS) and spec["profile"] == "paper"
    assert isinstance(spec["gpu_hours"], (int, float)) and spec["gpu_hours"] >= 0
    assert spec.get("smoke", {}).get("fixture") in FIXTURES, f"{slug}: smoke.fixture must name one of {list(FIXTURES)}"
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfgs = [compose("train", overrides=[f"experiment={slug}", *_entry_overrides(spec, e)]) for e in spec["runs"]]
    for entry, cfg in zip(spec["runs"], cfgs):
        assert cfg.experiment_slug == slug
        assert cfg.trainer.accelerator in ("gpu", "cpu"), f"{slug}/{entry['name']}: {cfg.trainer.accelerator}"
        generated = spec["smoke"]["fixture"] == "none" or entry["name"] in spec.get("embedded_entries", [])
        assert cfg.data.source == "real" or generated, f"{slug}/{entry['name']}: data.source=real (or embedded_entries)"
    # The paper's method (``params_entry``, default the first entry) at full size; the other entries compose above
    # (counting them all on the meta device costs tens of seconds for models that search their width).
    names = [e["name"] for e in spec["runs"]]
    which = spec.get("params_entry", names[0])
    node = cfgs[names.index(which)]
    for part in spec.get("params_of", "model").split("."):
        node = node[part]
    with torch.device(spec.get("params_device", "meta")):
        obj = hydra.utils.instantiate(node)
    main = sum(p.numel() for p in obj.parameters())
    counts = {which: main}
    paper = spec["paper_params"]
    print(f"\n{slug}: {counts} parameters at paper size; paper {paper}")  # shown with -s (the report of the count)
    if paper is None:
        return
    rel = (main - paper) / paper
    tol = spec.get("params_tolerance", DEFAULT_TOLERANCE)
    if spec.get("params_note"):
        print(f"{slug}: {main:,} vs paper {paper:,} ({rel:+.1%}), not compared: {spec['params_note']}")
        return
    assert abs(rel) <= tol, f"{slug}: {main:,} parameters vs the paper's {paper:,} ({rel:+.1%}, beyond {tol:.0%})"


@pytest.mark.parametrize("slug", SLUGS)
def test_one_training_step_at_reduced_width_on_real_format_fixture(slug: str, tmp_path: Path):
    spec = load_spec(slug, profile="paper")
    smoke = spec["smoke"]
    names = [e["name"] for e in spec["runs"]]
    entry = spec["runs"][names.index(smoke.get("entry", names[0]))]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    FIXTURES[smoke["fixture"]](data_dir)
    local = [f"data.data_dir={data_dir}"] if smoke["fixture"] != "none" else []
    # One CPU process whatever the profile asks for (trainer=ddp with trainer.devices=8 would spawn eight).
    cpu = [
        "trainer=cpu",
        "trainer.devices=1",
        "trainer.num_nodes=1",
        "trainer.precision=32-true",
        "trainer.accumulate_grad_batches=1",
        "data.num_workers=0",
        "debug=fdr",
        "logger=csv",
    ]
    overrides = _entry_overrides(spec, entry, shlex.split(smoke.get("overrides", "")), local, cpu)
    cfg = compose_train([f"experiment={slug}", *overrides], tmp_path / "run")
    if smoke["fixture"] != "none":
        assert cfg.data.source == "real", f"{slug}: the paper profile must read the real dataset (data.source=real)"
    objs = build(cfg)
    model, trainer = objs["model"], objs["trainer"]
    before = {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}
    trainer.fit(model, datamodule=objs["datamodule"])
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
    assert metrics, f"{slug}: the step logged nothing"
    assert all(math.isfinite(v) for v in metrics.values()), f"{slug}: non-finite metric in {metrics}"
    after = model.state_dict()
    if before:  # a model built before fit: the step must have changed some parameter
        assert any(not torch.equal(before[k], after[k]) for k in before if k in after), f"{slug}: no parameter moved"
    else:  # built from the data in setup(): it must exist now
        assert any(np.prod(v.shape) > 0 for v in after.values()), f"{slug}: no parameters after the step"


# -- the loader and the page section (no runs) ------------------------------------------------------------------------
def test_later_overrides_win_and_slurm_is_detected():
    merged = merge_overrides(["trainer=gpu", "trainer.devices=8", "+callbacks.x.a=1"], ["trainer=ddp", "seed=0,1"])
    assert merged == ["trainer.devices=8", "+callbacks.x.a=1", "trainer=ddp", "seed=0,1"]
    from suite.claim import uses_slurm

    assert uses_slurm(["trainer=cpu", "launcher=slurm"]) and not uses_slurm(["launcher=local", "slurm.qos=x"])


def test_paper_spec_errors_are_one_line(tmp_path: Path):
    from core.errors import ConfigError

    bad = tmp_path / "p.yaml"
    bad.write_text("runs: [{name: a}]\nprofile: paper\npublished: {}\npaper_params: null\n")
    with pytest.raises(ConfigError, match=r"lacks \['gpu_hours'\]"):
        load_spec("x", bad, profile="paper")
    bad.write_text("runs: [{name: a}]\nprofile: paper\npublished: {b: {test/x: 1}}\npaper_params: null\ngpu_hours: 1\n")
    with pytest.raises(ConfigError, match=r"published names \['b'\]"):
        load_spec("x", bad, profile="paper")
    with pytest.raises(ConfigError, match="no paper-scale profile for 'nope'"):
        load_spec("nope", profile="paper")
    # report: inherited from the CPU spec when the profile has none (one reports hook per claim slug)
    assert load_spec("grass", profile="paper")["report"] == load_spec("grass")["report"]


def test_published_section_puts_paper_numbers_beside_measured(tmp_path: Path):
    from suite.claim import published_section
    from suite.compare import RunRecord

    spec = {"gpu_hours": 3, "paper_params": 500000, "published": {"a": {"test/mae": 0.05, "test/r2": None}, "b": {}}}
    records = [RunRecord(tmp_path, "a", s, {"test/mae": v}) for s, v in ((0, 0.06), (1, 0.08))]
    text = published_section("grass", spec, records, ["launcher=slurm"])
    assert "make claim METHOD=grass PROFILE=paper ARGS=launcher=slurm" in text
    assert "Expected GPU-hours (whole claim): 3" in text and "500,000 parameters" in text
    assert "| a | test/mae | 0.05 | 0.07 ± 0.014 (2) | +0.02 |" in text
    assert "| a | test/r2 | not in the paper | — | — |" in text
