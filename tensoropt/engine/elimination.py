"""Choosing the order in which nodes are folded out (symbolically, before any arithmetic).

Nodes with at most two neighbours go first: that is OptCNN's node elimination (one
in-edge, one out-edge → one edge between the neighbours) and leaf elimination; parallel
factors on the same pair of nodes are summed as they meet (edge elimination). What is
left — residual connections, attention's fan-out/fan-in — is folded out by the general
fallback. Among candidates the cheapest step goes first: its estimated number of candidate
points, the joint configurations of the node and its neighbours times the summed
(estimated) frontier widths of the factors it touches (PaSE's GENERATESEQ picks the
smallest dependent set in the same spirit); ties to the fewest neighbours, then the
lowest index. Frontier widths are estimated additively (|A ⊕ B| ≈ |A| + |B|, the size of
a Minkowski sum of convex staircases), which keeps wide factors for last.

Within a step the touching factors are combined widest scope first, then those that do
not grow the scope (edge elimination), then the one that grows it least
(:func:`combine_order`); the last combine folds the node out.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    node: int                    # the node folded out
    factors: tuple[int, ...]     # ids of the factors it touches
    result: int                  # id of the factor it leaves
    groups: tuple[tuple[int, ...], ...] = ()  # how they are combined (:func:`combine_order`)


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
    widths: list[int] | None = None,
) -> EliminationPlan:
    """Order the folding of every node not in ``keep``; factor ``i`` has scope ``scopes[i]``
    (and, if given, an estimated frontier width ``widths[i]``, default 1)."""
    scopes = list(scopes)
    depths = list(depths) if depths is not None else [0] * len(scopes)
    widths = list(widths) if widths is not None else [1] * len(scopes)
    alive = set(range(len(scopes)))
    touching: dict[int, set[int]] = {v: set() for v in sizes}
    for i, s in enumerate(scopes):
        for v in s:
            touching[v].add(i)
    todo = {v for v in sizes if v not in keep}
    heap = [_priority(v, touching, scopes, sizes, widths) for v in todo]
    heapq.heapify(heap)
    steps: list[Step] = []
    max_table = 1
    while todo:
        prio = heapq.heappop(heap)
        node = prio[-1]
        if node not in todo or prio != _priority(node, touching, scopes, sizes, widths):
            continue  # stale entry: a fresher one is in the heap
        todo.remove(node)
        if not touching[node]:
            continue
        groups = combine_order(sorted(touching[node]), scopes, widths)
        fs = [i for g in groups for i in g]
        new_scope = tuple(sorted({u for i in fs for u in scopes[i]} - {node}))
        depth = combine_depth(groups, depths)
        table = sizes[node]
        for u in new_scope:
            table *= sizes[u]
        max_table = max(max_table, table)
        result = len(scopes)
        scopes.append(new_scope)
        depths.append(depth)
        widths.append(min(sum(widths[i] for i in fs), _WIDTH_CAP))
        for i in fs:
            alive.discard(i)
            for u in scopes[i]:
                touching[u].discard(i)
        for u in new_scope:
            touching[u].add(result)
        alive.add(result)
        steps.append(Step(node, tuple(fs), result, tuple(tuple(g) for g in groups)))
        for u in new_scope:
            if u in todo:
                heapq.heappush(heap, _priority(u, touching, scopes, sizes, widths))
    leftover = tuple(sorted(alive))
    final_depth = max((depths[i] for i in leftover), default=0) + max(len(leftover) - 1, 0)
    return EliminationPlan(tuple(steps), leftover, final_depth, max_table)


_WIDTH_CAP = 1 << 20


def combine_order(factors: list[int], scopes: list[tuple[int, ...]], widths: list[int]) -> list[list[int]]:
    """How one step combines its factors: groups merged first, then the groups one after
    another (the last combine folds the node out).

    A group holds the factors with one scope (parallel edges: OptCNN's edge elimination)
    plus those whose scope is a subset of it, so no table grows before it has to. Groups
    go widest scope first, then the one that grows the scope least.
    """
    groups: dict[frozenset, list[int]] = {}
    for i in sorted(factors, key=lambda i: (-len(scopes[i]), i)):
        key = frozenset(scopes[i])
        home = [g for g in groups if key <= g]
        if home:
            groups[min(home, key=lambda g: (len(g), sorted(g)))].append(i)
        else:
            groups[key] = [i]
    for g in groups.values():
        g.sort(key=lambda i: (widths[i], i))  # narrow first: the wide factor is summed once
    rest = sorted(groups, key=lambda g: (-len(g), -len(groups[g]), sorted(g)))
    order = [rest.pop(0)]
    union = set(order[0])
    while rest:
        best = min(rest, key=lambda g: (len(g - union), -len(groups[g]), sorted(g)))
        rest.remove(best)
        order.append(best)
        union |= best
    return [groups[g] for g in order]


def combine_depth(groups: list[list[int]], depths: list[int]) -> int:
    """Prunes on the longest path when a step combines these groups (see :func:`combine_order`);
    a single factor is still pruned once, by the fold."""
    group_depths = [_sequential_depth([depths[i] for i in g]) for g in groups]
    depth = _sequential_depth(group_depths)
    return depth + 1 if len(groups) == 1 else depth


def _sequential_depth(depths: list[int]) -> int:
    depth = depths[0]
    for d in depths[1:]:
        depth = max(depth, d) + 1
    return depth


def _priority(v, touching, scopes, sizes, widths):
    nbrs = {u for i in touching[v] for u in scopes[i]} - {v}
    table = sizes[v]
    for u in nbrs:
        table *= sizes[u]
    cost = table * (1 + sum(widths[i] for i in touching[v]))
    return (len(nbrs) > 2, cost, len(nbrs), v)
