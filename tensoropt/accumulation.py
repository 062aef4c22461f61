"""Gradient accumulation without pipeline stages: a step of ``m`` micro-batches on one mesh.

Each micro-batch computes as the model at the micro-batch size does and keeps that size's
activations. Without ZeRO and under ZeRO-1, gradients are reduced (and ZeRO-1's parameters
gathered) once per step: the cost graph's parameter traffic scaled by 1/m, so m micro-batches
add up to one reduction; under ZeRO-2 and -3 every micro-batch gathers and reduces
(``execution.syncs_gradients_once``, which the apply layer runs by). The optimizer steps once. A plan's time is its micro-batch's times m, plus the
fixed cost once. ``setups`` prices a plan someone runs this way (``plan_for(...,
microbatches=m)``) and the search (``frontier(..., accumulate=(2, 4))``) tries every mesh and
ZeRO stage at each count; ``apply.train_step`` runs the m micro-batches of a step.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Callable, Sequence

import numpy as np

from .costmodel import CostModel
from .engine import memguard
from .execution import syncs_gradients_once
from .mesh import Cluster, Mesh
from .mesh_search import zero_stages
from .opgraph import OpGraph
from .peak_search import solve_problem
from .pipeline import StagesBound
from .plan import Plan
from .plan_builder import Candidate, PlanContext, plan_from_assignment
from .planner import MeshProblem, build_problem
from .search_jobs import Job
from .search_options import SearchOptions
from .space import SearchSpace

__all__ = ["accumulation_counts", "accumulation_problem", "accumulated", "accumulated_plan", "accumulation_jobs_on"]


def accumulation_counts(batch: int, counts: Sequence[int]) -> list[int]:
    """The counts m > 1 of ``counts`` that divide the global ``batch``."""
    return sorted({int(m) for m in counts if int(m) > 1 and batch % int(m) == 0})


def accumulation_problem(micro: OpGraph, mesh: Mesh, cm: CostModel, m: int, zero_stage: int, recompute: bool,
                         recompute_policy: str = "full", batch_only_axes: tuple[int, ...] = ()) -> MeshProblem:
    """The cost graph of one micro-batch (``micro``: the model at the micro-batch size) of a
    step that accumulates ``m``."""
    comm_factor = 1.0 / m if syncs_gradients_once(zero_stage) else 1.0
    return build_problem(micro, mesh, cm, zero_stage=zero_stage, recompute=recompute, comm_factor=comm_factor,
                         accumulates=True, recompute_policy=recompute_policy, batch_only_axes=batch_only_axes,
                         update_factor=1.0 / m)


def accumulated(plan: Plan, m: int, fixed_s: float, batch_size: int, inputs) -> Plan:
    """A micro-batch's plan (priced on ``accumulation_problem``) as the step of ``m``:
    compute, recomputation and re-layouts run per micro-batch, and an operator's own
    collectives too under ZeRO; the optimizer's update is per step."""
    b = dict(plan.breakdown)
    per_micro = ("compute_s", "recompute_s", "relayout_s") + (() if syncs_gradients_once(plan.zero_stage)
                                                             else ("comm_s",))
    for k in per_micro:
        b[k] = b.get(k, 0.0) * m
    mesh_part, _, rest = plan.summary.partition(" ")
    return replace(plan, time_s=(plan.time_s - fixed_s) * m + fixed_s, breakdown=b, microbatches=m,
                   training={**plan.training, "batch_size": batch_size}, inputs=inputs,
                   summary=" ".join(x for x in (mesh_part, f"mb{m}", rest) if x))


def accumulation_jobs_on(mb_ctx: PlanContext, step_graph: OpGraph, cluster: Cluster, space: SearchSpace,
                         cost_for: Callable[[Mesh], CostModel], options: SearchOptions, m: int,
                         mesh: Mesh) -> list[Job]:
    """A job per ZeRO stage on ``mesh`` accumulating ``m`` micro-batches (``mb_ctx.graph``:
    the model at the micro-batch size; ``step_graph``: at the global batch)."""
    jobs = []
    for z in zero_stages(mesh, options):
        problem = accumulation_problem(mb_ctx.graph, mesh, cost_for(mesh), m, z, options.recompute,
                                       options.recompute_policy, space.batch_only_axes(mesh, cluster))
        memguard.check()
        bound = StagesBound((problem.lower_bound(),), float(m), 0.0)
        jobs.append(Job(f"mesh {mesh}, ZeRO stage {z}, {m} accumulated micro-batches", bound,
                        partial(_solve, mb_ctx, step_graph, problem, m, space.block_groups)))
    return jobs


def _solve(mb_ctx: PlanContext, step_graph: OpGraph, problem: MeshProblem, m: int, block_groups,
           time_limit_s: float | None, ceiling: np.ndarray | None = None,
           epsilon: float | None = None) -> list[Candidate]:
    mb_ctx = mb_ctx.approximate(epsilon)
    # a micro-batch point (t, peak) gives a step of time m·t (+ the fixed cost) at that peak
    found = solve_problem(problem, mb_ctx.graph, m, epsilon=mb_ctx.epsilon, time_limit_s=time_limit_s,
                          block_groups=block_groups, ceiling=None if ceiling is None else ceiling / [m, 1.0])
    mb_ctx.peak_searches[found.stats["peak_search"]] += 1
    return [Candidate(float(t) * m + problem.fixed_s, float(mem), float(peak),
                      partial(accumulated_plan, mb_ctx, step_graph, problem, a, m, (float(mem), float(peak))))
            for t, mem, peak, a in zip(found.times, found.memories, found.peaks, found.assignments)]


def accumulated_plan(mb_ctx: PlanContext, step_graph: OpGraph, problem: MeshProblem, assignment, m: int,
                     held_peak: tuple[float, float] | None = None) -> Plan:
    """One assignment of ``accumulation_problem`` priced as the step of ``m`` micro-batches
    (``held_peak``: as ``plan_from_assignment``'s)."""
    plan = plan_from_assignment(mb_ctx, problem, assignment, microbatches=m, held_peak=held_peak)
    return accumulated(plan, m, problem.fixed_s, step_graph.batch_size, step_graph.inputs)
