"""Temporal-graph building blocks: the leak-free temporal neighbour sampler and the TGAT encoder."""
