"""The exact (time, peak memory) frontier of a :class:`~tensoropt.engine.peakgraph.PeakGraph`.

The recurrence runs over the regions in order, so the search does too: the state after
region ``g`` is a factor over the nodes of regions ``<= g`` that later terms still read
(the *live* nodes at that cut), and each of its entries is the Pareto set of
``(time, R, D)`` over the assignments of everything before the cut, where ``R`` is the
memory summed so far and ``D`` the recurrence's running rise. Appending region ``g``
(:func:`_fold_rule`) maps a state point and a point of the region's *piece* to

    (t + t_g,  R + M_g,  max(D - H_g, Y_g)),

which is monotone in every coordinate (non-increasing in ``H_g``), so dominated points
never lead to a better final ``(time, R + max(0, D))`` and dropping them is exact.

A region's piece is the Pareto set of ``(t, M, -H, Y)`` over its own nodes, for every
configuration of the live nodes on either side of it: variable elimination (the fold
order of ``elimination.plan_elimination``) over its terms, with coordinates
``(t, M, -H, X, L, B, C)`` merged by sum or max as the recurrence says, read out as
``Y = X + max(L, B + C)``; a mode node's configurations are solved one at a time.

Two refinements keep the sets small without changing any result:

* once ``D`` cannot matter any more, it is raised to a floor: after cut ``c`` the final
  ``max(0, D)`` ignores every ``D <= b_c``, where ``b_c`` is a lower bound, over all
  completions, of ``max(H_[c,end], max_g (H_[c,g] + Y_g))`` (from each term's least value);
* identical consecutive regions (``PeakGraph.chain``) share one piece.

With ``PeakGraph.exclude`` every point also carries whether all its nodes took a marked
configuration so far (a group: points of different groups never prune each other), and
the excluded combination is dropped at the end. No torch here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from . import kfactors as kf
from .elimination import plan_elimination
from .factors import SolveTimeout
from .kprune import kd_prune
from .peakgraph import PeakGraph, Term

__all__ = ["solve_peak", "PeakResult"]

# Coordinates of a piece while its nodes are folded out, and how each merges.
_VE_COORDS = ("t", "M", "MH", "X", "L", "B", "C")
_VE_OPS = {"t": "sum", "M": "sum", "MH": "sum", "X": "sum", "L": "max", "B": "sum", "C": "max", "cls": "and"}
_NEUTRAL = {"sum": 0.0, "max": -np.inf, "and": 1.0}
_KIND_COORD = {"held": "MH", "view": "X", "local": "L", "base": "B", "rise": "C"}


@dataclass(frozen=True)
class PeakResult:
    points: np.ndarray        # (n, 2): time ascending, peak strictly descending
    assignments: np.ndarray   # (n, n_nodes)
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.points)


def solve_peak(graph: PeakGraph, *, time_limit_s: float | None = None) -> PeakResult:
    """Every assignment whose (time, peak) no other assignment beats, one per point."""
    start = time.monotonic()
    deadline = None if time_limit_s is None else start + time_limit_s
    plan = _Layout(graph)
    grouped = graph.exclude is not None
    state = kf.leaf((), np.array([0.0, 0.0, plan.floor[0]] + ([1.0] if grouped else [])))   # A = R + b_0
    pieces: dict[int, kf.KFactor] = {}
    try:
        for g in range(len(graph.regions)):
            piece = _piece(graph, plan, g, deadline)
            pieces[g] = piece
            floor = plan.floor[g + 1]
            gone = tuple(v for v in plan.live[g] if v not in plan.live[g + 1])
            state = kf.combine(state, piece, _fold_rule(grouped, floor), eliminate=gone, deadline=deadline)
    except SolveTimeout as err:
        raise SolveTimeout(f"peak frontier search stopped after {time.monotonic() - start:.1f} s "
                           f"(time_limit_s={time_limit_s}): {err}") from None
    vals, src = state.vals, state.src
    ok = np.isfinite(vals[:, 0])
    if grouped:
        ok &= vals[:, 3] == 0.0
    idx = np.flatnonzero(ok)
    peak = np.maximum(vals[idx, 1], vals[idx, 2])          # R + max(0, D) = max(R, A)
    keep = kd_prune(np.column_stack([vals[idx, 0], peak])[None])[0]
    keep = keep[keep >= 0]
    points = np.column_stack([vals[idx[keep], 0], peak[keep]])
    found: dict[int, np.ndarray] = {}
    if len(points):
        kf.reconstruct(state, idx[keep], found)
    if len(points) and len(found) != graph.n_nodes:
        missing = sorted(set(range(graph.n_nodes)) - set(found))[:5]
        raise AssertionError(f"reconstruction left nodes {missing} unassigned")
    assignments = np.column_stack([np.broadcast_to(found[v], (len(points),)) for v in range(graph.n_nodes)]) \
        if len(points) else np.zeros((0, graph.n_nodes), dtype=np.int64)
    _verify(graph, points, assignments)
    stats = {"seconds": time.monotonic() - start, "regions": len(graph.regions),
             "max_live": max((len(s) for s in plan.live), default=0),
             "widest_state": plan.widest}
    return PeakResult(points, assignments.astype(np.int64), stats)


# ---------------------------------------------------------------------------- layout


class _Layout:
    """Which terms each region's piece holds, the live nodes at every cut and the floors."""

    def __init__(self, graph: PeakGraph):
        n_regions = len(graph.regions)
        region_of = graph.region_of
        self.additive: list[list[Term]] = [[] for _ in range(n_regions)]
        last_use = list(region_of)
        for term in graph.additive:
            g = max((region_of[v] for v in term.scope), default=0)
            self.additive[g].append(term)
            for v in term.scope:
                last_use[v] = max(last_use[v], g)
        for g, reg in enumerate(graph.regions):
            for kind in _KIND_COORD:
                for term in reg.terms(kind):
                    for v in term.scope:
                        last_use[v] = max(last_use[v], g)
        for reg in graph.regions:
            if reg.mode is not None and last_use[reg.mode] != region_of[reg.mode]:
                raise ValueError(f"mode node {graph.names[reg.mode]!r} is read by a later region's term")
        self.live = [tuple(v for v in range(graph.n_nodes) if region_of[v] < c <= last_use[v])
                     for c in range(n_regions + 1)]
        self.bounds = _bounds(graph)
        self.floor = self.bounds.floor
        self.widest = 0


