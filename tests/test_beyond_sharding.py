"""ZeRO stages, activation recomputation and the device count inside the frontier."""

from __future__ import annotations

import numpy as np
import pytest

import tensoropt
from tensoropt.costmodel import CostModel
from tensoropt.training import TrainingConfig
from tensoropt.engine import solve
from tensoropt.engine.reference import brute_force_frontier
from tensoropt.hardware import get_device
from tensoropt.mesh import parse_devices
from tensoropt.models import example_inputs, get_model
from tensoropt.capture import capture
from tensoropt.planner import build_problem, recompute_units
from tensoropt.scaling import ScalingFrontier, device_counts, parse_scaling
from tensoropt.budget import InfeasibleBudget
from tensoropt.space import distinct_meshes


@pytest.fixture(scope="module")
def gpt_graph():
    return capture(get_model("gpt-tiny", n_layers=1), example_inputs("gpt-tiny", n_layers=1))


def test_zero_and_recompute_reach_strictly_lower_memory():
    # the richer space keeps every point only where each of its searches is exact; on this
    # model and mesh they are (a larger search falls back to the block graph: ``peak_search``)
    full = tensoropt.frontier("bert-tiny", "2xA100-80GB", pipeline=False, progress=False)
    ops_only = tensoropt.frontier("bert-tiny", "2xA100-80GB", zero=False, recompute=False, pipeline=False,
                                  progress=False)
    assert set(full.stats["peak_search"]) == {"exact"} == set(ops_only.stats["peak_search"])
    assert full.min_memory().peak_memory_bytes < ops_only.min_memory().peak_memory_bytes
    assert full.min_memory().zero_stage > 0 or full.min_memory().recompute
    # the richer space never loses a point of the smaller one
    t, m = full.times_s, full.memories_bytes
    for p in ops_only.plans:
        assert np.any((t <= p.time_s * (1 + 1e-12)) & (m <= p.peak_memory_bytes * (1 + 1e-12)))


def test_recompute_node_costs(gpt_graph):
    cl = parse_devices("2xA100-80GB")
    mesh = distinct_meshes(cl)[0]
    pr = build_problem(gpt_graph, mesh, CostModel(cl.device))
    units = recompute_units(gpt_graph)
    assert [u for u, _ in units] == ["layers.0"] and len(pr.units) == 1
    node = pr.recompute_node(0)
    n_ops = len(gpt_graph.operators)
    a0 = [0] * n_ops + [0]
    a1 = [0] * n_ops + [1]
    (t0, m0), (t1, m1) = pr.cost_graph.cost(a0), pr.cost_graph.cost(a1)
    ops = units[0][1]
    saved = sum(pr.node_costs[i][0].activation_bytes for i in ops)
    again = sum(pr.node_costs[i][0].forward_s for i in ops)
    assert t1 - t0 == pytest.approx(again) and again > 0
    assert m0 - m1 == pytest.approx(saved - pr.unit_input_bytes[0][0]) and m1 < m0
    assert node == n_ops


@pytest.mark.parametrize("zero_stage", [0, 2, 3])
def test_enlarged_space_still_equals_brute_force(gpt_graph, zero_stage):
    cl = parse_devices("2xA100-80GB")
    mesh = distinct_meshes(cl)[0]
    pr = build_problem(gpt_graph, mesh, CostModel(cl.device), zero_stage=zero_stage)
    # shrink to 2 configurations on the recompute node and the matrix/norm operators and 1
    # elsewhere, so brute force stays small
    g = pr.cost_graph
    from tensoropt.engine import CostGraph
    wide = {i for i, op in enumerate(gpt_graph.operators) if op.family in ("linear", "attention", "norm")}
    wide.add(pr.recompute_node(0))
    keep = [list(range(min(2 if v in wide else 1, k))) for v, k in enumerate(g.n_configs)]

    def exact(costs):
        # times on a 2^-40 s grid and whole bytes: every sum is exact in float64, so the two
        # solvers cannot disagree over rounding in near-ties
        out = np.array(costs)
        out[..., 0] = np.round(out[..., 0] * 2.0 ** 40) / 2.0 ** 40
        out[..., 1] = np.round(out[..., 1])
        return out

    nodes = [(n, exact(c[k])) for n, c, k in zip(g.names, g.node_costs, keep)]
    edges = [(u, v, exact(t[np.ix_(keep[u], keep[v])])) for (u, v), t in g.edge_costs.items()]
    small = CostGraph.build(nodes, edges)
    assert 2 ** 8 <= small.n_assignments <= 2 ** 16
    ours = solve(small)
    bf, _ = brute_force_frontier(small)
    assert np.array_equal(ours.points, bf)


