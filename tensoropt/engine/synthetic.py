"""Synthetic cost graphs with the structure of real ones, for tests and benchmarks.

Every generator is deterministic given ``seed`` (``np.random.default_rng(seed)``).

Units are "nice" abstract numbers: times look like milliseconds (roughly 0.1 .. 100) and
memories like MiB (roughly 1 .. 1000). The solvers do not care about units.

How configurations are modelled (all generators): every node runs on ``P = 8`` devices.
Configuration ``c`` of a node is a distinct tuple (tensor-parallel degree ``d`` in
{1, 2, 4, 8} — the rest of the devices split the batch —, input layout, output layout,
recompute flag); layouts are small integer labels ("replicated", "shard batch", "shard
hidden", ...). Every node offers the "natural" tuples first (degree ``d`` with layout
``log2 d`` in and out, so whole blocks can run at one degree without re-layouts), then
random other tuples; only activation-heavy nodes (head, loss) offer recomputation.

A node's cost is a deterministic function of ``(d, recompute)``: compute time grows a
little with ``d`` (smaller GEMMs); operators with weights add activation all-reduces over
the tensor-parallel group and gradient all-reduces over the data-parallel group; weights
(with gradients and optimizer state) are sharded over the tensor-parallel group;
recomputation trades activation memory for a second forward pass. Configurations that
differ only in their layouts therefore cost the same on the node and differ only on the
edges. An edge ``(u, v)`` costs a deterministic re-layout time (depending on the pair of
layouts, the pair of degrees and the tensor size; zero where both match); some edges also
carry a memory cost (a staging buffer) on mismatched pairs. The only noise is one time
factor per node (within ±3 %, the same for all its configurations). Frontiers are then
as narrow as real ones: about a dozen points for one transformer block, a few hundred
for 12–24 blocks (exact frontiers still widen with every block), not thousands for one
block as i.i.d. noise per configuration and edge entry made them.

``dyadic=True`` (the default) rounds every time to a multiple of 1/64 and every memory to
a multiple of 1/4 (sizes are whole numbers of bytes; memories never need the fine grid).
All costs are then
dyadic rationals of modest size, so every sum of them is exact in float64 whatever the
order of addition: a solver's frontier can be compared with the brute-force frontier by
exact equality (``np.array_equal``), not up to a tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .costgraph import CostGraph

__all__ = [
    "transformer_graph",
    "chain_graph",
    "diamond_graph",
    "residual_graph",
    "attention_graph",
    "random_dag",
    "dyadic_round",
    "TRANSFORMER_BLOCK",
]

N_LAYOUTS = 4
_DEGREES = np.array([1, 2, 4, 8])
DYADIC_DENOM = 64


def dyadic_round(x: np.ndarray) -> np.ndarray:
    """Round to the nearest multiple of 1/64 (costs stay >= 0)."""
    return np.maximum(np.round(np.asarray(x, dtype=np.float64) * DYADIC_DENOM) / DYADIC_DENOM, 0.0)


@dataclass(frozen=True)
class _Op:
    """One node's configurations: cost table plus the layouts and degrees the edges look at."""
    costs: np.ndarray       # (K, 2)
    in_layout: np.ndarray   # (K,)
    out_layout: np.ndarray  # (K,)
    degree: np.ndarray      # (K,)


N_DEVICES = 8
_RECOMPUTE_MIN_ACT = 100.0  # only the largest activations (head, loss) offer recomputation
_MEMORY_QUANTUM = 0.25      # memories are exact sizes: multiples of 1/4 "MiB"
# Every (degree, in layout, out layout, recompute) tuple a node may offer.
_CONFIG_SPACE = np.array(
    [(d, i, o, r) for d in _DEGREES for i in range(N_LAYOUTS) for o in range(N_LAYOUTS) for r in (0, 1)],
    dtype=np.int64,
)


