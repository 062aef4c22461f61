"""Lay a frontier :class:`~tensoropt.plan.Plan` out exactly, operator by operator.

A plan gives every captured operator a configuration (per mesh axis the label split over it).
That fixes the layout of every operand (``strategy.term_placements``) and of the output
(``S(d)``/``R``/``P``). The layout is executed with DTensor on the plan's full mesh:

* parameters become DTensors with their first user's operand placements;
* the model's tensor inputs become replicated DTensors (every rank passes the full batch);
* a ``TorchFunctionMode`` active during ``forward`` recognises each captured operator when it
  is called (innermost module FQN + function name, in capture order), redistributes each
  operand from the producer's layout to the planned one -- the per-edge re-layouts of the
  cost model, whose backward DTensor derives -- and runs the operator on the *local shards*,
  wrapping the result in the planned output layout. Local execution issues no collective
  of its own, so the collectives of a step are exactly the planned re-layouts plus the
  parameter-gradient reductions (a post-accumulate-grad hook turns ``P`` gradients into the
  parameter's placements). Corrections keep local execution exact: a bias under a
  contracted split is added on one rank only, mean reductions over a split label are scaled
  to partial sums, a vocabulary-split embedding masks foreign rows;
* everything between operators (views, transposes) runs on DTensors with DTensor's rules.

ZeRO (``plan.zero_stage``) on a plan with model-parallel axes: a parameter is additionally
sharded over the axes where it is replicated while its operator splits another label (its
data-parallel axes, where its gradient is a partial sum); each use gathers it with the same
per-operand redistribution (all-gather forward, reduce-scatter of the gradient backward), so
parameters, gradients and Adam state are stored sharded. Stage 3 does not keep the gathered
copy for backward: autograd's saved copy is replaced by a reference to the shard and gathered
again when backward unpacks it (``saved_tensors_hooks``); stage 2 keeps it from forward to
backward (like FSDP2's ``reshard_after_forward=False``).

Recomputation (``plan.recompute``): each named module's forward runs under non-reentrant
``torch.utils.checkpoint``. The recomputation in backward runs outside the forward's function
mode, so the checkpointed body enters a fresh mode with the module's operators queued and the
recomputed operators run exactly as in forward (local shards, same re-layouts: their forward
collectives are issued again during backward).

Plans whose mesh axes are all data-parallel (every batched operator splits the batch) use
FSDP2's ``replicate`` instead (gradient all-reduce), with the batch split per rank.

BatchNorm splitting the batch needs the statistics of the whole batch: it runs locally with
per-channel sums all-reduced over the axes that split the batch (``_sync_batch_norm``: the
SyncBatchNorm the cost model prices), so such plans never take the ``replicate`` path, whose
ranks would normalise by their own slice. Operators grouped from several aten ops are rejected
(``PlanNotApplicable``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.checkpoint import checkpoint

from ..execution import aten_base, batch_statistics_axes, data_axes, runs_replicated
from ..opgraph import OpGraph
from ..plan import Plan
from ..strategy import OpConfig, term_placements
from ._sync_batch_norm import sync_batch_norm
from ._validate import param_signature

__all__ = ["PlanNotApplicable", "PlanLayout", "OpLayout", "plan_layout", "apply_plan", "capture_for_plan"]


class PlanNotApplicable(ValueError):
    """The plan names a choice the apply layer cannot lay out exactly."""


# Captured aten name -> torch-function names that call it.
_ALIASES = {
    "add": {"add", "__add__", "__radd__", "__iadd__", "add_"},
    "mul": {"mul", "__mul__", "__rmul__", "mul_"},
    "sub": {"sub", "__sub__", "__rsub__"},
    "cross_entropy_loss": {"cross_entropy"},
    "relu": {"relu", "relu_"},
    "gelu": {"gelu"},
    "silu": {"silu"},
    "mean": {"mean"},
    "sum": {"sum"},
}
_MEAN_REDUCTIONS = ("mean",)


def _func_name(func) -> str:
    name = getattr(func, "__name__", "")
    if not name and hasattr(func, "__func__"):
        name = func.__func__.__name__
    return name


def _to_placement(p: str) -> Placement:
    if p == "R":
        return Replicate()
    if p == "P":
        return Partial()
    m = re.match(r"^S\((\d+)\)$", p)
    if not m:
        raise ValueError(f"unknown placement {p!r}")
    return Shard(int(m.group(1)))


@dataclass
class OpLayout:
    index: int
    name: str
    module: str
    family: str
    base: str                              # captured aten name, e.g. "linear"
    func_names: frozenset[str]
    config: OpConfig
    terms: tuple[str, ...]
    out_term: str
    contracted: str
    param_names: tuple[str | None, ...]
    want: tuple[tuple[str, ...], ...]       # per operand: placement per mesh axis
    grad_partial: tuple[tuple[bool, ...], ...]  # per operand: gradient arrives as partial sums
    out: tuple[str, ...]                    # output placement per mesh axis ("P" allowed)
    batch_axes: tuple[int, ...] = ()        # BatchNorm: axes its statistics are all-reduced over


@dataclass
class PlanLayout:
    plan: Plan
    graph: OpGraph
    ops: list[OpLayout]
    param_placements: dict[str, tuple[str, ...]]
    data_axes: tuple[int, ...]
    mode: str                               # "replicate" (all axes data-parallel) or "dtensor"

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return tuple(self.plan.mesh_shape)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return self.plan.mesh_axis_names


# ---------------------------------------------------------------------------------- layout


def capture_for_plan(plan: Plan, model: nn.Module, inputs: tuple | None = None) -> OpGraph:
    """Capture ``model`` again (on meta inputs) for a plan: the zoo's example inputs of
    ``plan.model`` at the plan's batch size, sized by the model's own config."""
    from ..capture import capture

    if inputs is None:
        from ..models import MODEL_NAMES, example_inputs

        if plan.model not in MODEL_NAMES:
            raise ValueError(f"plan is for model {plan.model!r}, which is not in the zoo: pass the "
                             "captured graph (graph=tensoropt.capture.capture(model, inputs)) or inputs=")
        cfg = getattr(model, "config", None)
        overrides = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else {}
        batch = plan.training.get("batch_size") if plan.training else None
        try:
            inputs = tuple(example_inputs(plan.model, batch, device="meta", **overrides))
        except (TypeError, ValueError):
            inputs = tuple(example_inputs(plan.model, batch, device="meta"))
    return capture(model, tuple(inputs), name=plan.model)


def plan_layout(plan: Plan, model: nn.Module, graph: OpGraph | None = None) -> PlanLayout:
    """Check ``plan`` against ``model`` and work out every operand's layout (no collectives)."""
    if not isinstance(plan, Plan):
        raise TypeError(f"expected a tensoropt Plan, got {type(plan).__name__}")
    if getattr(plan, "stages", ()) or getattr(plan, "microbatches", 1) > 1:
        raise PlanNotApplicable(
            f"plan {plan.summary} is a pipeline plan ({len(plan.stages)} stage plans, "
            f"{getattr(plan, 'microbatches', 1)} micro-batches): a pipelined model cannot be called like "
            "the original; use runner = tensoropt.apply.pipeline(model, plan) and runner.step(*inputs)")
    sig = param_signature(model)
    if plan.param_signature and plan.param_signature != sig:
        raise ValueError(
            f"plan was made for another model: plan {plan.model!r} has parameter signature "
            f"{plan.param_signature[:16]}..., this model's is {sig[:16]}... "
            "(parameter names, shapes or dtypes differ; re-plan for this model)")
    if graph is None:
        graph = capture_for_plan(plan, model)
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
    pplace: dict[str, tuple[str, ...]] = {}
    for i, (op, cfg) in enumerate(zip(graph.operators, cfgs)):
        terms, out = op.terms
        contracted = "".join(dict.fromkeys(c for t in terms for c in t if c not in out))
        for a, s in enumerate(cfg.splits):
            if s is not None and s not in op.splittable:
                raise PlanNotApplicable(f"operator {op.name}: config {cfg} splits label {s!r} on mesh "
                                        f"axis m{a}, which the operator cannot split ({op.equation})")
        if len(op.aten) != 1 and any(s is not None for s in cfg.splits):
            raise PlanNotApplicable(
                f"operator {op.name} ({op.module_type or op.family}) groups {len(op.aten)} aten ops "
                f"{op.aten}; the apply layer lays out single-op operators only (config {cfg})")
        base = aten_base(op.aten[0]) if op.aten else op.name
        if base == "embedding" and any(s is not None and s in contracted for s in cfg.splits) and \
                sum(1 for s in cfg.splits if s is not None and s in contracted) > 1:
            raise PlanNotApplicable(f"operator {op.name}: vocabulary split over several mesh axes ({cfg})")
        want = tuple(term_placements(cfg, t) for t in terms)
        gp = tuple(tuple(s is not None and s not in t for s in cfg.splits) for t in terms)
        outp = term_placements(cfg, out, contracted)
        for t, pname, w in zip(terms, op.param_names, want):
            if pname is None:
                continue
            if pname not in params:
                raise ValueError(f"operator {op.name} uses parameter {pname!r}, which the model does not have")
            pplace.setdefault(pname, w)
            shape = tuple(params[pname].shape)
            cut = {}
            for a, p in enumerate(w):
                if p.startswith("S("):
                    d = int(p[2:-1])
                    cut[d] = cut.get(d, 1) * plan.mesh_shape[a]
            for d, n in cut.items():
                if d >= len(shape) or shape[d] % n:
                    raise ValueError(f"operator {op.name}: parameter {pname} of shape {shape} cannot be "
                                     f"split {n} ways on dim {d} (plan placements {w})")
        names = frozenset(_ALIASES.get(base, {base}))
        ops.append(OpLayout(i, op.name, op.module, op.family, base, names, cfg, tuple(terms), out,
                            contracted, tuple(op.param_names), want, gp, outp, batch_statistics_axes(op, cfg)))
    dp_axes = data_axes(graph, cfgs, plan.mesh_shape)
    mode = "replicate" if runs_replicated(graph, cfgs, plan.mesh_shape) else "dtensor"
    recompute = tuple(getattr(plan, "recompute", ()) or ())
    for fqn in recompute:
        try:
            model.get_submodule(fqn)
        except AttributeError:
            raise ValueError(f"plan recomputes module {fqn!r}, which the model does not have") from None
    return PlanLayout(plan, graph, ops, pplace, dp_axes, mode)


