"""The abstract cost graph the Frontier Tracking engine solves.

A DAG of nodes; node ``v`` has ``K_v`` configurations, each with a cost vector
``(time_s, memory_bytes)``; edge ``(u, v)`` has a ``(K_u, K_v, 2)`` table of cost vectors
(re-layout time, and memory if any). Costs add over nodes and edges. No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

N_OBJECTIVES = 2  # (time_s, memory_bytes)


@dataclass(frozen=True)
class CostGraph:
    names: tuple[str, ...]
    node_costs: tuple[np.ndarray, ...]            # node v: (K_v, 2)
    edge_costs: dict[tuple[int, int], np.ndarray]  # (u, v): (K_u, K_v, 2)
    # Identical repeated blocks: node indices of each block, positionally aligned.
    blocks: tuple[tuple[int, ...], ...] = ()

    @staticmethod
    def build(
        nodes: Sequence[tuple[str, np.ndarray]] | Sequence[np.ndarray],
        edges: Iterable[tuple[int, int, np.ndarray]] = (),
        blocks: Sequence[Sequence[int]] = (),
    ) -> "CostGraph":
        """Check and freeze a graph. ``nodes`` are ``(name, costs)`` pairs or bare cost arrays."""
        names: list[str] = []
        costs: list[np.ndarray] = []
        for i, item in enumerate(nodes):
            name, arr = item if isinstance(item, tuple) else (f"n{i}", item)
            arr = np.array(arr, dtype=np.float64)
            if arr.ndim != 2 or arr.shape[1] != N_OBJECTIVES:
                raise ValueError(f"node {name!r}: costs must have shape (K, 2), got {arr.shape}")
            if arr.shape[0] == 0:
                raise ValueError(f"node {name!r}: empty configuration set")
            _check_values(arr, f"node {name!r}")
            arr.setflags(write=False)
            names.append(name)
            costs.append(arr)
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        table: dict[tuple[int, int], np.ndarray] = {}
        checked: set[int] = set()
        for u, v, arr in edges:
            label = f"edge {names[u] if 0 <= u < len(names) else u!r}->{names[v] if 0 <= v < len(names) else v!r}"
            if not (0 <= u < len(names) and 0 <= v < len(names)):
                raise ValueError(f"{label}: endpoint out of range 0..{len(names) - 1}")
            if u == v:
                raise ValueError(f"{label}: self-loop")
            # a read-only float64 table is kept as it is: repeated blocks share one copy
            if not (isinstance(arr, np.ndarray) and arr.dtype == np.float64 and not arr.flags.writeable):
                arr = np.array(arr, dtype=np.float64)
            want = (costs[u].shape[0], costs[v].shape[0], N_OBJECTIVES)
            if arr.shape != want:
                raise ValueError(f"{label}: table shape {arr.shape} does not match (K_u, K_v, 2) = {want}")
            if id(arr) not in checked:
                _check_values(arr, label)
                checked.add(id(arr))
            if (u, v) in table:  # parallel edges: their costs add (OptCNN edge elimination)
                arr = table[(u, v)] + arr
            arr.setflags(write=False)
            table[(u, v)] = arr
        _check_acyclic(names, table)
        graph = CostGraph(tuple(names), tuple(costs), table, tuple(tuple(b) for b in blocks))
        if blocks:
            check_blocks(graph)
        return graph

    @property
    def n_nodes(self) -> int:
        return len(self.names)

    @property
    def n_configs(self) -> tuple[int, ...]:
        return tuple(c.shape[0] for c in self.node_costs)

    @property
    def n_assignments(self) -> int:
        n = 1
        for k in self.n_configs:
            n *= k
        return n

    def cost(self, assignment: Sequence[int]) -> np.ndarray:
        """The (time, memory) of one assignment (configuration index per node): its
        :meth:`terms` added one after another, nodes first, then edges."""
        return total(self.terms(assignment))

    def terms(self, assignment: Sequence[int]) -> np.ndarray:
        """(n_nodes + n_edges, 2): each node's cost, then each edge's, in ``edge_costs``
        order (:attr:`edge_ends`), for one assignment."""
        a = np.asarray(assignment, dtype=np.int64)
        if a.shape != (self.n_nodes,):
            raise ValueError(f"assignment must have {self.n_nodes} entries, got shape {a.shape}")
        padded, flat, k_v, ks = self._gather
        if np.any(a < 0) or np.any(a >= ks):
            raise ValueError("assignment index out of range")
        n = len(self.node_costs)
        out = np.empty((n + len(flat), N_OBJECTIVES))
        out[:n] = padded[np.arange(n), a]
        u, v = self.edge_ends
        at = ((a[u] * k_v + a[v]) * N_OBJECTIVES).tolist()
        out[n:, 0] = [f.item(i) for f, i in zip(flat, at)]
        out[n:, 1] = [f.item(i + 1) for f, i in zip(flat, at)]
        return out

    @cached_property
    def edge_ends(self) -> tuple[np.ndarray, np.ndarray]:
        """The edges' sources and targets, in ``edge_costs`` order."""
        ends = np.array(list(self.edge_costs), dtype=np.int64).reshape(-1, 2)
        return ends[:, 0], ends[:, 1]

    @cached_property
    def _gather(self):
        """Node tables padded into one array; each edge's table as a flat view, and its
        target's configuration count; each node's: what :meth:`terms` reads, without
        copying the edges."""
        k = max((len(c) for c in self.node_costs), default=1)
        padded = np.zeros((len(self.node_costs), k, N_OBJECTIVES))
        for v, c in enumerate(self.node_costs):
            padded[v, :len(c)] = c
        flat = [t.reshape(-1) for t in self.edge_costs.values()]
        k_v = np.array([t.shape[1] for t in self.edge_costs.values()], dtype=np.int64)
        return padded, flat, k_v, np.array(self.n_configs, dtype=np.int64)


