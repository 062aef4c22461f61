"""A search's jobs solved in forked worker processes (``tensoropt.search_pool``): the same
frontier as one process, results that refer to the parent's own objects, one memory cap over
parent and workers, and a worker's error ending the search."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import time
from functools import partial

import numpy as np
import pytest

from tensoropt.engine import SolveTimeout, memguard
from tensoropt.engine.bounds import LowerBound
from tensoropt.engine.memguard import SearchMemoryExceeded
from tensoropt.fallback import PROBE_S
from tensoropt.plan_builder import Candidate
from tensoropt.search_jobs import Job, run_jobs
from tensoropt.search_options import Deadline
from tensoropt.search_pool import can_fork, fork_map, groups_of

pytestmark = pytest.mark.skipif(not can_fork(), reason="worker processes are forked")


def _bound(t: float, m: float) -> LowerBound:
    return LowerBound(np.array([[1.0, 0.0, t], [0.0, 1.0, m]]), t, m)


class Problem:
    """Stands for a mesh problem: what a candidate's plan builder refers to."""
    def __init__(self, name):
        self.name = name


def _plan(problem, k):
    return (problem.name, k)


def _points(problem, points, limit, ceiling):
    return [Candidate(t, m, m, partial(_plan, problem, k)) for k, (t, m) in enumerate(points)]


def test_candidates_come_back_referring_to_the_parents_objects():
    problems = [Problem("a"), Problem("b"), Problem("c")]
    points = [[(3.0, 1.0)], [(1.0, 5.0), (2.0, 2.0)], [(2.5, 7.0)]]
    jobs = [Job(p.name, _bound(*pts[0]), partial(_points, p, pts)) for p, pts in zip(problems, points)]
    serial, s_stats = run_jobs(jobs, Deadline(None, "test"), prune=False)
    out, stats = run_jobs(jobs, Deadline(None, "test"), prune=False, workers=2)
    assert stats["workers"] == 2 and s_stats["workers"] == 1
    assert [(c.time_s, c.peak_bytes) for c in out] == [(c.time_s, c.peak_bytes) for c in serial]
    # the builder holds the parent's problem, not a copy made in the worker
    assert [c.build.args[0] for c in out] == [problems[0], problems[1], problems[1], problems[2]]
    assert all(c.build.args[0] is p for c, p in zip(out, [problems[0], problems[1], problems[1], problems[2]]))
    assert [c.build() for c in out] == [("a", 0), ("b", 0), ("b", 1), ("c", 0)]
    # a solver that is a closure, not a partial: what it closes over is the parent's too
    held = Problem("closed")

    def closure(limit, ceiling):
        return [Candidate(9.0, 9.0, 9.0, partial(_plan, held, 0))]
    out, _ = run_jobs(jobs + [Job("closure", _bound(9.0, 9.0), closure)], Deadline(None, "test"), prune=False,
                      workers=2)
    assert out[-1].build.args[0] is held


def test_jobs_of_one_chain_stay_together_in_order():
    jobs = [Job(str(i), _bound(1.0, 1.0), lambda *a: [], chain=c) for i, c in enumerate(["x", "", "x", "y", ""])]
    assert groups_of(jobs, [4, 2, 1, 0, 3]) == [[4], [2, 0], [1], [3]]


def _wait_for(counter, n: int) -> None:
    end = time.monotonic() + 20
    while counter.value < n and time.monotonic() < end:
        time.sleep(0.01)


