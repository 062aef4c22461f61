"""Model-axis layout: turn ModuleShardings into ``parallelize_module`` styles or explicit DTensor layouts.

Convention between modules: activations travel as plain *local* tensors. A module's
``inputs[i]`` is the layout (on the model axes) in which its i-th activation arrives, and its
``output`` the layout it hands on. ``"P"`` outputs are reduced at the module boundary: to the
next listed module's first-input layout when that is ``S(d)`` (reduce-scatter, sequence
parallel), else to ``R`` (all-reduce) -- partial sums never flow through un-planned code
such as residual adds.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from ..plan_types import ApplySpec, ModuleSharding
from ._validate import parse_placement_str

NORM_TYPES = ("LayerNorm", "RMSNorm")   # normalise trailing dims only: a sharded leading dim is safe


def to_placement(p: str) -> Placement:
    kind, d = parse_placement_str(p)
    if kind == "R":
        return Replicate()
    if kind == "P":
        return Partial()
    return Shard(d)


def model_axes(spec: ApplySpec) -> list[int]:
    return [a for a in range(len(spec.mesh.shape)) if a not in spec.data_axes and spec.mesh.shape[a] > 1]


def _sub(pls: tuple[str, ...] | None, axes: list[int]) -> tuple[str, ...]:
    if not pls:
        return tuple("R" for _ in axes)
    return tuple(pls[a] for a in axes)


def _resolved_outputs(spec: ApplySpec, axes: list[int]) -> list[tuple[Placement, ...]]:
    """Per module: the output layout on the model axes after resolving "P" (see module doc)."""
    outs = []
    for i, ms in enumerate(spec.modules):
        out = _sub(ms.output, axes)
        nxt = spec.modules[i + 1] if i + 1 < len(spec.modules) else None
        nxt_in = _sub(nxt.inputs[0], axes) if (nxt is not None and nxt.inputs) else None
        res = []
        for j, p in enumerate(out):
            if p == "P":
                q = nxt_in[j] if nxt_in is not None else "R"
                res.append(to_placement(q) if q.startswith("S") else Replicate())
            else:
                res.append(to_placement(p))
        outs.append(tuple(res))
    return outs


def describe_layout(spec: ApplySpec) -> dict[str, str]:
    """How :func:`apply_model_axes` will lay out each module (for reports and tests)."""
    axes = model_axes(spec)
    outs = _resolved_outputs(spec, axes)
    return {ms.module: _choose(ms, axes, outs[i], None)[0] for i, ms in enumerate(spec.modules)}


def _choose(ms: ModuleSharding, axes: list[int], out: tuple[Placement, ...],
            module: nn.Module | None) -> tuple[str, ParallelStyle | None]:
    """Pick ("kind", style) for one module. kind in {"none", "colwise", "rowwise",
    "sequence_parallel", "explicit"}; "explicit" means distribute_tensor + hooks."""
    if not axes:
        return "none", None
    p_all = {n: _sub(pl, axes) for n, pl in ms.params.items()}
    ins = [_sub(pl, axes) for pl in ms.inputs] or [tuple("R" for _ in axes)]
    all_r = lambda t: all(x == "R" for x in t)  # noqa: E731
    params_r = all(all_r(v) for v in p_all.values())
    ins_r = all(all_r(t) for t in ins)
    out_r = all(isinstance(o, Replicate) for o in out)
    if params_r and ins_r and out_r:
        return "none", None
    if len(axes) != 1:
        return "explicit", None
    w = p_all.get("weight", ("R",))[0]
    b = p_all.get("bias", None)
    in_p = to_placement(ins[0][0])
    o = out[0]
    mt = ms.module_type
    if mt == "Linear" and len(ins) == 1:
        if w == "S(0)" and (b is None or b[0] == "S(0)") and not isinstance(o, Partial):
            return "colwise", ColwiseParallel(input_layouts=in_p, output_layouts=o, use_local_output=True)
        if w == "S(1)" and (b is None or b[0] == "R"):
            return "rowwise", RowwiseParallel(input_layouts=in_p, output_layouts=o, use_local_output=True)
    if mt == "Embedding" and len(ins) == 1 and isinstance(in_p, Replicate):
        if w == "S(0)":
            return "rowwise", RowwiseParallel(input_layouts=in_p, output_layouts=o, use_local_output=True)
        if w == "S(1)":
            return "colwise", ColwiseParallel(input_layouts=in_p, output_layouts=o, use_local_output=True)
    if (params_r and len(ins) == 1 and isinstance(in_p, Shard) and in_p.dim not in (-1,)
            and mt in NORM_TYPES):
        return "sequence_parallel", SequenceParallel(sequence_dim=in_p.dim, use_local_output=True)
    return "explicit", None


def apply_model_axes(model: nn.Module, spec: ApplySpec, mesh: DeviceMesh) -> dict[str, str]:
    """Lay out every ModuleSharding on the model sub-mesh. Returns {fqn: kind} as applied."""
    axes = model_axes(spec)
    if not axes:
        return {ms.module: "none" for ms in spec.modules}
    names = tuple(spec.mesh.axis_names[a] for a in axes)
    sub = mesh[names[0]] if len(names) == 1 else mesh[names]
    outs = _resolved_outputs(spec, axes)
    tied = _tied_groups(model)
    applied = {}
    for i, ms in enumerate(spec.modules):
        module = model.get_submodule(ms.module) if ms.module else model
        kind, style = _choose(ms, axes, outs[i], module)
        applied[ms.module] = kind
        if kind == "none":
            continue
        if style is not None:
            parallelize_module(module, sub, style)
            if kind == "sequence_parallel":
                seq = _sub(ms.inputs[0], axes)
                _add_output_redistribute(module, sub, (to_placement(seq[0]),), outs[i])
        else:
            _explicit_layout(module, ms, axes, sub, outs[i])
    _retie(model, tied)
    return applied


def _tied_groups(model: nn.Module) -> list[list[str]]:
    """Names sharing one Parameter object (e.g. GPT's lm_head.weight is tok_emb.weight)."""
    by_id: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(n)
    return [names for names in by_id.values() if len(names) > 1]


def _retie(model: nn.Module, groups: list[list[str]]) -> None:
    """Layout replaces parameters module by module, which unties shared ones; tie them again
    to the first owner's (possibly distributed) parameter, requiring identical layouts."""
    for names in groups:
        first = model.get_parameter(names[0])
        for n in names[1:]:
            other = model.get_parameter(n)
            if other is first:
                continue
            pf = getattr(first, "placements", None)
            po = getattr(other, "placements", None)
            if pf != po:
                raise ValueError(f"tied parameters {names[0]} and {n} were given different layouts "
                                 f"({pf} vs {po}); tied parameters need identical placements")
            owner_name, _, leaf = n.rpartition(".")
            owner = model.get_submodule(owner_name) if owner_name else model
            setattr(owner, leaf, first)


def _map_tensors(obj: Any, fn) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, list):
        return [_map_tensors(o, fn) for o in obj]
    return obj


