"""N-ForGOT throughput on the embedded primary-school stream (one thread), side by side in one run:

* temporal neighbour sampling, vectorised sampler vs its naive twin (queries/s; goal: >= 50k/s, never the
  bottleneck of training);
* TGAT training (forward + backward + Adam) in events/s, with the share of the step spent sampling;
* TGN training on time-ordered batches (its memory advances over the events between batches) in events/s, and
  the memory stepping alone (events fed to the GRU memory per second);
* the discrepancy terms per batch: linear-time MMD vs multi-kernel MMD vs the temporal-WL kernel MMD (WL
  relabelling + product-kernel MMD), as ratios to the linear-time MMD.

Timings are noisy on a shared machine: read the ratios. The arms of each part alternate over ``--rounds`` interleaved
rounds after a warm-up; each ratio (and the sampler's rate against its goal) is printed with its 95% interval over the
rounds (``benchmarks/_timing.py``). Run: ``python benchmarks/nforgot_throughput.py [--rounds 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import (  # noqa: E402
    add_args,
    calibrate,
    describe,
    header,
    interleave,
    log_interval,
    ratio_interval,
    rounds_of,
    seconds,
)
from datamodules.temporal_graph import TemporalGraphDataModule  # noqa: E402
from layers.temporal_graph.sampler import naive_temporal_neighbors  # noqa: E402
from layers.temporal_graph.tgat import TGAT  # noqa: E402
from layers.temporal_graph.tgn import TGN  # noqa: E402
from ops.nforgot.losses import linear_time_mmd, multi_kernel_mmd, wl_kernel_mmd  # noqa: E402
from ops.nforgot.wl import temporal_wl_labels  # noqa: E402

GOAL_QPS = 50_000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(parser)
    args = parser.parse_args()
    rounds = rounds_of(parser, args)
    n_query, n_naive, bsz, max_tgn = (2000, 5, 50, 2) if args.quick else (20000, 20, 200, 20)
    torch.set_num_threads(1)
    dm = TemporalGraphDataModule(dataset="primary_school", classes_per_task=2)
    dm.setup()
    s, g = dm.stream.samplers[0], dm.stream.graph
    ex = dm.stream.examples[0]["train"]
    q = ex.subset(torch.arange(min(n_query, len(ex))))
    k = 10
    sub = q.subset(torch.arange(n_naive))
    sel = torch.maximum(torch.where(g.y >= 0, g.y // 2, -1)[g.src], torch.where(g.y >= 0, g.y // 2, -1)[g.dst]) == 0
    src, dst, tt = g.src[sel], g.dst[sel], g.t[sel]
    n_fast = calibrate(lambda: s.sample(q.node, q.t, k))
    t = interleave(
        {
            "fast": lambda: seconds(lambda: s.sample(q.node, q.t, k), n_fast) / len(q),
            "naive": lambda: (
                seconds(lambda: naive_temporal_neighbors(g.num_nodes, src, dst, tt, sub.node, sub.t, k)) / len(sub)
            ),
        },
        rounds,
        warmup=True,
    )  # seconds per query
    print(header(rounds))
    qps = log_interval([1 / v for v in t["fast"]])
    print(f"sampler (k={k}): {describe(qps, ' queries/s', goal=GOAL_QPS, better='higher')}")
    speed = describe(ratio_interval(t["naive"], t["fast"]))
    print(f"  vs naive twin ({1 / statistics.median(t['naive']):,.1f} queries/s): {speed}")

    torch.manual_seed(0)
    enc = TGAT(g.x.shape[1], 64, 32, 1, 2, k)
    head = torch.nn.Linear(64, 2)
    opt = torch.optim.Adam([*enc.parameters(), *head.parameters()], 1e-3)
    b = ex.subset(torch.arange(bsz))

    def step():
        loss = torch.nn.functional.cross_entropy(head(enc(g.x, s, b.node, b.t)), b.y % 2)
        opt.zero_grad()
        loss.backward()
        opt.step()

    n_sample = calibrate(lambda: s.sample(b.node, b.t, k))
    t = interleave(
        {"step": lambda: seconds(step, 5), "sample": lambda: seconds(lambda: s.sample(b.node, b.t, k), n_sample)},
        rounds,
        warmup=True,
    )
    share = ratio_interval(t["sample"], t["step"])
    print(
        f"TGAT training: {bsz / statistics.median(t['step']):,.0f} events/s (batch {bsz}); sampling's share of a step "
        f"{describe(share, '%')}"
    )

    torch.manual_seed(0)
    tgn = TGN(g.x.shape[1], 64, 32, 1, 2, k)
    head_n = torch.nn.Linear(64, 2)
    opt_n = torch.optim.Adam([*tgn.parameters(), *head_n.parameters()], 1e-3)
    chrono = ex.subset(torch.argsort(ex.t, stable=True))
    n_steps = min(max_tgn, len(chrono) // bsz)

    def tgn_epoch():
        tgn.reset_memory()
        for i in range(n_steps):
            c = chrono.subset(torch.arange(bsz * i, bsz * (i + 1)))
            loss = torch.nn.functional.cross_entropy(head_n(tgn(g.x, s, c.node, c.t)), c.y % 2)
            opt_n.zero_grad()
            loss.backward()
            opt_n.step()

    n_events = s.events[0].numel()

    def memory_pass():
        tgn.reset_memory()
        with torch.no_grad():
            tgn._history(s, -(-n_events // tgn.memory_batch))

    t = interleave({"tgn": lambda: seconds(tgn_epoch) / n_steps, "memory": lambda: seconds(memory_pass)}, rounds)
    print(
        f"TGN training: {bsz / statistics.median(t['tgn']):,.0f} queries/s (batch {bsz}, time-ordered, {n_steps} "
        f"steps); memory stepping {n_events / statistics.median(t['memory']):,.0f} events/s ({n_events:,} events in "
        f"chunks of {tgn.memory_batch}) (medians over the rounds)"
    )

    with torch.no_grad():
        _, X = enc.subtree(g.x, s, b.node, b.t)
        m = dm.stream.examples[1]["train"].subset(torch.arange(bsz))
        _, Y = enc.subtree(g.x, dm.stream.samplers[1], m.node, m.t)

    def wl():
        lx = temporal_wl_labels(s, b.node, b.t, 3, 1, 60.0, 4)
        ly = temporal_wl_labels(dm.stream.samplers[1], m.node, m.t, 3, 1, 60.0, 4)
        return wl_kernel_mmd(X, Y, lx, ly)

    calls = {
        "lin": lambda: linear_time_mmd(X, Y),
        "mk": lambda: multi_kernel_mmd(X, Y),
        "wl": wl,
        "relabel": lambda: temporal_wl_labels(s, b.node, b.t, 3, 1, 60.0, 4),
    }
    inner = {key: calibrate(fn) for key, fn in calls.items()}
    t = interleave({key: lambda key=key: seconds(calls[key], inner[key]) for key in calls}, rounds, warmup=True)
    med = {key: 1e3 * statistics.median(v) for key, v in t.items()}
    shape = f"[{bsz}, {X.shape[1]}, {X.shape[2]}]"
    print(f"discrepancy per batch of {bsz} subtrees {shape} (medians): linear-time MMD {med['lin']:.2f} ms;")
    print(f"  multi-kernel MMD {med['mk']:.2f} ms: {describe(ratio_interval(t['mk'], t['lin']))} the linear-time one")
    print(
        f"  temporal-WL kernel MMD {med['wl']:.2f} ms: {describe(ratio_interval(t['wl'], t['lin']))} the linear-time "
        f"one (of which WL relabelling of one side {med['relabel']:.2f} ms)"
    )


if __name__ == "__main__":
    main()
