"""OSTQuant (ICLR 2025) on the suite's causal LMs: equivalent orthogonal + scaling transforms and W/A/KV fake quant.

:class:`TransformedLM` rebuilds a :class:`layers.lm.CausalLM`-shaped model (``embed``, optional ``pos``, ``blocks``
with ``norm1 / mixer / norm2 / mlp``, ``norm``, ``lm_head``) so that every linear computes its weight on the fly
from the frozen original weight and the learnable transforms (the official "temporary" mode):

* RMSNorm weights ``g`` are fused into the following linears (``W <- W diag(g)``, ``g <- 1``), so the norm commutes
  with any orthogonal ``R`` (``RMSNorm(x R) = RMSNorm(x) R``).
* ``R_res`` (global, ``[d, d]``, on the Stiefel manifold): embeddings ``E <- E R``; input-side linears (those that read
  the block's normed input: q/k/v, gates, up/gate, the LM head) ``W <- W R``; output-side linears (those that write
  the residual: out / down projections) ``W <- R^T W``.
* Smoothing scales (all start at one): ``S_attn``, ``S_mlp`` per norm (activation ``x / s``, weight columns ``* s``;
  at deployment ``1/s`` folds into the norm weight) and ``S_up_down`` (up-projection rows ``* s``, down-projection
  columns ``/ s``: exact because SwiGLU is linear in ``up``).
* Optional online Hadamard ``H`` before the down projection (``x H``, ``W H``; QuaRot / OSTQuant default).

The rewrite is *equivalence preserving*: with quantizers off the logits equal the original model's
(``tests/lightning_modules/test_ostquant_model.py`` checks 1e-5). Linears are classified generically by hooking one
forward pass: a linear whose input *is* the mixer's (MLP's) input is input-side; one whose output *is* the mixer's
(MLP's) output is output-side. A block without both raises ``ConfigError``.

Quantization (:mod:`ops.quant`): weights per output channel (symmetric), activations per token (asymmetric) at the
input of every transformed linear, and K/V per token and head for mixers exposing ``kv_quantizer``
(:mod:`layers.attention.outlier_variants`). The LM head stays in full precision (as in QuaRot / OSTQuant).

Deviations from the official code: no per-head ``R_ov`` / ``S_ov`` / ``S_qk`` (the suite's mixers pack q/k/v in one
projection, RoPE pairs make ``S_qk`` inexact), no online QK Hadamard; see ``docs/methods/ostquant.md``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ops.quant import Quantizer, check_group, hadamard, klt, random_hadamard
from ops.quant.transforms import is_pow2
from suite.errors import ConfigError

INITS = ("identity", "hadamard", "klt_hadamard")


class TLinear(nn.Module):
    """A linear whose effective weight is built from its frozen original and the shared transforms.

    ``W_eff = [R^T]_out  ( diag(s_row) W0 diag(1/s_colinv) H )  [R]_in diag(s_in)``, input ``x / s_in`` (or ``x H``).
    """

    def __init__(self, base: nn.Linear, state: TransformedLM, key: str) -> None:
        super().__init__()
        self.register_buffer("w0", base.weight.detach().clone())
        self.register_buffer("b0", base.bias.detach().clone() if base.bias is not None else None)
        self.register_buffer("w_frozen", None)
        self.key = key
        self.in_rot = self.out_rot = self.online_had = False
        self.in_scale: str | None = None
        self.row_scale: str | None = None
        self.colinv_scale: str | None = None
        self.quantize_act = True
        self.hessian: torch.Tensor | None = None
        self.collect = False
        object.__setattr__(self, "_state", state)  # not a submodule: no parameter duplication

    def effective(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(W_eff [out, in], b_eff [out] | None)`` from the current transforms."""
        st = self._state
        w, b = self.w0, self.b0
        if self.row_scale:
            s = st.scales[self.row_scale]
            w = s[:, None] * w
            b = b * s if b is not None else None
        if self.colinv_scale:
            w = w / st.scales[self.colinv_scale][None, :]
        if self.online_had:
            w = w @ st.had.to(w)
        if self.in_rot:
            w = w @ st.rotation
        if self.in_scale:
            w = w * st.scales[self.in_scale][None, :]
        if self.out_rot:
            w = st.rotation.T @ w
            b = b @ st.rotation if b is not None else None
        return w, b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        st = self._state
        if self.in_scale:
            x = x / st.scales[self.in_scale]
        if self.online_had:
            x = x @ st.had.to(x)
        if self.collect:
            h = x.detach().reshape(-1, x.shape[-1]).double()
            h = 2 * h.T @ h
            self.hessian = h if self.hessian is None else self.hessian + h
            self.n_collected = getattr(self, "n_collected", 0) + x.shape[:-1].numel()
        if self.quantize_act:
            x = st.act_quant(x)
        if self.w_frozen is not None:
            return F.linear(x, self.w_frozen, self.effective()[1])
        w, b = self.effective()
        return F.linear(x, st.train_w_quant(w), b)


