"""Run a pipeline :class:`~tensoropt.plan.Plan` with ``torch.distributed.pipelining``.

A pipeline plan's mesh axis 0 is the pipeline axis (``p`` stages); the other axes form each
stage's sub-mesh. ``tensoropt.pipeline`` cuts ``model.layers`` into ``p`` equal runs of
blocks; the first stage also holds what comes before the blocks, the last what comes after
(the loss). ``plan.stages`` holds one plan per distinct stage (first, one middle standing for
all middle stages, last), each on the sub-mesh and per micro-batch.

Each rank builds only its own stage (:class:`PipelineRunner`):

* the stage module runs the model's own ``forward`` on the micro-batch with the blocks of
  other stages replaced by parameter-free stand-ins (their parameters are dropped): the
  first stage stops after its last block (the block's output is the stage output), later
  stages compute the prefix without autograd and replace the input of their first block
  by the activation received from the previous stage; the last stage returns the loss;
* inside the stage the stage plan is laid out exactly like a non-pipeline plan (DTensor on
  the sub-mesh, operator by operator; data parallel, tensor parallel, recomputation), with
  the stage module as the root: inputs and the output cross stages as full (replicated)
  tensors, every rank of a sub-mesh exchanging with the rank at the same sub-mesh
  coordinate of the neighbouring stage;
* ``PipelineStage`` + ``Schedule1F1B`` with ``plan.microbatches`` micro-batches (static
  shapes from the captured micro-batch graph); gradients are scaled by ``1/m`` (mean
  losses), so they equal the full-batch gradients;
* a parameter used by two stages (tied embeddings: first stage's embedding, last stage's
  head) has its gradient summed over those stages after the schedule.

Parameters of the prefix modules that later stages only evaluate to discard (e.g. a
position embedding) stay on those ranks without gradients or optimizer state.

Tested (tests/test_apply_beyond.py) with 2 stages (pp2·rep1, pp2·rep2, pp2·tp2 with 2 to 8
micro-batches, with and without recomputation); plans with middle stages (p > 2, the middle
stage plan re-targeted to each middle stage's blocks) are laid out the same way but no
frontier of the test models has them. ZeRO inside stages is not searched by the planner.
Peak memory of a stage: ``peak_memory(..., modules=False)`` (the first stage ends its forward
by an exception, which MemTracker's module hooks do not survive).
"""

from __future__ import annotations

import collections
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate

from ..plan import Plan
from ._plan import PlanNotApplicable, _Runner, capture_for_plan, plan_layout

__all__ = ["PipelineRunner", "pipeline"]


class _StageExit(Exception):
    def __init__(self, value):
        super().__init__("stage output")
        self.value = value


class _Skip(nn.Module):
    """Stand-in for a block of another stage (identity, no parameters)."""

    def forward(self, x, *args, **kwargs):
        return x


class _StageModule(nn.Module):
    """One pipeline stage of ``model`` (not registered as a child: FQNs stay the model's)."""

    def __init__(self, model: nn.Module, index: int, n: int, lo: int, hi: int, params: list[nn.Parameter]):
        super().__init__()
        object.__setattr__(self, "model", model)
        self.index, self.n, self.lo, self.hi = index, n, lo, hi
        object.__setattr__(self, "_params", params)
        self.inputs: collections.deque = collections.deque()     # micro-batch inputs (stages > 0)
        self._act = None
        self._prefix = False          # later stages: evaluating the discarded prefix
        layers = model.layers
        if index < n - 1:
            layers[hi - 1].register_forward_hook(self._exit)
        if index > 0:
            layers[lo].register_forward_pre_hook(self._enter)

    def parameters(self, recurse: bool = True):           # what PipelineStage scales
        return iter(self._params)

    def _exit(self, _m, _args, out):
        raise _StageExit(out)

    def _enter(self, _m, args):
        torch._C._set_grad_enabled(True)
        self._prefix = False
        act = self._act
        self._act = None
        return (act, *args[1:])

    def forward(self, *args):
        if self.index == 0:
            inputs, act = args, None
        else:
            inputs, act = self.inputs.popleft(), args[0]
            mesh = self._mesh                 # the prefix runs on replicated DTensors, like stage 0's
            inputs = tuple(DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim, run_check=False)
                           if isinstance(t, torch.Tensor) and not isinstance(t, DTensor) else t for t in inputs)
        try:
            if act is None:
                return self.model(*inputs)
            self._act = act
            self._prefix = True
            with torch.no_grad():                 # the prefix is recomputed here only to be dropped
                return self.model(*inputs)
        except _StageExit as e:
            return e.value
        finally:
            self._prefix = False


