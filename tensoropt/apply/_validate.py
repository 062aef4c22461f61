"""Checks run before any collective: signature, module/parameter existence, divisibility, world size."""

from __future__ import annotations

import hashlib
import math
import os
import re

import torch
import torch.nn as nn

from ..plan_types import ApplySpec

_SHARD_RE = re.compile(r"^S\((-?\d+)\)$")


def param_signature(model: nn.Module) -> str:
    """sha256 over sorted ``(name, shape, dtype)`` of ``model.named_parameters()``.

    Reads only metadata, so it works on meta-device models and never materialises storage.
    """
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        shape = tuple(p.shape)
        dtype = str(p.dtype).replace("torch.", "")
        h.update(f"{name}|{shape}|{dtype}\n".encode())
    return h.hexdigest()


def parse_placement_str(p: str) -> tuple[str, int | None]:
    """``"R"`` -> ("R", None), ``"S(d)"`` -> ("S", d), ``"P"`` -> ("P", None); else ValueError."""
    p = p.strip()
    if p in ("R", "P"):
        return p, None
    m = _SHARD_RE.match(p)
    if m:
        return "S", int(m.group(1))
    raise ValueError(f"unknown placement {p!r}: expected 'R', 'P' or 'S(d)'")


def _unwrap_name(model: nn.Module, fqn: str) -> nn.Module:
    try:
        return model.get_submodule(fqn) if fqn else model
    except AttributeError as e:
        raise ValueError(f"plan names module {fqn!r}, which does not exist in the model ({e})") from None


def validate_spec(model: nn.Module, spec: ApplySpec) -> None:
    """Everything that can be checked on the model and spec alone (no process group needed)."""
    ndim = len(spec.mesh.shape)
    if len(spec.mesh.axis_names) != ndim:
        raise ValueError(f"mesh shape {spec.mesh.shape} and axis names {spec.mesh.axis_names} differ in length")
    if len(set(spec.mesh.axis_names)) != ndim:
        raise ValueError(f"mesh axis names must be unique, got {spec.mesh.axis_names}")
    if any(s < 1 for s in spec.mesh.shape):
        raise ValueError(f"mesh shape must be positive, got {spec.mesh.shape}")
    for a in spec.data_axes:
        if not 0 <= a < ndim:
            raise ValueError(f"data axis {a} out of range for a {ndim}-D mesh")
    if spec.zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0..3, got {spec.zero_stage}")

    sig = param_signature(model)
    if spec.param_signature != sig:
        raise ValueError(
            f"plan was made for another model: plan {spec.model!r} has parameter signature "
            f"{spec.param_signature[:16]}..., this model's is {sig[:16]}... "
            f"(parameter names, shapes or dtypes differ; re-plan for this model)")

    seen = set()
    for ms in spec.modules:
        if ms.module in seen:
            raise ValueError(f"module {ms.module!r} appears twice in the plan")
        seen.add(ms.module)
        mod = _unwrap_name(model, ms.module)
        if type(mod).__name__ != ms.module_type:
            raise ValueError(f"plan says module {ms.module!r} is a {ms.module_type}, "
                             f"but the model has a {type(mod).__name__}")
        params = dict(mod.named_parameters())
        for pname, pls in ms.params.items():
            if pname not in params:
                raise ValueError(f"plan names parameter {ms.module}.{pname}, which does not exist "
                                 f"(module has {sorted(params)})")
            _check_placements(pls, ndim, f"{ms.module}.{pname}", allow_partial=False)
            shape = tuple(params[pname].shape)
            _check_divisible(shape, pls, spec.mesh.shape, f"parameter {ms.module}.{pname}",
                             skip_axes=spec.data_axes)
        for i, pls in enumerate(ms.inputs):
            _check_placements(pls, ndim, f"{ms.module} input {i}", allow_partial=False)
        if ms.output:
            _check_placements(ms.output, ndim, f"{ms.module} output", allow_partial=True)
    for i, pls in enumerate(spec.input_placements):
        _check_placements(pls, ndim, f"model input {i}", allow_partial=False)
    for fqn in spec.recompute:
        _unwrap_name(model, fqn)


def _check_placements(pls, ndim: int, what: str, allow_partial: bool) -> None:
    if len(pls) != ndim:
        raise ValueError(f"{what}: {len(pls)} placements {tuple(pls)} for a {ndim}-D mesh")
    for p in pls:
        kind, _ = parse_placement_str(p)
        if kind == "P" and not allow_partial:
            raise ValueError(f"{what}: 'P' (partial) is only allowed for module outputs")


def _check_divisible(shape, pls, mesh_shape, what: str, skip_axes=()) -> None:
    per_dim: dict[int, int] = {}
    for axis, p in enumerate(pls):
        kind, d = parse_placement_str(p)
        if kind != "S" or axis in skip_axes:
            continue
        dd = d + len(shape) if d < 0 else d
        if not 0 <= dd < len(shape):
            raise ValueError(f"{what}: placement {p} on axis {axis} but the tensor has shape {shape}")
        per_dim[dd] = per_dim.get(dd, 1) * mesh_shape[axis]
    for dd, n in per_dim.items():
        if shape[dd] % n:
            raise ValueError(f"{what}: dim {dd} of size {shape[dd]} is not divisible by {n} "
                             f"(the mesh axes sharding it); shape {shape}, placements {tuple(pls)}")


def expected_world_size(spec: ApplySpec) -> int:
    return math.prod(spec.mesh.shape)


def current_world_size() -> int:
    """World size of the initialised process group, else ``$WORLD_SIZE``; RuntimeError if neither."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    raise RuntimeError(
        "tensoropt.parallelize needs torch.distributed: no process group is initialised and "
        "RANK/WORLD_SIZE are not set. Launch the script with torchrun, e.g. "
        "`torchrun --standalone --nproc-per-node N your_script.py`, or call "
        "torch.distributed.init_process_group first.")


def check_world_size(spec: ApplySpec) -> None:
    ws = current_world_size()
    want = expected_world_size(spec)
    if ws != want:
        raise ValueError(f"world size {ws} does not match the plan's mesh {tuple(spec.mesh.shape)} "
                         f"({' x '.join(spec.mesh.axis_names)} = {want} ranks)")


def ensure_process_group() -> str:
    """Initialise the default process group from the torchrun environment if needed.

    Returns the device type for the mesh ("cuda" when CUDA is available, else "cpu").
    """
    import torch.distributed as dist
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if not dist.is_initialized():
        current_world_size()          # raises the "launch with torchrun" error if no env
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    else:
        backend = dist.get_backend()
        if device_type == "cuda" and "nccl" not in str(backend):
            device_type = "cpu"
    return device_type
