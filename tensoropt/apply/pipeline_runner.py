"""Run a pipeline :class:`~tensoropt.plan.Plan` with ``torch.distributed.pipelining``.

A pipeline plan's mesh axis 0 is the pipeline axis (``p`` stages); the other axes form each
stage's sub-mesh. The plan cuts the repeated blocks (``OpGraph.block_modules``: any module
path) into ``p`` runs (``pipeline.stage_operators``, the rule the search prices: equal
runs, or one block more in the later stages); the first stage also holds what comes before
the blocks, the last what comes after (the loss). ``plan.stages`` holds one plan per
distinct stage (first, one middle standing for all middle stages, last), each on the
sub-mesh and per micro-batch.

Each rank runs its stage of the model's captured program, captured at the micro-batch size
(``runner.ProgramRunner``, the same execution as a non-pipeline plan, on the stage's
sub-mesh):

* a stage runs its own operators and computes locally whatever else they read that no
  operator produced: constants, views, and inputs derived from the batch (masks, position
  ids), from the micro-batch it is handed (every rank gets the whole batch);
* operator outputs of earlier stages that a stage reads cross the boundary: stage ``s``
  sends everything later stages read from stages up to ``s`` (a value read two stages on,
  such as an encoder output, is passed along), every rank of a sub-mesh sending its share
  (the value split on its first dim the sub-mesh divides; ``crossing_placements``) to the
  rank at the same sub-mesh coordinate of the neighbouring stage, which uses it as a sharded
  DTensor;
* ``PipelineStage`` + ``Schedule1F1B`` with ``plan.microbatches`` micro-batches; gradients
  are scaled by ``1/m`` (mean losses), so they equal the full-batch gradients;
* a parameter used by two stages (tied embeddings) has its gradient summed over them after
  the schedule; parameters no operator of this stage uses are freed on this rank.

Peak memory of a stage: ``peak_memory(..., modules=False)``.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..capture.inputs import bind_call, forward_signature, loss_of
from ..pipeline import stage_blocks, stage_operators, sub_graph
from ..plan import Plan
from .layout import PlanNotApplicable, capture_for_plan, plan_layout, split_batch
from .meshes import device_mesh
from .process_group import current_world_size, ensure_process_group
from .runner import ProgramRunner, is_skipped

__all__ = ["PipelineRunner", "pipeline"]


class _Stage(nn.Module):
    """One stage for ``PipelineStage``: takes the values crossing into it, returns those
    crossing out (the loss on the last stage). Micro-batch inputs come from ``inputs``."""

    def __init__(self, runner: ProgramRunner, received: list[str], sent: list[str], loss: str | None,
                 params: list[nn.Parameter], shapes: list[tuple]):
        super().__init__()
        object.__setattr__(self, "runner", runner)
        self.received, self.sent, self.loss, self.shapes = received, sent, loss, shapes
        object.__setattr__(self, "_params", params)
        self.inputs: collections.deque = collections.deque()

    def parameters(self, recurse: bool = True):           # what PipelineStage scales
        return iter(self._params)

    def forward(self, *args):
        runner = self.runner
        mesh = runner.mesh
        env = runner.placeholders(self.inputs.popleft())
        for name, x, shape in zip(self.received, args, self.shapes):
            env[name] = DTensor.from_local(x, mesh, crossing_placements(shape, mesh), run_check=False)
        runner.run(runner.steps, env)
        if self.loss is not None:
            v = env[self.loss]
            return v.full_tensor() if isinstance(v, DTensor) else v
        out = []
        for name in self.sent:
            v = env[name]
            v = v if isinstance(v, DTensor) else DTensor.from_local(v, mesh, [Replicate()] * mesh.ndim, run_check=False)
            # each device sends its share (contiguous: a permuted view, as ConvNeXt leaves it)
            out.append(v.redistribute(mesh, crossing_placements(v.shape, mesh)).to_local().contiguous())
        return tuple(out)


def crossing_placements(shape, mesh: DeviceMesh) -> list:
    """How a value of (global) ``shape`` crosses a stage boundary on a stage's sub-mesh: split
    on the first dim that the sub-mesh's devices divide (each sends its share, as the cost
    model prices), else whole."""
    n = mesh.size()
    for d, size in enumerate(shape):
        if size % n == 0:
            return [Shard(d)] * mesh.ndim
    return [Replicate()] * mesh.ndim


class PipelineRunner:
    """A pipeline plan laid out on this rank: ``step(...)`` runs one 1F1B iteration over the
    global batch (every rank passes the same whole batch, positional or keyword as planned;
    each stage takes what it needs) and returns the global (mean) loss on every rank, with
    this stage's parameter gradients accumulated (``.grad``). ``parameters()`` for the
    optimizer (this stage's only), ``full_grads()`` / ``full_params()`` (collective) to
    compare with single-process training. Calling it like the model is an error: forward
    and backward run together."""

    def __init__(self, model: nn.Module, plan: Plan, mesh: DeviceMesh, stage_index: int, stage_module: _Stage,
                 schedule, stage_params: dict[str, nn.Parameter], tied: dict[str, Any], pp_group,
                 call: tuple, batch: int) -> None:
        self.model, self.plan, self.mesh = model, plan, mesh
        self.stage_index = stage_index
        self.n_stages = plan.mesh_shape[0]
        self.microbatches = plan.microbatches
        self.stage_module = stage_module
        self.schedule = schedule
        self._params = stage_params
        self._tied = tied
        self._pp_group = pp_group
        self._call = call
        self._batch = batch
        self.signature = forward_signature(model)

    def __call__(self, *args, **kwargs):
        raise TypeError("a pipeline plan runs forward and backward together over its micro-batches: "
                        "use loss = runner.step(...) (or tensoropt.train_step(runner, ...)), then the optimizer")

    def parameters(self):
        return list(self._params.values())

    def named_parameters(self):
        return list(self._params.items())

    def _micro_batches(self, args, kwargs) -> list[list]:
        args, kwargs = bind_call(self.signature, self._call, (args, kwargs))
        m, batch = self.microbatches, self._batch
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] != batch and t.shape[0] == batch // m:
                raise ValueError(f"pass the whole batch of {batch} to step(), not one micro-batch")
        return [tree_flatten(part)[0] for part in split_batch((args, kwargs), batch, m)]

    def step(self, *args, **kwargs) -> torch.Tensor:
        self.stage_module.inputs.extend(self._micro_batches(args, kwargs))
        losses: list[torch.Tensor] = []
        try:
            if self.stage_index == 0:
                self.schedule.step(torch.zeros(self.microbatches, 1))
            elif self.stage_index == self.n_stages - 1:
                # the loss is computed inside the last stage; the schedule's target is a dummy
                self.schedule.step(target=torch.zeros(self.microbatches), losses=losses, return_outputs=False)
            else:
                self.schedule.step()
        finally:
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
            local[n] = None if t is None else (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
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


# ---------------------------------------------------------------------------------- stages


def _crossings(program, graph, stage_ops: list[tuple[int, ...]], loss: str) -> tuple[list[set[str]], list[list[str]]]:
    """Per stage: the program nodes it runs, and the operator outputs it receives (graph order)."""
    order = {n.name: k for k, n in enumerate(program.graph.nodes)}
    by_name = {n.name: n for n in program.graph.nodes}
    owner: dict[str, int] = {}
    members: dict[str, int] = {}
    for s, ops in enumerate(stage_ops):
        for i in ops:
            op = graph.operators[i]
            for m in op.nodes:
                members[m.split("[")[0]] = s
            owner[op.nodes[-1].split("[")[0]] = s
            for m in op.nodes:
                base = m.split("[")[0]
                if any(u.name not in {x.split("[")[0] for x in op.nodes} for u in by_name[base].users):
                    owner[base] = s
    # Nodes that depend on no parameter (constants, masks and position ids derived from the
    # batch) run on every stage: what they compute can also reach later nodes through in-place
    # writes (a shifted copy of the labels filled slice by slice), which data flow misses.
    free: set[str] = set()
    for n in program.graph.nodes:
        if n.op == "call_function" and n.name not in members and all(
                a.name in free or (a.op == "placeholder" and program.input_kinds.get(a.name) != "param")
                for a in n.all_input_nodes):
            free.add(n.name)
    p = len(stage_ops)
    runs: list[set[str]] = []
    needs: list[set[str]] = []
    for s in range(p):
        run = {name for name, st in members.items() if st == s} | free
        todo = [a.name for m in list(run) for a in by_name[m].all_input_nodes if a.name not in run]
        if s == p - 1:
            todo.append(loss)
        need: set[str] = set()
        while todo:
            name = todo.pop()
            if name in run or name in need:
                continue
            node = by_name[name]
            if name in owner and owner[name] != s:
                if owner[name] > s:
                    raise PlanNotApplicable(f"stage {s} reads {name}, which a later stage produces")
                need.add(name)
            elif node.op == "placeholder":
                continue
            else:
                run.add(name)
                todo.extend(a.name for a in node.all_input_nodes)
        runs.append(run)
        needs.append(need)
    received: list[list[str]] = [[] for _ in range(p)]
    carry: set[str] = set()
    for s in range(p - 1, 0, -1):
        carry = {x for x in carry if owner[x] < s} | needs[s]
        received[s] = sorted(carry, key=order.__getitem__)
    return runs, received


def _example(node: fx.Node, mesh: DeviceMesh) -> torch.Tensor:
    """One device's share of a crossing value (see :func:`crossing_placements`)."""
    v = node.meta["val"]
    shape = list(v.shape)
    pl = crossing_placements(shape, mesh)[0]
    if isinstance(pl, Shard):
        shape[pl.dim] //= mesh.size()
    t = torch.empty(tuple(shape), dtype=v.dtype)
    return t.requires_grad_(v.dtype.is_floating_point or v.dtype.is_complex)


def pipeline(model: nn.Module, plan: Plan, mesh: DeviceMesh | None = None, inputs: Any = None) -> PipelineRunner:
    """Lay a pipeline plan out on this rank (collective over every rank of the launch) and
    return its :class:`PipelineRunner`. ``inputs``: example inputs at the plan's global batch
    (only shapes are used), for a plan that stores none."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    p, m = plan.mesh_shape[0], plan.microbatches
    if not plan.stages:
        raise ValueError(f"plan {plan.summary} has no pipeline stages: use tensoropt.parallelize")
    batch = (plan.training or {}).get("batch_size")
    if not batch or batch % m:
        raise ValueError(f"pipeline plan {plan.summary}: batch {batch} does not split into {m} micro-batches")
    graph, program, call = capture_for_plan(plan, model, inputs, batch=batch // m)
    if stage_blocks(len(graph.blocks), p) is None:
        raise PlanNotApplicable(f"pipeline plan {plan.summary}: the model's {len(graph.blocks)} repeated "
                                f"blocks do not split into {p} stages")
    ws = current_world_size()
    if ws != plan.world_size:
        raise ValueError(f"world size {ws} does not match the plan's mesh {plan.mesh} "
                         f"({plan.world_size} devices); launch with --nproc-per-node {plan.world_size}")
    stage_ops = stage_operators(graph, p)
    out = next(n for n in program.graph.nodes if n.op == "output")
    flat = list(out.args[0]) if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
    loss_node = loss_of(tree_unflatten([flat[i] for i in program.user_outputs], program.out_spec))
    runs, received = _crossings(program, graph, stage_ops, loss_node.name)
    # Layout checks for every stage before any collective: the middle stage plan (made for
    # stage 1) applies to every middle stage by position.
    plans = [plan.stages[0]] + [plan.stages[1] if len(plan.stages) > 2 else None] * (p - 2) + [plan.stages[-1]]
    layouts = []
    for s in range(p):
        g, _ = sub_graph(graph, stage_ops[s])
        sp = plans[s]
        if len(sp.ops) != len(g.operators):
            raise ValueError(f"corrupt pipeline plan: stage {s} has {len(g.operators)} operators, "
                             f"its plan {len(sp.ops)}")
        sp = dataclasses.replace(sp, ops=tuple(dataclasses.replace(o, name=op.name)
                                               for o, op in zip(sp.ops, g.operators)), param_signature="")
        lay = plan_layout(sp, model, captured=(g, program, call))
        lay.mode = "dtensor"
        layouts.append(lay)
    device_type = ensure_process_group()
    names = plan.mesh_axis_names
    if mesh is None:
        mesh = device_mesh(device_type, tuple(plan.mesh_shape), names)
    s = mesh.get_coordinate()[0]
    sub = mesh[names[1:]] if len(names) > 2 else mesh[names[1]]
    pp_group = mesh[names[0]].get_group()
    lay = layouts[s]
    sent = received[s + 1] if s < p - 1 else []
    nodes = [n for n in program.graph.nodes if n.name in runs[s] and not is_skipped(n)]
    runner = ProgramRunner(model, lay, program, sub, nodes=nodes, keep=set(sent) | {loss_node.name})
    used = {n for o in lay.ops for n in o.param_names if n is not None}
    stage_params = runner.install_parameters(used)
    kept = {id(prm) for prm in stage_params.values()}
    for prm in model.parameters():
        if id(prm) not in kept:                # another stage's: free it here
            prm.requires_grad_(False)
            prm.data = torch.empty(0, dtype=prm.dtype, device=prm.device)

    # Parameters used by several stages (tied): sum their gradients over those stages.
    tied: dict[str, Any] = {}
    users: dict[str, set[int]] = {}
    for st, ops in enumerate(stage_ops):
        for i in ops:
            for n in graph.operators[i].param_names:
                if n is not None:
                    users.setdefault(n, set()).add(st)
    groups: dict[tuple[int, ...], Any] = {}
    full = mesh.mesh.reshape(p, -1)
    for name, stages_of in sorted(users.items()):
        if len(stages_of) < 2:
            continue
        key = tuple(sorted(stages_of))
        if key not in groups:
            mine = None
            for c in range(full.shape[1]):      # one group per sub-mesh coordinate
                ranks = [int(full[st, c]) for st in key]
                grp = dist.new_group(ranks)
                if dist.get_rank() in ranks:
                    mine = grp
            groups[key] = mine
        if s in key and name in stage_params:
            tied[name] = groups[key]

    by_name = {n.name: n for n in program.graph.nodes}
    root = _Stage(runner, received[s], sent, loss_node.name if s == p - 1 else None, list(stage_params.values()),
                  [tuple(by_name[n].meta["val"].shape) for n in received[s]])
    in_args = tuple(_example(by_name[n], sub) for n in received[s]) if s > 0 else (torch.zeros(1, 1),)
    out_args = tuple(_example(by_name[n], sub) for n in sent) if s < p - 1 else (torch.empty((), requires_grad=True),)
    dev = torch.device(device_type if device_type != "cuda" else f"cuda:{torch.cuda.current_device()}")
    stage = PipelineStage(root, s, p, dev, input_args=in_args, output_args=out_args, group=pp_group)
    schedule = Schedule1F1B(stage, m, loss_fn=_loss_is_output, scale_grads=True)
    return PipelineRunner(model, plan, mesh, s, root, schedule, stage_params, tied, pp_group, call, batch)


def _loss_is_output(out, _target):
    return out

