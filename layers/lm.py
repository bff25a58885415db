"""Decoder-only causal LM whose token mixer is chosen by config (Gated DeltaNet / stick-breaking / softmax / hybrids).

Block (Llama / Transformer++ layout used by both papers)::

    h = x + mixer(RMSNorm(x));   y = h + SwiGLU(RMSNorm(h))

A mixer spec is one of

* ``{"kind": "gated_deltanet" | "softmax" | "stickbreaking", **kwargs}`` (short names for the classes in
  :mod:`layers.attention`);
* ``{"_target_": "package.module.Class", **kwargs}`` (any ``nn.Module`` taking ``d_model=``; with Hydra, add
  ``_partial_: true`` so it arrives as a partial);
* a callable ``f(d_model=...) -> nn.Module``.

``mixer`` may also be a list of specs, cycled over the layers: ``[gdn, swa]`` is Gated DeltaNet-H1 (GDN and
sliding-window attention alternate), ``[mamba2, gdn, swa]`` is H2. Blocks expose ``norm1 / mixer / norm2 / mlp``
and :meth:`CausalLM.forward` can return every block's output, so activation statistics (an outlier census) can hook
into named submodules.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from core.errors import ConfigError
from layers.attention.common import SwiGLU, check_positive

MIXER_KINDS = {
    "gated_deltanet": "layers.attention.gated_deltanet.GatedDeltaNet",
    "softmax": "layers.attention.softmax.SoftmaxAttention",
    "stickbreaking": "layers.attention.stickbreaking.StickBreakingAttention",
}
POS_EMBEDDINGS = ("none", "learned")


def _resolve(path: str) -> Callable[..., nn.Module]:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        raise ConfigError(f"mixer _target_={path!r} is not an importable class") from None


def build_mixer(spec: Any, d_model: int) -> nn.Module:
    """Instantiate one mixer spec (see module docstring) for width ``d_model``."""
    if callable(spec) and not isinstance(spec, Mapping):
        return spec(d_model=d_model)
    if not isinstance(spec, Mapping):
        raise ConfigError(f"mixer spec must be a dict with 'kind' or '_target_', or a callable; got {spec!r}")
    kwargs = {str(k): v for k, v in spec.items() if k not in ("kind", "_target_", "_partial_")}
    if "_target_" in spec:
        cls = _resolve(str(spec["_target_"]))
    elif spec.get("kind") in MIXER_KINDS:
        cls = _resolve(MIXER_KINDS[spec["kind"]])
    else:
        raise ConfigError(f"mixer.kind={spec.get('kind')!r} must be one of {sorted(MIXER_KINDS)} (or give _target_)")
    try:
        return cls(d_model=d_model, **kwargs)
    except TypeError as err:
        raise ConfigError(f"mixer {spec.get('kind') or spec.get('_target_')}: {err}") from None


class Block(nn.Module):
    """Pre-norm residual block: mixer then SwiGLU MLP.

    Args:
        d_model: Width.
        mixer: Token mixer module.
        mlp_hidden: SwiGLU inner width.
        norm_eps: RMSNorm epsilon.
    """

    def __init__(self, d_model: int, mixer: nn.Module, mlp_hidden: int, norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(d_model, eps=norm_eps)
        self.mixer = mixer
        self.norm2 = nn.RMSNorm(d_model, eps=norm_eps)
        self.mlp = SwiGLU(d_model, mlp_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, d_model] -> [B, T, d_model]``."""
        x = x + self.mixer(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CausalLM(nn.Module):
    """Token embedding, ``n_layers`` blocks, final RMSNorm and (tied) LM head.

    Args:
        vocab_size: Vocabulary size ``V``.
        d_model: Width.
        n_layers: Number of blocks.
        mixer: A mixer spec or a list of specs cycled over layers (hybrids).
        mlp_ratio: SwiGLU inner width is ``round(mlp_ratio * d_model)``.
        pos_embedding: ``none`` (positions come from the mixer: RoPE, recurrence, stick-breaking) or ``learned``
            (an absolute table of ``max_len`` rows).
        max_len: Rows of the learned position table (required with ``learned``).
        tie_embeddings: Share the embedding and output matrices.
        norm_eps: RMSNorm epsilon.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 128,
        n_layers: int = 2,
        mixer: Any = None,
        mlp_ratio: float = 2.0,
        pos_embedding: str = "none",
        max_len: int | None = None,
        tie_embeddings: bool = True,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        check_positive("net.vocab_size", vocab_size)
        check_positive("net.d_model", d_model)
        check_positive("net.n_layers", n_layers)
        if pos_embedding not in POS_EMBEDDINGS:
            raise ConfigError(f"net.pos_embedding={pos_embedding!r} must be one of {list(POS_EMBEDDINGS)}")
        if pos_embedding == "learned":
            check_positive("net.max_len (needed by pos_embedding=learned)", max_len)
        specs = list(mixer) if isinstance(mixer, Sequence) and not isinstance(mixer, (str, Mapping)) else [mixer]
        if not specs or any(s is None for s in specs):
            raise ConfigError("net.mixer must be given (a spec or a non-empty list of specs)")
        self.vocab_size, self.max_len = vocab_size, max_len
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model) if pos_embedding == "learned" else None
        hidden = max(1, round(mlp_ratio * d_model))
        self.blocks = nn.ModuleList(
            [Block(d_model, build_mixer(specs[i % len(specs)], d_model), hidden, norm_eps) for i in range(n_layers)]
        )
        self.norm = nn.RMSNorm(d_model, eps=norm_eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, return_hidden: bool = False) -> Any:
        """``input_ids [B, T] -> logits [B, T, V]`` (and the ``n_layers + 1`` hidden states ``[B, T, d]``)."""
        t = input_ids.shape[1]
        if self.pos is not None and t > self.max_len:
            raise ValueError(f"sequence length {t} exceeds the learned position table (max_len={self.max_len})")
        x = self.embed(input_ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(t, device=input_ids.device))
        hidden = [x]
        for block in self.blocks:
            x = block(x)
            hidden.append(x)
        logits = self.lm_head(self.norm(x))
        return (logits, hidden) if return_hidden else logits
