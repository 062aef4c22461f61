"""Tied blocks (engine.tying): exact over the tied assignments, a subset of the full search."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tensoropt.engine import covers, pareto, solve
from tensoropt.engine.synthetic import transformer_graph
from tensoropt.engine.tying import group_count, tie_blocks


@pytest.mark.parametrize("n, cap, want", [(96, 8, 8), (95, 8, 5), (12, 8, 6), (7, 8, 7), (7, 3, 1), (4, 1, 1)])
def test_group_count_is_the_largest_divisor_within_the_cap(n, cap, want):
    assert group_count(n, cap) == want


def test_nothing_to_tie():
    g = transformer_graph(3, k_range=(2, 3), seed=1)
    assert tie_blocks(g, 3) is None                 # one block per group
    assert tie_blocks(transformer_graph(1, k_range=(2, 3)), 1) is None


@pytest.mark.parametrize("seed", range(3))
def test_tied_graph_prices_expanded_assignments_exactly(seed):
    g = transformer_graph(6, k_range=(2, 4), seed=seed)
    tied = tie_blocks(g, 3)
    assert (tied.groups, tied.group_size) == (3, 2)
    assert len(tied.graph.blocks) == 3
    rng = np.random.default_rng(seed)
    for _ in range(50):
        a = np.array([rng.integers(k) for k in tied.graph.n_configs])
        full = tied.expand(a[None])[0]
        np.testing.assert_allclose(g.cost(full), tied.graph.cost(a), rtol=1e-12)
        for k in range(0, 6, 2):                    # the two blocks of a group agree
            assert list(full[list(g.blocks[k])]) == list(full[list(g.blocks[k + 1])])


@pytest.mark.parametrize("n_blocks, seed", [(2, 0), (3, 1), (4, 2)])
def test_tied_frontier_equals_brute_force_over_tied_assignments(n_blocks, seed):
    g = transformer_graph(n_blocks, k_range=(1, 2), seed=seed)
    tied = tie_blocks(g, 1)
    ks = tied.graph.n_configs
    assert np.prod(ks) <= 1 << 17
    every = np.array(list(itertools.product(*[range(k) for k in ks])))
    costs = np.array([g.cost(a) for a in tied.expand(every)])
    res = solve(g, block_groups=1)
    np.testing.assert_allclose(res.points, pareto(costs), rtol=1e-9)
    assert res.stats["block_groups"] == 1 and res.stats["block_group_size"] == n_blocks
    for a, p in zip(res.assignments, res.points):
        np.testing.assert_allclose(g.cost(a), p, rtol=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_more_groups_never_lose_and_the_full_search_covers_all(seed):
    g = transformer_graph(4, k_range=(2, 4), seed=seed)
    exact = solve(g).points
    one, two = solve(g, block_groups=1).points, solve(g, block_groups=2).points
    assert covers(exact, two, 0.0) and covers(two, one, 0.0)
    assert np.array_equal(solve(g, block_groups=4).points, exact)  # nothing tied
