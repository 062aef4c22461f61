"""Lower bounds on a cost graph's frontier (``engine.bounds``), the skipping of dominated
jobs they allow (``search_jobs``), and the search's memory cap (``engine.memguard``)."""

from __future__ import annotations

import numpy as np
import pytest

from tensoropt.engine.bounds import LowerBound, dominated, lower_bound
from tensoropt.engine.pareto import pareto
from tensoropt.engine.reference import brute_force_frontier
from tensoropt.engine.synthetic import random_dag, residual_graph, transformer_graph


def _graphs():
    for seed in range(12):
        yield random_dag(7, edge_prob=0.4, seed=seed)
        yield residual_graph(n_blocks=2, k_range=(2, 5), seed=seed)
    yield transformer_graph(1, k_range=(2, 3), seed=1)


def test_bounds_are_exact_at_the_ends_and_below_every_frontier_point():
    for graph in _graphs():
        pts, _ = brute_force_frontier(graph)
        lb = lower_bound(graph)
        assert lb.time_min == pytest.approx(pts[:, 0].min(), rel=1e-8)
        assert lb.memory_min == pytest.approx(pts[:, 1].min(), rel=1e-8)
        assert lb.time_min <= pts[:, 0].min() and lb.memory_min <= pts[:, 1].min()
        for t, m in pts:
            assert lb.time_within(m) <= t
        assert lb.time_within(pts[:, 1].min() * (1 - 1e-6)) == float("inf")
        # the envelope touches the frontier where a weight's optimum lies
        a, b, c = lb.lines.T
        for j in range(len(c)):
            assert (a[j] * pts[:, 0] + b[j] * pts[:, 1]).min() == pytest.approx(c[j], rel=1e-8)


def test_repeated_blocks_fold_once_to_the_same_bound():
    """A chain of blocks is bounded by one block's transfer raised to a min-plus power: the
    same lines as eliminating every node of every block."""
    from tensoropt.engine import bounds

    for seed in range(6):
        graph = transformer_graph(2 + seed % 4, k_range=(2, 5), seed=seed)
        chained = lower_bound(graph)
        dense = bounds._joint(bounds._eliminate(
            [(v,) for v in range(graph.n_nodes)] + list(graph.edge_costs),
            [c @ chained.lines[:, :2].T for c in graph.node_costs]
            + [c @ chained.lines[:, :2].T for c in graph.edge_costs.values()],
            dict(enumerate(graph.n_configs)), frozenset()), (), dict(enumerate(graph.n_configs)), len(chained.lines))
        assert bounds.chain_layout(graph) is not None
        np.testing.assert_allclose(chained.lines[:, 2], dense * (1 - bounds._SLACK), rtol=1e-12)
    from tensoropt.engine import solve

    graph = transformer_graph(3, k_range=(2, 4), seed=3)
    pts, lb = solve(graph).points, lower_bound(graph)      # the engine's exact frontier
    assert lb.time_min == pytest.approx(pts[:, 0].min(), rel=1e-8)
    assert all(lb.time_within(m) <= t for t, m in pts)


def test_a_graph_never_dominates_its_own_frontier():
    for graph in _graphs():
        pts, _ = brute_force_frontier(graph)
        lb = lower_bound(graph)
        assert not dominated(lb.time_within, lb.memory_min, pts)
        # any one frontier point missing leaves room the bound must see
        for k in range(len(pts)):
            assert not dominated(lb.time_within, lb.memory_min, np.delete(pts, k, axis=0))


def test_dominated_against_a_staircase():
    # a job whose plans all need 2 s and 10 bytes, or 4 s and 5 bytes: time_within steps
    lb = LowerBound(np.array([[1.0, 0.0, 2.0], [0.0, 1.0, 5.0], [1.0, 0.4, 6.0]]), 2.0, 5.0)
    assert lb.time_within(4.9) == float("inf")
    assert lb.time_within(10.0) == 2.0 and lb.time_within(5.0) == 4.0
    assert dominated(lb.time_within, lb.memory_min, np.array([[1.0, 4.0]]))             # faster and smaller
    assert not dominated(lb.time_within, lb.memory_min, np.array([[2.0, 5.0]]))         # a tie is not
    assert not dominated(lb.time_within, lb.memory_min, np.array([[3.0, 4.0]]))         # it may be faster
    assert not dominated(lb.time_within, lb.memory_min, np.array([[1.0, 6.0]]))         # it may be smaller
    # two points together cover what neither covers alone
    both = np.array([[1.0, 9.0], [2.2, 4.0]])
    assert not dominated(lb.time_within, lb.memory_min, both[:1])
    assert not dominated(lb.time_within, lb.memory_min, both[1:])
    assert dominated(lb.time_within, lb.memory_min, both)
    assert not dominated(lb.time_within, lb.memory_min, np.zeros((0, 2)))
    shifted = lb.shifted(3.0)
    assert shifted.memory_min == 8.0 and shifted.time_within(8.0) == 4.0


