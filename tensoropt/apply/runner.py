"""Run a model's captured program with a plan's layouts, operator by operator, on DTensor.

The plan was made for the operators capture found in the exported program
(``capture.Program``); this runs that same program (exported again from the same model and
input shapes, so node names agree), not the model's eager code. Whatever the eager code does
-- keyword arguments, masks built on the fly, fused activation modules, rotary tables under
``no_grad`` -- the nodes are the ones that were planned:

* each operator's operands are redistributed from their producers' layouts to the planned
  ones (the cost model's per-edge re-layouts, whose backward DTensor derives) and its nodes
  run on the *local shards*; the result is wrapped in the planned output layout. Local
  execution issues no collective of its own, so a step's collectives are the planned
  re-layouts plus the parameter-gradient reductions (a post-accumulate-grad hook turns
  partial gradients into the parameter's placements). Corrections keep local execution
  exact: a bias under a contracted split is added on one rank only; mean reductions over a
  split label become partial sums; a class loss over a split batch divides its local sum by
  the count of counted targets in the whole batch; causal attention over split queries
  gets the mask of its own rows; a vocabulary-split embedding masks foreign rows; BatchNorm
  over a split batch all-reduces its statistics (``batch_norm``);
* nodes between operators (views) run on DTensors with DTensor's rules; constants and
  derived inputs (masks, position ids: capture's ``_derived``) run on plain tensors, every
  rank computing them from the whole batch it is handed;
* a recomputed module's nodes run under non-reentrant ``torch.utils.checkpoint`` (their
  re-layouts are issued again in backward);
* ZeRO on model-parallel plans: a parameter is stored sharded over the axes where its
  gradient is a partial sum and gathered at each use; stage 1 gathers a group's parameters
  together once per step and reduce-scatters their gradients together (``zero_groups``);
  stage 3 also drops the gathered copy after forward and gathers it again when backward
  needs it.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.checkpoint import checkpoint

from ..capture.program import Program, call_node, is_skipped, module_paths
from ..capture.inputs import bind_call, forward_signature
from .. import placement as planned
from ..execution import gradient_group
from .batch_norm import sync_batch_norm
from .checkpointing import checkpoint_context
from . import zero_groups

__all__ = ["ProgramRunner", "to_placement", "Step", "is_skipped"]

_CLASS_LOSSES = ("cross_entropy_loss", "nll_loss", "nll_loss_nd", "nll_loss2d")
_ELEM_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")


def to_placement(p: planned.Placement) -> Placement:
    """The ``torch.distributed.tensor`` placement of a planned one."""
    if isinstance(p, planned.Shard):
        return Shard(p.dim)
    if isinstance(p, planned.Partial):
        return Partial()
    if isinstance(p, planned.Replicate):
        return Replicate()
    raise TypeError(f"not a placement: {p!r}")


def _grad_placements(placements, partial) -> list[Placement]:
    """How an operand's gradient arrives: partial sums on the axes where ``partial`` says so
    (``traffic.grad_partial``), laid out as ``placements`` elsewhere."""
    return [Partial() if q else pl for pl, q in zip(placements, partial)]


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    """``t``, copied where it is a slice of a larger buffer (gloo's all-to-all is an all-gather
    and a chunk), so that what is kept (saved by autograd, held) is only the slice."""
    return t.clone() if t.untyped_storage().nbytes() > t.numel() * t.element_size() else t


# env key of the operands already moved to a layout this forward: consumers of one node that
# want it in the same layout share one move (one all-gather for q, k and v, one saved copy)
_MOVED = "__moved__"


@dataclass
class Step:
    kind: str                        # "node" | "op" | "segment"
    node: fx.Node | None = None
    op: Any = None                   # OpLayout
    steps: list["Step"] = field(default_factory=list)    # a segment's own steps
    name: str = ""                   # a segment's module
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    free: tuple[str, ...] = ()       # env entries dead after this step
    # written in place: an operator's moved operands (written back to where they came from),
    # a segment's reads (read by reference, not as checkpoint inputs autograd would find changed)
    written: tuple[str, ...] = ()


def _piece(name: str) -> tuple[str, int | None]:
    if name.endswith("]") and "[" in name:
        base, k = name[:-1].split("[")
        return base, int(k)
    return name, None


class ProgramRunner:
    """The plan's operators laid out on ``mesh``, run over the program's nodes ``nodes`` (all
    by default; a pipeline stage runs its own)."""

    def __init__(self, model: nn.Module, layout, program: Program, mesh: DeviceMesh,
                 nodes: list[fx.Node] | None = None, keep: set[str] = frozenset()) -> None:
        self.model, self.layout, self.program, self.mesh = model, layout, program, mesh
        self.signature = forward_signature(model)
        self.coord = list(mesh.get_coordinate() or [])
        self.zero = getattr(layout.plan, "zero_stage", 0) or 0
        self.by_name = {n.name: n for n in program.graph.nodes}
        self.zero_axes: dict[str, tuple[int, ...]] = {}
        self.storage: dict[str, tuple[str, ...]] = {}
        self.params_by_id: dict[int, str] = {}
        self.recomputing = 0
        # accumulating micro-batches without ZeRO or under ZeRO-1: gradients stay partial sums
        # until the last one's backward (``execution.syncs_gradients_once``), then are reduced once
        self.defer_grad_sync = False
        self.held: dict[tuple, torch.Tensor] = {}   # ZeRO-1: parameters gathered for the step (``_held``)
        # ZeRO-1: a parameter's use (name, layout, partial axes) -> the unit of uses gathered
        # together (gradient group, partial axes, dtype: as the gradient buckets); each unit's
        # uses in order, with the dims ZeRO shards per mesh axis; its uses whose gradients
        # wait for the rest
        self.unit_of: dict[tuple, tuple] = {}
        self.units: dict[tuple, dict[tuple, dict[int, int]]] = {}
        self.held_pending: dict[tuple, dict[tuple, torch.Tensor]] = {}
        self.zero_params: dict[str, nn.Parameter] = {}
        # gradients reduced per bucket (``_buckets``): parameter id -> bucket, bucket -> size,
        # and the parameters whose gradients wait for the rest of their bucket
        self.bucket_of: dict[int, tuple] = {}
        self.bucket_sizes: dict[tuple, int] = {}
        self.pending: dict[tuple, dict[int, torch.Tensor]] = {}
        # gradients kept from the step before that hold partial sums under their reduced
        # placements until their bucket is reduced (``_take_partial``)
        self.unreduced: set[int] = set()
        self.replaying: set[str] | None = None     # in a recomputed forward: values it must not write
        nodes = [n for n in program.graph.nodes if n.op not in ("placeholder", "output")] if nodes is None else nodes
        out = next(n for n in program.graph.nodes if n.op == "output")
        self.keep = set(keep) | {a.name for a in out.all_input_nodes}
        self.steps = self._steps([n for n in nodes if not is_skipped(n)], tuple(getattr(layout.plan, "recompute", ()) or ()))
        _liveness(self.steps, self.keep)

    # ---------------------------------------------------------------- steps

    def _steps(self, nodes: list[fx.Node], recompute: tuple[str, ...]) -> list[Step]:
        ops_at: dict[str, list] = {}
        members: dict[str, Any] = {}
        for o in self.layout.ops:
            for m in o.nodes:
                members[_piece(m)[0]] = o
            ops_at.setdefault(_piece(o.nodes[-1])[0], []).append(o)
        steps = []
        for n in nodes:
            if n.name in ops_at:
                for o in ops_at[n.name]:
                    steps.append(self._op_step(o, members))
            elif n.name not in members:
                steps.append(Step("node", node=n, reads=tuple(a.name for a in n.all_input_nodes), writes=(n.name,)))
        for fqn in recompute:
            steps = _segment(steps, fqn, self.keep)
        self._mark_segment_writes(steps)
        return steps

    def _mark_segment_writes(self, steps: list[Step]) -> None:
        for st in steps:
            if st.kind == "segment":
                mutated = {v.name for n in self._body_nodes(st.steps) for _, v in _written_args(n)}
                st.written = tuple(r for r in st.reads if r in mutated)
                self._mark_segment_writes(st.steps)

    def _op_step(self, o, members) -> Step:
        mine = {_piece(m)[0] for m in o.nodes}
        reads = list(o.operand_nodes)
        writes = []
        for m in mine:
            node = self.by_name[m]
            for a in node.all_input_nodes:
                if a.name not in mine and a.name not in reads:
                    reads.append(a.name)
            if any(u.name not in mine and not is_skipped(u) for u in node.users):
                writes.append(m)
        return Step("op", op=o, reads=tuple(reads), writes=tuple(writes),
                    written=tuple(_written_operands(o, self.by_name)))

    # ---------------------------------------------------------------- setup

    def _take_partial(self, p: DTensor, grad: torch.Tensor):
        """Before a bucketed parameter's gradient is accumulated into one kept from the step
        before (``zero_grad(set_to_none=False)``: reduced, and zero), DTensor would all-reduce
        the new partial sums on their own to add them (its rule for Replicate + Partial), one
        call per parameter. Where the kept gradient is zero, they are added as they are and
        reduced with their bucket (:meth:`_reduce_partial_grad`), as are later micro-batches'
        sums while gradient sync is deferred; one that holds reduced values (gradients summed
        over several backward calls) is left to DTensor. So is every one on a GPU: telling
        zeros there would wait for the device once per parameter."""
        g = p.grad
        bucket = self.bucket_of.get(id(p))
        if (bucket is None or not isinstance(g, DTensor) or not isinstance(grad, DTensor) or g.device.type != "cpu"
                or tuple(g.placements) != tuple(p.placements)
                or tuple(grad.placements) != tuple(_grad_placements(p.placements, bucket[1]))
                or (id(p) not in self.unreduced and bool(g.to_local().any()))):
            return None
        self.unreduced.add(id(p))    # (already there: an earlier micro-batch's sums, not reduced yet)
        return DTensor.from_local(grad.to_local(), p.device_mesh, g.placements, run_check=False)

    def _reduce_partial_grad(self, p: torch.Tensor) -> None:
        if self.defer_grad_sync:
            return
        g = p.grad
        bucket = self.bucket_of.get(id(p))
        unreduced = id(p) in self.unreduced
        if not unreduced:
            if not (isinstance(g, DTensor) and isinstance(p, DTensor) and g.placements != p.placements):
                return
            if bucket is None or tuple(g.placements) != tuple(_grad_placements(p.placements, bucket[1])):
                p.grad = g.redistribute(p.device_mesh, p.placements)
                return
        if not self.pending:
            torch.autograd.Variable._execution_engine.queue_callback(self._flush_buckets)
        waiting = self.pending.setdefault(bucket, {})
        waiting[id(p)] = p
        if len(waiting) == self.bucket_sizes[bucket]:
            self._flush(bucket)

    def _buckets(self, params: dict[str, nn.Parameter]) -> None:
        """The parameters whose gradients are all-reduced together (ZeRO's sharded parameters
        aside), by FSDP2 group (``execution.gradient_group``) and by the mesh axes their
        gradients are partial over -- one call per bucket and axis, as the cost model's
        ``execution.latency_shares`` prices them."""
        seen: set[str] = set()
        for o in self.layout.ops:
            for j, pname in enumerate(o.param_names):
                if pname is None or pname in seen:
                    continue
                seen.add(pname)
                p = params.get(pname)
                if p is None or id(p) in self.params_by_id or not any(o.grad_partial[j]):
                    continue
                key = (gradient_group(self.layout.graph, self.layout.graph.operators[o.index]),
                       o.grad_partial[j], p.dtype)
                self.bucket_of[id(p)] = key
                self.bucket_sizes[key] = self.bucket_sizes.get(key, 0) + 1

    def _flush(self, bucket: tuple) -> None:
        """One all-reduce per partial axis of a bucket's gradients, flattened: each gradient is
        moved into the flat buffer and then is a view of it, so the bucket holds one copy."""
        ps = list(self.pending.pop(bucket).values())
        flat = torch.empty(sum(p.grad.to_local().numel() for p in ps), dtype=bucket[2],
                           device=ps[0].grad.to_local().device)
        views, at = [], 0
        for p in ps:
            t = p.grad.to_local()       # not listed first: each gradient goes once copied
            view = flat[at:at + t.numel()].view(t.shape)
            view.copy_(t)
            at += t.numel()
            views.append(view)
            p.grad = None
            self.unreduced.discard(id(p))
        for a, partial in enumerate(bucket[1]):
            if partial:
                dist.all_reduce(flat, group=self.mesh.get_group(a))
        for p, view in zip(ps, views):
            p.grad = DTensor.from_local(view, self.mesh, p.placements, run_check=False)

    def _flush_buckets(self) -> None:
        """At the end of a backward: the buckets some of whose parameters got no gradient."""
        for bucket in list(self.pending):
            self._flush(bucket)

    def install_parameters(self, names: set[str] | None = None) -> dict[str, nn.Parameter]:
        """Replace the model's parameters (those in ``names``, all by default) by DTensor
        parameters with their planned (or ZeRO storage) placements; returns them by name."""
        model, mesh = self.model, self.mesh
        if self.zero:
            self._zero_storage()
        tied: dict[int, list[str]] = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            tied.setdefault(id(p), []).append(n)
        out = {}
        for aliases in tied.values():
            if names is not None and not any(a in names for a in aliases):
                continue
            owner = next((a for a in aliases if a in self.layout.param_placements), None)
            p = model.get_parameter(aliases[0])
            pls = (self.storage.get(owner) or self.layout.param_placements.get(owner)) if owner else None
            pls = pls or (planned.REPLICATE,) * len(self.layout.mesh_shape)
            new = nn.Parameter(distribute_tensor(p.data, mesh, [to_placement(x) for x in pls]),
                               requires_grad=p.requires_grad)
            new.register_post_accumulate_grad_hook(self._reduce_partial_grad)
            new.register_hook(functools.partial(self._take_partial, new))
            for a in aliases:
                mod_name, _, leaf = a.rpartition(".")
                setattr(model.get_submodule(mod_name) if mod_name else model, leaf, new)
            if owner in self.zero_axes:
                self.params_by_id[id(new)] = owner
                self.zero_params[owner] = new
            out[aliases[0]] = new
        installed = {id(q) for q in out.values()}
        self._buckets({n: q for n, q in model.named_parameters(remove_duplicate=False) if id(q) in installed})
        if self.zero == 1:
            self._zero_units(self.steps)
        return out

    def _zero_units(self, steps: list[Step]) -> None:
        """ZeRO-1: the uses of its sharded parameters gathered together (``zero_groups``), per
        gradient group. A use joins its unit where the operator takes the parameter itself (not
        a view of it), in the stored layout with ZeRO's axes replicated, its gradient partial
        on exactly those axes; others are moved on their own (``_held``)."""
        graph = self.layout.graph
        for st in steps:
            if st.kind == "segment":
                self._zero_units(st.steps)
            if st.kind != "op":
                continue
            o = st.op
            for j, pname in enumerate(o.param_names):
                param = self.zero_params.get(pname)
                if param is None or self.by_name[o.operand_nodes[j]].op != "placeholder":
                    continue        # (used through a view: moved on its own, as the view)
                axes, stored, want = self.zero_axes[pname], self.storage[pname], o.want[j]
                partial_axes = tuple(a for a, q in enumerate(o.grad_partial[j]) if q)
                if partial_axes != axes or any(
                        (want[a] != stored[a]) if a not in axes else not isinstance(want[a], planned.Replicate)
                        for a in range(len(want))):
                    continue
                use = (pname, want, o.grad_partial[j])
                unit = (gradient_group(graph, graph.operators[o.index]), o.grad_partial[j], param.dtype)
                if use in self.unit_of:
                    continue
                self.unit_of[use] = unit
                self.units.setdefault(unit, {})[use] = {a: stored[a].dim for a in axes}

    def _zero_storage(self) -> None:
        """ZeRO on the axes where a parameter is replicated while its operator splits another
        label (its data-parallel axes): the stored parameter -- and so its gradient and optimizer
        state -- is sharded there too (an even split of some dim; dims that do not split evenly
        stay replicated). Each use gathers it (``redistribute``: all-gather in forward, and the
        partial gradient is reduce-scattered back by redistribute's backward)."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        shape = self.layout.mesh_shape
        seen: set[str] = set()
        for o in self.layout.ops:
            for j, pname in enumerate(o.param_names):
                if pname is None or pname in seen or pname not in params:
                    continue
                seen.add(pname)
                want, axes = planned.zero_storage(self.layout.param_placements[pname], o.grad_partial[j],
                                                  params[pname].shape, shape)
                if axes:
                    self.zero_axes[pname] = axes
                    self.storage[pname] = want

    # ---------------------------------------------------------------- running

    def placeholders(self, leaves: list[Any]) -> dict[str, Any]:
        """The program's inputs: parameters and buffers from the model (those it still has),
        lifted constants, and the user inputs ``leaves`` (flattened like the captured call)."""
        env: dict[str, Any] = {}
        it = iter(leaves)
        prog = self.program
        for n in prog.placeholders():
            kind, target = prog.input_kinds.get(n.name), prog.input_targets.get(n.name)
            if kind == "input":
                env[n.name] = next(it)
            elif kind == "param":
                try:
                    env[n.name] = self.model.get_parameter(target)
                except AttributeError:
                    pass                      # another pipeline stage's
            elif kind == "buffer":
                env[n.name] = self.model.get_buffer(target)
            else:
                env[n.name] = prog.constants[target]
        return env

    def forward(self, captured_call: tuple, *args, **kwargs):
        args, kwargs = bind_call(self.signature, captured_call, (args, kwargs))
        leaves, spec = tree_flatten((args, kwargs))
        if spec != self.program.in_spec:
            raise ValueError(f"the model was called with inputs structured as {spec}, but the plan "
                             f"was made for {self.program.in_spec}")
        env = self.placeholders(leaves)
        self.run(self.steps, env)
        out = next(n for n in self.program.graph.nodes if n.op == "output")
        flat = list(out.args[0]) if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
        values = [_replicated_scalar(env[flat[i].name]) if isinstance(flat[i], fx.Node) else flat[i]
                  for i in self.program.user_outputs]
        return tree_unflatten(values, self.program.out_spec)

    def run(self, steps: list[Step], env: dict[str, Any]) -> None:
        for st in steps:
            if st.kind == "node":
                env[st.node.name] = self._node(st.node, env)
            elif st.kind == "op":
                self._op(st, env)
            else:
                self._segment(st, env)
            for name in st.free:
                env.pop(name, None)
            if st.free and _MOVED in env:
                gone = set(st.free)
                for key in [k for k in env[_MOVED] if k[0] in gone]:
                    del env[_MOVED][key]

    def _node(self, n: fx.Node, env: dict[str, Any]) -> Any:
        if n.op == "get_attr":
            return getattr(self.program.gm, n.target)
        args = fx.node.map_arg(n.args, lambda a: env[a.name])
        kwargs = fx.node.map_arg(n.kwargs, lambda a: env[a.name])
        if self.replaying is not None:
            done, args, kwargs = self._replayed(n, args, kwargs)
            if args is None:
                return done
        try:
            return call_node(n, args, kwargs)
        except (NotImplementedError, RuntimeError):
            if not any(isinstance(x, DTensor) for x in tree_flatten((args, kwargs))[0]):
                raise
        # a view DTensor has no sharding rule for: run it on the whole tensor, replicated
        rep = [Replicate()] * self.mesh.ndim
        full = lambda x: x.full_tensor() if isinstance(x, DTensor) else x  # noqa: E731
        res = call_node(n, fx.node.map_aggregate(args, full), fx.node.map_aggregate(kwargs, full))
        wrap = lambda t: DTensor.from_local(t, self.mesh, rep, run_check=False) \
            if isinstance(t, torch.Tensor) else t  # noqa: E731
        return type(res)(wrap(t) for t in res) if isinstance(res, (tuple, list)) else wrap(res)

    def _segment(self, st: Step, env: dict[str, Any]) -> None:
        # what the segment writes in place (BatchNorm's statistics and step count) it reads by
        # reference, not as a checkpoint input that autograd would find changed
        names = [r for r in st.reads if r not in st.written]
        held = {r: env[r] for r in st.written}
        outs = list(st.writes)
        calls = [0]

        def body(*vals):
            local = {**held, **dict(zip(names, vals))}     # a fresh set of moves: recomputed ones too
            replay = calls[0] > 0
            calls[0] += 1
            self.recomputing += 1
            saved = self.replaying
            if replay:
                self.replaying = (saved or set()) | set(held)
            try:
                self.run(st.steps, local)
            finally:
                self.recomputing -= 1
                self.replaying = saved
            return tuple(local[o] for o in outs)

        policy = getattr(self.layout.plan, "recompute_policy", "full")
        extra = {"context_fn": checkpoint_context(policy)} if policy != "full" else {}
        res = checkpoint(body, *[env[r] for r in names], use_reentrant=False, **extra)
        env.update(zip(outs, res))

    def _body_nodes(self, steps: list[Step]):
        for st in steps:
            if st.kind == "node":
                yield st.node
            elif st.kind == "op":
                yield from (self.by_name[_piece(m)[0]] for m in st.op.nodes)
            else:
                yield from self._body_nodes(st.steps)

    def _replayed(self, node: fx.Node, args: tuple, kwargs: dict):
        """A recomputed forward leaves state alone that the first one updated: an in-place
        write to a value from outside the segment is skipped (returns that value), and
        BatchNorm's running statistics are not updated a second time."""
        if _mutates_first(node) and node.args[0].name in self.replaying:
            return args[0], None, None
        if node.target is torch.ops.aten.batch_norm.default and len(args) >= 6 and args[5]:
            spare = [t.clone() if isinstance(t, torch.Tensor) else t for t in args[3:5]]
            args = (*args[:3], *spare, *args[5:])       # updates a spare copy: as many saved tensors
        return None, args, kwargs

    # ---------------------------------------------------------------- operators

    def _as_dtensor(self, t: torch.Tensor) -> DTensor:
        if isinstance(t, DTensor):
            return t
        return DTensor.from_local(t, self.mesh, [Replicate()] * self.mesh.ndim, run_check=False)

    def _operand(self, o, j: int, src, gathered: list, moved: dict) -> Any:
        if not isinstance(src, torch.Tensor):
            return src
        zero_param = self.params_by_id.get(id(src)) if self.zero else None
        if zero_param is not None and self.zero == 1 and torch.is_grad_enabled():
            use = (zero_param, o.want[j], o.grad_partial[j])
            unit = self.unit_of.get(use)
            local = self._unit_use(unit, use) if unit else self._held(*use, src)
            if local.requires_grad:
                local = _OwnGrad.apply(local)
            return self._fix_operand(o, j, local)
        key = (o.operand_nodes[j], o.want[j], o.grad_partial[j])
        if zero_param is None and key in moved:     # another consumer moved it the same way
            local = moved[key]
            if local.requires_grad:
                local = (_OwnGrad if o.param_names[j] is not None else _ContiguousGrad).apply(local)
            return self._fix_operand(o, j, local)
        x = self._as_dtensor(src)
        if x.requires_grad:
            x = _ContiguousGrad.apply(x)        # redistribute's backward may slice non-contiguously
        want = [to_placement(p) for p in o.want[j]]
        if o.param_names[j] is None or tuple(x.placements) != tuple(want):
            # (a parameter used in its stored layout gets its gradient as partial sums, which
            # its post-accumulate hook reduces: once per step when micro-batches defer it)
            x = x.redistribute(self.mesh, want)
        gpl = _grad_placements(want, o.grad_partial[j])
        local = x.to_local(grad_placements=gpl) if x.requires_grad else x.to_local()
        if o.param_names[j] is None:
            local = _own_storage(local)
        if zero_param is not None and self.zero >= 3 and not self.recomputing:
            gathered.append((local.untyped_storage().data_ptr(), src, want))
        elif zero_param is None:
            moved[key] = local
        if local.requires_grad:
            local = (_OwnGrad if o.param_names[j] is not None else _ContiguousGrad).apply(local)
        return self._fix_operand(o, j, local)

    def _held(self, pname: str, want: tuple, partial: tuple, param: DTensor) -> torch.Tensor:
        """ZeRO-1: ``param`` (its sharded storage) gathered into the layout ``want`` once per
        step, a leaf every use shares; its gradient -- partial sums where ``partial`` -- adds
        up over the step's micro-batches and is reduce-scattered into the stored shard's
        gradient once, after the last (``execution.syncs_gradients_once``)."""
        key = (pname, want, partial)
        leaf = self.held.get(key)
        if leaf is not None:
            return leaf
        placements = [to_placement(p) for p in want]
        with torch.no_grad():
            leaf = _own_storage(param.redistribute(self.mesh, placements).to_local())
        if param.requires_grad:
            gpl = _grad_placements(placements, partial)
            leaf.requires_grad_()
            leaf.register_post_accumulate_grad_hook(lambda t: self._reduce_held(key, param, gpl, t))
        self.held[key] = leaf
        return leaf

    def _reduce_held(self, key: tuple, param: DTensor, gpl: list, leaf: torch.Tensor) -> None:
        if self.defer_grad_sync:
            return
        with torch.no_grad():
            g = DTensor.from_local(leaf.grad, self.mesh, gpl, run_check=False)
            g = g.redistribute(self.mesh, param.placements)
        param.grad = g if param.grad is None else param.grad + g
        leaf.grad = None
        del self.held[key]                     # the next step gathers the updated parameter

    def _unit_use(self, unit: tuple, use: tuple) -> torch.Tensor:
        """ZeRO-1: a use of a sharded parameter, its whole unit (``_zero_units``) gathered at the
        step's first use of any of them, as leaves whose gradients add up over the step's
        micro-batches and are reduce-scattered together once every one has its own
        (``_reduce_unit``) -- which they are kept whole until anyway."""
        if use not in self.held:
            uses = list(self.units[unit])
            params = [self.zero_params[u[0]] for u in uses]
            with torch.no_grad():
                full = zero_groups.gather([p.to_local() for p in params], list(self.units[unit].values()), self.mesh)
            for u, p, leaf in zip(uses, params, full):
                if p.requires_grad:
                    leaf.requires_grad_()
                    leaf.register_post_accumulate_grad_hook(lambda t, unit=unit, u=u: self._reduce_unit(unit, u, t))
                self.held[u] = leaf
        return self.held[use]

    def _reduce_unit(self, unit: tuple, use: tuple, leaf: torch.Tensor) -> None:
        if self.defer_grad_sync:
            return
        if not self.held_pending:
            torch.autograd.Variable._execution_engine.queue_callback(self._flush_units)
        waiting = self.held_pending.setdefault(unit, {})
        waiting[use] = leaf
        if len(waiting) == len(self.units[unit]):
            self._flush_unit(unit)

    def _flush_unit(self, unit: tuple) -> None:
        """ZeRO-1: the unit's gradients reduce-scattered into their stored shards' gradients,
        and its gathered parameters let go (the next step gathers the updated ones)."""
        waiting = self.held_pending.pop(unit)
        uses = [u for u in self.units[unit] if u in waiting]
        dims = [self.units[unit][u] for u in uses]
        grads = [waiting[u].grad for u in uses]
        for u in uses:
            waiting[u].grad = None
        with torch.no_grad():
            shards = zero_groups.reduce_scatter(grads, dims, self.mesh)
            for u, shard in zip(uses, shards):
                param = self.zero_params[u[0]]
                g = DTensor.from_local(shard, self.mesh, param.placements, run_check=False)
                param.grad = g if param.grad is None else param.grad + g
        for u in self.units[unit]:
            self.held.pop(u, None)

    def _flush_units(self) -> None:
        """At the end of a backward: the units some of whose uses got no gradient."""
        for unit in list(self.held_pending):
            self._flush_unit(unit)

    def _op(self, st: Step, env: dict[str, Any]) -> None:
        o = st.op
        local: dict[str, Any] = {}
        gathered: list = []
        moved = env.setdefault(_MOVED, {})
        for j, name in enumerate(o.operand_nodes):
            local[name] = self._operand(o, j, env[name], gathered, moved)
        look = lambda a: local[a.name] if a.name in local else env[a.name]  # noqa: E731
        with _regather_saved(gathered, self.mesh):
            for m in o.nodes:
                base, piece = _piece(m)
                node = self.by_name[base]
                args = fx.node.map_arg(node.args, look)
                kwargs = fx.node.map_arg(node.kwargs, look)
                if _mutates_first(node) and node.args[0].name in o.operand_nodes:
                    # in place on an operand: on this operator's own copy of it
                    args = (args[0].clone(), *args[1:])
                res = self._call(o, node, args, kwargs, env)
                local[m if piece is None else base] = res if piece is None else res[piece]
        if self.replaying is None:
            for name in st.written:
                self._write_back(o, o.operand_nodes.index(name), env[name], local[name])
        for name in st.writes:
            value = local[name]
            if name == _piece(o.nodes[-1])[0] and _piece(o.nodes[-1])[1] is not None:     # a split piece
                k = _piece(o.nodes[-1])[1]
                slot = env.setdefault(name, [None] * len(self.by_name[name].meta["val"]))
                slot[k] = self._wrap(o, value)
            else:
                env[name] = self._wrap(o, value)

    def _write_back(self, o, j: int, src, moved) -> None:
        """An operand the operator updates in place (BatchNorm's running statistics) was
        moved to the operator's layout: its update goes back to the tensor it came from."""
        if not isinstance(src, torch.Tensor) or not isinstance(moved, torch.Tensor):
            return
        base = src.to_local() if isinstance(src, DTensor) else src
        if moved.untyped_storage().data_ptr() == base.untyped_storage().data_ptr():
            return
        with torch.no_grad():
            new = DTensor.from_local(moved, self.mesh, [to_placement(p) for p in o.want[j]], run_check=False)
            if isinstance(src, DTensor):
                base.copy_(new.redistribute(self.mesh, src.placements).to_local())
            else:
                base.copy_(new.full_tensor())

    def _wrap(self, o, value):
        if isinstance(value, (tuple, list)):
            first = next((v for v in value if isinstance(v, torch.Tensor)), None)
            return type(value)(self._wrap(o, v) if v is first or (
                isinstance(v, torch.Tensor) and first is not None and v.shape == first.shape)
                else _Unplaced(o.name) if isinstance(v, torch.Tensor) and any(not isinstance(p, planned.Replicate) for p in o.out) else
                (self._wrap(o, v) if isinstance(v, torch.Tensor) else v) for v in value)
        if not isinstance(value, torch.Tensor):
            return value
        value = self._fix_output(o, value)
        if value.requires_grad:
            value = _ContiguousGrad.apply(value)
        return DTensor.from_local(value, self.mesh, [to_placement(p) for p in o.out], run_check=False)

    def _call(self, o, node: fx.Node, args, kwargs, env):
        if self.replaying is not None:
            done, args, kwargs = self._replayed(node, args, kwargs)
            if args is None:
                return done
        base = o.base
        if node.name != _piece(o.nodes[-1])[0] or len(o.nodes) > 1:
            return call_node(node, args, kwargs)
        if base == "embedding" and any(s is not None and s in o.contracted for s in o.config.splits):
            return self._vocab_split_embedding(o, node, args, kwargs)
        if o.batch_axes:
            axes = [a for a in o.batch_axes if self.mesh.shape[a] > 1]
            return sync_batch_norm(node.target, args, kwargs, [self.mesh.get_group(a) for a in axes],
                                   math.prod(self.mesh.shape[a] for a in axes))
        if base == "scaled_dot_product_attention":
            return self._attention(o, node, args, kwargs)
        if base in _CLASS_LOSSES:
            return self._class_loss(o, node, args, kwargs, env)
        return call_node(node, args, kwargs)

    def _attention(self, o, node, args, kwargs):
        """Causal attention over split queries: the causal mask of this rank's rows."""
        call = _bind(node, args, kwargs)
        s_label = o.terms[0][-2]
        axes = [a for a, s in enumerate(o.config.splits) if s == s_label and self.mesh.shape[a] > 1]
        if not call.get("is_causal") or not axes:
            return call_node(node, args, kwargs)
        q, k = call["query"], call["key"]
        idx = 0
        for a in axes:
            idx = idx * self.mesh.shape[a] + self.coord[a]
        rows = q.shape[-2]
        qpos = torch.arange(rows, device=q.device) + idx * rows
        call["attn_mask"] = torch.arange(k.shape[-2], device=q.device)[None, :] <= qpos[:, None]
        call["is_causal"] = False
        return node.target(**call)

    def _class_loss(self, o, node, args, kwargs, env):
        """Mean over the counted targets of the whole batch: local sum / global count (the
        targets are the batch every rank is handed, or derived from it)."""
        axes = [a for a, s in enumerate(o.config.splits) if s is not None and s in o.contracted
                and self.mesh.shape[a] > 1]
        call = _bind(node, args, kwargs)
        if not axes or call.get("reduction", _MEAN) != _MEAN:
            return call_node(node, args, kwargs)
        if call.get("weight") is not None:
            raise NotImplementedError(f"operator {o.name}: a class-weighted loss over a split batch")
        whole = env.get(o.operand_nodes[1]) if len(o.operand_nodes) > 1 else None
        if not isinstance(whole, torch.Tensor) or isinstance(whole, DTensor):
            raise NotImplementedError(f"operator {o.name}: targets computed from activations over a split batch")
        count = (whole != call.get("ignore_index", -100)).sum().clamp_min(1)
        call["reduction"] = _SUM
        return node.target(**call) / count

    def _vocab_split_embedding(self, o, node, args, kwargs):
        """Rows of the table live on one rank each: look up the local rows, zero the rest
        (partial sums over the vocabulary axis)."""
        weight, idx = args[0], args[1]
        a = next(a for a, s in enumerate(o.config.splits) if s is not None and s in o.contracted)
        rows = weight.shape[0]
        lo = self.coord[a] * rows
        foreign = (idx < lo) | (idx >= lo + rows)
        out = node.target(weight, (idx - lo).masked_fill(foreign, 0), *args[2:], **kwargs)
        return out.masked_fill(foreign.unsqueeze(-1), 0.0)

    def _fix_operand(self, o, j: int, local: torch.Tensor) -> torch.Tensor:
        # Bias of a contraction split over some axis: added on coordinate 0 of that axis only.
        if o.family in ("linear", "conv", "matmul") and j > 0 and o.param_names[j] is not None:
            for a, s in enumerate(o.config.splits):
                if s is not None and s in o.contracted and s not in o.terms[j] and self.coord[a] != 0:
                    return local * 0
        return local

    def _fix_output(self, o, out: torch.Tensor) -> torch.Tensor:
        if len(o.nodes) == 1 and (o.base in _ELEM_LOSSES or o.base == "mean"):
            n = math.prod(self.mesh.shape[a] for a, s in enumerate(o.config.splits)
                          if s is not None and s in o.contracted)
            if n > 1:
                out = out / n
        return out


_MEAN, _SUM = 1, 2          # aten's reduction enum


def _mutates_first(node: fx.Node) -> bool:
    """Does ``node`` write its first argument (a node) in place?"""
    return any(i == 0 for i, _ in _written_args(node))


def _written_operands(o, by_name: dict) -> list[str]:
    """Operands of ``o`` that one of its nodes writes in place, the first argument of a node
    excepted (that one runs on the operator's own copy)."""
    out = []
    for m in o.nodes:
        for i, v in _written_args(by_name[_piece(m)[0]]):
            if i and v.name in o.operand_nodes and v.name not in out:
                out.append(v.name)
    return out


def _written_args(node: fx.Node) -> list[tuple[int, fx.Node]]:
    """(position, node) of the arguments ``node`` writes in place."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    args = schema.arguments
    written = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
    if node.target is torch.ops.aten.batch_norm.default:     # its schema does not mark them
        written = [3, 4]
    out = []
    for i in written:
        v = node.args[i] if i < len(node.args) else node.kwargs.get(args[i].name)
        if isinstance(v, fx.Node):
            out.append((i, v))
    return out


def _bind(node: fx.Node, args, kwargs) -> dict:
    """A call's arguments by the aten schema's names."""
    schema = node.target._schema
    d = {a.name: v for a, v in zip(schema.arguments, args)}
    d.update(kwargs)
    return d


class _Unplaced:
    """A secondary result of a split operator whose layout the plan does not give."""

    def __init__(self, op: str) -> None:
        self.op = op

    def __getattr__(self, name):
        raise RuntimeError(f"operator {self.op}: a secondary result of a split operator is used; "
                           "the plan gives no layout for it")


def _replicated_scalar(v):
    if isinstance(v, DTensor) and v.dim() == 0:
        return v.redistribute(v.device_mesh, [Replicate()] * v.device_mesh.ndim).to_local()
    return v


def _segment(steps: list[Step], fqn: str, keep: set[str]) -> list[Step]:
    """Steps with the run of those inside module ``fqn`` folded into one checkpointed segment."""
    def inside(st: Step) -> bool:
        if st.kind == "node":
            return fqn in module_paths(st.node)
        if st.kind == "op":
            return st.op.module == fqn or st.op.module.startswith(fqn + ".")
        return st.name == fqn or st.name.startswith(fqn + ".")
    idx = [k for k, st in enumerate(steps) if inside(st)]
    if not idx:
        raise ValueError(f"plan recomputes module {fqn!r}, but none of its operators runs here")
    lo, hi = idx[0], idx[-1] + 1
    body = steps[lo:hi]
    defined = {w for st in body for w in st.writes}
    reads = list(dict.fromkeys(r for st in body for r in st.reads if r not in defined))
    later = {r for st in steps[hi:] for r in st.reads}
    writes = tuple(w for w in dict.fromkeys(defined) if w in later or w in keep)
    return steps[:lo] + [Step("segment", steps=body, name=fqn, reads=tuple(reads), writes=writes)] + steps[hi:]


def _liveness(steps: list[Step], keep: set[str]) -> None:
    """Each step's ``free``: env entries no later step reads (kept: ``keep``)."""
    last: dict[str, int] = {}
    for k, st in enumerate(steps):
        for r in st.reads:
            last[r] = k
        for w in st.writes:
            last.setdefault(w, k)
    frees: dict[int, list[str]] = {}
    for name, k in last.items():
        if name not in keep:
            frees.setdefault(k, []).append(name)
    for k, st in enumerate(steps):
        st.free = tuple(frees.get(k, ()))
        if st.kind == "segment":
            _liveness(st.steps, set(st.writes))


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


class _OwnGrad(torch.autograd.Function):
    """Identity whose backward hands on a gradient of its own. A parameter's gradient can
    otherwise be a tensor that autograd also passes on (a parameter added to an activation
    of its own shape): ``AccumulateGrad`` then keeps that very tensor as ``.grad``, a slice of
    it may become another parameter's ``.grad``, and the next accumulation (a pipeline's next
    micro-batch) adds into both."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g.clone(memory_format=torch.contiguous_format)