@dataclass(frozen=True)
class _Extremes:
    """Bounds of one region variant's H and Y over its assignments, from each term's extremes."""
    h_min: float
    h_max: float
    y_min: float
    y_max: float
    x_max: float
    b_max: float


@dataclass(frozen=True)
class _Bounds:
    """Per region and variant (mode configuration) its :class:`_Extremes`, and per cut ``c``:
    ``floor[c]`` (``b_c``: a ``D`` at or below it cannot change any final result) and
    ``ceiling[c]``, an upper bound of the state's ``D`` there (after raising to the floor)."""
    variants: list[dict]
    floor: list[float]
    ceiling: list[float]


def _extremes(reg, mode: int | None) -> _Extremes:
    low = -np.inf

    def tables(kind):
        return [_at_mode(t, reg.mode, mode) for t in reg.terms(kind)]

    def total(kind, f):
        return sum(float(f(t)) for t in tables(kind))

    def most(kind, f):
        return max((float(f(t)) for t in tables(kind)), default=low)
    x_max, b_max = total("view", np.max), total("base", np.max)
    y_min = total("view", np.min) + max(most("local", np.min), total("base", np.min) + most("rise", np.min))
    y_max = x_max + max(most("local", np.max), b_max + most("rise", np.max))
    return _Extremes(total("held", np.min), total("held", np.max), y_min, y_max, x_max, b_max)


def _at_mode(term: Term, mode_node: int | None, mode: int | None) -> np.ndarray:
    """A term's table with the mode node's axis fixed at ``mode`` (as is, if it has none)."""
    if mode is None or mode_node not in term.scope:
        return term.table
    return np.take(term.table, mode, axis=term.scope.index(mode_node))


