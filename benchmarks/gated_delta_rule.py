"""Gated delta rule forward+backward: chunked (WY/UT) vs token-by-token recurrence, side by side in one run.

Also reports the achieved GFLOP/s of the chunked path (:func:`chunk_flops`) as a fraction of a plain
``torch.matmul`` on the same machine (goal: >= 50% at the defaults, one thread).
Run: ``python benchmarks/gated_delta_rule.py [--B 2 --H 4 --T 4096 --D 64 --chunk 64] [--rounds 5] [--quick]``
(goal: >= 20x the recurrence). Single-threaded by default (``--threads``). After one warm-up call each, the paths are
timed in ``--rounds`` interleaved rounds (each path once per round): on a shared virtual machine the speed of the host
drifts by tens of percent over a minute, and interleaving makes both paths see the same drift. The speed-up is the
geometric mean of the per-round ratios with its 95% interval over the rounds (``benchmarks/_timing.py``). The
reference ``torch.matmul`` is timed once per round too, and the share of its rate is given the same way.
``--also-chunks`` adds other chunk sizes side by side; ``--fla`` adds
fla's Triton ``chunk_gated_delta_rule`` (CUDA, bf16: the float32 inputs are cast by the dispatcher) as one more
path. The token-by-token twin is time-bounded: it is first timed on ``T / 8`` tokens; if that predicts more than
``--max-recurrent-s`` for the timed full-``T`` calls (both paths are linear in ``T``), the full-length time is
extrapolated from the prefix and marked as such.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import (
    add_args,
    describe,
    header,
    interleave,
    log_interval,
    ratio_interval,
    round_order,
    rounds_of,
)  # noqa: E402
from ops.gated_delta_rule import (  # noqa: E402
    chunk_gated_delta_rule,
    fla_available,
    gated_delta_rule,
    naive_recurrent_gated_delta_rule,
)


def timed(fn, repeat: int) -> float:
    """Best of ``repeat`` timed calls after one warm-up (``repeat=0``: time the single call itself)."""
    if repeat == 0:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def chunk_flops(b: int, h: int, t: int, d: int, c: int) -> float:
    """Matmul flops of the chunked forward (x3 for forward+backward), counted as the dense products it runs.

    Per chunk: ``K K^T`` and ``Q K^T`` (``2 c^2 d`` each), the UT transform applied to ``K`` and ``V`` (``T [K, V]``,
    ``2 x 2 c^2 d``), ``attn V_new`` (``2 c^2 d``), and three state products ``W S``, ``Q S`` and ``K^T V_new``
    (``2 c d^2`` each); counting a fourth state product (``8 c d^2``) would overstate the rate by 12.5% at ``c = d``.
    """
    n = t / c
    per_chunk = 2 * c * c * d * 2 + 2 * c * c * d * 2 + 2 * c * c * d + 2 * c * d * d * 3
    return 3 * b * h * n * per_chunk


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--B", type=int, default=2)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--T", type=int, default=4096)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--chunk", type=int, default=64, help="chunk size of the headline ratio")
    p.add_argument("--also-chunks", default="32", help="comma-separated extra chunk sizes shown side by side")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--max-recurrent-s", type=float, default=600.0, help="time bound of the recurrent twin")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--fla", action="store_true", help="add fla's Triton kernel (needs CUDA and the [gpu] extra)")
    add_args(p)
    p.add_argument("--repeat", dest="rounds", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # alias
    a = p.parse_args()
    rounds = rounds_of(p, a)
    if a.quick:
        a.B, a.H, a.T, a.D, a.chunk, a.also_chunks = 1, 1, 256, 16, 32, ""
    if a.fla and (a.device != "cuda" or not torch.cuda.is_available() or not fla_available()):
        raise SystemExit("error: --fla needs a CUDA device and flash-linear-attention (pip install '.[gpu]')")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(a.B, a.T, a.H, a.D, generator=gen)
    k = F.normalize(torch.randn(a.B, a.T, a.H, a.D, generator=gen), dim=-1)
    v = torch.randn(a.B, a.T, a.H, a.D, generator=gen)
    beta = torch.rand(a.B, a.T, a.H, generator=gen)
    g = F.logsigmoid(torch.randn(a.B, a.T, a.H, generator=gen))
    leaves = [x.to(dev).requires_grad_(True) for x in (q, k, v, beta, g)]

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def run(fn, t=a.T, **kw):
        def go():
            o, _ = fn(*(x[:, :t] for x in leaves), **kw)
            o.sum().backward()
            sync()

        return go

    chunks = [a.chunk] + [int(c) for c in a.also_chunks.split(",") if c.strip() and int(c) != a.chunk]
    paths = {f"chunked C={c}": run(chunk_gated_delta_rule, chunk_size=c) for c in chunks}
    if a.fla:
        paths["fla bf16"] = run(gated_delta_rule, backend="fla")
    t_pre = max(1, a.T // 8)
    t_rec_pre = timed(run(naive_recurrent_gated_delta_rule, t=t_pre), 1)
    extrapolated = t_rec_pre * a.T / t_pre * (rounds + 1) > a.max_recurrent_s
    if not extrapolated:
        paths["recurrent"] = run(naive_recurrent_gated_delta_rule)
    # Interleaved rounds: every round times each path once, so a slow spell of the (shared, virtualised) machine hits
    # all paths of that round alike; the headline is the median over rounds of the per-round ratio.
    fla_fwd = None
    for name, go in list(paths.items()):
        try:
            go()  # warm-up
        except RuntimeError as err:
            if name != "fla bf16" or "#640" not in str(err):
                raise
            # fla 0.6 refuses its gated backward on Hopper with Triton 3.4-3.7.0 (a Triton miscompile, fla #640)
            print(
                f"fla bf16: backward refused on this GPU/Triton ({str(err).splitlines()[0][:120]}); "
                "timing fla's forward beside the chunked forward instead"
            )
            del paths[name]
            fla_fwd = {
                "fla bf16 fwd": lambda: (gated_delta_rule(*leaves[:4], g=leaves[4], backend="fla"), sync()),
                f"chunked C={a.chunk} fwd": lambda: (
                    chunk_gated_delta_rule(*leaves[:4], g=leaves[4], chunk_size=a.chunk),
                    sync(),
                ),
            }
    # The reference matmul is one more path of every round, so the rate ratio sees the same drift as the paths.
    n = (256 if a.quick else 2048) if dev.type == "cpu" else 8192
    x, y = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    timed(lambda: (x @ y, sync()), 1)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in paths}
    t_mms: list[float] = []
    arms = {**paths, "matmul": lambda: (x @ y, sync())}
    for r in range(rounds):
        for name in round_order(list(arms), r):
            (t_mms if name == "matmul" else times[name]).append(timed(arms[name], 0))
    if extrapolated:
        times["recurrent"] = [t_rec_pre * a.T / t_pre] * rounds
    rec = times["recurrent"]
    flops = chunk_flops(a.B, a.H, a.T, a.D, a.chunk)
    mm_gflops = 2 * n**3 / min(t_mms) / 1e9
    ck_times = times[f"chunked C={a.chunk}"]
    ck_gflops = flops / min(ck_times) / 1e9
    rate_ratios = [(flops / t_ck) / (2 * n**3 / t_mm) for t_ck, t_mm in zip(ck_times, t_mms)]
    print(f"gated delta rule fwd+bwd  B={a.B} H={a.H} T={a.T} D={a.D} C={a.chunk} device={dev} threads={a.threads}")
    print(f"{header(rounds)}; speed-up = recurrent / path")
    print(f"{'path':<14}{'best [ms]':>11}{'median [ms]':>13}   speed-up")
    note = f"   (extrapolated from T={t_pre}: one value for every round)" if extrapolated else ""
    print(f"{'recurrent':<14}{min(rec) * 1e3:>11.1f}{statistics.median(rec) * 1e3:>13.1f}{note}")
    for name in paths:
        if name == "recurrent":
            continue
        ts = times[name]
        goal = {"goal": 20.0, "better": "higher"} if name == f"chunked C={a.chunk}" else {}
        speed = describe(ratio_interval(rec, ts), **goal)
        print(f"{name:<14}{min(ts) * 1e3:>11.1f}{statistics.median(ts) * 1e3:>13.1f}   {speed}")
    print(
        f"chunked GFLOP/s {ck_gflops:.1f} (best C={a.chunk}) vs torch.matmul {n}^3 {mm_gflops:.1f} (best); share of "
        f"matmul's rate per round: {describe(log_interval(rate_ratios), '%', goal=0.5, better='higher')}"
    )
    if fla_fwd:
        with torch.no_grad():
            fwd = interleave({name: lambda go=go: timed(go, 1) for name, go in fla_fwd.items()}, rounds)
        (n_fla, t_fla), (n_ck, t_ck) = fwd.items()
        print(
            f"forward only: {n_fla} {statistics.median(t_fla) * 1e3:.2f} ms, {n_ck} "
            f"{statistics.median(t_ck) * 1e3:.2f} ms (medians): fla faster by "
            f"{describe(ratio_interval(t_ck, t_fla))}"
        )


if __name__ == "__main__":
    main()
