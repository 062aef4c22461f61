"""A peak graph with its runs of fixed regions folded into one region each, the same cost
for every assignment.

Nodes with a single configuration are constants. A run of consecutive regions (whole units,
or regions that are units of their own) whose terms, nodes and additive terms read at most
one node with more than one configuration acts on the backward rise as one map

    D' = max(D - H, K)

with ``H`` and ``K`` tables over that node alone (``PeakGraph``'s recurrence: a region
alone gives ``H = held``, ``K = max(view + remat + local, base + remat + rise)``; a unit
gives ``H`` its regions' held summed, ``K`` the largest of each region's ``view + E + local``
less the held of the regions after it in the unit, and ``base + E + rise``, where ``E`` is
the remat summed so far; two maps in a row give ``H1 + H2`` and ``max(K1 - H2, K2)``). Such a
run becomes one region with one held and one local term, and additive terms over the same
nodes are summed into one. A graph whose operators all run one layout, recomputed or not
block by block (FSDP2's ``replicate`` plans: one mode node per block, every other node
fixed), shrinks from a region per operator to one per block; the search does the same work
per region, whatever its terms.

No torch here.
"""

from __future__ import annotations

import numpy as np

from .peakgraph import REGION_KINDS, PeakGraph, Region, SumTerm, Term

__all__ = ["fold_fixed"]

_LOW = -np.inf
# fold only where it removes at least this share of the regions (below, the search's own
# per-region cost is what it was and the fold's is wasted)
MIN_SHARE = 0.25


class _Table:
    """A table over at most one node (``node`` None: a constant)."""

    __slots__ = ("node", "values")

    def __init__(self, node: int | None, values):
        self.node = node
        self.values = np.asarray(values, dtype=np.float64)

    def _pair(self, other: "_Table") -> tuple[int | None, np.ndarray, np.ndarray]:
        if self.node is not None and other.node is not None and self.node != other.node:
            raise AssertionError("tables over two different nodes in one folded run")
        node = self.node if self.node is not None else other.node
        return node, self.values, other.values

    def __add__(self, other: "_Table") -> "_Table":
        node, a, b = self._pair(other)
        return _Table(node, a + b)

    def __sub__(self, other: "_Table") -> "_Table":
        node, a, b = self._pair(other)
        return _Table(node, a - b)

    def max(self, other: "_Table") -> "_Table":
        node, a, b = self._pair(other)
        return _Table(node, np.maximum(a, b))


_ZERO = _Table(None, 0.0)
_NONE = _Table(None, _LOW)


def _multi(graph: PeakGraph, scope) -> set[int]:
    return {v for v in scope if graph.n_configs[v] > 1}


def _squeezed(graph: PeakGraph, term) -> _Table:
    """The term as a table over its one node with several configurations (the others fixed)."""
    if isinstance(term, SumTerm):
        total = _ZERO
        for p in term.parts:
            total = total + _squeezed(graph, p)
        return total
    multi = [v for v in term.scope if graph.n_configs[v] > 1]
    if len(multi) > 1:
        raise AssertionError("a folded term over two nodes with several configurations")
    index = tuple(slice(None) if graph.n_configs[v] > 1 else 0 for v in term.scope)
    return _Table(multi[0] if multi else None, term.table[index])


def _summed(graph: PeakGraph, terms) -> _Table:
    total = _ZERO
    for t in terms:
        total = total + _squeezed(graph, t)
    return total


def _most(graph: PeakGraph, terms) -> _Table:
    out = _NONE
    for t in terms:
        out = out.max(_squeezed(graph, t))
    return out


def _block_map(graph: PeakGraph, first: int, last: int) -> tuple[_Table, _Table]:
    """(H, K) of regions ``first..last``: one region alone, or one whole unit."""
    regs = graph.regions[first:last + 1]
    held = [_summed(graph, r.held) for r in regs]
    after = [_ZERO] * len(regs)                         # held by the unit's later regions
    for i in range(len(regs) - 2, -1, -1):
        after[i] = after[i + 1] + held[i + 1]
    e, top, rise = _ZERO, _NONE, _NONE
    for i, r in enumerate(regs):
        e = e + _summed(graph, r.remat)
        if r.local:
            top = top.max(_summed(graph, r.view) + e + _most(graph, r.local) - after[i])
        if r.rise:
            rise = rise.max(e + _most(graph, r.rise))
    if any(r.rise for r in regs):
        top = top.max(_summed(graph, regs[-1].base) + rise)
    return held[0] + after[0], top


