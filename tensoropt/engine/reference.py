"""Reference solvers the Frontier Tracking engine is checked against.

Deliberately simple and independent of the engine's own code (``pareto.py``,
``elimination.py``, ...):

* :func:`pareto_points` — the non-dominated subset of a point set.
* :func:`brute_force_frontier` — the exact (time, memory) Pareto frontier of a
  :class:`~tensoropt.engine.costgraph.CostGraph` by enumerating every assignment
  (vectorised in chunks; only for small graphs).
* :func:`ilp_min_time` / :func:`ilp_min_memory` — one frontier point at a time via an
  Alpa-style integer program solved by HiGHS (``scipy.optimize.milp``); works on graphs
  far too large to enumerate.

Both objectives are minimised. No torch here.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from .costgraph import CostGraph

__all__ = ["pareto_points", "brute_force_frontier", "brute_force_peak_frontier", "ilp_min_time", "ilp_min_memory"]

_CHUNK = 1 << 17  # assignments evaluated per numpy batch in brute_force_frontier


# --------------------------------------------------------------------------- pareto


def _pareto_order(t: np.ndarray, m: np.ndarray, tie: np.ndarray | None = None) -> np.ndarray:
    """Indices of the non-dominated points, by time ascending (memory strictly descending).

    Among equal points the one with the smallest ``tie`` key (default: position) is kept.
    """
    n = t.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    tie = np.arange(n) if tie is None else tie
    order = np.lexsort((tie, m, t))  # time, then memory, then tie key
    ms = m[order]
    best_before = np.empty_like(ms)
    best_before[0] = np.inf
    np.minimum.accumulate(ms[:-1], out=best_before[1:])
    return order[ms < best_before]


def pareto_points(points: np.ndarray) -> np.ndarray:
    """The non-dominated subset of an ``(n, 2)`` array of (time, memory) points.

    Sorted by time ascending, so memory is strictly descending; duplicate points are
    collapsed to one. A point is dropped iff another point is <= in both coordinates and
    differs from it. Returns a new ``(n', 2)`` float64 array (``(0, 2)`` for empty input).
    """
    p = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    if np.isnan(p).any():
        raise ValueError("pareto_points: NaN in input")
    keep = _pareto_order(p[:, 0], p[:, 1])
    return p[keep].copy()


# --------------------------------------------------------------------- brute force


def _edge_items(graph: CostGraph) -> list[tuple[int, int, np.ndarray]]:
    # Same iteration order as CostGraph.cost, so sums are bit-identical to graph.cost(a).
    return [(u, v, t) for (u, v), t in graph.edge_costs.items()]


def brute_force_frontier(graph: CostGraph, max_assignments: int = 2_000_000) -> tuple[np.ndarray, np.ndarray]:
    """The exact Pareto frontier of (total time, total memory) over every assignment.

    Returns ``(points, assignments)``: ``points`` is ``(n, 2)`` sorted by time ascending
    (memory strictly descending); ``assignments[i]`` (shape ``(n, V)``, int64) is the
    lexicographically smallest assignment whose cost equals ``points[i]`` exactly. Costs are
    summed in the same order as :meth:`CostGraph.cost`, so
    ``graph.cost(assignments[i]) == points[i]`` bit for bit.

    Raises ValueError when ``graph.n_assignments > max_assignments``.
    """
    total = graph.n_assignments
    if total > max_assignments:
        raise ValueError(
            f"brute force would enumerate {total:,} assignments, more than max_assignments={max_assignments:,}"
        )
    ks = np.array(graph.n_configs, dtype=np.int64)
    n = graph.n_nodes
    # Mixed radix with node 0 most significant: enumeration order == lexicographic order.
    strides = np.ones(n, dtype=np.int64)
    for v in range(n - 2, -1, -1):
        strides[v] = strides[v + 1] * ks[v + 1]
    edges = _edge_items(graph)

    best_t = np.zeros(0)
    best_m = np.zeros(0)
    best_idx = np.zeros(0, dtype=np.int64)
    for start in range(0, total, _CHUNK):
        idx = np.arange(start, min(start + _CHUNK, total), dtype=np.int64)
        a = (idx[:, None] // strides[None, :]) % ks[None, :]
        cost = np.zeros((idx.shape[0], 2))
        for v in range(n):
            cost += graph.node_costs[v][a[:, v]]
        for u, v, table in edges:
            cost += table[a[:, u], a[:, v]]
        # Merge with the running frontier; the tie key is the assignment's rank.
        t = np.concatenate([best_t, cost[:, 0]])
        m = np.concatenate([best_m, cost[:, 1]])
        rank = np.concatenate([best_idx, idx])
        keep = _pareto_order(t, m, rank)
        best_t, best_m, best_idx = t[keep], m[keep], rank[keep]
    points = np.stack([best_t, best_m], axis=1)
    assignments = (best_idx[:, None] // strides[None, :]) % ks[None, :]
    return points, assignments.astype(np.int64)


def brute_force_peak_frontier(graph, max_assignments: int = 2_000_000) -> tuple[np.ndarray, np.ndarray]:
    """The exact Pareto frontier of (time, peak) of a
    :class:`~tensoropt.engine.peakgraph.PeakGraph` over every assignment it does not exclude,
    each assignment priced by :meth:`PeakGraph.evaluate`. Returns ``(points, assignments)``
    as :func:`brute_force_frontier` does (lexicographically smallest assignment per point)."""
    total = graph.n_assignments
    if total > max_assignments:
        raise ValueError(
            f"brute force would enumerate {total:,} assignments, more than max_assignments={max_assignments:,}"
        )
    ks = np.array(graph.n_configs, dtype=np.int64)
    n = graph.n_nodes
    strides = np.ones(n, dtype=np.int64)
    for v in range(n - 2, -1, -1):
        strides[v] = strides[v + 1] * ks[v + 1]
    best_t, best_m, best_idx = np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64)
    for start in range(0, total, _CHUNK):
        idx = np.arange(start, min(start + _CHUNK, total), dtype=np.int64)
        a = (idx[:, None] // strides[None, :]) % ks[None, :]
        ok = ~graph.excluded(a)
        idx, a = idx[ok], a[ok]
        cost = graph.evaluate(a)
        t = np.concatenate([best_t, cost[:, 0]])
        m = np.concatenate([best_m, cost[:, 2]])
        rank = np.concatenate([best_idx, idx])
        keep = _pareto_order(t, m, rank)
        best_t, best_m, best_idx = t[keep], m[keep], rank[keep]
    points = np.stack([best_t, best_m], axis=1)
    assignments = (best_idx[:, None] // strides[None, :]) % ks[None, :]
    return points, assignments.astype(np.int64)


# ----------------------------------------------------------------------------- ILP


class _Program:
    """The Alpa-style 0/1 program of a cost graph, as sparse arrays.

    Variables: ``x[v, c]`` (one per node configuration, ``sum_c x[v, c] = 1``) then
    ``e[uv, c, d]`` (one per edge configuration pair) with the standard linearisation
    ``sum_d e[uv, c, d] = x[u, c]`` and ``sum_c e[uv, c, d] = x[v, d]``. The ``x`` are
    integral; the ``e`` are left continuous in [0, 1] because with 0/1 ``x`` the two
    marginal constraints force ``e[uv, c, d] = x[u, c] * x[v, d]`` exactly (row ``c*`` sums
    to 1, every column but ``d*`` sums to 0), which makes the program smaller to branch on
    without changing its optimum.
    """

    def __init__(self, graph: CostGraph):
        self.graph = graph
        ks = np.array(graph.n_configs, dtype=np.int64)
        self.x_off = np.concatenate([[0], np.cumsum(ks)])
        n_x = int(self.x_off[-1])
        edges = _edge_items(graph)
        sizes = np.array([ks[u] * ks[v] for u, v, _ in edges], dtype=np.int64)
        e_off = n_x + np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.n_vars = int(e_off[-1])
        self.n_x = n_x

        cost = np.zeros((self.n_vars, 2))
        cost[:n_x] = np.concatenate(graph.node_costs, axis=0)
        for i, (u, v, table) in enumerate(edges):
            cost[e_off[i] : e_off[i + 1]] = table.reshape(-1, 2)
        self.cost = cost

        rows, cols, vals = [], [], []
        # One-hot rows: sum_c x[v, c] = 1.
        n_nodes = graph.n_nodes
        rows.append(np.repeat(np.arange(n_nodes), ks))
        cols.append(np.arange(n_x))
        vals.append(np.ones(n_x))
        r = n_nodes
        for i, (u, v, _) in enumerate(edges):
            ku, kv = int(ks[u]), int(ks[v])
            e = e_off[i] + np.arange(ku * kv).reshape(ku, kv)
            cc, dd = np.meshgrid(np.arange(ku), np.arange(kv), indexing="ij")
            # Row marginals: sum_d e[c, d] - x[u, c] = 0   (rows r .. r+ku-1)
            rows += [r + cc.ravel(), r + np.arange(ku)]
            cols += [e.ravel(), self.x_off[u] + np.arange(ku)]
            vals += [np.ones(ku * kv), -np.ones(ku)]
            r += ku
            # Column marginals: sum_c e[c, d] - x[v, d] = 0   (rows r .. r+kv-1)
            rows += [r + dd.ravel(), r + np.arange(kv)]
            cols += [e.ravel(), self.x_off[v] + np.arange(kv)]
            vals += [np.ones(ku * kv), -np.ones(kv)]
            r += kv
        a_eq = sparse.csr_array(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, self.n_vars)
        )
        b_eq = np.zeros(r)
        b_eq[:n_nodes] = 1.0
        self.eq = LinearConstraint(a_eq, b_eq, b_eq)
        self.integrality = np.zeros(self.n_vars, dtype=np.int8)
        self.integrality[:n_x] = 1
        self.bounds = Bounds(np.zeros(self.n_vars), np.ones(self.n_vars))

    def solve(self, objective: int, memory_budget: float | None, time_limit_s: float | None):
        """Minimise cost column ``objective``; returns (assignment, status, message)."""
        c = self.cost[:, objective]
        scale = float(np.abs(c).max()) or 1.0
        constraints = [self.eq]
        if memory_budget is not None:
            mem = self.cost[:, 1]
            mscale = max(float(np.abs(mem).max()), abs(float(memory_budget))) or 1.0
            row = sparse.csr_array(mem[None, :] / mscale)
            constraints.append(LinearConstraint(row, -np.inf, float(memory_budget) / mscale))
        options = {"mip_rel_gap": 0.0, "presolve": True}
        if time_limit_s is not None:
            options["time_limit"] = float(time_limit_s)
        res = milp(
            c / scale,
            constraints=constraints,
            integrality=self.integrality,
            bounds=self.bounds,
            options=options,
        )
        if res.x is None:
            return None, res.status, res.message
        if res.status != 0:
            warnings.warn(
                f"ILP stopped before proving optimality (status {res.status}: {res.message}); "
                "returning the best assignment found",
                RuntimeWarning,
                stacklevel=3,
            )
        x = res.x[: self.n_x]
        assignment = np.array(
            [int(np.argmax(x[self.x_off[v] : self.x_off[v + 1]])) for v in range(self.graph.n_nodes)],
            dtype=np.int64,
        )
        return assignment, res.status, res.message


def _no_solution(status: int, message: str, time_limit_s: float | None) -> Exception:
    if status == 1:
        return TimeoutError(f"ILP found no feasible solution within time_limit_s={time_limit_s}: {message}")
    return RuntimeError(f"ILP failed (status {status}): {message}")


def ilp_min_memory(graph: CostGraph, time_limit_s: float | None = None) -> tuple[float, float, np.ndarray]:
    """The minimum total memory over all assignments, by ILP.

    Returns ``(time, memory, assignment)`` with the cost recomputed exactly by
    :meth:`CostGraph.cost` (the time is that of whichever min-memory assignment HiGHS
    found; no tie-break on time). With ``time_limit_s`` hit, the best assignment found so
    far is returned (not proven optimal); TimeoutError if none was found.
    """
    prog = _Program(graph)
    assignment, status, message = prog.solve(1, None, time_limit_s)
    if assignment is None:
        raise _no_solution(status, message, time_limit_s)
    t, m = graph.cost(assignment)
    return float(t), float(m), assignment


def ilp_min_time(
    graph: CostGraph, memory_budget: float, time_limit_s: float | None = None
) -> tuple[float, float, np.ndarray]:
    """The minimum total time over assignments with total memory <= ``memory_budget``.

    Alpa-style 0/1 program (see :class:`_Program`) solved by HiGHS with a zero MIP gap.
    Returns ``(time, memory, assignment)`` with the cost recomputed exactly by
    :meth:`CostGraph.cost`; the recomputed memory is guaranteed ``<= memory_budget``
    (should HiGHS' feasibility tolerance admit a point just over the budget, the budget is
    tightened by the overshoot and the program re-solved).

    Raises ValueError when no assignment fits the budget (the message reports the minimum
    achievable memory). With ``time_limit_s`` hit, the best assignment found so far is
    returned (not proven optimal); TimeoutError if none was found.
    """
    prog = _Program(graph)
    budget = float(memory_budget)
    for _ in range(8):
        assignment, status, message = prog.solve(0, budget, time_limit_s)
        if assignment is None:
            if status == 2:  # infeasible
                try:
                    _, min_mem, _ = ilp_min_memory(graph, time_limit_s)
                    detail = f"the minimum achievable memory is {min_mem!r}"
                except Exception:  # pragma: no cover - report what we can
                    detail = "infeasible"
                raise ValueError(
                    f"memory budget {float(memory_budget)!r} is not reachable: {detail}"
                )
            raise _no_solution(status, message, time_limit_s)
        t, m = graph.cost(assignment)
        if m <= memory_budget:
            return float(t), float(m), assignment
        overshoot = m - float(memory_budget)
        budget = budget - overshoot - 1e-9 * max(abs(float(memory_budget)), 1.0)
    raise ValueError(
        f"memory budget {float(memory_budget)!r} is not reachable within the ILP's numerical tolerance"
    )
