"""TULIP text towers side by side in one run: forward + backward throughput (tokens/s) and activation memory at
77 / 248 / 512 tokens, RoPE student (SDPA, causal) vs CLIP's absolute-position tower (open_clip blocks).

Goal: RoPE within 1.15x of absolute at equal length; memory linear in length apart from attention. Memory is the
peak allocated on CUDA, and on CPU the bytes of the tensors autograd saves for backward (activation memory),
per sequence. Timings are noisy on a shared machine: read the ratios.

Run: ``python benchmarks/tulip_text_encoder.py [--layers 12 --batch 16]`` (defaults: ViT-B/16's text width 512 and
8 heads; 2 layers and batch 4 on CPU so that it finishes in a few minutes on one thread).
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from layers.vision_language import AbsoluteTextTower, RoPETextTower


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


def measure(tower: torch.nn.Module, tokens: torch.Tensor, repeat: int) -> tuple[float, float]:
    """(seconds per fwd+bwd, memory bytes per sequence)."""
    dev = tokens.device

    def step():
        tower.zero_grad(set_to_none=True)
        tower(tokens).float().square().sum().backward()

    step()  # warm-up
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if dev.type == "cuda":
        mem = torch.cuda.max_memory_allocated() - base
    else:
        params = {p.untyped_storage().data_ptr() for p in tower.parameters()}
        mem = saved_bytes(lambda: tower(tokens).float().square(), params)
    return min(times), mem / tokens.shape[0]


def main() -> None:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=12 if cuda else 2)
    parser.add_argument("--batch", type=int, default=32 if cuda else 4)
    parser.add_argument("--repeat", type=int, default=5 if cuda else 2)
    parser.add_argument("--lengths", type=int, nargs="+", default=[77, 248, 512])
    args = parser.parse_args()
    torch.set_num_threads(1) if not cuda else None
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    print(f"device {dev}, {dtype}, width {args.width}, {args.heads} heads, {args.layers} layers, batch {args.batch}")
    print(f"{'tokens':>6} | {'abs tok/s':>10} {'rope tok/s':>10} {'rope/abs time':>13} | "
          f"{'abs MiB/seq':>11} {'rope MiB/seq':>12}")  # fmt: skip
    rows = []
    for length in args.lengths:
        torch.manual_seed(0)
        absolute = AbsoluteTextTower(49408, length, args.width, args.heads, args.layers, 512).to(dev, dtype)
        rope = RoPETextTower.from_teacher(absolute, heads=args.heads).to(dev, dtype)
        rope.set_rope(length, 10000.0)
        tokens = torch.randint(1, 49000, (args.batch, length), device=dev)
        tokens[:, -1] = 49407
        t_abs, m_abs = measure(absolute, tokens, args.repeat)
        t_rope, m_rope = measure(rope, tokens, args.repeat)
        n = args.batch * length
        rows.append((length, t_rope / t_abs, m_abs, m_rope))
        print(f"{length:>6} | {n / t_abs:>10,.0f} {n / t_rope:>10,.0f} {t_rope / t_abs:>13.2f} | "
              f"{m_abs / 2**20:>11.1f} {m_rope / 2**20:>12.1f}")  # fmt: skip
    worst = max(r[1] for r in rows)
    print(f"goal RoPE within 1.15x of absolute: {'met' if worst <= 1.15 else 'NOT met'} (worst {worst:.2f}x)")
    (l0, _, _, m0), (l1, _, _, m1) = rows[0], rows[-1]
    print(f"RoPE memory per token {m0 / l0 / 1024:.1f} KiB at {l0} vs {m1 / l1 / 1024:.1f} KiB at {l1} "
          "(constant = linear in length; SDPA keeps no T x T matrix on CUDA)")  # fmt: skip


if __name__ == "__main__":
    main()
