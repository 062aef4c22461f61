"""Device meshes, one per (device type, shape, axis names) and process group.

Every sub-group of a mesh is a ``new_group`` that all ranks create together, which costs a
store round trip each (a third of a second per group on gloo): laying out a second plan on
the same mesh reuses the first one's groups.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

_MESHES: dict[tuple, tuple[object, DeviceMesh]] = {}


def device_mesh(device_type: str, shape: tuple[int, ...], names: tuple[str, ...] | None) -> DeviceMesh:
    """``init_device_mesh(device_type, shape, mesh_dim_names=names)``, cached while the
    default process group is the one it was made in."""
    key = (device_type, tuple(shape), tuple(names) if names else None)
    world = dist.group.WORLD
    hit = _MESHES.get(key)
    if hit is not None and hit[0] is world:
        return hit[1]
    mesh = init_device_mesh(device_type, tuple(shape), mesh_dim_names=tuple(names) if names else None)
    _MESHES[key] = (world, mesh)
    return mesh
