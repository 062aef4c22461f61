"""Choosing the order in which nodes are folded out (symbolically, before any arithmetic).

Nodes with at most two neighbours go first: that is OptCNN's node elimination (one
in-edge, one out-edge → one edge between the neighbours) and leaf elimination; parallel
factors on the same pair of nodes are summed as they meet (edge elimination). What is
left — residual connections, attention's fan-out/fan-in — is folded out by the general
fallback: at each step the node whose neighbourhood table is smallest (the product of
its neighbours' configuration counts; PaSE's GENERATESEQ picks the smallest dependent
set in the same spirit), ties to the fewest neighbours, then the lowest index.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    node: int                    # the node folded out
    factors: tuple[int, ...]     # ids of the factors it touches, combined in this order
    result: int                  # id of the factor it leaves


@dataclass(frozen=True)
class EliminationPlan:
    steps: tuple[Step, ...]
    leftover: tuple[int, ...]    # factor ids over kept nodes only (or scalars), combined at the end
    depth: int                   # prunes on the longest leaf-to-root path of the final factor
    max_table: int               # largest number of joint configurations of one intermediate factor


def plan_elimination(
    scopes: list[tuple[int, ...]],
    sizes: dict[int, int],
    depths: list[int] | None = None,
    keep: frozenset[int] = frozenset(),
) -> EliminationPlan:
    """Order the folding of every node not in ``keep``; factor ``i`` has scope ``scopes[i]``."""
    scopes = list(scopes)
    depths = list(depths) if depths is not None else [0] * len(scopes)
    alive = set(range(len(scopes)))
    touching: dict[int, set[int]] = {v: set() for v in sizes}
    for i, s in enumerate(scopes):
        for v in s:
            touching[v].add(i)
    todo = {v for v in sizes if v not in keep}
    heap = [_priority(v, touching, scopes, sizes) for v in todo]
    heapq.heapify(heap)
    steps: list[Step] = []
    max_table = 1
    while todo:
        prio = heapq.heappop(heap)
        node = prio[-1]
        if node not in todo or prio != _priority(node, touching, scopes, sizes):
            continue  # stale entry: a fresher one is in the heap
        todo.remove(node)
        fs = sorted(touching[node], key=lambda i: (len(scopes[i]), i))
        if not fs:
            continue
        new_scope = tuple(sorted({u for i in fs for u in scopes[i]} - {node}))
        # Combining fs one after another: each combine is one prune on the path.
        depth = depths[fs[0]] if fs else 0
        for i in fs[1:]:
            depth = max(depth, depths[i]) + 1
        depth = depth + 1 if len(fs) == 1 else depth
        table = sizes[node]
        for u in new_scope:
            table *= sizes[u]
        max_table = max(max_table, table)
        result = len(scopes)
        scopes.append(new_scope)
        depths.append(depth)
        for i in fs:
            alive.discard(i)
            for u in scopes[i]:
                touching[u].discard(i)
        for u in new_scope:
            touching[u].add(result)
        alive.add(result)
        steps.append(Step(node, tuple(fs), result))
        for u in new_scope:
            if u in todo:
                heapq.heappush(heap, _priority(u, touching, scopes, sizes))
    leftover = tuple(sorted(alive))
    final_depth = max((depths[i] for i in leftover), default=0) + max(len(leftover) - 1, 0)
    return EliminationPlan(tuple(steps), leftover, final_depth, max_table)


def _priority(v, touching, scopes, sizes):
    nbrs = {u for i in touching[v] for u in scopes[i]} - {v}
    table = 1
    for u in nbrs:
        table *= sizes[u]
    return (len(nbrs) > 2, table, len(nbrs), v)
