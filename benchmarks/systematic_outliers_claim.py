"""Small CPU claim check for systematic_outliers + ostquant (prints a markdown table; see docs/results/*.md).

For each attention variant: train a tiny byte-level LM (Python stdlib text) for ``--steps`` AdamW steps, record the
validation loss curve (convergence), run the outlier census (activation top1/median, share of tokens above 100x the
mean, weight max/median, attention share on token 0), then quantize W4A4KV4 with RTN / QuaRot / OSTQuant
(callbacks.quant_calibration pipeline) and report the perplexity gap to full precision.

    .venv/bin/python -m benchmarks.systematic_outliers_claim --steps 400 --variants softmax kv_bias ca_scale
"""

from __future__ import annotations

import argparse
import math
import time
from functools import partial

import torch
import torch.nn.functional as F

from callbacks.outlier_census import run_census, summarize
from callbacks.quant_calibration import QuantCalibration
from datamodules.text import stdlib_documents
from layers.attention.outlier_variants import OutlierVariantAttention
from layers.lm import CausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--variants", nargs="+", default=["softmax", "kv_bias", "ca_scale"])
    ap.add_argument("--mixers", nargs="*", default=[], help="extra suite mixers: stickbreaking gated_deltanet")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--calib_steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(2)
    data = torch.tensor(list(b"\n\n".join(stdlib_documents(0, 600_000))), dtype=torch.long)
    n_val = 40_000
    train, val = data[:-n_val], data[-n_val:]
    g = torch.Generator().manual_seed(args.seed)

    def batch(src: torch.Tensor) -> dict[str, torch.Tensor]:
        i = torch.randint(0, src.numel() - args.seq - 1, (args.batch,), generator=g)
        w = torch.stack([src[j : j + args.seq + 1] for j in i.tolist()])
        return {"input_ids": w[:, :-1], "labels": w[:, 1:]}

    val_batches = [batch(val) for _ in range(8)]
    calib = [batch(train) for _ in range(4)]
    subjects = [(v, partial(OutlierVariantAttention, num_heads=4, variant=v)) for v in args.variants]
    subjects += [(m, {"kind": m, "num_heads": 4 if m != "gated_deltanet" else 2}) for m in args.mixers]
    rows = []
    for name, mixer in subjects:
        torch.manual_seed(args.seed)
        net = CausalLM(256, 64, 2, mixer=[mixer], pos_embedding="learned", max_len=args.seq)
        opt = torch.optim.AdamW(net.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
        curve, t0 = [], time.time()
        for step in range(1, args.steps + 1):
            b = batch(train)
            loss = F.cross_entropy(net(b["input_ids"]).flatten(0, 1), b["labels"].flatten())
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            if step % max(1, args.steps // 4) == 0:
                with torch.no_grad():
                    net.eval()
                    vl = sum(
                        F.cross_entropy(net(v["input_ids"]).flatten(0, 1), v["labels"].flatten()).item()
                        for v in val_batches
                    ) / len(val_batches)
                    net.train()
                curve.append(round(vl, 3))
        net.eval()
        census = summarize(
            run_census(
                net,
                lambda: net(val_batches[0]["input_ids"]),  # noqa: B023 (called at once)
                r"^blocks\.\d+$",
                r"(o_proj|down_proj)$",
                k=[100.0, 1000.0],
            )
        )
        cb = QuantCalibration(methods=["fp", "rtn", "quarot", "ostquant"], steps=args.calib_steps)
        quant = {}
        for m in cb.methods:
            quant[m] = cb.evaluate(net, cb.build(net, m, calib, args.calib_steps), val_batches)
        rows.append((name, curve, census, quant, time.time() - t0))
        print(name, curve, census, {m: round(q["ppl"], 3) for m, q in quant.items()}, flush=True)
    print(
        "\n| model | val loss curve | act top1/median | tokens >100x mean | weight max/median | sink share | "
        "ppl fp | RTN | QuaRot | OSTQuant |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, curve, c, q, _ in rows:
        print(
            f"| {name} | {' '.join(map(str, curve))} | {c.get('census/act_ratio_max', math.nan):.1f} | "
            f"{c.get('census/act_token_frac_k100', math.nan):.3f} | {c.get('census/weight_ratio_max', math.nan):.1f} | "
            f"{c.get('census/sink_share', math.nan):.3f} | {q['fp']['ppl']:.3f} | {q['rtn']['ppl']:.3f} | "
            f"{q['quarot']['ppl']:.3f} | {q['ostquant']['ppl']:.3f} |"
        )


if __name__ == "__main__":
    main()
