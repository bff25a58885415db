"""Gated delta rule (Gated DeltaNet, ICLR 2025): recurrent reference, chunked WY/UT algorithm, fla dispatch on CUDA."""

from __future__ import annotations

import importlib.util

import torch

from ops.gated_delta_rule.chunk import _check_inputs, check_chunk_size, chunk_gated_delta_rule
from ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

BACKENDS = ("auto", "chunk", "recurrent", "fla")

__all__ = [
    "BACKENDS",
    "check_chunk_size",
    "chunk_gated_delta_rule",
    "fla_available",
    "gated_delta_rule",
    "naive_recurrent_gated_delta_rule",
]


def fla_available() -> bool:
    """Whether the optional ``flash-linear-attention`` extra is importable (checked without importing it)."""
    return importlib.util.find_spec("fla") is not None


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    use_delta: bool = True,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dispatch: fla's Triton ``chunk_gated_delta_rule`` on CUDA when installed (bf16/fp16 inputs, ``use_delta``), else
    the PyTorch chunked algorithm; ``backend="recurrent"`` forces the token-by-token reference.

    Shapes as in :func:`chunk_gated_delta_rule`: ``[B, T, H, D]`` (sequence-first, fla's ``head_first=False``), the
    gate ``g`` in log space, ``initial_state`` ``[B, H, K, V]``, default scale ``K ** -0.5``: the same contract as
    fla's ``chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state)`` (passed by keyword).
    fla's chunk kernel rejects float32 ``q`` (it asserts bf16/fp16), so ``auto`` keeps float32 on the exact PyTorch
    path and an explicit ``backend="fla"`` casts float32 ``q, k, v, g, beta`` to bfloat16 (output cast back).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} must be one of {list(BACKENDS)}")
    half = q.dtype in (torch.bfloat16, torch.float16)
    use_fla = backend == "fla" or (backend == "auto" and q.is_cuda and half and use_delta and fla_available())
    if use_fla:
        if not use_delta:
            raise ValueError("backend='fla' implements only the delta rule (use_delta=True)")
        if not fla_available():
            raise ValueError("backend='fla' needs the optional flash-linear-attention extra (pip install '.[gpu]')")
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk  # optional extra, CUDA only

        _check_inputs(q, k, v, beta, g, initial_state)
        dt = q.dtype if half else torch.bfloat16
        gate = g if g is not None else beta.new_zeros(beta.shape)
        o, ht = fla_chunk(
            q.to(dt),
            k.to(dt),
            v.to(dt),
            g=gate.to(dt),
            beta=beta.to(dt),
            scale=scale,
            initial_state=initial_state,
            output_final_state=output_final_state,
        )
        return o.to(v.dtype), ht
    if backend == "recurrent":
        return naive_recurrent_gated_delta_rule(
            q,
            k,
            v,
            beta,
            g,
            scale=scale,
            initial_state=initial_state,
            output_final_state=output_final_state,
            use_delta=use_delta,
        )
    return chunk_gated_delta_rule(
        q,
        k,
        v,
        beta,
        g,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        chunk_size=chunk_size,
        use_delta=use_delta,
    )
