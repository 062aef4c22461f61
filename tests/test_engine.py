"""The Frontier Tracking engine against brute force, the ILP, and its own invariants."""

from __future__ import annotations

import importlib
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphs import block_graphs, cost_graphs, random_cost_graph
from tensoropt.engine import CostGraph, SolveResult, SolveTimeout, choice, covers, pareto, series_sum, solve
from tensoropt.engine.reference import brute_force_frontier, ilp_min_time
from tensoropt.engine.synthetic import (
    attention_graph,
    chain_graph,
    diamond_graph,
    random_dag,
    residual_graph,
    transformer_graph,
)

# ``tensoropt.engine.pareto`` the attribute is the function; the module is this.
pareto_mod = importlib.import_module("tensoropt.engine.pareto")

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same_frontier(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, f"{len(got)} points, expected {len(want)}"
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)


def assert_assignments_exact(g: CostGraph, result: SolveResult) -> None:
    assert result.assignments.shape == (len(result.points), g.n_nodes)
    for a, p in zip(result.assignments, result.points):
        np.testing.assert_allclose(g.cost(a), p, rtol=1e-9, atol=0)


def assert_frontier_shape(points: np.ndarray) -> None:
    assert np.all(np.diff(points[:, 0]) > 0), "time strictly ascending"
    assert np.all(np.diff(points[:, 1]) < 0), "memory strictly descending"


# ------------------------------------------------------------------ exact vs brute force


@SETTINGS
@given(cost_graphs(max_assignments=4096))
def test_exact_frontier_equals_brute_force(g):
    result = solve(g)
    want, _ = brute_force_frontier(g)
    assert_same_frontier(result.points, want)
    assert_assignments_exact(g, result)
    assert_frontier_shape(result.points)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost_graphs(max_assignments=100_000, max_k=6, shapes=("dag", "attention", "residual")))
def test_exact_frontier_equals_brute_force_wider(g):
    result = solve(g)
    want, _ = brute_force_frontier(g)
    assert_same_frontier(result.points, want)
    assert_assignments_exact(g, result)


@pytest.mark.parametrize(
    "g",
    [
        chain_graph(10, k_range=(3, 4), seed=5),            # ~10^6 assignments
        residual_graph(3, k_range=(3, 4), seed=2),
        attention_graph(k_range=(5, 6), seed=1),
        random_dag(9, 0.45, k_range=(3, 5), seed=7),
        transformer_graph(1, k_range=(2, 3), seed=3),
    ],
    ids=["chain10", "residual3", "attention", "dag9", "transformer1"],
)
def test_exact_frontier_equals_brute_force_large(g):
    assert g.n_assignments <= 2_000_000
    result = solve(g)
    want, _ = brute_force_frontier(g)
    assert_same_frontier(result.points, want)
    assert_assignments_exact(g, result)


@pytest.mark.parametrize("seed", range(6))
def test_diamond_and_plain_graphs(seed):
    for g in (diamond_graph(seed=seed), random_cost_graph(seed, max_assignments=8192, max_k=5)):
        result = solve(g)
        assert_same_frontier(result.points, brute_force_frontier(g)[0])
        assert_assignments_exact(g, result)


def test_without_dominance_dropping():
    g = random_cost_graph(11, shape="dag", max_assignments=4096)
    a, b = solve(g), solve(g, drop_dominated=False)
    assert_same_frontier(a.points, b.points)
    assert_assignments_exact(g, b)


# -------------------------------------------------------------------- pareto primitives

point_sets = st.lists(st.tuples(st.integers(0, 16), st.integers(0, 16)), min_size=1, max_size=60).map(
    lambda p: np.array(p, dtype=np.float64) / 4
)


@SETTINGS
@given(point_sets)
def test_pareto_no_point_dominates_another(points):
    front = pareto(points)
    for i, j in itertools.permutations(range(len(front)), 2):
        assert not (front[i, 0] <= front[j, 0] and front[i, 1] <= front[j, 1])
    assert_frontier_shape(front)
    for q in points:  # every input point is weakly dominated by a kept one
        assert np.any((front[:, 0] <= q[0]) & (front[:, 1] <= q[1]))


