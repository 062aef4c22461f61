"""A plan's collectives, as data: what the cost model prices, and what the apply layer issues.

:func:`predicted_collectives` concatenates the rules of :mod:`tensoropt.traffic` over a plan:
every operator's own collectives (parameter gradients, ZeRO, BatchNorm statistics), every
edge's re-layout and every later use of a tied parameter. Priced with the plan's cost model
(``CostModel.price``) the list sums to the plan's ``comm_s + relayout_s``: the search prices
the same rules (``tensoropt.traffic``) through the cost model.

:func:`issued_collectives` is the same rules applied the way ``tensoropt.apply`` runs the
plan, which differs from what the cost model prices in four ways:

* parameter collectives go out one call per group and kind where the apply layer groups
  them (FSDP2's groups; the DTensor runner's gradient buckets and its ZeRO units), where the cost
  model gives each parameter its share of that call's fixed costs
  (``execution.latency_shares``, ``execution.groups_parameter_collectives``);
* consumers of one tensor that want it in one layout share one move (the cost model prices
  every edge's move);
* a tied parameter lives in its first user's layout, so a later user that wants another
  layout moves it from there (the cost model prices the move as if that copy were
  replicated); one that wants the same layout moves nothing and reduces the gradient its
  splits leave partial itself, unless FSDP2 (``replicate`` mode) or a move shared with the
  first user sums the uses first;
* the reported loss value is all-reduced (not priced).

So what it marks ``priced`` is a sub-list of :func:`predicted_collectives` (less the shared
moves and the tied uses' moves as priced), and the rest (``priced=False``) are the apply-only
extras: a tied parameter's moves from its first user's layout and the reported loss value.
Neither is priced: the loss value is four bytes once per step, and pricing the tied moves
from the first user's layout takes an edge between the two users that spans the chain of
repeated blocks the engine folds (``planner._tied_parameter_times``). The apply tests compare
:func:`issued_collectives` with what ``CommDebugMode`` counts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

from .execution import gradient_group, latency_shares, runner_groups, runs_replicated, syncs_gradients_once
from .opgraph import OpGraph
from .placement import Partial
from .plan import Plan
from .strategy import OpConfig, output_placements, term_placements
from .traffic import (Collective, aligned, edge_collectives, grad_partial, is_parameter_collective,
                      operator_collectives, owners, relayout_collectives, tied_grad_move, tied_use_collectives,
                      tied_use_label, tied_uses)
from .training import TrainingConfig

__all__ = ["Collective", "predicted_collectives", "issued_collectives", "summarize", "summarize_for_backend",
           "compare"]


def _configs(plan: Plan, graph: OpGraph) -> list[OpConfig]:
    if plan.stages:
        raise ValueError("a pipeline plan's collectives are not listed per operator: take one of plan.stages "
                         "with its stage's graph")
    if [o.name for o in graph.operators] != [o.name for o in plan.ops]:
        raise ValueError("plan and graph list different operators: capture the plan's own model")
    return [OpConfig.parse(o.config) for o in plan.ops]


def _operator_collectives(plan: Plan, graph: OpGraph, cfgs, training: TrainingConfig) -> list[Collective]:
    shape = tuple(plan.mesh_shape)
    out: list[Collective] = []
    shares = latency_shares(graph)
    fsdp = runs_replicated(graph, cfgs, shape)
    for op, cfg, owns in zip(graph.operators, cfgs, owners(graph)):
        out += operator_collectives(op, cfg, shape, training, owns, plan.zero_stage or 0, shares, fsdp)
    return out


def _per_step(plan: Plan, micro_batch: list[Collective]) -> list[Collective]:
    """One micro-batch's collectives as a step of ``plan.microbatches`` runs them (no pipeline
    stages): each micro-batch issues its own, except the parameters' gradient reductions and
    ZeRO-1 gathers, which run once per step (``execution.syncs_gradients_once``)."""
    m = plan.microbatches
    if m <= 1:
        return micro_batch
    if not syncs_gradients_once(plan.zero_stage or 0):
        return micro_batch * m
    return ([c for c in micro_batch if is_parameter_collective(c)]
            + [c for c in micro_batch if not is_parameter_collective(c)] * m)


def predicted_collectives(plan: Plan, graph: OpGraph) -> list[Collective]:
    """Every collective the cost model prices for one training step of ``plan`` (see module
    doc). ``graph``: the model's captured OpGraph (``tensoropt.capture.capture``) at the batch
    one pass runs: for a plan accumulating micro-batches, one micro-batch."""
    cfgs = _configs(plan, graph)
    training = TrainingConfig.of_plan(plan.training)
    shape = tuple(plan.mesh_shape)
    out = _operator_collectives(plan, graph, cfgs, training)
    for e in graph.edges:
        out += edge_collectives(graph, e, cfgs[e.src], cfgs[e.dst], shape, training)
    for i, k in tied_uses(graph):
        out += tied_use_collectives(graph.operators[i], k, cfgs[i], shape, training)
    return _per_step(plan, out)


def issued_collectives(plan: Plan, graph: OpGraph, apply_mode: str) -> list[Collective]:
    """The collectives ``tensoropt.apply`` issues for one step of ``plan`` laid out in
    ``apply_mode`` ("replicate" or "dtensor", ``execution.apply_mode``); see the module doc
    for how they differ from :func:`predicted_collectives`. ``graph`` as there."""
    if apply_mode not in ("replicate", "dtensor"):
        raise ValueError(f"apply_mode must be 'replicate' or 'dtensor', got {apply_mode!r}")
    cfgs = _configs(plan, graph)
    training = TrainingConfig.of_plan(plan.training)
    shape = tuple(plan.mesh_shape)
    out = _bucketed(plan, graph, cfgs, training, apply_mode)
    moved: set = set()
    for e in graph.edges:
        dst = graph.operators[e.dst]
        d_term = dst.terms[0][e.operand]
        key = (dst.operand_nodes[e.operand] if dst.operand_nodes else (e.src, e.dst, e.operand),
               term_placements(cfgs[e.dst], d_term), grad_partial(cfgs[e.dst], d_term))
        if key not in moved:
            moved.add(key)
            out += edge_collectives(graph, e, cfgs[e.src], cfgs[e.dst], shape, training)
    out += _tied_uses_as_run(graph, cfgs, shape, training, apply_mode)
    if math.prod(shape) > 1:
        out += _loss_value(graph, cfgs[-1], shape, apply_mode)
    return _per_step(plan, out)


def _bucketed(plan: Plan, graph: OpGraph, cfgs, training: TrainingConfig, apply_mode: str) -> list[Collective]:
    """The operators' own collectives as the apply layer issues them: parameter collectives go
    out one call per group (``execution.gradient_group``), axes the gradient is partial over,
    kind, axis and phase -- FSDP2's groups, and the DTensor runner's gradient buckets and
    ZeRO units (``execution.runner_groups``)."""
    shape = tuple(plan.mesh_shape)
    shares = latency_shares(graph)
    zero = plan.zero_stage or 0
    out: list[Collective] = []
    merged: dict[tuple, int] = {}
    fsdp = apply_mode == "replicate"
    for op, cfg, owns in zip(graph.operators, cfgs, owners(graph)):
        colls = operator_collectives(op, cfg, shape, training, owns, zero, shares, fsdp)
        group = gradient_group(graph, op)
        partial = {pname: grad_partial(cfg, t) for t, pname in zip(op.terms[0], op.param_names) if pname}
        for c in colls:
            # FSDP2 issues every group's at once; the DTensor runner as the cost model says
            if not is_parameter_collective(c) or not (apply_mode == "replicate" or runner_groups(zero)):
                out.append(c)
                continue
            kind, pname = c.where.split(" ", 1)
            key = (group, partial.get(pname), c.kind, c.axis, c.phase, kind)
            if key in merged:
                i = merged[key]
                out[i] = replace(out[i], bytes=out[i].bytes + c.bytes, latency_share=1.0,
                                 where=f"{kind} group {group or '(root)'}")
            else:
                merged[key] = len(out)
                out.append(c)
    return out


def _tied_uses_as_run(graph: OpGraph, cfgs, shape, training: TrainingConfig, apply_mode: str) -> list[Collective]:
    first: dict[str, tuple] = {}          # parameter -> (its node, layout, partial axes) at its first user
    for op, cfg in zip(graph.operators, cfgs):
        for k, pname in enumerate(op.param_names):
            if pname is not None and pname not in first:
                t = op.terms[0][k]
                first[pname] = (op.operand_nodes[k] if op.operand_nodes else None, term_placements(cfg, t),
                                grad_partial(cfg, t))
    out: list[Collective] = []
    for i, k in tied_uses(graph):
        op, cfg = graph.operators[i], cfgs[i]
        t, spec, pname = op.terms[0][k], op.operands[k], op.param_names[k]
        node = op.operand_nodes[k] if op.operand_nodes else None
        owner = first[pname][1]
        want, partial = term_placements(cfg, t), grad_partial(cfg, t)
        if owner != want:
            moves = relayout_collectives(spec.nbytes * training.scale(spec), owner, want,
                                         tuple(aligned(h, w, range(len(t))) for h, w in zip(owner, want)),
                                         partial, shape, tied_use_label(op, k))
            out += [replace(c, priced=False) for c in moves]
        elif apply_mode == "dtensor" and (node is None or first[pname] != (node, want, partial)):
            out += tied_grad_move(op, k, cfg, shape, training)
    return out


def _loss_value(graph: OpGraph, cfg: OpConfig, shape, apply_mode: str) -> list[Collective]:
    """The reported loss value: FSDP2 plans all-reduce it over every rank; operator-level
    plans over the axes where the loss is left partial."""
    if apply_mode == "replicate":
        return [Collective("all_reduce", -1, 4, "forward", "reported loss value", priced=False)]
    return [Collective("all_reduce", a, 4, "forward", "reported loss value", priced=False)
            for a, p in enumerate(output_placements(graph.operators[-1], cfg)) if isinstance(p, Partial) and shape[a] > 1]


def summarize(colls: list[Collective]) -> dict[str, dict]:
    """``{kind: {"count", "bytes"}}`` over a list of collectives."""
    res: dict[str, dict] = defaultdict(lambda: {"count": 0, "bytes": 0.0})
    for c in colls:
        res[c.kind]["count"] += 1
        res[c.kind]["bytes"] += c.bytes
    return dict(res)


def compare(predicted: dict[str, dict], measured: dict[str, dict]) -> dict[str, dict]:
    """Per kind: predicted and measured count and bytes and the relative byte error
    (``predicted`` from :func:`summarize_for_backend`, so that all-to-alls are counted as
    the backend issues them)."""
    kinds = sorted(set(predicted) | set(measured))
    out = {}
    for k in kinds:
        p = predicted.get(k, {"count": 0, "bytes": 0.0})
        m = measured.get(k, {"count": 0, "bytes": 0})
        rel = abs(m["bytes"] - p["bytes"]) / p["bytes"] if p["bytes"] else (0.0 if not m["bytes"] else float("inf"))
        out[k] = {"predicted_count": p["count"], "measured_count": m["count"],
                  "predicted_bytes": p["bytes"], "measured_bytes": m["bytes"], "rel_bytes": rel}
    return out


def summarize_for_backend(colls: list[Collective], mesh_shape: tuple[int, ...], backend: str = "gloo") -> dict:
    """Like :func:`summarize`, with all-to-alls as the backend issues them (gloo has none:
    DTensor all-gathers the whole ``p`` times larger buffer and keeps its chunk)."""
    if backend != "gloo":
        return summarize(colls)
    conv = [replace(c, kind="all_gather", bytes=c.bytes * mesh_shape[c.axis]) if c.kind == "all_to_all" else c
            for c in colls]
    return summarize(conv)