# ---------------------------------------------------------------------------------- apply


def apply_plan(model: nn.Module, layout: PlanLayout, mesh: DeviceMesh) -> nn.Module:
    """Lay ``model`` out in place on ``mesh`` (collective: every rank must call it)."""
    if layout.mode == "replicate":
        _apply_replicate(model, layout, mesh)
    else:
        _Runner(model, layout, mesh).install()
    model._tensoropt_plan_layout = layout     # type: ignore[attr-defined]
    model._tensoropt_mesh = mesh              # type: ignore[attr-defined]
    return model


def _apply_replicate(model: nn.Module, layout: PlanLayout, mesh: DeviceMesh) -> None:
    """All axes data-parallel: FSDP2 ``replicate`` (ZeRO 0) or ``fully_shard`` (ZeRO 2: keep
    parameters gathered after forward; ZeRO 3: reshard), one group per ``layers`` block and
    the root; recomputed modules run under non-reentrant checkpointing."""
    from . import _checkpoint_forward

    zero = getattr(layout.plan, "zero_stage", 0) or 0
    if zero:
        from torch.distributed.fsdp import fully_shard

        def wrap(m, mesh):
            fully_shard(m, mesh=mesh, reshard_after_forward=zero == 3)
    else:
        from torch.distributed._composable.replicate_with_fsdp import replicate as wrap
    for fqn in getattr(layout.plan, "recompute", ()) or ():
        _checkpoint_forward(model.get_submodule(fqn))
    names = tuple(layout.axis_names[a] for a in layout.data_axes)
    dp = mesh[names[0]] if len(names) == 1 else mesh[names]._flatten("_".join(names))
    layers = getattr(model, "layers", None)
    if isinstance(layers, (nn.ModuleList, nn.Sequential)):
        for block in layers:
            if any(True for _ in block.parameters()):
                wrap(block, mesh=dp)
    wrap(model, mesh=dp)
    n, r = dp.size(), dp.get_local_rank()

    def pre(_m, args, kwargs):
        batch = None
        out = []
        for a in args:
            if isinstance(a, torch.Tensor) and a.dim() > 0:
                batch = a.shape[0] if batch is None else batch
                if a.shape[0] == batch:
                    if batch % n:
                        raise ValueError(f"batch of {batch} does not split evenly over {n} data-parallel ranks")
                    a = a.chunk(n, dim=0)[r].contiguous()
            out.append(a)
        return tuple(out), kwargs

    def post(_m, _args, loss):
        if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
            return loss
        g = loss.detach().clone()
        dist.all_reduce(g, group=dp.get_group())     # the reported value: mean over the data ranks
        return loss + (g / n - loss).detach()

    model.register_forward_pre_hook(pre, with_kwargs=True)
    model.register_forward_hook(post)