def _add_output_redistribute(module: nn.Module, sub: DeviceMesh, have: tuple[Placement, ...],
                             want: tuple[Placement, ...]) -> None:
    if tuple(have) == tuple(want):
        return

    def post(_m, _inp, out):
        def conv(t):
            if not isinstance(t, DTensor):
                t = DTensor.from_local(t, sub, have, run_check=False)
            return t.redistribute(sub, want).to_local()
        return _map_tensors(out, conv)
    module.register_forward_hook(post)


def _explicit_layout(module: nn.Module, ms: ModuleSharding, axes: list[int], sub: DeviceMesh,
                     out: tuple[Placement, ...]) -> None:
    """No style fits: distribute every parameter with its placements (unnamed ones replicated),
    turn arriving local activations into DTensors with the planned input layouts, and hand the
    output on as a local tensor in the resolved output layout."""
    for pname, p in list(module.named_parameters()):
        pls = tuple(to_placement(x) for x in _sub(ms.params.get(pname), axes))
        owner_name, _, leaf = pname.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        dt = distribute_tensor(p.data, sub, pls)
        owner.register_parameter(leaf, nn.Parameter(dt, requires_grad=p.requires_grad))
    in_pls = [tuple(to_placement(x) for x in _sub(pl, axes)) for pl in ms.inputs]

    def pre(_m, args):
        new, k = [], 0
        for a in args:
            if isinstance(a, torch.Tensor) and not isinstance(a, DTensor):
                pls = in_pls[k] if k < len(in_pls) else tuple(Replicate() for _ in axes)
                a = DTensor.from_local(a, sub, pls, run_check=False)
                k += 1
            elif isinstance(a, DTensor):
                k += 1
            new.append(a)
        return tuple(new)

    def post(_m, _inp, o):
        def conv(t):
            if isinstance(t, DTensor):
                return t.redistribute(sub, out).to_local()
            return t
        return _map_tensors(o, conv)

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(post)
