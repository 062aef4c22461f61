"""From an operator graph on one mesh to a cost graph.

``build_problem`` enumerates every operator's configurations (``strategy``), prices them
and every edge (``costmodel``) and the later uses of tied parameters (``traffic``), and gives
a :class:`MeshProblem`: a plain :class:`CostGraph` of time and end-of-forward memory, and
per operator what its backward holds (``backward_tables``, ``edge_transients``, ``skips``),
from which ``peakmodel`` builds the step's peak. Operators with identical shapes and roles
share one cost computation.

Activation recomputation is one more node per recompute unit (each repeated block's module,
``OpGraph.block_modules``; in a graph without blocks each ``layers.<i>`` module),
with two configurations, keep (0) or recompute (1), and an edge to every operator of the
unit: keep charges the operator's saved activations, recompute charges a second forward
instead (and, on the unit's first operator, the unit input that the checkpoint keeps).
Under a selective policy (``recompute.POLICIES``) recompute charges, for an operator whose
output the unit keeps, that output and no second forward. The operator nodes themselves then
carry no activation memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .costmodel import CostModel, NodeCost, edge_tables
from .engine import CostGraph
from .engine.costgraph import total
from .engine.bounds import LowerBound, lower_bound
from .execution import batch_statistics_axes, gradient_group, latency_shares
from .mesh import Mesh
from .opgraph import OpGraph, Operator
from .recompute import kept_outputs
from .strategy import OpConfig, enumerate_configs, term_placements
from .traffic import grad_partial, owners, tied_copy, tied_use_moves, tied_uses

__all__ = ["MeshProblem", "build_problem", "owners", "recompute_units", "returned_ops", "replicate_configs",
           "replicate_times", "takes_configs"]

_UNIT = re.compile(r"^(.*?\blayers\.\d+)(?:\.|$)")


SPLIT_NONE, SPLIT_BATCH, SPLIT_OTHER = 0, 1, 2


@dataclass(frozen=True)
class MeshProblem:
    mesh: Mesh
    zero_stage: int
    configs: tuple[tuple[OpConfig, ...], ...]    # per operator
    node_costs: tuple[tuple[NodeCost, ...], ...]  # per operator, per configuration
    units: tuple[tuple[str, tuple[int, ...]], ...]  # recompute units: (module FQN, operator indices)
    unit_input_bytes: tuple[tuple[float, ...], ...]  # per unit, per configuration of its first operator
    cost_graph: CostGraph                         # nodes: operators, then one node per unit
    tied_s: dict = None                           # operator -> per-configuration tied-parameter moves (s)
    activation_factor: float = 1.0                # micro-batches of activations held (pipeline stages)
    accumulates: bool = False                     # gradients accumulate over micro-batches (pipeline stages)
    edge_transients: tuple = ()                   # (src, dst, backward, forward): layout moves' buffers, K_src x K_dst
    skips: tuple = ()                             # (src, last consumer) where that is not src + 1
    # per operator: the share of its parameters' bytes that a later operator uses too (tied
    # weights); its backward's gradient of them is added to the one already there
    tied_share: tuple = ()
    # (first user, later user, held, regathered): K_first x K_later bytes of the copy of a tied
    # parameter its later user works on (``traffic.tied_copy``), kept from forward to its
    # backward, or under ZeRO-3 gathered again for it
    tied_copies: tuple = ()
    # (scope, bytes): an operator that saves a tensor another operator is charged for keeps a
    # copy of its own where it moves it to another layout (``_resaved_copies``); ``scope`` is
    # (producer, [previous saver,] that operator), the table over their configurations
    resaved: tuple = ()
    recompute_policy: str = "full"                # what a recomputed unit keeps (``recompute``)
    recompute_kept: frozenset = frozenset()       # operators whose output a recomputed unit keeps
    # per operator its configuration in the plan FSDP2 runs (``replicate_configs``), or None
    # (the peak model prices FSDP2's holdings for it only where it is ``fsdp_holdings_priced``)
    replicate_configs: np.ndarray | None = None
    # per operator, what that plan's time differs by from its price in ``cost_graph``: FSDP2
    # groups the parameter collectives the DTensor runner issues one by one under ZeRO-2/3
    # (``execution.groups_parameter_collectives``) and runs the model's own code, not each
    # operator on DTensor (``CostTerms.per_dtensor_op_s``); None where it does not differ
    replicate_time_s: np.ndarray | None = None
    replicate_costs: tuple = ()                   # per operator, its NodeCost in that plan
    fixed_s: float = 0.0                          # the fixed cost per step (``CostModel.fixed_s``)

    @property
    def fsdp_holdings_priced(self) -> bool:
        """Whether the peak model prices FSDP2's own holdings for the plan it runs. Not for
        ZeRO-1, which with one micro-batch runs as ZeRO-2 (``plan_for`` prices it so) and as
        itself only while accumulating, nor for any accumulating plan: FSDP2's holdings over
        micro-batches are not priced (the search does not offer ZeRO-1); such a plan's peak is
        priced as the DTensor runner's, its time as FSDP2's."""
        return self.replicate_configs is not None and not self.accumulates and self.zero_stage != 1

    def is_replicate(self, assignments) -> np.ndarray:
        """Per assignment (configuration per operator, then per unit), whether FSDP2 runs it."""
        return takes_configs(assignments, self.replicate_configs)

    def priced_apart(self, assignment) -> bool:
        """Whether one assignment is FSDP2's plan at a price other than the cost graph's."""
        return self.replicate_time_s is not None and bool(self.is_replicate(assignment)[0])

    def lower_bound(self) -> LowerBound:
        """``engine.lower_bound`` of the cost graph, less what FSDP2's plan saves on it, in
        peak memory (``min_rise`` above the end of forward)."""
        bound = lower_bound(self.cost_graph).shifted(self.min_rise())
        if self.replicate_time_s is not None:
            bound = bound.faster_by(-float(np.minimum(self.replicate_time_s, 0.0).sum()))
        return bound

    def min_rise(self) -> float:
        """No plan's peak is below its end-of-forward memory plus this: the least transient of
        the last operator's backward, the first moment of the backward pass, when every
        activation is still held (``peakmodel``: that moment's other terms are never
        negative)."""
        trans = self.backward_tables[1]
        return max(float(trans[-1].min()), 0.0) if trans else 0.0

    def time_of(self, assignment) -> float:
        """The step time of one assignment, as a plan of it is priced (``cost_graph`` and,
        for the plan FSDP2 runs, ``replicate_time_s``)."""
        terms = self.cost_graph.terms(assignment)
        if self.priced_apart(assignment):
            terms = terms.copy()
            n = len(self.configs)
            terms[:n, 0] = replicate_times(terms[:n, 0], self.replicate_time_s)
        return float(total(terms)[0])

    def recompute_node(self, unit: int) -> int:
        return len(self.configs) + unit

    @cached_property
    def labels(self) -> dict[tuple[int, int], tuple[str, str]]:
        """(operator, configuration) -> its plan labels (config, output placements), filled
        as plans are built (``plan_builder``)."""
        return {}

    @cached_property
    def choices(self) -> dict:
        """(operator, configuration, its priced values) -> the plan's ``OpChoice``, filled
        as plans are built (``plan_builder``): plans of one problem share most of them."""
        return {}

    @cached_property
    def cost_fields(self) -> dict[str, np.ndarray]:
        """Per ``NodeCost`` field a plan reads, (operators, most configurations): each
        operator's value under each of its configurations (0 past its last)."""
        k = max((len(c) for c in self.node_costs), default=1)
        out = {}
        for name in ("compute_s", "comm_s", "forward_s", "param_bytes", "grad_bytes", "optimizer_bytes",
                     "activation_bytes", "output_bytes", "update_s"):
            table = np.zeros((len(self.node_costs), k))
            for i, costs in enumerate(self.node_costs):
                table[i, :len(costs)] = [getattr(c, name) for c in costs]
            out[name] = table
        return out

    @cached_property
    def split_codes(self) -> np.ndarray:
        """(mesh axes, operators, most configurations): what each operator's configuration
        splits over each axis, ``SPLIT_NONE``, ``SPLIT_BATCH`` or ``SPLIT_OTHER`` (a plan's
        summary reads them)."""
        k = max((len(c) for c in self.configs), default=1)
        codes = np.full((self.mesh.ndim, len(self.configs), k), SPLIT_NONE, dtype=np.int8)
        for i, cfgs in enumerate(self.configs):
            for j, cfg in enumerate(cfgs):
                for axis, s in enumerate(cfg.splits):
                    codes[axis, i, j] = SPLIT_NONE if s is None else SPLIT_BATCH if s == "b" else SPLIT_OTHER
        return codes

    @cached_property
    def backward_tables(self) -> tuple[tuple[np.ndarray, ...], ...]:
        """Per operator, per configuration: saved activation bytes (one micro-batch), the
        transient its backward adds, its output's bytes and, under ZeRO-3, the gathered
        parameters a recomputed forward keeps (see ``peakmodel``)."""
        act = tuple(np.array([c.activation_bytes for c in costs]) for costs in self.node_costs)
        # a gradient added to one already held (micro-batches accumulating, or a tied weight's
        # first user, reached last in backward) is a fresh buffer first
        share = self.tied_share or (0.0,) * len(self.node_costs)
        trans = tuple(np.array([c.transient_bytes + (1.0 if self.accumulates else f) * c.grad_bytes for c in costs])
                      for costs, f in zip(self.node_costs, share))
        out = tuple(np.array([c.output_bytes for c in costs]) for costs in self.node_costs)
        regathered = tuple(np.array([c.regathered_bytes for c in costs]) for costs in self.node_costs)
        return act, trans, out, regathered


