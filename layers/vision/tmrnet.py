"""TMRNet (Zhang et al., ICLR 2025, "Exposure Bracketing Is All You Need For A High-Quality Image"), Sec. 4.2.

Input: ``raws`` ``[B, T, 4, h, w]``, exposure-normalised packed RGGB frames, frame 0 the shortest exposure (the
reference). Output: the HDR RAW ``[B, 4, s h, s w]`` aligned to frame 0 (``s = 4`` for BracketIRE+).

1. **Feature extraction** (shared by all frames): channels ``[x_c, max(x_c, 0)^(1/2.2)]`` interleaved (8), then
   ``ResidualBlocksWithInputConv(8 -> C, n_feat)``.
2. **Alignment** of frames ``1..T-1`` to frame 0: flow-guided modulated deformable convolution (BasicVSR++ style):
   warp ``f_i`` by the flow, predict ``o = max_mag tanh(conv([warped, f_0, flow])) + flow`` and a sigmoid mask, and
   apply ``deform_conv2d(f_i, o, mask)``. The flow is ``zero`` (the DCN learns the offsets alone), ``oracle`` (the
   simulator's camera motion) or ``learned`` (a small flow net trained end to end) -- the paper's pretrained SPyNet
   is not available offline.
3. **Temporally modulated recurrence** (paper Eq. (4)-(5)): ``h_0 = 0``; for each frame ``i``:
   ``h <- h + B_c([f_0, f_i, h])`` (one block shared by all frames), then
   ``h <- h + alpha_i * B_i([f_0, f_i, h])`` (a frame-specific block), with the learnable ``alpha`` ``[T, C]``
   initialised to 0, so that training starts from the shared recurrence and the frame-specific branches switch
   on gradually. ``specific=False`` drops the ``B_i`` (the shared-only baseline); ``alpha_learnable=False`` with
   ``alpha_init=1`` ablates the modulation.
4. **Reconstruction**: ``hr = Recon([f_0, h], n_recon) + conv(x_0)``, ``y = conv_last(lrelu(conv_hr(hr)))``.
   BracketIRE+ (``scale=4``): ``hr = up4(hr) + up4(skip) + beta * PS2(PS2(hr))`` with ``beta`` ``[C]`` initialised
   to 0 (bilinear ``up4``; ``PS2`` = conv + pixel shuffle x2 + lrelu).

``forward(raws, flow, return_all=True)`` returns the output after every recurrence step (the self-supervised
adaptation's ``y_0 .. y_{T-1}``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import deform_conv2d

from ops.isp.deform import batched_modulated_deform_conv2d, flow_warp

FLOWS = ("zero", "oracle", "learned")
DCN_IMPLS = ("torchvision", "batched")


class ResidualBlock(nn.Module):
    """``x + conv(relu(conv(x)))``, no normalisation, Kaiming init scaled by 0.1 (EDVR / BasicVSR)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)
        for conv in (self.conv1, self.conv2):
            nn.init.kaiming_normal_(conv.weight)
            conv.weight.data.mul_(0.1)
            nn.init.zeros_(conv.bias)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv2(F.relu(self.conv1(x)))


class ResidualBlocksWithInputConv(nn.Sequential):
    """``conv3x3(c_in -> c) + lrelu(0.1)`` followed by ``n`` :class:`ResidualBlock`."""

    def __init__(self, c_in: int, c: int, n: int) -> None:
        super().__init__(nn.Conv2d(c_in, c, 3, padding=1), nn.LeakyReLU(0.1), *[ResidualBlock(c) for _ in range(n)])


def gamma_channels(raws: Tensor) -> Tensor:
    """``[..., 4, h, w]`` -> ``[..., 8, h, w]``: ``[x_c, max(x_c, 0)^(1/2.2)]`` per channel, interleaved."""
    return torch.stack([raws, raws.clamp(min=0) ** (1 / 2.2)], dim=-3).flatten(-4, -3)


def to_rgb3(raws: Tensor) -> Tensor:
    """``[..., 4, h, w]`` -> ``[..., 3, h, w]``: ``clip(R, mean G, B)^(1/2.2)``, the flow network's input."""
    rgb = torch.stack([raws[..., 0, :, :], raws[..., 1:3, :, :].mean(-3), raws[..., 3, :, :]], dim=-3)
    return rgb.clamp(1e-6, 1.0) ** (1 / 2.2)


