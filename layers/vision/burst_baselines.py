"""Baselines of the BracketIRE claim, at the same width and depth budget as :class:`~layers.vision.tmrnet.TMRNet`.

* :class:`SingleFrameNet` -- the same feature extractor and reconstruction on the reference frame only, with the
  recurrence's residual blocks as its body (one frame: no alignment, no fusion).
* :class:`EarlyFusionNet` -- all exposure-normalised frames concatenated at the input (``8 T`` channels), one
  residual body, the same reconstruction: a burst network with no alignment and no recurrence.
* :class:`FrameAverage` -- no parameters: the mean of the exposure-normalised frames (optionally only over each
  pixel's unsaturated frames), bilinearly upsampled x4 for BracketIRE+.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from layers.vision.tmrnet import Reconstruction, ResidualBlocksWithInputConv, gamma_channels


class SingleFrameNet(nn.Module):
    """Restoration of frame 0 alone: ``Recon([f_0, Body(f_0)])``; ``n_body`` residual blocks."""

    def __init__(self, channels: int = 16, n_feat: int = 2, n_body: int = 5, n_recon: int = 2, scale: int = 1) -> None:
        super().__init__()
        self.feat = ResidualBlocksWithInputConv(8, channels, n_feat)
        self.body = ResidualBlocksWithInputConv(channels, channels, n_body)
        self.recon = Reconstruction(2 * channels, channels, n_recon, scale)

    def forward(self, raws: Tensor, flow: Tensor | None = None, return_all: bool = False) -> Tensor | list[Tensor]:
        f0 = self.feat(gamma_channels(raws[:, 0]))
        out = self.recon(torch.cat([f0, self.body(f0)], dim=1), raws[:, 0])
        return [out] * raws.shape[1] if return_all else out


class EarlyFusionNet(nn.Module):
    """All ``T`` frames fused at the input: ``Recon([g, Body(g)])`` with ``g = Feat(cat_i [x_i, x_i^(1/2.2)])``."""

    def __init__(
        self,
        num_frames: int = 5,
        channels: int = 16,
        n_feat: int = 2,
        n_body: int = 5,
        n_recon: int = 2,
        scale: int = 1,
    ) -> None:
        super().__init__()
        self.num_frames = num_frames
        self.feat = ResidualBlocksWithInputConv(8 * num_frames, channels, n_feat)
        self.body = ResidualBlocksWithInputConv(channels, channels, n_body)
        self.recon = Reconstruction(2 * channels, channels, n_recon, scale)

    def forward(self, raws: Tensor, flow: Tensor | None = None, return_all: bool = False) -> Tensor | list[Tensor]:
        if raws.shape[1] != self.num_frames:
            raise ValueError(f"EarlyFusionNet expects {self.num_frames} frames, got {raws.shape[1]}")
        g = self.feat(gamma_channels(raws).flatten(1, 2))
        out = self.recon(torch.cat([g, self.body(g)], dim=1), raws[:, 0])
        return [out] * raws.shape[1] if return_all else out


class FrameAverage(nn.Module):
    """Plain exposure-normalised frame averaging (no parameters).

    Args:
        scale: 1, or 4 (bilinear x4 upsampling for BracketIRE+).
        masked: average each pixel over its unsaturated frames only (a normalised value below the frame's
            saturation level ``ratio^(ref - i)``; frame 0 always counts). ``False``: the plain mean.
        ratio, ref: the exposure ratio and the normalisation's reference frame.
    """

    def __init__(self, scale: int = 1, masked: bool = False, ratio: int = 4, ref: int = 2) -> None:
        super().__init__()
        self.scale, self.masked, self.ratio, self.ref = scale, masked, ratio, ref

    def forward(self, raws: Tensor, flow: Tensor | None = None, return_all: bool = False) -> Tensor | list[Tensor]:
        if self.masked:
            t = raws.shape[1]
            sat = torch.tensor([0.98 * float(self.ratio) ** (self.ref - i) for i in range(t)], dtype=raws.dtype)
            w = (raws < sat.to(raws.device)[None, :, None, None, None]).to(raws.dtype)
            w[:, 0] = 1.0
            out = (w * raws).sum(1) / w.sum(1)
        else:
            out = raws.mean(1)
        if self.scale != 1:
            out = F.interpolate(out, scale_factor=self.scale, mode="bilinear", align_corners=False)
        return [out] * raws.shape[1] if return_all else out