def takes_configs(assignments, configs: np.ndarray | None) -> np.ndarray:
    """Per assignment (rows: configuration per operator, then per unit), whether its
    operators take exactly ``configs`` (one per operator; None: no assignment does)."""
    a = np.atleast_2d(np.asarray(assignments, dtype=np.int64))
    if configs is None:
        return np.zeros(len(a), dtype=bool)
    return (a[:, :len(configs)] == configs).all(axis=1)


def replicate_times(times: np.ndarray, replicate_time_s: np.ndarray) -> np.ndarray:
    """Operators' times in the cost graph (per operator, or any shape that broadcasts) as the
    plan FSDP2 runs prices them (``MeshProblem.replicate_time_s``): the one place that
    sum is made, so every caller gets the same bits."""
    return np.maximum(times + replicate_time_s, 0.0)


def replicate_configs(graph: OpGraph, configs, mesh_shape) -> np.ndarray | None:
    """Per operator, its configuration in the plan the apply layer runs with FSDP2
    ``replicate`` (every axis of more than one device splits the batch of every batched
    operator while the others replicate, and no batch statistics are synchronised) -- or,
    under ZeRO, FSDP2 ``fully_shard`` -- or None when no plan of this problem runs that way
    (an operator with no such configuration; pipeline stages, which the caller leaves out)."""
    if any(n > 1 for n in mesh_shape) and not any(op.batched for op in graph.operators):
        return None
    out = []
    for op, cfgs in zip(graph.operators, configs):
        want = "b" if op.batched else None
        hits = [j for j, c in enumerate(cfgs)
                if all(s == want for s, n in zip(c.splits, mesh_shape) if n > 1) and not batch_statistics_axes(op, c)]
        if len(hits) != 1:
            return None
        out.append(hits[0])
    return np.array(out, dtype=np.int64)


