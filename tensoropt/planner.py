"""From an operator graph on one mesh to a cost graph, and back from assignments to plans.

``build_problem`` enumerates every operator's configurations (``strategy``), prices them
and every edge (``costmodel``) and hands the engine a plain :class:`CostGraph`, with the
graph's identical blocks declared so the engine composes them by repeated squaring.
Operators with identical shapes and roles share one cost computation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .costmodel import CostModel, NodeCost, edge_cost_table
from .engine import CostGraph
from .mesh import Mesh
from .opgraph import OpGraph, Operator
from .strategy import OpConfig, enumerate_configs

__all__ = ["MeshProblem", "build_problem", "owners"]


@dataclass(frozen=True)
class MeshProblem:
    mesh: Mesh
    configs: tuple[tuple[OpConfig, ...], ...]    # per operator
    node_costs: tuple[tuple[NodeCost, ...], ...]  # per operator, per configuration
    cost_graph: CostGraph


def owners(graph: OpGraph) -> list[bool]:
    """Per operator: whether it is the first user of all its parameters (tied weights are
    charged once)."""
    seen: set[str] = set()
    out = []
    for op in graph.operators:
        names = [p for p in op.param_names if p is not None]
        out.append(not any(p in seen for p in names))
        seen.update(names)
    return out


def _signature(op: Operator, owns: bool) -> tuple:
    return (op.family, op.equation, op.operands, tuple(p is None for p in op.param_names), op.output,
            op.splittable, op.flops_fwd, op.flops_bwd, op.saved_operands, op.saved_extra_bytes, owns)


def build_problem(graph: OpGraph, mesh: Mesh, cost_model: CostModel) -> MeshProblem:
    own = owners(graph)
    sigs = [_signature(op, o) for op, o in zip(graph.operators, own)]
    cache: dict[tuple, tuple[tuple[OpConfig, ...], tuple[NodeCost, ...]]] = {}
    configs, costs = [], []
    for op, o, sig in zip(graph.operators, own, sigs):
        if sig not in cache:
            cfgs = tuple(enumerate_configs(op, mesh))
            cache[sig] = (cfgs, tuple(cost_model.node_cost(op, c, mesh, owns_params=o) for c in cfgs))
        configs.append(cache[sig][0])
        costs.append(cache[sig][1])
    edge_cache: dict[tuple, np.ndarray] = {}
    edges = []
    for e in graph.edges:
        key = (sigs[e.src], sigs[e.dst], e.operand, e.dim_map)
        if key not in edge_cache:
            edge_cache[key] = edge_cost_table(cost_model, graph, e, list(configs[e.src]), list(configs[e.dst]), mesh)
        edges.append((e.src, e.dst, edge_cache[key]))
    nodes = [(op.name, np.array([[c.time_s, c.memory_bytes] for c in cs])) for op, cs in zip(graph.operators, costs)]
    cg = CostGraph.build(nodes, edges, blocks=graph.blocks)
    return MeshProblem(mesh, tuple(configs), tuple(costs), cg)
