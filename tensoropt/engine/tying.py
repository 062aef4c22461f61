"""Tied blocks: a smaller search over assignments where groups of repeated blocks agree.

A graph with L identical blocks is cut into ``q`` groups of ``g = L / q`` consecutive
blocks. Every block of a group takes the same configuration at each position, so one
*representative* node stands for the g nodes at its position: its cost is g times theirs,
an edge inside a block becomes g edges, and an edge from block k to block k+1 inside the
group joins two representatives of the same group (g − 1 copies). The tied graph prices
every tied assignment exactly; its frontier is the frontier of that restricted set, a
subset of what the full search may choose, so its points are real plans whose costs are
exact but the frontier may miss points that need neighbouring blocks to differ (with
q = L nothing is tied).

For pipelines and large clusters this keeps a choice per group (e.g. recomputation of
12 of GPT-3's 96 layers at a time) while the search no longer grows with L.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .costgraph import CostGraph

__all__ = ["TiedGraph", "tie_blocks", "group_count"]


def group_count(n_blocks: int, max_groups: int) -> int:
    """The largest divisor of ``n_blocks`` that is at most ``max_groups`` (groups are equal)."""
    if max_groups < 1:
        raise ValueError(f"max_groups must be >= 1, got {max_groups}")
    return max(q for q in range(1, min(n_blocks, max_groups) + 1) if n_blocks % q == 0)


@dataclass(frozen=True)
class TiedGraph:
    graph: CostGraph           # the tied graph
    node_of: np.ndarray        # original node -> tied node
    groups: int
    group_size: int

    def expand(self, assignments: np.ndarray) -> np.ndarray:
        """Tied assignments (n, tied nodes) -> assignments of the original graph (n, nodes)."""
        return np.asarray(assignments)[:, self.node_of]


def tie_blocks(graph: CostGraph, max_groups: int) -> TiedGraph | None:
    """The tied graph with at most ``max_groups`` groups, or None when that ties nothing."""
    blocks = graph.blocks
    if len(blocks) < 2:
        return None
    q = group_count(len(blocks), max_groups)
    if q == len(blocks):
        return None
    g = len(blocks) // q
    rep = np.arange(graph.n_nodes)
    for k, block in enumerate(blocks):
        head = blocks[(k // g) * g]
        rep[list(block)] = head
    kept = np.unique(rep)                      # ascending: a topological order stays one
    new = np.full(graph.n_nodes, -1)
    new[kept] = np.arange(len(kept))
    node_of = new[rep]

    copies = np.bincount(rep, minlength=graph.n_nodes)
    nodes = [(graph.names[v], graph.node_costs[v] * copies[v]) for v in kept]
    costs = [np.array(c, dtype=np.float64) for _, c in nodes]
    edges: dict[tuple[int, int], np.ndarray] = {}
    for (u, v), table in graph.edge_costs.items():
        a, b = int(node_of[u]), int(node_of[v])
        if a == b:                             # both ends are one representative: its diagonal
            costs[a] = costs[a] + np.einsum("iik->ik", table)
            continue
        if a > b:                              # keep edges running forward in the new order
            a, b, table = b, a, table.transpose(1, 0, 2)
        edges[(a, b)] = edges[(a, b)] + table if (a, b) in edges else np.array(table, dtype=np.float64)
    new_blocks = tuple(tuple(int(node_of[v]) for v in blocks[k]) for k in range(0, len(blocks), g))
    named = [(name, c) for (name, _), c in zip(nodes, costs)]
    listed = [(a, b, t) for (a, b), t in edges.items()]
    try:
        tied = CostGraph.build(named, listed, blocks=new_blocks if len(new_blocks) > 1 else ())
    except ValueError:                         # groups joined unevenly: no repeated structure left
        tied = CostGraph.build(named, listed)
    return TiedGraph(tied, node_of, q, g)
