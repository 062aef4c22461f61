"""The (time, peak memory) search: equal to brute force on random peak graphs and on small
models, the ε bound in both objectives, the compiled kernels equal to numpy, and limits
that stop a search before it grows past them."""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest

from tensoropt.engine import SolveTimeout
from tensoropt.engine import kfactors, peaksolve
from tensoropt.engine.kfactors import SearchTooLarge
from tensoropt.engine.peakfold import fold_fixed
from tensoropt.engine.peaksolve import solve_peak
from tensoropt.engine.reference import brute_force_peak_frontier, pareto_points

from peak_graphs import random_peak_graph

VARIANTS = {
    "plain": dict(modes=False),
    "modes": dict(modes=True),
    "units": dict(modes=True, units=True),
    "exclude": dict(modes=True, exclude=True),
    "chain": dict(modes=True, chain=3, regions=1, n_ops=3),
    "units+exclude": dict(modes=True, units=True, exclude=True, n_ops=7),
    # operators with one configuration each (peakfold.fold_fixed folds their runs), or some of them
    "fixed": dict(modes=True, units=True, k_range=(1, 1), n_ops=12, regions=5),
    "some fixed": dict(modes=True, units=True, k_range=(1, 2), n_ops=9, regions=4),
    "fixed+exclude": dict(modes=True, units=True, exclude=True, k_range=(1, 1), n_ops=10, regions=4),
}


def _check_points(graph, res):
    """Every returned point is its assignment's cost, strictly Pareto."""
    priced = graph.evaluate(res.assignments)
    assert np.array_equal(priced[:, [0, 2]], res.points)
    assert np.all(np.diff(res.points[:, 0]) > 0) and np.all(np.diff(res.points[:, 1]) < 0)
    assert not graph.excluded(res.assignments).any()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_random_peak_graphs_equal_brute_force(variant):
    for seed in range(40):
        graph = random_peak_graph(seed, **VARIANTS[variant])
        res = solve_peak(graph)
        exact, _ = brute_force_peak_frontier(graph)
        assert np.array_equal(res.points, exact), (variant, seed)
        _check_points(graph, res)


def test_folded_graphs_cost_the_same_and_search_to_the_same_frontier(monkeypatch):
    """``fold_fixed`` gives every assignment the cost the graph as given does (enumerated), on
    graphs where it folds something; searched with and without the fold, the same points."""
    folded_some = 0
    for seed in range(40):
        graph = random_peak_graph(seed, **VARIANTS["fixed" if seed % 2 else "some fixed"])
        small = fold_fixed(graph)
        if small is None:
            continue
        folded_some += 1
        assert len(small.regions) < len(graph.regions) and small.n_configs == graph.n_configs
        every = np.array(list(itertools.product(*[range(k) for k in graph.n_configs])))
        assert np.array_equal(small.evaluate(every), graph.evaluate(every)), seed
        assert np.array_equal(small.excluded(every), graph.excluded(every))
        with_fold = solve_peak(graph)
        assert with_fold.stats["regions"] == len(small.regions) < with_fold.stats["regions_given"]
        with monkeypatch.context() as m:
            m.setattr(peaksolve, "fold_fixed", lambda g: None)
            plain = solve_peak(graph)
        assert plain.stats["regions"] == len(graph.regions)
        assert np.array_equal(with_fold.points, plain.points), seed
    assert folded_some >= 20


def test_compiled_kernels_equal_numpy(monkeypatch):
    graphs = [random_peak_graph(seed, modes=True, units=seed % 2 == 0, exclude=seed % 3 == 0) for seed in range(25)]
    native = [solve_peak(g) for g in graphs]
    monkeypatch.setattr(kfactors, "kernels", lambda: None)
    for g, a in zip(graphs, native):
        b = solve_peak(g)
        assert np.array_equal(a.points, b.points)
        assert np.array_equal(g.evaluate(b.assignments), g.evaluate(a.assignments))


def test_fold_grid_keeps_the_same_plans():
    """The compiled fold's grid of sampled points, which only rows with many candidates take,
    drops candidates without changing what is kept: every row sent through it gives the same
    points and assignments as the small graphs' rows give without it."""
    lib = kfactors.kernels()
    if lib is None:
        pytest.skip("no C compiler")
    grid_min = ctypes.c_int64.in_dll(lib, "kd_fold_grid_min")
    stats = (ctypes.c_int64 * 6).in_dll(lib, "kd_fold_stats")      # [3]: runs the grid skipped
    graphs = [random_peak_graph(seed, modes=True, units=seed % 2 == 0, exclude=seed % 3 == 0, n_ops=7)
              for seed in range(25)]
    before = stats[3]
    plain = [solve_peak(g) for g in graphs]
    assert stats[3] == before
    old = grid_min.value
    try:
        grid_min.value = 0
        gridded = [solve_peak(g) for g in graphs]
    finally:
        grid_min.value = old
    assert stats[3] > before
    for a, b in zip(plain, gridded):
        assert np.array_equal(a.points, b.points)
        assert np.array_equal(a.assignments, b.assignments)