class TEmbedding(nn.Module):
    """Embedding table ``E0 R`` (the residual stream starts rotated)."""

    def __init__(self, base: nn.Embedding, state: TransformedLM) -> None:
        super().__init__()
        self.register_buffer("w0", base.weight.detach().clone())
        object.__setattr__(self, "_state", state)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.w0 @ self._state.rotation)


def _classify(module: nn.Module, x: torch.Tensor) -> tuple[list[str], list[str]]:
    """Names of the linears inside ``module`` that read its input / write its output (one hooked forward)."""
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [
        m.register_forward_hook(lambda m, i, o, n=n: seen.__setitem__(n, (i[0], o)))
        for n, m in module.named_modules()
        if isinstance(m, nn.Linear)
    ]
    try:
        with torch.no_grad():
            out = module(x)
    finally:
        for h in hooks:
            h.remove()
    ins = [n for n, (i, _) in seen.items() if i.shape == x.shape and torch.equal(i, x)]
    outs = [n for n, (_, o) in seen.items() if o.shape == out.shape and torch.equal(o, out)]
    return ins, outs


class TransformedLM(nn.Module):
    """An OSTQuant-transformable, fake-quantized copy of a causal LM (the original is left untouched).

    Args:
        net: A :class:`layers.lm.CausalLM`-shaped model.
        init: ``identity`` (RTN / SmoothQuant), ``hadamard`` (QuaRot: random Hadamard), ``klt_hadamard`` (OSTQuant
            ``--use_klt``: KLT of the input-side weight rows times a random Hadamard).
        w_bits, a_bits, kv_bits: Bit widths (2..8; 16 = off).
        w_group_size, a_group_size, kv_group_size: Quantization groups (must divide the dimension; ``None`` = row).
        online_hadamard: Hadamard before each down projection (needs a power-of-two MLP width).
        train_w_quant: Fake-quantize weights (RTN) during calibration too (official: off for W4A4).
        seed: Random Hadamard signs.
    """

    def __init__(
        self,
        net: nn.Module,
        init: str = "hadamard",
        w_bits: int = 4,
        a_bits: int = 4,
        kv_bits: int = 4,
        w_group_size: int | None = None,
        a_group_size: int | None = None,
        kv_group_size: int | None = None,
        online_hadamard: bool = True,
        train_w_quant: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if init not in INITS:
            raise ConfigError(f"ostquant init={init!r} must be one of {list(INITS)}")
        for attr in ("embed", "blocks", "norm", "lm_head"):
            if not hasattr(net, attr):
                raise ConfigError(f"model {type(net).__name__} has no '{attr}': not a supported causal LM")
        net = copy.deepcopy(net).eval()
        for p in net.parameters():
            p.requires_grad_(False)
        d = net.embed.weight.shape[1]
        self.net, self.d = net, d
        self.act_quant = Quantizer(a_bits, False, a_group_size, "a_bits")
        self.kv_quant = Quantizer(kv_bits, False, kv_group_size, "kv_bits")
        self.w_quant_cfg = (w_bits, w_group_size)
        self._wq = Quantizer(w_bits, True, w_group_size, "w_bits")
        self.train_w_quant_on = train_w_quant
        self.scales = nn.ParameterDict()
        self.linears: dict[str, TLinear] = {}
        gen = torch.Generator().manual_seed(seed)
        probe = torch.randn(1, 4, d, generator=gen)
        input_rows = []
        for i, block in enumerate(net.blocks):
            for part, norm, tag in (("mixer", block.norm1, f"attn{i}"), ("mlp", block.norm2, f"mlp{i}")):
                sub = getattr(block, part)
                ins, outs = _classify(sub, probe)
                if not ins or len(outs) != 1:
                    raise ConfigError(
                        f"blocks.{i}.{part} ({type(sub).__name__}) has no supported linear layers: needs input-side "
                        f"linears (found {ins}) and exactly one output linear (found {outs})"
                    )
                g = norm.weight.detach().clone()
                norm.weight.data.fill_(1.0)
                self.scales[tag] = nn.Parameter(torch.ones(d))
                for name in ins:
                    lin = self._replace(sub, name, f"blocks.{i}.{part}.{name}")
                    lin.w0.mul_(g[None, :])
                    lin.in_rot, lin.in_scale = True, tag
                    input_rows.append(lin.w0)
                (name,) = outs
                self._replace(sub, name, f"blocks.{i}.{part}.{name}").out_rot = True
                if hasattr(sub, "kv_quantizer"):
                    check_group(f"kv_group_size (head_dim of blocks.{i}.{part})", kv_group_size, sub.head_dim)
                    sub.kv_quantizer = self.kv_quant
            mlp = block.mlp
            if isinstance(getattr(mlp, "up_proj", None), TLinear) and isinstance(
                getattr(mlp, "down_proj", None), TLinear
            ):
                hidden = mlp.up_proj.w0.shape[0]
                self.scales[f"ud{i}"] = nn.Parameter(torch.ones(hidden))
                mlp.up_proj.row_scale = mlp.down_proj.colinv_scale = f"ud{i}"
                if online_hadamard:
                    if not is_pow2(hidden):
                        raise ConfigError(f"online_hadamard needs a power-of-two MLP width, got {hidden}")
                    mlp.down_proj.online_had = True
                    self.register_buffer("had", hadamard(hidden), persistent=False)
        g = net.norm.weight.detach().clone()
        net.norm.weight.data.fill_(1.0)
        head = TLinear(net.lm_head, self, "lm_head")
        head.w0.mul_(g[None, :])
        head.in_rot, head.quantize_act = True, False
        net.lm_head = head
        net.embed = TEmbedding(net.embed, self)
        if getattr(net, "pos", None) is not None:
            net.pos = TEmbedding(net.pos, self)
        self.rotation = nn.Parameter(self._init_rotation(init, torch.cat(input_rows), gen))
        for lin in self.linears.values():  # fail at construction, naming the layer, not at the first forward
            n_in = lin.w0.shape[1]
            check_group(f"w_group_size (in_features of {lin.key})", w_group_size, n_in)
            check_group(f"a_group_size (in_features of {lin.key})", a_group_size, n_in)

    def _replace(self, parent: nn.Module, name: str, key: str) -> TLinear:
        *path, leaf = name.split(".")
        owner = parent
        for p in path:
            owner = getattr(owner, p)
        lin = TLinear(getattr(owner, leaf), self, key)
        setattr(owner, leaf, lin)
        self.linears[key] = lin
        return lin

    def _init_rotation(self, init: str, rows: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        if init == "identity":
            return torch.eye(self.d)
        h = random_hadamard(self.d, gen)
        if init == "hadamard":
            return h
        w = rows.double()
        return (klt(w.T @ w / w.shape[0]).float() @ h).contiguous()

    def train_w_quant(self, w: torch.Tensor) -> torch.Tensor:
        return self._wq(w) if self.train_w_quant_on else w

    def set_quant(self, enabled: bool) -> None:
        """Switch activation / KV fake quantization on or off (weights: see :meth:`freeze`)."""
        self.act_quant.enabled = self.kv_quant.enabled = enabled

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids [B, T] -> logits [B, T, V]``."""
        return self.net(input_ids)

    def rotation_parameters(self) -> list[nn.Parameter]:
        return [self.rotation]

    def scale_parameters(self) -> list[nn.Parameter]:
        return list(self.scales.values())

    @torch.no_grad()
    def freeze(self, quantizer: str = "rtn", percdamp: float = 0.01) -> None:
        """Fold the transforms and quantize every transformed weight (``rtn`` or ``gptq``; GPTQ needs Hessians from
        :meth:`collect_hessians`). The LM head stays in full precision."""
        from ops.quant import gptq, rtn_weight

        if quantizer not in ("rtn", "gptq"):
            raise ConfigError(f"w_quantizer={quantizer!r} must be 'rtn' or 'gptq'")
        bits, group = self.w_quant_cfg
        for lin in self.linears.values():
            w, _ = lin.effective()
            if bits >= 16:
                lin.w_frozen = w.detach().clone()
            elif quantizer == "gptq":
                if lin.hessian is None:
                    raise ConfigError(f"w_quantizer=gptq: no calibration Hessian for {lin.key}; run collect_hessians")
                h = lin.hessian / max(1, lin.n_collected)
                lin.w_frozen = gptq(w.double(), h, bits, group, percdamp=percdamp).to(w.dtype)
            else:
                lin.w_frozen = rtn_weight(w, bits, group)
        self.rotation.requires_grad_(False)
        for s in self.scales.values():
            s.requires_grad_(False)

    @torch.no_grad()
    def collect_hessians(self, batches: list[torch.Tensor]) -> None:
        """Accumulate ``2 X^T X`` of every transformed linear's (full-precision) input over ``batches``."""
        self.set_quant(False)
        for lin in self.linears.values():
            lin.collect, lin.hessian, lin.n_collected = True, None, 0
        try:
            for ids in batches:
                self(ids)
        finally:
            for lin in self.linears.values():
                lin.collect = False
            self.set_quant(True)

    @torch.no_grad()
    def smoothquant_scales(self, batches: list[torch.Tensor], alpha: float = 0.5) -> None:
        """SmoothQuant: ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` per norm group (activations ``/ s``)."""
        if not 0 <= alpha <= 1:
            raise ConfigError(f"smoothquant alpha={alpha!r} must be in [0, 1]")
        amax: dict[str, torch.Tensor] = {}
        hooks = []
        for lin in self.linears.values():
            if lin.in_scale:
                tag = lin.in_scale

                def hook(m, i, o, tag=tag):
                    a = i[0].detach().abs().reshape(-1, i[0].shape[-1]).amax(0)
                    amax[tag] = torch.maximum(amax[tag], a) if tag in amax else a

                hooks.append(lin.register_forward_hook(hook))
        self.set_quant(False)
        try:
            for ids in batches:
                self(ids)
        finally:
            for h in hooks:
                h.remove()
            self.set_quant(True)
        for tag, a in amax.items():
            # activations were divided by the current s (= 1); weights of the group share the channel
            wmax = torch.stack(
                [(lin.w0 @ self.rotation).abs().amax(0) for lin in self.linears.values() if lin.in_scale == tag]
            ).amax(0)
            self.scales[tag].copy_((a.clamp_min(1e-5) ** alpha / wmax.clamp_min(1e-5) ** (1 - alpha)).clamp_min(1e-5))
