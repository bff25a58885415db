"""Baselines GRASS is compared against on ZINC: GINE (Hu et al., 2020) and GraphGPS (Rampasek et al., 2022).

Both read the same typed molecular graphs as :class:`~layers.graph.grass.GrassNet` and predict one number per
graph. GINE uses atom and bond embeddings only (as in the GINE rows of the ZINC tables); GraphGPS adds the
random-walk structural encoding (RWSE = the diagonal of ``T^k``, i.e. the RRWP node encoding) as in its paper,
and mixes a local GINE layer with global multi-head attention through PyG's ``GPSConv``.
"""

from __future__ import annotations

from torch import Tensor, nn
from torch_geometric.nn import GINEConv, GPSConv, global_add_pool

from core.errors import ConfigError
from layers.graph.grass import RunningNorm
from layers.graph.grass_encodings import batched_rrwp


def _gine(dim: int) -> GINEConv:
    return GINEConv(nn.Sequential(nn.Linear(dim, dim), nn.BatchNorm1d(dim), nn.ReLU(), nn.Linear(dim, dim)))


def _head(dim: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim // 2 or 1), nn.ReLU(), nn.Linear(dim // 2 or 1, 1)
    )


class GINENet(nn.Module):
    """GINE stack: ``x <- x + ReLU(BN(GINEConv(x, e)))``, sum pooling and an MLP head.

    Args:
        num_layers: GINE layers.
        dim: Width.
        num_node_types, num_edge_types: Vocabulary sizes.
    """

    def __init__(self, num_layers: int = 8, dim: int = 64, num_node_types: int = 28, num_edge_types: int = 4) -> None:
        super().__init__()
        if num_layers < 1 or dim < 2:
            raise ConfigError(f"GINE num_layers={num_layers} must be >= 1 and dim={dim} >= 2")
        self.node_emb = nn.Embedding(num_node_types, dim)
        self.edge_emb = nn.Embedding(num_edge_types, dim)
        self.convs = nn.ModuleList(_gine(dim) for _ in range(num_layers))
        self.norms = nn.ModuleList(nn.BatchNorm1d(dim) for _ in range(num_layers))
        self.head = _head(dim)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor) -> Tensor:
        """Args as :meth:`GrassNet.forward`. Returns ``[B]``."""
        h = self.node_emb(x.view(-1).long())
        e = self.edge_emb(edge_attr.view(-1).long())
        for conv, norm in zip(self.convs, self.norms):
            h = h + norm(conv(h, edge_index, e)).relu()
        return self.head(global_add_pool(h, batch, int(batch.max()) + 1)).squeeze(-1)


class GPSNet(nn.Module):
    """GraphGPS: ``GPSConv`` layers (local GINE + global multi-head attention), RWSE input, sum pooling.

    Args:
        num_layers: GPS layers.
        dim: Width (divisible by ``heads``).
        heads: Attention heads.
        rwse_steps: Random-walk steps of the RWSE node encoding (0 disables it).
        num_node_types, num_edge_types: Vocabulary sizes.
        dropout: Dropout inside ``GPSConv``.
    """

    def __init__(
        self,
        num_layers: int = 8,
        dim: int = 64,
        heads: int = 4,
        rwse_steps: int = 16,
        num_node_types: int = 28,
        num_edge_types: int = 4,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if num_layers < 1 or heads < 1 or dim % heads:
            raise ConfigError(f"GPS num_layers={num_layers} must be >= 1 and dim={dim} divisible by heads={heads}")
        self.rwse_steps = rwse_steps
        self.node_emb = nn.Embedding(num_node_types, dim)
        self.edge_emb = nn.Embedding(num_edge_types, dim)
        self.rwse = nn.Sequential(RunningNorm(rwse_steps), nn.Linear(rwse_steps, dim)) if rwse_steps > 0 else None
        self.convs = nn.ModuleList(
            GPSConv(dim, _gine(dim), heads=heads, dropout=dropout, attn_type="multihead") for _ in range(num_layers)
        )
        self.head = _head(dim)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor) -> Tensor:
        """Args as :meth:`GrassNet.forward`. Returns ``[B]``."""
        h = self.node_emb(x.view(-1).long())
        if self.rwse is not None:
            node_pe, _, _ = batched_rrwp(edge_index, batch, self.rwse_steps, dtype=h.dtype)
            h = h + self.rwse(node_pe)
        e = self.edge_emb(edge_attr.view(-1).long())
        for conv in self.convs:
            h = conv(h, edge_index, batch, edge_attr=e)
        return self.head(global_add_pool(h, batch, int(batch.max()) + 1)).squeeze(-1)


def count_parameters(module: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
