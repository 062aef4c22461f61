"""Small cost graphs for tests: hypothesis strategies and plain seeded generators.

``from graphs import cost_graphs, random_cost_graph, chain_graph, ...`` (tests/conftest.py
puts this directory on sys.path).

All costs are dyadic (multiples of 1/4 on nodes and edges, small magnitudes), so every
sum is exact in float64 and frontiers can be compared with ``np.array_equal``. Costs are
drawn from a small grid on purpose: that produces ties (equal times, equal memories,
equal points), and some configurations are made deliberately dominated by, or exact
duplicates of, another configuration of the same node.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import strategies as st

from tensoropt.engine.costgraph import CostGraph
from tensoropt.engine.synthetic import (  # re-exported plain builders
    attention_graph,
    chain_graph,
    diamond_graph,
    dyadic_round,
    random_dag,
    residual_graph,
    transformer_graph,
)

__all__ = [
    "SHAPES",
    "block_graphs",
    "cost_graphs",
    "random_cost_graph",
    "structure",
    "attention_graph",
    "chain_graph",
    "diamond_graph",
    "dyadic_round",
    "random_dag",
    "residual_graph",
    "transformer_graph",
]

SHAPES = ("chain", "diamond", "residual", "attention", "dag")
_GRID = 4.0  # costs are multiples of 1/_GRID


def structure(shape: str, size: int, dag_edges: Sequence[bool] = ()) -> tuple[int, list[tuple[int, int]]]:
    """``(n_nodes, edges)`` of a shape. ``size`` picks the variant:

    chain: ``size`` nodes (2..9); diamond: ``size`` stacked diamonds (1..2, 4 or 7 nodes);
    residual: ``size`` residual blocks (1..2, 4 or 7 nodes); attention: ``size`` 0 is the
    8-node ln/q/k/v/attn/o/add block with residual, 1 drops the ln (7 nodes); dag: ``size``
    nodes, pair ``i < j`` (row-major) is an edge where ``dag_edges`` says so.
    """
    if shape == "chain":
        return size, [(i, i + 1) for i in range(size - 1)]
    if shape == "diamond":
        edges, top = [], 0
        for _ in range(size):
            a, b, sink = top + 1, top + 2, top + 3
            edges += [(top, a), (top, b), (a, sink), (b, sink)]
            top = sink
        return top + 1, edges
    if shape == "residual":
        edges, prev, n = [], 0, 1
        for _ in range(size):
            f, g, add = n, n + 1, n + 2
            edges += [(prev, f), (f, g), (g, add), (prev, add)]
            prev, n = add, n + 3
        return n, edges
    if shape == "attention":
        if size == 0:  # x, ln, q, k, v, attn, o, add
            return 8, [(0, 1), (1, 2), (1, 3), (1, 4), (2, 5), (3, 5), (4, 5), (5, 6), (6, 7), (0, 7)]
        # x, q, k, v, attn, o, add
        return 7, [(0, 1), (0, 2), (0, 3), (1, 4), (2, 4), (3, 4), (4, 5), (5, 6), (0, 6)]
    if shape == "dag":
        pairs = [(i, j) for i in range(size) for j in range(i + 1, size)]
        return size, [p for p, on in zip(pairs, dag_edges) if on]
    raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")


def _fit_ks(ks: list[int], max_assignments: int) -> list[int]:
    ks = list(ks)
    while int(np.prod(ks, dtype=object)) > max_assignments:
        i = int(np.argmax(ks))
        if ks[i] == 1:
            break
        ks[i] -= 1
    return ks


def _node_table(raw: np.ndarray, kinds: Sequence[int], sources: Sequence[int]) -> np.ndarray:
    """``raw`` (K, 2) grid integers. kind 0: fresh; 1: dominated copy of an earlier
    configuration (raw added on top); 2: exact duplicate of an earlier configuration."""
    table = raw.astype(np.float64).copy()
    for c in range(1, table.shape[0]):
        src = sources[c] % c
        if kinds[c] == 1:
            table[c] = table[src] + raw[c] % 3  # weakly dominated (increment may be 0 in one coord)
        elif kinds[c] == 2:
            table[c] = table[src]
    return table / _GRID


def _edge_table(raw: np.ndarray, zero_mask: np.ndarray, with_memory: bool) -> np.ndarray:
    """``raw`` (Ku, Kv, 2): re-layout time where ``zero_mask`` is False, memory only if asked."""
    table = raw.astype(np.float64).copy()
    table[zero_mask] = 0.0
    if not with_memory:
        table[..., 1] = 0.0
    return table / _GRID


def _build(n: int, edges: list[tuple[int, int]], nodes: list[np.ndarray], tables: list[np.ndarray]) -> CostGraph:
    return CostGraph.build([(f"n{i}", t) for i, t in enumerate(nodes)], [(u, v, t) for (u, v), t in zip(edges, tables)])


@st.composite
def cost_graphs(
    draw,
    max_assignments: int = 4096,
    shapes: Sequence[str] = SHAPES,
    max_k: int = 4,
    max_cost: int = 24,
) -> CostGraph:
    """Small dyadic cost graphs (2..9 nodes, 1..``max_k`` configurations per node, at most
    ``max_assignments`` assignments) of the given ``shapes``."""
    shape = draw(st.sampled_from(tuple(shapes)))
    dag_edges: list[bool] = []
    if shape == "chain":
        size = draw(st.integers(2, 9))
    elif shape in ("diamond", "residual"):
        size = draw(st.integers(1, 2))
    elif shape == "attention":
        size = draw(st.integers(0, 1))
    else:
        size = draw(st.integers(2, 7))
        dag_edges = draw(st.lists(st.booleans(), min_size=size * (size - 1) // 2, max_size=size * (size - 1) // 2))
    n, edges = structure(shape, size, dag_edges)
    ks = _fit_ks(draw(st.lists(st.integers(1, max_k), min_size=n, max_size=n)), max_assignments)

    nodes = []
    for k in ks:
        raw = np.array(draw(st.lists(st.integers(0, max_cost), min_size=2 * k, max_size=2 * k))).reshape(k, 2)
        kinds = draw(st.lists(st.sampled_from((0, 0, 1, 2)), min_size=k, max_size=k))
        sources = draw(st.lists(st.integers(0, max_k), min_size=k, max_size=k))
        nodes.append(_node_table(raw, kinds, sources))
    tables = []
    for u, v in edges:
        size_uv = ks[u] * ks[v]
        raw = np.array(draw(st.lists(st.integers(1, max_cost // 2), min_size=2 * size_uv, max_size=2 * size_uv)))
        zero = np.array(draw(st.lists(st.booleans(), min_size=size_uv, max_size=size_uv)), dtype=bool)
        with_memory = draw(st.booleans())
        tables.append(_edge_table(raw.reshape(ks[u], ks[v], 2), zero.reshape(ks[u], ks[v]), with_memory))
    return _build(n, edges, nodes, tables)


def random_cost_graph(
    seed: int,
    shape: str | None = None,
    max_assignments: int = 4096,
    max_k: int = 4,
    max_cost: int = 24,
) -> CostGraph:
    """The plain (numpy-seeded) counterpart of :func:`cost_graphs`, for loops and benchmarks."""
    rng = np.random.default_rng(seed)
    shape = shape or str(rng.choice(SHAPES))
    dag_edges: list[bool] = []
    size = {
        "chain": lambda: int(rng.integers(2, 10)),
        "diamond": lambda: int(rng.integers(1, 3)),
        "residual": lambda: int(rng.integers(1, 3)),
        "attention": lambda: int(rng.integers(0, 2)),
        "dag": lambda: int(rng.integers(2, 8)),
    }[shape]()
    if shape == "dag":
        dag_edges = list(rng.random(size * (size - 1) // 2) < 0.4)
    n, edges = structure(shape, size, dag_edges)
    ks = _fit_ks(list(rng.integers(1, max_k + 1, size=n)), max_assignments)
    nodes = [
        _node_table(rng.integers(0, max_cost + 1, size=(k, 2)), rng.choice([0, 0, 1, 2], size=k), rng.integers(0, max_k + 1, size=k))
        for k in ks
    ]
    tables = [
        _edge_table(
            rng.integers(1, max_cost // 2 + 1, size=(ks[u], ks[v], 2)),
            rng.random((ks[u], ks[v])) < 0.5,
            bool(rng.random() < 0.5),
        )
        for u, v in edges
    ]
    return _build(n, edges, nodes, tables)


@st.composite
def block_graphs(draw, max_k: int = 3, max_blocks: int = 5, max_cost: int = 24) -> CostGraph:
    """Graphs of ``L`` identical blocks (declared with ``blocks=``) between a source node and
    a sink node: ``src -> block_0 -> ... -> block_{L-1} -> sink``.

    A block has 2..4 nodes with random forward edges inside; random edges go from the
    block's exit positions to positions of the next block; ``src`` feeds block 0, the
    last block's exits feed ``sink``, and sometimes ``src -> sink`` joins the two ends
    directly (then the prefix and suffix of the chain are not independent).
    """
    size = draw(st.integers(2, 4))
    n_blocks = draw(st.integers(2, max_blocks))
    inner = [(a, b) for a in range(size) for b in range(a + 1, size) if draw(st.booleans())]
    exits = sorted(draw(st.sets(st.integers(0, size - 1), min_size=1, max_size=2)))
    inter = [(a, draw(st.integers(0, size - 1))) for a in exits]
    ks = draw(st.lists(st.integers(1, max_k), min_size=size + 2, max_size=size + 2))

    def node_table(k):
        raw = np.array(draw(st.lists(st.integers(0, max_cost), min_size=2 * k, max_size=2 * k))).reshape(k, 2)
        return raw / _GRID

    def edge_table(ku, kv):
        raw = np.array(draw(st.lists(st.integers(0, max_cost // 2), min_size=2 * ku * kv, max_size=2 * ku * kv)))
        return raw.reshape(ku, kv, 2) / _GRID

    block_ks = ks[:size]
    block_nodes = [node_table(k) for k in block_ks]
    inner_tables = [edge_table(block_ks[a], block_ks[b]) for a, b in inner]
    inter_tables = [edge_table(block_ks[a], block_ks[b]) for a, b in inter]
    k_src, k_sink = ks[size], ks[size + 1]
    nodes = [("src", node_table(k_src))]
    edges = []
    blocks = []
    for i in range(n_blocks):
        base = len(nodes)
        blocks.append(tuple(base + p for p in range(size)))
        nodes += [(f"b{i}.{p}", block_nodes[p]) for p in range(size)]
        edges += [(base + a, base + b, t) for (a, b), t in zip(inner, inner_tables)]
        if i == 0:
            edges.append((0, base, edge_table(k_src, block_ks[0])))
        else:
            prev = blocks[i - 1]
            edges += [(prev[a], base + b, t) for (a, b), t in zip(inter, inter_tables)]
    sink = len(nodes)
    nodes.append(("sink", node_table(k_sink)))
    edges += [(blocks[-1][a], sink, edge_table(block_ks[a], k_sink)) for a in exits]
    if draw(st.booleans()):
        edges.append((0, sink, edge_table(k_src, k_sink)))
    return CostGraph.build(nodes, edges, blocks=blocks)