def _op(rng: np.random.Generator, k: int, compute: float, params: float, act: float, dyadic: bool) -> _Op:
    """A node with ``k`` distinct configurations; ``compute`` ~ time, ``params``/``act`` ~ memory."""
    space = _CONFIG_SPACE if act >= _RECOMPUTE_MIN_ACT else _CONFIG_SPACE[_CONFIG_SPACE[:, 3] == 0]
    if k > len(space):
        raise ValueError(f"at most {len(space)} configurations for this node, asked for {k}")
    # The "natural" configurations come first: degree d with layout log2(d) in and out (the
    # layouts every node offers, so whole blocks can run at one degree without re-layouts),
    # then random other tuples.
    natural = (space[:, 1] == np.log2(space[:, 0])) & (space[:, 2] == space[:, 1])
    first = np.flatnonzero(natural)[:k]
    rest = np.flatnonzero(~natural)
    pick = np.concatenate([first, rng.choice(rest, size=k - len(first), replace=False)])
    deg, in_l, out_l, recompute = space[pick].T
    dp = N_DEVICES // deg
    log_d = np.log2(deg)
    compute_s = compute / N_DEVICES * (1.0 + 0.08 * log_d) * (1.0 + 0.35 * recompute)
    # Only operators with weights need collectives: activation all-reduces over the
    # tensor-parallel group, gradient all-reduces over the data-parallel group.
    has_weights = params > 0
    tp_comm_s = 0.12 * act * (deg - 1) / deg * has_weights
    dp_comm_s = 0.03 * params / deg * (dp - 1) / dp
    time = compute_s + tp_comm_s + dp_comm_s
    # Weights (with gradients and optimizer state) are sharded over the tensor-parallel group;
    # saved activations are split over all devices either way (batch or hidden), a little
    # replicated under tensor parallelism, and shrink with recomputation.
    memory = 2.0 * params / deg + act / N_DEVICES * np.where(recompute == 1, 0.25, 1.0) * (1.0 - 0.05 * log_d)
    time = time * rng.uniform(0.97, 1.03)  # per node: the same on every configuration
    costs = np.stack([time, memory], axis=1)
    if dyadic:
        costs = dyadic_round(costs)
        costs[:, 1] = _MEMORY_QUANTUM * np.round(costs[:, 1] / _MEMORY_QUANTUM)
    return _Op(costs, in_l, out_l, deg)


def _relayout_matrix(rng: np.random.Generator) -> np.ndarray:
    """Per (output layout, input layout) re-layout time factor; zero on the diagonal."""
    f = rng.uniform(0.2, 1.0, size=(N_LAYOUTS, N_LAYOUTS))
    np.fill_diagonal(f, 0.0)
    return f


def _edge(
    rng: np.random.Generator, src: _Op, dst: _Op, size: float, relayout: np.ndarray, dyadic: bool,
    memory_prob: float = 0.3,
) -> np.ndarray:
    """Edge table: zero where layouts and degrees match, a deterministic re-layout time elsewhere."""
    lu, lv = src.out_layout[:, None], dst.in_layout[None, :]
    du, dv = np.log2(src.degree)[:, None], np.log2(dst.degree)[None, :]
    reshard = 3.0 * np.abs(du - dv)
    time = size * (relayout[lu, lv] + reshard) / N_DEVICES
    mismatch = time > 0
    memory = np.zeros_like(time)
    if rng.random() < memory_prob:
        memory = np.where(mismatch, 0.25 * size * (1.0 + relayout[lu, lv]), 0.0)
    table = np.stack([time, memory], axis=-1)
    if dyadic:
        table = dyadic_round(table)
    return table


def _ks(rng: np.random.Generator, k_range: tuple[int, int], n: int) -> np.ndarray:
    lo, hi = int(k_range[0]), int(k_range[1])
    if lo < 1 or hi < lo:
        raise ValueError(f"k_range must satisfy 1 <= lo <= hi, got {k_range}")
    return rng.integers(lo, hi + 1, size=n)


# ---------------------------------------------------------------------- transformer

# Positional order of one block's nodes: (name, compute, params, act).
TRANSFORMER_BLOCK: tuple[tuple[str, float, float, float], ...] = (
    ("ln1", 1.0, 0.5, 16.0),
    ("q", 8.0, 32.0, 16.0),
    ("k", 8.0, 32.0, 16.0),
    ("v", 8.0, 32.0, 16.0),
    ("attn", 24.0, 0.0, 64.0),
    ("o_proj", 8.0, 32.0, 16.0),
    ("add1", 0.5, 0.0, 16.0),
    ("ln2", 1.0, 0.5, 16.0),
    ("fc1", 32.0, 128.0, 64.0),
    ("act", 2.0, 0.0, 64.0),
    ("fc2", 32.0, 128.0, 16.0),
    ("add2", 0.5, 0.0, 16.0),
)
# Intra-block edges by position, with the tensor size that flows along them.
_BLOCK_EDGES: tuple[tuple[int, int, float], ...] = (
    (0, 1, 16.0), (0, 2, 16.0), (0, 3, 16.0),   # ln1 -> q, k, v
    (1, 4, 16.0), (2, 4, 16.0), (3, 4, 16.0),   # q, k, v -> attn
    (4, 5, 16.0), (5, 6, 16.0),                  # attn -> o_proj -> add1
    (6, 7, 16.0), (7, 8, 16.0), (8, 9, 64.0),    # add1 -> ln2 -> fc1 -> act
    (9, 10, 64.0), (10, 11, 16.0),               # act -> fc2 -> add2
    (6, 11, 16.0),                               # residual add1 -> add2
)
_BLOCK_IN = (0, 6)  # positions fed by the block input (ln1, and the residual into add1)
_BLOCK_OUT = 11     # add2


