"""ZeRO-1's parameter collectives on the DTensor runner, one call per group and mesh axis.

The parameters ZeRO stores sharded (``placement.zero_storage``: an even split of one
dimension per data-parallel axis) are gathered a group at a time (``execution.gradient_group``:
a repeated block's parameters, or the root's), as FSDP2 gathers its groups: every member's
local shard goes into one flat buffer, one all-gather per mesh axis brings the others', and
each member is cut back out of it. Their gradients go back the same way, one reduce-scatter
per axis. This is what the cost model prices (``execution.groups_parameter_collectives``).

Only ZeRO-1 holds a group's gathered parameters and whole gradients for the step anyway.
Under ZeRO-2 the flat buffer beside the group's copies, and the group's gradients held for
one reduce-scatter, are memory a plan is not priced at (measured on a one-group MLP: +30 %
and +56 % of its peak), so there each parameter is moved on its own.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

__all__ = ["gather", "reduce_scatter"]

# per member: mesh axis -> the dimension ZeRO shards there
Dims = Sequence[dict[int, int]]


def gather(shards: Sequence[torch.Tensor], dims: Dims, mesh: DeviceMesh) -> list[torch.Tensor]:
    """The members' whole tensors on their ZeRO axes, from their local ``shards``. DTensor
    nests a dimension's shards in mesh-axis order, so the last axis is undone first."""
    cur = list(shards)
    for a in reversed(range(mesh.ndim)):
        idx = [k for k, d in enumerate(dims) if a in d]
        if not idx:
            continue
        n = mesh.size(a)
        flat = torch.cat([cur[k].reshape(-1) for k in idx])
        out = torch.empty(n * flat.numel(), dtype=flat.dtype, device=flat.device)
        dist.all_gather_into_tensor(out, flat, group=mesh.get_group(a))
        rows = out.view(n, flat.numel())
        at = 0
        for k in idx:
            m, shape = cur[k].numel(), cur[k].shape
            cur[k] = torch.cat([rows[r, at:at + m].view(shape) for r in range(n)], dim=dims[k][a])
            at += m
    return cur


def reduce_scatter(grads: list[torch.Tensor], dims: Dims, mesh: DeviceMesh) -> list[torch.Tensor]:
    """The members' gradients (partial sums on their ZeRO axes, laid out as :func:`gather`
    returns them) summed and cut to each rank's shard, in the reverse order of the gathers.
    ``grads`` is emptied: each gradient is let go once it is in the flat buffer, so that a
    caller holding no other reference holds the group's gradients about once, not twice."""
    cur: list = list(grads)
    grads.clear()
    for a in range(mesh.ndim):
        idx = [k for k, d in enumerate(dims) if a in d]
        if not idx:
            continue
        n = mesh.size(a)
        sizes = [cur[k].numel() // n for k in idx]
        shapes = []
        total = sum(sizes)
        flat = torch.empty(n * total, dtype=cur[idx[0]].dtype, device=cur[idx[0]].device)
        rows = flat.view(n, total)
        at = 0
        for k, m in zip(idx, sizes):
            chunks = cur[k].chunk(n, dim=dims[k][a])
            for r in range(n):
                rows[r, at:at + m].view(chunks[r].shape).copy_(chunks[r])
            shapes.append(chunks[0].shape)
            cur[k] = None
            at += m
        out = torch.empty(total, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter_tensor(out, flat, group=mesh.get_group(a))
        del flat, rows
        at = 0
        for k, m, shape in zip(idx, sizes, shapes):
            cur[k] = out[at:at + m].view(shape)
            at += m
    return cur