@pytest.mark.parametrize("epsilon", [0.1, 0.5])
def test_epsilon_bound_holds_in_both_objectives(epsilon):
    """Every exact point has a returned one no slower and at most (1 + ε) times its peak; each
    returned point is its assignment's exact cost."""
    coarsened = 0
    for seed in range(40):
        graph = random_peak_graph(seed, modes=True, units=seed % 2 == 1, n_ops=7)
        exact, _ = brute_force_peak_frontier(graph)
        res = solve_peak(graph, epsilon=epsilon)
        _check_points(graph, res)
        for t, p in exact:
            assert ((res.points[:, 0] <= t) & (res.points[:, 1] <= (1 + epsilon) * p)).any(), (seed, t, p)
        coarsened += len(res) < len(exact)
    if epsilon >= 0.5:
        assert coarsened > 0      # the bound is not met by returning everything


def test_limits_stop_the_search_before_it_grows():
    graph = random_peak_graph(3, modes=True, n_ops=8, k_range=(3, 5))
    full = solve_peak(graph)
    assert full.stats["candidates"] > 100
    with pytest.raises(SearchTooLarge, match="point pairs"):
        solve_peak(graph, max_candidates=full.stats["candidates"] // 2)
    with pytest.raises(SearchTooLarge, match="GB"):
        solve_peak(graph, max_factor_bytes=64)
    with pytest.raises(SolveTimeout):
        solve_peak(graph, time_limit_s=0.0)
    # within its limits, the same answer
    again = solve_peak(graph, max_candidates=full.stats["candidates"])
    assert np.array_equal(again.points, full.points)


# --- small models: every assignment priced by the peak model, enumerated ---------------

def _record(monkeypatch):
    import tensoropt.mesh_search as mesh_search

    seen = []
    real = mesh_search.solve_problem

    def recording(problem, graph, *args, **kwargs):
        found = real(problem, graph, *args, **kwargs)
        seen.append(found)
        return found
    monkeypatch.setattr(mesh_search, "solve_problem", recording)
    return seen


def _brute_force(found) -> np.ndarray:
    """Every (time, peak) the problem's plans can have, as the Pareto set."""
    pm = found.model
    pts = [brute_force_peak_frontier(pm.exact)[0]]
    if pm.replicate is not None:
        pts.append(brute_force_peak_frontier(pm.replicate)[0])
    return pareto_points(np.concatenate(pts))


def _residual_mlp(batch: int = 8, d: int = 32):
    """Two repeated residual blocks (so recompute units are searched) in a user's own code."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

        def forward(self, x):
            return x + self.down(F.relu(self.up(x)))

    class Net(nn.Module):
        def __init__(self, d=32):
            super().__init__()
            self.stem = nn.Linear(d, d)
            self.blocks = nn.ModuleList(Block(d) for _ in range(2))

        def forward(self, x, y):
            x = self.stem(x)
            for b in self.blocks:
                x = b(x)
            return F.mse_loss(x, y)

    with torch.device("meta"):
        model = Net(d)
        inputs = (torch.randn(batch, d), torch.randn(batch, d))
    return model, inputs


@pytest.fixture(scope="module")
def mlp_search():
    import tensoropt

    model, inputs = _residual_mlp()
    with pytest.MonkeyPatch.context() as mp:
        seen = _record(mp)
        f = tensoropt.frontier(model, "cpu:2", inputs=inputs, progress=False, pipeline=False, references=False,
                                   prune_meshes=False)
    return f, seen


def test_small_model_frontiers_equal_brute_force(mlp_search):
    f, seen = mlp_search
    assert len(seen) == 3                                     # ZeRO 0, 2 and 3 on the one mesh
    assert any(len(s.model.exact.units) for s in seen)        # recompute units searched as units
    for found in seen:
        assert found.stats["peak_search"] == "exact"
        assert found.model.exact.n_assignments > 1000
        assert np.array_equal(np.column_stack([found.times, found.peaks]), _brute_force(found))


def test_best_under_a_budget_is_the_brute_force_optimum(mlp_search):
    f, seen = mlp_search
    every = np.concatenate([_brute_force(s) for s in seen])
    peaks = np.unique(every[:, 1])
    for budget in list(peaks[:: max(1, len(peaks) // 8)]) + [peaks[-1] * 2]:
        best = f.best(memory_budget=float(budget))
        assert best.peak_memory_bytes <= budget * (1 + 1e-12)
        assert best.time_s == pytest.approx(every[every[:, 1] <= budget, 0].min(), rel=1e-12)
    # every plan states the peak it was searched on
    for p in f.plans:
        assert np.isclose(every, [p.time_s, p.peak_memory_bytes], rtol=1e-12, atol=0).all(axis=1).any()


def test_selective_recompute_frontiers_equal_brute_force(monkeypatch):
    """Under the per-operator policy a recomputed block keeps its first linear's output, wider
    than that linear's input: the peak model's terms for it stay exact where the next operator
    saves that output, and the search equals brute force."""
    import tensoropt

    model, inputs = _residual_mlp(batch=8, d=16)      # a width where recomputed plans are on the frontier
    seen = _record(monkeypatch)
    f = tensoropt.frontier(model, "cpu:2", inputs=inputs, progress=False, pipeline=False, references=False,
                           prune_meshes=False, zero=False, recompute_policy="op")
    assert len(seen) == 1
    found = seen[0]
    assert found.stats["peak_search"] == "exact"
    # the kept output's excess over what its linear saves goes to the next operator's remat
    assert any(len(t.scope) == 3 for r in found.model.exact.regions for t in r.remat)
    assert np.array_equal(np.column_stack([found.times, found.peaks]), _brute_force(found))
    rc = [p for p in f.plans if p.recompute]
    assert rc and all(p.recompute_policy == "op" and ":op" in p.summary for p in rc)


def _tied_lm():
    """An embedding whose weight the output projection uses again (a tied language model head)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class TiedLM(nn.Module):
        def __init__(self, vocab=16, d=8):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.mix = nn.Linear(d, d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids, targets):
            logits = self.head(F.relu(self.mix(self.emb(ids))))
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    with torch.device("meta"):
        model = TiedLM()
    ids = torch.randint(0, 16, (4, 8), device="meta")
    return model, (ids, ids)


def test_tied_copy_frontiers_equal_brute_force():
    """The later use of a tied weight works on a copy whose size depends on both users'
    configurations; the exact search, split by the first user's classes, still equals
    enumerating every assignment of the full graph."""
    import tensoropt

    import tensoropt.mesh_search as mesh_search

    model, inputs = _tied_lm()
    seen, problems = [], []
    real = mesh_search.solve_problem

    def recording(problem, graph, *args, **kwargs):
        problems.append(problem)
        seen.append(real(problem, graph, *args, **kwargs))
        return seen[-1]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mesh_search, "solve_problem", recording)
        tensoropt.frontier(model, "cpu:2", inputs=inputs, progress=False, pipeline=False, references=False,
                           prune_meshes=False)
    assert any(len(s.model.parts) > 1 for s in seen)
    assert any(held.any() for p in problems for _, _, held, _ in p.tied_copies)
    assert any(again.any() for p in problems for _, _, _, again in p.tied_copies)       # ZeRO-3
    for found in seen:
        assert found.stats["peak_search"] == "exact"
        assert np.array_equal(np.column_stack([found.times, found.peaks]), _brute_force(found))