# --- a ceiling inside a solve: the frontier less what the ceiling dominates ---------------------

def _ceiling_from(points: np.ndarray, rng) -> np.ndarray:
    """Some frontier points moved a little either way, and some exactly (ties must stay)."""
    moved = points[rng.random(len(points)) < 0.4]
    return np.vstack([moved * rng.uniform(0.97, 1.03, moved.shape), points[rng.random(len(points)) < 0.1]])


def test_a_ceiling_leaves_out_exactly_the_points_it_dominates():
    from tensoropt.engine import solve
    from tensoropt.engine.bounds import Ceiling

    cut = 0
    for seed in range(8):
        graph = transformer_graph(2 + seed % 4, k_range=(3, 6), seed=seed)
        full = solve(graph)
        ceiling = _ceiling_from(full.points, np.random.default_rng(seed))
        keep = ~Ceiling(ceiling).beats(full.points[:, 0], full.points[:, 1])
        res = solve(graph, ceiling=ceiling)
        assert np.array_equal(res.points, full.points[keep])
        cut += res.stats["chain_points_cut"]
        # the exact points it keeps are each still the cost of the assignment returned with it
        assert 0 < len(res) < len(full)
    assert cut > 0          # partial plans went inside the chain, not only at the end


def test_a_ceiling_cuts_partial_plans_during_elimination_and_keeps_the_rest():
    """Graphs without repeated blocks: the cut happens in the elimination steps (with the
    other factors' least costs as the rest), and the result is still exactly the frontier
    less what the ceiling dominates."""
    from tensoropt.engine import solve
    from tensoropt.engine.bounds import Ceiling

    cut = 0
    for seed in range(10):
        graph = (random_dag(12, k_range=(3, 6), seed=seed) if seed % 2 else
                 residual_graph(3, k_range=(3, 6), seed=seed))
        full = solve(graph, use_blocks=False)
        ceiling = _ceiling_from(full.points, np.random.default_rng(seed))
        keep = ~Ceiling(ceiling).beats(full.points[:, 0], full.points[:, 1])
        res = solve(graph, use_blocks=False, ceiling=ceiling)
        assert np.array_equal(res.points, full.points[keep])
        cut += res.stats["points_cut"]
    assert cut > 0


def test_a_forward_end_search_with_a_ceiling_keeps_every_plan_it_does_not_beat():
    from tensoropt.capture.recapture import capture_model
    from tensoropt.engine.bounds import Ceiling
    from tensoropt.mesh import parse_devices
    from tensoropt.peak_search import solve_problem
    from tensoropt.planner import build_problem
    from tensoropt.pricing import cost_models
    from tensoropt.space import SearchSpace
    from tensoropt.training import TrainingConfig

    graph, _, _ = capture_model("gpt-tiny", None, 8)
    cluster = parse_devices("8xA100-80GB")
    mesh = [m for m in SearchSpace.for_cluster(cluster, 2).meshes(cluster) if len(m.shape) == 2][0]
    problem = build_problem(graph, mesh, cost_models(cluster, TrainingConfig("bf16-mixed", "adam"))(mesh))
    full = solve_problem(problem, graph, start_at="forward-end")
    ceiling = _ceiling_from(np.column_stack([full.times, full.peaks]), np.random.default_rng(1))
    res = solve_problem(problem, graph, start_at="forward-end", ceiling=ceiling)
    beaten = Ceiling(ceiling)
    full_pts = {(t, p) for t, p in zip(full.times, full.peaks)}
    kept = {(t, p) for t, p in zip(res.times, res.peaks)}
    assert {(t, p) for t, p in full_pts if not beaten.beats(t, p)} <= kept and len(kept) < len(full)
    # a plan that only a plan now left out had dominated comes back; the ceiling beats it
    assert all(beaten.beats(t, p) for t, p in kept - full_pts)
    merged = [pareto(np.vstack([ceiling, np.array(sorted(s))])) for s in (kept, full_pts)]
    assert np.array_equal(*merged)


