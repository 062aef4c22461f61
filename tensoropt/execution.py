"""How the apply layer will run a plan, decided from the graph and configurations alone.

Both sides need the answer: ``tensoropt.apply`` picks its execution from it, and the cost
model prices what that execution really holds and sends (FSDP2's ``replicate`` keeps an
unsharded copy of the parameters and gradients that DTensor execution does not; a BatchNorm
over a split batch all-reduces its statistics). Kept free of torch so the planner can use it.
"""

from __future__ import annotations

from typing import Sequence

from .opgraph import OpGraph, Operator
from .strategy import OpConfig, label_sizes

__all__ = ["aten_base", "batch_statistics_axes", "batch_statistics_bytes", "data_axes", "runs_replicated",
           "apply_mode", "syncs_gradients_once", "model_parallel", "gradient_group", "latency_shares",
           "groups_parameter_collectives", "runner_groups"]

_BATCH_STAT_NORMS = ("batch_norm",)


def syncs_gradients_once(zero_stage: int) -> bool:
    """Whether a step accumulating micro-batches reduces parameter gradients once, after the
    last micro-batch (gradient sync off for the others), rather than after every micro-batch.
    Without ZeRO (FSDP2 ``replicate``, DTensor execution) and under ZeRO-1, which keeps whole
    gradients anyway (Megatron's distributed optimizer): its parameters are gathered once, at
    the step's first use (FSDP2 ``fully_shard`` kept unsharded through the micro-batches; a
    DTensor plan's gathered copy held for the step), and its gradients reduce-scattered once.
    Under ZeRO-2 and -3 every micro-batch gathers and reduces: turning sync off there would
    keep each group's whole gradients until the last micro-batch, which is not the memory
    they are priced at."""
    return zero_stage <= 1


def model_parallel(cfg: OpConfig, mesh_shape: Sequence[int]) -> bool:
    """Whether ``cfg`` splits something besides the batch over a mesh axis of more than one
    device: such an operator runs on DTensor, operator by operator."""
    return any(s not in (None, "b") and n > 1 for s, n in zip(cfg.splits, mesh_shape))


def gradient_group(graph: OpGraph, op: Operator) -> str:
    """The FSDP2 group that holds ``op``'s parameters when the apply layer runs a plan
    replicated: its repeated block's module (``OpGraph.block_modules``), or "" (the root)."""
    return next((m for m in graph.block_modules if op.module == m or op.module.startswith(m + ".")), "")


def groups_parameter_collectives(cfg: OpConfig, mesh_shape: Sequence[int], zero_stage: int,
                                 fsdp: bool = False) -> bool:
    """Whether the apply layer issues an operator's parameter collectives with the rest of its
    group (:func:`latency_shares`) rather than one call each: where the DTensor runner groups
    them (:func:`runner_groups`), and in a plan FSDP2 runs (``fsdp``: :func:`runs_replicated`),
    whose operators split nothing but the batch. Under ZeRO-2 and -3 the DTensor runner
    moves every parameter on its own, a batch-only operator's too: whether a plan's
    batch-only operators are grouped is a property of the whole plan, so the search prices
    them per parameter and FSDP2's plan apart (``planner.MeshProblem.replicate_time_s``)."""
    return runner_groups(zero_stage) or (fsdp and not model_parallel(cfg, mesh_shape))


def runner_groups(zero_stage: int) -> bool:
    """Whether the DTensor runner issues parameter collectives one call per group: without
    ZeRO, gradient buckets; under ZeRO-1, gathers and reduce-scatters per group
    (``apply.zero_groups``: the gradients are kept whole until then anyway); under ZeRO-2
    and -3 one call per parameter."""
    return zero_stage <= 1


def latency_shares(graph: OpGraph) -> dict[str, float]:
    """Per parameter: the share of one collective's fixed costs (α per ring step, the per-call
    overhead) that its gradient reduction and ZeRO gathers carry where they go out with its
    group's (:func:`groups_parameter_collectives`). Those collectives run per group, not per
    parameter -- FSDP2's groups and the DTensor runner's buckets in the apply layer
    (:func:`gradient_group`), gradient buckets in DDP-style runtimes -- so a group pays the
    fixed costs once per axis, shared by its parameters in proportion to their size. A tied
    parameter counts once, at its first user."""
    numel: dict[str, int] = {}
    group_of: dict[str, str] = {}
    for op in graph.operators:
        for spec, pname in zip(op.operands, op.param_names):
            if pname is not None and pname not in numel:
                numel[pname] = spec.numel
                group_of[pname] = gradient_group(graph, op)
    totals: dict[str, int] = {}
    for pname, n in numel.items():
        totals[group_of[pname]] = totals.get(group_of[pname], 0) + n
    return {p: n / totals[group_of[p]] if totals[group_of[p]] else 1.0 for p, n in numel.items()}


def aten_base(aten: str) -> str:
    """``"aten.linear.default"`` -> ``"linear"``."""
    parts = aten.split(".")
    return parts[1] if len(parts) >= 2 else parts[0]


def batch_statistics_axes(op: Operator, cfg: OpConfig) -> tuple[int, ...]:
    """Mesh axes over which a BatchNorm's configuration splits a dimension its statistics
    reduce over (batch or spatial); () for any other operator. Over these axes the apply
    layer all-reduces the per-channel sums (``apply.batch_norm``) and the cost model
    prices that."""
    base = aten_base(op.aten[0]) if op.aten else op.name
    if base not in _BATCH_STAT_NORMS:
        return ()
    first = op.terms[0][0]
    return tuple(a for a, s in enumerate(cfg.splits) if s is not None and s in first and first.index(s) != 1)


def batch_statistics_bytes(op: Operator, cfg: OpConfig, mesh_shape: Sequence[int]) -> float:
    """Bytes of one such all-reduce: two fp32 sums per channel on this device."""
    first = op.terms[0][0]
    channels = label_sizes(op).get(first[1], 1) / cfg.shards(first[1], mesh_shape) if len(first) > 1 else 1
    return 2 * 4 * channels



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
    axis is data-parallel and no BatchNorm needs statistics over the whole batch."""
    sizes = [n for n in mesh_shape if n > 1]
    if not sizes:
        return True
    dp = data_axes(graph, cfgs, mesh_shape)
    if len(dp) != len(sizes):
        return False
    return not any(batch_statistics_axes(op, c) for op, c in zip(graph.operators, cfgs))


def apply_mode(graph: OpGraph, plan) -> str:
    """How ``tensoropt.apply`` runs ``plan`` (a :class:`~tensoropt.plan.Plan` of ``graph``):
    "pipeline", "replicate" (FSDP2 on the model's own code) or "dtensor" (the captured
    program, operator by operator)."""
    if plan.stages:
        return "pipeline"
    cfgs = [OpConfig.parse(o.config) for o in plan.ops]
    return "replicate" if runs_replicated(graph, cfgs, plan.mesh_shape) else "dtensor"