def test_a_graph_refuses_bad_terms_and_shares_frozen_ones():
    """``PeakGraph.build`` keeps a term already frozen (int nodes, read-only float64 table) as
    it is, copies any other, and refuses a scope that repeats a node, reads one out of range
    or does not match its table's shape, frozen or not."""
    from tensoropt.engine.peakgraph import PeakGraph, Region, Term

    frozen = np.zeros((2, 3))
    frozen.setflags(write=False)

    def build(local):
        return PeakGraph.build(["a", "b"], [2, 3], [Term((0,), np.zeros((2, 2))), Term((1,), np.zeros((3, 2)))],
                               [Region((0, 1), local=(local,))])
    kept = Term((0, 1), frozen)
    g = build(kept)
    assert g.regions[0].local[0] is kept
    loose = Term([np.int64(0), 1], np.zeros((2, 3)))          # numpy node, writable table
    g = build(loose)
    out = g.regions[0].local[0]
    assert out is not loose and out.scope == (0, 1) and type(out.scope[0]) is int
    assert not out.table.flags.writeable and loose.table.flags.writeable
    square = np.zeros((2, 2))
    square.setflags(write=False)
    for bad, match in [(Term((0, 0), square), "repeats a node"), (Term((0, 2), frozen), "out of range"),
                       (Term((1, 0), frozen), "table shape")]:
        with pytest.raises(ValueError, match=match):
            build(bad)


def test_bounds_in_peak_memory_stay_below_every_plan(monkeypatch):
    """A job's lower bound is shifted by the least rise of its backward pass
    (``MeshProblem.min_rise``), so that it bounds peaks, not end-of-forward memory: every
    problem's plans, enumerated (their Pareto set: a dominated plan lies above it too), stay
    on or above it, and the shift is not zero."""
    import tensoropt
    import tensoropt.mesh_search as mesh_search
    from tensoropt.engine.bounds import lower_bound

    model, inputs = _residual_mlp()
    seen = []
    real = mesh_search.solve_problem

    def recording(problem, graph, *args, **kwargs):
        seen.append((problem, real(problem, graph, *args, **kwargs)))
        return seen[-1][1]
    monkeypatch.setattr(mesh_search, "solve_problem", recording)
    tensoropt.frontier(model, "cpu:2", inputs=inputs, progress=False, pipeline=False, references=False,
                       prune_meshes=False)
    assert seen
    for problem, found in seen:
        rise = problem.min_rise()
        assert rise > 0
        bound = problem.lower_bound()
        every = _brute_force(found)
        assert (every[:, 1] >= bound.memory_min).all()
        assert all(bound.time_within(m) <= t * (1 + 1e-12) for t, m in every)
        # the job's bound is the cost graph's, shifted
        assert bound.memory_min == pytest.approx(lower_bound(problem.cost_graph).memory_min + rise, rel=1e-12)