def _skips(graph: OpGraph) -> tuple[tuple[int, int], ...]:
    last: dict[int, int] = {}
    for e in graph.edges:
        last[e.src] = max(last.get(e.src, e.dst), e.dst)
    return tuple((s, d) for s, d in sorted(last.items()) if d > s + 1)


def recompute_units(graph: OpGraph) -> list[tuple[str, tuple[int, ...]]]:
    """Operators grouped by the repeated block that owns them (``graph.block_modules``), in
    order; a graph without blocks by its ``layers.<i>`` modules."""
    units: dict[str, list[int]] = {}
    if graph.block_modules:
        for i, op in enumerate(graph.operators):
            name = gradient_group(graph, op)
            if name:
                units.setdefault(name, []).append(i)
        return [(name, tuple(ops)) for name, ops in units.items()]
    for i, op in enumerate(graph.operators):
        m = _UNIT.match(op.module)
        if m:
            units.setdefault(m.group(1), []).append(i)
    return [(name, tuple(ops)) for name, ops in units.items()]


def returned_ops(graph: OpGraph, accumulates: bool = False) -> frozenset[int]:
    """Operators whose outputs the step holds to its end because the forward returns them
    (``OpGraph.returned``), charged with the activations. A pipeline stage's schedule keeps
    only the loss (``accumulates``: a stage's problem)."""
    return frozenset() if accumulates else frozenset(graph.returned)


def _signature(op: Operator, owns: bool) -> tuple:
    return (op.family, op.equation, op.operands, tuple(p is None for p in op.param_names), op.output,
            op.splittable, op.flops_fwd, op.flops_bwd, op.saved_operands, op.saved_extra_bytes,
            op.backward_extra_bytes, op.aten, op.dispatches, op.members, owns)


