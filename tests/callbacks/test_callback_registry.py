"""Which experiments each shared callback works with, found from the registry.

Every ``conf/experiment/*.yaml`` is composed and its module instantiated as ``python -m train`` does; each shared
callback's contract (:mod:`callbacks.contracts`) is checked on the module, and, where the module meets it, on the
datamodule set up on its embedded data. Each pair that meets a contract (the MDA subject and the BaDLoss CNN first,
then the others by name, at most :data:`MAX_RUNS` per callback) then runs through the train entry point with
``debug=fdr`` and the callback added by Hydra overrides, and the test checks that the callback did its work: norm
parameters adapted (and nothing else) with ``tta/*`` logged; a loss matrix ``[N, epochs]`` of finite per-example
losses written; quantized metrics logged next to full precision, with a non-zero KL from it (for classifiers: the
top-1 of every method at W4A4, its drop from full precision, the same in ``quant_calibration.json``). The minimum
(three experiments, the ViT and the CNN among them) is asked of each family of callbacks: the LM and classifier
quantization callbacks together, and the classifier one alone. Pairs that do not meet a
contract are skipped with the contract's own reasons (``pytest -rs`` lists them). The README's callback table is
checked against the same census.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import pytest
import torch
from lightning.pytorch import Callback
from omegaconf import OmegaConf

from callbacks.contracts import dynamics_loader
from callbacks.loss_dynamics import LossDynamics
from callbacks.quant_calibration import MaskedLMQuantCalibration, QuantCalibration
from callbacks.quant_classifier import METHODS as CLASSIFIER_METHODS
from callbacks.quant_classifier import ClassifierQuantCalibration
from callbacks.tta import TestTimeAdaptation
from tests.conftest import ROOT, compose_train, run_entry

pytestmark = pytest.mark.usefixtures("one_thread")

SLUGS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
#: Every callback works with the MDA subject (a ViT) and the BaDLoss classifier (a CNN).
REQUIRED = ("mda", "badloss")
#: Runs per callback (the required experiments first): keeps the test near a minute on two cores.
MAX_RUNS = 3
#: Smaller embedded training / test sets where a datamodule takes them (the same for the census and the runs):
#: loss dynamics score the whole training set even under ``debug=fdr``.
SHRINK = {"data.subset": 1000, "data.test_subset": 200}


@dataclass(frozen=True)
class Spec:
    """A shared callback as the test adds it: ``callbacks.<key>`` = ``target(**settings)``."""

    target: type[Callback]
    key: str
    settings: dict[str, Any] = field(default_factory=dict)
    #: What the issue's minimum (at least three experiments, the ViT and the CNN among them) is asked of: the
    #: callbacks of one family together (the LM quantization callbacks are the language-model side of the family
    #: whose classifier side is ClassifierQuantCalibration).
    family: str = ""

    def callback(self) -> Callback:
        return self.target(**self.settings)

    def overrides(self) -> list[str]:
        path = f"{self.target.__module__}.{self.target.__qualname__}"
        return [f"++callbacks.{self.key}._target_={path}"] + [
            f"++callbacks.{self.key}.{k}={_hydra_value(v)}" for k, v in self.settings.items()
        ]


def _hydra_value(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_hydra_value(x) for x in v) + "]"
    return str(v)


QUANT = {"methods": ["fp", "rtn"], "w_bits": 4, "a_bits": 4, "kv_bits": 4, "steps": 0, "calib_batches": 1}
#: Every method at W4A4 (``debug=fdr`` caps OSTQuant's learning at 2 steps on one calibration batch).
CLASSIFIER_QUANT = {"methods": list(CLASSIFIER_METHODS), "w_bits": 4, "a_bits": 4, "steps": 2, "calib_batches": 1}
SPECS = {
    "TestTimeAdaptation": Spec(TestTimeAdaptation, "tta", {"method": "tent", "optimizer": "adam", "lr": 0.01}),
    "LossDynamics": Spec(LossDynamics, "loss_dynamics", {"metric": "loss", "capacity": 4}),
    "QuantCalibration": Spec(QuantCalibration, "quant_calibration", QUANT, family="quantization"),
    "MaskedLMQuantCalibration": Spec(MaskedLMQuantCalibration, "quant_calibration", QUANT, family="quantization"),
    "ClassifierQuantCalibration": Spec(
        ClassifierQuantCalibration, "quant_calibration", CLASSIFIER_QUANT, family="quantization"
    ),
}
FAMILIES = sorted({spec.family or name for name, spec in SPECS.items()})


@dataclass
class Census:
    problems: dict[str, dict[str, list[str]]]  # callback -> slug -> what the pair lacks (empty: meets it)
    datamodules: dict[str, Any]  # slug -> datamodule set up on its embedded data (pairs whose module met a contract)
    shrink: dict[str, list[str]]  # slug -> the SHRINK overrides its data config takes

    def meets(self, callback: str) -> list[str]:
        return [s for s in SLUGS if not self.problems[callback][s]]

    def chosen(self, callback: str) -> list[str]:
        ok = self.meets(callback)
        return ([s for s in REQUIRED if s in ok] + [s for s in ok if s not in REQUIRED])[:MAX_RUNS]


@functools.cache
def census() -> Census:
    """Every experiment's module (and, where the module qualifies, its datamodule) against every contract."""
    problems: dict[str, dict[str, list[str]]] = {name: {} for name in SPECS}
    datamodules: dict[str, Any] = {}
    shrink: dict[str, list[str]] = {}
    callbacks = {name: spec.callback() for name, spec in SPECS.items()}
    for slug in SLUGS:
        cfg = compose_train([f"experiment={slug}"], ROOT / "logs" / "unused")
        shrink[slug] = [f"{k}={v}" for k, v in SHRINK.items() if OmegaConf.select(cfg, k) is not None]
        for override in shrink[slug]:  # as the runs' command-line overrides will
            key, value = override.split("=")
            OmegaConf.update(cfg, key, int(value))
        module = hydra.utils.instantiate(cfg.model)
        for name, cb in callbacks.items():
            found = cb.contract_problems(module)  # the module alone first: no data is loaded for a module that fails
            if not found:
                if slug not in datamodules:
                    datamodules[slug] = hydra.utils.instantiate(cfg.data)
                    datamodules[slug].setup("fit")
                found = cb.contract_problems(module, datamodules[slug])
            problems[name][slug] = found
    return Census(problems, datamodules, shrink)