class _Mode(TorchFunctionMode):
    def __init__(self, runner: "_Runner") -> None:
        super().__init__()
        self.runner = runner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = self.runner.match(func)
        if op is None:
            return func(*args, **kwargs)
        return self.runner.run(op, func, args, kwargs)


class _Runner:
    def __init__(self, model: nn.Module, layout: PlanLayout, mesh: DeviceMesh,
                 root: nn.Module | None = None) -> None:
        self.model, self.layout, self.mesh = model, layout, mesh
        self.root = model if root is None else root     # where forward starts and ends (pipeline stage)
        self.coord = list(mesh.get_coordinate() or [])
        self.stack: list[str] = []
        self.pending: dict[str, list[OpLayout]] = {}
        self.mode: _Mode | None = None
        self.zero = getattr(layout.plan, "zero_stage", 0) or 0
        self.ckpt_depth = 0                       # > 0 inside a recomputed module
        # ZeRO: per parameter (owner name) the axes its storage is sharded over in addition to
        # the plan's placements, and the resulting storage placements.
        self.zero_axes: dict[str, tuple[int, ...]] = {}
        self.storage: dict[str, tuple[str, ...]] = {}
        self.params_by_id: dict[int, str] = {}

    # -- setup
    def install(self) -> None:
        model, mesh = self.model, self.mesh
        tied: dict[int, list[str]] = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            tied.setdefault(id(p), []).append(n)
        done: dict[int, nn.Parameter] = {}
        if self.zero:
            self._zero_storage()
        for names in tied.values():
            owner = next((n for n in names if n in self.layout.param_placements), None)
            p = model.get_parameter(names[0])
            pls = self.storage.get(owner) or self.layout.param_placements.get(owner) if owner else None
            pls = pls or tuple("R" for _ in self.layout.mesh_shape)
            new = nn.Parameter(distribute_tensor(p.data, mesh, [_to_placement(x) for x in pls]),
                               requires_grad=p.requires_grad)
            new.register_post_accumulate_grad_hook(_reduce_partial_grad)
            for n in names:
                mod_name, _, leaf = n.rpartition(".")
                mod = model.get_submodule(mod_name) if mod_name else model
                setattr(mod, leaf, new)
            done[id(p)] = new
            if owner in self.zero_axes:
                self.params_by_id[id(new)] = owner
        for fqn, mod in model.named_modules():
            mod.register_forward_pre_hook(self._push(fqn))
            mod.register_forward_hook(self._pop(fqn))
        for fqn in getattr(self.layout.plan, "recompute", ()) or ():
            self._recompute(fqn)
        self.root.register_forward_pre_hook(self._root_pre, with_kwargs=True, prepend=True)
        self.root.register_forward_hook(self._root_post)

    def _zero_storage(self) -> None:
        """ZeRO on the axes where a parameter is replicated while its operator splits another
        label (its data-parallel axes): the stored parameter -- and so its gradient and optimizer
        state -- is sharded there too (an even split of some dim; dims that do not split evenly
        stay replicated). Each use gathers it (``redistribute``: all-gather in forward, and the
        partial gradient is reduce-scattered back by redistribute's backward). Stage 3 also
        drops the gathered copy after forward and gathers again in backward (``run``)."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        shape = self.layout.mesh_shape
        seen: set[str] = set()
        for o in self.layout.ops:
            for j, pname in enumerate(o.param_names):
                if pname is None or pname in seen:
                    continue
                seen.add(pname)
                want = list(o.want[j])
                axes = []
                pshape = list(params[pname].shape)
                for a, pl in enumerate(want):
                    if pl.startswith("S("):
                        pshape[int(pl[2:-1])] //= shape[a]
                for a in range(len(shape)):
                    if not (o.grad_partial[j][a] and shape[a] > 1 and want[a] == "R"):
                        continue
                    d = next((d for d in range(len(pshape)) if pshape[d] % shape[a] == 0), None)
                    if d is None:
                        continue
                    pshape[d] //= shape[a]
                    want[a] = f"S({d})"
                    axes.append(a)
                if axes:
                    self.zero_axes[pname] = tuple(axes)
                    self.storage[pname] = tuple(want)

    def _recompute(self, fqn: str) -> None:
        """Non-reentrant activation checkpointing of module ``fqn`` (FQNs unchanged). The
        recomputation in backward runs outside the forward's function mode, so it enters a
        fresh one with the module's own operators queued: recomputed operators run exactly as
        in forward (local shards, planned re-layouts)."""
        module = self.model.get_submodule(fqn)
        if getattr(module, "_tensoropt_recompute", False):
            return
        orig = module.forward
        ops = [o for o in self.layout.ops if o.module == fqn or o.module.startswith(fqn + ".") or not fqn]

        def body(*args, **kwargs):
            if self.mode is not None:                        # forward
                self.ckpt_depth += 1
                try:
                    return orig(*args, **kwargs)
                finally:
                    self.ckpt_depth -= 1
            saved = (self.stack, self.pending, self.ckpt_depth)
            self.stack, self.pending, self.ckpt_depth = [fqn], {}, 1
            for o in ops:
                self.pending.setdefault(o.module, []).append(o)
            mode = _Mode(self)
            mode.__enter__()
            try:
                return orig(*args, **kwargs)
            finally:
                mode.__exit__(None, None, None)
                self.stack, self.pending, self.ckpt_depth = saved

        @functools.wraps(orig)
        def forward(*args, **kwargs):
            return checkpoint(body, *args, use_reentrant=False, **kwargs)

        module.forward = forward                  # type: ignore[method-assign]
        module._tensoropt_recompute = True        # type: ignore[attr-defined]

    def _push(self, fqn):
        def hook(_m, _a):
            self.stack.append(fqn)
        return hook

    def _pop(self, fqn):
        def hook(_m, _a, _o):
            if self.stack and self.stack[-1] == fqn:
                self.stack.pop()
        return hook

    def _root_pre(self, _m, args, kwargs):
        self.pending = {}
        self.stack = []
        for o in self.layout.ops:
            self.pending.setdefault(o.module, []).append(o)
        rep = [Replicate()] * self.mesh.ndim

        def conv(t):
            if isinstance(t, torch.Tensor) and not isinstance(t, DTensor):
                return DTensor.from_local(t, self.mesh, rep, run_check=False)
            return t
        args = tuple(conv(a) for a in args)
        kwargs = {k: conv(v) for k, v in kwargs.items()}
        self.mode = _Mode(self)
        self.mode.__enter__()
        return args, kwargs

    def _root_post(self, _m, _args, out):
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.mode = None
        left = [o.name for q in self.pending.values() for o in q]
        if left:
            raise PlanNotApplicable(f"the plan's operators {left[:5]} were not seen during forward "
                                    "(the model ran different code than it was captured with)")
        if isinstance(out, DTensor):
            out = out.redistribute(self.mesh, [Replicate()] * self.mesh.ndim).to_local()
        return out

    # -- execution
    def match(self, func) -> OpLayout | None:
        if self.root is not self.model and getattr(self.root, "_prefix", False):
            return None                     # a later pipeline stage evaluating the dropped prefix
        fqn = self.stack[-1] if self.stack else ""
        queue = self.pending.get(fqn)
        if not queue:
            return None
        if _func_name(func) in queue[0].func_names:
            return queue.pop(0)
        return None

    def run(self, op: OpLayout, func, args, kwargs):
        flat, spec = tree_flatten((args, kwargs))
        idx = [k for k, a in enumerate(flat) if isinstance(a, torch.Tensor)]
        if len(idx) != len(op.terms):
            raise PlanNotApplicable(f"operator {op.name}: captured with {len(op.terms)} tensor operands "
                                    f"({op.terms}), called with {len(idx)}")
        mesh = self.mesh
        gathered: list[tuple[int, torch.Tensor, list[Placement]]] = []
        for j, k in enumerate(idx):
            src = flat[k]
            x = self._as_dtensor(src)
            zero_param = self.params_by_id.get(id(src)) if self.zero else None
            if x.requires_grad:
                x = _ContiguousGrad.apply(x)        # redistribute's backward may slice non-contiguously
            want = [_to_placement(p) for p in op.want[j]]
            x = x.redistribute(mesh, want)
            gpl = [Partial() if op.grad_partial[j][a] else _to_placement(op.want[j][a]) for a in range(mesh.ndim)]
            local = x.to_local(grad_placements=gpl) if x.requires_grad else x.to_local()
            if op.param_names[j] is None and local.untyped_storage().nbytes() > local.numel() * local.element_size():
                # a slice of a larger buffer (gloo's all-to-all is an all-gather and a chunk):
                # keep only the slice, which is what autograd may save
                local = local.clone()
            if zero_param is not None and self.zero >= 3 and self.ckpt_depth == 0:
                gathered.append((local.untyped_storage().data_ptr(), src, want))
            flat[k] = self._fix_operand(op, j, _ContiguousGrad.apply(local) if local.requires_grad else local)
        a2, k2 = tree_unflatten(flat, spec)
        with _regather_saved(gathered, mesh):
            if op.base == "embedding" and any(s is not None and s in op.contracted for s in op.config.splits):
                out = self._vocab_split_embedding(op, func, a2, k2)
            elif op.batch_axes:
                axes = [a for a in op.batch_axes if self.mesh.shape[a] > 1]
                out = sync_batch_norm(func, a2, k2, [self.mesh.get_group(a) for a in axes],
                                      math.prod(self.mesh.shape[a] for a in axes))
            else:
                out = func(*a2, **k2)
        out = self._fix_output(op, out, k2)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out = _ContiguousGrad.apply(out)
        return DTensor.from_local(out, mesh, [_to_placement(p) for p in op.out], run_check=False)

    def _as_dtensor(self, t: torch.Tensor) -> DTensor:
        if isinstance(t, DTensor):
            return t
        return DTensor.from_local(t, self.mesh, [Replicate()] * self.mesh.ndim, run_check=False)

    def _fix_operand(self, op: OpLayout, j: int, local: torch.Tensor) -> torch.Tensor:
        # Bias of a contraction split over some axis: added on coordinate 0 of that axis only.
        if op.family in ("linear", "conv", "matmul") and j > 0 and op.param_names[j] is not None:
            for a, s in enumerate(op.config.splits):
                if s is not None and s in op.contracted and s not in op.terms[j] and self.coord[a] != 0:
                    return local * 0
        return local

    def _vocab_split_embedding(self, op: OpLayout, func, args, kwargs):
        """Rows of the table live on one rank each: look up the local rows, zero the rest
        (partial sums over the vocabulary axis)."""
        idx, weight = args[0], args[1]
        a = next(a for a, s in enumerate(op.config.splits) if s is not None and s in op.contracted)
        rows = weight.shape[0]
        lo = self.coord[a] * rows
        foreign = (idx < lo) | (idx >= lo + rows)
        out = func((idx - lo).masked_fill(foreign, 0), weight, *args[2:], **kwargs)
        return out.masked_fill(foreign.unsqueeze(-1), 0.0)

    def _fix_output(self, op: OpLayout, out, kwargs):
        if op.base in ("cross_entropy_loss", "mse_loss", "nll_loss", "l1_loss") or op.base in _MEAN_REDUCTIONS:
            reduction = kwargs.get("reduction", "mean") if isinstance(kwargs, dict) else "mean"
            if op.base in _MEAN_REDUCTIONS or reduction == "mean":
                n = math.prod(self.mesh.shape[a] for a, s in enumerate(op.config.splits)
                              if s is not None and s in op.contracted)
                if n > 1:
                    out = out / n
        return out


def _regather_saved(gathered, mesh: DeviceMesh):
    """ZeRO-3: tensors autograd saves that live in a gathered parameter's storage are saved as
    a reference to the sharded parameter and gathered again when backward needs them."""
    if not gathered:
        return contextlib.nullcontext()
    ptrs = {ptr: (param, want) for ptr, param, want in gathered}

    def pack(t: torch.Tensor):
        if isinstance(t, DTensor) or t.device.type == "meta":
            return t
        hit = ptrs.get(t.untyped_storage().data_ptr())
        if hit is None:
            return t
        return _Regather(hit[0], hit[1], tuple(t.shape), tuple(t.stride()), t.storage_offset())

    def unpack(obj):
        if not isinstance(obj, _Regather):
            return obj
        with torch.no_grad():
            full = obj.param.detach().redistribute(mesh, obj.want).to_local()
        return full.as_strided(obj.shape, obj.stride, obj.offset)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


@dataclass
class _Regather:
    param: Any
    want: list
    shape: tuple
    stride: tuple
    offset: int


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous (DTensor views of the gradient
    between operators need it)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g.contiguous()


def _reduce_partial_grad(p: torch.Tensor) -> None:
    g = p.grad
    if isinstance(g, DTensor) and isinstance(p, DTensor) and g.placements != p.placements:
        p.grad = g.redistribute(p.device_mesh, p.placements)
