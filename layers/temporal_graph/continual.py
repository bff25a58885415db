"""The open-set class-incremental protocol on a temporal graph (N-ForGOT's ``get_data_old``).

* A node's task is ``label // classes_per_task`` (-1 for unlabelled nodes); an event's task is the larger task of
  its two endpoints, so each task owns the events that touch its classes (events between unlabelled nodes only
  belong to no task). Each task is its own temporal graph with its own neighbour sampler, as in the official code.
* Per task, the labelled nodes are permuted with ``split_seed``; ``train_frac`` (80%) train, the rest split half
  val / half test. Splits are by node, so val/test nodes are never trained on.
* An *example* is (node, event time, task, label) for every endpoint of a task's event whose node has that
  task's class and lies in the split; the encoder embeds the node from events strictly before that time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from layers.temporal_graph.sampler import TemporalNeighborSampler

SPLITS = ("train", "val", "test")


@dataclass
class TemporalGraph:
    """An event stream with node features and (static) node classes.

    Attributes:
        src, dst: ``[E]`` endpoints; ``t``: ``[E]`` float64 times, non-decreasing.
        x: ``[N, F]`` node features; ``y``: ``[N]`` classes (-1 = unlabelled).
        name: where it came from (used in error messages).
    """

    src: Tensor
    dst: Tensor
    t: Tensor
    x: Tensor
    y: Tensor
    name: str = "graph"

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])


@dataclass
class Examples:
    """Classification queries: ``node [M]``, ``t [M]`` (float64), ``task [M]``, ``y [M]``."""

    node: Tensor
    t: Tensor
    task: Tensor
    y: Tensor

    def __len__(self) -> int:
        return int(self.node.numel())

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"node": self.node[i], "t": self.t[i], "task": self.task[i], "y": self.y[i]}

    def subset(self, idx: Tensor) -> Examples:
        return Examples(self.node[idx], self.t[idx], self.task[idx], self.y[idx])

    @staticmethod
    def cat(parts: list[Examples]) -> Examples:
        return Examples(*(torch.cat([getattr(p, f) for p in parts]) for f in ("node", "t", "task", "y")))


@dataclass
class ContinualTemporalGraph:
    """Tasks of new classes over a temporal graph: per-task samplers and train/val/test examples."""

    graph: TemporalGraph
    classes_per_task: int
    num_tasks: int
    samplers: list[TemporalNeighborSampler] = field(default_factory=list)
    examples: list[dict[str, Examples]] = field(default_factory=list)
    task_classes: list[list[int]] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        graph: TemporalGraph,
        classes_per_task: int,
        train_frac: float = 0.8,
        split_seed: int = 42,
        max_train_examples: int | None = None,
        max_eval_examples: int | None = None,
    ) -> ContinualTemporalGraph:
        """Split ``graph`` into tasks; ``max_*_examples`` subsample (seeded, time order kept) per task and split."""
        y = graph.y
        labelled = y >= 0
        num_classes = int(y.max()) + 1
        num_tasks = (num_classes - 1) // classes_per_task + 1
        node_task = torch.where(labelled, y // classes_per_task, torch.full_like(y, -1))
        event_task = torch.maximum(node_task[graph.src], node_task[graph.dst])
        g = torch.Generator().manual_seed(split_seed)
        out = cls(graph, classes_per_task, num_tasks)
        for k in range(num_tasks):
            sel = event_task == k
            src, dst, t = graph.src[sel], graph.dst[sel], graph.t[sel]
            out.samplers.append(TemporalNeighborSampler(graph.num_nodes, src, dst, t))
            nodes = torch.nonzero(node_task == k).view(-1)
            out.task_classes.append(sorted(set(y[nodes].tolist())))
            perm = nodes[torch.randperm(nodes.numel(), generator=g)]
            n_train = int(round(train_frac * nodes.numel()))
            n_val = (nodes.numel() - n_train) // 2
            parts = {"train": perm[:n_train], "val": perm[n_train : n_train + n_val], "test": perm[n_train + n_val :]}
            out.examples.append({})
            for split, members in parts.items():
                in_split = torch.zeros(graph.num_nodes, dtype=torch.bool)
                in_split[members] = True
                qs = []
                for ends in (src, dst):
                    keep = in_split[ends]
                    qs.append((ends[keep], t[keep]))
                node = torch.cat([q[0] for q in qs])
                time = torch.cat([q[1] for q in qs])
                order = torch.argsort(time, stable=True)
                ex = Examples(node[order], time[order], torch.full_like(node, k), y[node[order]])
                cap = max_train_examples if split == "train" else max_eval_examples
                if cap is not None and len(ex) > cap:
                    idx = torch.randperm(len(ex), generator=g)[:cap].sort().values
                    ex = ex.subset(idx)
                out.examples[k][split] = ex
        return out

    @property
    def num_classes(self) -> int:
        return self.num_tasks * self.classes_per_task

    def split(self, task: int, split: str, cumulative: bool = False) -> Examples:
        """Examples of ``task`` (or of tasks ``0..task`` when ``cumulative``) in ``split``."""
        tasks = range(task + 1) if cumulative else [task]
        return Examples.cat([self.examples[k][split] for k in tasks])
