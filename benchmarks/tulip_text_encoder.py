"""TULIP text towers side by side in one run: forward + backward throughput (tokens/s) and activation memory at
77 / 248 / 512 tokens, RoPE student (SDPA, causal) vs CLIP's absolute-position tower (open_clip blocks).

Goal: RoPE within 1.15x of absolute at equal length; memory linear in length apart from attention. Memory is the
peak allocated on CUDA, and on CPU the bytes of the tensors autograd saves for backward (activation memory),
per sequence. The two towers alternate over ``--rounds`` interleaved rounds at each length (one fwd+bwd each per
round, after a warm-up); the time ratio is printed with its 95% interval over the rounds (``benchmarks/_timing.py``),
and the goal is met only when every length's interval is within it.

Run: ``python benchmarks/tulip_text_encoder.py [--layers 12 --batch 16] [--rounds 5] [--quick]`` (defaults: ViT-B/16's
text width 512 and 8 heads; 2 layers and batch 4 on CPU so that it finishes in a few minutes on one thread).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import (  # noqa: E402
    add_args,
    describe,
    goal_verdict,
    header,
    interleave,
    overall_verdict,
    ratio_interval,
    rounds_of,
    seconds,
)
from layers.vision_language import AbsoluteTextTower, RoPETextTower  # noqa: E402

GOAL = 1.15


def saved_bytes(fn, params: set[int]) -> int:
    """Bytes of the distinct non-parameter tensors autograd saves while ``fn`` runs its forward (activations)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        with contextlib.suppress(RuntimeError):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    out.sum().backward()
    return sum(seen.values())


def make_step(tower: torch.nn.Module, tokens: torch.Tensor):
    """One fwd+bwd of ``tower`` on ``tokens`` (synchronised on CUDA, so that the wall time covers it)."""

    def step() -> None:
        tower.zero_grad(set_to_none=True)
        tower(tokens).float().square().sum().backward()
        if tokens.device.type == "cuda":
            torch.cuda.synchronize()

    return step


def memory(tower: torch.nn.Module, tokens: torch.Tensor) -> float:
    """Activation bytes per sequence: the CUDA peak of one fwd+bwd, or on CPU the bytes autograd saves."""
    if tokens.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        make_step(tower, tokens)()
        mem = torch.cuda.max_memory_allocated() - base
    else:
        params = {p.untyped_storage().data_ptr() for p in tower.parameters()}
        mem = saved_bytes(lambda: tower(tokens).float().square(), params)
    return mem / tokens.shape[0]


def main() -> None:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=12 if cuda else 2)
    parser.add_argument("--batch", type=int, default=32 if cuda else 4)
    parser.add_argument("--lengths", type=int, nargs="+", default=[77, 248, 512])
    add_args(parser)
    args = parser.parse_args()
    rounds = rounds_of(parser, args)
    if args.quick:
        args.width, args.heads, args.layers, args.batch, args.lengths = 64, 2, 1, 2, [16, 32]
    torch.set_num_threads(1) if not cuda else None
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    print(f"device {dev}, {dtype}, width {args.width}, {args.heads} heads, {args.layers} layers, batch {args.batch}")
    print(header(rounds))
    print(f"{'tokens':>6} | {'abs tok/s':>10} {'rope tok/s':>10} | {'abs MiB/seq':>11} {'rope MiB/seq':>12} | rope/abs")
    mems, verdicts = [], []
    for length in args.lengths:
        torch.manual_seed(0)
        absolute = AbsoluteTextTower(49408, length, args.width, args.heads, args.layers, 512).to(dev, dtype)
        rope = RoPETextTower.from_teacher(absolute, heads=args.heads).to(dev, dtype)
        rope.set_rope(length, 10000.0)
        tokens = torch.randint(1, 49000, (args.batch, length), device=dev)
        tokens[:, -1] = 49407
        steps = {"abs": make_step(absolute, tokens), "rope": make_step(rope, tokens)}
        t = interleave({name: lambda fn=fn: seconds(fn) for name, fn in steps.items()}, rounds, warmup=True)
        m_abs, m_rope = memory(absolute, tokens), memory(rope, tokens)
        iv = ratio_interval(t["rope"], t["abs"])
        verdicts.append(goal_verdict(iv, GOAL, "lower"))
        mems.append((length, m_rope))
        n = args.batch * length
        print(
            f"{length:>6} | {n / statistics.median(t['abs']):>10,.0f} {n / statistics.median(t['rope']):>10,.0f} | "
            f"{m_abs / 2**20:>11.1f} {m_rope / 2**20:>12.1f} | {describe(iv, goal=GOAL)}"
        )
    print(f"goal RoPE within {GOAL}x of absolute at every length: {overall_verdict(verdicts)}")
    (l0, m0), (l1, m1) = mems[0], mems[-1]
    print(
        f"RoPE memory per token {m0 / l0 / 1024:.1f} KiB at {l0} vs {m1 / l1 / 1024:.1f} KiB at {l1} "
        "(constant = linear in length; SDPA keeps no T x T matrix on CUDA)"
    )


if __name__ == "__main__":
    main()