def _hold(arrived, parties: int, nbytes: int, limit, ceiling):
    """Holds ``nbytes``; the first runs of ``parties`` jobs check the cap while all of them
    hold their blocks: each writes its growth at a check, so all check once, then again."""
    block = np.ones(nbytes // 8)          # touched: resident
    with arrived.get_lock():
        arrived.value += 1
    _wait_for(arrived, parties)
    try:
        memguard.check()
    finally:
        with arrived.get_lock():
            arrived.value += 1
    _wait_for(arrived, 2 * parties)
    memguard.check()
    return [Candidate(1.0, float(block[0]), 1.0, partial(_plan, Problem("held"), 0))]


def _first_point(limit, ceiling):
    return [Candidate(0.5, 100.0, 100.0, partial(_plan, Problem("first"), 0))]


# Until a point is found, the pool starts groups that have no time limit one at a time (the others
# start with its frontier), so tests that need two jobs at once put a quick one first.
_FIRST = Job("first", _bound(0.5, 100.0), _first_point)


def _holding_jobs(nbytes: int, n: int = 2, together: int = 2):
    """``n`` jobs that each hold ``nbytes``, the first ``together`` of them until all hold."""
    arrived = mp.get_context("fork").Value("i", 0)
    return [_FIRST] + [Job(f"hold {i}", _bound(1.0 + i, 1.0), partial(_hold, arrived, together, nbytes))
                       for i in range(n)]


def _cap_scenarios() -> dict:
    """Jobs holding memory under caps set just before the pool forks: two jobs of 200 MB each
    under a cap 250 MB above the parent, on two workers (whether they return what one process
    returns, the pool's stats and the cap); one job of 300 MB under a cap 200 MB above (the
    error it stops with); two jobs of 150 MB under a cap 400 MB above (the pool's stats)."""
    serial, _ = run_jobs(_holding_jobs(200 * 2**20, together=1), Deadline(None, "test"), prune=False)
    gc.collect()
    cap = memguard.resident_bytes() + 250 * 2**20
    with memguard.memory_cap(cap, "lower it"):
        out, stats = run_jobs(_holding_jobs(200 * 2**20), Deadline(None, "test"), prune=False, workers=2)
    same = [(c.time_s, c.peak_bytes, c.build()) for c in out] == [(c.time_s, c.peak_bytes, c.build()) for c in serial]
    gc.collect()
    error = None
    with memguard.memory_cap(memguard.resident_bytes() + 200 * 2**20, "lower it"):
        try:
            run_jobs(_holding_jobs(300 * 2**20, n=1, together=1), Deadline(None, "test"), prune=False, workers=2)
        except SearchMemoryExceeded as err:
            error = str(err)
    gc.collect()
    with memguard.memory_cap(memguard.resident_bytes() + 400 * 2**20, "lower it"):
        side, side_stats = run_jobs(_holding_jobs(150 * 2**20), Deadline(None, "test"), prune=False, workers=2)
    return {"same": same, "stats": stats, "cap": cap, "error": error, "side": len(side), "side_stats": side_stats}


def test_one_memory_cap_holds_over_every_worker():
    """Two workers each growing by 200 MB pass a cap 250 MB above the parent together, though
    either alone is within it: they are crowded out and run again one at a time, and the
    search finds what one process finds. A job too large for the cap alone still ends the
    search with the cap's error. (Run in a fresh interpreter: a test process that has run
    others holds and frees memory on its own, which moves a cap's margin.)"""
    import json
    import subprocess
    import sys

    code = ("import json, sys; sys.path[:0] = sys.argv[1:]; import test_search_pool as t; "
            "print(json.dumps(t._cap_scenarios()))")
    run = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__), os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(run.stdout.strip().splitlines()[-1])
    stats, cap = res["stats"], res["cap"]
    assert stats["crowded_out"] >= 1 and stats["concurrency"] == 1, (stats, cap)
    assert res["same"]
    assert stats["peak_resident_bytes"] > cap                 # the cap was passed, and seen
    assert res["error"] is not None, "a job too large for the cap alone did not stop the search"
    assert "past its memory cap" in res["error"] and "while solving hold" in res["error"]
    assert "lower it" in res["error"]
    # within a cap 400 MB above the parent they run side by side: pages a worker shares with the
    # parent (a few hundred MB here) are not counted again
    assert res["side"] == 3 and res["side_stats"]["crowded_out"] == 0 and res["side_stats"]["concurrency"] == 2


def _hold_for_build(arrived, together: int, nbytes: int, k: int):
    return (k, _hold(arrived, together, nbytes, None, None)[0].time_s)


def test_builds_crowded_out_of_the_memory_cap_run_again():
    """The same for jobs built in workers (``fork_map``): two builds that pass the cap together
    run again one at a time and return what they return alone; one too large alone stops."""
    arrived = mp.get_context("fork").Value("i", 0)
    calls = [partial(_hold_for_build, arrived, 2, 150 * 2**20, k) for k in range(2)]
    calls += [partial(abs, -k) for k in range(4)]
    with memguard.memory_cap(memguard.resident_bytes() + 200 * 2**20, "lower it"):
        assert fork_map(calls, 2) == [(0, 1.0), (1, 1.0), 0, 1, 2, 3]
        assert arrived.value > 2                 # at least one ran again
        arrived = mp.get_context("fork").Value("i", 0)
        calls = [partial(_hold_for_build, arrived, 1, 300 * 2**20, 0), os.getpid]
        with pytest.raises(SearchMemoryExceeded, match="lower it"):
            fork_map(calls, 2)


def _times_out(limit, ceiling):
    raise SolveTimeout("time limit reached during a combine")


def _sleeps(limit, ceiling):
    time.sleep(60)
    return []


def test_a_workers_error_ends_the_search_and_stops_the_others():
    jobs = [_FIRST, Job("slow", _bound(1.0, 1.0), _sleeps), Job("late", _bound(2.0, 1.0), _times_out)]
    start = time.monotonic()
    with pytest.raises(SolveTimeout, match="while solving late"):
        run_jobs(jobs, Deadline(5.0, "the test model"), prune=False, workers=2)
    assert time.monotonic() - start < 30


def _one_point(limit, ceiling):
    return [Candidate(1.0, 1.0, 1.0, partial(_plan, Problem("first"), 0))]


