"""Dropping dominated configurations before the search.

Configuration ``c`` of node ``v`` is dominated by ``c'`` when ``c'`` costs no more on the
node itself and on every incident edge, whatever the neighbours choose. Swapping ``c`` for
``c'`` in any assignment then costs no more in either objective, so dropping ``c`` leaves
the frontier unchanged. (Of two configurations with identical costs the lower index stays.)
"""

from __future__ import annotations

import numpy as np

from .costgraph import CostGraph


def dominated_free_configs(graph: CostGraph, max_sweeps: int = 8) -> list[np.ndarray]:
    """Per node, the indices of the configurations that survive, ascending."""
    kept = [np.arange(k) for k in graph.n_configs]
    incident: dict[int, list[tuple[tuple[int, int], int]]] = {v: [] for v in range(graph.n_nodes)}
    for (u, v) in graph.edge_costs:
        incident[u].append(((u, v), 0))
        incident[v].append(((u, v), 1))
    for _ in range(max_sweeps):
        masks = [_dominated_mask(graph, v, kept, incident[v]) for v in range(graph.n_nodes)]
        # Nodes of repeated blocks drop a configuration only if it is dominated in every block,
        # so the blocks stay identical.
        for block_pos in range(len(graph.blocks[0]) if graph.blocks else 0):
            nodes = [block[block_pos] for block in graph.blocks]
            joint = np.logical_and.reduce([masks[v] for v in nodes])
            for v in nodes:
                masks[v] = joint
        changed = False
        for v, mask in enumerate(masks):
            if mask.any():
                kept[v] = kept[v][~mask]
                changed = True
        if not changed:
            break
    return kept


def _dominated_mask(graph, v, kept, incident) -> np.ndarray:
    k = len(kept[v])
    if k == 1:
        return np.zeros(1, dtype=bool)
    parts = [graph.node_costs[v][kept[v]]]
    for (a, b), side in incident:
        table = graph.edge_costs[(a, b)][np.ix_(kept[a], kept[b])]
        rows = table if side == 0 else np.swapaxes(table, 0, 1)
        parts.append(rows.reshape(k, -1))
    vec = np.concatenate(parts, axis=1)  # (k, n_costs)
    leq = (vec[:, None, :] <= vec[None, :, :]).all(axis=-1)  # leq[a, b]: a costs no more than b
    equal = leq & leq.T
    lower = np.arange(k)[:, None] < np.arange(k)[None, :]
    beats = leq & (~equal | lower)
    np.fill_diagonal(beats, False)
    return beats.any(axis=0)