# -- the census ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_each_callback_works_with_three_experiments_the_vit_and_the_cnn_among_them(family: str) -> None:
    names = [n for n, spec in SPECS.items() if (spec.family or n) == family]
    ok = sorted({slug for n in names for slug in census().meets(n)})
    assert len(ok) >= 3 and set(REQUIRED) <= set(ok), f"{family} ({names}) meets its contract on {ok} only"


def test_the_classifier_quantization_alone_works_with_the_vit_the_cnn_and_a_third() -> None:
    ok = census().meets("ClassifierQuantCalibration")
    assert len(ok) >= 3 and set(REQUIRED) <= set(ok), ok


def test_contracts_name_what_is_missing() -> None:
    """The census's reasons are the one-line errors the callbacks raise: a few that must stay as they are."""
    p = census().problems
    assert p["TestTimeAdaptation"]["leaderbot"][0].startswith("model LeaderbotLitModule has no integer num_classes")
    assert any("has no normalisation layers" in m for m in p["TestTimeAdaptation"]["ostquant"])
    assert p["LossDynamics"]["ts_lif"] == [
        "datamodule TimeSeriesDataModule training batches are (x, y) with y float32 [2, 6, 12], needs (x, y) with "
        "class labels y [B]"
    ]
    assert "is not a causal LM: no embed, lm_head" in p["QuantCalibration"]["mda"][0]


def test_readme_callback_table_lists_the_experiments_each_callback_works_with() -> None:
    """README.md's callback table names, per callback, exactly the experiments that meet its contract."""
    text = (ROOT / "README.md").read_text()
    for name in SPECS:
        row = re.search(rf"^\|\s*`callbacks\.\w+\.{name}`[^\n]*$", text, re.M)
        assert row, f"README.md has no callback-table row for {name}"
        cells = [c.strip() for c in row.group(0).strip("|").split("|")]
        listed = sorted(re.findall(r"`(\w+)`", cells[-1]))
        assert listed == census().meets(name), f"README row {name}: {listed} != census {census().meets(name)}"


# -- the runs --------------------------------------------------------------------------------------------------------
def _run(slug: str, extra: list[str], tmp_path: Path, capsys) -> tuple[Path, dict[str, float]]:  # noqa: ANN001
    args = [
        f"experiment={slug}",
        "debug=fdr",
        "logger=csv",
        "trainer.enable_progress_bar=false",
        f"paths.log_dir={tmp_path}",
        *extra,
    ]
    code = run_entry("train", args)
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    (run,) = (tmp_path / "debug" / slug / "runs").iterdir()
    return run, json.loads((run / "metrics.json").read_text())


