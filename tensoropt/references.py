"""Reference plans priced by the same cost model as the frontier: plain data parallelism and
Megatron-style tensor parallelism (column-parallel then row-parallel linears, heads split),
with data parallelism on the outer axis of a 2-D mesh."""

from __future__ import annotations

import numpy as np

from .engine import CostGraph, solve
from .plan import Plan
from .plan_builder import PlanContext, plan_from_assignment
from .planner import MeshProblem

__all__ = ["reference_plans"]

COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "fc1", "gate_proj", "up_proj", "query", "key", "value", "c_fc")
ROW_PARALLEL = ("o_proj", "fc2", "down_proj", "out_proj", "c_proj")


def reference_plans(ctx: PlanContext, problems: list[MeshProblem], per_node: int) -> dict[str, Plan]:
    """``"data parallel"`` on the 1-D mesh, and ``"megatron dp<d>·tp<t>"`` on every mesh of at
    most two axes whose tensor-parallel (last) axis stays inside a node of ``per_node``
    devices: its fastest plan among Megatron's choices. Meshes with ZeRO are skipped."""
    refs: dict[str, Plan] = {}
    graph = ctx.graph
    for problem in problems:
        mesh = problem.mesh
        if problem.zero_stage != 0:
            continue
        if mesh.ndim == 1:
            a = []
            for i in range(len(graph.operators)):
                want = [j for j, c in enumerate(problem.configs[i]) if c.splits == ("b",)]
                a.append(want[0] if want else 0)
            refs["data parallel"] = plan_from_assignment(ctx, problem, a, "data parallel")
        if mesh.ndim <= 2 and mesh.shape[-1] <= per_node:
            tp_axis = mesh.ndim - 1
            allowed = []
            for i, op in enumerate(graph.operators):
                ok = []
                for j, c in enumerate(problem.configs[i]):
                    dp_ok = mesh.ndim == 1 or c.splits[0] == ("b" if _splits_batch(problem, i) else None)
                    if dp_ok and _megatron_choice(op, c.splits[tp_axis]):
                        ok.append(j)
                allowed.append(ok or [0])
            a = _restricted_min_time(problem, allowed + [[0]] * len(problem.units))
            dp = mesh.shape[0] if mesh.ndim == 2 else 1
            name = f"megatron dp{dp}·tp{mesh.shape[tp_axis]}"
            refs[name] = plan_from_assignment(ctx, problem, a, name)
    return refs


def _megatron_choice(op, split: str | None) -> bool:
    """Whether an operator's split on the tensor-parallel axis is Megatron's."""
    leaf = op.module.rsplit(".", 1)[-1]
    if op.family == "linear":
        if leaf in COLUMN_PARALLEL:
            return split == "n"
        if leaf in ROW_PARALLEL:
            return split == "k"
        return split is None
    if op.family == "attention":
        return split == "n"
    return True


def _splits_batch(problem: MeshProblem, i: int) -> bool:
    return any(c.splits[0] == "b" for c in problem.configs[i])


def _restricted_min_time(problem: MeshProblem, allowed: list[list[int]]) -> list[int]:
    """The fastest assignment that takes every node's configuration from ``allowed``."""
    cg = problem.cost_graph
    nodes = [(n, c[idx]) for n, c, idx in zip(cg.names, cg.node_costs, allowed)]
    edges = [(u, v, t[np.ix_(allowed[u], allowed[v])]) for (u, v), t in cg.edge_costs.items()]
    sub = CostGraph.build(nodes, edges, blocks=cg.blocks)
    res = solve(sub)
    return [allowed[v][c] for v, c in enumerate(res.assignments[0])]
