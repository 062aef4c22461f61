"""Building plans from assignments: what one problem's plans share (its cost tables, its
operator choices) must not leak from one plan into another, and a cost graph's total is its
terms added one after another."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from tensoropt.engine.costgraph import total
from tensoropt.engine.synthetic import random_dag, transformer_graph


@pytest.mark.parametrize("seed", range(6))
def test_a_cost_is_its_terms_added_in_order(seed):
    graph = random_dag(14, k_range=(2, 5), seed=seed) if seed % 2 else transformer_graph(3, seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(20):
        a = [int(rng.integers(k)) for k in graph.n_configs]
        want = np.zeros(2)
        for v, c in enumerate(a):
            want += graph.node_costs[v][c]
        for (u, v), t in graph.edge_costs.items():
            want += t[a[u], a[v]]
        terms = graph.terms(a)
        assert terms.shape == (graph.n_nodes + len(graph.edge_costs), 2)
        assert np.array_equal(graph.cost(a), want) and np.array_equal(total(terms), want)
    with pytest.raises(ValueError, match="out of range"):
        graph.cost([k for k in graph.n_configs])


@pytest.fixture(scope="module")
def solved():
    from tensoropt.capture.recapture import capture_model
    from tensoropt.mesh import parse_devices
    from tensoropt.peak_search import solve_problem
    from tensoropt.planner import build_problem
    from tensoropt.pricing import cost_models
    from tensoropt.space import SearchSpace
    from tensoropt.training import TrainingConfig

    graph, _, _ = capture_model("gpt-tiny", None, 8)
    cluster = parse_devices("8xA100-80GB")
    training = TrainingConfig("bf16-mixed", "adam")
    mesh = [m for m in SearchSpace.for_cluster(cluster, 2).meshes(cluster) if len(m.shape) == 2][0]
    problem = build_problem(graph, mesh, cost_models(cluster, training)(mesh), zero_stage=2)
    res = solve_problem(problem, graph, start_at="forward-end")
    return graph, training, problem, res


def test_plans_of_one_problem_are_each_what_a_fresh_problem_builds(solved):
    """Plans built in turn from one problem (sharing its choices) equal, field for field,
    those built in the other order, each from a copy of the problem that has built nothing."""
    from tensoropt.plan_builder import PlanContext, plan_from_assignment

    graph, training, problem, res = solved
    ctx = PlanContext(graph, training, "sig", 0.0, "8xA100-80GB")
    rows = list(zip(res.assignments, res.memories, res.peaks))
    assert len(rows) > 3
    # recomputation switched on for some units too, so recomputed and kept operators differ
    flipped = [(np.concatenate([a[:len(graph.operators)], np.arange(len(problem.units)) % 2]), m, k)
               for a, m, k in rows[:3]]
    rows += flipped
    shared = [plan_from_assignment(ctx, problem, a, held_peak=(m, k)) for a, m, k in rows]
    assert len(problem.choices) < sum(len(p.ops) for p in shared)          # they do share
    fresh = [plan_from_assignment(ctx, _uncached(problem), a, held_peak=(m, k))
             for a, m, k in reversed(rows)][::-1]
    assert [p.to_json() for p in shared] == [p.to_json() for p in fresh]
    assert len({p.to_json() for p in shared}) == len(shared)


def _uncached(problem):
    """The problem without what plans filled in (its cached properties)."""
    out = copy.copy(problem)
    for name in ("choices", "labels", "cost_fields", "split_codes"):
        out.__dict__.pop(name, None)
    return out
