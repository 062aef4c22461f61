"""Frontier Tracking: the exact (time, memory) Pareto frontier of a cost graph.

Problem. Node ``v`` picks configuration ``c_v``; an assignment costs
``T = Σ_v t_v(c_v) + Σ_(u,v) t_uv(c_u, c_v)`` and likewise ``M``. We want every
assignment whose (T, M) no other assignment beats in both, and one assignment per point.

Recurrence. Costs are sums of node and edge terms, so folding a node ``x`` out of the
factors ``f_1..f_r`` that mention it gives a factor over their other nodes ``S``:

    F(s) = ∪_{c_x} [ f_1(s, c_x) ⊕ … ⊕ f_r(s, c_x) ]        for every joint configuration s of S

where ⊕ is the series sum of frontiers and ∪ the choice (both prune dominated points;
``pareto.py``). With one in-edge and one out-edge this is OptCNN's node elimination,
``F(c_i, c_k) = ∪_{c_j} E1(c_i, c_j) ⊕ N(c_j) ⊕ E2(c_j, c_k)``; factors on the same pair
merge by ⊕ (edge elimination). Folding every node in turn leaves the frontier of the
whole graph. Where each step lives:

1. drop dominated configurations (``dominance.dominated_free_configs``);
2. repeated blocks become one chain factor A^(L-1) by repeated squaring (``blocks``,
   :func:`_chain_factor`);
3. order the folding — OptCNN's eliminations first, then the smallest-neighbourhood
   fallback for residuals and fan-outs (``elimination.plan_elimination``);
4. fold, keeping back-pointers (``factors.combine``);
5. walk the back-pointers once per frontier point (``factors.reconstruct``) and check
   each assignment's recomputed cost against its point.

``epsilon > 0`` prunes every combine to a (1+δ) grid in memory with
``δ = (1+ε)^(1/D) − 1``, D the longest chain of prunes to the result: every exact
frontier point is then within a factor (1+ε) in both time and memory of a returned
point, and every returned point is the exact cost of its returned assignment.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from . import factors as fx
from .blocks import ChainLayout, chain_layout
from .costgraph import CostGraph
from .dominance import dominated_free_configs
from .elimination import plan_elimination
from .factors import Factor, SolveTimeout

__all__ = ["solve", "SolveResult", "SolveTimeout"]

_ZERO = fx.leaf((), np.zeros(2))


@dataclass(frozen=True)
class SolveResult:
    points: np.ndarray        # (n, 2): time_s ascending, memory_bytes strictly descending
    assignments: np.ndarray   # (n, n_nodes): the configuration index of each node, per point
    epsilon: float
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.points)


def solve(
    graph: CostGraph,
    *,
    epsilon: float = 0.0,
    time_limit_s: float | None = None,
    progress: bool | None = None,
    use_blocks: bool = True,
    drop_dominated: bool = True,
) -> SolveResult:
    """The Pareto frontier of ``graph``: exact for ``epsilon=0``, else (1+ε)-approximate.

    ``time_limit_s`` raises :class:`SolveTimeout` when exceeded (nothing partial is returned).
    ``progress``: a tqdm bar over the folding steps; None shows it on large graphs at a terminal.
    """
    if not (epsilon >= 0 and np.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    if time_limit_s is not None and not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be positive, got {time_limit_s!r}")
    start = time.monotonic()
    deadline = None if time_limit_s is None else start + time_limit_s

    kept = dominated_free_configs(graph) if drop_dominated else [np.arange(k) for k in graph.n_configs]
    g = _restrict(graph, kept)
    layout = chain_layout(g) if use_blocks else None

    sizes = {v: k for v, k in enumerate(g.n_configs)}
    chain = None
    if layout is not None:
        chain = _ChainBuilder(g, layout, sizes)
    leaves, scopes = _leaves(g, layout)
    depths = [0] * len(leaves)
    if chain is not None:
        leaves.append(None)  # the chain factor, built below
        scopes.append(layout.first_exits + layout.last_exits)
        depths.append(chain.depth)
    reduced_sizes = {v: sizes[v] for s in scopes for v in s}
    plan = plan_elimination(scopes, reduced_sizes, depths)
    depth = max(plan.depth, 1)
    delta = (1.0 + epsilon) ** (1.0 / depth) - 1.0 if epsilon > 0 else 0.0

    n_steps = len(plan.steps) + (chain.n_steps if chain else 0)
    show = progress if progress is not None else (n_steps > 2000 and sys.stderr.isatty())
    bar = _progress_bar(n_steps, show)
    try:
        if chain is not None:
            leaves[-1] = chain.build(delta, deadline, bar)
        root = _run(plan, leaves, delta, deadline, bar)
    except SolveTimeout as err:
        raise SolveTimeout(
            f"Frontier search stopped after {time.monotonic() - start:.1f} s (time_limit_s={time_limit_s}) "
            f"at step {bar.n} of {n_steps}: {err}. Raise the limit, pass epsilon > 0 for a smaller "
            "approximate frontier, or shrink the configuration space."
        ) from None
    finally:
        bar.close()

    points, assignments = _read_out(root, g, kept)
    _verify(graph, points, assignments)
    stats = {
        "seconds": time.monotonic() - start,
        "n_steps": n_steps,
        "max_table": plan.max_table,
        "depth": depth,
        "delta": delta,
        "configs_before": int(sum(graph.n_configs)),
        "configs_after": int(sum(len(k) for k in kept)),
        "used_blocks": chain is not None,
    }
    return SolveResult(points, assignments, float(epsilon), stats)


def _restrict(graph: CostGraph, kept: list[np.ndarray]) -> CostGraph:
    nodes = tuple(c[k] for c, k in zip(graph.node_costs, kept))
    edges = {(u, v): t[np.ix_(kept[u], kept[v])] for (u, v), t in graph.edge_costs.items()}
    return CostGraph(graph.names, nodes, edges, graph.blocks)


def _leaves(g: CostGraph, layout: ChainLayout | None):
    """Node and edge factors outside the chain: the chain holds the nodes of blocks 1..L-1
    and every edge into them."""
    chained = {v for block in layout.blocks[1:] for v in block} if layout else set()
    leaves, scopes = [], []
    for v in range(g.n_nodes):
        if v not in chained:
            leaves.append(fx.leaf((v,), g.node_costs[v]))
            scopes.append((v,))
    for (u, v), table in sorted(g.edge_costs.items()):
        if v in chained:
            continue
        leaves.append(fx.leaf((u, v), table))
        scopes.append((u, v))
    return leaves, scopes


def _run(plan, leaves: list, delta: float, deadline, bar, keep_scope: tuple[int, ...] = ()) -> Factor:
    """Carry out an elimination plan; the result's scope is ``keep_scope`` (in that order)."""
    table = list(leaves)
    for step in plan.steps:
        merged = []
        for group in step.groups:
            acc = table[group[0]]
            for i in group[1:]:
                acc = fx.combine(acc, table[i], delta=delta, deadline=deadline)
            merged.append(acc)
        acc = merged[0]
        for f in merged[1:-1]:
            acc = fx.combine(acc, f, delta=delta, deadline=deadline)
        last = merged[-1] if len(merged) > 1 else _ZERO
        table.append(fx.combine(acc, last, eliminate=step.node, delta=delta, deadline=deadline))
        for i in step.factors:
            _release(table[i])
        bar.update(1)
    rest = [table[i] for i in plan.leftover]
    acc = rest[0] if rest else _ZERO
    for f in rest[1:]:
        acc = fx.combine(acc, f, delta=delta, deadline=deadline)
    missing = [v for v in keep_scope if v not in acc.scope]
    if missing:
        raise AssertionError(f"kept nodes {missing} vanished from the result")
    return _permute(acc, keep_scope)