class PipelineRunner:
    """A pipeline plan laid out on this rank: ``step(*inputs)`` runs one 1F1B iteration over
    the global batch (every rank passes the same full batch; each stage takes what it needs)
    and returns the global (mean) loss on every rank, with this stage's parameter gradients
    accumulated (``.grad``). Use ``parameters()`` for the optimizer (this stage's parameters
    only), ``full_grads()`` / ``full_params()`` (collective) to compare with single-process
    training. ``model`` is this rank's (partial) model; ``stage_index`` its stage."""

    def __init__(self, model: nn.Module, plan: Plan, mesh: DeviceMesh, stage_index: int, stage_module,
                 schedule, stage_params: dict[str, nn.Parameter], tied: dict[str, Any], pp_group) -> None:
        self.model, self.plan, self.mesh = model, plan, mesh
        self.stage_index = stage_index
        self.n_stages = plan.mesh_shape[0]
        self.microbatches = plan.microbatches
        self.stage_module = stage_module
        self.schedule = schedule
        self._params = stage_params
        self._tied = tied
        self._pp_group = pp_group

    def parameters(self):
        return list(self._params.values())

    def named_parameters(self):
        return list(self._params.items())

    def _split(self, inputs):
        batch = next(t.shape[0] for t in inputs if isinstance(t, torch.Tensor) and t.dim() > 0)
        m = self.microbatches
        if batch % m:
            raise ValueError(f"batch of {batch} does not split into {m} micro-batches")
        chunks = [t.chunk(m, dim=0) if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == batch
                  else (t,) * m for t in inputs]
        return [tuple(c[k] for c in chunks) for k in range(m)]

    def step(self, *inputs) -> torch.Tensor:
        mbs = self._split(inputs)
        losses: list[torch.Tensor] = []
        if self.stage_index == 0:
            self.schedule.step(*inputs)
        else:
            self.stage_module.inputs.extend(mbs)
            if self.stage_index == self.n_stages - 1:
                # the loss is computed inside the last stage; the schedule's target is a dummy
                self.schedule.step(target=torch.zeros(self.microbatches), losses=losses, return_outputs=False)
            else:
                self.schedule.step()
            self.stage_module.inputs.clear()
        self._sum_tied_grads()
        t = torch.zeros(())
        if self.stage_index == self.n_stages - 1:
            t = torch.stack([x.detach().reshape(()) for x in losses]).mean()
        dist.all_reduce(t, group=self._pp_group)          # only the last stage contributes
        return t

    def _sum_tied_grads(self) -> None:
        for name, group in self._tied.items():
            p = self._params[name]
            g = p.grad
            if g is None:
                g = torch.zeros_like(p)
            full = g.full_tensor() if isinstance(g, DTensor) else g.clone()
            dist.all_reduce(full, group=group)
            if isinstance(p, DTensor):
                sub = p.device_mesh
                full = DTensor.from_local(full, sub, [Replicate()] * sub.ndim, run_check=False) \
                    .redistribute(sub, p.placements)
            p.grad = full

    def zero_grad(self) -> None:
        for p in self._params.values():
            p.grad = None

    def _gather(self, tensors: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
        """Full tensors of every model parameter, on every rank (collective over the world)."""
        rank = dist.get_rank()
        sub_rank0 = all(c == 0 for c in list(self.mesh.get_coordinate())[1:])
        local = {}
        for n, t in tensors.items():
            full = None if t is None else (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
            local[n] = full
        objs: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(objs, (rank, sub_rank0, local))
        out: dict[str, torch.Tensor | None] = {}
        for _r, first, d in objs:
            if not first:
                continue
            for n, t in d.items():
                if t is not None:
                    out.setdefault(n, t)
        return out

    def full_grads(self) -> dict[str, torch.Tensor | None]:
        return self._gather({n: p.grad for n, p in self._params.items()})

    def full_params(self) -> dict[str, torch.Tensor | None]:
        return self._gather(dict(self._params))


def _stage_ranges(plan: Plan, graph, model: nn.Module) -> tuple[int, int]:
    blocks = graph.blocks
    layers = getattr(model, "layers", None)
    if not isinstance(layers, (nn.ModuleList, nn.Sequential)) or len(layers) != len(blocks):
        raise PlanNotApplicable(f"pipeline plan {plan.summary}: the model's blocks must be model.layers "
                                f"({len(blocks)} captured blocks)")
    for i, b in enumerate(blocks):
        mods = {graph.operators[j].module for j in b}
        if not all(m == f"layers.{i}" or m.startswith(f"layers.{i}.") for m in mods):
            raise PlanNotApplicable(f"pipeline plan {plan.summary}: captured block {i} is not model.layers[{i}]")
    return len(blocks), len(blocks) // plan.mesh_shape[0]


def pipeline(model: nn.Module, plan: Plan, mesh: DeviceMesh | None = None, inputs: tuple | None = None,
             graph=None) -> PipelineRunner:
    """Lay a pipeline plan out on this rank (collective over every rank of the launch) and
    return its :class:`PipelineRunner`. ``inputs``: example inputs at the plan's global batch
    (any device; only shapes are used) -- needed unless ``plan.model`` is a zoo model. The
    micro-batch graph is captured here (``graph`` is accepted for symmetry and unused)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from ..pipeline import split_stages, sub_graph
    from ._validate import current_world_size, ensure_process_group

    p, m = plan.mesh_shape[0], plan.microbatches
    if not plan.stages:
        raise ValueError(f"plan {plan.summary} has no pipeline stages: use tensoropt.parallelize")
    batch = (plan.training or {}).get("batch_size")
    if not batch or batch % m:
        raise ValueError(f"pipeline plan {plan.summary}: batch {batch} does not split into {m} micro-batches")
    if inputs is not None:
        mb_inputs = tuple(t.chunk(m, dim=0)[0].to("meta") if isinstance(t, torch.Tensor) and t.dim() > 0
                          and t.shape[0] == batch else t for t in inputs)
    else:
        mb_inputs = None
    mb_graph = capture_for_plan(_with_batch(plan, batch // m), model, mb_inputs)
    n_blocks, per = _stage_ranges(plan, mb_graph, model)
    specs = split_stages(mb_graph, p)                 # first, (one middle), last
    ws = current_world_size()
    if ws != plan.world_size:
        raise ValueError(f"world size {ws} does not match the plan's mesh {plan.mesh} "
                         f"({plan.world_size} devices); launch with --nproc-per-node {plan.world_size}")
    # Layout checks for every distinct stage before any collective.
    layouts = []
    for spec, sp in zip(specs, plan.stages):
        g, _ = sub_graph(mb_graph, spec.ops)
        lay = plan_layout(sp, model, g)
        lay.mode = "dtensor"
        layouts.append((spec, g, lay))
    device_type = ensure_process_group()
    names = plan.mesh_axis_names
    if mesh is None:
        mesh = init_device_mesh(device_type, tuple(plan.mesh_shape), mesh_dim_names=names)
    coord = mesh.get_coordinate()
    s = coord[0]
    sub = mesh[names[1:]] if len(names) > 2 else mesh[names[1]]
    pp_group = mesh[names[0]].get_group()
    which = 0 if s == 0 else (len(specs) - 1 if s == p - 1 else 1)
    spec, g, lay = layouts[which]
    lo, hi = s * per, (s + 1) * per
    # A middle stage's plan is planned for stage 1; its operators are named after stage 1's
    # blocks: rename them to this stage's blocks.
    if 0 < s < p - 1 and s != 1:
        lay = _shift_blocks(lay, s - 1)

    # Drop the blocks of other stages; remember parameters used by this stage's operators.
    for i in range(n_blocks):
        if not lo <= i < hi:
            model.layers[i] = _Skip()
    used = {n for o in lay.ops for n in o.param_names if n is not None}
    root = _StageModule(model, s, p, lo, hi, [])
    root._mesh = sub
    _Runner(model, lay, sub, root=root).install()
    params = dict(model.named_parameters(remove_duplicate=True))
    aliases = {}
    for n, prm in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(prm), []).append(n)
    stage_params = {}
    for n, prm in params.items():
        if any(a in used for a in aliases[id(prm)]):
            stage_params[n] = prm
        else:
            prm.requires_grad_(False)
    root._params[:] = list(stage_params.values())

    # Parameters used by several stages (tied): sum their gradients over those stages.
    tied: dict[str, Any] = {}
    users = _param_stages(mb_graph, p, per, model)
    groups: dict[tuple[int, ...], Any] = {}
    for name, stages_of in sorted(users.items()):
        if len(stages_of) < 2:
            continue
        key = tuple(sorted(stages_of))
        if key not in groups:
            # one group per sub-mesh coordinate: the ranks of these stages at that coordinate
            mine = None
            full = mesh.mesh.reshape(p, -1)
            for c in range(full.shape[1]):
                ranks = [int(full[st, c]) for st in key]
                grp = dist.new_group(ranks)
                if dist.get_rank() in ranks:
                    mine = grp
            groups[key] = mine
        if s in key:
            own = next((n for n in stage_params if n == name or name in aliases[id(stage_params[n])]), None)
            if own is not None:
                tied[own] = groups[key]

    # Static shapes: micro-batch inputs (first stage), the boundary activations, the loss.
    bounds = [mb_graph.operators[max(mb_graph.blocks[(k + 1) * per - 1])].output for k in range(p - 1)]
    if s == 0:
        in_args = tuple(torch.empty(t.shape, dtype=t.dtype) if isinstance(t, torch.Tensor) else t
                        for t in mb_inputs) if mb_inputs is not None else _example_inputs(plan, model, batch // m)
    else:
        b = bounds[s - 1]
        in_args = (torch.empty(b.shape, dtype=getattr(torch, b.dtype), requires_grad=True),)
    if s < p - 1:
        b = bounds[s]
        out_args = (torch.empty(b.shape, dtype=getattr(torch, b.dtype), requires_grad=True),)
    else:
        out_args = (torch.empty((), requires_grad=True),)
    stage = PipelineStage(root, s, p, torch.device(device_type if device_type != "cuda" else
                                                   f"cuda:{torch.cuda.current_device()}"),
                          input_args=in_args, output_args=out_args, group=pp_group)
    schedule = Schedule1F1B(stage, m, loss_fn=_loss_is_output, scale_grads=True)
    runner = PipelineRunner(model, plan, mesh, s, root, schedule, stage_params, tied, pp_group)
    model._tensoropt_pipeline = runner        # type: ignore[attr-defined]
    return runner


def _loss_is_output(out, _target):
    return out


def _with_batch(plan: Plan, b: int) -> Plan:
    import dataclasses
    return dataclasses.replace(plan, training={**(plan.training or {}), "batch_size": b})


def _example_inputs(plan: Plan, model: nn.Module, b: int) -> tuple:
    import dataclasses

    from ..models import example_inputs
    cfg = getattr(model, "config", None)
    overrides = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else {}
    try:
        return tuple(example_inputs(plan.model, b, device="cpu", **overrides))
    except (TypeError, ValueError):
        return tuple(example_inputs(plan.model, b, device="cpu"))


def _shift_blocks(lay, shift: int):
    """The middle-stage layout for stage 1 + shift: block indices in module names moved."""
    import copy
    import re
    lay = copy.copy(lay)

    def mv(name: str | None) -> str | None:
        if name is None:
            return None
        return re.sub(r"^layers\.(\d+)", lambda mm: f"layers.{int(mm.group(1)) + shift}", name)
    new_ops = []
    for o in lay.ops:
        o2 = copy.copy(o)
        o2.module = mv(o.module)
        o2.param_names = tuple(mv(n) for n in o.param_names)
        new_ops.append(o2)
    lay.ops = new_ops
    lay.param_placements = {mv(k): v for k, v in lay.param_placements.items()}
    return lay


def _param_stages(mb_graph, p: int, per: int, model: nn.Module) -> dict[str, set[int]]:
    """Stage indices that use each parameter (by its first name)."""
    first = {}
    for n, prm in model.named_parameters(remove_duplicate=False):
        first.setdefault(id(prm), n)
    by_name = {n: first[id(prm)] for n, prm in model.named_parameters(remove_duplicate=False)}
    out: dict[str, set[int]] = {}
    blocks = mb_graph.blocks
    pre_end, post_start = min(blocks[0]), max(blocks[-1]) + 1
    for i, op in enumerate(mb_graph.operators):
        if i < pre_end:
            st = 0
        elif i >= post_start:
            st = p - 1
        else:
            st = next(k for k, b in enumerate(blocks) if i in b) // per
        for n in op.param_names:
            if n is not None:
                out.setdefault(by_name.get(n, n), set()).add(st)
    return out