@SETTINGS
@given(point_sets, st.randoms(use_true_random=False))
def test_pareto_order_irrelevant(points, rnd):
    perm = list(range(len(points)))
    rnd.shuffle(perm)
    assert np.array_equal(pareto(points), pareto(points[perm]))


@SETTINGS
@given(point_sets, point_sets)
def test_series_sum_and_choice(a, b):
    zero = np.zeros((1, 2))
    assert np.array_equal(series_sum(pareto(a), zero), pareto(a))
    assert np.array_equal(choice(a, a), pareto(a))
    assert np.array_equal(choice(pareto(a)), pareto(a))
    assert np.array_equal(series_sum(a, b), series_sum(b, a))
    assert np.array_equal(choice(a, b), choice(b, a))
    brute = pareto(np.array([p + q for p in a for q in b]))
    assert np.array_equal(series_sum(a, b), brute)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 700),
    st.integers(1, 40),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0.0, 0.25, 1.0]),
)
def test_prune_rows_matches_per_row_reference(rows, width, levels, seed, ratio):
    # Wide rows go through the staircase prefilter; ties in time and memory are common.
    rng = np.random.default_rng(seed)
    t = rng.integers(0, levels, size=(rows, width)).astype(np.float64) / 4
    m = rng.integers(1, levels + 1, size=(rows, width)).astype(np.float64) / 4
    t[rng.random((rows, width)) < 0.05] = np.inf
    out_t, out_m, src = pareto_mod.prune_rows(t, m, ratio)
    for r in range(rows):
        ok = src[r] >= 0
        assert np.array_equal(out_t[r, ok], t[r, src[r, ok]])
        assert np.array_equal(out_m[r, ok], m[r, src[r, ok]])
        finite = np.isfinite(t[r])
        exact = pareto(np.stack([t[r, finite], m[r, finite]], axis=1))
        got = np.stack([out_t[r, ok], out_m[r, ok]], axis=1)
        if ratio == 0:
            assert np.array_equal(got, exact)
            # among equal points the lowest column is kept
            for c, (pt, pm) in zip(src[r, ok], got):
                assert c == np.flatnonzero((t[r] == pt) & (m[r] == pm))[0]
        else:
            # every exact point has a kept point no slower and less than (1 + ratio) times heavier
            ok_cover = (got[None, :, 0] <= exact[:, None, 0]) & (
                got[None, :, 1] < exact[:, None, 1] * (1 + ratio) * (1 + 1e-12))
            assert ok_cover.any(axis=1).all()
            assert_frontier_shape(got)


# ----------------------------------------------------------------------------- blocks


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block_graphs())
def test_blocks_same_frontier(g):
    with_blocks = solve(g)
    assert with_blocks.stats["used_blocks"]
    without = solve(g, use_blocks=False)
    assert_same_frontier(with_blocks.points, without.points)
    assert_assignments_exact(g, with_blocks)
    if g.n_assignments <= 200_000:
        assert_same_frontier(with_blocks.points, brute_force_frontier(g)[0])


@pytest.mark.parametrize("n_blocks", [2, 3, 6])
def test_transformer_blocks_same_frontier(n_blocks):
    g = transformer_graph(n_blocks, k_range=(3, 6), seed=n_blocks)
    a, b = solve(g), solve(g, use_blocks=False)
    assert a.stats["used_blocks"] and not b.stats["used_blocks"]
    assert_same_frontier(a.points, b.points)
    assert_assignments_exact(g, a)


