"""N-ForGOT throughput on the embedded primary-school stream (one thread), side by side in one run:

* temporal neighbour sampling, vectorised sampler vs its naive twin (queries/s; goal: >= 50k/s, never the
  bottleneck of training);
* TGAT training (forward + backward + Adam) in events/s, with the share of the step spent sampling;
* TGN training on time-ordered batches (its memory advances over the events between batches) in events/s, and
  the memory stepping alone (events fed to the GRU memory per second);
* the discrepancy terms per batch: linear-time MMD vs multi-kernel MMD vs the temporal-WL kernel MMD (WL
  relabelling + product-kernel MMD), as ratios to the linear-time MMD.

Timings are noisy on a shared machine: read the ratios. Run: ``python benchmarks/nforgot_throughput.py``.
"""

from __future__ import annotations

import time

import torch

from datamodules.temporal_graph import TemporalGraphDataModule
from layers.temporal_graph.sampler import naive_temporal_neighbors
from layers.temporal_graph.tgat import TGAT
from layers.temporal_graph.tgn import TGN
from ops.nforgot.losses import linear_time_mmd, multi_kernel_mmd, wl_kernel_mmd
from ops.nforgot.wl import temporal_wl_labels


def best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    torch.set_num_threads(1)
    dm = TemporalGraphDataModule(dataset="primary_school", classes_per_task=2)
    dm.setup()
    s, g = dm.stream.samplers[0], dm.stream.graph
    ex = dm.stream.examples[0]["train"]
    q = ex.subset(torch.arange(min(20000, len(ex))))
    k = 10
    t_fast = best(lambda: s.sample(q.node, q.t, k))
    sub = q.subset(torch.arange(20))
    sel = torch.maximum(torch.where(g.y >= 0, g.y // 2, -1)[g.src], torch.where(g.y >= 0, g.y // 2, -1)[g.dst]) == 0
    src, dst, tt = g.src[sel], g.dst[sel], g.t[sel]
    t_naive = best(lambda: naive_temporal_neighbors(g.num_nodes, src, dst, tt, sub.node, sub.t, k), 1)
    fast_qps, naive_qps = len(q) / t_fast, len(sub) / t_naive
    print(
        f"sampler: {fast_qps:,.0f} queries/s (k={k}) vs naive {naive_qps:,.1f} queries/s: {fast_qps / naive_qps:,.0f}x"
    )
    print(f"  goal >= 50k queries/s: {'met' if fast_qps >= 50_000 else 'NOT met'}")

    torch.manual_seed(0)
    enc = TGAT(g.x.shape[1], 64, 32, 1, 2, k)
    head = torch.nn.Linear(64, 2)
    opt = torch.optim.Adam([*enc.parameters(), *head.parameters()], 1e-3)
    b = ex.subset(torch.arange(200))

    def step():
        loss = torch.nn.functional.cross_entropy(head(enc(g.x, s, b.node, b.t)), b.y % 2)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    t_step = best(lambda: [step() for _ in range(5)]) / 5
    t_samp = best(lambda: s.sample(b.node, b.t, k))
    print(
        f"TGAT training: {200 / t_step:,.0f} events/s (batch 200); sampling is {100 * t_samp / t_step:.1f}% of a step"
    )

    torch.manual_seed(0)
    tgn = TGN(g.x.shape[1], 64, 32, 1, 2, k)
    head_n = torch.nn.Linear(64, 2)
    opt_n = torch.optim.Adam([*tgn.parameters(), *head_n.parameters()], 1e-3)
    chrono = ex.subset(torch.argsort(ex.t, stable=True))
    n_steps = min(20, len(chrono) // 200)

    def tgn_epoch():
        tgn.reset_memory()
        for i in range(n_steps):
            c = chrono.subset(torch.arange(200 * i, 200 * (i + 1)))
            loss = torch.nn.functional.cross_entropy(head_n(tgn(g.x, s, c.node, c.t)), c.y % 2)
            opt_n.zero_grad()
            loss.backward()
            opt_n.step()

    t_tgn = best(tgn_epoch, 2) / n_steps
    n_events = s.events[0].numel()

    def memory_pass():
        tgn.reset_memory()
        with torch.no_grad():
            tgn._history(s, -(-n_events // tgn.memory_batch))

    t_mem = best(memory_pass, 2)
    print(f"TGN training: {200 / t_tgn:,.0f} queries/s (batch 200, time-ordered, {n_steps} steps); memory stepping "
          f"{n_events / t_mem:,.0f} events/s ({n_events:,} events in chunks of {tgn.memory_batch})")  # fmt: skip

    with torch.no_grad():
        _, X = enc.subtree(g.x, s, b.node, b.t)
        m = dm.stream.examples[1]["train"].subset(torch.arange(200))
        _, Y = enc.subtree(g.x, dm.stream.samplers[1], m.node, m.t)
    t_lin = best(lambda: linear_time_mmd(X, Y), 5)
    t_mk = best(lambda: multi_kernel_mmd(X, Y), 5)

    def wl():
        lx = temporal_wl_labels(s, b.node, b.t, 3, 1, 60.0, 4)
        ly = temporal_wl_labels(dm.stream.samplers[1], m.node, m.t, 3, 1, 60.0, 4)
        return wl_kernel_mmd(X, Y, lx, ly)

    t_wl = best(wl, 5)
    t_relabel = best(lambda: temporal_wl_labels(s, b.node, b.t, 3, 1, 60.0, 4), 5)
    shape = f"[200, {X.shape[1]}, {X.shape[2]}]"
    print(f"discrepancy per batch of 200 subtrees {shape}: linear-time MMD {1e3 * t_lin:.2f} ms;")
    print(f"  multi-kernel MMD {1e3 * t_mk:.2f} ms ({t_mk / t_lin:.1f}x); temporal-WL kernel MMD {1e3 * t_wl:.2f} ms "
          f"({t_wl / t_lin:.1f}x, of which WL relabelling of one side {1e3 * t_relabel:.2f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
