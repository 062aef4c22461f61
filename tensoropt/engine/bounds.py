"""Lower bounds on a cost graph's frontier, cheap enough to decide whether to solve it at all.

For weights ``(a_j, b_j) >= 0`` the least ``a_j·T + b_j·M`` over all assignments, ``c_j``,
is a min-sum problem: one number per joint configuration instead of a frontier, solved for
every weight at once by dense variable elimination (the same folding order as the frontier
search, ``elimination.plan_elimination``). Every assignment then satisfies
``a_j·T + b_j·M >= c_j`` for every ``j``: the frontier lies on or above the lower convex
envelope those lines draw, and no plan that needs memory at most ``B`` is faster than
``max_j (c_j - b_j·B) / a_j`` (:meth:`LowerBound.time_within`). Weight (1, 0) gives the least
time, (0, 1) the least memory, exactly.

:func:`dominated` decides whether a frontier already found leaves any room below such a
bound; a search skips a problem it leaves none.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .blocks import chain_layout
from .costgraph import CostGraph
from .elimination import plan_elimination
from .native import kernels
from .pareto import pareto

__all__ = ["Ceiling", "LowerBound", "lower_bound", "dominated", "WEIGHTS"]

# relative weights of memory against time, scaled by the graph's own time/memory ratio
WEIGHTS = (1 / 64, 1 / 16, 1 / 4, 1.0, 4.0, 16.0, 64.0)
# a bound is lowered, and a found point raised, by this much before they are compared: the
# bound's sums run in another order than the exact prices, and a tie must never prune
_SLACK = 1e-9


@dataclass(frozen=True)
class LowerBound:
    """``a_j·T + b_j·M >= c_j`` for every assignment, per row ``j`` of ``lines`` (a, b, c)."""
    lines: np.ndarray                     # (L, 3)
    time_min: float
    memory_min: float

    def time_within(self, budget: float) -> float:
        """No assignment with memory <= ``budget`` takes less time than this (inf: none fits)."""
        if budget < self.memory_min:
            return float("inf")
        if budget == float("inf"):
            return self.time_min
        a, b, c = self.lines.T
        timed = a > 0
        return float(max(self.time_min, np.max((c[timed] - b[timed] * budget) / a[timed], initial=0.0)))

    def faster_by(self, seconds: float) -> "LowerBound":
        """The bound of the same plans, some of which may take up to ``seconds`` less."""
        lines = self.lines.copy()
        lines[:, 2] -= lines[:, 0] * seconds
        return LowerBound(lines, self.time_min - seconds, self.memory_min)

    def shifted(self, memory: float) -> "LowerBound":
        """The bound of the same plans holding ``memory`` more bytes each."""
        lines = self.lines.copy()
        lines[:, 2] += lines[:, 1] * memory
        return LowerBound(lines, self.time_min, self.memory_min + memory)


def lower_bound(graph: CostGraph, weights: Sequence[float] = WEIGHTS) -> LowerBound:
    t_scale = sum(float(c[:, 0].min()) for c in graph.node_costs) or 1.0
    m_scale = sum(float(c[:, 1].min()) for c in graph.node_costs) or 1.0
    ab = np.array([(1.0, 0.0), (0.0, 1.0)] + [(1.0, w * t_scale / m_scale) for w in weights])
    c = _min_sums(graph, ab) * (1 - _SLACK)
    return LowerBound(np.column_stack([ab, c]), float(c[0]), float(c[1]))


def dominated(time_within: Callable[[float], float], memory_min: float, found: np.ndarray) -> bool:
    """Whether every plan of a bound (``time_within(B)``: least time within memory ``B``;
    ``memory_min``: least memory) is dominated by, or ties, a point of ``found`` ((n, 2) time
    and memory, any order). Only strictly: a plan that could tie a found point is not."""
    if not len(found):
        return False
    f = Ceiling(found)                          # the staircase: time ascending, memory descending
    if time_within(float("inf")) <= f.t[0] or memory_min <= f.m[-1]:
        return False
    # room below the staircase lies left of each step: time < next point's, memory < this one's
    return all(time_within(m) > t_next for m, t_next in zip(f.m[:-1], f.t[1:]))


class Ceiling:
    """The frontier found so far, as a bar for partial plans: a plan whose cost one of its
    points strictly dominates (by more than ``_SLACK``) cannot reach the frontier."""

    def __init__(self, found: np.ndarray):
        f = pareto(found) * (1 + _SLACK)          # time ascending, memory strictly descending
        self.t, self.m = f[:, 0], f[:, 1]

    def beats(self, t: np.ndarray, m: np.ndarray) -> np.ndarray:
        """Whether a point strictly dominates each (t, m) (any shape; inf counts as beaten)."""
        # of the points no slower than t, the last has the least memory
        i = np.searchsorted(self.t, t, side="right") - 1
        ft, fm = self.t[np.maximum(i, 0)], self.m[np.maximum(i, 0)]
        return (i >= 0) & (fm <= m) & ((ft < t) | (fm < m))


# the chain's min-plus matrix products cost exits^3 per weight; above this, fold densely
_CHAIN_MAX_CELLS = 5e7


def _min_sums(graph: CostGraph, ab: np.ndarray) -> np.ndarray:
    """Per weight row (a, b): the least a·T + b·M over all assignments. Repeated blocks in
    a chain (``blocks.chain_layout``): one block's table over its exits is solved once, as
    the frontier search solves its template, then raised to a min-plus matrix power by
    repeated squaring (scalars per weight make a matrix product cheap; the frontier search
    folds its frontiers in one block at a time instead); anything else by dense elimination."""
    sizes = {v: k for v, k in enumerate(graph.n_configs)}
    scopes: list[tuple[int, ...]] = []
    tables: list[np.ndarray] = []
    for v, costs in enumerate(graph.node_costs):
        scopes.append((v,))
        tables.append(costs @ ab.T)                       # (K_v, L)
    for (u, v), costs in graph.edge_costs.items():
        scopes.append((u, v))
        tables.append(costs @ ab.T)                       # (K_u, K_v, L)
    chain = _chain_min_sums(graph, scopes, tables, sizes, len(ab))
    if chain is not None:
        return chain
    return _joint(_eliminate(scopes, tables, sizes, frozenset()), (), sizes, len(ab))


def _chain_min_sums(graph, scopes, tables, sizes, n_w: int) -> np.ndarray | None:
    layout = chain_layout(graph)
    if layout is None:
        return None
    blocks = layout.blocks
    x0, xl = layout.first_exits, layout.last_exits
    x1 = tuple(blocks[1][p] for p in layout.exits)
    r = int(np.prod([sizes[v] for v in x0], dtype=np.int64))
    if r ** 3 * n_w > _CHAIN_MAX_CELLS:
        return None
    chained = {v for b in blocks[1:] for v in b}
    in_b1, from_x0, out_xl = set(blocks[1]), set(x0), set(xl)
    template, outer = [], []
    for i, s in enumerate(scopes):
        if s[-1] in chained:               # a node of blocks 1..L-1, or an edge into one
            if s[-1] in in_b1:
                if not all(v in in_b1 or v in from_x0 for v in s):
                    return None
                template.append(i)         # block 1's; the later blocks' are the same
        elif any(v in chained and v not in out_xl for v in s):
            return None                    # an edge out of the chain not from its last exits
        else:
            outer.append(i)
    # the transfer A(x0, x1): block 1 given the exits before it and its own
    keep = frozenset(x0 + x1)
    a = _joint(_eliminate([scopes[i] for i in template], [tables[i] for i in template], sizes, keep),
               x0 + x1, sizes, n_w).reshape(r, r, n_w)
    # everything outside the chain, as a table over the first exits and the last
    keep = frozenset(x0 + xl)
    v0 = _joint(_eliminate([scopes[i] for i in outer], [tables[i] for i in outer], sizes, keep),
                x0 + xl, sizes, n_w).reshape(r, r, n_w)
    power = _min_plus_power(a, len(blocks) - 1)          # (x0, xl): the chain's least cost
    return (v0 + power).reshape(-1, n_w).min(axis=0)


def _min_plus_power(a: np.ndarray, n: int) -> np.ndarray:
    out, sq = None, a
    while n:
        if n & 1:
            out = sq if out is None else min_plus(out, sq)
        n >>= 1
        if n:
            sq = min_plus(sq, sq)
    return out


def min_plus(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The min-plus product of (r, s, L) and (s, c, L), per trailing index: (r, c, L)."""
    return np.min(p[:, :, None, :] + q[None, :, :, :], axis=1)


