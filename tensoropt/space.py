"""How much of the plan space a search covers: every mesh and assignment, or, on large
clusters, a coarser space that keeps the search time independent of the model's depth.

The coarse space (on by default above ``COARSE_ABOVE`` devices) makes three restrictions,
each the rule large-model practice follows anyway:

* meshes whose axes after the first stay inside a node, so only the outermost axis
  crosses the inter-node network;
* on an axis whose groups cross nodes, operators split the batch or replicate (data
  parallelism and ZeRO go over the network; tensor splits stay on the intra-node links);
* the repeated blocks are tied into at most ``BLOCK_GROUPS`` groups of consecutive blocks
  that share one assignment, recomputation included (``engine.tying``).

Every plan found is priced exactly; the frontier is exact over the restricted space.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .mesh import Cluster, Mesh, enumerate_meshes

__all__ = ["SearchSpace", "COARSE_ABOVE", "BLOCK_GROUPS", "distinct_meshes"]

COARSE_ABOVE = 64
BLOCK_GROUPS = 8


def distinct_meshes(cluster: Cluster, max_dims: int = 3) -> list[Mesh]:
    """Meshes over the cluster, keeping one of each set that differ only by the order of axes
    with the same size and link (their frontiers are identical)."""
    seen, out = set(), []
    for m in enumerate_meshes(cluster, max_dims=max_dims):
        key = tuple(sorted((s, link.name) for s, link in zip(m.shape, m.links)))
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


@dataclass(frozen=True)
class SearchSpace:
    max_mesh_dims: int = 3
    coarse: bool = False

    @staticmethod
    def for_cluster(cluster: Cluster, max_mesh_dims: int = 3, coarse: bool | None = None) -> "SearchSpace":
        if coarse is None:
            coarse = cluster.world_size > COARSE_ABOVE
        return SearchSpace(max_mesh_dims, bool(coarse))

    @property
    def block_groups(self) -> int | None:
        return BLOCK_GROUPS if self.coarse else None

    def meshes(self, cluster: Cluster) -> list[Mesh]:
        meshes = distinct_meshes(cluster, self.max_mesh_dims)
        if self.coarse:
            meshes = [m for m in meshes if not any(self._crosses(m, cluster, a) for a in range(1, m.ndim))]
        return meshes

    def batch_only_axes(self, mesh: Mesh, cluster: Cluster) -> tuple[int, ...]:
        if not self.coarse:
            return ()
        return tuple(a for a in range(mesh.ndim) if self._crosses(mesh, cluster, a))

    @staticmethod
    def _crosses(mesh: Mesh, cluster: Cluster, axis: int) -> bool:
        return cluster.n_nodes > 1 and math.prod(mesh.shape[axis:]) > cluster.per_node

    def describe(self) -> dict:
        return {"max_mesh_dims": self.max_mesh_dims, "coarse": self.coarse,
                "block_groups": self.block_groups}