def build_problem(graph: OpGraph, mesh: Mesh, cost_model: CostModel, zero_stage: int = 0,
                  recompute: bool = True, activation_factor: float = 1.0, comm_factor: float = 1.0,
                  batch_only_axes: tuple[int, ...] = (), accumulates: bool = False,
                  recompute_policy: str = "full", update_factor: float | None = None,
                  pipeline_stage: bool = False) -> MeshProblem:
    """``recompute_policy``: what a recomputed unit keeps (``recompute.POLICIES``).
    ``activation_factor`` multiplies saved activations (micro-batches in flight in a
    pipeline stage); ``comm_factor`` multiplies parameter-gradient traffic (once per
    iteration, where the rest of a stage's cost is per micro-batch) and ``update_factor``
    (default ``comm_factor``) the optimizer's update. ``batch_only_axes``:
    mesh axes on which operators may only split the batch or replicate (data parallel);
    ``accumulates``: parameter gradients are summed over micro-batches (each micro-batch's
    gradient is a temporary before it is added); ``pipeline_stage``: a stage of a pipeline,
    which the apply layer runs on DTensor whatever its configurations (no FSDP2 plan)."""
    own = owners(graph)
    sigs = [_signature(op, o) for op, o in zip(graph.operators, own)]
    # like operators share their configurations and costs, within a problem and across the
    # problems of one cost model (pipeline stages at one micro-batch size, on one mesh)
    cache = cost_model.node_cache
    shares = latency_shares(graph)
    share_keys = [tuple(shares.get(p, 1.0) for p in op.param_names if p is not None) for op in graph.operators]
    configs, costs = [], []
    for op, o, sig, sk in zip(graph.operators, own, sigs, share_keys):
        key = (sig, sk, mesh, zero_stage, batch_only_axes)
        if key not in cache:
            cfgs = tuple(c for c in enumerate_configs(op, mesh)
                         if all(c.splits[a] in (None, "b") for a in batch_only_axes))
            cache[key] = (cfgs, tuple(cost_model.node_cost(op, c, mesh, owns_params=o, zero_stage=zero_stage,
                                                           latency_shares=shares) for c in cfgs))
        configs.append(cache[key][0])
        costs.append(cache[key][1])
    edge_cache = cost_model.edge_cache
    edges, edge_transients, ahead_of = [], [], {}
    for e in graph.edges:
        key = (sigs[e.src], sigs[e.dst], e.operand, e.dim_map, mesh, batch_only_axes)
        if key not in edge_cache:
            edge_cache[key] = edge_tables(cost_model, graph, e, list(configs[e.src]), list(configs[e.dst]), mesh)
            for t in edge_cache[key]:
                t.setflags(write=False)                        # shared by every like edge
        table, moved, ahead = edge_cache[key]
        edges.append((e.src, e.dst, table))
        ahead_of[e.dst, e.operand] = (e.src, ahead)
        if moved.any() or ahead.any():
            edge_transients.append((e.src, e.dst, moved, ahead))

    tied = _tied_parameter_times(graph, configs, mesh, cost_model)
    units = recompute_units(graph) if recompute else []
    in_unit = {i for _, ops in units for i in ops}
    kept = returned_ops(graph, accumulates)
    nodes = []
    update_factor = comm_factor if update_factor is None else update_factor
    for i, (op, cs) in enumerate(zip(graph.operators, costs)):
        act = 0.0 if i in in_unit else activation_factor
        table = np.array([[c.compute_s + comm_factor * c.comm_s + update_factor * c.update_s, c.memory_bytes + (act - 1) * c.activation_bytes
                           + (c.output_bytes if i in kept else 0.0)] for c in cs])
        if i in tied:
            table[:, 0] += tied[i]
        nodes.append((op.name, table))
    input_bytes = []
    kept_outs = frozenset(i for _, ops in units for i in kept_outputs(graph, ops, recompute_policy))
    for u, (name, ops) in enumerate(units):
        node = len(nodes)
        nodes.append((f"recompute:{name}", np.zeros((2, 2))))
        first = graph.operators[ops[0]]
        kept = _unit_input_bytes(first, configs[ops[0]], mesh, cost_model)
        input_bytes.append(tuple(kept))
        for j, i in enumerate(ops):
            table = np.zeros((2, len(costs[i]), 2))
            table[0, :, 1] = [activation_factor * c.activation_bytes for c in costs[i]]
            if i in kept_outs:
                table[1, :, 1] = [activation_factor * c.output_bytes for c in costs[i]]
            else:
                table[1, :, 0] = [c.forward_s for c in costs[i]]
            if j == 0:
                table[1, :, 1] += activation_factor * np.asarray(kept)
            edges.append((node, i, table))
    blocks = _blocks_with_units(graph.blocks, units, len(graph.operators))
    cg = CostGraph.build(nodes, edges, blocks=blocks)
    copies = _tied_copies(graph, configs, mesh, cost_model, zero_stage)
    resaved = _resaved_copies(graph, configs, mesh, cost_model, ahead_of, sigs, batch_only_axes)
    rep = None if pipeline_stage else replicate_configs(graph, configs, mesh.shape)
    rep_s, fsdp = None, []
    if rep is not None and mesh.size > 1:
        for i, (op, o, sig, sk) in enumerate(zip(graph.operators, own, sigs, share_keys)):
            cfg = configs[i][rep[i]]
            key = ("fsdp", sig, sk, mesh, zero_stage, cfg)
            if key not in cache:
                cache[key] = cost_model.node_cost(op, cfg, mesh, owns_params=o, zero_stage=zero_stage,
                                                  latency_shares=shares, fsdp=True)
            fsdp.append(cache[key])
        ran = [costs[i][rep[i]] for i in range(len(rep))]
        rep_s = np.array([(f.compute_s - c.compute_s) + comm_factor * (f.comm_s - c.comm_s)
                          + update_factor * (f.update_s - c.update_s) for f, c in zip(fsdp, ran)])
        if not rep_s.any():
            rep_s, fsdp = None, ()
    return MeshProblem(mesh, zero_stage, tuple(configs), tuple(costs), tuple(units), tuple(input_bytes), cg, tied,
                       activation_factor, accumulates, tuple(edge_transients), _skips(graph), _tied_share(graph),
                       copies, resaved, recompute_policy, kept_outs, rep, rep_s, tuple(fsdp), cost_model.fixed_s)


