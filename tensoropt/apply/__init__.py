"""Lay a model out according to an :class:`~tensoropt.plan_types.ApplySpec` with PyTorch's own
distributed stack (DeviceMesh, DTensor ``parallelize_module`` styles, FSDP2 ``fully_shard`` /
FSDP2-based ``replicate``, non-reentrant activation checkpointing).

Order: validate (no collectives) -> process group -> ``init_device_mesh`` -> model axes
(TP styles on the model sub-mesh) -> recompute wrappers -> data axes (replicate / fully_shard
on the data sub-mesh). See ``_layout`` for the activation-layout convention.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from ..plan import Plan
from ..plan_types import ApplySpec
from ._layout import apply_model_axes, describe_layout
from ._mesh import device_mesh
from ._validate import (
    check_world_size,
    ensure_process_group,
    param_signature,
    parse_placement_str,
    validate_spec,
)
from ..capture.inputs import loss_of
from ._plan import PlanLayout, PlanNotApplicable, apply_plan, capture_for_plan, plan_layout
from ._pipeline import PipelineRunner, pipeline
from .measure import count_collectives, peak_memory, step_peak_memory

__all__ = [
    "parallelize", "param_signature", "validate_spec", "build_mesh", "shard_batch", "global_loss",
    "full_grads", "full_params", "count_collectives", "peak_memory", "step_peak_memory", "describe_layout",
    "plan_layout", "PlanLayout", "PlanNotApplicable", "load_plan", "pipeline", "PipelineRunner", "train_step",
]


def load_plan(plan: "Plan | str | os.PathLike") -> Plan:
    """A Plan as given, or loaded from a JSON file (ValueError naming the file if corrupt)."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, os.PathLike)):
        try:
            return Plan.load(plan)
        except FileNotFoundError:
            raise ValueError(f"plan file {os.fspath(plan)!r} does not exist") from None
        except (ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"plan file {os.fspath(plan)!r} is not a valid tensoropt plan: {err}") from None
    raise TypeError(f"expected an ApplySpec, a Plan or a plan file path, got {type(plan).__name__}")


def _parallelize_plan(model: nn.Module, plan: Plan, mesh: DeviceMesh | None, inputs: Any) -> nn.Module:
    """Frontier plan path: validate (no collectives), then lay out operator by operator."""
    layout = plan_layout(plan, model, inputs)
    from ._validate import current_world_size
    ws = current_world_size()
    if ws != plan.world_size:
        raise ValueError(f"world size {ws} does not match the plan's mesh {plan.mesh} "
                         f"({plan.world_size} devices, planned for {plan.devices!r}); launch with "
                         f"--nproc-per-node {plan.world_size} or re-plan for {ws} devices")
    names = plan.mesh_axis_names
    if mesh is not None and tuple(mesh.shape) != tuple(plan.mesh_shape):
        raise ValueError(f"mesh {tuple(mesh.shape)} does not match the plan's mesh {tuple(plan.mesh_shape)}")
    device_type = ensure_process_group()
    if device_type == "cuda":
        model.to(torch.device("cuda", torch.cuda.current_device()))
    if mesh is None:
        mesh = device_mesh(device_type, tuple(plan.mesh_shape), names)
    return apply_plan(model, layout, mesh)


def build_mesh(spec: ApplySpec, device_type: str | None = None) -> DeviceMesh:
    """``init_device_mesh(device_type, spec.mesh.shape, mesh_dim_names=spec.mesh.axis_names)``
    (one per shape and process group)."""
    check_world_size(spec)
    dt = ensure_process_group() if device_type is None else device_type
    return device_mesh(dt, tuple(spec.mesh.shape), tuple(spec.mesh.axis_names))


def parallelize(model: nn.Module, plan: "Plan | ApplySpec | str | os.PathLike",
                mesh: DeviceMesh | None = None, *, inputs: Any = None):
    """Lay ``model`` out according to ``plan`` on this rank of a ``torchrun`` launch.

    ``plan``: a frontier :class:`~tensoropt.plan.Plan`, the path of a saved one, or an
    :class:`ApplySpec`. The model is captured again on meta tensors of the input shapes the
    plan stores (``inputs=``: example inputs, for a plan that stores none). All validation
    happens before any collective.

    Returns the model, laid out in place: every rank passes the whole global batch to
    ``model(...)`` (positional or keyword, as planned) and gets the global loss back. ZeRO
    stages and recomputed modules of the plan are applied. A pipeline plan returns a
    :class:`PipelineRunner` instead: forward and backward run together over the
    micro-batches (1F1B), ``loss = runner.step(...)``; :func:`train_step` runs one step of
    either kind.
    """
    if isinstance(plan, ApplySpec):
        return _parallelize_spec(model, plan, mesh)
    plan = load_plan(plan)
    if plan.stages:
        return pipeline(model, plan, mesh=mesh, inputs=inputs)
    return _parallelize_plan(model, plan, mesh, inputs)


def train_step(model, *args, **kwargs):
    """One training step's forward and backward on a parallelized model (a pipeline's 1F1B
    schedule, or ``model(...)`` then ``backward``); returns the loss (detached for a pipeline)."""
    if isinstance(model, PipelineRunner):
        return model.step(*args, **kwargs)
    out = model(*args, **kwargs)
    loss = loss_of(out)
    loss.backward()
    return loss