# --- the search: skipping changes nothing but the work ---------------------------------------

def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        (p.time_s, p.peak_memory_bytes, p.summary, p.mesh) == (q.time_s, q.peak_memory_bytes, q.summary, q.mesh)
        for p, q in zip(a.plans, b.plans))


@pytest.fixture(scope="module")
def pruned_and_full():
    import tensoropt

    # GPT-2 on 8 devices: some pipeline shapes are bounded out by plans found before them
    kw = dict(max_mesh_dims=1, progress=False, references=False)
    return (tensoropt.frontier("gpt2", "8xA100-80GB", **kw),
            tensoropt.frontier("gpt2", "8xA100-80GB", prune_meshes=False, **kw))


def test_skipping_dominated_jobs_keeps_the_frontier(pruned_and_full):
    pruned, full = pruned_and_full
    assert pruned.stats["skipped"] > 0 and full.stats["skipped"] == 0
    assert pruned.stats["jobs"] == full.stats["jobs"]
    assert _same(pruned, full)


def _close(a, b) -> bool:
    return len(a) == len(b) and all(
        p.summary == q.summary and p.mesh == q.mesh and np.isclose(p.time_s, q.time_s, rtol=1e-12, atol=0)
        and np.isclose(p.peak_memory_bytes, q.peak_memory_bytes, rtol=1e-12, atol=0) for p, q in zip(a.plans, b.plans))


def test_ceilings_inside_solves_keep_the_frontier(monkeypatch):
    """Every problem searched on end-of-forward memory, where solved jobs take the frontier
    found so far as a ceiling (pipeline stages rescaled to their own time and memory)."""
    import tensoropt
    import tensoropt.mesh_search as mesh_search
    import tensoropt.pipeline as pipeline
    from tensoropt import peak_search

    def forward_end(*args, **kw):
        return peak_search.solve_problem(*args, **{**kw, "start_at": "forward-end"})
    monkeypatch.setattr(mesh_search, "solve_problem", forward_end)
    monkeypatch.setattr(pipeline, "solve_problem", forward_end)
    kw = dict(max_mesh_dims=2, progress=False, references=False)
    pruned = tensoropt.frontier("gpt-tiny", "8xA100-80GB", batch_size=16, **kw)
    full = tensoropt.frontier("gpt-tiny", "8xA100-80GB", batch_size=16, prune_meshes=False, **kw)
    assert pruned.stats["peak_search"] == {"forward-end": pruned.stats["peak_search"]["forward-end"]}
    assert any(p.stages for p in full.plans)
    assert _close(pruned, full)


def test_jobs_run_fastest_bound_first_and_return_in_their_own_order():
    from tensoropt.plan_builder import Candidate
    from tensoropt.search_jobs import Job, run_jobs
    from tensoropt.search_options import Deadline

    ran = []

    def job(name, t, m, points):
        bound = LowerBound(np.array([[1.0, 0.0, t], [0.0, 1.0, m]]), t, m)

        def solve(limit, ceiling):
            ran.append(name)
            return [Candidate(pt, pm, pm, lambda: None) for pt, pm in points]
        return Job(name, bound, solve)

    jobs = [job("slow", 3.0, 1.0, [(3.0, 1.0)]),
            job("hopeless", 2.0, 6.0, [(2.5, 7.0)]),     # bounded out by "fast"
            job("fast", 1.0, 5.0, [(1.0, 5.0), (2.0, 2.0)])]
    out, stats = run_jobs(jobs, Deadline(None, "test"))
    assert ran == ["fast", "slow"] and stats == {"jobs": 3, "skipped": 1, "workers": 1, "set_aside": 0,
                                                  "crowded_out": 0, "concurrency": 1, "approximated": []}
    assert [(c.time_s, c.peak_bytes) for c in out] == [(3.0, 1.0), (1.0, 5.0), (2.0, 2.0)]
    ran.clear()
    out, stats = run_jobs(jobs, Deadline(None, "test"), prune=False)
    assert ran == ["fast", "hopeless", "slow"] and stats["skipped"] == 0 and len(out) == 4


