"""CLIP text towers for TULIP (Najdenkoska et al., ICLR 2025): the original absolute-position tower and the RoPE
student, both built from open_clip's modules so that an OpenAI/OpenCLIP state dict loads with its own key names.

* :class:`AbsoluteTextTower`: CLIP's text transformer, ``x_0 = E[tokens] + P[:T]`` with learned absolute positions
  ``P`` of context ``L``; optional Long-CLIP stretching of ``P`` (:func:`stretch_positions`), with the kept rows
  frozen as Long-CLIP trains them.
* :class:`RoPETextTower`: the TULIP student (Sec. 3.2): no ``P``; every layer rotates ``q`` and ``k`` with RoPE
  (Eq. 1-2, interleaved pairs), causal mask of the actual length, EOT pooling, final LayerNorm and projection.
  :meth:`RoPETextTower.expand` switches to an extended context with NTK-aware base scaling (Sec. 3.3).

Both take token ids ``[B, T]`` (``T <= context_length``) and return text features ``[B, E]`` (not normalised).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from open_clip.transformer import Transformer
from torch import nn

from core.errors import check
from ops.rope import ntk_theta, rope_angles
from ops.rope.interleaved import apply_rope, rope_cos_sin


def causal_mask(length: int, device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive causal mask ``[T, T]`` (0 on and below the diagonal, ``-inf`` above), built for the actual length."""
    return torch.full((length, length), float("-inf"), device=device, dtype=dtype).triu(1)


