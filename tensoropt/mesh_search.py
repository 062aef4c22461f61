"""Every mesh of a device set, and every ZeRO stage on it: one cost graph each, as a job.

For each mesh of the search space and ZeRO stage 0 (2 and 3 too on meshes of more than one
device, with ``SearchOptions.zero``) the planner builds the cost graph and ``engine.bounds``
its lower bound; the job, when run (``search_jobs``), has ``peak_search`` solve its frontier
in (time, the step's peak memory), and every frontier point becomes a
:class:`~tensoropt.plan_builder.Candidate`.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Callable

import numpy as np

from .costmodel import CostModel
from .engine import memguard
from .mesh import Cluster, Mesh
from .peak_search import solve_problem
from .plan_builder import Candidate, PlanContext, plan_from_assignment
from .planner import MeshProblem, build_problem
from .search_jobs import Job
from .search_options import SearchOptions
from .space import SearchSpace

__all__ = ["mesh_cases", "mesh_jobs", "mesh_jobs_on", "show_progress"]


def show_progress(progress: bool | None) -> bool:
    return progress if progress is not None else sys.stderr.isatty()


def zero_stages(mesh: Mesh, options: SearchOptions) -> tuple[int, ...]:
    return (0, 2, 3) if options.zero and mesh.size > 1 else (0,)


def mesh_cases(cluster: Cluster, space: SearchSpace, options: SearchOptions) -> list[tuple[Mesh, int]]:
    return [(mesh, z) for mesh in space.meshes(cluster) for z in zero_stages(mesh, options)]


def mesh_jobs(ctx: PlanContext, cluster: Cluster, space: SearchSpace, cost_for: Callable[[Mesh], CostModel],
              options: SearchOptions, bar=None) -> tuple[list[MeshProblem], list[Job]]:
    """The cost graph of every (mesh, ZeRO stage), and its job; ``bar`` advances per job built."""
    problems: list[MeshProblem] = []
    jobs: list[Job] = []
    for mesh in space.meshes(cluster):
        p, j = mesh_jobs_on(ctx, cluster, space, cost_for, options, mesh)
        problems += p
        jobs += j
        if bar is not None:
            bar.update(len(j))
    return problems, jobs


def mesh_jobs_on(ctx: PlanContext, cluster: Cluster, space: SearchSpace, cost_for: Callable[[Mesh], CostModel],
                 options: SearchOptions, mesh: Mesh) -> tuple[list[MeshProblem], list[Job]]:
    """The cost graph and job of each ZeRO stage on one mesh (they share which peak search
    the last one solved needed: one chain)."""
    problems: list[MeshProblem] = []
    jobs: list[Job] = []
    start_at: dict[str, str] = {}          # the search its last solved ZeRO stage needed
    for z in zero_stages(mesh, options):
        problem = build_problem(ctx.graph, mesh, cost_for(mesh), zero_stage=z, recompute=options.recompute,
                                recompute_policy=options.recompute_policy, batch_only_axes=space.batch_only_axes(mesh, cluster))
        memguard.check()
        problems.append(problem)
        jobs.append(Job(f"mesh {mesh}, ZeRO stage {z}", problem.lower_bound(),
                        partial(_solve, ctx, problem, space.block_groups, start_at),
                        chain=f"mesh {mesh}"))
    return problems, jobs


def _solve(ctx: PlanContext, problem: MeshProblem, block_groups, start_at: dict[str, str],
           time_limit_s: float | None, ceiling: np.ndarray | None = None,
           epsilon: float | None = None) -> list[Candidate]:
    ctx = ctx.approximate(epsilon)
    key = str(problem.mesh)
    found = solve_problem(problem, ctx.graph, epsilon=ctx.epsilon, time_limit_s=time_limit_s,
                          block_groups=block_groups, start_at=start_at.get(key, "exact"), ceiling=ceiling)
    start_at[key] = found.stats["peak_search"]
    ctx.peak_searches[found.stats["peak_search"]] += 1
    return [Candidate(float(t) + problem.fixed_s, float(m), float(peak), partial(plan_from_assignment, ctx, problem, a,
                                                                held_peak=(float(m), float(peak))))
            for t, m, peak, a in zip(found.times, found.memories, found.peaks, found.assignments)]