def check_tta(slug: str, run: Path, metrics: dict[str, float]) -> None:
    assert metrics["probe/norm_change"] > 1e-6, f"{slug}: TTA left the norm parameters as they were"
    assert metrics["probe/other_change"] == 0.0, f"{slug}: TTA changed parameters outside the norm layers"
    assert metrics["tta/param_shift"] > 0.0
    assert metrics["tta/selected"] == 1.0  # Tent adapts on every example
    quarters = [metrics[f"tta/acc_q{q}"] for q in range(1, 5)]
    assert all(0.0 <= a <= 1.0 for a in quarters), quarters
    rows = (run / "tta_history.csv").read_text().splitlines()
    assert len(rows) >= 2 and all(math.isfinite(float(r.split(",")[0])) for r in rows[1:])


def check_loss_dynamics(slug: str, run: Path, metrics: dict[str, float]) -> None:
    n = len(dynamics_loader(census().datamodules[slug]).dataset)
    saved = torch.load(run / "loss_dynamics.pt", weights_only=True)
    values = saved["values"]
    assert tuple(values.shape) == (n, 1), f"{slug}: loss matrix {tuple(values.shape)}, expected ({n}, 1)"
    assert saved["epochs"].tolist() == [0]
    assert bool(torch.isfinite(values).all()) and bool((values > 0).all()), f"{slug}: unrecorded or bad losses"
    assert float(values.std()) > 0, f"{slug}: every example has the same loss"


def check_quant(slug: str, run: Path, metrics: dict[str, float]) -> None:
    for key in ("fp_loss", "fp_ppl", "rtn_loss", "rtn_ppl", "rtn_kl", "rtn_ppl_gap"):
        assert math.isfinite(metrics[f"quant/{key}"]), (slug, key)
    assert metrics["quant/fp_kl"] < 1e-6  # full precision against itself
    assert metrics["quant/rtn_kl"] > 1e-4, f"{slug}: the W4A4 model predicts as full precision: nothing quantized"
    assert any(run.rglob("quant_calibration.json")), f"{slug}: no quant_calibration.json in {run}"


def check_classifier_quant(slug: str, run: Path, metrics: dict[str, float]) -> None:
    fp = metrics["quant/fp_acc"]
    assert 0.0 <= fp <= 1.0 and metrics["quant/fp_kl"] == 0.0 and metrics["quant/fp_acc_drop"] == 0.0, slug
    (record,) = run.rglob("quant_calibration.json")
    saved = json.loads(record.read_text())
    assert (saved["w_bits"], saved["a_bits"]) == (4, 4) and list(saved["results"]) == list(CLASSIFIER_METHODS)
    for method in CLASSIFIER_METHODS:
        acc, drop, kl = (metrics[f"quant/{method}_{k}"] for k in ("acc", "acc_drop", "kl"))
        assert 0.0 <= acc <= 1.0 and drop == pytest.approx(fp - acc, abs=1e-6), (slug, method, acc, drop, fp)
        assert saved["results"][method] == pytest.approx({"acc": acc, "acc_drop": drop, "kl": kl}, rel=1e-5)
        if method != "fp":  # an untrained (debug=fdr) model's logits are near-uniform: the KL is small but not zero
            assert kl > 1e-6, f"{slug}: W4A4 {method} predicts as full precision (KL {kl}): nothing quantized"


CHECKS = {
    "TestTimeAdaptation": (check_tta, ["+callbacks.probe._target_=tests.fixtures.callback_probes.ParameterProbe"]),
    "LossDynamics": (check_loss_dynamics, []),
    "QuantCalibration": (check_quant, []),
    "MaskedLMQuantCalibration": (check_quant, []),
    "ClassifierQuantCalibration": (check_classifier_quant, []),
}


@pytest.mark.parametrize("slug", SLUGS)
@pytest.mark.parametrize("name", list(SPECS))
def test_callback_does_its_work_through_train(name: str, slug: str, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    found = census().problems[name][slug]
    if found:
        pytest.skip(f"{slug} does not meet the {name} contract: " + "; ".join(found))
    if slug not in census().chosen(name):
        pytest.skip(f"{slug} meets the {name} contract; not run (at most {MAX_RUNS} runs per callback)")
    check, extra = CHECKS[name]
    run, metrics = _run(slug, census().shrink[slug] + SPECS[name].overrides() + extra, tmp_path, capsys)
    check(slug, run, metrics)


def test_a_pair_that_misses_a_contract_is_refused_in_one_line(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """``python -m train experiment=leaderbot +callbacks.tta=...``: refused at setup, before any training, in one line
    naming what the module lacks."""
    code = run_entry(
        "train",
        [
            "experiment=leaderbot",
            "debug=fdr",
            "logger=csv",
            f"paths.log_dir={tmp_path}",
            *SPECS["TestTimeAdaptation"].overrides(),
        ],
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err[-1].startswith("error: callbacks.tta: model LeaderbotLitModule has no integer num_classes >= 2"), err
    assert not list(tmp_path.rglob("metrics.json"))