def eot_pool(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Features at the end-of-text token, the largest id of each row (CLIP's ``argmax`` pooling): ``[B, W]``."""
    return x[torch.arange(x.shape[0], device=x.device), tokens.argmax(dim=-1)]


def project(x: torch.Tensor, projection: nn.Parameter | nn.Module | None) -> torch.Tensor:
    """CLIP's text projection, a ``[W, E]`` matrix (OpenAI) or an ``nn.Linear`` (some OpenCLIP configs)."""
    if projection is None:
        return x
    return projection(x) if isinstance(projection, nn.Module) else x @ projection


def stretch_positions(pos: torch.Tensor, keep: int = 20, factor: int = 4) -> torch.Tensor:
    """Long-CLIP knowledge-preserved stretching (Zhang et al., 2024): keep the first ``keep`` rows of the absolute
    position table, linearly interpolate the remaining ``L - keep`` rows ``factor`` times (the last interval is
    extrapolated with the last difference, as Long-CLIP does).

    Args:
        pos: ``[L, W]`` learned positions.
        keep: Rows kept as they are (20 for CLIP's 77).
        factor: Interpolation factor (4 for 77 -> 248).

    Returns:
        ``[keep + (L - keep) * factor, W]``.
    """
    length = pos.shape[0]
    check(0 <= keep < length - 1, f"Long-CLIP keep={keep} must be in [0, {length - 2}] for a context of {length}")
    check(factor >= 1, f"Long-CLIP factor={factor} must be >= 1")
    tail = pos[keep:]  # [L - keep, W]
    step = torch.cat([tail[1:] - tail[:-1], (tail[-1] - tail[-2])[None]], 0)  # [L - keep, W]
    frac = torch.arange(factor, dtype=pos.dtype, device=pos.device) / factor  # [factor]
    stretched = tail[:, None, :] + frac[None, :, None] * step[:, None, :]  # [L - keep, factor, W]
    return torch.cat([pos[:keep], stretched.reshape(-1, pos.shape[1])], 0)


class AbsoluteTextTower(nn.Module):
    """CLIP's text transformer with learned absolute positions (the teacher, and the CLIP / Long-CLIP baselines).

    The attribute names are open_clip's ``CLIP`` text attributes, so a ``CLIP`` state dict's text keys load as they
    are. :meth:`from_open_clip` shares (not copies) the modules of an open_clip ``CLIP``.

    Args:
        vocab_size: Token vocabulary (49408 for CLIP's BPE).
        context_length: ``L``, rows of the absolute position table.
        width: Transformer width ``W``.
        heads: Attention heads.
        layers: Transformer blocks.
        embed_dim: Joint embedding size ``E``.
        mlp_ratio: MLP hidden size over ``W``.
    """

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        width: int,
        heads: int,
        layers: int,
        embed_dim: int,
        mlp_ratio: float = 4.0,
    ) -> None:
        super().__init__()
        self.context_length = context_length
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.positional_embedding = nn.Parameter(torch.randn(context_length, width) * 0.01)
        self.transformer = Transformer(width, layers, heads, mlp_ratio)
        self.ln_final = nn.LayerNorm(width)
        self.text_projection: nn.Parameter | nn.Module | None = nn.Parameter(
            torch.randn(width, embed_dim) * width**-0.5
        )
        nn.init.normal_(self.token_embedding.weight, std=0.02)

    @classmethod
    def from_open_clip(cls, clip: nn.Module) -> AbsoluteTextTower:
        """The text tower of an open_clip ``CLIP`` (modules shared)."""
        tower = cls.__new__(cls)
        nn.Module.__init__(tower)
        tower.context_length = int(clip.positional_embedding.shape[0])
        for name in ("token_embedding", "positional_embedding", "transformer", "ln_final", "text_projection"):
            setattr(tower, name, getattr(clip, name))
        return tower

    def stretch(self, keep: int = 20, factor: int = 4, freeze_kept: bool = False) -> None:
        """Replace the position table by its Long-CLIP stretch (context ``keep + (L - keep) * factor``).

        ``freeze_kept``: the first ``keep`` rows are read from a buffer (``kept_positions``), so training leaves them
        as they are; Long-CLIP's ``positional_embedding`` (``requires_grad=False``) under ``mask1`` (rows < 20) plus
        the trainable ``positional_embedding_res`` under ``mask2`` (the rest). :meth:`set_positions` refills both.
        """
        new = stretch_positions(self.positional_embedding.detach(), keep, factor)
        self.positional_embedding = nn.Parameter(new.clone())
        self.context_length = int(new.shape[0])
        if freeze_kept:
            self.register_buffer("kept_positions", new[:keep].clone())

    def set_positions(self, pos: torch.Tensor) -> None:
        """Copy ``pos`` ``[context_length, W]`` into the position table (and the frozen kept rows, if any)."""
        with torch.no_grad():
            self.positional_embedding.copy_(pos)
            kept = getattr(self, "kept_positions", None)
            if kept is not None:
                kept.copy_(pos[: kept.shape[0]])

    def positions(self, length: int) -> torch.Tensor:
        """The position rows ``[length, W]`` added to the first ``length`` tokens (the frozen kept rows first)."""
        pos = self.positional_embedding[:length]
        kept = getattr(self, "kept_positions", None)
        if kept is None:
            return pos
        return torch.cat([kept[:length].to(pos.dtype), pos[kept.shape[0] :]], 0)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Text features ``[B, E]`` of token ids ``[B, T]``, ``T <= context_length``."""
        length = tokens.shape[1]
        check(
            length <= self.context_length, f"text of {length} tokens exceeds the tower's context {self.context_length}"
        )
        x = self.token_embedding(tokens) + self.positions(length)
        x = self.transformer(x, attn_mask=causal_mask(length, x.device, x.dtype))
        return project(eot_pool(self.ln_final(x), tokens), self.text_projection)


class RoPETextTower(nn.Module):
    """TULIP's student text tower (Sec. 3.2): CLIP's blocks without absolute positions, RoPE on ``q``/``k``.

    Each block computes ``x = x + ls1(MHA_rope(ln1(x)))``, ``x = x + ls2(MLP(ln2(x)))`` with the block's own
    ``nn.MultiheadAttention`` weights (``in_proj_weight`` ``[3W, W]``, ``out_proj``); queries and keys of head size
    ``d`` are rotated by ``m * theta^(-2i/d)`` (Eq. 2) before ``softmax(q k^T / sqrt(d) + causal)``.

    Args:
        vocab_size: Token vocabulary.
        context_length: Longest input (distillation context ``L``, then the expanded one).
        width: ``W``.
        heads: Attention heads (``d = W / heads``, even).
        layers: Blocks.
        embed_dim: ``E``.
        mlp_ratio: MLP hidden size over ``W``.
        theta: RoPE base (10000).
        attention: ``sdpa`` (``scaled_dot_product_attention``, causal) or ``naive`` (explicit softmax, the parity
            reference).
    """

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        width: int,
        heads: int,
        layers: int,
        embed_dim: int,
        mlp_ratio: float = 4.0,
        theta: float = 10000.0,
        attention: str = "sdpa",
    ) -> None:
        super().__init__()
        check(width % heads == 0, f"text width={width} must divide by heads={heads}")
        check((width // heads) % 2 == 0, f"RoPE head size {width // heads} (width/heads) must be even")
        check(attention in ("sdpa", "naive"), f"attention={attention!r} must be 'sdpa' or 'naive'")
        self.heads, self.attention, self.context_length, self.theta = heads, attention, context_length, float(theta)
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.transformer = Transformer(width, layers, heads, mlp_ratio)
        self.ln_final = nn.LayerNorm(width)
        self.text_projection: nn.Parameter | nn.Module | None = nn.Parameter(
            torch.randn(width, embed_dim) * width**-0.5
        )
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        self.register_buffer("angles", rope_angles(context_length, self.head_dim, theta), persistent=False)

    @property
    def head_dim(self) -> int:
        return self.transformer.width // self.heads

    @classmethod
    def from_teacher(
        cls, teacher: AbsoluteTextTower, heads: int, theta: float = 10000.0, attention: str = "sdpa"
    ) -> RoPETextTower:
        """A student initialised from the teacher (Sec. 3.2; official ``load_state_dict(strict=False)``): copies of
        the blocks, token embedding, final LayerNorm and projection; the absolute positions are dropped."""
        student = cls.__new__(cls)
        nn.Module.__init__(student)
        student.heads, student.attention, student.theta = heads, attention, float(theta)
        student.context_length = teacher.context_length
        for name in ("token_embedding", "transformer", "ln_final", "text_projection"):
            setattr(student, name, copy.deepcopy(getattr(teacher, name)))
        check(student.head_dim % 2 == 0, f"RoPE head size {student.head_dim} must be even")
        student.register_buffer(
            "angles", rope_angles(student.context_length, student.head_dim, theta), persistent=False
        )
        return student

    def set_rope(self, context_length: int, theta: float) -> None:
        """Use ``theta`` as RoPE base for inputs up to ``context_length`` tokens."""
        self.context_length, self.theta = int(context_length), float(theta)
        self.angles = rope_angles(self.context_length, self.head_dim, theta).to(self.angles.device)

    def expand(
        self,
        context_length: int,
        old_length: int,
        scaling_factor: float | None = 8.0,
        ntk_lengths: tuple[int, int] | list[int] | None = None,
    ) -> float:
        """Relative-position expansion (Sec. 3.3): NTK-aware base ``theta'`` (:func:`ops.rope.ntk_theta`) for the
        extended context; ``scaling_factor=None`` keeps ``theta`` (the no-NTK ablation). ``ntk_lengths=(new, old)``
        overrides the lengths in the NTK ratio (the official defaults are ``(231, 248)``); by default they are
        ``(context_length, old_length)``. Returns the new base."""
        new, old = ntk_lengths if ntk_lengths is not None else (context_length, old_length)
        theta = (
            self.theta
            if scaling_factor is None
            else ntk_theta(self.theta, scaling_factor, int(new), int(old), self.head_dim)
        )
        self.set_rope(context_length, theta)
        return theta

    def _attend(self, block: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attn = block.attn
        qkv = F.linear(x, attn.in_proj_weight, attn.in_proj_bias)  # [B, T, 3W]
        q, k, v = qkv.unflatten(-1, (3, self.heads, self.head_dim)).permute(2, 0, 3, 1, 4)  # 3 x [B, H, T, d]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.attention == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
            out = (scores + causal_mask(x.shape[1], x.device, scores.dtype)).softmax(-1) @ v
        return attn.out_proj(out.transpose(1, 2).flatten(2))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Text features ``[B, E]`` of token ids ``[B, T]``, ``T <= context_length``."""
        length = tokens.shape[1]
        check(
            length <= self.context_length, f"text of {length} tokens exceeds the tower's context {self.context_length}"
        )
        x = self.token_embedding(tokens)
        cos, sin = rope_cos_sin(self.angles[:length], x.dtype)
        for block in self.transformer.resblocks:
            x = x + block.ls_1(self._attend(block, block.ln_1(x), cos, sin))
            x = x + block.ls_2(block.mlp(block.ln_2(x)))
        return project(eot_pool(self.ln_final(x), tokens), self.text_projection)
