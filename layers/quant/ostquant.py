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
* Per attention layer (``head_transforms``), on mixers whose logits are ``q . k`` and whose output is linear in ``v``
  per head (:class:`~layers.attention.softmax.SoftmaxAttention`, :class:`~layers.attention.outlier_variants.
  OutlierVariantAttention`; :class:`~layers.attention.stickbreaking.StickBreakingAttention` gets ``S_qk`` only, since
  its GroupNorm over heads does not commute with a rotation), acting on the packed ``qkv_proj`` rows (``[3, H, D]``)
  and the ``o_proj`` columns:

  - ``S_qk [H, D]`` (paper Sec. 4.2, Eq. (6)-(7) "learnable scaling between Q and K"): ``q <- q * s``,
    ``k <- k / s``, so ``q . k`` and every softmax / stick-breaking logit are unchanged. With RoPE the scale is
    shared by each rotated pair ``(i, i + D/2)`` (``[H, D/2]`` learned), which makes it commute with the rotation.
  - ``R_ov [H, D, D]`` (per-head orthogonal, the "R2" of SpinQuant / OSTQuant, on the Stiefel manifold) and
    ``S_ov [H, D]``: ``v_h <- v_h R_h diag(s_h)`` (``W_v[h] <- diag(s_h) R_h^T W_v[h]``) and
    ``W_o[:, h] <- W_o[:, h] R_h diag(1 / s_h)``. Attention is linear in ``v`` per head, so the output is unchanged.
    Value-space biases of the variants (``v_bias``: fixed / context-aware / key-value bias; ``head_bias`` of
    stick-breaking) are transformed the same way and the key bias ``k_bias`` is divided by ``S_qk``.
  - K/V fake quantization then sees the scaled keys and the rotated values (per token and head). For mixers without
    a ``kv_quantizer`` hook and without RoPE (stick-breaking), K/V are quantized at the ``qkv_proj`` output.

