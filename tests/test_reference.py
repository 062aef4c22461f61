"""The reference solvers (brute force, ILP) and the synthetic graph generators."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphs import SHAPES, cost_graphs, random_cost_graph, structure
from tensoropt.engine import reference
from tensoropt.engine.costgraph import CostGraph
from tensoropt.engine.reference import brute_force_frontier, ilp_min_memory, ilp_min_time, pareto_points
from tensoropt.engine.synthetic import (
    TRANSFORMER_BLOCK,
    attention_graph,
    chain_graph,
    diamond_graph,
    random_dag,
    residual_graph,
    transformer_graph,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

point_sets = st.lists(
    st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=0, max_size=40
).map(lambda p: np.array(p, dtype=np.float64).reshape(-1, 2) / 4)


def _dominates_weakly(p: np.ndarray, q: np.ndarray) -> bool:
    return bool(p[0] <= q[0] and p[1] <= q[1])


# ------------------------------------------------------------------- pareto_points


@FAST
@given(point_sets)
def test_pareto_no_point_dominates_another(points):
    front = pareto_points(points)
    assert front.shape[1] == 2
    for i, j in itertools.permutations(range(len(front)), 2):
        assert not _dominates_weakly(front[i], front[j])
    assert np.all(np.diff(front[:, 0]) > 0)
    assert np.all(np.diff(front[:, 1]) < 0)


@FAST
@given(point_sets, st.randoms(use_true_random=False))
def test_pareto_independent_of_input_order(points, rnd):
    perm = list(range(len(points)))
    rnd.shuffle(perm)
    assert np.array_equal(pareto_points(points), pareto_points(points[perm]))


@FAST
@given(point_sets)
def test_pareto_covers_every_input_point(points):
    front = pareto_points(points)
    for q in points:
        assert any(_dominates_weakly(p, q) for p in front)
    # ... and every output point is an input point.
    for p in front:
        assert any(np.array_equal(p, q) for q in points)


def test_pareto_small_cases():
    assert pareto_points(np.zeros((0, 2))).shape == (0, 2)
    pts = np.array([[1, 5], [1, 5], [2, 5], [1, 6], [3, 1], [2, 2], [3, 1]], dtype=float)
    assert np.array_equal(pareto_points(pts), [[1, 5], [2, 2], [3, 1]])


# --------------------------------------------------------------------- brute force


def _hand_graph() -> CostGraph:
    flip = lambda t, m: np.array([[[0, 0], [t, m]], [[t, m], [0, 0]]], dtype=float)  # noqa: E731
    return CostGraph.build(
        [("a", np.array([[1, 4], [2, 1]])), ("b", np.array([[1, 1], [3, 0]])), ("c", np.array([[2, 2], [1, 3]]))],
        [(0, 1, flip(1, 0)), (1, 2, flip(2, 1))],
    )


def test_brute_force_hand_made_graph():
    # Costs of the 8 assignments (a, b, c), by hand:
    #   000 (4,7)  001 (5,9)  010 (9,7)  011 (6,7)
    #   100 (6,4)  101 (7,6)  110 (9,4)  111 (6,4)
    # Frontier: (4,7) by 000 and (6,4) by 100 and 111 -> the lexicographically smaller 100.
    g = _hand_graph()
    points, assignments = brute_force_frontier(g)
    assert np.array_equal(points, [[4, 7], [6, 4]])
    assert np.array_equal(assignments, [[0, 0, 0], [1, 0, 0]])
    assert assignments.dtype == np.int64


def _naive_frontier(g: CostGraph):
    costs = {a: tuple(g.cost(a)) for a in itertools.product(*(range(k) for k in g.n_configs))}
    front = pareto_points(np.array(list(costs.values())))
    best = [min(a for a, c in costs.items() if c == tuple(p)) for p in front]
    return front, np.array(best, dtype=np.int64).reshape(len(front), g.n_nodes)


@FAST
@given(cost_graphs(max_assignments=512))
def test_brute_force_matches_naive_enumeration(g):
    points, assignments = brute_force_frontier(g)
    want_points, want_assign = _naive_frontier(g)
    assert np.array_equal(points, want_points)
    assert np.array_equal(assignments, want_assign)
    for a, p in zip(assignments, points):
        assert np.array_equal(g.cost(a), p)


def test_brute_force_chunked_merge(monkeypatch):
    g = random_cost_graph(3, shape="chain", max_assignments=4096)
    full = brute_force_frontier(g)
    monkeypatch.setattr(reference, "_CHUNK", 7)
    chunked = brute_force_frontier(g)
    assert np.array_equal(full[0], chunked[0]) and np.array_equal(full[1], chunked[1])


def test_brute_force_too_many_assignments():
    g = chain_graph(12, k_range=(4, 4))
    with pytest.raises(ValueError, match="16,777,216"):
        brute_force_frontier(g)
    with pytest.raises(ValueError, match="max_assignments"):
        brute_force_frontier(_hand_graph(), max_assignments=7)


# ----------------------------------------------------------------------------- ILP


def _best_under(points: np.ndarray, budget: float) -> float:
    ok = points[:, 1] <= budget
    return float(points[ok, 0].min())


@pytest.mark.parametrize("seed", range(12))
def test_ilp_min_time_matches_brute_force(seed):
    g = random_cost_graph(seed, shape=SHAPES[seed % len(SHAPES)], max_assignments=4096)
    points, _ = brute_force_frontier(g)
    mems = points[:, 1]
    budgets = list(mems) + list((mems[1:] + mems[:-1]) / 2) + [mems.max() + 10]
    for budget in budgets:
        t, m, a = ilp_min_time(g, budget)
        assert m <= budget
        assert np.array_equal(g.cost(a), [t, m])
        assert t == pytest.approx(_best_under(points, budget), rel=1e-6, abs=1e-9)
    t, m, a = ilp_min_memory(g)
    assert m == pytest.approx(mems.min(), rel=1e-6, abs=1e-9)
    assert np.array_equal(g.cost(a), [t, m])


@pytest.mark.parametrize("builder", [chain_graph, diamond_graph, residual_graph, attention_graph, random_dag])
def test_ilp_on_synthetic_builders(builder):
    g = builder(7, seed=1) if builder in (chain_graph, random_dag) else builder(seed=1)
    points, _ = brute_force_frontier(g)
    for budget in points[:: max(1, len(points) // 4), 1]:
        t, m, _ = ilp_min_time(g, budget)
        assert t == pytest.approx(_best_under(points, budget), rel=1e-6)


def test_ilp_infeasible_budget():
    g = _hand_graph()
    with pytest.raises(ValueError, match="minimum achievable memory is 4"):
        ilp_min_time(g, 3.5)
    t, m, a = ilp_min_time(g, 4.0)
    assert (t, m) == (6.0, 4.0)


def test_ilp_builds_large_graph_fast():
    import time

    g = transformer_graph(96)
    start = time.perf_counter()
    prog = reference._Program(g)
    assert time.perf_counter() - start < 5.0
    assert prog.n_vars == sum(g.n_configs) + sum(t.shape[0] * t.shape[1] for t in g.edge_costs.values())


def test_ilp_small_transformer():
    g = transformer_graph(1, k_range=(1, 2), seed=4)
    points, _ = brute_force_frontier(g)
    for budget in points[[0, len(points) // 2, -1], 1]:
        t, _, _ = ilp_min_time(g, budget)
        assert t == pytest.approx(_best_under(points, budget), rel=1e-6)


# ----------------------------------------------------------------------- synthetic


def _is_acyclic(g: CostGraph) -> bool:
    indeg = [0] * g.n_nodes
    for _, v in g.edge_costs:
        indeg[v] += 1
    ready = [v for v in range(g.n_nodes) if indeg[v] == 0]
    seen = 0
    while ready:
        u = ready.pop()
        seen += 1
        for a, b in g.edge_costs:
            if a == u:
                indeg[b] -= 1
                if indeg[b] == 0:
                    ready.append(b)
    return seen == g.n_nodes


@pytest.mark.parametrize("n_blocks", [1, 2, 5])
def test_transformer_structure(n_blocks):
    g = transformer_graph(n_blocks, seed=7)
    nb = len(TRANSFORMER_BLOCK)
    assert g.n_nodes == nb * n_blocks + 4
    assert len(g.edge_costs) == (14 + 2) * n_blocks + 3
    assert g.names[0] == "embedding" and g.names[-3:] == ("ln_f", "head", "loss")
    assert _is_acyclic(g)
    assert all(8 <= k <= 36 for k in g.n_configs)
    if n_blocks == 1:
        assert g.blocks == ()
        return
    assert len(g.blocks) == n_blocks
    for i, block in enumerate(g.blocks):
        assert [g.names[v] for v in block] == [f"b{i}.{name}" for name, *_ in TRANSFORMER_BLOCK]
        for p, v in enumerate(block):
            assert np.array_equal(g.node_costs[v], g.node_costs[g.blocks[0][p]])
    pos = {v: (b, p) for b, block in enumerate(g.blocks) for p, v in enumerate(block)}
    by_positions: dict[tuple[int, int, int], list[np.ndarray]] = {}
    for (u, v), t in g.edge_costs.items():
        if u in pos and v in pos:
            by_positions.setdefault((pos[v][0] - pos[u][0], pos[u][1], pos[v][1]), []).append(t)
    inter = {k: ts for k, ts in by_positions.items() if k[0] == 1}
    assert set(inter) == {(1, nb - 1, 0), (1, nb - 1, 6)}  # add2 -> ln1, add2 -> add1
    for ts in by_positions.values():
        assert all(np.array_equal(t, ts[0]) for t in ts)
    # Fan-out of ln1 to q, k, v and fan-in of attn.
    b0 = g.blocks[0]
    succ_ln1 = sorted(v for (u, v) in g.edge_costs if u == b0[0])
    assert succ_ln1 == [b0[1], b0[2], b0[3]]
    assert sorted(u for (u, v) in g.edge_costs if v == b0[4]) == [b0[1], b0[2], b0[3]]


def test_transformer_costs_realistic_and_dyadic():
    g = transformer_graph(3, seed=2)
    all_costs = list(g.node_costs) + list(g.edge_costs.values())
    for arr in all_costs:
        assert np.all(arr * 64 == np.round(arr * 64))
        assert np.all(arr >= 0)
    for (u, v), t in g.edge_costs.items():
        assert (t[..., 0] == 0).any(), "some matching layouts cost nothing"
        assert (t[..., 0] > 0).any() or min(g.n_configs[u], g.n_configs[v]) == 1
    assert any((t[..., 1] > 0).any() for t in g.edge_costs.values()), "some edges carry memory"
    # Real trade-off: per node, the fastest configuration is not the leanest (most nodes).
    tradeoff = [np.argmin(c[:, 0]) != np.argmin(c[:, 1]) for c in g.node_costs]
    assert np.mean(tradeoff) > 0.5
    assert all(c.max() < 2000 for c in all_costs)


def test_transformer_deterministic_and_variants():
    a, b = transformer_graph(2, seed=11), transformer_graph(2, seed=11)
    assert a.n_configs == b.n_configs
    assert all(np.array_equal(x, y) for x, y in zip(a.node_costs, b.node_costs))
    assert all(np.array_equal(a.edge_costs[k], b.edge_costs[k]) for k in a.edge_costs)
    c = transformer_graph(3, seed=11, identical_blocks=False)
    assert c.blocks == () and c.n_nodes == 40
    d = transformer_graph(2, seed=11, dyadic=False)
    assert any(np.any(x * 64 != np.round(x * 64)) for x in d.node_costs)


def test_small_builders_shapes():
    assert chain_graph(5).n_nodes == 5 and len(chain_graph(5).edge_costs) == 4
    assert diamond_graph().n_nodes == 4 and len(diamond_graph().edge_costs) == 4
    assert residual_graph(3).n_nodes == 10 and len(residual_graph(3).edge_costs) == 12
    assert attention_graph().n_nodes == 8 and len(attention_graph().edge_costs) == 10
    g = random_dag(8, 0.5, seed=3)
    assert g.n_nodes == 8 and _is_acyclic(g)
    assert all(2 <= k <= 4 for k in g.n_configs)


@pytest.mark.parametrize("shape", SHAPES)
def test_structure_shapes_acyclic(shape):
    n, edges = structure(shape, 2, [True] * 3)
    g = CostGraph.build([np.zeros((1, 2))] * n, [(u, v, np.zeros((1, 1, 2))) for u, v in edges])
    assert _is_acyclic(g)


@settings(max_examples=40, deadline=None)
@given(cost_graphs(max_assignments=256))
def test_cost_graphs_strategy(g):
    assert 2 <= g.n_nodes <= 9
    assert g.n_assignments <= 256
    assert all(1 <= k <= 4 for k in g.n_configs)
    for arr in list(g.node_costs) + list(g.edge_costs.values()):
        assert np.all(arr * 4 == np.round(arr * 4))