def _release(f: Factor) -> None:
    # Once consumed, a factor is only walked back: its back-pointers and width suffice.
    if f.kind == "combine" and f.t is not None:
        f.extra["width"] = f.width
        f.t = f.m = None


def _permute(f: Factor, scope: tuple[int, ...]) -> Factor:
    if f.scope == scope:
        return f
    perm = [f.scope.index(v) for v in scope] + [len(f.scope)]
    return Factor(scope, f.t.transpose(perm), f.m.transpose(perm), f.src.transpose(perm), f.kind,
                  f.inputs, f.eliminated, f.depth, f.extra)


class _ChainBuilder:
    """Blocks 1..L-1 as one factor over (first-block exits, last-block exits)."""

    def __init__(self, g: CostGraph, layout: ChainLayout, sizes: dict[int, int]):
        self.g, self.layout = g, layout
        b0, b1 = layout.blocks[0], layout.blocks[1]
        self.x0 = layout.first_exits
        self.x1 = tuple(b1[p] for p in layout.exits)
        leaves, scopes = [], []
        for v in b1:
            leaves.append(fx.leaf((v,), g.node_costs[v]))
            scopes.append((v,))
        for v in self.x0:  # so every exit of block 0 is in the template's scope
            leaves.append(fx.leaf((v,), np.zeros((sizes[v], 2))))
            scopes.append((v,))
        in_b1 = set(b1)
        for (u, v), table in sorted(g.edge_costs.items()):
            if v in in_b1 and (u in in_b1 or u in self.x0):
                leaves.append(fx.leaf((u, v), table))
                scopes.append((u, v))
        self.template_leaves = leaves
        self.template_sizes = {v: sizes[v] for s in scopes for v in s}
        self.plan = plan_elimination(scopes, self.template_sizes, keep=frozenset(self.x0 + self.x1))
        self.n = len(layout.blocks) - 1
        self.bits = [k for k in range(self.n.bit_length()) if self.n >> k & 1]
        n_squarings = self.n.bit_length() - 1
        self.n_steps = len(self.plan.steps) + n_squarings + len(self.bits) - 1
        d = self.plan.depth
        powers = [d]
        for _ in range(n_squarings):
            powers.append(powers[-1] + 1)
        acc = None
        for k in reversed(self.bits):
            acc = powers[k] if acc is None else max(acc, powers[k]) + 1
        self.depth = acc
        self.pos0 = {v: p for p, v in enumerate(b0)}
        self.pos1 = {v: p for p, v in enumerate(b1)}

    def build(self, delta, deadline, bar) -> Factor:
        template = _run(self.plan, self.template_leaves, delta, deadline, bar, keep_scope=self.x0 + self.x1)
        kx = tuple(self.template_sizes[v] for v in self.x0)
        r = int(np.prod(kx, dtype=np.int64))
        base = _Pow(_as_matrix(template, r), 1, template=template)
        powers = [base]
        for _ in range(self.n.bit_length() - 1):
            powers.append(_mul(powers[-1], powers[-1], delta, deadline))
            bar.update(1)
        top = None
        for k in reversed(self.bits):
            if top is None:
                top = powers[k]
            else:
                top = _mul(top, powers[k], delta, deadline)
                bar.update(1)
        shape = kx + kx + (top.f.width,)
        t = top.f.t.reshape(shape)
        m = top.f.m.reshape(shape)
        src = np.broadcast_to(np.arange(top.f.width), shape)
        scope = self.layout.first_exits + self.layout.last_exits

        def unfold(ctx, point, assignment, _stack):
            a = int(np.ravel_multi_index(tuple(ctx[v] for v in self.layout.first_exits), kx))
            c = int(np.ravel_multi_index(tuple(ctx[v] for v in self.layout.last_exits), kx))
            self._unfold(top, 0, a, c, point, kx, assignment)

        return Factor(scope, t, m, src, "chain", (), None, top.f.depth, {"reconstruct": unfold})

    def _unfold(self, node: "_Pow", offset: int, a: int, c: int, point: int, kx, assignment) -> None:
        blocks = self.layout.blocks
        if node.template is not None:
            local = dict(zip(self.x0, np.unravel_index(a, kx)))
            local.update(zip(self.x1, np.unravel_index(c, kx)))
            local = {v: int(x) for v, x in local.items()}
            fx.reconstruct(node.template, point, local)
            for v, conf in local.items():
                real = blocks[offset][self.pos0[v]] if v in self.pos0 else blocks[offset + 1][self.pos1[v]]
                assignment[real] = conf
            return
        code = int(node.f.src[a, c, point])
        wl, wr = node.left.f.width, node.right.f.width
        b, rest = divmod(code, wl * wr)
        i, j = divmod(rest, wr)
        self._unfold(node.left, offset, a, b, i, kx, assignment)
        self._unfold(node.right, offset + node.left.span, b, c, j, kx, assignment)