def _eliminate(scopes, tables, sizes, keep: frozenset[int]) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """Min-sum variable elimination of every node not in ``keep``: the factors left."""
    plan = plan_elimination(scopes, sizes, keep=keep)
    factors: dict[int, tuple[tuple[int, ...], np.ndarray]] = {i: (s, t) for i, (s, t) in
                                                             enumerate(zip(scopes, tables))}
    for step in plan.steps:
        parts = [factors.pop(i) for i in step.factors]
        scope = tuple(sorted({u for s, _ in parts for u in s}))
        aligned = [_align(t, s, scope, sizes) for s, t in parts]
        axis = scope.index(step.node)
        factors[step.result] = (scope[:axis] + scope[axis + 1:], _sum_min(aligned, scope, axis, sizes))
    return [factors[i] for i in plan.leftover]


# joint tables above this many cells are minimised one configuration of the folded node at a
# time (a table of the rest per step) rather than materialised whole: same result, less memory
_LOOP_CELLS = 1 << 16


def _sum_min(aligned: list[np.ndarray], scope: tuple[int, ...], axis: int, sizes) -> np.ndarray:
    """min over ``axis`` of the sum of ``aligned`` (broadcastable over ``scope``, then weights)."""
    n_w = aligned[0].shape[-1]
    cells = int(np.prod([sizes[v] for v in scope], dtype=np.int64)) * n_w
    aligned = sorted(aligned, key=lambda t: _level(t, axis))
    lib = kernels()
    if lib is not None and cells > _NATIVE_CELLS:
        return _sum_min_native(lib, aligned, scope, axis, sizes)
    if cells <= _LOOP_CELLS:
        return sum(aligned).min(axis=axis)
    rest = tuple(sizes[v] for i, v in enumerate(scope) if i != axis) + (n_w,)
    best = np.full(rest, np.inf)
    acc = np.empty(rest)
    for k in range(sizes[scope[axis]]):
        acc.fill(0.0)
        for t in aligned:
            acc += t[(slice(None),) * axis + (min(k, t.shape[axis] - 1),)]
        np.minimum(best, acc, out=best)
    return best