def _bounds(graph: PeakGraph) -> _Bounds:
    variants = []
    for reg in graph.regions:
        modes = range(graph.n_configs[reg.mode]) if reg.mode is not None else (None,)
        variants.append({m: _extremes(reg, m) for m in modes})
    h_min = [min(v.h_min for v in var.values()) for var in variants]
    y_min = [min(v.y_min for v in var.values()) for var in variants]
    y_max = [max(v.y_max for v in var.values()) for var in variants]
    n = len(graph.regions)
    floor = [0.0] * (n + 1)
    for c in range(n - 1, -1, -1):
        held, best = 0.0, -np.inf
        for g in range(c, n):
            held += h_min[g]
            best = max(best, held + y_min[g])   # H_[c,g] + Y_g
        floor[c] = max(held, best)              # held is now H_[c,end]
    ceiling = [floor[0]]
    for g in range(n):
        ceiling.append(max(floor[g + 1], ceiling[g] - h_min[g], y_max[g]))
    return _Bounds(variants, floor, ceiling)


def _fold_rule(grouped: bool, floor: float) -> kf.Rule:
    """State (t, R, A) with a piece (t, M, P1, P2): ``A = R + D`` and
    ``R + M + max(D - H, Y) = max(A + (M - H), R + (M + Y))``; then ``D`` is raised to the
    floor of the next cut."""
    def merge(s: np.ndarray, p: np.ndarray) -> np.ndarray:
        t = s[..., 0] + p[..., 0]
        r = s[..., 1] + p[..., 1]
        a = np.maximum(np.maximum(s[..., 2] + p[..., 2], s[..., 1] + p[..., 3]), r + floor)
        cols = [t, r, a] + ([np.minimum(s[..., 3], p[..., 4])] if grouped else [])
        return np.stack(np.broadcast_arrays(*cols), axis=-1)
    return kf.Rule(merge, 4 if grouped else 3, 3 if grouped else None, native=("fold", floor))


def _ve_rule(coords: tuple[str, ...]) -> kf.Rule:
    ops = [_VE_OPS[c] for c in coords]
    sums = [i for i, o in enumerate(ops) if o == "sum"]
    maxs = [i for i, o in enumerate(ops) if o != "sum"]   # max, and "and" on 0/1 as min

    def merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = np.broadcast_arrays(a, b)
        out = np.empty(a.shape)
        out[..., sums] = a[..., sums] + b[..., sums]
        for i in maxs:
            out[..., i] = np.maximum(a[..., i], b[..., i]) if ops[i] == "max" else np.minimum(a[..., i], b[..., i])
        return out
    group = coords.index("cls") if "cls" in coords else None
    codes = [{"sum": 0, "max": 1, "and": 2}[o] for o in ops]
    return kf.Rule(merge, len(coords), group, np.array([_NEUTRAL[o] for o in ops]), native=("coords", codes))


# ---------------------------------------------------------------------------- pieces