def test_zero_stage_memory_formulas():
    cl = parse_devices("4xA100-80GB")
    cm = CostModel(cl.device, training=TrainingConfig("bf16-mixed"))
    g = capture(get_model("mlp-tiny"), example_inputs("mlp-tiny"))
    mesh = distinct_meshes(cl, max_dims=1)[0]
    op = g.operators[0]
    from tensoropt.strategy import OpConfig
    dp = OpConfig(("b",))
    n = sum(s.numel for s, p in zip(op.operands, op.param_names) if p is not None)
    costs = {z: cm.node_cost(op, dp, mesh, zero_stage=z) for z in (0, 1, 2, 3)}
    state = {z: c.param_bytes + c.grad_bytes + c.optimizer_bytes for z, c in costs.items()}
    # ZeRO paper (costs.md): 16Ψ; 4Ψ + 12Ψ/N; 2Ψ + 14Ψ/N; 16Ψ/N with N = 4; ZeRO-1 also keeps
    # the stored shards of its parameters and gradients (4Ψ/N) beside the step's whole ones,
    # as the apply layer runs it
    assert state[0] == pytest.approx(16 * n)
    assert state[1] == pytest.approx(4 * n + 16 * n / 4)
    assert state[2] == pytest.approx(2 * n + 14 * n / 4)
    assert state[3] == pytest.approx(16 * n / 4)
    assert costs[3].comm_s > costs[2].comm_s == pytest.approx(costs[1].comm_s)
    with pytest.raises(ValueError, match="zero_stage"):
        cm.node_cost(op, dp, mesh, zero_stage=4)


def test_device_count_axis():
    assert parse_scaling("up to 8xA100-80GB") == (8, "A100-80GB")
    assert parse_scaling("8xA100-80GB") is None
    assert device_counts(8) == [1, 2, 4, 8] and device_counts(6) == [1, 2, 4, 6]
    s = tensoropt.frontier("gpt-tiny", "up to 4xA100-80GB", progress=False, max_mesh_dims=1, pipeline=False)
    assert isinstance(s, ScalingFrontier) and sorted(s.frontiers) == [1, 2, 4]
    df = s.to_pandas()
    assert {"devices", "time_s", "memory_bytes", "device_hours"} <= set(df.columns)
    assert np.allclose(df["device_hours"], df["time_s"] * df["devices"] / 3600)
    # no kept plan is beaten in all three objectives by another
    pts = df[["time_s", "memory_bytes", "devices"]].to_numpy()
    for i, p in enumerate(pts):
        others = np.delete(pts, i, axis=0)
        assert not np.any(np.all(others <= p, axis=1) & np.any(others < p, axis=1))
    # fewer devices, less memory each is impossible; more devices buys lower memory
    assert df[df.devices == 4].memory_bytes.min() < df[df.devices == 1].memory_bytes.min()
    fast = s.best(max_devices=2)
    assert fast.world_size <= 2
    assert fast.time_s == min(p.time_s for p in s.plans if p.world_size <= 2 and p.peak_memory_bytes <= 80e9)
    cheap = s.best(objective="device_hours")
    assert cheap.time_s * cheap.world_size == min(p.time_s * p.world_size for p in s.plans)
    with pytest.raises(InfeasibleBudget, match="minimum achievable"):
        s.best(memory_budget=1000)
    with pytest.raises(ValueError, match="objective"):
        s.best(objective="cost")