def _ceiling_size(limit, ceiling):
    n = 0 if ceiling is None else len(ceiling)
    return [Candidate(2.0, -1.0 if limit is None else limit, 10.0 + n, partial(_plan, Problem("second"), 0))]


def test_jobs_start_with_the_frontier_found_or_a_time_limit_to_be_set_aside_by():
    """Jobs that start before anything is found (the first two, on two workers) get
    ``PROBE_S`` to solve in; those after start with what was found to cut against."""
    jobs = [Job("first", _bound(1.0, 1.0), _one_point)] + [Job(f"then {i}", _bound(2.0 + i, 0.5), _ceiling_size)
                                                            for i in range(3)]
    out, stats = run_jobs(jobs, Deadline(None, "test"), prune=True, workers=2)
    assert stats["workers"] == 2 and len(out) == 4 and stats["set_aside"] == 0
    started_blind = [c for c in out[1:] if c.peak_bytes == 10.0]
    assert len(started_blind) <= 1 and all(c.memory_bytes == PROBE_S for c in started_blind)
    assert all(c.memory_bytes == -1.0 for c in out[1:] if c.peak_bytes > 10.0)


def test_workers_find_the_frontier_one_process_finds():
    import tensoropt

    kw = dict(batch_size=16, max_mesh_dims=2, progress=False, references=False)
    one = tensoropt.frontier("gpt-tiny", "8xA100-80GB", workers=1, **kw)
    two = tensoropt.frontier("gpt-tiny", "8xA100-80GB", workers=2, **kw)
    assert one.stats["workers"] == 1 and two.stats["workers"] == 2
    assert two.stats["peak_search"] == one.stats["peak_search"]
    assert any(p.stages for p in one.plans) and len(one.plans) == len(two.plans)
    for p, q in zip(one.plans, two.plans):
        assert p.to_dict() == q.to_dict()


def test_where_captures_cannot_run_forked_the_parent_takes_them_to_the_same_frontier(monkeypatch):
    import tensoropt
    import tensoropt.search as search
    from tensoropt.capture.recapture import Recapture

    kw = dict(batch_size=16, max_mesh_dims=1, progress=False, references=False)
    one = tensoropt.frontier("gpt-tiny", "4xA100-80GB", workers=1, **kw)
    here = []                   # captures at a micro-batch size that ran in this process
    capture_model = search.capture_model

    def noting(*args):
        graph, module, recapture = capture_model(*args)
        at = recapture.capture_at
        recapture.capture_at = lambda b: here.append(b) or at(b)
        return graph, module, recapture
    monkeypatch.setattr(search, "capture_model", noting)
    monkeypatch.setattr(Recapture, "runs_forked", staticmethod(lambda: False))
    two = tensoropt.frontier("gpt-tiny", "4xA100-80GB", workers=2, **kw)
    assert two.stats["workers"] == 2 and here, here
    assert any(p.stages for p in two.plans)
    assert [p.to_dict() for p in two.plans] == [p.to_dict() for p in one.plans]


def test_the_parent_works_meanwhile_once_the_workers_are_forked():
    import os

    seen = []
    out = fork_map([os.getpid] * 3, 2, meanwhile=lambda: seen.append(os.getpid()))
    assert seen == [os.getpid()] and os.getpid() not in out and len(set(out)) <= 2

    def fails():
        raise ValueError("capture failed")
    with pytest.raises(ValueError, match="capture failed"):
        fork_map([os.getpid] * 3, 2, meanwhile=fails)


def test_workers_must_be_positive():
    import tensoropt

    with pytest.raises(ValueError, match="workers must be at least 1"):
        tensoropt.frontier("gpt-tiny", "2xA100-80GB", workers=0, progress=False)


def test_a_search_in_a_distributed_rank_stays_in_one_process_unless_told(monkeypatch):
    """A rank of an initialized process group is not forked by default (a child would copy it
    without its communication threads); an explicit ``workers`` still holds."""
    import torch.distributed as dist

    from tensoropt.search_options import SearchOptions
    from tensoropt.search_pool import usable_cpus

    assert SearchOptions().worker_count() == usable_cpus()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(29400 + os.getpid() % 500))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        assert SearchOptions().worker_count() == 1 and SearchOptions(workers=2).worker_count() == 2
    finally:
        dist.destroy_process_group()
    assert SearchOptions().worker_count() == usable_cpus()


def test_the_micro_batch_captures_workers_take_are_the_ones_recapture_would_make():
    from tensoropt.capture.recapture import capture_model

    graph, _, recapture = capture_model("gpt-tiny", batch_size=16)
    # a batch of one is always captured; of the others only the first, which fixes the interpolation
    assert recapture.captures_for([8, 4, 8, 1, 2]) == [8, 1]
    recapture.add(8, recapture.capture_at(8))        # as the search does with a worker's capture
    assert recapture.captures_for([8, 4, 1, 2]) == [1]
    assert recapture(4) == recapture.capture_at(4)   # interpolated from the two, as captured
    assert recapture(16) is graph
