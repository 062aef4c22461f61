"""Clusters (device × nodes × devices per node) and the device meshes laid over them.

Rank layout is row-major: the last mesh axis is fastest, so its groups are consecutive
ranks, and ranks ``[k*per_node, (k+1)*per_node)`` are node ``k``.

Link of an axis. The groups of axis ``i`` are blocks of ``prod(shape[i:])`` consecutive
ranks. If that block size divides ``per_node`` every group stays inside one node and the
axis uses the intra-node link. Otherwise the axis is charged the inter-node link, even
when only some of its hops leave the node (e.g. one axis of 16 ranks over 2 nodes of 8):
the slowest hop bounds a ring.

Layout rule (which meshes are kept). Every axis's block size must either divide
``per_node`` (groups inside a node) or be a multiple of it (groups made of whole nodes);
meshes with blocks that straddle node boundaries unevenly are skipped. If more than
``MAX_MESHES`` remain, only meshes whose axes after the first all stay inside a node are kept.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .hardware import Device, Link, get_device, get_link, inter_link, intra_link

__all__ = ["Cluster", "Mesh", "parse_devices", "enumerate_meshes", "mesh_for", "MAX_MESHES", "CPU_LINK_NAME"]

#: beyond this many meshes, enumerate_meshes keeps only meshes whose inner axes fit in a node
MAX_MESHES = 100
#: link tier of local CPU ranks ("cpu:N")
CPU_LINK_NAME = "gloo-loopback"
_CPU_DEVICE_NAME = "cpu"


@dataclass(frozen=True)
class Cluster:
    device: Device
    n_nodes: int
    per_node: int
    intra_link: Link
    inter_link: Link

    @property
    def world_size(self) -> int:
        return self.n_nodes * self.per_node

    def __str__(self) -> str:
        return f"{self.n_nodes}x{self.per_node}x{self.device.name}"


_SPEC_HELP = ("expected '<n>x<device>' (e.g. '8xA100-80GB'; more than a node's worth is split into "
              "nodes of the device's usual size), '<nodes>x<per_node>x<device>' (e.g. '4x8xH100'), "
              "or 'cpu:<n>' (n local CPU ranks on gloo)")
_SPEC_RE = re.compile(r"^(?:(?P<a>[^xX]+)[xX])?(?:(?P<b>[^xX]+)[xX])?(?P<dev>[a-zA-Z][^:]*)$")
_CPU_RE = re.compile(r"^cpu:(?P<n>.+)$", re.IGNORECASE)


def _count(text: str, spec: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"bad device count {text!r} in {spec!r}; {_SPEC_HELP}") from None
    if not value.is_integer() or value <= 0 or not re.fullmatch(r"[+]?\d+", text.strip()):
        raise ValueError(f"device count {text!r} in {spec!r} must be a positive integer; {_SPEC_HELP}")
    return int(value)


def _make_cluster(device: Device, n_nodes: int, per_node: int) -> Cluster:
    return Cluster(device, n_nodes, per_node, intra_link(device), inter_link(device))


def parse_devices(spec: str | Cluster) -> Cluster:
    """Parse "8xA100-80GB", "4x8xH100", "16xA100-80GB" (→ 2 nodes of 8) or "cpu:4"."""
    if isinstance(spec, Cluster):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"cannot parse {spec!r} as a device spec; {_SPEC_HELP}")
    text = "".join(spec.split())
    cpu = _CPU_RE.match(text)
    if cpu:
        n = _count(cpu.group("n"), spec)
        device = get_device(_CPU_DEVICE_NAME)
        link = get_link(CPU_LINK_NAME)
        return Cluster(device, 1, n, link, link)
    match = _SPEC_RE.match(text)
    if match is None:
        raise ValueError(f"cannot parse device spec {spec!r}; {_SPEC_HELP}")
    counts = [_count(c, spec) for c in (match.group("a"), match.group("b")) if c is not None]
    try:
        device = get_device(match.group("dev"))
    except ValueError as err:
        raise ValueError(f"in device spec {spec!r}: {err}") from None
    if len(counts) == 2:
        return _make_cluster(device, counts[0], counts[1])
    n = counts[0] if counts else 1
    if device.per_node is None or n <= device.per_node:
        return _make_cluster(device, 1, n)
    if n % device.per_node:
        raise ValueError(f"{n} x {device.name} does not split into nodes of {device.per_node} "
                         f"in {spec!r}; give the split explicitly, e.g. '<nodes>x<per_node>x{device.name}'")
    return _make_cluster(device, n // device.per_node, device.per_node)


@dataclass(frozen=True)
class Mesh:
    shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    links: tuple[Link, ...]             # per axis: the slowest link its groups cross

    def __post_init__(self):
        if not (len(self.shape) == len(self.axis_names) == len(self.links)):
            raise ValueError(f"mesh shape {self.shape}, axis names {self.axis_names} and "
                             f"{len(self.links)} links must have one entry per axis")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def axis_index(self, axis: int | str) -> int:
        if isinstance(axis, str):
            if axis not in self.axis_names:
                raise ValueError(f"unknown mesh axis {axis!r}; axes: {self.axis_names}")
            return self.axis_names.index(axis)
        if not -self.ndim <= axis < self.ndim:
            raise ValueError(f"mesh axis {axis} out of range for mesh {self}")
        return axis % self.ndim

    def axis_size(self, axis: int | str) -> int:
        return self.shape[self.axis_index(axis)]

    def latency_s(self, axis: int | str) -> float:
        return self.links[self.axis_index(axis)].latency_s

    def bandwidth_bytes_per_s(self, axis: int | str) -> float:
        return self.links[self.axis_index(axis)].bandwidth_bytes_per_s

    def __str__(self) -> str:
        dims = "x".join(str(s) for s in self.shape)
        return f"{dims}({','.join(link.name for link in self.links)})"


def _axis_names(ndim: int) -> tuple[str, ...]:
    return tuple(f"m{i}" for i in range(ndim))


def _ordered_factorisations(n: int, max_dims: int) -> list[tuple[int, ...]]:
    """All ordered tuples of factors > 1 with product n and at most max_dims entries."""
    if n == 1:
        return [()]
    out = []
    if max_dims >= 1:
        out.append((n,))
    if max_dims >= 2:
        for f in range(2, n):
            if n % f == 0:
                out.extend((f, *rest) for rest in _ordered_factorisations(n // f, max_dims - 1))
    return out


def _block_sizes(shape: tuple[int, ...]) -> list[int]:
    return [math.prod(shape[i:]) for i in range(len(shape))]


def mesh_for(shape: tuple[int, ...], cluster: Cluster) -> Mesh | None:
    """The mesh of ``shape`` over ``cluster`` (devices numbered node by node, the last axis
    innermost), each axis on the slowest link its groups cross; None where an axis's groups
    straddle node boundaries unevenly."""
    links = []
    for block in _block_sizes(shape):
        if cluster.per_node % block == 0:
            links.append(cluster.intra_link)
        elif block % cluster.per_node == 0:
            links.append(cluster.inter_link)
        else:
            return None                 # groups straddle node boundaries unevenly
    return Mesh(shape, _axis_names(len(shape)), tuple(links))


def enumerate_meshes(cluster: Cluster | str, max_dims: int = 3) -> list[Mesh]:
    """Every 1..max_dims-D mesh over the cluster (see module docstring), ordered by ndim, then shape."""
    cluster = parse_devices(cluster)
    if max_dims < 1:
        raise ValueError(f"max_dims must be >= 1, got {max_dims}")
    world = cluster.world_size
    if world == 1:
        return [Mesh((1,), _axis_names(1), (cluster.intra_link,))]
    shapes = sorted(_ordered_factorisations(world, max_dims), key=lambda s: (len(s), s))
    meshes = [m for m in (mesh_for(s, cluster) for s in shapes) if m is not None]
    if len(meshes) > MAX_MESHES:
        meshes = [m for m in meshes
                  if all(cluster.per_node % b == 0 for b in _block_sizes(m.shape)[1:])]
    return meshes
