"""The step's peak memory of a mesh problem, as a :class:`~tensoropt.engine.PeakGraph`.

This is where ``Plan.peak_memory_bytes`` is defined: every plan is priced with the exact
graph (:meth:`PeakModel.evaluate`) and the engine searches on it. Backward visits the
operators in reverse; when operator ``p`` runs its backward the device holds

* the state and everything else the cost graph adds up at the end of the forward pass
  (``M``), less the activations of the operators after ``p``, already freed;
* ``p``'s transient (``NodeCost.transient_bytes``: its output's and largest input's
  gradients, fresh parameter gradients, ZeRO-3's gathered weights) and the summed gradient
  of every output used again further on (a residual) whose last user is done;
* or, for a moment, the backward buffers of a layout move into ``p`` instead of ``p``'s
  own activations;
* in a recomputed unit, its rematerialised activations up to ``p`` (and, under ZeRO-3, the
  parameters the recomputation gathered); when the unit's backward starts, its second
  forward holds at each operator the activations rematerialised so far, that operator's
  output, its inputs' forward layout moves, the unit's outputs still waiting for a later
  user, and the gradient of the unit's output and of those pending beyond it; under a
  selective policy (``MeshProblem.recompute_kept``) the unit holds the outputs it kept from
  the end of forward until its second forward takes them up (the kept output of an operator
  after ``p`` is held beside the activations rematerialised up to ``p``; those of ``p`` and
  before it are among them; ``_Terms.remat`` says where a kept output larger than what its
  operator saves is counted twice);
* for plans the apply layer runs with FSDP2 (every axis data-parallel): under ``replicate``
  (no ZeRO) the unsharded parameter copy and the gradients already reduced (measured on
  CPU/gloo: neither is released early); under ``fully_shard`` with ZeRO-2 the parameter
  shards beside the gathered parameters; with ZeRO-3 the root group's gathered parameters
  and those of the operator's block and the block prefetched next, gathered whole
  (``_replicate_extra``); and, in the forward pass, each group's all-gather: the flat
  buffer it gathers into beside the previous group's, which FSDP2 frees only at the next
  copy-out (``_fsdp_forward``, as positions at each block's first operator and at the last
  operator). Where recomputation has made the backward light, the peak falls there.
* the copy a consumer keeps of a saved tensor that another operator is charged for, where
  it moves that tensor to another layout (``MeshProblem.resaved``): held like its own
  activations, rematerialised when its unit recomputes;
* a tied parameter's copy that a later user works on in a layout other than the stored
  one (``traffic.tied_copy``), kept from forward to that user's backward (under ZeRO-3
  gathered again for it): a term over both users' configurations, whose operators are far
  apart; the block graph takes it at the first user's configuration that makes it largest.

The ``replicate`` holdings and FSDP2's grouped collectives (``MeshProblem.replicate_time_s``)
depend on the whole plan running that way, so those plans (one configuration per operator:
the batch split on every axis) get a graph of their own and are excluded from the main one
(under ZeRO-1 and while accumulating, with the DTensor runner's holdings:
``MeshProblem.fsdp_holdings_priced``).

Two granularities. The *exact* graph has one region per operator, and each recompute unit
is a unit of regions (``PeakGraph.units``): it is this definition term for term, and what
plans are priced with. Its search carries the joint configurations of every operator whose
output is still read further on, so it is used where those stay few. Otherwise the search
runs on the *block* graph: each repeated block one region, whose positions see the
activations (or rematerialised ones) of the block's later operators at their least over
configurations and every gradient pending anywhere in the block -- never below the exact
peak, equal to it where the block's later operators take their least, so the plans it
returns are within ``PeakModel.bound`` of the exact frontier (:func:`block_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Callable, Iterator

import numpy as np

from .engine.peakgraph import PeakGraph, Region, SumTerm, Term
from .execution import gradient_group
from .planner import MeshProblem, recompute_units, replicate_times, takes_configs

__all__ = ["PeakModel", "peak_model", "EXACT_SEARCH_ROWS"]

# The exact graph is searched when no cut between operators keeps more joint configurations
# of live operators than this; beyond it, the block graph.
EXACT_SEARCH_ROWS = 1 << 12


@dataclass(frozen=True)
class PeakModel:
    """The graphs of one mesh problem. ``exact`` prices every plan but the replicate ones
    (which it excludes); ``replicate`` prices those (one configuration per operator, FSDP2's
    holdings included), ``replicate_configs`` being the operators' configurations there.
    ``search`` is what the engine solves for the main plans: ``exact`` itself, or the block
    graph, never below it; it and ``parts`` are built when a search first asks (pricing
    plans needs ``exact`` alone)."""
    exact: PeakGraph
    replicate: PeakGraph | None
    replicate_configs: np.ndarray | None     # (n_ops,) configuration index per operator
    n_ops: int
    build_block: Callable[[], PeakGraph] | None = None
    build_parts: Callable[[], Iterator[tuple]] | None = None
    exact_rows: int = EXACT_SEARCH_ROWS

    @cached_property
    def _searched(self) -> tuple[PeakGraph, tuple]:
        if self.build_block is None:
            return self.exact, ()
        split = []
        for part in (self.build_parts() if self.build_parts is not None else ()):
            if _widest_cut(part[2]) > self.exact_rows:
                return self.build_block(), ()          # the parts after it are not built
            split.append(part)
        if split or _widest_cut(self.exact) <= self.exact_rows:
            return self.exact, tuple(split)
        return self.build_block(), ()

    def release_search(self) -> None:
        """Forget the searched graphs (the block graph, the exact one's parts); pricing plans
        needs ``exact`` alone."""
        self.__dict__.pop("_searched", None)

    @property
    def search(self) -> PeakGraph:
        return self._searched[0]

    @property
    def parts(self) -> tuple:
        """The exact graph split by the classes of a tied parameter's first user
        (configurations that store it alike): (that operator, its configurations in the
        class, the graph where it takes only those), whose searches together are the exact
        one; () when not split, or when the search is not the exact one."""
        return self._searched[1]

    @property
    def search_is_exact(self) -> bool:
        return self.search is self.exact

    def block(self) -> PeakGraph:
        """The block graph (``search`` where that is it already)."""
        if not self.search_is_exact or self.build_block is None:
            return self.search
        return self.build_block()

    def is_replicate(self, assignments: np.ndarray) -> np.ndarray:
        return takes_configs(assignments, self.replicate_configs)

    def evaluate(self, assignments: np.ndarray) -> np.ndarray:
        """(time, end-of-forward memory, peak) per assignment (operators, then units)."""
        a = np.atleast_2d(np.asarray(assignments, dtype=np.int64))
        out = np.empty((len(a), 3))
        rep = self.is_replicate(a)
        if (~rep).any():
            out[~rep] = self.exact.evaluate(a[~rep])
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


def peak_model(problem: MeshProblem, graph, microbatches: int = 1, exact_rows: int = EXACT_SEARCH_ROWS
               ) -> PeakModel:
    """The peak graphs of ``problem`` (``graph``: the operator graph it was built from;
    ``microbatches``: how many the step's input batch holds, for a pipeline stage)."""
    n_ops = len(problem.configs)
    rep = problem.replicate_configs
    if not (problem.fsdp_holdings_priced or problem.replicate_time_s is not None):
        rep = None                  # the main graph prices that plan as it runs: no graph apart
    if rep is not None and problem.mesh.size == 1:
        if any(len(c) != 1 for c in problem.configs):
            raise AssertionError("a one-device mesh with several configurations per operator")
        only = _build(problem, graph, microbatches, fine=True, replicate=problem.fsdp_holdings_priced)
        return PeakModel(only, None, None, n_ops)
    exclude = None
    if rep is not None:
        exclude = [np.arange(len(problem.configs[i])) == rep[i] for i in range(n_ops)]
        exclude += [np.ones(2, dtype=bool) for _ in problem.units]
    exact = _build(problem, graph, microbatches, fine=True, exclude=exclude)
    block = partial(_build, problem, graph, microbatches, fine=False, exclude=exclude)

    def parts():                    # one at a time: the search may need only the first
        for f, sub in _tied_classes(problem):
            yield f, sub, _build(problem, graph, microbatches, fine=True, exclude=exclude, restrict={f: sub})
    only = None if rep is None else _build(problem, graph, microbatches, fine=True, fixed=rep,
                                           replicate=problem.fsdp_holdings_priced)
    return PeakModel(exact, only, rep, n_ops, block, parts, exact_rows)


def _tied_classes(problem: MeshProblem) -> list[tuple[int, np.ndarray]]:
    """The classes of a tied parameter's first user: its configurations whose copies at the
    later user are alike (they store the parameter alike). Given the class, the copy depends
    on the later user alone, so the exact search need not carry the first user's
    configuration across the whole model. Only for one tied parameter used again once."""
    if len(problem.tied_copies) != 1:
        return []
    f, _, held, again = problem.tied_copies[0]
    classes: dict[bytes, list[int]] = {}
    for a in range(held.shape[0]):
        classes.setdefault(held[a].tobytes() + again[a].tobytes(), []).append(a)
    return [(f, np.array(c, dtype=np.int64)) for c in classes.values()]


def _widest_cut(g: PeakGraph) -> int:
    """The most joint configurations of the nodes live at one cut between regions."""
    region_of = g.region_of
    last = list(region_of)
    for t in g.additive:
        late = max((region_of[v] for v in t.scope), default=0)
        for v in t.scope:
            last[v] = max(last[v], late)
    for r, reg in enumerate(g.regions):
        for kind in ("held", "view", "remat", "local", "base", "rise"):
            for t in reg.terms(kind):
                for v in t.scope:
                    last[v] = max(last[v], r)
    # node v is live at cuts region_of[v] + 1 .. last[v]: a running product, exact in ints
    enter: dict[int, int] = {}
    leave: dict[int, int] = {}
    for v in range(g.n_nodes):
        if region_of[v] < last[v]:
            enter[region_of[v] + 1] = enter.get(region_of[v] + 1, 1) * g.n_configs[v]
            leave[last[v] + 1] = leave.get(last[v] + 1, 1) * g.n_configs[v]
    widest = rows = 1
    for c in range(1, len(g.regions)):
        rows = rows * enter.get(c, 1) // leave.get(c, 1)
        widest = max(widest, rows)
    return widest


@dataclass(frozen=True)
class _Terms:
    """The per-operator quantities of the definition, restricted to the configurations kept."""
    act: list
    trans: list
    out: list
    reg: list
    moves: dict          # (src, dst) -> (backward buffer table, forward buffer table)
    into: dict           # dst -> its edges with layout buffers
    extra: list | None   # replicate: what FSDP2 holds while each operator runs backward
    unit_input: list
    skips: tuple
    kept: dict           # operator -> the output bytes a recomputed unit keeps of it (its policy)
    tied: dict = field(default_factory=dict)     # later user -> (scope, held, regathered), exact graph
    resave: dict = field(default_factory=dict)   # operator -> [(kind, term)]: copies it keeps of saved tensors
    # operator -> (bytes beyond M, whether before its own activations): FSDP2's forward moments
    forward: dict = field(default_factory=dict)
    _by_unit: dict = field(default_factory=dict)

    def remat(self, mode: int, first: int, p: int) -> Term:
        """What a recomputed unit (``first``, ``mode`` node) rematerialises at ``p`` beyond the
        output it kept of ``p``. Never below zero (the engine's bounds count a unit's remat
        whole): where a kept output is larger than what its operator saves (a linear that
        widens), the next operator's remat, which saves that output, takes the excess; what it
        cannot take is counted twice while the unit's backward is at that operator or before."""
        own = self.act[p] + self.reg[p]
        if p in self.kept:
            own = own - self.kept[p]
        q = p - 1
        if p > first and q in self.kept:
            excess = np.maximum(self.kept[q] - self.act[q] - self.reg[q], 0.0)
            if excess.any():
                table = np.maximum(own[None, :] - excess[:, None], 0.0)
                return Term((mode, q, p), np.stack([np.zeros_like(table), table]))
        own = np.maximum(own, 0.0)
        return Term((mode, p), np.stack([np.zeros_like(own), own]))

    def pending(self, p: int) -> list[int]:
        """Operators whose output's summed gradient is held while ``p`` runs backward."""
        return self._pending.get(p, [])

    def waiting(self, first: int, last: int, j: int) -> list[int]:
        """Operators of the unit ``first..last`` whose output waits for a later user while
        the unit's second forward runs operator ``j``."""
        return [s for s, user in self._from(first, last) if s < j <= min(user, last)]

    @cached_property
    def _pending(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for s, last in self.skips:
            for p in range(s + 1, last):
                out.setdefault(p, []).append(s)
        return out

    def _from(self, first: int, last: int) -> list[tuple[int, int]]:
        key = (first, last)
        if key not in self._by_unit:
            self._by_unit[key] = [(s, user) for s, user in self.skips if first <= s <= last]
        return self._by_unit[key]


def _build(problem: MeshProblem, graph, microbatches: int, fine: bool, fixed: np.ndarray | None = None,
           exclude=None, replicate: bool = False, restrict: dict | None = None) -> PeakGraph:
    """One peak graph: ``fine`` the exact one, else the block graph. ``fixed``: per operator
    the one configuration it keeps (the replicate graph). ``replicate``: price FSDP2
    ``replicate``'s holdings (every plan of the graph runs that way). ``restrict``: operator ->
    the configurations it may take (a tied first user's class, ``_tied_classes``)."""
    n_ops = len(problem.configs)
    n_units = len(problem.units)
    cg = problem.cost_graph
    ks = list(cg.n_configs)
    pick = [np.arange(k) for k in ks]
    if fixed is not None:
        pick = [np.array([fixed[i]]) for i in range(n_ops)] + [np.arange(2) for _ in range(n_units)]
        ks = [1] * n_ops + [2] * n_units
    for v, sub in (restrict or {}).items():
        pick[v] = pick[v][sub]
        ks[v] = len(sub)
        if exclude is not None:
            exclude = [e[sub] if u == v else e for u, e in enumerate(exclude)]

    whole = [len(p) == k and (p == np.arange(k)).all() for p, k in zip(pick, cg.n_configs)]

    def cut(scope, table):
        if not scope or all(whole[v] for v in scope):
            return table                     # shared, read-only: like edges keep one table
        return table[np.ix_(*[pick[v] for v in scope])]

    additive = [Term((v,), cut((v,), c)) for v, c in enumerate(cg.node_costs)]
    if fixed is not None and problem.replicate_time_s is not None:
        # the plan FSDP2 runs: its own node times (``MeshProblem.replicate_time_s``)
        for v, d in enumerate(problem.replicate_time_s):
            if d:
                table = additive[v].table.copy()
                table[..., 0] = replicate_times(table[..., 0], d)
                additive[v] = Term((v,), table)
    additive += [Term((u, v), cut((u, v), t)) for (u, v), t in cg.edge_costs.items()]
    additive += _input_terms(problem, graph, microbatches, pick)
    act_of, trans_of, out_of, reg_of = problem.backward_tables
    moves = {(s, d): (cut((s, d), m), cut((s, d), f)) for s, d, m, f in problem.edge_transients}
    into: dict[int, list[tuple[int, int]]] = {}
    for s, d in moves:
        into.setdefault(d, []).append((s, d))
    act = [a[pick[i]] for i, a in enumerate(act_of)]
    trans = [t[pick[i]] for i, t in enumerate(trans_of)]
    tied = {}
    for f, i, held, again in problem.tied_copies:
        held, again = cut((f, i), held), cut((f, i), again)
        scope = (f, i)
        if f in (restrict or {}):          # alike over the class: the later user's alone
            scope, held, again = (i,), held[0], again[0]
        if fine:
            tied[i] = (scope, held, again)
            additive.append(Term(scope, np.stack([np.zeros_like(held), problem.activation_factor * held], axis=-1)))
        else:
            # the block graph: at the first user's configuration that makes the largest copy
            act[i] = act[i] + held.max(axis=0)
            trans[i] = trans[i] + again.max(axis=0)
            additive.append(Term((i,), np.stack([np.zeros(len(act[i])), problem.activation_factor * held.max(axis=0)],
                                                axis=-1)))
    resave = _resave_terms(problem, graph, fine, cut, additive)
    grads = [np.array([c.grad_bytes for c in costs])[pick[i]] for i, costs in enumerate(problem.node_costs)]
    params = [np.array([c.param_bytes for c in costs])[pick[i]] for i, costs in enumerate(problem.node_costs)]
    reg = [r[pick[i]] for i, r in enumerate(reg_of)]
    out = [o[pick[i]] for i, o in enumerate(out_of)]
    terms = _Terms(act, trans, out, reg, moves, into,
                   _replicate_extra(grads, params, problem, graph, reg) if replicate else None,
                   [np.asarray(u)[pick[ops[0]]] for u, (_, ops) in zip(problem.unit_input_bytes, problem.units)],
                   problem.skips, {i: out[i] for i in problem.recompute_kept}, tied, resave,
                   _fsdp_forward(problem, graph, params) if replicate else {})
    groups = _groups(problem, graph)
    regions, units = [], []
    for ops, mode in groups:
        if fine:
            first = len(regions)
            regions += _exact_regions(ops, mode, terms, ks, problem, graph)
            if mode is not None and len(ops) > 1:
                units.append((first, len(regions) - 1))
        else:
            regions.append(_block_region(ops, mode, terms, problem, graph))
    chain = () if fine else _chain(graph, regions)
    return PeakGraph.build(list(cg.names), ks, additive, regions, chain=chain, exclude=exclude, units=units)


def _mode_pair(mode: int | None, keep: np.ndarray, recompute: np.ndarray) -> tuple[tuple[int, ...], np.ndarray]:
    """A table over (mode, ...) that is ``keep`` when the unit keeps its activations and
    ``recompute`` when it recomputes them (just ``keep`` where there is no mode)."""
    if mode is None:
        return (), keep
    return (mode,), np.stack([keep, recompute])


def _exact_regions(ops, mode, tm: _Terms, ks, problem, graph) -> list[Region]:
    """One region per operator: the definition term for term."""
    first, last = ops[0], ops[-1]
    regions = []
    for j, p in enumerate(ops):
        kinds: dict[str, list[Term]] = {k: [] for k in ("held", "view", "remat", "local", "base", "rise")}
        zero = np.zeros_like(tm.act[p])
        m, held = _mode_pair(mode, tm.act[p], tm.kept.get(p, zero))
        kinds["held"].append(Term(m + (p,), held))
        copy = tm.tied.get(p)
        if copy is not None:      # kept in either mode: a tied use inside a recomputed unit is rare
            kinds["held"].append(Term(copy[0], copy[1]))
        for kind, term in tm.resave.get(p, ()):
            kinds[kind].append(term)
        if mode is not None:
            kinds["remat"].append(tm.remat(mode, first, p))
            if p == first:
                k = problem.units.index(next(u for u in problem.units if u[1][0] == first))
                u = tm.unit_input[k]
                kinds["held"].append(Term((mode, p), np.stack([np.zeros_like(u), u])))
        extra = tm.extra[p] if tm.extra is not None else 0.0
        # p's backward, beside the gradients pending through it
        again = [Term(copy[0], copy[2])] if copy is not None and copy[2].any() else []
        kinds["local"].append(_sum([Term((p,), tm.trans[p] + extra)] + again
                                   + [Term((s,), tm.out[s]) for s in tm.pending(p)]))
        # a layout move's backward after p's: p's activations freed, no gradient pending
        for s, d in tm.into.get(p, ()):
            kinds["local"].append(Term((s, p), tm.moves[(s, d)][0] - tm.act[p][None, :] + extra))
        if p in tm.forward:
            kinds["local"].append(_forward_moment(p, tm.forward[p], kinds, regions, mode, tm))
        if mode is not None:
            # the unit's second forward at p: p's output, a forward move into p, the unit's
            # outputs that still wait for a later user
            gate = Term((mode,), np.array([-np.inf, 0.0]))         # a position only when recomputing
            for e in tm.into.get(p, ()) or [None]:
                parts = [gate, Term((p,), tm.out[p])] + [Term((s,), tm.out[s]) for s in tm.waiting(first, last, p)]
                if e is not None:
                    parts.append(Term((e[0], p), tm.moves[e][1]))
                kinds["rise"].append(_sum(parts))
            if p == last:
                _base(kinds, mode, last, tm)
        regions.append(Region((p,) + ((mode,) if mode is not None and p == first else ()), None,
                              **{k: tuple(v) for k, v in kinds.items()}, name=graph.operators[p].name))
    return regions


def _forward_moment(p: int, at: tuple[float, bool], kinds: dict, before: list[Region], mode, tm: _Terms):
    """A moment of the forward pass as a position of ``p``'s region: ``M`` plus ``at[0]``, less
    the activations of the operators after ``p`` (and ``p``'s own where ``at[1]``: the moment
    comes before ``p`` runs). The recurrence adds the region's pending gradients and the
    unit's rematerialised activations to a position; those do not exist in the forward pass,
    so the term takes them off again."""
    extra, before_p = at
    off = kinds["view"] + kinds["remat"] + (kinds["held"] if before_p else [])
    if mode is not None:
        off += [t for r in before for t in r.remat]
    parts = [Term((p,), np.full(len(tm.act[p]), extra))]
    for t in off:
        parts += [Term(q.scope, -q.table) for q in (t.parts if isinstance(t, SumTerm) else (t,))]
    return _sum(parts)


def _fsdp_forward(problem: MeshProblem, graph, params) -> dict[int, tuple[float, bool]]:
    """FSDP2 ``fully_shard``'s forward pass, beyond ``M`` (measured on CPU/gloo, and what
    ``foreach_all_gather`` does on any device): each group all-gathers its parameters into one
    flat buffer and copies them out into the unsharded ones; the flat buffer stays until the
    next group's copy-out, the last one until the forward pass ends. Every parameter is padded
    along its first dimension to a multiple of the devices, shards and gathered copies alike.
    So at a block's gather the device holds the shards, the gathered groups (ZeRO-2: the root
    and the blocks so far; ZeRO-3: the root and this block), the previous group's flat
    buffer and this one's; at the end of forward, the last flat buffer beside ``M``. Returns
    per operator (bytes beyond ``M``, whether the moment comes before its activations): each
    block's first operator, and the last operator."""
    zero, d = problem.zero_stage, problem.mesh.size
    if zero not in (2, 3) or not graph.blocks:
        return {}
    group = {m: b for b, m in enumerate(graph.block_modules)}
    padded = np.zeros(len(graph.blocks) + 1)            # elements per group (the blocks, then the root)
    numel = 0
    seen: set[str] = set()
    for op in graph.operators:
        for t, name in zip(op.operands, op.param_names):
            if name is None or name in seen:
                continue
            seen.add(name)
            rows = t.shape[0] if t.shape else 1
            padded[group.get(gradient_group(graph, op), -1)] += -(-rows // d) * d * (t.numel // rows if rows else 0)
            numel += t.numel
    charged = float(sum(p[0] for p in params))          # what M holds of them
    # in bytes at the training precision: M's parameters are the whole (ZeRO-2) or the shard
    padded *= charged * (d if zero == 3 else 1) / numel if numel else 0.0
    shards = float(padded.sum()) / d
    root = padded[-1]
    out: dict[int, tuple[float, bool]] = {}
    flat_before = root
    for b, ops in enumerate(graph.blocks):
        gathered = root + (padded[:b + 1].sum() if zero == 2 else padded[b])
        out[ops[0]] = (shards + gathered - charged + flat_before + padded[b], True)
        flat_before = padded[b]
    gathered = padded.sum() if zero == 2 else root
    out[len(graph.operators) - 1] = (shards + gathered - charged + flat_before, False)
    return out


def _base(kinds, mode: int, last: int, tm: _Terms) -> None:
    """Beside a unit's second forward: the gradient of its output and of those pending
    through its last operator (and FSDP2's holdings at its last operator)."""
    for s in [last] + tm.pending(last):
        kinds["base"].append(Term((mode, s), np.stack([np.zeros_like(tm.out[s]), tm.out[s]])))
    if tm.extra is not None:
        kinds["base"].append(Term((mode,), np.array([0.0, float(tm.extra[last][0])])))


def _block_region(ops, mode, tm: _Terms, problem, graph) -> Region:
    """One region for a block: its positions see the activations (or rematerialised ones)
    of the block's later operators at their least over configurations, and every gradient
    pending anywhere in it."""
    kinds: dict[str, list[Term]] = {k: [] for k in ("held", "view", "remat", "local", "base", "rise")}
    first, last = ops[0], ops[-1]
    keep_min = np.array([tm.act[i].min() for i in ops])
    rc_min = np.array([(tm.act[i] + tm.reg[i]).min() for i in ops])
    after_keep = np.append(np.cumsum(keep_min[::-1])[::-1][1:], 0.0)
    after_rc = np.append(np.cumsum(rc_min[::-1])[::-1][1:], 0.0)
    # the unit's second forward still holds the outputs its policy kept of later operators
    remat = {p: tm.remat(mode, first, p) for p in ops} if mode is not None else {}
    rise_min = np.array([remat[p].table[1].min() for p in ops]) if mode is not None else keep_min
    after_rise = np.append(np.cumsum(rise_min[::-1])[::-1][1:], 0.0)
    for s in sorted({s for p in ops for s in tm.pending(p)}):
        kinds["view"].append(Term((s,), tm.out[s]))
    for j, p in enumerate(ops):
        zero = np.zeros_like(tm.act[p])
        m, held = _mode_pair(mode, tm.act[p], tm.kept.get(p, zero))
        kinds["held"].append(Term(m + (p,), held))
        if mode is not None:
            kinds["remat"].append(remat[p])
        for kind, term in tm.resave.get(p, ()):
            kinds[kind].append(term)
        extra = tm.extra[p] if tm.extra is not None else 0.0
        value = tm.trans[p] + extra
        m, table = _mode_pair(mode, value - after_keep[j], value - after_rc[j])
        kinds["local"].append(Term(m + (p,), table))
        for s, d in tm.into.get(p, ()):
            value = tm.moves[(s, d)][0] - tm.act[p][None, :] + extra
            m, table = _mode_pair(mode, value - after_keep[j], value - after_rc[j])
            kinds["local"].append(Term(m + (s, p), table))
    if mode is not None:
        k = problem.units.index(next(u for u in problem.units if u[1][0] == first))
        u = tm.unit_input[k]
        kinds["held"].append(Term((mode, first), np.stack([np.zeros_like(u), u])))
        waiting = sorted({s for j in ops for s in tm.waiting(first, last, j)})
        for s in [last] + tm.pending(last) + waiting:
            kinds["base"].append(Term((mode, s), np.stack([np.zeros_like(tm.out[s]), tm.out[s]])))
        if tm.extra is not None:
            kinds["base"].append(Term((mode,), np.array([0.0, float(tm.extra[last][0])])))
        for j, p in enumerate(ops):
            for e in tm.into.get(p, ()) or [None]:
                scope, value = ((p,), tm.out[p]) if e is None else ((e[0], p), tm.moves[e][1] + tm.out[p][None, :])
                kinds["rise"].append(Term((mode, *scope), np.stack([np.full(value.shape, -np.inf),
                                                                     value - after_rise[j]])))
    return Region(tuple(ops) + ((mode,) if mode is not None else ()), mode,
                  **{k: tuple(v) for k, v in kinds.items()}, name=graph.operators[first].module)


def _resave_terms(problem: MeshProblem, graph, fine: bool, cut, additive: list) -> dict:
    """The copies an operator keeps of saved tensors another is charged for
    (``MeshProblem.resaved``): end-of-forward memory (``additive``, extended here) and, per
    operator, its region's terms -- held while it keeps its activations, rematerialised when
    its unit recomputes. The block graph takes them at the largest over the nodes outside
    the operator's group (never below the exact graph, and no term across blocks)."""
    mode_of = {i: len(problem.configs) + k for k, (_, ops) in enumerate(problem.units) for i in ops}
    group_of = {}
    if not fine:
        for g, (ops, _) in enumerate(_groups(problem, graph)):
            group_of.update(dict.fromkeys(ops, g))
    f = problem.activation_factor
    out: dict[int, list] = {}
    made: dict[tuple, tuple] = {}        # like operators' shared tables give one set of terms' tables
    for scope, table in problem.resaved:
        c = scope[-1]
        far = tuple(a for a, v in enumerate(scope) if group_of[v] != group_of[c]) if not fine else ()
        m = mode_of.get(c)
        t = cut(scope, table)
        # a table taken whole is shared by like operators, and so are the terms' tables made of it
        key = (id(table), far, m is None) if t is table else None
        if key is None or key not in made:
            if far:
                t = t.max(axis=far)
            zero = np.zeros_like(t)
            if m is None:
                tables = (np.stack([zero, f * t], axis=-1), t)
            else:
                tables = (np.stack([np.stack([zero, f * t], axis=-1), np.stack([zero, zero], axis=-1)]),
                          np.stack([t, zero]), np.stack([zero, t]))
            for x in tables:
                x.setflags(write=False)
            if key is not None:
                made[key] = tables
        else:
            tables = made[key]
        scope = tuple(v for a, v in enumerate(scope) if a not in far)
        if m is None:
            additive.append(Term(scope, tables[0]))
            out.setdefault(c, []).append(("held", Term(scope, tables[1])))
        else:
            additive.append(Term((m,) + scope, tables[0]))
            out.setdefault(c, []).append(("held", Term((m,) + scope, tables[1])))
            out.setdefault(c, []).append(("remat", Term((m,) + scope, tables[2])))
    return out


def _groups(problem: MeshProblem, graph) -> list[tuple[tuple[int, ...], int | None]]:
    """(operators, mode node) in order: each repeated block (recompute unit) together,
    every other operator alone."""
    n_ops = len(problem.configs)
    mode_of = {name: n_ops + k for k, (name, _) in enumerate(problem.units)}
    first = {ops[0]: (tuple(ops), mode_of.get(name)) for name, ops in recompute_units(graph)}
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


def _sum(parts: list[Term]):
    """One term, or the sum of several (its joint table built only if a search needs it)."""
    return parts[0] if len(parts) == 1 else SumTerm(tuple(parts))


def _replicate_extra(grads, params, problem: MeshProblem, graph, regathered) -> list[np.ndarray]:
    """Per operator (one configuration each here): what FSDP2 holds while it runs its
    backward, beyond what the cost model charges operator by operator (measured on CPU/gloo).

    * ``replicate`` (ZeRO 0): the unsharded parameter copy, and the gradients of the
      operators after it (reduced already, their buffers kept until backward ends);
    * ``fully_shard`` keeping parameters gathered after forward (ZeRO 2): the sharded
      parameters beside the gathered ones, and the whole gradients its group has made so
      far (reduce-scattered when the group's backward ends, ``_pending_group_grads``);
    * ``fully_shard`` resharding after forward (ZeRO 3), one group per repeated block and one
      for the rest (the root, which keeps its parameters gathered from forward on): the
      root's parameters, those of the operator's block and, prefetched, of the block whose
      backward comes next (after the last block: the last block), less the gathered copy
      the operator's own cost already holds (its parameters, a prefetch of their size and
      their unsharded gradient); and the group's pending gradients, as under ZeRO 2."""
    zero, d = problem.zero_stage, problem.mesh.size
    block_of = {i: b for b, ops in enumerate(graph.blocks) for i in ops}
    if zero:
        pending = _pending_group_grads(np.array([g[0] * d for g in grads]), block_of, d)
    if zero == 2:
        shard = float(sum(p[0] for p in params)) / d
        return [np.array([shard + pending[i]]) for i in range(len(grads))]
    if zero == 3:
        full = np.array([p[0] * d for p in params])               # charged: the shard
        in_block = np.zeros(len(graph.blocks))
        for i, b in block_of.items():
            in_block[b] += full[i]
        root = float(full.sum() - in_block.sum())
        # gradient bytes per parameter byte, as the cost model charges them
        ratio = next((g[0] / p[0] for g, p in zip(grads, params) if p[0] > 0), 1.0)
        last = max(block_of.values(), default=-1)
        first_block_op = min(block_of, default=len(params))
        out = []
        for i in range(len(params)):
            b = block_of.get(i)
            if b is None:
                b_now = None
                b_next = last if i > first_block_op else None     # after the blocks: the last one comes next
            else:
                b_now, b_next = b, b - 1 if b > 0 else None
            held = root + sum(in_block[x] for x in (b_now, b_next) if x is not None)
            own = float(regathered[i][0]) * (2 + ratio) * (1 - 1 / d)
            out.append(np.array([max(held - own, 0.0) + pending[i]]))
        return out
    copy = float(sum(p[0] for p in params))
    g = np.array([gr[0] for gr in grads])
    done = np.append(np.cumsum(g[::-1])[::-1][1:], 0.0)
    return [np.array([copy + done[i]]) for i in range(len(grads))]


def _pending_group_grads(full_grads: np.ndarray, block_of: dict, devices: int) -> np.ndarray:
    """Per operator, under FSDP2 ``fully_shard`` (one group per repeated block, one for the
    rest): the whole gradients its group's operators after it have made, which wait for the
    group's reduce-scatter at the end of its backward (the root group's: at the end of the
    step's backward), and at the group's first operator the reduce-scatter's output.
    ``block_of``: operator -> its repeated block."""
    out = np.zeros(len(full_grads))
    seen: dict = {}
    first: dict = {}
    for i in range(len(full_grads) - 1, -1, -1):          # backward order
        g = block_of.get(i, "root")
        out[i] = seen.get(g, 0.0)
        seen[g] = seen.get(g, 0.0) + full_grads[i]
        first[g] = i
    for g, i in first.items():
        # the reduce-scatter's output shard, beside the whole gradients, before it is added
        # to the kept one
        out[i] += seen[g] / devices
    return out


def _input_terms(problem: MeshProblem, graph, microbatches: int, pick) -> list[Term]:
    """The step's input batch: every rank holds the whole batch, less what activations
    already charge of it -- an operator that keeps a graph input unsplit keeps that very
    tensor (as terms: a constant, and per such operator minus that input; two operators that
    keep one input both charge it as an activation, so both take it off)."""
    fed = {(e.dst, e.operand) for e in graph.edges}
    first_of_unit = {ops[0] for _, ops in problem.units}
    shape = problem.mesh.shape
    f = problem.activation_factor
    terms = []
    for i, op in enumerate(graph.operators):
        term_of, _ = op.terms
        acts = [k for k, p in enumerate(op.param_names) if p is None]
        shared = np.zeros(len(problem.configs[i]))
        for k in acts:
            if (i, k) in fed or "b" not in term_of[k]:
                continue
            if k in op.saved_operands or (i in first_of_unit and k == acts[0]):
                shared += [op.operands[k].nbytes if c.shards(term_of[k], shape) == 1 else 0.0
                           for c in problem.configs[i]]
        if shared.any():
            terms.append(Term((i,), np.stack([np.zeros_like(shared), -f * shared], axis=-1)[pick[i]]))
    terms.append(Term((), np.array([0.0, microbatches * float(graph.input_bytes)])))
    return terms


def _chain(graph, regions: list[Region]) -> tuple[int, ...]:
    """The block graph's regions of the repeated blocks, when consecutive."""
    if len(graph.blocks) < 2:
        return ()
    firsts = {b[0] for b in graph.blocks}
    idx = [g for g, r in enumerate(regions) if r.nodes[0] in firsts and len(r.nodes) > 1]
    if len(idx) != len(graph.blocks) or any(b != a + 1 for a, b in zip(idx, idx[1:])):
        return ()
    return tuple(idx)