def test_no_plan_is_below_its_problems_bound():
    """Every plan's peak is at least its cost graph's memory, so the bounds hold on the peak."""
    import tensoropt
    from tensoropt.capture.recapture import capture_model
    from tensoropt.mesh import parse_devices
    from tensoropt.peakmodel import peak_model
    from tensoropt.planner import build_problem
    from tensoropt.pricing import cost_models
    from tensoropt.space import SearchSpace
    from tensoropt.training import TrainingConfig

    graph, _, _ = capture_model("gpt-tiny", None, 4)
    cluster = parse_devices("4xA100-80GB")
    cost_for = cost_models(cluster, TrainingConfig("bf16-mixed", "adam"))
    rng = np.random.default_rng(0)
    for mesh in SearchSpace.for_cluster(cluster, 2).meshes(cluster):
        for z in (0, 3):
            problem = build_problem(graph, mesh, cost_for(mesh), zero_stage=z)
            cg = problem.cost_graph
            a = np.column_stack([rng.integers(k, size=300) for k in cg.n_configs])
            priced = peak_model(problem, graph).evaluate(a)
            eof = np.array([cg.cost(x) for x in a])
            assert np.allclose(priced[:, 0], eof[:, 0], rtol=1e-9)
            assert (priced[:, 2] >= eof[:, 1] * (1 - 1e-12)).all()
            lb = lower_bound(cg)
            assert all(lb.time_within(m) <= t for t, m in priced[:, [0, 2]])
    assert tensoropt  # imported for its side effects on the zoo


def test_a_search_past_its_memory_cap_says_what_to_change():
    import tensoropt
    from tensoropt.engine.memguard import SearchMemoryExceeded, resident_bytes

    if resident_bytes() is None:
        pytest.skip("resident memory cannot be read on this system")
    for workers in (1, 2):      # workers crowded out of the cap run fewer at once: no advice for them
        with pytest.raises(SearchMemoryExceeded, match="memory cap.*max_mesh_dims") as err:
            tensoropt.frontier("gpt-tiny", "4xA100-80GB", progress=False, memory_limit="1MB", workers=workers)
        assert "workers" not in str(err.value)


def test_the_command_line_reports_the_memory_cap(capsys):
    from tensoropt.cli import main
    from tensoropt.engine.memguard import resident_bytes

    if resident_bytes() is None:
        pytest.skip("resident memory cannot be read on this system")
    assert main(["frontier", "--model", "gpt-tiny", "--devices", "2xA100-80GB", "--no-progress",
                 "--memory-limit", "1MB"]) == 3
    assert "past its memory cap" in capsys.readouterr().err


def test_the_compiled_elimination_step_gives_the_numpy_numbers(monkeypatch):
    """``bounds._sum_min`` by the compiled kernel and by numpy (whole, and one configuration
    at a time): the same numbers to the bit, over broadcast, strided and infinite tables."""
    from tensoropt.engine import bounds
    from tensoropt.engine.native import kernels

    lib = kernels()
    if lib is None:
        pytest.skip("no C compiler: the numpy code is all there is")
    rng = np.random.default_rng(7)
    for trial in range(150):
        nd = int(rng.integers(1, 5))
        scope = tuple(range(nd))
        sizes = {v: int(rng.integers(1, 12)) for v in scope}
        tables = []
        for _ in range(int(rng.integers(1, 5))):
            t = rng.random(tuple(sizes[v] if rng.random() < 0.6 else 1 for v in scope) + (9,)) * 100
            if rng.random() < 0.3:
                t = np.where(rng.random(t.shape) < 0.1, np.inf, t)
            if rng.random() < 0.3 and nd >= 2:
                t = np.ascontiguousarray(np.swapaxes(t, 0, 1)).swapaxes(0, 1)      # strided
            tables.append(t)
        axis = int(rng.integers(0, nd))
        whole = np.broadcast_to(sum(tables), tuple(sizes[v] for v in scope) + (9,)).min(axis=axis)
        native = bounds._sum_min_native(lib, tables, scope, axis, sizes)
        assert np.array_equal(native, whole), trial
        # in order of level, the kernel keeps the partial sums of the earlier levels
        ordered = sorted(tables, key=lambda t: bounds._level(t, axis))
        by_level = np.broadcast_to(sum(ordered), tuple(sizes[v] for v in scope) + (9,)).min(axis=axis)
        assert np.array_equal(bounds._sum_min_native(lib, ordered, scope, axis, sizes), by_level), trial
        with monkeypatch.context() as m:                                 # numpy, per configuration
            m.setattr(bounds, "_LOOP_CELLS", 0)
            m.setattr(bounds, "_NATIVE_CELLS", float("inf"))
            one_at_a_time = bounds._sum_min(tables, scope, axis, sizes)
        assert np.array_equal(np.broadcast_to(one_at_a_time, whole.shape), by_level), trial   # it sums by level too