def _piece(graph: PeakGraph, plan: _Layout, g: int, deadline) -> kf.KFactor:
    """The region's Pareto sets of (t, M, M - H, M + Y[, group]) over the live nodes on both sides."""
    reg = graph.regions[g]
    boundary = tuple(sorted(set(plan.live[g]) | set(plan.live[g + 1])))
    grouped = graph.exclude is not None
    bd = plan.bounds
    floor, ceiling = bd.floor[g + 1], bd.ceiling[g]
    kinds = {kind: reg.terms(kind) for kind in _KIND_COORD}
    modes = range(graph.n_configs[reg.mode]) if reg.mode is not None else (None,)
    roots, parts = [], []
    for mode in modes:
        ext = bd.variants[g][mode]
        # H matters only if some state's D minus it can pass the floor, Y only if it can
        need = {"MH": ceiling - ext.h_min > floor}
        need.update(dict.fromkeys(("X", "L", "B", "C"), ext.y_max > floor))
        present = [c for c in _VE_COORDS if c in ("t", "M")
                   or (need[c] and any(kinds[k] for k, cc in _KIND_COORD.items() if cc == c))]
        coords = tuple(present) + (("cls",) if grouped else ())
        rule = _ve_rule(coords)
        # max-coordinates below these levels leave Y at or under the floor: raised to them
        lift = {"L": floor - ext.x_max, "C": floor - ext.x_max - ext.b_max}
        leaves = _leaves(graph, plan, g, coords, mode, lift)
        root = _eliminate(leaves, boundary, graph.n_configs, rule, deadline)
        roots.append(root)
        parts.append(_read_out(root.vals, coords, grouped, floor, ceiling - floor))
    widths = [p.shape[-2] for p in parts]
    offsets = np.cumsum([0] + widths)
    cand = np.concatenate(parts, axis=-2)
    dims = cand.shape[:-2]
    flat = cand.reshape(-1, cand.shape[-2], cand.shape[-1])
    keep = kd_prune(flat, 4 if grouped else None)
    vals = np.take_along_axis(flat, np.maximum(keep, 0)[..., None], axis=1)
    pad = keep < 0
    vals[pad] = 0.0
    vals[..., 0][pad] = np.inf
    width = keep.shape[1]
    plan.widest = max(plan.widest, width)
    mode_node = reg.mode

    def unfold(ctx, code, assignment, stack):
        variant = np.searchsorted(offsets, code, side="right") - 1
        local = code - offsets[variant]
        for vi in np.unique(variant):
            sel = variant == vi
            sub = {v: np.broadcast_to(ctx[v], code.shape)[sel] for v in boundary}
            if mode_node is not None:
                assignment.setdefault(mode_node, np.zeros(code.shape, dtype=np.int64))
                _set(assignment, mode_node, sel, vi, code.shape)
            found = dict(sub)
            kf.reconstruct(roots[vi], local[sel], found)
            for v, c in found.items():
                if v not in boundary:
                    _set(assignment, v, sel, c, code.shape)

    return kf.KFactor(boundary, vals.reshape(dims + (width, vals.shape[-1])), keep.reshape(dims + (width,)),
                      "custom", extra={"reconstruct": unfold})


def _set(assignment: dict, v: int, sel: np.ndarray, value, shape) -> None:
    cur = assignment.get(v)
    if cur is None or np.shape(cur) != shape:
        cur = np.zeros(shape, dtype=np.int64) if cur is None else np.array(np.broadcast_to(cur, shape))
    cur = np.array(cur)
    cur[sel] = value
    assignment[v] = cur


def _leaves(graph: PeakGraph, plan: _Layout, g: int, coords: tuple[str, ...], mode: int | None,
            lift: dict[str, float]) -> list[kf.KFactor]:
    reg = graph.regions[g]
    k = len(coords)
    neutral = np.array([_NEUTRAL[_VE_OPS[c]] for c in coords])
    out = []

    def add(term: Term, values: dict[str, np.ndarray]):
        scope, arrays = term.scope, dict(values)
        if mode is not None and reg.mode in scope:
            axis = scope.index(reg.mode)
            arrays = {c: np.take(a, mode, axis=axis) for c, a in arrays.items()}
            scope = scope[:axis] + scope[axis + 1:]
        shape = tuple(graph.n_configs[v] for v in scope)
        vals = np.broadcast_to(neutral, shape + (k,)).copy()
        for c, a in arrays.items():
            if c in coords:
                vals[..., coords.index(c)] = np.maximum(a, lift[c]) if c in lift else a
        out.append(kf.leaf(scope, vals))

    for term in plan.additive[g]:
        add(term, {"t": term.table[..., 0], "M": term.table[..., 1], "MH": term.table[..., 1]})
    for kind, c in _KIND_COORD.items():
        if c not in coords:
            continue
        for term in reg.terms(kind):
            if c in lift and _at_mode(term, reg.mode, mode).max() <= lift[c]:
                continue        # a position that never rises past the lift cannot matter
            add(term, {c: -term.table if c == "MH" else term.table})
    for v in reg.nodes:
        if v == reg.mode:
            continue
        if "cls" in coords:
            add(Term((v,), np.zeros(graph.n_configs[v])), {"cls": graph.exclude[v].astype(float)})
        else:
            add(Term((v,), np.zeros(graph.n_configs[v])), {})
    if "cls" in coords and reg.mode is not None:
        flag = float(graph.exclude[reg.mode][mode])
        out.append(kf.leaf((), np.where(np.array(coords) == "cls", flag, neutral)))
    return out