def _with_worse_copies(g: CostGraph, extra: float = 1.0) -> CostGraph:
    """``g`` with one more configuration per node, put first: a copy of its first that costs
    ``extra`` more in both objectives (so, in the repeated blocks, a dominated exit of every
    block, whose dropping shifts the indices of the others)."""
    nodes = [np.vstack([c[:1] + extra, c]) for c in g.node_costs]
    edges = []
    for (u, v), t in g.edge_costs.items():
        t = np.concatenate([t[:1], t], axis=0)
        edges.append((u, v, np.concatenate([t[:, :1], t], axis=1)))
    return CostGraph.build(list(zip(g.names, nodes)), edges, blocks=g.blocks)


@pytest.mark.parametrize("n_blocks, seed", [(2, 0), (3, 1), (6, 2), (4, 5)])
def test_dominated_chain_exits_are_dropped_and_the_frontier_kept(n_blocks, seed):
    g = transformer_graph(n_blocks, k_range=(3, 5), seed=seed)
    worse = _with_worse_copies(g)
    # node-level dominance off, so the chain's own exit dominance has the copies to drop
    res = solve(worse, drop_dominated=False)
    kept, exits = res.stats["chain_exits"]
    assert kept < exits
    assert_same_frontier(res.points, solve(g, use_blocks=False).points)
    assert_assignments_exact(worse, res)


def _kept_one_node_at_a_time(g: CostGraph) -> list[np.ndarray]:
    """``dominated_free_configs`` without sharing masks between like nodes: each node's mask
    computed on its own, the blocks' positions joined, sweeps until nothing changes."""
    from tensoropt.engine.dominance import _dominated_mask

    kept = [np.arange(k) for k in g.n_configs]
    incident = {v: [] for v in range(g.n_nodes)}
    for (u, v) in g.edge_costs:
        incident[u].append(((u, v), 0))
        incident[v].append(((u, v), 1))
    for _ in range(8):
        masks = [_dominated_mask(g, v, kept, incident[v]) for v in range(g.n_nodes)]
        for pos in range(len(g.blocks[0]) if g.blocks else 0):
            joint = np.logical_and.reduce([masks[b[pos]] for b in g.blocks])
            for b in g.blocks:
                masks[b[pos]] = joint
        if not any(m.any() for m in masks):
            break
        kept = [k[~m] for k, m in zip(kept, masks)]
    return kept


@pytest.mark.parametrize("n_blocks, seed", [(3, 0), (6, 3)])
def test_like_nodes_share_their_dominance_masks_and_keep_the_same_configurations(n_blocks, seed):
    from tensoropt.engine.dominance import dominated_free_configs

    g = _with_worse_copies(transformer_graph(n_blocks, k_range=(3, 5), seed=seed))
    # tables equal in value but separate objects, as a planner may hand them over
    g = CostGraph.build(list(zip(g.names, [c.copy() for c in g.node_costs])),
                        [(u, v, t.copy()) for (u, v), t in g.edge_costs.items()], blocks=g.blocks)
    got, want = dominated_free_configs(g), _kept_one_node_at_a_time(g)
    assert any(len(k) < n for k, n in zip(want, g.n_configs))
    assert [k.tolist() for k in got] == [k.tolist() for k in want]


def test_like_nodes_with_different_neighbours_get_their_own_masks():
    from tensoropt.engine.dominance import dominated_free_configs

    # p and q feed y1 and y2 through one table; p's second configuration is dominated, q's
    # is not, so once p has dropped it y1's second configuration is dominated and y2's not
    t = np.array([[[0.0, 0.0], [1.0, 1.0]], [[2.0, 2.0], [1.0, 1.0]]])
    y = np.zeros((2, 2))
    g = CostGraph.build([("p", np.array([[0.0, 0.0], [1.0, 1.0]])), ("q", np.array([[1.0, 1.0], [0.0, 0.0]])),
                         ("y1", y), ("y2", y.copy())], [(0, 2, t), (1, 3, t.copy())])
    got = dominated_free_configs(g)
    assert [k.tolist() for k in got] == [[0], [0, 1], [0], [0, 1]]
    assert [k.tolist() for k in got] == [k.tolist() for k in _kept_one_node_at_a_time(g)]


# ---------------------------------------------------------------------------- epsilon


