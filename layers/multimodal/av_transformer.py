"""A small CAV-MAE-style audio-visual classifier (Gong et al. 2023, the source model of SuMi).

Audio (a spectrogram ``[B, T, F]``) and video (a frame ``[B, C, H, W]``) are cut into patches, embedded, given
learned position and modality embeddings, and run through ``depth_specific`` modality-specific transformer blocks
each. A fusion block (``depth_fused`` of them) then sees the concatenated tokens; mean pooling, a LayerNorm and a
linear head give the logits. As in CAV-MAE each fusion block holds three sets of LayerNorms: shared ones for the
multimodal pass and audio-/video-specific ones for the unimodal passes, and there are three final norms
(``norm``, ``norm_a``, ``norm_v``). Unimodal modes put zero tokens where the other modality's tokens would be.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import ConfigError

MODES = ("multimodal", "audioonly", "videoonly")


class FusionBlock(nn.Module):
    """Pre-norm transformer block with shared, audio and video LayerNorms (CAV-MAE ``Block``).

    Args:
        dim: Token width ``D``.
        heads: Attention heads (must divide ``dim``).
        mlp_ratio: Hidden width of the MLP over ``dim``.
        dropout: Dropout on attention output and MLP.
        modality_norms: Hold the audio/video LayerNorms (fusion blocks). The modality-specific blocks only use the
            shared ones (CAV-MAE gives them all three sets, unused; we leave the unused ones out).
    """

    def __init__(
        self, dim: int, heads: int, mlp_ratio: float = 2.0, dropout: float = 0.0, modality_norms: bool = True
    ) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        if modality_norms:
            self.norm1_a, self.norm1_v = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.norm2_a, self.norm2_v = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.drop = nn.Dropout(dropout)

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))

    def forward(self, x: torch.Tensor, modality: str | None = None) -> torch.Tensor:
        """``x``: ``[B, N, D]``; ``modality`` picks the LayerNorms (``None`` shared, ``a`` audio, ``v`` video)."""
        if modality is None:
            n1, n2 = self.norm1, self.norm2
        elif modality in ("a", "v"):
            n1, n2 = getattr(self, f"norm1_{modality}"), getattr(self, f"norm2_{modality}")
        else:
            raise ValueError(f"modality={modality!r} must be None, 'a' or 'v'")
        x = x + self.drop(self._attn(n1(x)))
        return x + self.drop(self.mlp(n2(x)))


class AudioVisualTransformer(nn.Module):
    """Per-modality transformer blocks plus a fusion block (mini CAV-MAE).

    Args:
        num_classes: ``C``.
        audio_shape: ``(T, F)`` of the spectrogram input.
        audio_patch: ``(pt, pf)`` patch size over time and frequency.
        image_shape: ``(C_img, H, W)`` of the frame input.
        image_patch: Square patch side.
        dim: Token width ``D``.
        heads: Attention heads.
        depth_specific: Modality-specific blocks per modality (CAV-MAE: 11).
        depth_fused: Fusion blocks (CAV-MAE: 1).
        mlp_ratio: MLP width over ``dim``.
        dropout: Dropout in blocks.
        placeholder_audio: Zero tokens standing in for audio in ``videoonly`` mode (official code: 317).
        placeholder_video: Zero tokens standing in for video in ``audioonly`` mode (official code: 1).
    """

    def __init__(
        self,
        num_classes: int,
        audio_shape: tuple[int, int] = (32, 16),
        audio_patch: tuple[int, int] = (8, 4),
        image_shape: tuple[int, int, int] = (1, 28, 28),
        image_patch: int = 7,
        dim: int = 32,
        heads: int = 4,
        depth_specific: int = 2,
        depth_fused: int = 1,
        mlp_ratio: float = 2.0,
        dropout: float = 0.0,
        placeholder_audio: int = 1,
        placeholder_video: int = 1,
    ) -> None:
        super().__init__()
        (t, f), (pt, pf) = tuple(audio_shape), tuple(audio_patch)
        c, h, w = tuple(image_shape)
        checks = {
            "num_classes": (num_classes, num_classes >= 2, ">= 2"),
            "audio_patch": (audio_patch, t % pt == 0 and f % pf == 0, f"divides audio_shape={tuple(audio_shape)}"),
            "image_patch": (image_patch, h % image_patch == 0 and w % image_patch == 0, f"divides {(h, w)}"),
            "heads": (heads, heads >= 1 and dim % heads == 0, f"divides dim={dim}"),
            "depth_fused": (depth_fused, depth_fused >= 1, ">= 1"),
            "depth_specific": (depth_specific, depth_specific >= 0, ">= 0"),
            "placeholder_audio": (placeholder_audio, placeholder_audio >= 1, ">= 1"),
            "placeholder_video": (placeholder_video, placeholder_video >= 1, ">= 1"),
        }
        for key, (value, ok, rule) in checks.items():
            if not ok:
                raise ConfigError(f"model.net.{key}={value} must be {rule}")
        self.audio_shape, self.image_shape = (t, f), (c, h, w)
        self.placeholder_audio, self.placeholder_video = placeholder_audio, placeholder_video
        self.patch_a = nn.Conv2d(1, dim, kernel_size=(pf, pt), stride=(pf, pt))  # over [F, T] as CAV-MAE
        self.patch_v = nn.Conv2d(c, dim, kernel_size=image_patch, stride=image_patch)
        self.n_audio, self.n_video = (t // pt) * (f // pf), (h // image_patch) * (w // image_patch)
        self.pos_a = nn.Parameter(torch.randn(1, self.n_audio, dim) * 0.02)
        self.pos_v = nn.Parameter(torch.randn(1, self.n_video, dim) * 0.02)
        self.modality_a = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.modality_v = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.blocks_a = nn.ModuleList(FusionBlock(dim, heads, mlp_ratio, dropout, False) for _ in range(depth_specific))
        self.blocks_v = nn.ModuleList(FusionBlock(dim, heads, mlp_ratio, dropout, False) for _ in range(depth_specific))
        self.blocks_u = nn.ModuleList(FusionBlock(dim, heads, mlp_ratio, dropout) for _ in range(depth_fused))
        self.norm, self.norm_a, self.norm_v = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes))
        self.dim = dim

    def encode_audio(self, a: torch.Tensor) -> torch.Tensor:
        """``[B, T, F]`` spectrogram -> ``[B, N_a, D]`` tokens after the audio-specific blocks."""
        if a.dim() != 3 or tuple(a.shape[1:]) != self.audio_shape:
            raise ValueError(f"audio must be [B, {self.audio_shape[0]}, {self.audio_shape[1]}], got {list(a.shape)}")
        x = self.patch_a(a.unsqueeze(1).transpose(2, 3)).flatten(2).transpose(1, 2)
        x = x + self.pos_a + self.modality_a
        for blk in self.blocks_a:
            x = blk(x)
        return x

    def encode_video(self, v: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` frame -> ``[B, N_v, D]`` tokens after the video-specific blocks."""
        if v.dim() != 4 or tuple(v.shape[1:]) != self.image_shape:
            raise ValueError(f"video must be [B, {', '.join(map(str, self.image_shape))}], got {list(v.shape)}")
        x = self.patch_v(v).flatten(2).transpose(1, 2)
        x = x + self.pos_v + self.modality_v
        for blk in self.blocks_v:
            x = blk(x)
        return x

    def fuse(self, tok_a: torch.Tensor | None, tok_v: torch.Tensor | None, mode: str) -> torch.Tensor:
        """Fusion blocks, pooling and head; returns ``[B, C]`` logits.

        ``multimodal`` needs both token sets and uses the shared norms; ``audioonly`` (``videoonly``) replaces the
        video (audio) tokens by ``placeholder_video`` (``placeholder_audio``) zero tokens and uses the audio (video)
        norms, as CAV-MAE's ``forward_eval``.
        """
        if mode == "multimodal":
            if tok_a is None or tok_v is None:
                raise ValueError("multimodal mode needs both modalities")
            x, mod, norm = torch.cat([tok_a, tok_v], 1), None, self.norm
        elif mode == "audioonly":
            if tok_a is None:
                raise ValueError("audioonly mode needs the audio tokens")
            zeros = tok_a.new_zeros(tok_a.shape[0], self.placeholder_video, self.dim)
            x, mod, norm = torch.cat([tok_a, zeros], 1), "a", self.norm_a
        elif mode == "videoonly":
            if tok_v is None:
                raise ValueError("videoonly mode needs the video tokens")
            zeros = tok_v.new_zeros(tok_v.shape[0], self.placeholder_audio, self.dim)
            x, mod, norm = torch.cat([zeros, tok_v], 1), "v", self.norm_v
        else:
            raise ValueError(f"mode={mode!r} must be one of {list(MODES)}")
        for blk in self.blocks_u:
            x = blk(x, mod)
        return self.head(norm(x).mean(1))

    def forward(self, a: torch.Tensor | None, v: torch.Tensor | None, mode: str = "multimodal") -> torch.Tensor:
        """Logits ``[B, C]``. A modality passed as ``None`` is missing for the whole batch: the multimodal mode then
        falls back to the unimodal mode of the other one (its zero placeholders stand in)."""
        if a is None and v is None:
            raise ValueError("both modalities are missing")
        if mode == "multimodal" and (a is None or v is None):
            mode = "audioonly" if v is None else "videoonly"
        tok_a = self.encode_audio(a) if a is not None and mode != "videoonly" else None
        tok_v = self.encode_video(v) if v is not None and mode != "audioonly" else None
        return self.fuse(tok_a, tok_v, mode)
