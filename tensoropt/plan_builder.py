"""From a solved cost graph back to a :class:`~tensoropt.plan.Plan`.

:func:`plan_from_assignment` prices one assignment (a configuration per operator and per
recompute unit of a :class:`~tensoropt.planner.MeshProblem`) operator by operator: compute,
communication, layout moves, state and activations, the backward pass's rise and the input
batch. :class:`Candidate` is a priced point whose plan is built only when it survives the
merge of frontiers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from .engine.costgraph import total
from .opgraph import OpGraph
from .placement import format_placements
from .plan import OpChoice, Plan
from .peakmodel import peak_model as build_peak_model
from .planner import SPLIT_BATCH, SPLIT_NONE, SPLIT_OTHER, MeshProblem, replicate_times, returned_ops
from .strategy import output_placements
from .training import TrainingConfig

__all__ = ["PlanContext", "Candidate", "plan_from_assignment", "assignment_of", "summarize"]


@dataclass(frozen=True)
class PlanContext:
    """What every plan of one search shares."""
    graph: OpGraph
    training: TrainingConfig
    param_signature: str         # ``capture.param_signature`` of the model
    epsilon: float
    devices: str                 # the device set as the user named it
    # how many problems each peak search (``peak_search.solve_problem``) served, filled as it runs
    peak_searches: Counter = field(default_factory=Counter, compare=False)

    def approximate(self, epsilon: float | None) -> "PlanContext":
        """The context of a job solved (1+ε)-approximately (None: as the search asked); its
        plans say so (``Plan.epsilon``), and it counts peak searches with the rest."""
        return self if epsilon is None else replace(self, epsilon=epsilon)


@dataclass(frozen=True)
class Candidate:
    """A priced frontier point; its :class:`~tensoropt.plan.Plan` is built on demand (a search
    keeps only the points that survive the merge of frontiers)."""
    time_s: float
    memory_bytes: float                  # the cost graph's (end-of-forward) memory
    peak_bytes: float                    # its plan's ``peak_memory_bytes``
    build: Callable[[], Plan]


def plan_from_assignment(ctx: PlanContext, problem: MeshProblem, assignment: Sequence[int], label: str = "",
                         microbatches: int = 1, held_peak: tuple[float, float] | None = None,
                         fixed_s: float | None = None) -> Plan:
    """Price one assignment (configuration index per operator, then per recompute unit; units
    default to keeping their activations) into a :class:`Plan`; its (end-of-forward memory,
    peak) are ``held_peak`` where the search priced them already, in one batch with others,
    else ``peakmodel.peak_model(problem, ctx.graph, microbatches)``'s. ``fixed_s``: the fixed
    cost per step it adds (None: the problem's; a pipeline stage's plan adds none, its
    pipeline adds it once)."""
    graph, mesh = ctx.graph, problem.mesh
    n_ops = len(graph.operators)
    a = [int(x) for x in assignment]
    if len(a) == n_ops:                        # operators only: keep every unit's activations
        a += [0] * len(problem.units)
    terms = problem.cost_graph.terms(a)
    u, v = problem.cost_graph.edge_ends
    from_ops = u < n_ops
    relayout = np.zeros(n_ops)
    np.add.at(relayout, v[from_ops], terms[problem.cost_graph.n_nodes:][from_ops, 0])   # in edge order
    for i, times in (problem.tied_s or {}).items():
        relayout[i] += times[a[i]]
    recomputed_ops: set[int] = set()
    recomputed, kept_inputs = [], 0.0
    for k, (name, unit_ops) in enumerate(problem.units):
        if a[problem.recompute_node(k)] == 1:
            recomputed.append(name)
            recomputed_ops.update(unit_ops)
            kept_inputs += problem.activation_factor * problem.unit_input_bytes[k][a[unit_ops[0]]]
    kept = returned_ops(graph, problem.accumulates)
    copies = np.zeros(n_ops)          # copies an operator keeps beyond its own activations (planner)
    for f, i, held, _ in problem.tied_copies:
        copies[i] += problem.activation_factor * held[a[f], a[i]]
    for scope, table in problem.resaved:
        if scope[-1] not in recomputed_ops:
            copies[scope[-1]] += problem.activation_factor * table[tuple(a[v] for v in scope)]
    # per operator, its configuration's costs (``MeshProblem.cost_fields``), as vectors
    pick = np.asarray(a[:n_ops], dtype=np.int64)
    f = {name: table[np.arange(n_ops), pick] for name, table in problem.cost_fields.items()}
    if problem.priced_apart(a):      # FSDP2 runs it (``MeshProblem.replicate_time_s``)
        f = {name: np.array([getattr(c, name) for c in problem.replicate_costs]) for name in f}
        terms = terms.copy()
        terms[:n_ops, 0] = replicate_times(terms[:n_ops, 0], problem.replicate_time_s)
    rec = np.zeros(n_ops, dtype=bool)
    rec[list(recomputed_ops)] = True
    keeps = np.zeros(n_ops, dtype=bool)
    keeps[list(problem.recompute_kept)] = True
    returned = np.zeros(n_ops, dtype=bool)
    returned[list(kept)] = True
    again = rec & ~keeps
    factor = problem.activation_factor
    act = np.where(rec, np.where(keeps, factor * f["output_bytes"], 0.0), factor * f["activation_bytes"])
    act = act + np.where(returned, f["output_bytes"], 0.0) + copies
    redo = np.where(again, f["forward_s"], 0.0)
    totals = dict(compute_s=_added(0.0, f["compute_s"]), recompute_s=_added(0.0, redo),
                  comm_s=_added(0.0, f["comm_s"]), relayout_s=0.0, update_s=_added(0.0, f["update_s"]),
                  param_bytes=_added(0.0, f["param_bytes"]), grad_bytes=_added(0.0, f["grad_bytes"]),
                  optimizer_bytes=_added(0.0, f["optimizer_bytes"]), activation_bytes=_added(kept_inputs, act))
    columns = zip((f["compute_s"] + redo).tolist(), f["comm_s"].tolist(), relayout.tolist(),
                  (f["param_bytes"] + f["grad_bytes"] + f["optimizer_bytes"]).tolist(), act.tolist(),
                  f["update_s"].tolist())
    ops = []
    seen = problem.choices
    for i, (op, values) in enumerate(zip(graph.operators, columns)):
        key = (i, a[i], values)
        choice = seen.get(key)
        if choice is None:           # plans of one problem share most of their choices
            labels = problem.labels.get((i, a[i]))
            if labels is None:
                cfg = problem.configs[i][a[i]]
                labels = problem.labels[(i, a[i])] = (str(cfg), format_placements(output_placements(op, cfg)))
            compute_s, comm_s, relayout_s, param_bytes, act_bytes, update_s = values
            choice = seen[key] = OpChoice(name=op.name, module=op.module, family=op.family, config=labels[0],
                                          placements=labels[1], compute_s=compute_s, comm_s=comm_s,
                                          relayout_s=relayout_s, param_bytes=param_bytes,
                                          activation_bytes=act_bytes, update_s=update_s)
        ops.append(choice)
    totals["relayout_s"] = float(relayout.sum())
    t, m = total(terms)
    t += problem.fixed_s if fixed_s is None else fixed_s
    m += float(copies.sum())
    if held_peak is None:
        held_peak = build_peak_model(problem, graph, microbatches).evaluate(np.array([a]))[0, 1:]
    held, peak = held_peak
    totals["input_bytes"] = float(held - m)                    # the step's input batch beside the state
    totals["transient_bytes"] = float(peak - held)             # the backward pass's rise above both
    summary = summarize(graph, problem, a)
    if problem.zero_stage:
        summary += f" zero{problem.zero_stage}"
    if recomputed:
        summary += f" rc{len(recomputed)}/{len(problem.units)}"
        if problem.recompute_policy != "full":
            summary += f":{problem.recompute_policy}"
    tr = ctx.training
    return Plan(model=graph.name, devices=ctx.devices, mesh_shape=mesh.shape,
                mesh_links=tuple(link.name for link in mesh.links), time_s=float(t), memory_bytes=float(m),
                summary=summary, ops=tuple(ops), breakdown=totals,
                training={"precision": tr.precision, "optimizer": tr.optimizer, "batch_size": graph.batch_size},
                param_signature=ctx.param_signature, label=label, epsilon=ctx.epsilon,
                zero_stage=problem.zero_stage, recompute=tuple(recomputed),
                recompute_policy=problem.recompute_policy if recomputed else "full", inputs=graph.inputs)


def _added(start: float, values: np.ndarray) -> float:
    """``start`` plus each of ``values`` in turn (``total``'s order)."""
    return float(total(np.concatenate([[start], values])))


def assignment_of(plan: Plan, problem: MeshProblem, graph: OpGraph) -> list[int]:
    """The inverse of :func:`plan_from_assignment`: ``plan``'s configuration index per
    operator of ``problem``, then per recompute unit 1 where the plan recomputes it."""
    if len(plan.ops) != len(graph.operators):
        raise ValueError(f"plan has {len(plan.ops)} operators, the graph {len(graph.operators)}")
    out = []
    for i, (op, choice) in enumerate(zip(graph.operators, plan.ops)):
        index = {str(c): j for j, c in enumerate(problem.configs[i])}
        if choice.config not in index:
            raise ValueError(f"{op.name}: configuration {choice.config} is not one of the problem's")
        out.append(index[choice.config])
    recomputed = set(plan.recompute)
    return out + [1 if name in recomputed else 0 for name, _ in problem.units]


def summarize(graph: OpGraph, problem: MeshProblem, assignment: Sequence[int]) -> str:
    """Per mesh axis its role and size, e.g. ``dp2·tp4``: ``rep`` when no operator splits
    anything over it, ``dp`` when every batched operator splits the batch, ``tp`` when at
    least half the weight-carrying operators split a weight dimension, ``dp~`` when at least
    half the batched operators split the batch, else ``mix``."""
    parts = []
    n_ops = len(graph.operators)
    codes, is_batched, is_weighted = problem.split_codes, graph.batched_ops, graph.weighted_ops
    a = np.asarray(assignment[:n_ops], dtype=np.int64)
    for axis, size in enumerate(problem.mesh.shape):
        splits = codes[axis][np.arange(n_ops), a]
        batched = splits[is_batched]
        weighted = splits[is_weighted]
        if (splits == SPLIT_NONE).all():
            role = "rep"
        elif len(batched) and (batched == SPLIT_BATCH).all():
            role = "dp"
        elif len(weighted) and (weighted == SPLIT_OTHER).sum() * 2 >= len(weighted):
            role = "tp"
        elif len(batched) and (batched == SPLIT_BATCH).sum() * 2 >= len(batched):
            role = "dp~"
        else:
            role = "mix"
        parts.append(f"{role}{size}")
    return "·".join(parts)
