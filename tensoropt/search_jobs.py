"""A frontier search as a list of jobs, each bounded before it is solved.

A job is one mesh and ZeRO stage, or one pipeline shape (stages, micro-batches, stage mesh).
Before any is solved each gets a lower bound on the plans it can give (``engine.bounds``:
least time, least memory and the convex envelope between them, in the cost graph's
end-of-forward memory, which no plan's peak is below). Jobs are then solved fastest bound
first, and a job whose bound lies wholly on or above the frontier found so far is skipped:
none of its plans could reach the frontier, so the frontier is the one solving every job
would give, found with less work. A job that is solved is handed that frontier too, to
drop partial plans it already dominates (``engine.solve``'s ``ceiling``); while nothing has
been found, a job that would take long is set aside until the rest are solved
(``fallback.solve_in_turn``), for the same reason. Candidates come
back in the jobs' own order, so ties on the merged frontier go the same way whichever jobs
ran. With ``workers > 1`` the jobs are solved in forked processes (``search_pool``), to the
same frontier.

With a ``fallback`` ε, a job whose exact solve passes the search's memory cap, or takes more
than its share of the time the search has left, is solved again (1+ε)-approximately
(``fallback.solve_job``) instead of ending the search; the run's stats list every such job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from .fallback import PROBE_JOBS, solve_in_turn, with_candidates
from .plan_builder import Candidate
from .search_options import Deadline
from .search_pool import can_fork, groups_of, run_parallel

__all__ = ["Bound", "Job", "run_jobs"]


class Bound(Protocol):
    time_min: float
    memory_min: float

    def time_within(self, budget: float) -> float: ...


@dataclass(frozen=True)
class Job:
    label: str                                              # e.g. "mesh 2x4, ZeRO stage 2"
    bound: Bound
    # (time limit, the frontier found so far as (time, peak) points or None) -> its frontier
    # points; it may leave out those the frontier found so far strictly dominates. Called with
    # ``epsilon=`` too, it solves (1+ε)-approximately whatever the search asked for
    # (``solve_job``'s fallback).
    solve: Callable[..., list[Candidate]]
    # jobs of one chain hand state on to each other in order (one worker runs them in turn)
    chain: str = ""


def run_jobs(jobs: list[Job], deadline: Deadline, bar=None, prune: bool = True,
             workers: int = 1, fallback: float | None = None) -> tuple[list[Candidate], dict]:
    """Every job's candidates, in job order, skipping those the frontier found so far
    dominates (``prune``); ``bar`` advances once per job; ``workers > 1``: in that many forked
    processes where the platform forks; ``fallback``: see ``fallback.solve_job``. While nothing
    is found yet, up to ``PROBE_JOBS`` jobs that take longer than ``fallback.PROBE_S`` are set
    aside and solved last (``fallback.solve_in_turn``). Stats: jobs, skipped, workers,
    set_aside (how many jobs were, chains included), crowded_out and concurrency (groups of
    jobs run again with fewer beside them to stay within the memory cap, and how many could
    run at once at the end: ``search_pool.run_parallel``), approximated (the jobs solved with
    the fallback ε, in job order)."""
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].bound.time_min, jobs[i].bound.memory_min, i))
    if workers > 1 and can_fork() and len(groups_of(jobs, order)) > 1:
        results, skipped, approx, pool = run_parallel(jobs, order, deadline, bar, prune, workers, fallback,
                                                      probes=PROBE_JOBS)
        return [c for r in results for c in r], {"jobs": len(jobs), "skipped": skipped, **pool,
                                                 "approximated": [approx[i] for i in sorted(approx)]}
    out, approx, aside = solve_in_turn(jobs, order, deadline, np.zeros((0, 2)), prune, fallback, bar,
                                       probes=PROBE_JOBS)
    if aside:
        found = with_candidates(np.zeros((0, 2)), [c for r in out.values() if r for c in r])
        later, more, _ = solve_in_turn(jobs, aside, deadline, found, prune, fallback, bar)
        out.update(later)
        approx.update(more)
    results = [out[i] or [] for i in range(len(jobs))]
    skipped = sum(c is None for c in out.values())
    return [c for r in results for c in r], {"jobs": len(jobs), "skipped": skipped, "workers": 1,
                                             "set_aside": len(aside), "crowded_out": 0, "concurrency": 1,
                                             "approximated": [approx[i] for i in sorted(approx)]}
