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
2. order the folding (``elimination.plan_elimination``): cheapest step first — OptCNN's
   node eliminations (≤ 2 neighbours) before the general fallback for residuals and
   fan-outs; within a step, factors on the same nodes merge first (edge elimination,
   ``elimination.combine_order``), carried out by :func:`_run`;
3. fold, keeping back-pointers (``factors.combine``). The union-of-sums at its heart,
   ``∪_c f(s, c) ⊕ g(s, c)``, is ``factors.sum_prune``: compiled (``_kernels.c``,
   ``pareto_sum2``: each row's candidates into a staircase, dominated runs skipped by
   bisection), or in numpy, where wide sums skip segment pairs whose ideal point is
   strictly dominated by real candidates, then prune the rest with ``pareto.prune_rows``
   (one sort by time, ties resolved without sorting);
4. repeated blocks (``blocks.chain_layout``): one block's transfer factor
   ``A(x_{k-1}, x_k)`` is solved once (the template), then folded in block by block,
   ``V_k(x_k) = ∪_{x_{k-1}} V_{k-1}(x_{k-1}) ⊕ A(x_{k-1}, x_k)`` with ``V_0`` the
   factor of everything before the chain (:class:`_ChainBuilder`); exit configurations
   another does at least as well as into and out of every block are dropped first
   (``dominance.surviving_exits``: each step costs the square of their number);
5. walk the back-pointers for all frontier points at once (``factors.reconstruct``)
   and check each assignment's recomputed cost against its point (:func:`_verify`).