@dataclass(eq=False)
class _Pow:
    f: Factor                      # scope (-1, -2): joint exit configurations in and out
    span: int                      # blocks covered
    left: "_Pow | None" = None
    right: "_Pow | None" = None
    template: Factor | None = None


def _as_matrix(template: Factor, r: int) -> Factor:
    w = template.width
    return Factor((-1, -2), template.t.reshape(r, r, w), template.m.reshape(r, r, w),
                  template.src.reshape(r, r, w), "matrix", depth=template.depth)


def _mul(x: _Pow, y: _Pow, delta, deadline) -> _Pow:
    left = Factor((-1, -2), x.f.t, x.f.m, x.f.src, "matrix", depth=x.f.depth)
    right = Factor((-2, -3), y.f.t, y.f.m, y.f.src, "matrix", depth=y.f.depth)
    prod = fx.combine(left, right, eliminate=-2, delta=delta, deadline=deadline)
    prod.scope = (-1, -2)
    return _Pow(prod, x.span + y.span, x, y)


def _read_out(root: Factor, g: CostGraph, kept: list[np.ndarray]):
    ok = np.isfinite(root.t)
    points = np.stack([root.t[ok], root.m[ok]], axis=1)
    index = np.flatnonzero(ok)
    assignments = np.empty((len(points), g.n_nodes), dtype=np.int64)
    for row, p in enumerate(index):
        found: dict[int, int] = {}
        fx.reconstruct(root, int(p), found)
        if len(found) != g.n_nodes:
            missing = sorted(set(range(g.n_nodes)) - set(found))[:5]
            raise AssertionError(f"reconstruction left nodes {missing} unassigned")
        local = np.array([found[v] for v in range(g.n_nodes)], dtype=np.int64)
        assignments[row] = [kept[v][c] for v, c in enumerate(local)]
    return points, assignments


def _verify(graph: CostGraph, points: np.ndarray, assignments: np.ndarray) -> None:
    totals = np.zeros_like(points)
    for v, costs in enumerate(graph.node_costs):
        totals += costs[assignments[:, v]]
    for (u, v), table in graph.edge_costs.items():
        totals += table[assignments[:, u], assignments[:, v]]
    scale = np.maximum(np.abs(points), 1e-300)
    if not np.all(np.abs(totals - points) <= 1e-9 * scale + 1e-12):
        bad = int(np.argmax(np.abs(totals - points).max(axis=1)))
        raise AssertionError(f"frontier point {points[bad]} does not match its assignment's cost {totals[bad]}")


def _progress_bar(total: int, show: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not show, desc="frontier search", unit="step", leave=False)