@pytest.mark.parametrize("epsilon", [0.01, 0.05, 0.2, 1.0])
@pytest.mark.parametrize("make", [
    lambda: transformer_graph(3, k_range=(4, 8), seed=1),
    lambda: transformer_graph(1, seed=2),
    lambda: random_dag(8, 0.5, k_range=(3, 4), seed=4),
])
def test_epsilon_covers_exact(epsilon, make):
    g = make()
    exact = solve(g)
    approx = solve(g, epsilon=epsilon)
    assert approx.epsilon == epsilon
    assert len(approx.points) <= len(exact.points)
    assert covers(approx.points, exact.points, epsilon)
    assert_assignments_exact(g, approx)
    assert_frontier_shape(approx.points)


@SETTINGS
@given(cost_graphs(max_assignments=2048), st.sampled_from([0.01, 0.1, 0.5]))
def test_epsilon_covers_exact_random(g, epsilon):
    exact, _ = brute_force_frontier(g)
    approx = solve(g, epsilon=epsilon)
    assert covers(approx.points, exact, epsilon)
    assert_assignments_exact(g, approx)


# ------------------------------------------------------------------------ determinism


def test_deterministic():
    g = transformer_graph(4, k_range=(4, 10), seed=9)
    a, b = solve(g), solve(g)
    assert np.array_equal(a.points, b.points)
    assert np.array_equal(a.assignments, b.assignments)
    c, d = solve(g, epsilon=0.05), solve(g, epsilon=0.05)
    assert np.array_equal(c.points, d.points) and np.array_equal(c.assignments, d.assignments)


# ------------------------------------------------------------------ beyond brute force


def test_medium_transformer_matches_ilp():
    # 4 blocks: ~10^50 assignments, far beyond brute force; K kept small so HiGHS is quick.
    g = transformer_graph(4, k_range=(4, 8), seed=0)
    result = solve(g)
    assert_assignments_exact(g, result)
    mems = result.points[:, 1]
    picks = np.unique(np.linspace(0, len(mems) - 1, 5).round().astype(int))
    budgets = list(mems[picks]) + [float((mems[0] + mems[-1]) / 2)]
    assert len(budgets) >= 5
    for budget in budgets:
        best = float(result.points[mems <= budget, 0].min())
        t, m, _ = ilp_min_time(g, budget)
        assert m <= budget
        assert t == pytest.approx(best, rel=1e-6)


# ---------------------------------------------------------------------------- bad input


def test_bad_input_names_the_culprit():
    ok = np.ones((2, 2))
    with pytest.raises(ValueError, match="cycle"):
        CostGraph.build([("a", ok), ("b", ok)], [(0, 1, np.zeros((2, 2, 2))), (1, 0, np.zeros((2, 2, 2)))])
    with pytest.raises(ValueError, match="edge 'a'->'b'.*shape"):
        CostGraph.build([("a", ok), ("b", ok)], [(0, 1, np.zeros((2, 3, 2)))])
    with pytest.raises(ValueError, match="node 'b'.*shape"):
        CostGraph.build([("a", ok), ("b", np.ones((2, 3)))])
    with pytest.raises(ValueError, match="node 'a'.*NaN"):
        CostGraph.build([("a", np.array([[1.0, np.nan]]))])
    with pytest.raises(ValueError, match="node 'a'.*negative"):
        CostGraph.build([("a", np.array([[1.0, -1.0]]))])
    with pytest.raises(ValueError, match="edge 'a'->'b'.*negative"):
        CostGraph.build([("a", ok), ("b", ok)], [(0, 1, -np.ones((2, 2, 2)))])
    with pytest.raises(ValueError, match="edge 'a'->'b'.*NaN"):
        CostGraph.build([("a", ok), ("b", ok)], [(0, 1, np.full((2, 2, 2), np.nan))])
    with pytest.raises(ValueError, match="node 'e'.*empty"):
        CostGraph.build([("a", ok), ("e", np.zeros((0, 2)))])
    with pytest.raises(ValueError, match="epsilon"):
        solve(chain_graph(3), epsilon=-0.1)
    with pytest.raises(ValueError, match="time_limit_s"):
        solve(chain_graph(3), time_limit_s=0)