def total(terms: np.ndarray) -> np.ndarray:
    """The sum of an assignment's :meth:`CostGraph.terms` (or of any values along their first
    axis), added one after another, so every caller gets the same bits."""
    return np.cumsum(terms, axis=0)[-1] if len(terms) else np.zeros(np.shape(terms)[1:])


def _check_values(arr: np.ndarray, label: str) -> None:
    if np.isnan(arr).any():
        raise ValueError(f"{label}: NaN cost")
    if np.isinf(arr).any():
        raise ValueError(f"{label}: infinite cost (drop the configuration instead)")
    if (arr < 0).any():
        raise ValueError(f"{label}: negative cost")


def _check_acyclic(names: Sequence[str], edges: dict[tuple[int, int], np.ndarray]) -> None:
    succ: dict[int, list[int]] = {}
    indeg = [0] * len(names)
    for u, v in edges:
        succ.setdefault(u, []).append(v)
        indeg[v] += 1
    ready = [v for v in range(len(names)) if indeg[v] == 0]
    seen = 0
    while ready:
        u = ready.pop()
        seen += 1
        for v in succ.get(u, ()):
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if seen != len(names):
        on_cycle = [names[v] for v in range(len(names)) if indeg[v] > 0]
        raise ValueError(f"the graph has a cycle through nodes {on_cycle[:8]}")


def check_blocks(graph: CostGraph) -> None:
    """Raise ValueError unless the declared blocks really are identical copies."""
    blocks = graph.blocks
    if len(blocks) < 2:
        return
    size = len(blocks[0])
    seen: set[int] = set()
    for b, block in enumerate(blocks):
        if len(block) != size or size == 0:
            raise ValueError(f"block {b} has {len(block)} nodes, block 0 has {size}")
        for v in block:
            if not 0 <= v < graph.n_nodes:
                raise ValueError(f"block {b}: node index {v} out of range")
            if v in seen:
                raise ValueError(f"block {b}: node {graph.names[v]!r} is in two blocks")
            seen.add(v)
    for p in range(size):
        ref = graph.node_costs[blocks[0][p]]
        for b, block in enumerate(blocks[1:], 1):
            if not np.array_equal(graph.node_costs[block[p]], ref):
                raise ValueError(
                    f"blocks are not identical: node {graph.names[block[p]]!r} (block {b}) differs "
                    f"from {graph.names[blocks[0][p]]!r} (block 0)"
                )
    where = {v: (b, p) for b, block in enumerate(blocks) for p, v in enumerate(block)}
    inside: dict[tuple[int, int, int], list[np.ndarray]] = {}
    for (u, v), table in graph.edge_costs.items():
        if u in where and v in where:
            (bu, pu), (bv, pv) = where[u], where[v]
            inside.setdefault((bv - bu, pu, pv), []).append((bu, table))
    for (gap, pu, pv), found in inside.items():
        expected = len(blocks) - abs(gap)
        if gap in (0, 1) and len(found) != expected:
            raise ValueError(
                f"blocks are not identical: edge between positions {pu}->{pv} (block gap {gap}) "
                f"appears {len(found)} times, expected {expected}"
            )
        for b, table in found[1:]:
            if not np.array_equal(table, found[0][1]):
                raise ValueError(f"blocks are not identical: edge table at positions {pu}->{pv} differs in block {b}")
