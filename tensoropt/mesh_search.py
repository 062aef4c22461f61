"""Every mesh of a device set, and every ZeRO stage on it: one cost graph each, solved.

For each mesh of the search space and ZeRO stage 0 (2 and 3 too on meshes of more than one
device, with ``SearchOptions.zero``) the planner builds the cost graph, the engine solves it
to its exact (or (1+ε)) frontier in (time, end-of-forward memory), and every frontier point
becomes a :class:`~tensoropt.plan_builder.Candidate` priced on the step's peak.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Callable

from .costmodel import CostModel
from .engine import solve
from .mesh import Cluster, Mesh
from .plan_builder import Candidate, PlanContext, plan_from_assignment
from .planner import MeshProblem, build_problem, peak_bytes
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
    for mesh, z in (bar if bar is not None else cases):
        if bar is not None:
            bar.set_postfix_str(f"{mesh} zero {z}")
        problem = build_problem(graph, mesh, cost_for(mesh), zero_stage=z, recompute=options.recompute,
                                batch_only_axes=space.batch_only_axes(mesh, cluster))
        remaining = deadline.remaining_s()
        with deadline.solving(f"mesh {mesh}, ZeRO stage {z}"):
            result = solve(problem.cost_graph, epsilon=options.epsilon, time_limit_s=remaining,
                           progress=options.progress, block_groups=space.block_groups)
        problems.append(problem)
        if not len(result.points):
            continue
        peaks = peak_bytes(problem, graph, result.assignments, result.points[:, 1])
        for pt, a, peak in zip(result.points, result.assignments, peaks):
            out.append(Candidate(pt[0], pt[1], peak, partial(plan_from_assignment, ctx, problem, a)))
    return problems, out