def test_time_limit():
    g = transformer_graph(6, seed=0)
    with pytest.raises(SolveTimeout, match=r"time_limit_s=0.01.*Raise the limit, pass epsilon > 0"):
        solve(g, time_limit_s=0.01)
    assert issubclass(SolveTimeout, TimeoutError)


def test_block_pruned_sums_match_dense(monkeypatch):
    # Force the segment-pair pruning of factors.sum_prune onto small graphs.
    fx = importlib.import_module("tensoropt.engine.factors")
    monkeypatch.setattr(fx, "kernels", lambda: None)
    monkeypatch.setattr(fx, "BLOCK_MIN_POINTS", 1)
    monkeypatch.setattr(fx, "_SEG_F", 2)
    monkeypatch.setattr(fx, "_SEG_G", 2)
    for seed in range(8):
        g = random_cost_graph(seed, max_assignments=8192, max_k=5)
        result = solve(g)
        assert_same_frontier(result.points, brute_force_frontier(g)[0])
        assert_assignments_exact(g, result)
    g = transformer_graph(4, k_range=(3, 6), seed=2)
    assert_same_frontier(solve(g).points, solve(g, use_blocks=False).points)


def _frontier_lists(rng, rows, n_c, width, ties, holes, levels=6):
    """(rows, n_c, width) frontiers sorted by time, inf-padded; ``ties``: integer costs below
    ``levels``, so many candidates are equal; ``holes``: some lists have an inf point inside."""
    t = np.full((rows, n_c, width), np.inf)
    m = np.full((rows, n_c, width), np.inf)
    for r, c in itertools.product(range(rows), range(n_c)):
        pts = rng.integers(0, levels, size=(3 * width, 2)).astype(float) if ties else rng.random((3 * width, 2))
        pt, pm, src = pareto_mod.prune_rows(pts[None, :, 0], pts[None, :, 1])
        n = int(min(rng.integers(0, width + 1), (src >= 0).sum()))
        t[r, c, :n], m[r, c, :n] = pt[0, :n], pm[0, :n]
        if holes and n > 2:
            t[r, c, n // 2] = m[r, c, n // 2] = np.inf
    return t, m


def _assert_native_sum_prunes_every_candidate(fx, lib, ft, fm, gt, gm, ratio):
    """pareto_sum2 against prune_rows over every (c, i, j): the same points and, among equal
    ones, the same (lowest) back-pointer."""
    rows = ft.shape[0]
    got = fx._sum_prune_native(lib, ft, fm, gt, gm, ratio)
    want = pareto_mod.prune_rows((ft[..., :, None] + gt[..., None, :]).reshape(rows, -1),
                                 (fm[..., :, None] + gm[..., None, :]).reshape(rows, -1), ratio)
    for a, b, fill in zip(got, want, (np.inf, np.inf, -1)):
        w = max(a.shape[1], b.shape[1])
        pad = lambda x: np.pad(x, ((0, 0), (0, w - x.shape[1])), constant_values=fill)  # noqa: E731
        assert np.array_equal(pad(a), pad(b))


@pytest.mark.parametrize("seed", range(60))
def test_compiled_union_of_sums_keeps_what_pruning_every_candidate_keeps(seed):
    """_kernels.c's pareto_sum2 against prune_rows over every (c, i, j): the same points, and
    among equal ones the same (lowest) back-pointer."""
    fx = importlib.import_module("tensoropt.engine.factors")
    lib = fx.kernels()
    if lib is None:
        pytest.skip("no C compiler")
    rng = np.random.default_rng(seed)
    rows, n_c, wf, wg = (int(x) for x in rng.integers(1, [5, 5, 12, 12]))
    ties, holes, ratio = seed % 3 == 0, seed % 5 == 0, (0.0, 0.0, 0.0, 0.7)[seed % 4]
    ft, fm = _frontier_lists(rng, rows, n_c, wf, ties, holes)
    gt, gm = _frontier_lists(rng, rows, n_c, wg, ties, holes)
    _assert_native_sum_prunes_every_candidate(fx, lib, ft, fm, gt, gm, ratio)


@pytest.mark.parametrize("seed", range(24))
def test_compiled_union_of_wide_sums_merged_in_time_order(seed):
    """Wide lists take pareto_sum2's merge in time order (one run per entry of the shorter
    list): the same points and back-pointers as pruning every candidate, whichever list is
    the longer, with ties, and with rows whose inf holes send them to the other loop."""
    fx = importlib.import_module("tensoropt.engine.factors")
    lib = fx.kernels()
    if lib is None:
        pytest.skip("no C compiler")
    rng = np.random.default_rng(1000 + seed)
    rows, n_c = (int(x) for x in rng.integers(1, [4, 5]))
    wide, narrow = int(rng.integers(32, 120)), int(rng.integers(1, 20))
    wf, wg = (wide, narrow) if seed % 2 else (narrow, wide)
    ties, holes, ratio = seed % 3 == 0, seed % 4 == 1, (0.0, 0.0, 0.0, 0.0, 0.0, 0.5)[seed % 6]
    ft, fm = _frontier_lists(rng, rows, n_c, wf, ties, holes, levels=2 * wf)
    gt, gm = _frontier_lists(rng, rows, n_c, wg, ties, holes, levels=2 * wg)
    _assert_native_sum_prunes_every_candidate(fx, lib, ft, fm, gt, gm, ratio)


@pytest.mark.parametrize("seed", range(8))
def test_compiled_wide_sums_where_distinct_times_round_to_one(seed):
    """Times a few ulps apart plus times a thousand times larger round to one sum: the merge
    in time order still keeps what pruning every candidate keeps, lowest back-pointers on ties."""
    fx = importlib.import_module("tensoropt.engine.factors")
    lib = fx.kernels()
    if lib is None:
        pytest.skip("no C compiler")
    rng = np.random.default_rng(2000 + seed)
    rows, n_c, wide, narrow = 2, 3, 64, 6
    ft = 1e-3 + np.cumsum(rng.integers(1, 4, size=(rows, n_c, wide)) * 2.2e-19, axis=-1)
    fm = np.cumsum(rng.integers(0, 3, size=(rows, n_c, wide))[..., ::-1], axis=-1)[..., ::-1] * 1.0
    gt = np.sort(1.0 + rng.integers(0, 3, size=(rows, n_c, narrow)) * 2.3e-16, axis=-1)
    gm = np.sort(rng.integers(0, 4, size=(rows, n_c, narrow)) * 1.0, axis=-1)[..., ::-1].copy()
    assert np.any((ft[..., 1:, None] + gt[..., None, :1]) == (ft[..., :-1, None] + gt[..., None, :1]))
    _assert_native_sum_prunes_every_candidate(fx, lib, ft, fm, gt, gm, 0.0)
    _assert_native_sum_prunes_every_candidate(fx, lib, gt, gm, ft, fm, 0.0)     # the long list as g


def test_compiled_and_numpy_sums_give_the_same_frontiers(monkeypatch):
    fx = importlib.import_module("tensoropt.engine.factors")
    if fx.kernels() is None:
        pytest.skip("no C compiler")
    graphs = [random_cost_graph(seed, max_assignments=4096, max_k=5) for seed in range(6)]
    graphs += [transformer_graph(4, k_range=(3, 6), seed=2), residual_graph(12, k_range=(2, 5), seed=1)]
    native = [solve(g) for g in graphs]
    monkeypatch.setattr(fx, "kernels", lambda: None)
    for g, a in zip(graphs, native):
        assert_same_frontier(a.points, solve(g).points)
        assert_assignments_exact(g, a)