def _resaved_copies(graph: OpGraph, configs, mesh: Mesh, cost_model: CostModel, ahead_of: dict, sigs,
                    batch_only_axes) -> tuple:
    """Per operand an operator saves while another is charged for the tensor
    (``Operator.resaved``): the bytes of the copy it keeps, over (producer, [previous saver,]
    this operator). It keeps one where the move from the producer's layout makes a new tensor
    (``costmodel.edge_tables``' forward buffer), unless the previous saver moved it the same
    way: the apply layer moves a tensor once for every consumer that wants one layout. Where it
    does not move it, it shares the producer's, taken as charged already. Like operators with
    like edges share one read-only table (the repeated blocks', every ZeRO stage's)."""
    out = []
    for c, op in enumerate(graph.operators):
        for j, back, pj in op.resaved:
            if (c, j) not in ahead_of:
                continue                              # a model input: charged with the batch
            src, ahead = ahead_of[c, j]
            q = c - back
            before = ahead_of.get((q, pj), (None, None)) if pj != -1 and q >= 0 else (None, None)
            q_ahead = before[1] if before[0] == src else None
            # the edge tables are shared objects (build_problem's cache), kept alive with the key
            key = ("resaved", sigs[c], j, id(ahead), None if q_ahead is None else (sigs[q], pj, id(q_ahead)),
                   mesh, batch_only_axes)
            if key not in cost_model.edge_cache:
                cost_model.edge_cache[key] = (_resaved_table(graph, configs, mesh, cost_model, c, j, ahead, q, pj,
                                                             q_ahead), ahead, q_ahead)
            table = cost_model.edge_cache[key][0]
            if table is not None:
                out.append(((src, c) if table.ndim == 2 else (src, q, c), table))
    return tuple(out)


