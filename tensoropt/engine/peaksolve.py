"""The exact (time, peak memory) frontier of a :class:`~tensoropt.engine.peakgraph.PeakGraph`.

The recurrence runs over the regions in order, so the search does too: the state after
region ``g`` is a factor over the nodes of regions ``<= g`` that later terms still read
(the *live* nodes at that cut), and each of its entries is the Pareto set of
``(time, R, A)`` over the assignments of everything before the cut, where ``R`` is the
memory summed so far and ``A = R + D`` (the recurrence's running rise on top of it).
A region's *piece* gives, for every configuration of the live nodes on either side of it,
the Pareto set of ``(t, M, P1, P2)``, ``P1 = M - H`` and ``P2 = M + Y``, and appending it is

    (t + t_g,  R + M_g,  max(A + P1_g, R + P2_g))

since ``R + M + max(D - H, Y) = max(A + (M - H), R + (M + Y))``. The rule is monotone in
every coordinate, so dominated points never lead to a better final ``(time, max(R, A))``
and dropping them is exact. Inside a unit of several regions the state also carries the
unit's rematerialised activations ``E`` and its recomputed forward's highest point ``C*``.

A piece is variable elimination (the fold order of ``elimination.plan_elimination``) over
the region's terms, in coordinates ``(t, M, M - H, X, Z, L, B, C)`` merged by sum or max
as the recurrence says; a mode node's configurations are solved one at a time.

Three refinements keep the sets small without changing any result:

* once ``D`` cannot matter any more it is raised to a floor: after cut ``c`` the final
  ``max(0, D)`` ignores every ``D <= b_c``, where ``b_c`` is a lower bound, over all
  completions, of ``max(H_[c,end], max_g (H_[c,g] + Y_g))`` (from each term's least value);
  a piece's ``Y`` below the floor and its ``H`` beyond what any state's ``D`` needs to fall
  to the floor are raised and capped to those levels, and coordinates that then cannot
  change are left out of its elimination;
* positions that can never rise past that level are left out;
* identical consecutive regions (``PeakGraph.chain``) share one piece;
* runs of regions that read one node with several configurations at most are folded into
  one region first (``peakfold.fold_fixed``: FSDP2 ``replicate`` graphs, every operator in
  one layout, go from a region per operator to one per block); the points found are checked
  against the graph as given.

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
from .peakfold import fold_fixed
from .peakgraph import PeakGraph, SumTerm, Term

__all__ = ["solve_peak", "PeakResult"]

# Coordinates of a piece while its nodes are folded out, and how each merges.
_VE_OPS = {"t": "sum", "M": "sum", "MH": "sum", "AL": "sum", "BE": "sum", "MX": "sum", "Z": "sum", "B": "sum",
           "L": "max", "C": "max", "cls": "and"}
_NEUTRAL = {"sum": 0.0, "max": -np.inf, "and": 1.0}
_KINDS = ("held", "view", "remat", "local", "base", "rise")
# Which coordinates each kind of term adds to (held ones negated), for a region that is a unit
# of its own: P2 = M + Y = max(AL + L, BE + C) with AL = M + Z + X and BE = M + Z + B, sums
# that prune more than Z, X and B apart; and for a region inside a unit, where the state
# carries the unit's remat: (MX = M + X, L, Z, B, C).
_FEEDS = {
    "alone": {"memory": ("M", "MH", "AL", "BE"), "held": ("MH",), "view": ("AL",), "remat": ("AL", "BE"),
              "local": ("L",), "base": ("BE",), "rise": ("C",)},
    "unit": {"memory": ("M", "MH", "MX"), "held": ("MH",), "view": ("MX",), "remat": ("Z",),
             "local": ("L",), "base": ("B",), "rise": ("C",)},
}
_LOW = -np.inf


@dataclass(frozen=True)
class PeakResult:
    points: np.ndarray        # (n, 2): time ascending, peak strictly descending
    assignments: np.ndarray   # (n, n_nodes)
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.points)


def solve_peak(graph: PeakGraph, *, epsilon: float = 0.0, time_limit_s: float | None = None,
               max_candidates: float = float("inf"), max_factor_bytes: float = float("inf")) -> PeakResult:
    """Every assignment whose (time, peak) no other assignment beats, one per point.

    ``epsilon > 0``: after every region the states keep, in each cell of a grid of width
    ``η = ε · P_lb / n`` over (R, A), only their fastest point (``P_lb``: a lower bound of any
    peak, the least of every additive memory term summed; ``n``: the regions). Each drop moves
    R and A by less than η and later steps pass such errors on no larger, so every exact
    frontier point has a returned one no slower whose peak is less than ``ε · P_lb`` above it:
    within a factor (1 + ε); every returned point is its assignment's exact cost.

    ``max_candidates`` (point pairs merged, summed over the search) and ``max_factor_bytes``
    (one factor's points): past either, :class:`~tensoropt.engine.kfactors.SearchTooLarge`."""
    if not (epsilon >= 0 and np.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    start = time.monotonic()
    limits = kf.Limits(None if time_limit_s is None else start + time_limit_s, max_candidates, max_factor_bytes)
    given, folded = graph, fold_fixed(graph)
    graph = folded if folded is not None else graph
    plan = _Layout(graph)
    quantum = epsilon * _peak_lower_bound(graph) / max(len(graph.regions), 1) if epsilon > 0 else 0.0
    grouped = graph.exclude is not None
    state = kf.leaf((), np.array([0.0, 0.0, plan.floor[0]] + ([1.0] if grouped else [])))   # A = R + b_0
    maps = _chain_maps(graph, plan)
    template: kf.KFactor | None = None
    try:
        for g in range(len(graph.regions)):
            unit = plan.unit_of.get(g)
            if unit is not None:
                if g == unit[0]:
                    state = _open_unit(state, grouped)
                piece = _piece(graph, plan, g, limits, in_unit=True)
                rule = _unit_rule(grouped, close=g == unit[1], floor=plan.floor[g + 1])
            else:
                if g in maps and template is not None:
                    piece = _relabel(template, maps[g], plan.floor[g + 1], plan.ceiling[g] - plan.floor[g + 1])
                elif maps and g == graph.chain[1]:
                    # the template serves every region it stands for: the lowest floor, highest ceiling
                    shared = [g] + list(maps)
                    piece = template = _piece(graph, plan, g, limits, min(plan.floor[r + 1] for r in shared),
                                              max(plan.ceiling[r] for r in shared))
                else:
                    piece = _piece(graph, plan, g, limits)
                rule = _fold_rule(grouped, plan.floor[g + 1])
            gone = tuple(v for v in plan.live[g] if v not in plan.live[g + 1])
            state = kf.combine(state, piece, rule, eliminate=gone, limits=limits)
            if quantum > 0 and (g not in plan.unit_of or g == plan.unit_of[g][1]):
                state = _coarsen(state, quantum, grouped)
            plan.widest_state = max(plan.widest_state, state.width)
    except SolveTimeout as err:
        raise SolveTimeout(f"peak frontier search stopped after {time.monotonic() - start:.1f} s "
                           f"(time_limit_s={time_limit_s}): {err}") from None
    vals = state.vals
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
        if len(found) != graph.n_nodes:
            missing = sorted(set(range(graph.n_nodes)) - set(found))[:5]
            raise AssertionError(f"reconstruction left nodes {missing} unassigned")
    assignments = np.column_stack([np.broadcast_to(found[v], (len(points),)) for v in range(graph.n_nodes)]) \
        if len(points) else np.zeros((0, graph.n_nodes), dtype=np.int64)
    _verify(given, points, assignments)
    stats = {"seconds": time.monotonic() - start, "candidates": limits.spent, "regions": len(graph.regions),
             "regions_given": len(given.regions),
             "epsilon": float(epsilon),
             "quantum": quantum,
             "max_live": max((len(s) for s in plan.live), default=0), "widest_piece": plan.widest,
             "widest_state": plan.widest_state, "pieces_reused": len(maps) if template is not None else 0}
    return PeakResult(points, assignments.astype(np.int64), stats)


def _peak_lower_bound(graph: PeakGraph) -> float:
    """No assignment's peak is below this: every additive memory term at its least, summed."""
    return max(sum(float(t.table[..., 1].min()) for t in graph.additive), 0.0)


def _coarsen(state: kf.KFactor, quantum: float, grouped: bool) -> kf.KFactor:
    """Per row, only the fastest point of each (R, A) cell of width ``quantum`` (and group)."""
    vals, src = state.vals, state.src
    dims = vals.shape[:-2]
    flat = vals.reshape(-1, vals.shape[-2], vals.shape[-1])
    fsrc = src.reshape(-1, src.shape[-1])
    keep_rows = []
    for r in range(flat.shape[0]):
        live = np.flatnonzero(np.isfinite(flat[r, :, 0]))
        pts = flat[r, live]
        cells = np.floor(pts[:, 1:3] / quantum)
        key = np.column_stack([cells, pts[:, 3:4]]) if grouped else cells
        order = np.lexsort((pts[:, 2], pts[:, 1], pts[:, 0]))     # fastest first
        _, first = np.unique(key[order], axis=0, return_index=True)
        keep_rows.append(np.sort(live[order[first]]))
    width = max(max((len(k) for k in keep_rows), default=0), 1)
    out_v = np.zeros((flat.shape[0], width, vals.shape[-1]))
    out_v[..., 0] = np.inf
    out_s = np.full((flat.shape[0], width), -1, dtype=np.int64)
    for r, k in enumerate(keep_rows):
        out_v[r, :len(k)] = flat[r, k]
        out_s[r, :len(k)] = fsrc[r, k]
    return kf.KFactor(state.scope, out_v.reshape(dims + (width, vals.shape[-1])), out_s.reshape(dims + (width,)),
                      state.kind, state.inputs, state.eliminated, state.elim_sizes, state.extra)


# ---------------------------------------------------------------------------- layout


class _Layout:
    """Which terms each region's piece holds, the live nodes at every cut, the units, and
    the floors and ceilings of ``D`` at every cut."""

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
            for kind in _KINDS:
                for term in reg.terms(kind):
                    for v in term.scope:
                        last_use[v] = max(last_use[v], g)
        for reg in graph.regions:
            if reg.mode is not None and last_use[reg.mode] != region_of[reg.mode]:
                raise ValueError(f"mode node {graph.names[reg.mode]!r} is read by a later region's term")
        self.live = [tuple(v for v in range(graph.n_nodes) if region_of[v] < c <= last_use[v])
                     for c in range(n_regions + 1)]
        self.unit_of = {g: (a, b) for a, b in graph.units for g in range(a, b + 1)}
        self.variants, self.floor, self.ceiling = _bounds(graph, self.unit_of)
        self.widest = 0
        self.widest_state = 0


@dataclass(frozen=True)
class _Extremes:
    """Bounds of one region variant's terms over its assignments, from each term's extremes:
    its held activations H, and the highest position ``y`` it can reach (``x + z + l`` or
    ``b + z + c``, its remat ``z`` counted whole)."""
    h_min: float
    h_max: float
    y_min: float
    y_max: float
    x_max: float
    z_max: float
    b_max: float
    z_min: float


def _extremes(reg, mode: int | None) -> _Extremes:
    def total(kind, f):
        return sum(f(t, reg.mode, mode) for t in reg.terms(kind))

    def most(kind, f):
        return max((f(t, reg.mode, mode) for t in reg.terms(kind)), default=_LOW)
    x, z, b = (total(k, _high) for k in ("view", "remat", "base"))
    y_min = total("remat", _low) + max(total("view", _low) + most("local", _low),
                                        total("base", _low) + most("rise", _low))
    y_max = z + max(x + most("local", _high), b + most("rise", _high))
    return _Extremes(total("held", _low), total("held", _high), y_min, y_max, x, z, b, total("remat", _low))


def _at_mode(term: Term, mode_node: int | None, mode: int | None) -> np.ndarray:
    """A term's table with the mode node's axis fixed at ``mode`` (as is, if it has none)."""
    if mode is None or mode_node not in term.scope:
        return term.table
    return np.take(term.table, mode, axis=term.scope.index(mode_node))


def _low(term, mode_node, mode) -> float:
    return term.low() if mode is None or mode_node not in term.scope else float(_at_mode(term, mode_node, mode).min())


def _high(term, mode_node, mode) -> float:
    return term.high() if mode is None or mode_node not in term.scope else float(_at_mode(term, mode_node, mode).max())


def _bounds(graph: PeakGraph, unit_of: dict[int, tuple[int, int]]):
    """Per region its variants' :class:`_Extremes`, and the floor and ceiling of ``D`` at
    every cut. Inside a unit of several regions nothing is raised (floor -inf); a unit counts
    as one block whose highest position is bounded with all its remat counted."""
    variants = []
    for reg in graph.regions:
        modes = range(graph.n_configs[reg.mode]) if reg.mode is not None else (None,)
        variants.append({m: _extremes(reg, m) for m in modes})
    n = len(graph.regions)
    blocks, g = [], 0
    while g < n:
        a, b = unit_of.get(g, (g, g))
        blocks.append((a, b))
        g = b + 1
    h_min, y_min, y_max = [], [], []
    for a, b in blocks:
        ext = [variants[g] for g in range(a, b + 1)]
        h_min.append(sum(min(v.h_min for v in e.values()) for e in ext))
        if a == b:
            y_min.append(min(v.y_min for v in ext[0].values()))
            y_max.append(max(v.y_max for v in ext[0].values()))
        else:
            z = sum(max(v.z_max for v in e.values()) for e in ext)
            y_min.append(_LOW)
            y_max.append(max(max(v.y_max for v in e.values()) for e in ext) + z)
    floor = [_LOW] * (n + 1)
    floor[n] = 0.0
    for i in range(len(blocks) - 1, -1, -1):
        held, best = 0.0, _LOW
        for j in range(i, len(blocks)):
            held += h_min[j]
            best = max(best, held + y_min[j])   # H_[c,g] + Y_g
        floor[blocks[i][0]] = max(held, best)   # held is now H_[c,end]
    ceiling = [floor[0]] + [np.inf] * n
    for i, (a, b) in enumerate(blocks):
        ceiling[b + 1] = max(floor[b + 1], ceiling[a] - h_min[i], y_max[i])
    return variants, floor, ceiling


# ---------------------------------------------------------------------------- rules


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


def _open_unit(state: kf.KFactor, grouped: bool) -> kf.KFactor:
    """The state entering a unit: (t, R, A[, g]) -> (t, R, A, E = 0, C* = -inf[, g])."""
    v = state.vals
    extra = np.zeros(v.shape[:-1] + (2,))
    extra[..., 1] = _LOW
    vals = np.concatenate([v[..., :3], extra] + ([v[..., 3:4]] if grouped else []), axis=-1)
    return kf.KFactor(state.scope, vals, state.src, state.kind, state.inputs, state.eliminated,
                      state.elim_sizes, state.extra)


def _unit_rule(grouped: bool, close: bool, floor: float) -> kf.Rule:
    """Inside a unit: state (t, R, A, E, C*) with a piece (t, M, P1, Q = M + X + L, Z, C, B):
    ``E' = E + Z``, ``A' = max(A + P1, R + Q + E')``, ``C*' = max(C*, E' + C)``; at the unit's
    last region ``A`` also takes ``R' + B + C*'`` and the state returns to (t, R, A)."""
    def merge(s: np.ndarray, p: np.ndarray) -> np.ndarray:
        t = s[..., 0] + p[..., 0]
        r = s[..., 1] + p[..., 1]
        e = s[..., 3] + p[..., 4]
        a = np.maximum(s[..., 2] + p[..., 2], s[..., 1] + p[..., 3] + e)
        cs = np.maximum(s[..., 4], e + p[..., 5])
        group = [np.minimum(s[..., 5], p[..., 7])] if grouped else []
        if close:
            a = np.maximum(np.maximum(a, r + p[..., 6] + cs), r + floor)
            return np.stack(np.broadcast_arrays(t, r, a, *group), axis=-1)
        return np.stack(np.broadcast_arrays(t, r, a, e, cs, *group), axis=-1)
    k = (3 if close else 5) + (1 if grouped else 0)
    return kf.Rule(merge, k, k - 1 if grouped else None, native=("unit", (close, floor)))


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


def _piece(graph: PeakGraph, plan: _Layout, g: int, limits: kf.Limits, floor: float | None = None,
           ceiling: float | None = None, in_unit: bool = False) -> kf.KFactor:
    """The region's Pareto sets over the live nodes on both sides: (t, M, M - H, M + Y[, group])
    for a region that is its own unit, (t, M, M - H, M + X + L, Z, C, B[, group]) inside one."""
    reg = graph.regions[g]
    boundary = tuple(sorted(set(plan.live[g]) | set(plan.live[g + 1])))
    grouped = graph.exclude is not None
    floor = plan.floor[g + 1] if floor is None else floor
    ceiling = plan.ceiling[g] if ceiling is None else ceiling
    modes = range(graph.n_configs[reg.mode]) if reg.mode is not None else (None,)
    roots, parts = [], []
    for mode in modes:
        ext = plan.variants[g][mode]
        lift: dict[str, float] = {}
        if in_unit:
            coords = ["t", "M", "MH", "MX"] + [c for c, kind in (("L", "local"), ("Z", "remat"), ("B", "base"),
                                                                  ("C", "rise")) if reg.terms(kind)]
        else:
            coords = ["t", "M"]
            if ceiling - ext.h_min > floor:              # H matters: some state's D minus it can pass the floor
                coords.append("MH")
            if ext.y_max > floor:                       # Y matters: it can pass the floor
                # max-coordinates below these levels leave Y at or under the floor: raised to them
                lift = {"L": floor - ext.x_max - ext.z_max, "C": floor - ext.z_max - ext.b_max}
                if _reaching(reg, "local", mode, lift["L"]):
                    coords += ["AL", "L"]
                if _reaching(reg, "rise", mode, lift["C"]):
                    coords += ["BE", "C"]
        coords = tuple(coords) + (("cls",) if grouped else ())
        rule = _ve_rule(coords)
        leaves = _leaves(graph, plan, g, coords, mode, lift, "unit" if in_unit else "alone")
        root = _eliminate(leaves, boundary, graph.n_configs, rule, limits)
        roots.append(root)
        if in_unit:
            parts.append(_read_out_unit(root.vals, coords, grouped))
        else:
            parts.append(_read_out(root.vals, coords, grouped, floor, ceiling - floor))
    widths = [p.shape[-2] for p in parts]
    offsets = np.cumsum([0] + widths)
    cand = np.concatenate(parts, axis=-2)
    dims = cand.shape[:-2]
    flat = cand.reshape(-1, cand.shape[-2], cand.shape[-1])
    keep = kd_prune(flat, cand.shape[-1] - 1 if grouped else None)
    vals = np.take_along_axis(flat, np.maximum(keep, 0)[..., None], axis=1)
    pad = keep < 0
    vals[pad] = 0.0
    vals[..., 0][pad] = np.inf
    width = keep.shape[1]
    plan.widest = max(plan.widest, width)
    mode_node = reg.mode

    def unfold(ctx, code, assignment, stack=None):
        variant = np.searchsorted(offsets, code, side="right") - 1
        local = code - offsets[variant]
        for vi in np.unique(variant):
            sel = variant == vi
            sub = {v: np.broadcast_to(ctx[v], code.shape)[sel] for v in boundary}
            if mode_node is not None:
                _set(assignment, mode_node, sel, vi, code.shape)
            found = dict(sub)
            kf.reconstruct(roots[vi], local[sel], found)
            for v, c in found.items():
                if v not in boundary:
                    _set(assignment, v, sel, c, code.shape)

    return kf.KFactor(boundary, vals.reshape(dims + (width, vals.shape[-1])), keep.reshape(dims + (width,)),
                      "custom", extra={"reconstruct": unfold})


def _chain_maps(graph: PeakGraph, plan: _Layout) -> dict[int, dict[int, int]]:
    """For each region of the chain after the second whose terms are those of the second
    (``PeakGraph.chain[1]``, the template) moved one block on per block: the map from the
    template's nodes (and its previous block's) to this region's. Regions that differ in any
    table, configuration count, exclusion or live set are left out (solved on their own)."""
    chain = graph.chain
    if len(chain) < 3 or any(g in plan.unit_of for g in chain):
        return {}
    t0 = chain[1]
    out = {}
    regs = graph.regions
    chained = {v for r in chain for v in regs[r].nodes}
    for g in chain[2:]:
        fwd = {}
        ok = len(regs[g].nodes) == len(regs[t0].nodes) and len(regs[g - 1].nodes) == len(regs[t0 - 1].nodes)
        if ok:
            fwd.update(zip(regs[t0].nodes, regs[g].nodes))
            fwd.update(zip(regs[t0 - 1].nodes, regs[g - 1].nodes))
            ok = (regs[g].mode is None) == (regs[t0].mode is None) and \
                (regs[t0].mode is None or fwd[regs[t0].mode] == regs[g].mode)
        if ok:
            ok = all(graph.n_configs[a] == graph.n_configs[b] for a, b in fwd.items())
        if ok and graph.exclude is not None:
            ok = all(np.array_equal(graph.exclude[a], graph.exclude[b]) for a, b in fwd.items())
        if ok:
            m = lambda v: fwd.get(v, None if v in chained else v)  # noqa: E731
            ok = _same_terms(plan.additive[t0], plan.additive[g], m) and all(
                _same_terms(regs[t0].terms(k), regs[g].terms(k), m) for k in _KINDS)
            ok = ok and [m(v) for v in plan.live[t0]] == list(plan.live[g]) \
                and [m(v) for v in plan.live[t0 + 1]] == list(plan.live[g + 1])
        if ok:
            out[g] = fwd
    return out


def _same_terms(a: list, b: list, m) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        px = x.parts if isinstance(x, SumTerm) else (x,)
        py = y.parts if isinstance(y, SumTerm) else (y,)
        if len(px) != len(py) or type(x) is not type(y):
            return False
        for u, w in zip(px, py):
            if tuple(m(v) for v in u.scope) != w.scope or not np.array_equal(u.table, w.table):
                return False
    return True


def _relabel(template: kf.KFactor, fwd: dict[int, int], floor: float, slack: float) -> kf.KFactor:
    """The template's piece over this region's nodes, raised to this region's floor and slack
    (the template was solved with the lowest and highest of those it stands for)."""
    inv = {b: a for a, b in fwd.items()}
    unfold = template.extra["reconstruct"]

    def mapped(ctx, code, assignment, stack=None):
        found: dict[int, np.ndarray] = {}
        unfold({inv.get(v, v): c for v, c in ctx.items()}, code, found)
        for v, c in found.items():
            assignment[fwd.get(v, v)] = c

    vals = template.vals.copy()
    vals[..., 3] = np.maximum(vals[..., 3], vals[..., 1] + floor)
    vals[..., 2] = np.maximum(vals[..., 2], vals[..., 1] - slack)
    return kf.KFactor(tuple(fwd.get(v, v) for v in template.scope), vals, template.src, "custom",
                      extra={"reconstruct": mapped})


def _set(assignment: dict, v: int, sel: np.ndarray, value, shape) -> None:
    cur = assignment.get(v)
    cur = np.zeros(shape, dtype=np.int64) if cur is None else np.array(np.broadcast_to(cur, shape))
    cur[sel] = value
    assignment[v] = cur


def _reaching(reg, kind: str, mode: int | None, lift: float) -> bool:
    """Whether some position term of ``kind`` can rise past ``lift`` in this variant."""
    return any(_high(t, reg.mode, mode) > lift for t in reg.terms(kind))


def _leaves(graph: PeakGraph, plan: _Layout, g: int, coords: tuple[str, ...], mode: int | None,
            lift: dict[str, float], layout: str) -> list[kf.KFactor]:
    reg = graph.regions[g]
    feeds = _FEEDS[layout]
    k = len(coords)
    neutral = np.array([_NEUTRAL[_VE_OPS[c]] for c in coords])
    out = []

    def add(scope, arrays: dict[str, np.ndarray]):
        if mode is not None and reg.mode in scope:
            axis = scope.index(reg.mode)
            arrays = {c: np.take(a, mode, axis=axis) for c, a in arrays.items()}
            scope = scope[:axis] + scope[axis + 1:]
        shape = tuple(graph.n_configs[v] for v in scope)
        vals = np.broadcast_to(neutral, shape + (k,)).copy()
        for c, a in arrays.items():
            vals[..., coords.index(c)] += a if _VE_OPS[c] == "sum" else 0.0
            if _VE_OPS[c] != "sum":
                vals[..., coords.index(c)] = np.maximum(a, lift[c]) if c in lift else a
        out.append(kf.leaf(scope, vals))

    for term in plan.additive[g]:
        arrays = {c: term.table[..., 1] for c in feeds["memory"] if c in coords}
        add(term.scope, {"t": term.table[..., 0], **arrays})
    for kind in _KINDS:
        targets = [c for c in feeds[kind] if c in coords]
        if not targets:
            continue
        for term in reg.terms(kind):
            if kind in ("local", "rise") and targets[0] in lift and _high(term, reg.mode, mode) <= lift[targets[0]]:
                continue        # a position that never rises past the lift cannot matter
            table = term.table
            add(term.scope, {c: -table if kind == "held" else table for c in targets})
    for v in reg.nodes:
        if v == reg.mode:
            continue
        flags = {"cls": graph.exclude[v].astype(float)} if "cls" in coords else {}
        add((v,), flags or {"t": np.zeros(graph.n_configs[v])})
    if "cls" in coords and reg.mode is not None:
        flag = float(graph.exclude[reg.mode][mode])
        out.append(kf.leaf((), np.where(np.array(coords) == "cls", flag, neutral)))
    return out


def _eliminate(leaves: list[kf.KFactor], keep: tuple[int, ...], sizes, rule: kf.Rule, limits: kf.Limits) -> kf.KFactor:
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
                acc = kf.combine(acc, table[i], rule, limits=limits)
            merged.append(acc)
        acc = merged[0]
        for f in merged[1:]:
            acc = kf.combine(acc, f, rule, limits=limits)
        table.append(kf.combine(acc, _unit(rule), rule, eliminate=(step.node,), limits=limits))
        for i in step.factors:
            table[i].release()
    acc = _unit(rule)
    for i in plan.leftover:
        acc = kf.combine(acc, table[i], rule, limits=limits)
    for v in keep:          # every boundary node in the scope, in the boundary's order
        if v not in acc.scope:
            acc = kf.combine(acc, kf.leaf((v,), np.broadcast_to(rule.neutral, (sizes[v], rule.k))),
                             rule, limits=limits)
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


def _coords(vals: np.ndarray, coords: tuple[str, ...]):
    get = {c: vals[..., i] for i, c in enumerate(coords)}
    zero = np.zeros(vals.shape[:-1])
    low = np.full(vals.shape[:-1], _LOW)
    return lambda c: get.get(c, low if _VE_OPS[c] == "max" else zero), get


def _read_out(vals: np.ndarray, coords: tuple[str, ...], grouped: bool, floor: float, slack: float) -> np.ndarray:
    """(t, M, P1, P2[, group]) from the elimination coordinates: ``P1 = M - H`` and
    ``P2 = M + Y = max(AL + L, BE + C)``, with Y raised to the floor and H capped at ``slack``
    (ceiling - floor), beyond which neither changes the next state."""
    c, got = _coords(vals, coords)
    m = c("M")
    low = np.full(m.shape, _LOW)
    p2 = np.maximum(got["AL"] + got["L"] if "AL" in got else low, got["BE"] + got["C"] if "BE" in got else low)
    p2 = np.maximum(p2, m + floor)
    p1 = np.maximum(got["MH"], m - slack) if "MH" in got else m - slack     # absent: H cannot matter
    out = np.stack([c("t"), m, p1, p2] + ([c("cls")] if grouped else []), axis=-1)
    out[..., 0] = np.where(np.isfinite(c("t")), out[..., 0], np.inf)
    return out


def _read_out_unit(vals: np.ndarray, coords: tuple[str, ...], grouped: bool) -> np.ndarray:
    """(t, M, P1, Q, Z, C, B[, group]) inside a unit: ``Q = M + X + L``."""
    c, _ = _coords(vals, coords)
    out = np.stack([c("t"), c("M"), c("MH"), c("MX") + c("L"), c("Z"), c("C"), c("B")]
                   + ([c("cls")] if grouped else []), axis=-1)
    out[..., 0] = np.where(np.isfinite(c("t")), out[..., 0], np.inf)
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
