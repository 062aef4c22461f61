"""The step's peak memory of a mesh problem, as a :class:`~tensoropt.engine.PeakGraph`.

This is where ``Plan.peak_memory_bytes`` is defined: the engine searches on it and plans
are priced with it (:func:`PeakModel.evaluate`). Backward visits the operators in reverse;
when operator ``p`` runs its backward the device holds

* the state and everything else the cost graph adds up at the end of the forward pass
  (``M``), less the activations of the operators after ``p``, already freed;
* ``p``'s transient (``NodeCost.transient_bytes``: its output's and largest input's
  gradients, fresh parameter gradients, ZeRO-3's gathered weights) and the summed gradient
  of every output used again further on (a residual) whose last user is done;
* or, for a moment, the backward buffers of a layout move into ``p`` instead of ``p``'s
  own activations;
* in a recomputed unit, its rematerialised activations (and, under ZeRO-3, the parameters
  the recomputation gathered); when the unit's backward starts, its second forward
  holds at each operator the rematerialised activations, that operator's output, its
  inputs' forward layout moves, the unit's outputs still waiting for a later user, and the
  gradient of the unit's output;
* for FSDP2 ``replicate`` plans (data parallel without ZeRO), the unsharded parameter copy
  and the gradients already reduced (measured on CPU/gloo: neither is released early).

Operators are grouped into regions: each repeated block (recompute unit) is one, every
other operator its own. Inside a region of several operators, "the activations of the
operators after ``p``" are counted as their least over configurations (an upper bound on
the peak, exact when they take their least); between regions the order is exact. The
recurrence of ``engine.peakgraph`` carries this; the ``replicate`` holdings depend on the
whole plan running that way, so those plans (one configuration per operator: the batch
split on every axis) get a graph of their own and are excluded from the main one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .engine.peakgraph import PeakGraph, Region, Term
from .execution import batch_statistics_axes
from .planner import MeshProblem, recompute_units
from .strategy import label_sizes

__all__ = ["PeakModel", "peak_model"]


@dataclass(frozen=True)
class PeakModel:
    """The graphs of one mesh problem: ``main`` (every plan but the replicate ones, which it
    excludes) and ``replicate`` (those plans, one configuration per operator, priced with
    FSDP2's holdings), with ``replicate_configs`` the operators' configurations there."""
    main: PeakGraph
    replicate: PeakGraph | None
    replicate_configs: np.ndarray | None     # (n_ops,) configuration index per operator
    n_ops: int

    def is_replicate(self, assignments: np.ndarray) -> np.ndarray:
        a = np.atleast_2d(np.asarray(assignments, dtype=np.int64))
        if self.replicate_configs is None:
            return np.zeros(len(a), dtype=bool)
        return (a[:, :self.n_ops] == self.replicate_configs).all(axis=1)

    def evaluate(self, assignments: np.ndarray) -> np.ndarray:
        """(time, end-of-forward memory, peak) per assignment (operators, then units)."""
        a = np.atleast_2d(np.asarray(assignments, dtype=np.int64))
        out = np.empty((len(a), 3))
        rep = self.is_replicate(a)
        if (~rep).any():
            out[~rep] = self.main.evaluate(a[~rep])
        if rep.any():
            sub = a[rep].copy()
            sub[:, :self.n_ops] = 0                       # the replicate graph has one config each
            out[rep] = self.replicate.evaluate(sub)
        return out

    def expand(self, assignments: np.ndarray) -> np.ndarray:
        """Replicate-graph assignments as assignments of the mesh problem."""
        a = np.array(assignments, dtype=np.int64)
        a[:, :self.n_ops] = self.replicate_configs
        return a


def peak_model(problem: MeshProblem, graph, microbatches: int = 1) -> PeakModel:
    """The peak graphs of ``problem`` (``graph``: the operator graph it was built from;
    ``microbatches``: how many the step's input batch holds, for a pipeline stage)."""
    n_ops = len(problem.configs)
    rep = _replicate_configs(problem, graph)
    if rep is not None and problem.mesh.size == 1:
        main = _build(problem, graph, microbatches, None, replicate=True)
        return PeakModel(main, None, None, n_ops)
    exclude = None
    if rep is not None:
        exclude = [np.arange(len(problem.configs[i])) == rep[i] for i in range(n_ops)]
        exclude += [np.ones(2, dtype=bool) for _ in problem.units]
    main = _build(problem, graph, microbatches, None, exclude=exclude)
    if rep is None:
        return PeakModel(main, None, None, n_ops)
    only = _build(problem, graph, microbatches, rep, replicate=True)
    return PeakModel(main, only, rep, n_ops)


def _replicate_configs(problem: MeshProblem, graph) -> np.ndarray | None:
    """Per operator, its configuration in a plan the apply layer runs with FSDP2 ``replicate``
    (every axis data parallel, no batch statistics synchronised), or None when no plan of
    this problem runs that way (ZeRO, pipeline stages, or an operator with no such config)."""
    if problem.zero_stage or problem.accumulates:
        return None
    shape = problem.mesh.shape
    out = []
    for op, cfgs in zip(graph.operators, problem.configs):
        batched = "b" in label_sizes(op)
        want = tuple(("b" if batched else None) if n > 1 else s for n, s in zip(shape, (None,) * len(shape)))
        hits = [j for j, c in enumerate(cfgs)
                if all((s == w) if n > 1 else True for s, w, n in zip(c.splits, want, shape))
                and not batch_statistics_axes(op, c)]
        if len(hits) != 1:
            return None
        out.append(hits[0])
    if not any("b" in label_sizes(op) for op in graph.operators) and any(n > 1 for n in shape):
        return None
    return np.array(out, dtype=np.int64)


def _regions(problem: MeshProblem, graph) -> list[tuple[tuple[int, ...], int | None]]:
    """(operators, mode node) per region, in order: each recompute unit (or repeated block)
    one region, every other operator its own."""
    n_ops = len(problem.configs)
    groups = recompute_units(graph)
    mode_of = {name: n_ops + k for k, (name, _) in enumerate(problem.units)}
    first = {ops[0]: (tuple(ops), mode_of.get(name)) for name, ops in groups}
    out, i = [], 0
    while i < n_ops:
        if i in first:
            ops, mode = first[i]
            if list(ops) != list(range(ops[0], ops[0] + len(ops))):
                raise ValueError(f"unit starting at operator {i} is not a run of consecutive operators")
            out.append((ops, mode))
            i = ops[-1] + 1
        else:
            out.append(((i,), None))
            i += 1
    return out


def _build(problem: MeshProblem, graph, microbatches: int, fixed: np.ndarray | None,
           exclude=None, replicate: bool = False) -> PeakGraph:
    """One peak graph. ``fixed``: per operator the one configuration it keeps (the
    replicate graph), else None. ``replicate``: price FSDP2 ``replicate``'s holdings."""
    n_ops = len(problem.configs)
    n_units = len(problem.units)
    cg = problem.cost_graph
    ks = list(cg.n_configs)
    pick = [np.arange(k) for k in ks]
    if fixed is not None:
        pick = [np.array([fixed[i]]) for i in range(n_ops)] + [np.arange(2) for _ in range(n_units)]
        ks = [1] * n_ops + [2] * n_units

    def cut(scope, table):
        return table[np.ix_(*[pick[v] for v in scope])] if scope else table

    additive = [Term((v,), cut((v,), c)) for v, c in enumerate(cg.node_costs)]
    additive += [Term((u, v), cut((u, v), t)) for (u, v), t in cg.edge_costs.items()]
    additive += _input_terms(problem, graph, microbatches, pick)

    act_of, trans_of, out_of, reg_of = problem.backward_tables
    act = [a[pick[i]] for i, a in enumerate(act_of)]
    trans = [t[pick[i]] for i, t in enumerate(trans_of)]
    out = [o[pick[i]] for i, o in enumerate(out_of)]
    reg = [r[pick[i]] for i, r in enumerate(reg_of)]
    skips = problem.skips
    moves = {(s, d): (cut((s, d), m), cut((s, d), f)) for s, d, m, f in problem.edge_transients}
    into: dict[int, list[tuple[int, int]]] = {}
    for s, d in moves:
        into.setdefault(d, []).append((s, d))
    extra = _replicate_extra(problem, act, [c[pick[i]] for i, c in enumerate(_grads(problem))],
                             [c[pick[i]] for i, c in enumerate(_params(problem))]) if replicate else None
    unit_input = [np.asarray(u)[pick[ops[0]]] for u, (_, ops) in zip(problem.unit_input_bytes, problem.units)]
    unit_of_mode = {n_ops + k: k for k in range(n_units)}

    def pending_srcs(p: int) -> list[int]:
        return [s for s, last in skips if s < p < last]

    regions = []
    for ops, mode in _regions(problem, graph):
        kinds: dict[str, list[Term]] = {k: [] for k in ("held", "view", "local", "base", "rise")}
        keep_min = np.array([act[i].min() for i in ops])
        rc_min = np.array([(act[i] + reg[i]).min() for i in ops])
        after_keep = np.append(np.cumsum(keep_min[::-1])[::-1][1:], 0.0)
        after_rc = np.append(np.cumsum(rc_min[::-1])[::-1][1:], 0.0)

        def shift(j: int) -> np.ndarray:
            """Per mode (keep, recompute): the least activations of the region's operators after ``j``."""
            return np.array([after_keep[j], after_rc[j]])

        # gradients of outputs used again further on, summed over their users so far: held
        # at every position of the region once their span reaches into it
        pending = sorted({s for p in ops for s in pending_srcs(p)})
        for s in pending:
            kinds["view"].append(Term((s,), out[s]))
        for j, p in enumerate(ops):
            if mode is None:
                kinds["held"].append(Term((p,), act[p]))
            else:
                kinds["held"].append(Term((mode, p), np.stack([act[p], np.zeros_like(act[p])])))
                kinds["view"].append(Term((mode, p), np.stack([np.zeros_like(act[p]), act[p] + reg[p]])))
            # A: p's backward
            value = trans[p] + (extra[p] if extra is not None else 0.0)
            kinds["local"].append(_positioned((p,), value, mode, shift(j)))
            # B: a layout move's backward after p's, p's activations freed
            for s, d in into.get(p, ()):
                value = moves[(s, d)][0] - act[p][None, :]
                if extra is not None:
                    value = value + extra[p]
                kinds["local"].append(_positioned((s, p), value, mode, shift(j)))
        if mode is not None:
            k = unit_of_mode[mode]
            first, last = ops[0], ops[-1]
            kinds["held"].append(Term((mode, first), np.stack([np.zeros_like(unit_input[k]), unit_input[k]])))
            # C: the unit's second forward, beside its output's gradient (and the pending ones
            # above) and the unit's own outputs that wait for a later user
            waiting = [s for s, user in skips if first <= s < last]
            for s in [last] + waiting:
                kinds["base"].append(Term((mode, s), np.stack([np.zeros_like(out[s]), out[s]])))
            for j, p in enumerate(ops):
                for e in into.get(p, ()) or [None]:
                    if e is None:
                        scope, value = (p,), out[p]
                    else:
                        scope, value = (e[0], p), moves[e][1] + out[p][None, :]
                    if extra is not None:
                        value = value + extra[last]
                    kinds["rise"].append(_mode_only(scope, value - after_rc[j], mode))
        regions.append(Region(tuple(ops) + ((mode,) if mode is not None else ()), mode,
                              **{k: tuple(v) for k, v in kinds.items()}, name=graph.operators[ops[0]].module))
    chain = _chain(problem, graph, regions)
    names = list(cg.names)
    return PeakGraph.build(names, ks, additive, regions, chain=chain, exclude=exclude)


def _positioned(scope: tuple[int, ...], value: np.ndarray, mode: int | None, shift: np.ndarray) -> Term:
    """A position's term; inside a region the later operators' least activations are taken
    off (per mode when the region has one)."""
    if mode is None:
        return Term(scope, value - shift[0])
    return Term((mode, *scope), np.stack([value - shift[0], value - shift[1]]))


def _mode_only(scope, value, mode) -> Term:
    """A recompute-only position: absent (-inf) when the unit keeps its activations."""
    return Term((mode, *scope), np.stack([np.full(value.shape, -np.inf), value]))


def _grads(problem: MeshProblem) -> list[np.ndarray]:
    return [np.array([c.grad_bytes for c in costs]) for costs in problem.node_costs]


def _params(problem: MeshProblem) -> list[np.ndarray]:
    return [np.array([c.param_bytes for c in costs]) for costs in problem.node_costs]


def _replicate_extra(problem: MeshProblem, act, grads, params) -> list[np.ndarray]:
    """Per operator (one config each here): what FSDP2 ``replicate`` holds while it runs its
    backward -- the unsharded parameter copy, and the gradients of the operators after it
    (reduced already, their buffers kept until backward ends)."""
    copy = float(sum(p[0] for p in params))
    g = np.array([gr[0] for gr in grads])
    done = np.append(np.cumsum(g[::-1])[::-1][1:], 0.0)
    return [np.array([copy + done[i]]) for i in range(len(act))]


def _input_terms(problem: MeshProblem, graph, microbatches: int, pick) -> list[Term]:
    """The step's input batch: every rank holds the whole batch, less what activations
    already charge of it (``planner.step_input_bytes``, as terms: a constant and, per
    operator that keeps a graph input unsplit, minus that input)."""
    fed = {(e.dst, e.operand) for e in graph.edges}
    first_of_unit = {ops[0] for _, ops in problem.units}
    shape = problem.mesh.shape
    f = problem.activation_factor
    terms = []
    most = 0.0
    for i, op in enumerate(graph.operators):
        term_of, _ = op.terms
        acts = [k for k, p in enumerate(op.param_names) if p is None]
        shared = np.zeros(len(problem.configs[i]))
        for k in acts:
            if (i, k) in fed or "b" not in term_of[k]:
                continue
            kept = k in op.saved_operands or (i in first_of_unit and k == acts[0])
            if not kept:
                continue
            shared += [op.operands[k].nbytes if c.shards(term_of[k], shape) == 1 else 0.0 for c in problem.configs[i]]
        if shared.any():
            terms.append(Term((i,), np.stack([np.zeros_like(shared), -f * shared], axis=-1)[pick[i]]))
            most += f * shared.max()
    total = microbatches * float(graph.input_bytes)
    if most > total:
        raise NotImplementedError("the kept inputs can exceed the input batch; the peak model "
                                  "would need a clamp the engine cannot carry")
    terms.append(Term((), np.array([0.0, total])))
    return terms


def _chain(problem: MeshProblem, graph, regions: list[Region]) -> tuple[int, ...]:
    """The regions of the repeated blocks, when consecutive."""
    if len(graph.blocks) < 2:
        return ()
    firsts = {b[0] for b in graph.blocks}
    idx = [g for g, r in enumerate(regions) if r.nodes[0] in firsts and len(r.nodes) > 1]
    if len(idx) != len(graph.blocks) or any(b != a + 1 for a, b in zip(idx, idx[1:])):
        return ()
    return tuple(idx)
