"""How the apply layer will run a plan, decided from the graph and configurations alone.

Both sides need the answer: ``tensoropt.apply`` picks its execution from it, and the cost
model prices the memory that execution really holds (FSDP2's ``replicate`` keeps an unsharded
copy of each group's parameters and gradients that DTensor execution does not). Kept free of
torch so the planner can use it.
"""

from __future__ import annotations

from typing import Sequence

from .opgraph import OpGraph, Operator
from .strategy import OpConfig

__all__ = ["aten_base", "splits_batch_statistics", "data_axes", "runs_replicated"]

_BATCH_STAT_NORMS = ("batch_norm",)


def aten_base(aten: str) -> str:
    """``"aten.linear.default"`` -> ``"linear"``."""
    parts = aten.split(".")
    return parts[1] if len(parts) >= 2 else parts[0]


def splits_batch_statistics(op: Operator, cfg: OpConfig) -> bool:
    """A BatchNorm whose configuration splits a dimension its statistics reduce over (batch or
    spatial): local execution would compute per-shard statistics, so it runs on DTensor."""
    base = aten_base(op.aten[0]) if op.aten else op.name
    if base not in _BATCH_STAT_NORMS:
        return False
    first = op.terms[0][0]
    return any(s is not None and s in first and first.index(s) != 1 for s in cfg.splits)


def _is_data_axis(graph: OpGraph, cfgs: Sequence[OpConfig], axis: int) -> bool:
    batched = False
    for op, cfg in zip(graph.operators, cfgs):
        s = cfg.splits[axis]
        terms, out = op.terms
        if "b" in "".join(terms) + out:
            batched = True
            if s != "b":
                return False
        elif s is not None:
            return False
    return batched


def data_axes(graph: OpGraph, cfgs: Sequence[OpConfig], mesh_shape: Sequence[int]) -> tuple[int, ...]:
    """Mesh axes (of size > 1) over which every batched operator splits the batch and every
    other operator replicates."""
    return tuple(a for a, n in enumerate(mesh_shape) if n > 1 and _is_data_axis(graph, cfgs, a))


def runs_replicated(graph: OpGraph, cfgs: Sequence[OpConfig], mesh_shape: Sequence[int]) -> bool:
    """Whether the apply layer runs the plan with FSDP2 (``replicate`` / ``fully_shard`` on the
    whole model, the batch split per rank) rather than operator by operator on DTensor: every
    axis is data-parallel and no operator needs DTensor's own rule."""
    sizes = [n for n in mesh_shape if n > 1]
    if not sizes:
        return True
    dp = data_axes(graph, cfgs, mesh_shape)
    if len(dp) != len(sizes):
        return False
    return not any(splits_batch_statistics(op, c) for op, c in zip(graph.operators, cfgs))