class FlowNet(nn.Module):
    """A small flow estimator (the stand-in for SPyNet): ``[ref, frame]`` RGB -> ``(dx, dy)``, the last conv
    zero-initialised so that training starts from zero flow."""

    def __init__(self, c: int = 16, max_flow: float = 8.0) -> None:
        super().__init__()
        self.max_flow = max_flow
        self.net = nn.Sequential(
            nn.Conv2d(6, c, 5, padding=2),
            nn.LeakyReLU(0.1),
            nn.Conv2d(c, c, 3, padding=2, dilation=2),
            nn.LeakyReLU(0.1),
            nn.Conv2d(c, c, 3, padding=4, dilation=4),
            nn.LeakyReLU(0.1),
            nn.Conv2d(c, 2, 3, padding=1),
        )
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, ref: Tensor, frame: Tensor) -> Tensor:
        return self.max_flow * torch.tanh(self.net(torch.cat([ref, frame], dim=1)) / self.max_flow)


class FlowGuidedDCN(nn.Module):
    """Flow-guided modulated deformable alignment of ``f_i`` to ``f_0``: ``impl="torchvision"`` uses
    ``torchvision.ops.deform_conv2d``, ``"batched"`` its parity-tested one-``grid_sample`` twin
    (:func:`~ops.isp.deform.batched_modulated_deform_conv2d`, about 5x faster fwd+bwd on CPU)."""

    def __init__(self, c: int, groups: int = 4, max_mag: float = 10.0, impl: str = "torchvision") -> None:
        super().__init__()
        if c % groups:
            raise ValueError(f"deformable groups {groups} must divide the width {c}")
        if impl not in DCN_IMPLS:
            raise ValueError(f"dcn_impl={impl!r} must be one of {list(DCN_IMPLS)}")
        self.groups, self.max_mag = groups, max_mag
        self.dcn = deform_conv2d if impl == "torchvision" else batched_modulated_deform_conv2d
        self.weight = nn.Parameter(torch.empty(c, c, 3, 3))
        self.bias = nn.Parameter(torch.zeros(c))
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)
        self.offset = nn.Sequential(
            nn.Conv2d(2 * c + 2, c, 3, padding=1),
            nn.LeakyReLU(0.1),
            nn.Conv2d(c, c, 3, padding=1),
            nn.LeakyReLU(0.1),
            nn.Conv2d(c, 3 * groups * 9, 3, padding=1),
        )
        nn.init.zeros_(self.offset[-1].weight)  # start at offsets = flow, mask = 0.5 (BasicVSR++)
        nn.init.zeros_(self.offset[-1].bias)

    def forward(self, feat: Tensor, ref: Tensor, flow: Tensor) -> Tensor:
        warped = flow_warp(feat, flow)
        o1, o2, mask = self.offset(torch.cat([warped, ref, flow], dim=1)).chunk(3, dim=1)
        offset = self.max_mag * torch.tanh(torch.cat([o1, o2], dim=1)) + flow.flip(1).repeat(1, self.groups * 9, 1, 1)
        return self.dcn(feat, offset, self.weight, self.bias, padding=1, mask=torch.sigmoid(mask))


class Reconstruction(nn.Module):
    """``Recon([f_0, h]) + conv(x_0)`` then ``conv_last(lrelu(conv_hr(.)))``; ``scale=4`` adds the BracketIRE+
    upsampler ``up4(hr) + up4(skip) + beta PS2(PS2(hr))`` with ``beta`` initialised to 0."""

    def __init__(self, c_in: int, c: int, n: int, scale: int = 1) -> None:
        super().__init__()
        if scale not in (1, 4):
            raise ValueError(f"scale must be 1 (BracketIRE) or 4 (BracketIRE+), got {scale}")
        self.scale = scale
        self.body = ResidualBlocksWithInputConv(c_in, c, n)
        self.skip = nn.Conv2d(4, c, 3, padding=1)
        if scale == 4:
            self.up1, self.up2 = nn.Conv2d(c, 4 * c, 3, padding=1), nn.Conv2d(c, 4 * c, 3, padding=1)
            self.beta = nn.Parameter(torch.zeros(1, c, 1, 1))
        self.conv_hr, self.conv_last = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, 4, 3, padding=1)

    def forward(self, feat: Tensor, x0: Tensor) -> Tensor:
        body, skip = self.body(feat), self.skip(x0)
        if self.scale == 1:
            hr = body + skip
        else:
            up = F.leaky_relu(F.pixel_shuffle(self.up1(body), 2), 0.1)
            up = F.leaky_relu(F.pixel_shuffle(self.up2(up), 2), 0.1)
            interp = F.interpolate(body, scale_factor=4, mode="bilinear", align_corners=False)
            hr = interp + F.interpolate(skip, scale_factor=4, mode="bilinear", align_corners=False) + self.beta * up
        return self.conv_last(F.leaky_relu(self.conv_hr(hr), 0.1))