def transformer_graph(
    n_blocks: int,
    k_range: tuple[int, int] = (8, 36),
    seed: int = 0,
    identical_blocks: bool = True,
    dyadic: bool = True,
) -> CostGraph:
    """A pre-LN transformer-shaped cost graph.

    ``embedding -> n_blocks x [ln1 -> q, k, v -> attn -> o_proj -> add1 -> ln2 -> fc1 ->
    act -> fc2 -> add2] -> ln_f -> head -> loss``, where ``ln1`` fans out to ``q, k, v``,
    ``attn`` fans in from them, ``add1`` also takes the block input (residual) and ``add2``
    also takes ``add1`` (residual). Node indices: ``embedding`` is 0, block ``i`` occupies
    ``1 + 12 i .. 12 + 12 i`` in :data:`TRANSFORMER_BLOCK` order, then ``ln_f, head, loss``.
    ``n_nodes == 12 * n_blocks + 4``.

    Configuration counts are drawn from ``k_range`` (inclusive). With ``identical_blocks``
    every block reuses the same node and edge tables (including the inter-block edges
    ``add2_i -> ln1_{i+1}`` and ``add2_i -> add1_{i+1}``) and the graph declares
    ``blocks=`` with each block's node indices in positional order.
    """
    if n_blocks < 1:
        raise ValueError("n_blocks must be >= 1")
    rng = np.random.default_rng(seed)
    relayout = _relayout_matrix(rng)
    nb = len(TRANSFORMER_BLOCK)

    def make_block_ops() -> list[_Op]:
        ks = _ks(rng, k_range, nb)
        return [_op(rng, int(k), c, p, a, dyadic) for k, (_, c, p, a) in zip(ks, TRANSFORMER_BLOCK)]

    def make_block_edges(ops: list[_Op]) -> list[np.ndarray]:
        return [_edge(rng, ops[a], ops[b], s, relayout, dyadic) for a, b, s in _BLOCK_EDGES]

    k_outer = _ks(rng, k_range, 4)
    embed = _op(rng, int(k_outer[0]), 4.0, 256.0, 16.0, dyadic)
    ln_f = _op(rng, int(k_outer[1]), 1.0, 0.5, 16.0, dyadic)
    head = _op(rng, int(k_outer[2]), 32.0, 256.0, 128.0, dyadic)
    loss = _op(rng, int(k_outer[3]), 4.0, 0.0, 128.0, dyadic)

    block_ops: list[list[_Op]] = []
    block_edges: list[list[np.ndarray]] = []
    if identical_blocks:
        ops0 = make_block_ops()
        edges0 = make_block_edges(ops0)
        # Inter-block edges (identical for every i): add2_i -> ln1_{i+1}, add2_i -> add1_{i+1}.
        inter = [_edge(rng, ops0[_BLOCK_OUT], ops0[p], 16.0, relayout, dyadic) for p in _BLOCK_IN]
        block_ops = [ops0] * n_blocks
        block_edges = [edges0] * n_blocks
    else:
        for _ in range(n_blocks):
            ops = make_block_ops()
            block_ops.append(ops)
            block_edges.append(make_block_edges(ops))

    nodes: list[tuple[str, np.ndarray]] = [("embedding", embed.costs)]
    edges: list[tuple[int, int, np.ndarray]] = []
    blocks: list[tuple[int, ...]] = []
    prev_out, prev_op = 0, embed
    for i in range(n_blocks):
        base = len(nodes)
        idx = tuple(base + p for p in range(nb))
        blocks.append(idx)
        nodes += [(f"b{i}.{name}", op.costs) for (name, *_), op in zip(TRANSFORMER_BLOCK, block_ops[i])]
        edges += [(idx[a], idx[b], t) for (a, b, _), t in zip(_BLOCK_EDGES, block_edges[i])]
        for j, p in enumerate(_BLOCK_IN):
            if i > 0 and identical_blocks:
                t = inter[j]
            else:
                t = _edge(rng, prev_op, block_ops[i][p], 16.0, relayout, dyadic)
            edges.append((prev_out, idx[p], t))
        prev_out, prev_op = idx[_BLOCK_OUT], block_ops[i][_BLOCK_OUT]
    n_lnf = len(nodes)
    nodes += [("ln_f", ln_f.costs), ("head", head.costs), ("loss", loss.costs)]
    edges.append((prev_out, n_lnf, _edge(rng, prev_op, ln_f, 16.0, relayout, dyadic)))
    edges.append((n_lnf, n_lnf + 1, _edge(rng, ln_f, head, 16.0, relayout, dyadic)))
    edges.append((n_lnf + 1, n_lnf + 2, _edge(rng, head, loss, 128.0, relayout, dyadic)))
    return CostGraph.build(nodes, edges, blocks=blocks if identical_blocks and n_blocks > 1 else ())