The rewrite is *equivalence preserving*: with quantizers off the logits equal the original model's
(``tests/lightning_modules/test_ostquant_model.py`` checks 1e-5). Linears are classified generically by hooking one
forward pass: a linear whose input *is* the mixer's (MLP's) input is input-side; one whose output *is* the mixer's
(MLP's) output is output-side. A block without both raises ``ConfigError``.

Quantization (:mod:`ops.quant`): weights per output channel (symmetric), activations per token (asymmetric) at the
input of every transformed linear, and K/V per token and head for mixers exposing ``kv_quantizer``
(:mod:`layers.attention.outlier_variants`). The LM head stays in full precision (as in QuaRot / OSTQuant).

Deviations from the official code: ``S_qk`` is pair-shared under RoPE (the official code does not constrain it, which
breaks exactness), no online QK Hadamard (post-RoPE Q/K Hadamard at KV4); see ``docs/methods/ostquant.md``.
"""

from __future__ import annotations

import copy
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import ConfigError
from layers.attention.outlier_variants import OutlierVariantAttention
from layers.attention.softmax import SoftmaxAttention
from layers.attention.stickbreaking import StickBreakingAttention
from ops.quant import Quantizer, check_group, gptq, hadamard, random_hadamard, rtn_weight, weight_klt
from ops.quant.transforms import is_pow2

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
        self.head_role: str | None = None  # "qkv" (packed q/k/v rows) or "o" (per-head input columns)
        self.head_layer = -1
        self.kv_out_quant = False  # fake-quantize the k / v slices of the output (per token and head)
        self.hessian: torch.Tensor | None = None
        self.collect = False
        object.__setattr__(self, "_state", state)  # not a submodule: no parameter duplication

    def effective(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(W_eff [out, in], b_eff [out] | None)`` from the current transforms."""
        st = self._state
        w, b = self.w0, self.b0
        if self.head_role == "qkv":
            w, b = st.qkv_rows(self.head_layer, w, b)
        elif self.head_role == "o":
            w = st.o_cols(self.head_layer, w)
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
            y = F.linear(x, self.w_frozen, self.effective()[1])
        else:
            w, b = self.effective()
            y = F.linear(x, st.train_w_quant(w), b)
        if self.kv_out_quant:
            mixer = st.head_mixers[self.head_layer]
            q, k, v = y.unflatten(-1, (3, mixer.num_heads, mixer.head_dim)).unbind(-3)
            y = torch.stack([q, st.kv_quant(k), st.kv_quant(v)], -3).flatten(-3)
        return y


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
        head_transforms: Add the per-attention-layer ``S_qk``, ``R_ov`` and ``S_ov`` (see module docstring);
            ``False`` keeps only ``R_res`` and the norm / up-down scales.
        klt_centered: KLT init from the centred covariance of the weight rows (the method; default) or from the
            uncentred ``W^T W / N`` (:func:`ops.quant.transforms.weight_klt`).
        w_sym_scale: Weight scale rule, ``signed`` (official ``max(-min/8, max/7)`` at 4 bits) or ``absmax``
            (``max|w|/7``); see :mod:`ops.quant.fake`.
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
        head_transforms: bool = True,
        klt_centered: bool = True,
        w_sym_scale: str = "signed",
    ) -> None:
        super().__init__()
        self.klt_centered, self.w_sym_scale = klt_centered, w_sym_scale
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
        self._wq = Quantizer(w_bits, True, w_group_size, "w_bits", sym_scale=w_sym_scale)
        self.train_w_quant_on = train_w_quant
        self.scales = nn.ParameterDict()
        self.head_rotations = nn.ParameterDict()
        self.head_mixers: dict[int, nn.Module] = {}
        self.qk_pairs: dict[int, bool] = {}
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
                if part == "mixer" and head_transforms:
                    self._add_head_transforms(i, sub, init, gen, kv_group_size)
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

    def _add_head_transforms(self, i: int, mixer: nn.Module, init: str, gen: torch.Generator, kv_group) -> None:
        """``S_qk`` / ``R_ov`` / ``S_ov`` of attention layer ``i`` (no-op for mixers they are not exact for)."""
        if not isinstance(mixer, (SoftmaxAttention, OutlierVariantAttention, StickBreakingAttention)):
            return  # e.g. Gated DeltaNet: conv + SiLU on q/k/v and a gated norm make them inexact
        qkv, o = getattr(mixer, "qkv_proj", None), getattr(mixer, "o_proj", None)
        h, d = mixer.num_heads, mixer.head_dim
        if not (isinstance(qkv, TLinear) and isinstance(o, TLinear)):
            return
        if qkv.w0.shape[0] != 3 * h * d or o.w0.shape[1] != h * d:
            return
        rope = getattr(mixer, "rope", None) is not None
        self.head_mixers[i], self.qk_pairs[i] = mixer, rope
        self.scales[f"qk{i}"] = nn.Parameter(torch.ones(h, d // 2 if rope else d))
        qkv.head_role, qkv.head_layer = "qkv", i
        ov = not isinstance(mixer, StickBreakingAttention) or mixer.norm is None  # GroupNorm: no R_ov / S_ov
        if ov:
            self.scales[f"ov{i}"] = nn.Parameter(torch.ones(h, d))
            self.head_rotations[f"ov{i}"] = nn.Parameter(self._init_head_rotation(init, o.w0.view(-1, h, d), gen))
            o.head_role, o.head_layer = "o", i
        if not hasattr(mixer, "kv_quantizer") and not rope:
            check_group(f"kv_group_size (head_dim of blocks.{i}.mixer)", kv_group, d)
            qkv.kv_out_quant = True
        # key / value-space biases of the variants become functions of the transforms (recomputed every forward)
        biases = {n: "k" if n == "k_bias" else "v" for n in ("k_bias", "v_bias", "head_bias")}
        biases = {n: kind for n, kind in biases.items() if isinstance(getattr(mixer, n, None), nn.Parameter)}
        if biases and not ov and any(kind == "v" for kind in biases.values()):
            biases = {n: kind for n, kind in biases.items() if kind == "k"}
        for name in biases:
            base = mixer._parameters.pop(name).detach().clone()
            mixer.register_buffer(f"{name}_0", base)
            setattr(mixer, name, base.clone())
        if biases:
            mixer.register_forward_pre_hook(partial(self._bias_hook, i=i, biases=biases))

    def _bias_hook(self, mixer: nn.Module, args: tuple, i: int, biases: dict[str, str]) -> None:
        for name, kind in biases.items():
            b0 = getattr(mixer, f"{name}_0")  # [H, D]
            if kind == "k":
                setattr(mixer, name, b0 / self.qk_scale(i))
            else:
                rot = self.head_rotations[f"ov{i}"]
                setattr(mixer, name, torch.einsum("he,hed->hd", b0, rot) * self.scales[f"ov{i}"])

    def qk_scale(self, i: int) -> torch.Tensor:
        """``S_qk [H, D]`` of layer ``i`` (RoPE: each pair ``(j, j + D/2)`` shares a scale)."""
        s = self.scales[f"qk{i}"]
        return torch.cat([s, s], -1) if self.qk_pairs[i] else s

    def qkv_rows(self, i: int, w: torch.Tensor, b: torch.Tensor | None):
        """Packed ``qkv_proj`` rows ``[3 H D, in]``: ``q * S_qk``, ``k / S_qk``, ``diag(S_ov) R_ov^T W_v`` per head."""
        mixer = self.head_mixers[i]
        h, d = mixer.num_heads, mixer.head_dim
        s = self.qk_scale(i)
        rot = self.head_rotations.get(f"ov{i}")
        s_ov = self.scales[f"ov{i}"] if rot is not None else None

        def rows(x: torch.Tensor) -> torch.Tensor:  # x [3 H D, ...]
            q, k, v = x.unflatten(0, (3, h, d)).unbind(0)
            extra = (None,) * (x.dim() - 1)
            q, k = q * s[(...,) + extra], k / s[(...,) + extra]
            if rot is not None:
                v = torch.einsum("hed,he...->hd...", rot, v) * s_ov[(...,) + extra]
            return torch.stack([q, k, v]).flatten(0, 2)

        return rows(w), (rows(b) if b is not None else None)

    def o_cols(self, i: int, w: torch.Tensor) -> torch.Tensor:
        """``o_proj`` columns ``[out, H D]``: ``W_o[:, h] R_h diag(1 / S_ov[h])``."""
        mixer = self.head_mixers[i]
        wh = w.unflatten(1, (mixer.num_heads, mixer.head_dim))
        wh = torch.einsum("ohe,hed->ohd", wh, self.head_rotations[f"ov{i}"]) / self.scales[f"ov{i}"][None]
        return wh.flatten(1)

    def _init_head_rotation(self, init: str, w_o: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """``R_ov [H, D, D]``: identity, random Hadamard, or KLT of each head's ``o_proj`` column block x Hadamard."""
        _, h, d = w_o.shape
        if init == "identity":
            return torch.eye(d).repeat(h, 1, 1)
        had = torch.stack([random_hadamard(d, gen) for _ in range(h)])
        if init == "hadamard":
            return had
        blocks = w_o.double().transpose(0, 1)  # [H, out, D]: rows of each head's o_proj column block
        return weight_klt(blocks, self.klt_centered).float() @ had

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
        return (weight_klt(rows, self.klt_centered).float() @ h).contiguous()

    def train_w_quant(self, w: torch.Tensor) -> torch.Tensor:
        return self._wq(w) if self.train_w_quant_on else w

    def set_quant(self, enabled: bool) -> None:
        """Switch activation / KV fake quantization on or off (weights: see :meth:`freeze`)."""
        self.act_quant.enabled = self.kv_quant.enabled = enabled

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids [B, T] -> logits [B, T, V]``."""
        return self.net(input_ids)

    def rotation_parameters(self) -> list[nn.Parameter]:
        """``R_res`` and the per-head ``R_ov`` (all on the Stiefel manifold)."""
        return [self.rotation, *self.head_rotations.values()]

    def scale_parameters(self) -> list[nn.Parameter]:
        return list(self.scales.values())

    @torch.no_grad()
    def freeze(
        self,
        quantizer: str = "rtn",
        percdamp: float = 0.01,
        clip_search: bool = True,
        clip_grid: str = "official",
        clip_norm: float = 2.4,
    ) -> None:
        """Fold the transforms and quantize every transformed weight (``rtn`` or ``gptq``; GPTQ needs Hessians from
        :meth:`collect_hessians`). The LM head stays in full precision.

        ``clip_search`` (on by default, as the official ``w_clip``) searches each row's clip ratio over ``clip_grid``
        (``official``: 80 ratios ``1.00 ... 0.21``; ``coarse``: ``1.0 ... 0.5`` by 0.05) with the error exponent
        ``clip_norm`` (official 2.4; 2 = squared error); see :func:`ops.quant.fake.rtn_weight`, :mod:`ops.quant.gptq`.
        """
        if quantizer not in ("rtn", "gptq"):
            raise ConfigError(f"w_quantizer={quantizer!r} must be 'rtn' or 'gptq'")
        bits, group = self.w_quant_cfg
        clip = {
            "clip_search": clip_search,
            "clip_grid": clip_grid,
            "clip_norm": clip_norm,
            "sym_scale": self.w_sym_scale,
        }
        for lin in self.linears.values():
            w, _ = lin.effective()
            if bits >= 16:
                lin.w_frozen = w.detach().clone()
            elif quantizer == "gptq":
                if lin.hessian is None:
                    raise ConfigError(f"w_quantizer=gptq: no calibration Hessian for {lin.key}; run collect_hessians")
                h = lin.hessian / max(1, lin.n_collected)
                lin.w_frozen = gptq(w.double(), h, bits, group, percdamp=percdamp, **clip).to(w.dtype)
            else:
                lin.w_frozen = rtn_weight(w, bits, group, **clip)
        for r in self.rotation_parameters():
            r.requires_grad_(False)
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
