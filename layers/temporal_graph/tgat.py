"""TGAT (Xu et al., ICLR 2020): temporal graph attention over the ``k`` most recent neighbours before the event.

For node ``u`` at time ``t`` and layer ``l`` (TGAT Eqs. (5)-(7); N-ForGOT's default backbone, 1 layer, 2 heads):

    q = [h_u^{l-1}(t) || Phi(0)],   K = V = [h_v^{l-1}(t_v) || Phi(t - t_v)]  for the k most recent (v, t_v), t_v < t
    h_u^l(t) = FFN([MultiHeadAttn(q, K, V) || h_u^{l-1}(t)])        (FFN = Linear -> ReLU -> Linear)
    h_u^0 = W_in x_u                                                  (input projection; TGAT uses raw features)

``Phi`` is the functional time encoding ``cos(w dt + b)`` (TGAT Eq. (3)), PyG's ``TimeEncoder``, initialised as
TGAT does (``w_i = 10^{-9 i / (d-1)}``, ``b = 0``) and learnt. Edge features are omitted: the N-ForGOT code feeds
zeros. A node with no earlier event gets a zero attention output (DyGLib pads with a zero neighbour).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.nn.models.tgn import TimeEncoder

from layers.temporal_graph.sampler import Neighbors, TemporalNeighborSampler

SUBTREE_NEIGHBOURS = ("states", "reembed")


def masked_multihead_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, heads: int) -> Tensor:
    """Scaled dot-product attention ``[B, D] x [B, K, D] -> [B, D]``; rows whose mask is all False give zeros."""
    b, n, d = k.shape
    dh = d // heads
    qh = q.view(b, heads, 1, dh)
    kh = k.view(b, n, heads, dh).transpose(1, 2)
    vh = v.view(b, n, heads, dh).transpose(1, 2)
    scores = (qh @ kh.transpose(-1, -2)) / math.sqrt(dh)  # [B, H, 1, K]
    scores = scores.masked_fill(~mask.view(b, 1, 1, n), float("-inf"))
    any_nbr = mask.any(1).view(b, 1, 1, 1)
    attn = torch.where(any_nbr, torch.softmax(scores.masked_fill(~any_nbr, 0.0), -1), torch.zeros_like(scores))
    return (attn @ vh).reshape(b, d)


class TGATLayer(nn.Module):
    """One TGAT attention layer (Eqs. (5)-(7) of TGAT) on precomputed neighbour states."""

    def __init__(self, dim: int, time_dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        width = dim + time_dim
        if width % heads:
            raise ValueError(f"dim + time_dim = {width} must be divisible by heads={heads}")
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        self.ffn = nn.Sequential(nn.Linear(width + dim, dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(dim, dim))
        self.dropout = nn.Dropout(dropout)

    def forward(self, h_self: Tensor, phi0: Tensor, h_nbr: Tensor, phi_dt: Tensor, mask: Tensor) -> Tensor:
        """Shapes: h_self [B, D], phi0 [B, T], h_nbr [B, K, D], phi_dt [B, K, T], mask [B, K] -> [B, D]."""
        query = torch.cat([h_self, phi0], -1)
        keys = torch.cat([h_nbr, phi_dt], -1)
        a = masked_multihead_attention(self.q(query), self.k(keys), self.v(keys), mask, self.heads)
        a = self.dropout(self.out(a))
        return self.ffn(torch.cat([a, h_self], -1))


class TGAT(nn.Module):
    """``num_layers`` TGAT layers with recursive temporal neighbour sampling.

    Args:
        in_dim: node feature width ``F``.
        dim: embedding width ``D``.
        time_dim: width of the time encoding.
        num_layers: attention layers (receptive field = ``num_layers`` hops, ``k^L`` sampled neighbours).
        heads: attention heads.
        num_neighbors: ``k``, most recent neighbours per hop.
        dropout: dropout inside the layers.
    """

    def __init__(
        self,
        in_dim: int,
        dim: int = 64,
        time_dim: int = 32,
        num_layers: int = 1,
        heads: int = 2,
        num_neighbors: int = 10,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if num_layers < 1 or num_neighbors < 1:
            raise ValueError(f"num_layers={num_layers} and num_neighbors={num_neighbors} must be >= 1")
        self.num_layers, self.k, self.dim = num_layers, num_neighbors, dim
        self.inp = nn.Linear(in_dim, dim)
        self.time = TimeEncoder(time_dim)
        with torch.no_grad():  # TGAT's initialisation of the functional time encoding
            self.time.lin.weight.copy_((1.0 / 10 ** torch.linspace(0, 9, time_dim)).view(-1, 1))
            self.time.lin.bias.zero_()
        self.layers = nn.ModuleList(TGATLayer(dim, time_dim, heads, dropout) for _ in range(num_layers))

    def phi(self, dt: Tensor) -> Tensor:
        """Time encoding of ``dt`` (any shape) -> ``[*dt.shape, time_dim]``."""
        return self.time(dt.to(self.time.lin.weight.dtype).reshape(-1)).view(*dt.shape, -1)

    # Hooks for encoders whose layer-0 state depends on more than the features (TGN: + the memory of the node).
    def context(self, sampler: TemporalNeighborSampler, nodes: Tensor, times: Tensor) -> Any:
        """Per-query state shared by the whole receptive field of each query (TGAT: none)."""
        return None

    def expand_context(self, ctx: Any, k: int) -> Any:
        """The context of the ``k`` neighbour rows of each row (row ``b`` -> rows ``b k .. b k + k - 1``)."""
        return None

    def base(self, x: Tensor, nodes: Tensor, ctx: Any) -> Tensor:
        """``h^0`` of ``nodes``: the projected node features ``W_in x_u``."""
        return self.inp(x[nodes.to(x.device)])

    def embed(
        self,
        x: Tensor,
        sampler: TemporalNeighborSampler,
        nodes: Tensor,
        times: Tensor,
        layer: int | None = None,
        ctx: Any = None,
    ) -> tuple[Tensor, Neighbors | None]:
        """``h^layer`` of ``nodes [B]`` at ``times [B]`` -> (``[B, D]``, the top layer's sampled neighbours)."""
        out, nb, _ = self._embed_with_neighbors(x, sampler, nodes, times, layer, ctx)
        return out, nb

    def _embed_with_neighbors(
        self,
        x: Tensor,
        sampler: TemporalNeighborSampler,
        nodes: Tensor,
        times: Tensor,
        layer: int | None = None,
        ctx: Any = None,
    ) -> tuple[Tensor, Neighbors | None, Tensor | None]:
        """As :meth:`embed`, plus the neighbours' ``h^{layer-1}`` states the top layer attended to ``[B, k, D]``."""
        layer = self.num_layers if layer is None else layer
        if layer == 0:
            return self.base(x, nodes, ctx), None, None
        nb = sampler.sample(nodes.cpu(), times.cpu(), self.k)  # the event tables live on the CPU
        b = nodes.numel()
        h_self, _ = self.embed(x, sampler, nodes, times, layer - 1, ctx)
        h_nbr, _ = self.embed(
            x, sampler, nb.nodes.reshape(-1), nb.times.reshape(-1), layer - 1, self.expand_context(ctx, self.k)
        )
        h_nbr = h_nbr.view(b, self.k, -1)
        dt = times.cpu().double().unsqueeze(1) - nb.times
        phi0 = self.phi(torch.zeros(b, device=h_self.device, dtype=h_self.dtype))
        out = self.layers[layer - 1](h_self, phi0, h_nbr, self.phi(dt.to(h_self.device)), nb.mask.to(h_self.device))
        return out, nb, h_nbr

    def forward(self, x: Tensor, sampler: TemporalNeighborSampler, nodes: Tensor, times: Tensor) -> Tensor:
        """``[B, D]`` embeddings of ``nodes`` at ``times`` (only events strictly before each time are used)."""
        return self.embed(x, sampler, nodes, times, ctx=self.context(sampler, nodes, times))[0]

    def subtree(
        self,
        x: Tensor,
        sampler: TemporalNeighborSampler,
        nodes: Tensor,
        times: Tensor,
        neighbours: str = "states",
    ) -> tuple[Tensor, Tensor]:
        """Depth-1 temporal subtree of each query, as N-ForGOT's discrepancy term reads it.

        Args:
            neighbours: what the ``k`` neighbour rows hold.
                * ``states`` (default; the official composition, ``forward_with_neighbors`` of the released TGAT):
                  the neighbours' layer-``(L-1)`` states that the top attention layer read, **without gradient**.
                  For the official 1-layer TGAT these are the raw input features, constant in the parameters, so
                  the discrepancy can move only the node's own embedding (the last row); here ``h^0 = W_in x``
                  (+ the memory for TGN), detached to keep that property.
                * ``reembed``: each neighbour re-embedded by the full encoder at its own event time, with gradient
                  (an ablation: every row is trainable, so the discrepancy can move the whole
                  neighbourhood).

        Returns:
            ``h [B, D]`` (the node's embedding) and ``S [B, k + 1, D]``: the ``k`` neighbour rows (zeros where
            padded), then the node's own embedding.
        """
        if neighbours not in SUBTREE_NEIGHBOURS:
            raise ValueError(f"neighbours={neighbours!r} must be one of {list(SUBTREE_NEIGHBOURS)}")
        ctx = self.context(sampler, nodes, times)
        b = nodes.numel()
        if neighbours == "states":
            h, nb, h_nbr = self._embed_with_neighbors(x, sampler, nodes, times, ctx=ctx)
            h_nbr = h_nbr.detach()
        else:
            h, nb = self.embed(x, sampler, nodes, times, ctx=ctx)
            h_nbr, _ = self.embed(
                x, sampler, nb.nodes.reshape(-1), nb.times.reshape(-1), ctx=self.expand_context(ctx, self.k)
            )
            h_nbr = h_nbr.view(b, self.k, -1)
        h_nbr = h_nbr * nb.mask.unsqueeze(-1).to(device=h.device, dtype=h.dtype)
        return h, torch.cat([h_nbr, h.unsqueeze(1)], 1)