def _term(table: _Table, additive: bool = False) -> Term:
    values = np.array(table.values, dtype=np.float64)
    if table.node is None and values.ndim > (1 if additive else 0):
        raise AssertionError("a constant table with an axis")
    scope = () if table.node is None else (table.node,)
    values.setflags(write=False)
    return Term(scope, values)


def fold_fixed(graph: PeakGraph) -> PeakGraph | None:
    """``graph`` with its runs of fixed regions folded (module docstring), the same
    ``evaluate`` for every assignment up to rounding, or None where that would not remove
    ``MIN_SHARE`` of its regions (or it declares a chain of repeated regions, which the search
    reuses as they are)."""
    if graph.chain or not graph.regions or min(graph.n_configs) > 1:
        return None
    region_of = graph.region_of
    extra: list[set[int]] = [set() for _ in graph.regions]     # additive terms' nodes, by their last region
    for t in graph.additive:
        if t.scope:
            extra[max(region_of[v] for v in t.scope)] |= _multi(graph, t.scope)
    unit_end = {a: b for a, b in graph.units}
    blocks, g = [], 0
    while g < len(graph.regions):
        b = unit_end.get(g, g)
        reads: set[int] = set()
        for r in range(g, b + 1):
            reg = graph.regions[r]
            reads |= _multi(graph, reg.nodes) | extra[r]
            for kind in REGION_KINDS:
                for t in reg.terms(kind):
                    reads |= _multi(graph, t.scope)
        blocks.append((g, b, reads))
        g = b + 1
    # runs of blocks that read one node at most between them, in order, with what they read
    groups: list[tuple[list[tuple[int, int]], set[int]]] = []
    for a, b, reads in blocks:
        if groups and len(groups[-1][1] | reads) <= 1:
            groups[-1][0].append((a, b))
            groups[-1][1].update(reads)
        else:
            groups.append(([(a, b)], set(reads)))
    # a group of one region stays as it is; so does a unit that reads several nodes
    folded = [len(grp) > 1 or (grp[0][1] > grp[0][0] and len(reads) <= 1) for grp, reads in groups]
    n_after = sum(1 if f else grp[0][1] - grp[0][0] + 1 for (grp, _), f in zip(groups, folded))
    if n_after > (1 - MIN_SHARE) * len(graph.regions):
        return None
    regions: list[Region] = []
    units: list[tuple[int, int]] = []
    for (grp, _), fold in zip(groups, folded):
        if not fold:
            a, b = grp[0]
            if b > a:
                units.append((len(regions), len(regions) + b - a))
            regions.extend(graph.regions[a:b + 1])
            continue
        h, k = _ZERO, _NONE
        for a, b in grp:
            h2, k2 = _block_map(graph, a, b)
            h, k = h + h2, (k - h2).max(k2)
        first, last = grp[0][0], grp[-1][1]
        members = graph.regions[first:last + 1]
        nodes = tuple(sorted(v for r in members for v in r.nodes))
        modes = [r.mode for r in members if r.mode is not None]
        mode = modes[0] if len(modes) == 1 else None
        local = (_term(k),) if np.isfinite(k.values).any() else ()
        regions.append(Region(nodes, mode, held=(_term(h),), local=local,
                              name=f"{members[0].name}..{members[-1].name}"))
    sums: dict[int | None, np.ndarray] = {}
    for t in graph.additive:
        if len(_multi(graph, t.scope)) > 1:
            sums = None
            break
        part = _squeezed(graph, t)
        sums[part.node] = sums.get(part.node, 0.0) + part.values
    additive = list(graph.additive) if sums is None else \
        [_term(_Table(node, v), additive=True) for node, v in sums.items()]
    return PeakGraph.build(graph.names, graph.n_configs, additive, regions, exclude=graph.exclude, units=units)
