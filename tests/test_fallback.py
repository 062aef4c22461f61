"""The ε fallback (``tensoropt.fallback``): a job whose exact solve passes the memory cap or
its share of the time left is solved again (1+ε)-approximately instead of ending the search,
the frontier says so, and the stated bound holds against the exact frontier."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tensoropt
from tensoropt import mesh_search
from tensoropt.engine import SolveTimeout
from tensoropt.engine.bounds import LowerBound
from tensoropt.engine.memguard import SearchMemoryExceeded
from tensoropt.plan_builder import Candidate
from tensoropt.fallback import PROBE_S, FALLBACK_SHARE
from tensoropt.search_jobs import Job, run_jobs
from tensoropt.search_options import Deadline
from tensoropt.search_pool import can_fork


def _bound(t: float, m: float) -> LowerBound:
    return LowerBound(np.array([[1.0, 0.0, t], [0.0, 1.0, m]]), t, m)


def _plan():
    return None


def _too_big(limit, ceiling, epsilon=None):
    if epsilon is None:
        raise SearchMemoryExceeded("the search holds 9 GiB, past its memory cap of 4 GiB")
    return [Candidate(2.0, 3.0, 3.0 * (1 + epsilon), _plan)]


def _fits(limit, ceiling, epsilon=None):
    return [Candidate(1.0, 5.0, 5.0, _plan)]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_job_past_the_memory_cap_is_solved_again_with_the_fallback(workers):
    if workers > 1 and not can_fork():
        pytest.skip("worker processes are forked")
    jobs = [Job("fits", _bound(1.0, 5.0), _fits), Job("too big", _bound(2.0, 3.0), _too_big)]
    out, stats = run_jobs(jobs, Deadline(None, "test"), workers=workers, fallback=0.01)
    assert [(c.time_s, c.peak_bytes) for c in out] == [(1.0, 5.0), (2.0, 3.0 * 1.01)]
    assert stats["approximated"] == [{"job": "too big", "epsilon": 0.01, "reason": "memory"}]
    with pytest.raises(SearchMemoryExceeded, match="while solving too big"):
        run_jobs(jobs, Deadline(None, "test"), workers=workers)


@pytest.mark.parametrize("needs", [0.01, 0.1, 1.0])
def test_where_the_fallback_too_passes_the_cap_ten_times_it_is_tried(needs):
    tried = []

    def big(limit, ceiling, epsilon=None):
        tried.append(epsilon)
        if epsilon is None or epsilon < needs * (1 - 1e-9):
            raise SearchMemoryExceeded("the search holds 9 GiB, past its memory cap of 4 GiB")
        return [Candidate(1.0, 1.0, 1.0, _plan)]
    jobs = [Job("big", _bound(1.0, 1.0), big)]
    if needs > 0.1:
        with pytest.raises(SearchMemoryExceeded, match="while solving big .again with epsilon = 0.1"):
            run_jobs(jobs, Deadline(None, "test"), fallback=0.01)
        assert tried == [None, 0.01, pytest.approx(0.1)]
        return
    out, stats = run_jobs(jobs, Deadline(None, "test"), fallback=0.01)
    assert len(out) == 1 and stats["approximated"][0]["epsilon"] == pytest.approx(needs)
    assert tried == [None, 0.01, pytest.approx(0.1)][:len(tried)] and tried[-1] == pytest.approx(needs)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_jobs_after_one_that_fell_back_on_its_chain_start_at_its_epsilon(workers):
    """The ZeRO stages of one mesh are one chain: alike graphs, alike cost to solve. Where the
    first needed ten times the fallback ε, the next tries neither the exact solve nor the ε
    below; a job on another chain starts exact."""
    if workers > 1 and not can_fork():
        pytest.skip("worker processes are forked")
    import multiprocessing as mp

    tried = mp.get_context("fork").Manager().list() if workers > 1 else []

    def needs(eps_needed, name):
        def solve(limit, ceiling, epsilon=None):
            tried.append((name, epsilon))
            if eps_needed and (epsilon is None or epsilon < eps_needed * (1 - 1e-9)):
                raise SearchMemoryExceeded("the search holds 9 GiB, past its memory cap of 4 GiB")
            return [Candidate(1.0, 1.0, 1.0, _plan)]
        return solve
    jobs = [Job("a0", _bound(1.0, 4.0), needs(0.1, "a0"), chain="mesh a"),
            Job("a2", _bound(2.0, 3.0), needs(0.1, "a2"), chain="mesh a"),
            Job("b0", _bound(3.0, 2.0), needs(0.0, "b0"), chain="mesh b")]
    _, stats = run_jobs(jobs, Deadline(None, "test"), workers=workers, fallback=0.01, prune=False)
    assert [(r["job"], r["reason"]) for r in stats["approximated"]] == [("a0", "memory"), ("a2", "chain")]
    assert all(r["epsilon"] == pytest.approx(0.1) for r in stats["approximated"])
    by_job = {}
    for name, eps in tried:
        by_job.setdefault(name, []).append(eps)
    assert by_job["a0"] == [None, 0.01, pytest.approx(0.1)]
    assert by_job["a2"] == [pytest.approx(0.1)] and by_job["b0"] == [None]


def test_a_slow_exact_solve_gets_its_share_of_the_time_then_the_fallback_the_rest():
    given = []

    def slow(limit, ceiling, epsilon=None):
        given.append((limit, epsilon))
        if epsilon is None:
            time.sleep(limit)
            raise SolveTimeout("time limit reached during a combine")
        return [Candidate(1.0, 1.0, 1.0, lambda: None)]
    deadline = Deadline(2.0, "test")
    out, stats = run_jobs([Job("slow", _bound(1.0, 1.0), slow)], deadline, fallback=0.05)
    assert len(out) == 1 and stats["approximated"] == [{"job": "slow", "epsilon": 0.05, "reason": "time"}]
    (first, none), (second, eps) = given
    assert none is None and eps == 0.05
    assert first == pytest.approx(2.0 * FALLBACK_SHARE, abs=0.1)
    assert second == pytest.approx(2.0 * (1 - FALLBACK_SHARE) * FALLBACK_SHARE, abs=0.1)
    # without a fallback the exact solve has all the time, and its timeout ends the search
    given.clear()
    with pytest.raises(SolveTimeout, match="time_limit_s=0.5"):
        run_jobs([Job("slow", _bound(1.0, 1.0), slow)], Deadline(0.5, "test"))
    assert given[0][0] == pytest.approx(0.5, abs=0.1)


def test_fallback_plans_are_within_the_stated_bound_of_the_exact_frontier(monkeypatch):
    """One mesh's exact solves made to pass the memory cap: its jobs are solved with ε, the
    frontier says so, its plans carry ε, and every exact frontier plan has a returned plan no
    slower within (1 + ε) of its peak."""
    eps = 0.05
    kw = dict(max_mesh_dims=2, pipeline=False, progress=False, workers=1, epsilon_fallback=eps)
    exact = tensoropt.frontier("cnn-tiny", "4xA100-80GB", **kw)
    assert exact.stats["approximated"] == [] and exact.caption() == "exact frontier"
    assert set(exact.stats["peak_search"]) == {"exact"}        # the bound is on the peak there
    solve = mesh_search.solve_problem
    target = "2x2"

    def capped(problem, graph, **k):
        if k["epsilon"] == 0 and problem.mesh.shape == (2, 2):
            raise SearchMemoryExceeded("the search holds 9 GiB, past its memory cap of 4 GiB")
        return solve(problem, graph, **k)
    monkeypatch.setattr(mesh_search, "solve_problem", capped)
    approx = tensoropt.frontier("cnn-tiny", "4xA100-80GB", **kw)
    fell = approx.stats["approximated"]
    # the mesh's ZeRO stage solved first passed the cap; the others started at its ε
    assert sorted(r["reason"] for r in fell) == ["chain", "chain", "memory"]
    assert all(r["epsilon"] == eps and f"mesh {target}" in r["job"] for r in fell)
    assert "1 as their exact solve passed the memory cap" in approx.caption()
    assert "2 as the job before them on their mesh fell back" in approx.caption()
    assert f"ε = {eps:g}" in approx.caption() and approx.to_pandas().attrs["caption"] == approx.caption()
    assert f"ε = {eps:g}" in repr(approx) and approx.epsilon == eps and exact.epsilon == 0
    on_mesh = [p for p in approx.plans if p.mesh_shape == (2, 2)]
    assert on_mesh and all(p.epsilon == eps for p in on_mesh)
    assert all(p.epsilon == 0 for p in approx.plans if p.mesh_shape != (2, 2))
    for q in exact.plans:
        assert any(p.time_s <= q.time_s * (1 + 1e-12) and p.peak_memory_bytes <= (1 + eps) * q.peak_memory_bytes
                   for p in approx.plans), q.summary
    with pytest.raises(SearchMemoryExceeded, match=f"mesh {target}"):
        tensoropt.frontier("cnn-tiny", "4xA100-80GB", **{**kw, "epsilon_fallback": None})


def test_a_bad_fallback_is_refused_before_capture():
    with pytest.raises(ValueError, match="epsilon_fallback"):
        tensoropt.frontier("not-a-model", "4xA100-80GB", epsilon_fallback=-1.0)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_job_too_slow_with_nothing_to_cut_against_is_set_aside_until_the_rest_are_solved(workers):
    """The fastest-bound job needs more than PROBE_S while nothing is found yet: it and the rest
    of its chain are solved last, against what the others found; candidates come back in job
    order as ever."""
    if workers > 1 and not can_fork():
        pytest.skip("worker processes are forked")
    import multiprocessing as mp

    manager = mp.get_context("fork").Manager() if workers > 1 else None
    ran, given = (manager.list(), manager.list()) if manager else ([], [])

    def slow_alone(name, point):
        def solve(limit, ceiling, epsilon=None):
            ran.append((name, 0 if ceiling is None else len(ceiling)))
            given.append(limit)
            if epsilon is None and (ceiling is None or not len(ceiling)):
                raise SolveTimeout("time limit reached during a combine")
            return [Candidate(*point, point[1], _plan)]
        return solve

    def quick(name, point):
        def solve(limit, ceiling, epsilon=None):
            ran.append((name, 0 if ceiling is None else len(ceiling)))
            return [Candidate(*point, point[1], _plan)]
        return solve
    jobs = [Job("b", _bound(2.0, 1.0), quick("b", (2.0, 1.0)), chain="mesh b"),
            Job("a0", _bound(1.0, 4.0), slow_alone("a0", (1.0, 4.0)), chain="mesh a"),
            Job("a2", _bound(1.5, 3.0), quick("a2", (1.5, 3.0)), chain="mesh a")]
    out, stats = run_jobs(jobs, Deadline(600.0, "test"), workers=workers, fallback=0.01)
    ran = list(ran)                    # on two workers "a0" and "b" start at once
    assert sorted(ran[:2]) == [("a0", 0), ("b", 0)] and ran[2:] == [("a0", 1), ("a2", 2)]
    assert [(c.time_s, c.peak_bytes) for c in out] == [(2.0, 1.0), (1.0, 4.0), (1.5, 3.0)]
    assert stats["set_aside"] == 2 and stats["approximated"] == [] and given[0] == PROBE_S
    # with too little time left to set one aside, the exact solve has its share, then the fallback
    given[:] = []
    out, stats = run_jobs(jobs[1:2], Deadline(2 * PROBE_S, "test"), workers=1, fallback=0.01)
    assert stats["set_aside"] == 0 and stats["approximated"][0]["reason"] == "time"
    assert given[0] == pytest.approx(PROBE_S, abs=0.5) and given[0] < PROBE_S


@pytest.mark.parametrize("workers", [1, 2])
def test_jobs_set_aside_leave_the_frontier_as_it_is(monkeypatch, workers):
    """Every probe made to run out of time: the first jobs are set aside and solved last, and
    the frontier is the one found without setting any aside, plan for plan."""
    if workers > 1 and not can_fork():
        pytest.skip("worker processes are forked")
    from tensoropt import fallback, search_jobs

    kw = dict(batch_size=16, max_mesh_dims=2, progress=False, references=False, workers=workers)
    monkeypatch.setattr(search_jobs, "PROBE_JOBS", 0)
    plain = tensoropt.frontier("gpt-tiny", "8xA100-80GB", **kw)
    monkeypatch.setattr(search_jobs, "PROBE_JOBS", 4)
    monkeypatch.setattr(fallback, "PROBE_S", 1e-6)
    aside = tensoropt.frontier("gpt-tiny", "8xA100-80GB", **kw)
    assert plain.stats["set_aside"] == 0 and aside.stats["set_aside"] >= 4
    assert aside.stats["approximated"] == [] and aside.caption() == plain.caption()
    assert len(aside.plans) == len(plain.plans)
    for p, q in zip(plain.plans, aside.plans):
        assert p.to_dict() == q.to_dict()


def test_a_probe_ends_once_another_worker_finds_plans_and_its_job_runs_next():
    """On two workers the fastest-bound job probes while another group solves: once that group
    has found plans, the probe ends at its next check (it would run long past ``PROBE_S``
    otherwise), and the job set aside runs before the groups not started yet."""
    if not can_fork():
        pytest.skip("worker processes are forked")
    import multiprocessing as mp

    from tensoropt.engine import memguard

    started = mp.get_context("fork").Manager().list()

    def long_alone(limit, ceiling, epsilon=None):
        started.append(("long", 0 if ceiling is None else len(ceiling)))
        end = time.monotonic() + (0.0 if ceiling is not None and len(ceiling) else 3 * PROBE_S)
        while time.monotonic() < end:        # a solve that checks in, as the engine's combines do
            memguard.check()
            time.sleep(0.005)
        return [Candidate(1.0, 4.0, 4.0, _plan)]

    def takes(name, seconds, point):
        def solve(limit, ceiling, epsilon=None):
            started.append((name, 0 if ceiling is None else len(ceiling)))
            time.sleep(seconds)
            return [Candidate(*point, point[1], _plan)]
        return solve
    jobs = [Job("long", _bound(1.0, 4.0), long_alone),
            Job("quick", _bound(2.0, 1.0), takes("quick", 0.1, (2.0, 1.0))),
            Job("c", _bound(3.0, 0.5), takes("c", 1.0, (3.0, 0.5))),
            Job("d", _bound(4.0, 0.25), takes("d", 0.2, (4.0, 0.25))),
            Job("e", _bound(5.0, 0.125), takes("e", 0.2, (5.0, 0.125)))]
    start = time.monotonic()
    out, stats = run_jobs(jobs, Deadline(None, "test"), workers=2, fallback=0.01)
    took = time.monotonic() - start
    names = [n for n, _ in started]
    assert stats["set_aside"] == 1 and stats["approximated"] == []
    assert names.count("long") == 2 and started[names.index("long")] == ("long", 0)
    again = len(names) - 1 - names[::-1].index("long")
    assert started[again][1] > 0 and again < names.index("d") < names.index("e")
    assert took < PROBE_S             # the probe did not run out its time
    assert [(c.time_s, c.peak_bytes) for c in out] == [(1.0, 4.0), (2.0, 1.0), (3.0, 0.5), (4.0, 0.25),
                                                       (5.0, 0.125)]