``epsilon > 0`` prunes every combine to a grid of memory cells, each ``1+δ`` times the
one below, ``(1+δ)^D = 1+ε`` (``pareto.prune_rows``), keeping the fastest point of each
cell; D is the longest chain of prunes to the result. Costs are not negative, so a factor
whose points each stand within a factor ``1+e`` in memory (no slower) for every exact
partial plan of that factor passes on to a sum of two such factors at most the larger
``e`` of the two; its own prune multiplies by ``1+δ``. So every exact frontier point ``q``
has a returned point ``p`` with ``t_p <= t_q`` and ``m_p <= (1+ε)·m_q``; every returned
point is the exact cost of its returned assignment. (An absolute grid, whose errors add
over every prune below a factor and not only along the longest path, would need cells
divided by the number of combines to hold the same bound.)
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from . import factors as fx
from .blocks import ChainLayout, chain_layout
from .bounds import Ceiling, min_plus
from .costgraph import CostGraph
from .dominance import dominated_free_configs, surviving_exits
from .elimination import plan_elimination
from .factors import Factor, SolveTimeout
from .tying import tie_blocks

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
    block_groups: int | None = None,
    ceiling: np.ndarray | None = None,
) -> SolveResult:
    """The Pareto frontier of ``graph``: exact for ``epsilon=0``, else (1+ε)-approximate.

    ``block_groups``: tie the repeated blocks into at most this many groups of consecutive
    blocks that share one assignment (``tying.py``): a faster search over a restricted
    set, exact over that set (``epsilon=0``); None searches every assignment.

    ``ceiling``: points (time, memory) found elsewhere (another mesh's plans); the frontier
    points one of them strictly dominates are left out, and so is every partial plan, in an
    elimination step (:func:`_run`) or in the repeated blocks' chain
    (:meth:`_ChainBuilder.fold`), that what is still to join cannot lift out from under
    them. What is returned is then exactly the frontier less the points the ceiling
    dominates; ``stats["points_cut"]`` and ``stats["chain_points_cut"]`` count the partial
    plans dropped.

    ``time_limit_s`` raises :class:`SolveTimeout` when exceeded (nothing partial is returned).
    ``progress``: a tqdm bar over the folding steps; None shows it on large graphs at a terminal.
    """
    if not (epsilon >= 0 and np.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    if time_limit_s is not None and not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be positive, got {time_limit_s!r}")
    start = time.monotonic()
    if block_groups is not None:
        tied = tie_blocks(graph, block_groups)
        if tied is not None:
            res = solve(tied.graph, epsilon=epsilon, time_limit_s=time_limit_s, progress=progress,
                        use_blocks=use_blocks, drop_dominated=drop_dominated, ceiling=ceiling)
            assignments = tied.expand(res.assignments)
            _verify(graph, res.points, assignments)
            stats = {**res.stats, "seconds": time.monotonic() - start, "block_groups": tied.groups,
                     "block_group_size": tied.group_size}
            return SolveResult(res.points, assignments, res.epsilon, stats)
    deadline = None if time_limit_s is None else start + time_limit_s
    bar_above = Ceiling(ceiling) if ceiling is not None and len(ceiling) else None

    kept = dominated_free_configs(graph) if drop_dominated else [np.arange(k) for k in graph.n_configs]
    g = _restrict(graph, kept)
    layout = chain_layout(g) if use_blocks else None

    sizes = {v: k for v, k in enumerate(g.n_configs)}
    chain = _ChainBuilder(g, layout, sizes) if layout is not None else None
    leaves, scopes = _leaves(g, layout)
    outer_sizes = {v: sizes[v] for sc in scopes for v in sc}
    keep = chain.outer_keep(outer_sizes) if chain else frozenset()
    plan = plan_elimination(scopes, outer_sizes, keep=keep)
    depth = max(plan.depth + (chain.depth_bound(len(keep)) if chain else 0), 1)
    ratio = float(np.expm1(np.log1p(epsilon) / depth))

    n_steps = len(plan.steps) + (chain.n_steps if chain else 0)
    show = progress if progress is not None else (n_steps > 2000 and sys.stderr.isatty())
    bar = _progress_bar(n_steps, show)
    try:
        outside = _least_outside(g, layout) if bar_above is not None else None
        counts: dict = {}
        rest = _run(plan, leaves, ratio, deadline, bar, bar_above, outside, counts)
        if chain is not None:
            rest = [chain.fold(rest, ratio, deadline, bar, bar_above)]
        root = _fold_all(rest, ratio, deadline)
        if bar_above is not None:
            _cut(root, bar_above, 0.0, 0.0, compact=False)
    except SolveTimeout as err:
        raise SolveTimeout(
            f"Frontier search stopped after {time.monotonic() - start:.1f} s (time_limit_s={time_limit_s}) "
            f"at step {bar.n} of {n_steps}: {err}. Raise the limit, pass epsilon > 0 for a smaller "
            "approximate frontier, or shrink the configuration space."
        ) from None
    finally:
        bar.close()
    if root.depth > depth:
        raise AssertionError(f"{root.depth} prunes on a path, the epsilon split assumed at most {depth}")

    points, assignments = _read_out(root, g, kept)
    _verify(graph, points, assignments)
    stats = {
        "seconds": time.monotonic() - start,
        "n_steps": n_steps,
        "max_table": max(plan.max_table, chain.plan.max_table if chain else 0),
        "depth": depth,
        "cell_ratio": ratio,
        "configs_before": int(sum(graph.n_configs)),
        "configs_after": int(sum(len(k) for k in kept)),
        "used_blocks": chain is not None,
    }
    if chain is not None:
        stats["chain_exits"] = (len(chain.keep), int(np.prod(chain.kx, dtype=np.int64)))
    if bar_above is not None:
        stats["points_cut"] = counts.get("cut", 0)
    if chain is not None and bar_above is not None:
        stats["chain_points_cut"] = chain.cut
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


def _run(plan, leaves: list, ratio: float, deadline, bar, ceiling: Ceiling | None = None,
         outside: tuple[float, float] | None = None, counts: dict | None = None) -> list[Factor]:
    """Carry out an elimination plan; returns the factors left over (scopes within the kept nodes).

    With a ``ceiling`` (and ``outside``: the least time and, apart, the least memory of what
    ``leaves`` leave out), each step's factor loses the partial plans the ceiling strictly
    dominates even with the least time and least memory that every other factor still to
    join adds (each factor's own minimum, summed): the costs of a plan are the sum over
    the factors that partition it, so no completion of such a partial plan reaches the
    frontier; as in :meth:`_ChainBuilder.fold`. ``counts["cut"]`` counts the points dropped."""
    table = list(leaves)
    least = [_least(f) for f in table] if ceiling is not None else []
    live = set(range(len(table)))
    for step in plan.steps:
        made: set = set()
        merged = []
        for group in step.groups:
            acc = table[group[0]]
            for i in group[1:]:
                acc = _consume(acc, table[i], ratio, deadline, made)
            merged.append(acc)
        acc = merged[0]
        for f in merged[1:-1]:
            acc = _consume(acc, f, ratio, deadline, made)
        last = merged[-1] if len(merged) > 1 else _ZERO
        table.append(_consume(acc, last, ratio, deadline, made, eliminate=step.node))
        for i in step.factors:
            _release(table[i])
        if ceiling is not None:
            live.difference_update(step.factors)
            rest_t = outside[0] + sum(least[i][0] for i in live)
            rest_m = outside[1] + sum(least[i][1] for i in live)
            n_cut = _cut(table[-1], ceiling, rest_t, rest_m)
            if counts is not None:
                counts["cut"] = counts.get("cut", 0) + n_cut
            least.append(_least(table[-1]))
            live.add(len(table) - 1)
        bar.update(1)
    return [table[i] for i in plan.leftover]


def _least(f: Factor) -> tuple[float, float]:
    """The least time and, apart, the least memory of any point of ``f``."""
    return (float(np.min(f.t)), float(np.min(f.m))) if f.t.size else (np.inf, np.inf)


def _least_outside(g: CostGraph, layout: ChainLayout | None) -> tuple[float, float]:
    """A lower bound on the time and, apart, the memory of the repeated blocks' chain (the
    leaves ``_leaves`` leaves out): each node's and edge's own minimum, summed."""
    if layout is None:
        return 0.0, 0.0
    chained = {v for block in layout.blocks[1:] for v in block}
    tables = [g.node_costs[v] for v in chained]
    tables += [t for (u, v), t in g.edge_costs.items() if v in chained]
    return (sum(float(t[..., 0].min()) for t in tables), sum(float(t[..., 1].min()) for t in tables))


def _consume(a: Factor, b: Factor, ratio, deadline, made: set, eliminate: int | None = None) -> Factor:
    """``a ⊕ b`` (``fx.combine``). Whichever of the two the caller made on the way (``made``:
    the ids of its partial sums) nothing reads again but its back-pointers, so it is released
    at once: a step's or the root's partial sums no longer hold their times and memories
    until the end of the search."""
    out = fx.combine(a, b, eliminate=eliminate, ratio=ratio, deadline=deadline)
    for f in (a, b):
        if id(f) in made:
            made.discard(id(f))
            _release(f)
    made.add(id(out))
    return out


def _combine_all(factors: list[Factor], ratio, deadline, made: set | None = None) -> Factor:
    made = set() if made is None else made
    acc = factors[0] if factors else _ZERO
    for f in factors[1:]:
        acc = _consume(acc, f, ratio, deadline, made)
    return acc


def _fold_all(factors: list[Factor], ratio, deadline) -> Factor:
    """Sum the factors and fold out every node they still mention: the root frontier."""
    made: set = set()
    acc = _combine_all(factors, ratio, deadline, made)
    for v in acc.scope:
        acc = _consume(acc, _ZERO, ratio, deadline, made, eliminate=v)
    return acc


def _release(f: Factor) -> None:
    # Once consumed, a factor is only walked back: its back-pointers and width suffice, and
    # the back-pointers are kept in 32 bits where they fit (read back as int64).
    if f.kind == "combine" and f.t is not None:
        f.extra["width"] = f.width
        f.t = f.m = None
        if f.src.size and int(f.src.max()) <= np.iinfo(np.int32).max:
            f.src = f.src.astype(np.int32)


def _permute(f: Factor, scope: tuple[int, ...]) -> Factor:
    if f.scope == scope:
        return f
    perm = [f.scope.index(v) for v in scope] + [len(f.scope)]
    return Factor(scope, f.t.transpose(perm), f.m.transpose(perm), f.src.transpose(perm), f.kind,
                  f.inputs, f.eliminated, f.depth, f.extra)


class _ChainBuilder:
    """Blocks 1..L-1, folded one block at a time into the factor of everything before them.

    The transfer factor A(x_{k-1}, x_k) — one block's cost given the exit configurations of
    the block before and its own, interior folded out — is computed once from block 1 (the
    template). Then V_k(x_k) = ∪_{x_{k-1}} V_{k-1}(x_{k-1}) ⊕ A(x_{k-1}, x_k), with V_0 the
    factor of block 0 and everything outside that does not touch the last block. (Repeated
    squaring A^(L-1) costs more: exact frontiers widen with every block, and a matrix
    product costs K_x times a vector product of the same widths.) When the rest of the
    graph joins the first and last exits directly, V also carries the last exits' index.
    """

    def __init__(self, g: CostGraph, layout: ChainLayout, sizes: dict[int, int]):
        self.g, self.layout = g, layout
        b0, b1 = layout.blocks[0], layout.blocks[1]
        self.x0 = layout.first_exits
        self.x1 = tuple(b1[p] for p in layout.exits)
        self.xl = layout.last_exits
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
        self.sizes = sizes
        self.template_sizes = {v: sizes[v] for s in scopes for v in s}
        self.plan = plan_elimination(scopes, self.template_sizes, keep=frozenset(self.x0 + self.x1))
        self.n = len(layout.blocks) - 1
        self.n_steps = len(self.plan.steps) + self.n
        self.kx = tuple(sizes[v] for v in self.x0)
        self.pos0 = {v: p for p, v in enumerate(b0)}
        self.pos1 = {v: p for p, v in enumerate(b1)}

    def outer_keep(self, outer_sizes: dict[int, int]) -> frozenset[int]:
        return frozenset(self.x0) | frozenset(v for v in self.xl if v in outer_sizes)

    def depth_bound(self, n_kept: int) -> int:
        """Prunes the chain adds on any path, at most (on top of the outer plan's)."""
        return self.plan.depth + len(self.plan.leftover) + self.n + 2 * n_kept + 4

    def fold(self, rest: list[Factor], ratio, deadline, bar, ceiling: Ceiling | None = None) -> Factor:
        """The factor over the last exits of everything: ``rest`` (the outer factors) and the chain.

        With a ``ceiling``, a partial plan ``p`` in V_k(x_k) is dropped when the ceiling strictly
        dominates ``p`` plus the least time and, apart, the least memory that the blocks still
        to come (from exit configuration x_k) and the outer factors still to join can add:
        every completion of ``p`` costs at least that, so none reaches the frontier. A point
        that ``p`` pruned away stays pruned, and rightly: it is no better than ``p`` for every
        completion. ``self.cut`` counts the points dropped."""
        template = _combine_all(_run(self.plan, self.template_leaves, ratio, deadline, bar), ratio, deadline)
        template = _permute(_pad_scope(template, self.x0 + self.x1, self.sizes), self.x0 + self.x1)
        r = int(np.prod(self.kx, dtype=np.int64))
        w = template.width
        a = Factor((-1, -2), template.t.reshape(r, r, w), template.m.reshape(r, r, w),
                   template.src.reshape(r, r, w), "matrix", depth=template.depth)
        xl = set(self.xl)
        post = [f for f in rest if xl & set(f.scope)]
        self.carry = any(set(self.x0) & set(f.scope) for f in post)
        pre = [f for f in rest if f not in post] + (post if self.carry else [])
        post = [] if self.carry else post
        v0_scope = (self.xl if self.carry else ()) + self.x0
        v0 = _permute(_pad_scope(_combine_all(pre, ratio, deadline), v0_scope, self.sizes), v0_scope)
        lead = (r,) if self.carry else ()
        scope = (-3, -1) if self.carry else (-1,)
        shape = lead + (r, v0.width)
        vt, vm, vsrc = v0.t.reshape(shape), v0.m.reshape(shape), v0.src.reshape(shape)
        self.keep = self._surviving_exits(a, vt, vm, post, ratio, deadline)
        if len(self.keep) < r:
            pick = np.ix_(self.keep, self.keep)
            a = Factor(a.scope, a.t[pick], a.m[pick], a.src[pick], "matrix", depth=a.depth)
            vt, vm, vsrc = vt[self.keep], vm[self.keep], vsrc[self.keep]
        self.slot = np.full(r, -1, dtype=np.int64)
        self.slot[self.keep] = np.arange(len(self.keep))
        vs = [Factor(scope, vt, vm, vsrc, "matrix", depth=v0.depth)]
        self.cut = 0
        if ceiling is not None:
            to_come = _rest_of_chain(a, self.n, post)
            self.cut += _cut(vs[0], ceiling, *to_come[self.n], compact=False)   # unfold reads v0's columns
        for k in range(1, self.n + 1):
            nxt = fx.combine(vs[-1], a, eliminate=-1, ratio=ratio, deadline=deadline)
            nxt.scope = scope  # (-3, -2) / (-2,): the new exits take the place of the old
            if ceiling is not None:
                self.cut += _cut(nxt, ceiling, *to_come[self.n - k])
            if len(vs) > 1:
                _release(vs[-1])
            vs.append(nxt)
            bar.update(1)
        last = vs[-1]
        t, m = last.t, last.m
        if self.carry:  # the last exits' two indices must agree
            t, m = t[np.arange(r), np.arange(r)], m[np.arange(r), np.arange(r)]
        elif len(self.keep) < r:    # dropped exits: no plan ends there
            t_all, m_all = np.full((r, t.shape[-1]), np.inf), np.full((r, t.shape[-1]), np.inf)
            t_all[self.keep], m_all[self.keep] = t, m
            t, m = t_all, m_all
        kl = tuple(self.sizes[v] for v in self.xl)
        width = t.shape[-1]
        src = np.broadcast_to(np.arange(width), kl + (width,))
        self.vs, self.v0, self.template = vs, v0, template

        def unfold(ctx, point, assignment, stack):
            self._unfold(ctx, point, assignment, stack)

        chained = Factor(self.xl, t.reshape(kl + (width,)), m.reshape(kl + (width,)), src, "chain",
                         (), None, last.depth, {"reconstruct": unfold})
        return _combine_all([chained] + post, ratio, deadline)

    def _unfold(self, ctx, point, assignment, stack) -> None:
        blocks, kx, keep = self.layout.blocks, self.kx, self.keep
        j = self.slot[np.ravel_multi_index(tuple(ctx[v] for v in self.xl), kx)]
        j_last = j
        wa = self.template.width
        for k in range(self.n, 0, -1):
            v = self.vs[k]
            code = fx.back_pointers(v, (j_last, j, point) if self.carry else (j, point))
            if (code < 0).any():
                raise AssertionError("back-pointer to a padding point")
            c, rest = np.divmod(code, self.vs[k - 1].width * wa)
            i, jj = np.divmod(rest, wa)
            local = dict(zip(self.x0, np.unravel_index(keep[c], kx)))
            local.update(zip(self.x1, np.unravel_index(keep[j], kx)))
            fx.reconstruct(self.template, jj, local)
            for node, conf in local.items():
                real = blocks[k - 1][self.pos0[node]] if node in self.pos0 else blocks[k][self.pos1[node]]
                assignment[real] = conf
            point, j = i, c
        ctx0 = dict(zip(self.x0, np.unravel_index(keep[j], kx)))
        if self.carry:
            ctx0.update((v, ctx[v]) for v in self.xl)
        stack.append((self.v0, point, {v: ctx0[v] for v in self.v0.scope}))

    def _surviving_exits(self, a: Factor, vt, vm, post: list[Factor], ratio, deadline) -> np.ndarray:
        """The exit configurations that no other does at least as well as, into and out of
        every block and in what precedes and follows the chain (``dominance.surviving_exits``);
        all of them where the rest of the graph joins the first exits and the last."""
        r = a.t.shape[0]
        if self.carry or r < 2:
            return np.arange(r)
        slices = [(vt, vm)]
        slices += [(a.t[x], a.m[x]) for x in range(r)]              # into each exit, from x
        slices += [(a.t[:, x], a.m[:, x]) for x in range(r)]        # out of each exit, to x
        if post:
            p = _permute(_pad_scope(_combine_all(post, ratio, deadline), self.xl, self.sizes), self.xl)
            slices.append((p.t.reshape(r, -1), p.m.reshape(r, -1)))
        return surviving_exits(slices)


def _rest_of_chain(a: Factor, n: int, post: list[Factor]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per number of blocks ``j`` still to come, the least time and the least memory (each
    alone) they and the ``post`` factors add, per exit configuration (index of the
    transfer's first axis)."""
    least = np.stack([a.t.min(axis=-1), a.m.min(axis=-1)], axis=-1)    # (r, r, 2)
    post_least = [sum((float(np.min(f.t)) for f in post), 0.0), sum((float(np.min(f.m)) for f in post), 0.0)]
    rest = [np.broadcast_to(post_least, (least.shape[0], 1, 2))]
    for _ in range(n):
        rest.append(min_plus(least, rest[-1]))
    return [(r[:, 0, 0], r[:, 0, 1]) for r in rest]


def _cut(f: Factor, ceiling: Ceiling, rest_t, rest_m, compact: bool = True) -> int:
    """Drop the points of ``f`` (exits on its second-to-last axis) that ``ceiling`` beats even
    with the least ``rest_t``, ``rest_m`` still to add (``compact``: each row's survivors move
    first, in order, and the width shrinks; else they become padding where they are).
    Returns how many went."""
    rest_t, rest_m = np.asarray(rest_t), np.asarray(rest_m)
    if rest_t.ndim:
        rest_t, rest_m = rest_t[:, None], rest_m[:, None]
    finite = np.isfinite(f.t)
    gone = finite & ceiling.beats(f.t + rest_t, f.m + rest_m)
    n_gone = int(gone.sum())
    if not n_gone:
        return 0
    alive = finite & ~gone
    if not compact:
        f.t, f.m = np.where(alive, f.t, np.inf), np.where(alive, f.m, np.inf)
        return n_gone
    order = np.argsort(~alive, axis=-1, kind="stable")
    width = max(int(alive.sum(axis=-1).max(initial=0)), 1)
    order = order[..., :width]
    f.t = np.where(np.take_along_axis(alive, order, -1), np.take_along_axis(f.t, order, -1), np.inf)
    f.m = np.where(np.take_along_axis(alive, order, -1), np.take_along_axis(f.m, order, -1), np.inf)
    f.src = np.where(np.take_along_axis(alive, order, -1), np.take_along_axis(f.src, order, -1), -1)
    return n_gone


def _pad_scope(f: Factor, scope: tuple[int, ...], sizes: dict[int, int]) -> Factor:
    """``f`` widened (at no cost) to mention every node of ``scope``."""
    for v in scope:
        if v not in f.scope:
            f = fx.combine(f, fx.leaf((v,), np.zeros((sizes[v], 2))))
    return f


def _read_out(root: Factor, g: CostGraph, kept: list[np.ndarray]):
    ok = np.isfinite(root.t)
    points = np.stack([root.t[ok], root.m[ok]], axis=1)
    index = np.flatnonzero(ok)
    found: dict[int, np.ndarray] = {}
    fx.reconstruct(root, index, found)
    if len(found) != g.n_nodes:
        missing = sorted(set(range(g.n_nodes)) - set(found))[:5]
        raise AssertionError(f"reconstruction left nodes {missing} unassigned")
    assignments = np.empty((len(points), g.n_nodes), dtype=np.int64)
    for v in range(g.n_nodes):
        assignments[:, v] = kept[v][np.broadcast_to(found[v], (len(points),))]
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


class _Steps:
    """Counts folding steps (for the time-limit message) and drives a tqdm bar when shown."""

    def __init__(self, total: int, show: bool):
        self.n = 0
        self._bar = None
        if show:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc="frontier search", unit="step", leave=False)

    def update(self, k: int = 1) -> None:
        self.n += k
        if self._bar is not None:
            self._bar.update(k)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _progress_bar(total: int, show: bool) -> _Steps:
    return _Steps(total, show)
