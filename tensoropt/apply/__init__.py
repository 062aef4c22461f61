"""Run a frontier :class:`~tensoropt.plan.Plan` with PyTorch's own distributed stack.

One front door: ``parallelize(model, plan)`` (a Plan or the path of a saved one), inside a
``torchrun`` launch. Every check -- parameter signature, the plan against the model's
captured graph, device count, mesh -- runs before any collective (``layout.plan_layout``);
then, by what the plan is:

* all mesh axes data-parallel: the model's own code under FSDP2 ``replicate`` /
  ``fully_shard`` (``layout.apply_plan``);
* otherwise the model's captured program on a ``DeviceMesh``, operator by operator on
  DTensor (``runner.ProgramRunner``);
* pipeline stages: ``torch.distributed.pipelining`` with 1F1B (``pipeline_runner``),
  returning a :class:`PipelineRunner`.

``train_step(model, *inputs)`` runs one step of any of them; ``layout_of(model)`` is the
layout a model was given (not a pipeline's). ``measure`` counts a step's collectives and its
peak memory.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten

from ..capture.inputs import loss_of
from ..capture.signature import param_signature
from ..execution import syncs_gradients_once
from ..opgraph import rebatch_spec
from ..plan import Plan
from .layout import PlanNotApplicable, apply_plan, layout_of, plan_layout, split_batch
from .measure import count_collectives, peak_memory, step_peak_memory
from .meshes import device_mesh
from .pipeline_runner import PipelineRunner, pipeline
from .process_group import current_world_size, ensure_process_group

__all__ = [
    "parallelize", "train_step", "load_plan", "param_signature", "full_grads", "count_collectives", "peak_memory",
    "step_peak_memory", "plan_layout", "layout_of", "PlanNotApplicable", "PipelineRunner",
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
    raise TypeError(f"expected a Plan or a plan file path, got {type(plan).__name__}")


def parallelize(model: nn.Module, plan: "Plan | str | os.PathLike", mesh: DeviceMesh | None = None, *,
                inputs: Any = None):
    """Lay ``model`` out according to ``plan`` on this rank of a ``torchrun`` launch.

    ``plan``: a frontier :class:`~tensoropt.plan.Plan` or the path of a saved one. The model
    is captured again on meta tensors of the input shapes the plan stores (``inputs=``:
    example inputs, for a plan that stores none). All validation happens before any
    collective.

    Returns the model, laid out in place: every rank passes the whole global batch to
    ``model(...)`` (positional or keyword, as planned) and gets the global loss back. ZeRO
    stages and recomputed modules of the plan are applied. A pipeline plan returns a
    :class:`PipelineRunner` instead: forward and backward run together over the
    micro-batches (1F1B), ``loss = runner.step(...)``. A plan that accumulates gradients over
    micro-batches without pipeline stages (``plan_for(..., microbatches=m)``) is laid out for
    one micro-batch: run its steps with :func:`train_step`, which cuts the global batch.
    :func:`train_step` runs one step of any kind.
    """
    plan = load_plan(plan)
    if plan.stages:
        return pipeline(model, plan, mesh=mesh, inputs=inputs)
    m, batch = plan.microbatches, int(plan.training.get("batch_size", 0) or 0)
    if m > 1:
        # gradient accumulation: laid out for one micro-batch; train_step runs the m of a step
        if not plan.inputs or not batch or batch % m:
            raise ValueError(f"a plan accumulating {m} micro-batches needs the input shapes it stores, at a "
                             f"global batch that {m} divides (got batch {batch or 'unknown'}); plan it again "
                             f"with tensoropt.plan_for")
        plan = replace(plan, inputs=rebatch_spec(plan.inputs, batch, batch // m))
    layout = plan_layout(plan, model, inputs)
    ws = current_world_size()
    if ws != plan.world_size:
        raise ValueError(f"world size {ws} does not match the plan's mesh {plan.mesh} "
                         f"({plan.world_size} devices, planned for {plan.devices!r}); launch with "
                         f"--nproc-per-node {plan.world_size} or re-plan for {ws} devices")
    if mesh is not None and tuple(mesh.shape) != tuple(plan.mesh_shape):
        raise ValueError(f"mesh {tuple(mesh.shape)} does not match the plan's mesh {tuple(plan.mesh_shape)}")
    device_type = ensure_process_group()
    if device_type == "cuda":
        model.to(torch.device("cuda", torch.cuda.current_device()))
    if mesh is None:
        mesh = device_mesh(device_type, tuple(plan.mesh_shape), plan.mesh_axis_names)
    out = apply_plan(model, layout, mesh)
    if m > 1:
        out._tensoropt_accumulate = (m, batch)        # type: ignore[attr-defined]

        def whole_batch(_m, args, kwargs):
            if any(isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == batch
                   for a in tree_flatten((args, kwargs))[0]):
                raise ValueError(f"this plan accumulates gradients over {m} micro-batches of {batch // m}: "
                                 f"run a step with tensoropt.train_step(model, ...), which cuts the batch of "
                                 f"{batch}, not model(...) on the whole batch")
        out.register_forward_pre_hook(whole_batch, with_kwargs=True, prepend=True)
    return out


def train_step(model, *args, **kwargs):
    """One training step's forward and backward on a parallelized model (a pipeline's 1F1B
    schedule; for a plan accumulating gradients, ``model(...)`` and ``backward`` on each of
    its micro-batches, cut from the global batch along dimension 0, each loss scaled by one
    over their number; else ``model(...)`` then ``backward``); returns the loss (detached for
    a pipeline and for accumulated micro-batches: their mean)."""
    if isinstance(model, PipelineRunner):
        return model.step(*args, **kwargs)
    accumulate = getattr(model, "_tensoropt_accumulate", None)
    if accumulate is not None:
        m, batch = accumulate
        total = 0.0
        try:
            for k, (part_args, part_kwargs) in enumerate(split_batch((args, kwargs), batch, m)):
                _gradient_sync(model, k == m - 1)
                loss = loss_of(model(*part_args, **part_kwargs))
                (loss / m).backward()
                total = total + loss.detach()
        finally:
            _gradient_sync(model, True)
        return total / m
    out = model(*args, **kwargs)
    loss = loss_of(out)
    loss.backward()
    return loss


def _gradient_sync(model: nn.Module, on: bool) -> None:
    """Gradient reductions on or off for the next micro-batch's backward, where the plan
    reduces gradients once per step (``execution.syncs_gradients_once``)."""
    layout = layout_of(model)
    if layout is None:
        return
    zero = getattr(layout.plan, "zero_stage", 0) or 0
    if not syncs_gradients_once(zero):
        return
    runner = getattr(model, "_tensoropt_runner", None)
    if runner is not None:
        runner.defer_grad_sync = not on
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_requires_gradient_sync(on, recurse=False)
            if zero:
                # ZeRO-1 on fully_shard: the parameters gathered by the first micro-batch stay
                # unsharded until the last one's backward
                module.set_reshard_after_backward(on, recurse=False)


def full_grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """Every parameter's gradient as a full tensor (collective on all ranks)."""
    out = {}
    for n, p in model.named_parameters():
        g = p.grad
        out[n] = None if g is None else (g.full_tensor() if isinstance(g, DTensor) else g).detach().clone()
    return out
