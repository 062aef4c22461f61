"""Lay a frontier :class:`~tensoropt.plan.Plan` out exactly, operator by operator.

A plan gives every captured operator a configuration (per mesh axis the label split over it).
That fixes the layout of every operand (``strategy.term_placements``) and of the output
(``Shard(d)``/``Replicate()``/``Partial()``, :mod:`tensoropt.placement`). ``plan_layout`` works these out and checks them against the model
without any collective; ``apply_plan`` then runs them:

* plans whose mesh axes are all data-parallel (every batched operator splits the batch, no
  BatchNorm needs the whole batch's statistics: ``execution.runs_replicated``) run the model's
  own code under FSDP2 -- ``replicate`` (ZeRO 0) or ``fully_shard`` (ZeRO 2 keeps parameters
  gathered after forward, ZeRO 3 reshards) -- one group per repeated block and the root, the
  batch split per rank;
* every other plan runs the model's captured program with the plan's layouts on DTensor
  (``runner.ProgramRunner``): the same nodes that were planned, whatever the eager code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.checkpoint import checkpoint

from ..capture.inputs import example_call, inputs_from_spec, loss_of, replace_loss
from ..execution import aten_base, batch_statistics_axes, data_axes, runs_replicated
from ..opgraph import OpGraph
from ..placement import REPLICATE, Placement, Shard
from ..plan import Plan
from ..recompute import check as check_policy
from .checkpointing import checkpoint_context
from ..strategy import OpConfig, contracted_labels, output_placements, term_placements
from ..traffic import grad_partial
from ..capture.signature import param_signature

__all__ = ["PlanNotApplicable", "PlanLayout", "OpLayout", "plan_layout", "apply_plan", "capture_for_plan", "plan_call",
           "checkpoint_forward", "split_batch"]


class PlanNotApplicable(ValueError):
    """The plan names a choice the apply layer cannot lay out exactly."""


@dataclass
class OpLayout:
    index: int
    name: str
    module: str
    family: str
    base: str                              # its main aten op, e.g. "linear"
    nodes: tuple[str, ...]                 # its nodes in the captured program
    operand_nodes: tuple[str, ...]         # per operand, the node that feeds it
    config: OpConfig
    terms: tuple[str, ...]
    out_term: str
    contracted: str
    param_names: tuple[str | None, ...]
    want: tuple[tuple[Placement, ...], ...]  # per operand: placement per mesh axis
    grad_partial: tuple[tuple[bool, ...], ...]  # per operand: gradient arrives as partial sums
    out: tuple[Placement, ...]              # output placement per mesh axis (Partial allowed)
    batch_axes: tuple[int, ...] = ()        # BatchNorm: axes its statistics are all-reduced over


@dataclass
class PlanLayout:
    plan: Plan
    graph: OpGraph
    ops: list[OpLayout]
    param_placements: dict[str, tuple[Placement, ...]]
    data_axes: tuple[int, ...]
    mode: str                               # "replicate" (all axes data-parallel) or "dtensor"
    program: Any = None                     # capture.Program the graph was built from
    call: tuple = ((), {})                  # the captured call's (args, kwargs), on meta

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return tuple(self.plan.mesh_shape)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return self.plan.mesh_axis_names


# ---------------------------------------------------------------------------------- layout


def plan_call(plan: Plan, model: nn.Module, inputs: Any = None, batch: int | None = None) -> tuple[tuple, dict]:
    """(args, kwargs) on meta to capture ``model`` for ``plan`` at ``batch`` (the plan's by
    default): ``inputs`` if given, else the shapes the plan stores, else a zoo model's own
    (for the model's config)."""
    plan_batch = (plan.training or {}).get("batch_size")
    if inputs is not None:
        return example_call(inputs, batch=plan_batch, at=batch, meta=True)
    if plan.inputs:
        return inputs_from_spec(plan.inputs, plan_batch, batch)
    from ..models import MODEL_NAMES

    if plan.model not in MODEL_NAMES:
        raise ValueError(f"plan for {plan.model!r} stores no input shapes (made before plans carried them): "
                         "pass inputs= (example inputs at the plan's batch size; meta tensors are fine)")
    import dataclasses

    cfg = getattr(model, "config", None)
    overrides = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else {}
    return example_call(zoo=plan.model, at=batch or plan_batch, overrides=overrides)


def capture_for_plan(plan: Plan, model: nn.Module, inputs: Any = None, batch: int | None = None):
    """(graph, program, call): ``model`` captured again on meta inputs for ``plan``."""
    from ..capture import capture_program

    args, kwargs = plan_call(plan, model, inputs, batch)
    graph, program = capture_program(model, args, kwargs=kwargs, name=plan.model)
    return graph, program, (args, kwargs)


def plan_layout(plan: Plan, model: nn.Module, inputs: Any = None, captured=None) -> PlanLayout:
    """Check ``plan`` against ``model`` and work out every operand's layout (no collectives).
    ``captured``: (graph, program, call) from ``capture_for_plan``, captured here if None."""
    if not isinstance(plan, Plan):
        raise TypeError(f"expected a tensoropt Plan, got {type(plan).__name__}")
    sig = param_signature(model)
    if plan.param_signature and plan.param_signature != sig:
        raise ValueError(
            f"plan was made for another model: plan {plan.model!r} has parameter signature "
            f"{plan.param_signature[:16]}..., this model's is {sig[:16]}... "
            "(parameter names, shapes or dtypes differ; re-plan for this model)")
    graph, program, call = captured if captured is not None else capture_for_plan(plan, model, inputs)
    names_g = [o.name for o in graph.operators]
    names_p = [o.name for o in plan.ops]
    if names_g != names_p:
        diff = next((i for i, (a, b) in enumerate(zip(names_g, names_p)) if a != b), min(len(names_g), len(names_p)))
        raise ValueError(f"plan does not match the model's captured graph: operator {diff} is "
                         f"{names_p[diff] if diff < len(names_p) else '(none)'!r} in the plan and "
                         f"{names_g[diff] if diff < len(names_g) else '(none)'!r} in the model; re-plan")
    ndim = len(plan.mesh_shape)
    cfgs = []
    for o in plan.ops:
        cfg = OpConfig.parse(o.config)
        if len(cfg.splits) != ndim:
            raise ValueError(f"corrupt plan: operator {o.name} has config {o.config!r} for a "
                             f"{ndim}-D mesh {plan.mesh_shape}")
        cfgs.append(cfg)
    params = dict(model.named_parameters(remove_duplicate=False))
    ops: list[OpLayout] = []
    pplace: dict[str, tuple[Placement, ...]] = {}
    for i, (op, cfg) in enumerate(zip(graph.operators, cfgs)):
        terms, out = op.terms
        contracted = contracted_labels(op)
        for a, s in enumerate(cfg.splits):
            if s is not None and s not in op.splittable:
                raise PlanNotApplicable(f"operator {op.name}: config {cfg} splits label {s!r} on mesh "
                                        f"axis m{a}, which the operator cannot split ({op.equation})")
        base = aten_base(op.aten[0]) if op.aten else op.name
        if base == "embedding" and sum(1 for s in cfg.splits if s is not None and s in contracted) > 1:
            raise PlanNotApplicable(f"operator {op.name}: vocabulary split over several mesh axes ({cfg})")
        want = tuple(term_placements(cfg, t) for t in terms)
        gp = tuple(grad_partial(cfg, t) for t in terms)
        outp = output_placements(op, cfg)
        for j, (pname, w) in enumerate(zip(op.param_names, want)):
            if pname is None:
                continue
            if pname not in params:
                raise ValueError(f"operator {op.name} uses parameter {pname!r}, which the model does not have")
            shape = tuple(params[pname].shape)
            w = _storage_placements(program, op.operand_nodes[j] if op.operand_nodes else None, w,
                                    op.operands[j].shape, shape)
            pplace.setdefault(pname, w)
            cut = {}
            for a, p in enumerate(w):
                if isinstance(p, Shard):
                    cut[p.dim] = cut.get(p.dim, 1) * plan.mesh_shape[a]
            for d, n in cut.items():
                if d >= len(shape) or shape[d] % n:
                    raise ValueError(f"operator {op.name}: parameter {pname} of shape {shape} cannot be "
                                     f"split {n} ways on dim {d} (plan placements {w})")
        ops.append(OpLayout(i, op.name, op.module, op.family, base, op.nodes, op.operand_nodes, cfg,
                            tuple(terms), out, contracted, tuple(op.param_names), want, gp, outp,
                            batch_statistics_axes(op, cfg)))
    dp_axes = data_axes(graph, cfgs, plan.mesh_shape)
    mode = "replicate" if runs_replicated(graph, cfgs, plan.mesh_shape) else "dtensor"
    check_policy(getattr(plan, "recompute_policy", "full"))
    for fqn in tuple(getattr(plan, "recompute", ()) or ()):
        try:
            model.get_submodule(fqn)
        except AttributeError:
            raise ValueError(f"plan recomputes module {fqn!r}, which the model does not have") from None
    return PlanLayout(plan, graph, ops, pplace, dp_axes, mode, program, call)


def _storage_placements(program, node: str | None, want: tuple[Placement, ...], operand_shape,
                        shape) -> tuple[Placement, ...]:
    """A parameter's own placements for an operand that shows it through views (a transpose
    moves the split dim; a dim it is expanded along is replicated: the operand's shards are
    local slices of it)."""
    if program is None or node is None:
        return want
    _, dims = program.source_dims(node)
    out = []
    for p in want:
        if isinstance(p, Shard):
            d = p.dim
            pd = dims[d] if d < len(dims) else None
            p = Shard(pd) if pd is not None and pd < len(shape) and shape[pd] == operand_shape[d] else REPLICATE
        out.append(p)
    return tuple(out)


# ---------------------------------------------------------------------------------- apply


def apply_plan(model: nn.Module, layout: PlanLayout, mesh: DeviceMesh) -> nn.Module:
    """Lay ``model`` out in place on ``mesh`` (collective: every rank must call it)."""
    if layout.mode == "replicate":
        _apply_replicate(model, layout, mesh)
    else:
        from .runner import ProgramRunner

        runner = ProgramRunner(model, layout, layout.program, mesh)
        runner.install_parameters()
        call = layout.call

        def forward(*args, **kwargs):
            return runner.forward(call, *args, **kwargs)

        model.forward = forward                   # type: ignore[method-assign]
        model._tensoropt_runner = runner          # type: ignore[attr-defined]
    model._tensoropt_plan_layout = layout     # type: ignore[attr-defined]
    model._tensoropt_mesh = mesh              # type: ignore[attr-defined]
    return model


def layout_of(model: nn.Module) -> PlanLayout | None:
    """The layout :func:`apply_plan` laid ``model`` out by; None for a model it did not."""
    return getattr(model, "_tensoropt_plan_layout", None)


def _apply_replicate(model: nn.Module, layout: PlanLayout, mesh: DeviceMesh) -> None:
    """All axes data-parallel: FSDP2 ``replicate`` (ZeRO 0) or ``fully_shard`` (ZeRO 1 and 2:
    keep parameters gathered after forward, and ZeRO-1 through a step's micro-batches, see
    ``apply._gradient_sync``; ZeRO 3: reshard), one group per repeated block and the root
    (``execution.gradient_group``); recomputed modules run under non-reentrant checkpointing."""
    zero = getattr(layout.plan, "zero_stage", 0) or 0
    if zero:
        from torch.distributed.fsdp import fully_shard

        def wrap(m, mesh):
            fully_shard(m, mesh=mesh, reshard_after_forward=zero == 3)
    else:
        from torch.distributed._composable.replicate_with_fsdp import replicate as wrap
    for fqn in getattr(layout.plan, "recompute", ()) or ():
        checkpoint_forward(model.get_submodule(fqn), getattr(layout.plan, "recompute_policy", "full"))
    # one device: no axis splits anything, and the wrappers get the mesh's (size-1) axes
    names = tuple(layout.axis_names[a] for a in layout.data_axes) or tuple(layout.axis_names)
    dp = mesh[names[0]] if len(names) == 1 else mesh[names]._flatten("_".join(names))
    for fqn in layout.graph.block_modules:
        block = model.get_submodule(fqn)
        if any(True for _ in block.parameters()):
            wrap(block, mesh=dp)
    wrap(model, mesh=dp)
    n, r = dp.size(), dp.get_local_rank()
    batch = layout.graph.batch_size

    def pre(_m, args, kwargs):
        if batch % n:
            raise ValueError(f"batch of {batch} does not split evenly over {n} data-parallel ranks")
        return split_batch((tuple(args), kwargs), batch, n)[r]

    def post(_m, _args, out):
        loss = loss_of(out)
        if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
            return out
        g = loss.detach().clone()
        dist.all_reduce(g, group=dp.get_group())     # the reported value: mean over the data ranks
        return replace_loss(out, loss + (g / n - loss).detach())

    model.register_forward_pre_hook(pre, with_kwargs=True)
    model.register_forward_hook(post)


def split_batch(call, batch: int, n: int) -> list:
    """``call`` (any nesting of tuples, lists and dicts, e.g. ``(args, kwargs)``) as ``n``
    parts: every tensor whose dimension 0 is the batch of ``batch`` cut along it into ``n``
    contiguous chunks, everything else shared by the parts."""
    leaves, spec = tree_flatten(call)
    parts = [[c.contiguous() for c in t.chunk(n, dim=0)]
             if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == batch else [t] * n for t in leaves]
    return [tree_unflatten([p[k] for p in parts], spec) for k in range(n)]


def checkpoint_forward(module: nn.Module, policy: str = "full") -> None:
    """Activation checkpointing without changing FQNs: the module's forward (inside its hooks)
    runs under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``, keeping what
    ``policy`` keeps (``tensoropt.recompute``)."""
    if getattr(module, "_tensoropt_recompute", False):
        return
    orig = module.forward
    extra = {"context_fn": checkpoint_context(policy)} if policy != "full" else {}

    @functools.wraps(orig)
    def forward(*args, **kwargs):
        return checkpoint(orig, *args, use_reentrant=False, **extra, **kwargs)

    module.forward = forward                  # type: ignore[method-assign]
    module._tensoropt_recompute = True        # type: ignore[attr-defined]