# ---- pipeline stages -------------------------------------------------------------------------
from tensoropt.pipeline import (check_pipeline, compose_stages, microbatch_counts, pipeline_plans,  # noqa: E402
                                split_stages, stage_blocks, stage_counts, stage_operators)


def test_stage_and_microbatch_choices():
    assert stage_counts(12, 8) == [2, 4] and stage_counts(2, 4) == [2] and stage_counts(1, 8) == []
    assert microbatch_counts(8, 2) == [2, 4, 8] and microbatch_counts(6, 4) == []


def test_blocks_that_do_not_divide_split_with_equal_middle_stages():
    # a first layer capture leaves out of the blocks (12 layers, 11 blocks): the first stage
    # runs it beside one block fewer than the others
    assert stage_blocks(11, 2) == (5, 6) and stage_blocks(11, 4) == (2, 3, 3, 3)
    assert stage_blocks(5, 4) == (1, 1, 1, 2)          # one block over: the last stage takes it
    assert stage_blocks(12, 4) == (3, 3, 3, 3)
    # two middle stages of different sizes would need two middle plans: not offered
    assert stage_blocks(10, 4) is None and stage_blocks(28, 8) is None and stage_blocks(1, 2) is None
    assert stage_counts(11, 8) == [2, 4] and stage_counts(96, 1024) == [2, 4, 8, 16, 32]
    for n, p in [(11, 4), (5, 4), (12, 4), (7, 2)]:
        counts = stage_blocks(n, p)
        assert sum(counts) == n and len(set(counts[1:-1])) <= 1


def test_an_uneven_split_covers_every_operator_once_in_block_order():
    g = capture(get_model("gpt-tiny", n_layers=3), example_inputs("gpt-tiny", n_layers=3))
    runs = stage_operators(g, 2)
    assert sorted(i for ops in runs for i in ops) == list(range(len(g.operators)))
    held = [[k for k, b in enumerate(g.blocks) if set(b) <= set(ops)] for ops in runs]
    assert held == [[0], [1, 2]]
    assert max(runs[0]) < min(runs[1])
    specs = split_stages(g, 2)
    assert [s.ops for s in specs] == runs and [s.in_flight for s in specs] == [2, 1]
    six = capture(get_model("gpt-tiny", n_layers=6), example_inputs("gpt-tiny", n_layers=6))
    with pytest.raises(ValueError, match="do not split into 4 stages"):
        stage_operators(six, 4)


def test_bad_pipeline_requests_are_clear_errors():
    g = capture(get_model("gpt-tiny"), example_inputs("gpt-tiny"))   # 2 blocks, batch 8
    with pytest.raises(ValueError, match="only 2 repeated blocks"):
        check_pipeline(g, 4, 4, 8)
    with pytest.raises(ValueError, match="do not divide the batch"):
        check_pipeline(g, 2, 3, 8)
    with pytest.raises(ValueError, match="at least as many micro-batches"):
        check_pipeline(g, 2, 1, 8)


def test_stage_split_covers_every_operator_once():
    g = capture(get_model("gpt-tiny", n_layers=4), example_inputs("gpt-tiny", n_layers=4))
    specs = split_stages(g, 4)
    assert [s.index for s in specs] == [0, 1, 3] and [s.in_flight for s in specs] == [4, 3, 1]
    two = split_stages(g, 2)
    assert sorted(i for s in two for i in s.ops) == list(range(len(g.operators)))