def _level(table: np.ndarray, axis: int) -> int:
    """The last dim of the scope other than ``axis`` along which ``table`` varies (-1: none).
    Factors summed in this order let the compiled step keep the partial sums of the earlier
    levels while the later dims run; both paths add in the same order."""
    dims = [d for d in range(table.ndim - 1) if d != axis and table.shape[d] > 1]
    return max(dims) - (max(dims) > axis) if dims else -1


# small steps stay in numpy: a call into the kernel has a fixed cost (argument arrays, ctypes)
_NATIVE_CELLS = 1 << 10


def _sum_min_native(lib, aligned: list[np.ndarray], scope: tuple[int, ...], axis: int, sizes) -> np.ndarray:
    """``_sum_min`` by the compiled kernel: the same sums in the same order, without a
    table of the rest per configuration of the folded node."""
    n_w = aligned[0].shape[-1]
    shape = tuple(sizes[v] for v in scope)
    views = [np.broadcast_to(np.asarray(t, dtype=np.float64), shape + (n_w,)) for t in aligned]
    strides = np.array([[s // 8 for s in v.strides] for v in views], dtype=np.int64)
    pointers = (ctypes.c_void_p * len(views))(*[v.ctypes.data for v in views])
    out = np.empty(tuple(n for i, n in enumerate(shape) if i != axis) + (n_w,))
    dims = np.array(shape, dtype=np.int64)
    if lib.min_sum_step(len(shape), dims.ctypes.data, axis, n_w, len(views), pointers,
                        strides.ctypes.data, out.ctypes.data):
        raise MemoryError("min_sum_step: out of memory")
    return out


def _joint(factors, scope: tuple[int, ...], sizes, n_w: int) -> np.ndarray:
    """The factors summed over ``scope`` (each node's configurations along its axis), every
    other node they mention minimised out; shape (*K_scope, n_w)."""
    total = np.zeros(tuple(sizes[v] for v in scope) + (n_w,))
    for s, t in factors:
        extra = tuple(v for v in s if v not in scope)
        if extra:
            t = np.transpose(t, [s.index(v) for v in extra] + [s.index(v) for v in s if v in scope]
                             + [len(s)])
            t = t.reshape((-1,) + t.shape[len(extra):]).min(axis=0)
            s = tuple(v for v in s if v in scope)
        total = total + _align(t, s, scope, sizes)
    return total


def _align(table: np.ndarray, scope: tuple[int, ...], target: tuple[int, ...], sizes) -> np.ndarray:
    """``table`` over ``scope`` (sorted or not) as an array broadcastable over ``target``."""
    order = sorted(range(len(scope)), key=lambda k: target.index(scope[k]))
    t = np.transpose(table, order + [len(scope)])
    shape = [sizes[u] if u in scope else 1 for u in target] + [table.shape[-1]]
    return t.reshape(shape)
