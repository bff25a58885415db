"""Stick-breaking attention forward+backward: blockwise vs naive O(T^2), peak memory and time side by side.

Each path runs in its own fresh subprocess. Peak memory on CPU is the growth of the process's peak resident set
(``ru_maxrss``) over one fwd+bwd call, after a small warm-up call (one-time library buffers) and with glibc told to
serve every allocation over 64 KiB by ``mmap`` (``MALLOC_MMAP_THRESHOLD_``), so freed tensors leave the resident set
at once and the high-water mark is that of live tensors; on CUDA it is ``torch.cuda.max_memory_allocated``. A second,
allocator-free number is the size of the tensors autograd saves for backward (``saved_tensors_hooks``; exact, the
same every round). The two paths alternate over ``--rounds`` interleaved rounds (a fresh process each); the time and
peak-memory ratios are printed with their 95% intervals over the rounds (``benchmarks/_timing.py``).
Run: ``python benchmarks/stickbreaking.py [--T 4096 --B 1 --H 4 --D 64 --block 128] [--rounds 5] [--quick]``
(goal: memory <= 1/8, time <= 1x).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._timing import add_args, describe, header, interleave, ratio_interval, rounds_of  # noqa: E402
from ops.stickbreaking import blockwise_stickbreaking, naive_stickbreaking  # noqa: E402

GOAL_MEMORY, GOAL_TIME = 0.125, 1.0


def measure(a: argparse.Namespace) -> dict[str, float]:
    """Time and peak memory of one fwd+bwd of ``a.only`` (run inside the child process)."""
    dev = torch.device(a.device)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (0.25 * torch.randn(a.B, a.H, a.T, a.D, generator=gen) for _ in range(3))
    leaves = [x.to(dev).requires_grad_(True) for x in (q, k, v)]
    kw = {"block_size": a.block, "row_block": a.rows} if a.only == "blockwise" else {}
    fn = blockwise_stickbreaking if a.only == "blockwise" else naive_stickbreaking

    def run(x=leaves) -> None:
        o, rem = fn(*x, **kw)
        (o.sum() + rem.sum()).backward()
        if dev.type == "cuda":
            torch.cuda.synchronize()

    saved: list[int] = []

    def pack(x: torch.Tensor) -> torch.Tensor:
        saved.append(x.numel() * x.element_size())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        fn(*leaves, **kw)
    run([x[:, :, :64].detach().requires_grad_(True) for x in leaves])  # warm-up: kernels and library buffers
    if dev.type == "cuda":
        run()  # warm-up
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        run()
        dt = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() - base
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        t0 = time.perf_counter()
        run()
        dt = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"time": dt, "peak": float(peak), "saved": float(sum(saved))}


def run_child(a: argparse.Namespace, name: str) -> dict[str, float]:
    """One fwd+bwd of path ``name`` in a fresh process (see the module docstring for the allocator setting)."""
    args = [f"--B={a.B}", f"--H={a.H}", f"--T={a.T}", f"--D={a.D}", f"--block={a.block}", f"--rows={a.rows}"]
    args += [f"--device={a.device}", f"--threads={a.threads}"]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, __file__, *args, f"--only={name}"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    if out.returncode:
        raise SystemExit(f"error: the {name} path failed (exit {out.returncode}): {out.stderr.strip()[-400:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--T", type=int, default=4096)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--rows", type=int, default=256, help="query rows per tile of the blockwise op")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--only", choices=["naive", "blockwise"], default=None, help=argparse.SUPPRESS)
    add_args(p)
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.only:
        print(json.dumps(measure(a)))
        return
    rounds = rounds_of(p, a)
    if a.quick:
        a.H, a.T, a.D, a.block, a.rows = 1, 512, 16, 64, 64
    res = interleave({name: lambda name=name: run_child(a, name) for name in ("naive", "blockwise")}, rounds)
    print(
        f"stick-breaking fwd+bwd  B={a.B} H={a.H} T={a.T} D={a.D} block={a.block} rows={a.rows} device={a.device} "
        f"threads={a.threads}"
    )
    print(header(rounds))
    print(f"{'path':<11}{'median time [ms]':>18}{'median peak [MiB]':>19}{'saved [MiB]':>13}")
    for name, rs in res.items():
        t, peak = statistics.median(r["time"] for r in rs), statistics.median(r["peak"] for r in rs)
        print(f"{name:<11}{t * 1e3:>18.0f}{peak / 2**20:>19.1f}{rs[0]['saved'] / 2**20:>13.1f}")
    n, b = res["naive"], res["blockwise"]
    tim = ratio_interval([r["time"] for r in b], [r["time"] for r in n])
    print(f"blockwise/naive time: {describe(tim, goal=GOAL_TIME)}")
    peaks = [(rb["peak"], rn["peak"]) for rb, rn in zip(b, n)]
    if min(min(pair) for pair in peaks) > 0:
        mem = ratio_interval([pb for pb, _ in peaks], [pn for _, pn in peaks])
        print(f"blockwise/naive peak memory: {describe(mem, '', goal=GOAL_MEMORY)}")
    else:
        print("blockwise/naive peak memory: not measurable at this size (a path's peak did not grow in some round)")
    print(f"blockwise/naive saved for backward: {b[0]['saved'] / n[0]['saved']:.4f} (exact, the same every round)")


if __name__ == "__main__":
    main()