def _parallelize_spec(model: nn.Module, spec: ApplySpec, mesh: DeviceMesh | None) -> nn.Module:
    validate_spec(model, spec)
    check_world_size(spec)
    device_type = ensure_process_group()
    if mesh is None:
        mesh = device_mesh(device_type, tuple(spec.mesh.shape), tuple(spec.mesh.axis_names))
    elif tuple(mesh.shape) != tuple(spec.mesh.shape) or tuple(mesh.mesh_dim_names or ()) != tuple(spec.mesh.axis_names):
        raise ValueError(f"mesh {tuple(mesh.shape)} {mesh.mesh_dim_names} does not match the plan's "
                         f"{tuple(spec.mesh.shape)} {spec.mesh.axis_names}")
    if device_type == "cuda":
        model.to(torch.device("cuda", torch.cuda.current_device()))

    applied = apply_model_axes(model, spec, mesh)

    for fqn in spec.recompute:
        _checkpoint_forward(model.get_submodule(fqn) if fqn else model)

    data = [a for a in spec.data_axes if spec.mesh.shape[a] > 1]
    if data:
        dp_mesh = _data_mesh(mesh, spec, data)
        _apply_data_parallel(model, spec, dp_mesh)
    model._tensoropt_layout = applied        # type: ignore[attr-defined]
    model._tensoropt_mesh = mesh              # type: ignore[attr-defined]
    return model


def _data_mesh(mesh: DeviceMesh, spec: ApplySpec, data: list[int]) -> DeviceMesh:
    names = tuple(spec.mesh.axis_names[a] for a in data)
    if len(names) == 1:
        return mesh[names[0]]
    return mesh[names]._flatten("_".join(names))


def _apply_data_parallel(model: nn.Module, spec: ApplySpec, dp_mesh: DeviceMesh) -> None:
    """zero_stage 3: fully_shard (reshard after forward); 1/2: fully_shard without resharding after
    forward (ZeRO-2-like); 0: FSDP2-based replicate (gradient all-reduce). Each block of
    ``model.layers`` gets its own group, then the root."""
    if spec.zero_stage == 0:
        from torch.distributed._composable.replicate_with_fsdp import replicate as wrap
        kw: dict[str, Any] = {"mesh": dp_mesh}
    else:
        from torch.distributed.fsdp import fully_shard as wrap
        kw = {"mesh": dp_mesh, "reshard_after_forward": spec.zero_stage == 3}
    layers = getattr(model, "layers", None)
    if isinstance(layers, (nn.ModuleList, nn.Sequential)):
        for block in layers:
            if any(True for _ in block.parameters()):
                wrap(block, **kw)
    wrap(model, **kw)


def _checkpoint_forward(module: nn.Module) -> None:
    """Activation checkpointing without changing FQNs: the module's forward (inside its hooks)
    runs under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``."""
    if getattr(module, "_tensoropt_recompute", False):
        return
    orig = module.forward

    @functools.wraps(orig)
    def forward(*args, **kwargs):
        return checkpoint(orig, *args, use_reentrant=False, **kwargs)

    module.forward = forward                  # type: ignore[method-assign]
    module._tensoropt_recompute = True        # type: ignore[attr-defined]


def _coords(mesh: DeviceMesh) -> list[int]:
    c = mesh.get_coordinate()
    if c is None:
        raise RuntimeError("this rank is not part of the mesh")
    return list(c)


def shard_batch(inputs: Sequence[Any], spec: ApplySpec, mesh: DeviceMesh) -> tuple:
    """This rank's slice of the global batch: input i is split along dim d for every mesh axis
    whose ``spec.input_placements[i]`` is ``S(d)`` (axes in mesh order, outer first, like DTensor).
    Inputs without placements (or non-tensors) are passed unchanged. Sizes must divide evenly."""
    coords = _coords(mesh)
    out = []
    for i, x in enumerate(inputs):
        pls = spec.input_placements[i] if i < len(spec.input_placements) else None
        if pls is None or not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        for axis, p in enumerate(pls):
            kind, d = parse_placement_str(p)
            n = spec.mesh.shape[axis]
            if kind != "S" or n == 1:
                continue
            if x.shape[d] % n:
                raise ValueError(f"input {i}: dim {d} of size {x.shape[d]} does not split evenly over "
                                 f"mesh axis {spec.mesh.axis_names[axis]} of size {n}")
            x = x.chunk(n, dim=d)[coords[axis]]
        out.append(x.contiguous())
    return tuple(out)


def global_loss(loss: torch.Tensor, spec: ApplySpec, mesh: DeviceMesh) -> torch.Tensor:
    """Detached mean of the per-rank loss over the data axes (equals the single-process loss
    when every data shard has the same size). Model axes already hold a replicated loss."""
    t = loss.detach()
    if isinstance(t, DTensor):
        t = t.full_tensor()
    t = t.clone()
    data = [a for a in spec.data_axes if spec.mesh.shape[a] > 1]
    if not data:
        return t
    dp = _data_mesh(mesh, spec, data)
    dist.all_reduce(t, group=dp.get_group())
    return t / math.prod(spec.mesh.shape[a] for a in data)


def full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter as a full tensor (``DTensor.full_tensor()``; collective on all ranks)."""
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for n, p in model.named_parameters()}


def full_grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """Every parameter's gradient as a full tensor (collective on all ranks)."""
    out = {}
    for n, p in model.named_parameters():
        g = p.grad
        out[n] = None if g is None else (g.full_tensor() if isinstance(g, DTensor) else g).detach().clone()
    return out