def test_stage_composition_equals_brute_force():
    rng = np.random.default_rng(0)
    fronts = []
    for k in (5, 4, 6):
        t = np.sort(rng.uniform(1, 10, k))
        m = np.sort(rng.uniform(1, 10, k))[::-1]
        fronts.append(np.stack([t, m], axis=1))
    pts, picks = compose_stages(fronts, scale=3.0, p2p_s=0.5)
    combos = [(3.0 * (max(a[0], b[0], c[0]) + 0.5), max(a[1], b[1], c[1]))
              for a in fronts[0] for b in fronts[1] for c in fronts[2]]
    from tensoropt.engine.reference import pareto_points
    np.testing.assert_allclose(pts, pareto_points(np.array(combos)))
    for (t, m), pick in zip(pts, picks):
        chosen = [f[i] for f, i in zip(fronts, pick)]
        assert t == pytest.approx(3.0 * (max(c[0] for c in chosen) + 0.5))
        assert m == pytest.approx(max(c[1] for c in chosen))


def test_a_stage_without_points_composes_to_no_plan():
    """A stage whose points the frontier found so far all dominate (the search's ceiling)
    leaves the pipeline shape no plan, not an error."""
    fronts = [np.array([[1.0, 5.0], [2.0, 3.0]]), np.zeros((0, 2))]
    pts, picks = compose_stages(fronts, scale=3.0, p2p_s=0.5)
    assert pts.shape == (0, 2) and picks.shape == (0, 2)


def test_a_pipeline_jobs_stages_share_its_time_limit(monkeypatch):
    """Each stage's solve gets what the job's limit has left, not the whole limit again."""
    import time

    import tensoropt.pipeline as pipeline
    from tensoropt.capture.recapture import capture_model
    from tensoropt.plan_builder import PlanContext
    from tensoropt.pricing import cost_models
    from tensoropt.space import SearchSpace

    given = []
    solve = pipeline.solve_problem

    def slow(*a, **k):
        given.append(k["time_limit_s"])
        time.sleep(0.3)
        return solve(*a, **k)
    monkeypatch.setattr(pipeline, "solve_problem", slow)
    _, _, recapture = capture_model("gpt-tiny")
    cluster = parse_devices("4xA100-80GB")
    training = TrainingConfig("bf16-mixed")
    ctx = PlanContext(recapture(2), training, "sig", 0.0, "4xA100-80GB")
    assert pipeline_plans(ctx, cluster, 2, 4, cost_models(cluster, training), SearchSpace(max_mesh_dims=1), True,
                          time_limit_s=60.0)
    assert len(given) == 2 and given[0] <= 60.0 and given[1] <= given[0] - 0.3


def test_pipeline_plans_follow_the_1f1b_formulas():
    from tensoropt.capture.recapture import capture_model
    from tensoropt.plan import Plan
    from tensoropt.plan_builder import PlanContext
    from tensoropt.pricing import cost_models
    from tensoropt.space import SearchSpace

    g, _, recapture = capture_model("gpt-tiny")
    cluster = parse_devices("4xA100-80GB")
    training = TrainingConfig("bf16-mixed")
    ctx = PlanContext(recapture(2), training, "sig", 0.0, "4xA100-80GB")
    plans = pipeline_plans(ctx, cluster, 2, 4, cost_models(cluster, training), SearchSpace(max_mesh_dims=1), True)
    assert plans and all(p.mesh_shape[0] == 2 and p.microbatches == 4 and len(p.stages) == 2 for p in plans)
    for p in plans:
        slowest = max(s.time_s for s in p.stages)
        assert slowest == p.breakdown["stage_s"]
        assert p.time_s == pytest.approx((4 + 2 - 1) * (slowest + p.breakdown["p2p_s"]))
        assert p.memory_bytes == max(s.memory_bytes for s in p.stages)
    # the first stage keeps 2 micro-batches of activations in flight, the last one
    first = plans[0].stages[0]
    assert Plan.from_json(plans[0].to_json()) == plans[0]
    assert first.label == "stage 0" and plans[0].stages[1].label == "stage 1"
    times = [p.time_s for p in plans]
    assert times == sorted(times)
