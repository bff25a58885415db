"""Stick-breaking attention forward+backward: blockwise vs naive O(T^2), peak memory and time side by side.

Each path runs in its own fresh subprocess. Peak memory on CPU is the growth of the process's peak resident set
(``ru_maxrss``) over one fwd+bwd call, after a small warm-up call (one-time library buffers) and with glibc told to
serve every allocation over 64 KiB by ``mmap`` (``MALLOC_MMAP_THRESHOLD_``), so freed tensors leave the resident set
at once and the high-water mark is that of live tensors; on CUDA it is ``torch.cuda.max_memory_allocated``. A second,
allocator-free number is the size of the tensors autograd saves for backward (``saved_tensors_hooks``).
Run: ``python -m benchmarks.stickbreaking [--T 4096 --B 1 --H 4 --D 64 --block 128]`` (goal: memory <= 1/8, time <= 1x).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

from ops.stickbreaking import blockwise_stickbreaking, naive_stickbreaking


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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--T", type=int, default=4096)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--rows", type=int, default=256, help="query rows per tile of the blockwise op")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--only", choices=["naive", "blockwise"], default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.only:
        print(json.dumps(measure(a)))
        return
    rows = {}
    for name in ("naive", "blockwise"):
        args = [f"--B={a.B}", f"--H={a.H}", f"--T={a.T}", f"--D={a.D}", f"--block={a.block}", f"--rows={a.rows}"]
        args += [f"--device={a.device}", f"--threads={a.threads}"]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.stickbreaking", *args, f"--only={name}"],
            capture_output=True, text=True, check=True, env=env,
        )  # fmt: skip
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"stick-breaking fwd+bwd  B={a.B} H={a.H} T={a.T} D={a.D} block={a.block} rows={a.rows} device={a.device} "
        f"threads={a.threads}"
    )
    print(f"{'path':<11}{'time [ms]':>11}{'peak [MiB]':>12}{'saved [MiB]':>13}")
    for name, r in rows.items():
        print(f"{name:<11}{r['time'] * 1e3:>11.0f}{r['peak'] / 2**20:>12.1f}{r['saved'] / 2**20:>13.1f}")
    n, b = rows["naive"], rows["blockwise"]
    mem, tim, sav = b["peak"] / n["peak"], b["time"] / n["time"], b["saved"] / n["saved"]
    print(f"blockwise/naive: peak memory {mem:.3f} (goal <= 0.125), time {tim:.2f}x (goal <= 1x), saved {sav:.4f}")


if __name__ == "__main__":
    main()