def _resaved_table(graph: OpGraph, configs, mesh: Mesh, cost_model: CostModel, c: int, j: int, ahead, q: int,
                   pj: int, q_ahead) -> np.ndarray | None:
    """:func:`_resaved_copies`' table for operand ``j`` of operator ``c`` (``q_ahead``: the
    forward buffers of operator ``q``'s operand ``pj``, which saved the same tensor before,
    or None), read-only; None where it keeps no copy."""
    op = graph.operators[c]
    term, spec = op.terms[0][j], op.operands[j]
    nbytes = spec.nbytes * cost_model.training.scale(spec)
    local = np.array([nbytes / cfg.shards(term, mesh.shape) for cfg in configs[c]])
    table = (ahead > 0) * local[None, :]                             # (K_src, K_c)
    if q_ahead is not None:
        q_term = graph.operators[q].terms[0][pj]
        keys: dict = {}
        kq = np.array([keys.setdefault((term_placements(g, q_term), grad_partial(g, q_term)), len(keys))
                       for g in configs[q]])
        kc = np.array([keys.setdefault((term_placements(g, term), grad_partial(g, term)), len(keys))
                       for g in configs[c]])
        shared = (q_ahead > 0)[:, :, None] & (kq[:, None] == kc[None, :])[None, :, :]
        table = table[:, None, :] * ~shared                          # (K_src, K_q, K_c)
    if not table.any():
        return None
    table.setflags(write=False)
    return table


def _tied_share(graph: OpGraph) -> tuple[float, ...]:
    later = {graph.operators[i].param_names[k] for i, k in tied_uses(graph)}
    out = []
    seen: set[str] = set()
    for op in graph.operators:
        own = [(t.nbytes, p) for t, p in zip(op.operands, op.param_names) if p is not None and p not in seen]
        seen.update(p for _, p in own)
        total = sum(b for b, _ in own)
        out.append(sum(b for b, p in own if p in later) / total if total else 0.0)
    return tuple(out)


def _tied_copies(graph: OpGraph, configs, mesh: Mesh, cost_model: CostModel, zero_stage: int) -> tuple:
    """Per later use of a tied parameter: (first user, later user, held, regathered), the
    bytes of the copy it works on over both users' configurations (``traffic.tied_copy``);
    only the uses where some pair of configurations makes one."""
    first: dict[str, tuple[int, int]] = {}
    for i, op in enumerate(graph.operators):
        for k, p in enumerate(op.param_names):
            if p is not None:
                first.setdefault(p, (i, k))
    out = []
    for i, k in tied_uses(graph):
        op = graph.operators[i]
        f, kf = first[op.param_names[k]]
        held = np.zeros((len(configs[f]), len(configs[i])))
        again = np.zeros_like(held)
        for a, fc in enumerate(configs[f]):
            for b, c in enumerate(configs[i]):
                nbytes, regathered = tied_copy(graph.operators[f], kf, fc, op, k, c, mesh.shape,
                                               cost_model.training, zero_stage)
                (again if regathered else held)[a, b] = nbytes
        if held.any() or again.any():
            out.append((f, i, held, again))
    return tuple(out)


def _tied_parameter_times(graph: OpGraph, configs, mesh: Mesh, cost_model: CostModel) -> dict[int, np.ndarray]:
    """Per later user of a tied parameter (lm_head using tok_emb.weight), per configuration:
    the time of its moves (``traffic.tied_use_moves``: as if the first user's copy were
    replicated). An edge to the first user would price it exactly, but that edge spans every
    block in between and breaks the chain the engine folds: a tenfold slower search on GPT-2."""
    out: dict[int, np.ndarray] = {}
    for i, k in tied_uses(graph):
        op = graph.operators[i]
        times = [cost_model.moves_s(tied_use_moves(op, k, c, mesh.shape, cost_model.training), mesh)
                 for c in configs[i]]
        out[i] = out.get(i, 0.0) + np.array(times)
    return out


def _unit_input_bytes(op: Operator, cfgs, mesh: Mesh, cost_model: CostModel) -> list[float]:
    """What a checkpoint keeps of a unit: its first operator's first activation input."""
    terms, _ = op.terms
    acts = [k for k, p in enumerate(op.param_names) if p is None]
    if not acts:
        return [0.0] * len(cfgs)
    k = acts[0]
    spec = op.operands[k]
    return [spec.nbytes * cost_model.training.scale(spec) / c.shards(terms[k], mesh.shape) for c in cfgs]


def _blocks_with_units(blocks, units, n_ops: int):
    """Each identical block also holds its recompute node, when units and blocks coincide."""
    if not blocks or not units:
        return blocks
    node_of = {frozenset(ops): n_ops + u for u, (_, ops) in enumerate(units)}
    out = []
    for block in blocks:
        node = node_of.get(frozenset(block))
        if node is None:
            return ()          # blocks and units differ: no repeated-block shortcut
        out.append(tuple(block) + (node,))
    return tuple(out)