# ------------------------------------------------------------------- small builders


def _from_structure(
    names: list[str],
    edge_list: list[tuple[int, int]],
    k_range: tuple[int, int],
    seed: int,
    dyadic: bool,
) -> CostGraph:
    rng = np.random.default_rng(seed)
    relayout = _relayout_matrix(rng)
    ks = _ks(rng, k_range, len(names))
    ops = []
    for k in ks:
        compute = float(rng.choice([1.0, 2.0, 4.0, 8.0, 16.0]))
        params = float(rng.choice([0.0, 4.0, 16.0, 64.0]))
        act = float(rng.choice([4.0, 16.0, 32.0]))
        ops.append(_op(rng, int(k), compute, params, act, dyadic))
    edges = [
        (u, v, _edge(rng, ops[u], ops[v], float(rng.choice([4.0, 8.0, 16.0])), relayout, dyadic))
        for u, v in edge_list
    ]
    return CostGraph.build(list(zip(names, (op.costs for op in ops))), edges)


def chain_graph(n_nodes: int, k_range: tuple[int, int] = (2, 4), seed: int = 0, dyadic: bool = True) -> CostGraph:
    """``n0 -> n1 -> ... -> n{n-1}``."""
    names = [f"n{i}" for i in range(n_nodes)]
    return _from_structure(names, [(i, i + 1) for i in range(n_nodes - 1)], k_range, seed, dyadic)


def diamond_graph(k_range: tuple[int, int] = (2, 4), seed: int = 0, dyadic: bool = True) -> CostGraph:
    """``src -> a, src -> b, a -> sink, b -> sink``."""
    return _from_structure(["src", "a", "b", "sink"], [(0, 1), (0, 2), (1, 3), (2, 3)], k_range, seed, dyadic)


def residual_graph(
    n_blocks: int = 2, k_range: tuple[int, int] = (2, 4), seed: int = 0, dyadic: bool = True
) -> CostGraph:
    """``in -> [f -> g -> add, with a skip edge block-input -> add] x n_blocks``.

    ``n_nodes == 1 + 3 * n_blocks``.
    """
    names = ["in"]
    edges: list[tuple[int, int]] = []
    prev = 0
    for i in range(n_blocks):
        f, g, add = len(names), len(names) + 1, len(names) + 2
        names += [f"b{i}.f", f"b{i}.g", f"b{i}.add"]
        edges += [(prev, f), (f, g), (g, add), (prev, add)]
        prev = add
    return _from_structure(names, edges, k_range, seed, dyadic)


def attention_graph(k_range: tuple[int, int] = (2, 4), seed: int = 0, dyadic: bool = True) -> CostGraph:
    """``x -> ln -> q, k, v -> attn -> o -> add``, plus the residual ``x -> add`` (8 nodes)."""
    names = ["x", "ln", "q", "k", "v", "attn", "o", "add"]
    edges = [(0, 1), (1, 2), (1, 3), (1, 4), (2, 5), (3, 5), (4, 5), (5, 6), (6, 7), (0, 7)]
    return _from_structure(names, edges, k_range, seed, dyadic)


def random_dag(
    n_nodes: int, edge_prob: float = 0.3, k_range: tuple[int, int] = (2, 4), seed: int = 0, dyadic: bool = True
) -> CostGraph:
    """A random DAG: each pair ``i < j`` is an edge ``i -> j`` with probability ``edge_prob``."""
    rng = np.random.default_rng(seed)
    edges = [(i, j) for i in range(n_nodes) for j in range(i + 1, n_nodes) if rng.random() < edge_prob]
    return _from_structure([f"n{i}" for i in range(n_nodes)], edges, k_range, int(rng.integers(2**31)), dyadic)
