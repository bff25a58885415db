"""GRASS throughput, side by side in one run: encodings + rewiring (graphs/s) and training-step time vs GINE.

1. RRWP + random regular rewiring per graph (the PyG ``BaseTransform``s, as in a data pipeline) vs the batched
   fast paths the model uses (one dense ``bmm`` chain and one sort per batch), in graphs per second.
2. Training-step time (forward + backward + Lion step) of GRASS and of GINE at the same parameter budget.

Graphs are the embedded MOSES molecules (ZINC vocabularies). Ratios matter, not absolute numbers: the arms of each
part alternate over ``--rounds`` interleaved rounds after a warm-up, and each ratio is printed with its 95% interval
over the rounds (``benchmarks/_timing.py``).

    python benchmarks/grass_throughput.py [--graphs 512] [--batch 128] [--steps 5] [--layers 8] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from lion_pytorch import Lion
from torch_geometric.data import Batch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import add_args, describe, header, interleave, ratio_interval, rounds_of, seconds  # noqa: E402
from datamodules.molecules import MoleculesDataModule  # noqa: E402
from layers.graph.grass import GrassNet  # noqa: E402
from layers.graph.grass_baselines import count_parameters  # noqa: E402
from layers.graph.grass_encodings import (  # noqa: E402
    AddRandomRegularEdges,
    AddRRWP,
    batched_random_regular_edges,
    batched_rrwp,
    pair_encoding,
)
from lightning_modules.grass import GrassLitModule  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=512)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5, help="training steps timed per round")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rrwp-steps", type=int, default=16)
    add_args(ap)
    args = ap.parse_args()
    rounds = rounds_of(ap, args)
    if args.quick:
        args.graphs, args.batch, args.steps, args.layers, args.rrwp_steps = 16, 8, 1, 2, 4
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        n = max(args.graphs, args.batch)
        dm = MoleculesDataModule(data_dir=tmp, num_molecules=n + 2, split_sizes=(n, 1, 1), cache=False)
        dm.setup()
        graphs = [dm.datasets["train"][i] for i in range(n)]
    rrwp_t, rewire_t = AddRRWP(args.rrwp_steps), AddRandomRegularEdges(6, 5, seed=0)

    def per_graph() -> None:
        for g in graphs:
            rewire_t(rrwp_t(g.clone()))

    batches = [Batch.from_data_list(graphs[i : i + args.batch]) for i in range(0, n, args.batch)]

    def batched() -> None:
        for b in batches:
            _, table, local = batched_rrwp(b.edge_index, b.batch, args.rrwp_steps)
            new = batched_random_regular_edges(b.batch, 6)
            pair_encoding(table, b.batch, local, torch.cat([b.edge_index, new], 1))

    t = interleave({"graph": lambda: seconds(per_graph), "batch": lambda: seconds(batched)}, rounds, warmup=True)
    print(f"RRWP (K={args.rrwp_steps}) + rewiring (k=6) on {n} molecules, {torch.get_num_threads()} thread(s)")
    print(header(rounds))
    print(f"  per-graph BaseTransforms : {n / statistics.median(t['graph']):10.0f} graphs/s (median round)")
    print(
        f"  batched fast path        : {n / statistics.median(t['batch']):10.0f} graphs/s   speed-up "
        f"{describe(ratio_interval(t['graph'], t['batch']))}"
    )

    batch = batches[0]
    print(f"Training step, batch {batch.num_graphs} graphs, {args.layers} layers (forward + backward + Lion step)")
    steps, params = {}, {}
    for arch in ("grass", "gine", "gps"):
        lit = GrassLitModule(GrassNet(num_layers=args.layers, encoding_steps=args.rrwp_steps), arch=arch)
        opt = Lion(lit.parameters(), lr=1e-4)

        def step(lit=lit, opt=opt) -> None:
            opt.zero_grad()
            torch.nn.functional.l1_loss(lit(batch), batch.y).backward()
            opt.step()

        steps[arch], params[arch] = step, count_parameters(lit.net)
    times = interleave({a: lambda f=f: seconds(f, args.steps) for a, f in steps.items()}, rounds, warmup=True)
    for arch, ts in times.items():
        print(f"  {arch:5s}: {statistics.median(ts) * 1e3:8.1f} ms/step (median round)  {params[arch]:7d} params")
    print(f"  GRASS / GINE step-time ratio: {describe(ratio_interval(times['grass'], times['gine']))}")


if __name__ == "__main__":
    main()
