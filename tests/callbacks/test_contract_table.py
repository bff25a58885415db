"""One contract, one copy: ``callbacks.contracts.CONTRACTS`` is the only statement of what each shared callback
needs. The table in ``docs/extending.md`` is its ``contract_table()``, the README's callback table names each of
its callbacks and repeats none of it, every callback with a ``contract_problems`` has an entry, and the checks read
the member names from the protocols."""

from __future__ import annotations

import importlib
import inspect
import re
from types import SimpleNamespace

import pytest
from torch import nn

from callbacks import contracts
from callbacks.contracts import (
    CONTRACTS,
    CausalLMNet,
    Classifier,
    DynamicsData,
    MaskedLMNet,
    MultimodalTTA,
    contract_table,
    missing_members,
    protocol_members,
    quant_calibration_problems,
    tta_problems,
)
from tests.conftest import ROOT

REGENERATE = 'python -c "from callbacks.contracts import contract_table; print(contract_table())"'


def _table_after(text: str, header: str) -> str:
    start = text.index(header)
    end = text.find("\n\n", start)
    return text[start : end if end >= 0 else None].strip()


def _callbacks_with_a_contract() -> dict[str, type]:
    """class name -> class of every callback defined in ``callbacks/`` that has ``contract_problems``."""
    found = {}
    for path in sorted((ROOT / "callbacks").glob("*.py")):
        mod = importlib.import_module(f"callbacks.{path.stem}")
        for name, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ == mod.__name__ and callable(getattr(cls, "contract_problems", None)):
                found[name] = cls
    return found


def test_docs_table_is_the_generated_one():
    text = (ROOT / "docs" / "extending.md").read_text()
    table = _table_after(text, "| callback | the module provides | the datamodule provides |")
    assert table == contract_table(), f"docs/extending.md's contract table is stale: paste the output of {REGENERATE}"


def test_every_callback_with_a_check_has_one_contract_and_uses_its_check():
    classes = _callbacks_with_a_contract()
    names = [c.callback for c in CONTRACTS]
    assert sorted(names) == sorted(classes) and len(set(names)) == len(names)
    probe = nn.Module()  # meets no contract: every check, and each variant of one, has its own complaint
    probe.net = nn.Linear(3, 2)
    for c in CONTRACTS:
        cls = classes[c.callback]
        cb = cls(method="tent") if c.callback == "TestTimeAdaptation" else cls()
        assert cb.contract_problems(probe) == c.problems(probe), c.callback


def test_readme_names_each_contract_callback_and_repeats_no_contract():
    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `callbacks\.(\w+)\.(\w+)` \|[^\n]*$", text, re.M)
    listed = {cls for _, cls in rows}
    assert {c.callback for c in CONTRACTS} <= listed, "a callback with a contract has no README row"
    section = text[text.index("## Shared callbacks") :]
    section = section[: section.index("\n## ", 1)]
    assert "(contract:" not in section, "the README restates a contract: keep it in callbacks/contracts.py only"


def test_protocol_members_are_what_the_protocols_declare():
    assert protocol_members(Classifier) == ("num_classes",)  # __call__ is checked by the probes
    assert protocol_members(MultimodalTTA) == ("tta_forward",)
    assert protocol_members(DynamicsData) == ("dynamics_dataloader",)
    assert protocol_members(CausalLMNet) == contracts.CAUSAL_LM_PARTS == ("embed", "blocks", "norm", "lm_head")
    assert protocol_members(MaskedLMNet) == ("encoder", "head")
    assert missing_members(SimpleNamespace(embed=1, norm=2), CausalLMNet) == ["blocks", "lm_head"]


def test_the_checks_read_their_names_from_the_protocols(monkeypatch):
    """Adding a member to a protocol changes what its check asks for: the check has no list of its own."""
    net = SimpleNamespace(embed=nn.Identity(), blocks=nn.ModuleList(), norm=nn.Identity(), lm_head=nn.Identity())
    module = nn.Module()
    module.net = nn.Module()
    for k, v in vars(net).items():
        setattr(module.net, k, v)
    assert quant_calibration_problems(module) == []
    monkeypatch.setattr(CausalLMNet, "__annotations__", {**CausalLMNet.__annotations__, "rotary": nn.Module})
    assert "no rotary" in quant_calibration_problems(module)[0]
    monkeypatch.setattr(Classifier, "__annotations__", {"n_labels": int})
    assert tta_problems(nn.Linear(2, 2), params="all", probe=False)[0].startswith(
        "model Linear has no integer n_labels >= 2"
    )


@pytest.mark.parametrize("c", CONTRACTS, ids=lambda c: c.callback)
def test_each_contract_names_module_and_datamodule(c):
    assert c.module.strip() and c.datamodule.strip() and "|" not in c.module + c.datamodule
