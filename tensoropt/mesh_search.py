"""Every mesh of a device set, and every ZeRO stage on it: one cost graph each, solved.

For each mesh of the search space and ZeRO stage 0 (2 and 3 too on meshes of more than one
device, with ``SearchOptions.zero``) the planner builds the cost graph, ``peak_search``
solves its frontier in (time, the step's peak memory), and every frontier point becomes a
:class:`~tensoropt.plan_builder.Candidate`.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Callable

from .costmodel import CostModel
from .mesh import Cluster, Mesh
from .peak_search import solve_problem
from .plan_builder import Candidate, PlanContext, plan_from_assignment
from .planner import MeshProblem, build_problem
from .search_options import Deadline, SearchOptions
from .space import SearchSpace

__all__ = ["mesh_candidates", "show_progress"]


def show_progress(progress: bool | None) -> bool:
    return progress if progress is not None else sys.stderr.isatty()


def mesh_candidates(ctx: PlanContext, cluster: Cluster, space: SearchSpace, cost_for: Callable[[Mesh], CostModel],
                    options: SearchOptions, deadline: Deadline) -> tuple[list[MeshProblem], list[Candidate]]:
    """The cost graph of every (mesh, ZeRO stage), and the frontier points of them all."""
    graph = ctx.graph
    cases = [(mesh, z) for mesh in space.meshes(cluster)
             for z in ((0, 2, 3) if options.zero and mesh.size > 1 else (0,))]
    bar = None
    if show_progress(options.progress):
        from tqdm.auto import tqdm

        bar = tqdm(cases, desc="meshes", leave=False)
    problems: list[MeshProblem] = []
    out: list[Candidate] = []
    start_at: dict[str, str] = {}          # per mesh: the search its last ZeRO stage needed
    for mesh, z in (bar if bar is not None else cases):
        if bar is not None:
            bar.set_postfix_str(f"{mesh} zero {z}")
        problem = build_problem(graph, mesh, cost_for(mesh), zero_stage=z, recompute=options.recompute,
                                batch_only_axes=space.batch_only_axes(mesh, cluster))
        remaining = deadline.remaining_s()
        with deadline.solving(f"mesh {mesh}, ZeRO stage {z}"):
            found = solve_problem(problem, graph, epsilon=options.epsilon, time_limit_s=remaining,
                                  block_groups=space.block_groups, start_at=start_at.get(str(mesh), "exact"))
        start_at[str(mesh)] = found.stats["peak_search"]
        problems.append(problem)
        ctx.peak_searches[found.stats["peak_search"]] += 1
        for t, m, peak, a in zip(found.times, found.memories, found.peaks, found.assignments):
            out.append(Candidate(float(t), float(m), float(peak),
                                 partial(plan_from_assignment, ctx, problem, a, peak_model=found.model)))
    return problems, out