def _eliminate(leaves: list[kf.KFactor], keep: tuple[int, ...], sizes, rule: kf.Rule, deadline) -> kf.KFactor:
    """Fold every node of the leaves not in ``keep`` out; the factor over ``keep``."""
    scopes = [f.scope for f in leaves]
    used = {v for s in scopes for v in s}
    plan = plan_elimination(scopes, {v: sizes[v] for v in used}, keep=frozenset(keep) & frozenset(used))
    table = list(leaves)
    for step in plan.steps:
        merged = []
        for group in step.groups:
            acc = table[group[0]]
            for i in group[1:]:
                acc = kf.combine(acc, table[i], rule, deadline=deadline)
            merged.append(acc)
        acc = merged[0]
        for f in merged[1:]:
            acc = kf.combine(acc, f, rule, deadline=deadline)
        table.append(kf.combine(acc, _unit(rule), rule, eliminate=(step.node,), deadline=deadline))
        for i in step.factors:
            table[i].release()
    rest = [table[i] for i in plan.leftover]
    acc = _unit(rule)
    for f in rest:
        acc = kf.combine(acc, f, rule, deadline=deadline)
    for v in keep:          # every boundary node in the scope, in the boundary's order
        if v not in acc.scope:
            acc = kf.combine(acc, kf.leaf((v,), np.broadcast_to(rule.neutral, (sizes[v], rule.k))),
                             rule, deadline=deadline)
    if acc.scope != tuple(keep):
        perm = [acc.scope.index(v) for v in keep]
        nd = len(keep)
        acc = kf.KFactor(tuple(keep), np.transpose(acc.vals, perm + [nd, nd + 1]),
                         np.transpose(acc.src, perm + [nd]), acc.kind, acc.inputs, acc.eliminated,
                         acc.elim_sizes, acc.extra)
    return acc


def _unit(rule: kf.Rule) -> kf.KFactor:
    """The factor that merges as the identity: one point, neutral in every coordinate."""
    return kf.leaf((), rule.neutral)


def _read_out(vals: np.ndarray, coords: tuple[str, ...], grouped: bool, floor: float, slack: float) -> np.ndarray:
    """(t, M, P1, P2[, group]) from the elimination coordinates: ``P1 = M - H`` and
    ``P2 = M + Y``, with Y raised to the floor and H capped at ``slack`` (ceiling - floor),
    beyond which neither changes the next state."""
    get = {c: vals[..., i] for i, c in enumerate(coords)}
    zero = np.zeros(vals.shape[:-1])
    low = np.full(vals.shape[:-1], -np.inf)
    m = get["M"]
    y = get.get("X", zero) + np.maximum(get.get("L", low), get.get("B", zero) + get.get("C", low))
    p2 = m + np.maximum(y, floor)
    p1 = np.maximum(get.get("MH", low), m - slack)
    cols = [get["t"], m, p1, p2] + ([get["cls"]] if grouped else [])
    out = np.stack(cols, axis=-1)
    out[..., 0] = np.where(np.isfinite(get["t"]), out[..., 0], np.inf)
    return out


def _verify(graph: PeakGraph, points: np.ndarray, assignments: np.ndarray) -> None:
    if not len(points):
        return
    got = graph.evaluate(assignments)
    want = points
    tol = 1e-9 * np.maximum(np.abs(want), 1.0)
    if not (np.abs(got[:, [0, 2]] - want) <= tol).all():
        bad = int(np.argmax(np.abs(got[:, [0, 2]] - want).max(axis=1)))
        raise AssertionError(f"frontier point {want[bad]} does not match its assignment's "
                             f"(time, peak) {got[bad, [0, 2]]}")
    if graph.excluded(assignments).any():
        raise AssertionError("an excluded assignment reached the frontier")
