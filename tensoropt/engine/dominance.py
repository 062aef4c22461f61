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
    # Repeated blocks and like operators have equal tables: a node whose costs, tables and
    # neighbours' surviving configurations equal one seen before in a sweep gets its mask.
    same: dict = {}
    node_id = [same.setdefault((c.shape, c.tobytes()), len(same)) for c in graph.node_costs]
    edge_id = {e: same.setdefault((t.shape, t.tobytes()), len(same)) for e, t in graph.edge_costs.items()}
    for _ in range(max_sweeps):
        seen: dict = {}
        masks = []
        for v in range(graph.n_nodes):
            key = (node_id[v], kept[v].tobytes(),
                   tuple((edge_id[e], side, kept[e[0]].tobytes(), kept[e[1]].tobytes()) for e, side in incident[v]))
            if key not in seen:
                seen[key] = _dominated_mask(graph, v, kept, incident[v])
            masks.append(seen[key])
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


def surviving_exits(slices: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The exit configurations of a chain of repeated blocks worth keeping, ascending.

    Each slice is a (time, memory) pair of arrays ``(r, w)``: per exit configuration (row) a
    set of points, padded with inf -- the transfer factor into it from one configuration of
    the exit before, out of it to one of the exit after, the factor of what precedes the
    chain, and of what follows it. Exit ``x`` is dropped when another ``y`` does at least as
    well in every slice (each point of ``x``'s row is weakly dominated by one of ``y``'s):
    in any plan, putting ``y`` where ``x`` was costs no more in either objective, whichever
    block it is the exit of, so the frontier stays the same. Of equivalent exits the lowest
    index stays."""
    r = slices[0][0].shape[0]
    good = np.ones((r, r), dtype=bool)          # good[y, x]: y does at least as well as x
    for t, m in slices:
        good &= _rows_dominate(t, m)
    np.fill_diagonal(good, False)
    lower = np.arange(r)[:, None] < np.arange(r)[None, :]
    beaten = (good & (~good.T | lower)).any(axis=0)
    return np.flatnonzero(~beaten)


def _rows_dominate(t: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(r, r): whether every finite point of row x is weakly dominated by a point of row y."""
    r = t.shape[0]
    finite = np.isfinite(t) & np.isfinite(m)
    out = np.zeros((r, r), dtype=bool)
    for y in range(r):
        ok = finite[y]
        if not ok.any():
            out[y] = ~finite.any(axis=1)
            continue
        order = np.argsort(t[y][ok], kind="stable")
        qt = t[y][ok][order]
        qm = np.minimum.accumulate(m[y][ok][order])
        i = np.searchsorted(qt, t, side="right") - 1              # (r, w)
        best = np.where(i >= 0, qm[np.maximum(i, 0)], np.inf)
        out[y] = np.all((best <= m) | ~finite, axis=1)
    return out