class TMRNet(nn.Module):
    """Temporally modulated recurrent network; see the module docstring.

    Args:
        num_frames: ``T`` (frame-specific blocks and ``alpha`` rows).
        channels: width ``C`` (64 in the paper).
        n_feat, n_common, n_specific, n_recon: residual blocks of feature extraction, the shared block, each
            frame-specific block and reconstruction (5, 16, 24, 5 in the paper).
        specific: use the frame-specific blocks (``False``: shared-only recurrence).
        alpha_init, alpha_learnable: the modulation ``alpha`` (0 and learnable in the paper).
        flow: ``zero | oracle | learned``.
        dcn_groups, max_offset: deformable groups and the offset residual's magnitude (8 and 10 in the paper).
        dcn_impl: ``torchvision`` (``deform_conv2d``) or ``batched`` (its CPU-fast twin).
        scale: 1 (BracketIRE) or 4 (BracketIRE+).
    """

    def __init__(
        self,
        num_frames: int = 5,
        channels: int = 16,
        n_feat: int = 2,
        n_common: int = 2,
        n_specific: int = 3,
        n_recon: int = 2,
        specific: bool = True,
        alpha_init: float = 0.0,
        alpha_learnable: bool = True,
        flow: str = "zero",
        dcn_groups: int = 4,
        max_offset: float = 10.0,
        dcn_impl: str = "torchvision",
        scale: int = 1,
    ) -> None:
        super().__init__()
        if flow not in FLOWS:
            raise ValueError(f"flow={flow!r} must be one of {list(FLOWS)}")
        self.num_frames, self.flow_mode, self.specific = num_frames, flow, specific
        c = channels
        self.feat = ResidualBlocksWithInputConv(8, c, n_feat)
        self.align = FlowGuidedDCN(c, dcn_groups, max_offset, dcn_impl) if num_frames > 1 else None
        self.flownet = FlowNet() if flow == "learned" and num_frames > 1 else None
        self.common = ResidualBlocksWithInputConv(3 * c, c, n_common)
        if specific:
            self.branches = nn.ModuleList(ResidualBlocksWithInputConv(3 * c, c, n_specific) for _ in range(num_frames))
            alpha = torch.full((num_frames, 1, c, 1, 1), float(alpha_init))
            if alpha_learnable:
                self.alpha = nn.Parameter(alpha)
            else:
                self.register_buffer("alpha", alpha)
        self.recon = Reconstruction(2 * c, c, n_recon, scale)

    def flows(self, raws: Tensor, flow: Tensor | None) -> Tensor:
        """``[B, T-1, 2, h, w]`` flow from frame 0 to frames ``1..T-1`` (``flow``: the oracle ``[B, T, 2]``)."""
        b, t, _, h, w = raws.shape
        if self.flow_mode == "oracle":
            if flow is None:
                raise ValueError("flow=oracle needs the bracket's oracle flow (the datamodule's 'flow' field)")
            return flow[:, 1:t, :, None, None].expand(b, t - 1, 2, h, w)
        if self.flow_mode == "learned":
            rgb = to_rgb3(raws)
            return torch.stack([self.flownet(rgb[:, 0], rgb[:, i]) for i in range(1, t)], dim=1)
        return raws.new_zeros(b, t - 1, 2, h, w)

    def forward(self, raws: Tensor, flow: Tensor | None = None, return_all: bool = False) -> Tensor | list[Tensor]:
        b, t, c4, h, w = raws.shape
        if t != self.num_frames or c4 != 4:
            raise ValueError(f"TMRNet expects [B, {self.num_frames}, 4, h, w] brackets, got {tuple(raws.shape)}")
        feats = self.feat(gamma_channels(raws).flatten(0, 1)).unflatten(0, (b, t))
        base = feats[:, 0]
        aligned = [base]
        if t > 1:
            fl = self.flows(raws, flow)
            aligned += [self.align(feats[:, i], base, fl[:, i - 1]) for i in range(1, t)]
        hstate = torch.zeros_like(base)
        outs = []
        for i, fi in enumerate(aligned):
            hstate = hstate + self.common(torch.cat([base, fi, hstate], dim=1))
            if self.specific:
                hstate = hstate + self.alpha[i] * self.branches[i](torch.cat([base, fi, hstate], dim=1))
            if return_all or i == t - 1:
                outs.append(self.recon(torch.cat([base, hstate], dim=1), raws[:, 0]))
        return outs if return_all else outs[-1]
