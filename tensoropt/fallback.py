"""The ε fallback of a search's jobs: a job whose exact solve would end the search is solved
again (1+ε)-approximately.

:func:`solve_job` runs one job (``search_jobs.Job``) for ``search_jobs.run_jobs`` and for the
forked workers of ``search_pool``. Where the exact solve passes the search's memory cap, or
``FALLBACK_SHARE`` of the time the search has left, the job is solved again with the fallback
ε, then with ten times it (``FALLBACK_STEPS``). An ε grid keeps every set of partial plans
smaller (``engine.solve``, ``engine.peaksolve.solve_peak``), and each plan the exact solve
would return then has one no slower within a factor (1 + ε) of its memory, in the memory the
job searched. The caller records which jobs fell back and why
(``Frontier.stats["approximated"]``, ``Frontier.caption``).
"""

from __future__ import annotations

import numpy as np

from .engine import SolveTimeout, memguard
from .engine.memguard import SearchMemoryExceeded

__all__ = ["solve_job", "FALLBACK_SHARE", "FALLBACK_STEPS"]

# Under a time limit, the share of the time left that an attempt may take before the next one,
# with a larger ε, has the rest.
FALLBACK_SHARE = 0.5
# The attempts after the exact one: the fallback ε, then ten times it.
FALLBACK_STEPS = (1.0, 10.0)


def solve_job(job, deadline, found: np.ndarray | None, fallback: float | None = None
              ) -> tuple[list, dict | None]:
    """``job``'s candidates and None -- or, where its exact solve passed the memory cap or
    ``FALLBACK_SHARE`` of the time left (``deadline``: the search's ``search_options.Deadline``)
    and ``fallback`` is an ε above the search's own, those of its (1+ε)-approximate solve and a
    record of it (``{"job", "epsilon", "reason"}``): ε is ``fallback``, or ten times it where
    that too passed the cap or its share of the time. Without ``fallback`` the job's errors end
    the search as they are."""
    attempts = [None] + ([] if fallback is None else [fallback * k for k in FALLBACK_STEPS])
    reason = None
    for n, eps in enumerate(attempts):
        last = n == len(attempts) - 1
        limit = deadline.remaining_s()
        what = job.label if eps is None else (
            f"{job.label} (again with epsilon = {eps:g}, the solve before passing "
            f"{'its memory cap' if reason == 'memory' else 'its share of the time'})")
        with deadline.solving(what):
            share = limit if last or limit is None else limit * FALLBACK_SHARE
            try:
                if eps is None:
                    return job.solve(share, found), None
                memguard.check()
                return job.solve(share, found, epsilon=eps), {"job": job.label, "epsilon": eps, "reason": reason}
            except SearchMemoryExceeded:
                if last:
                    raise
                reason = "memory"
            except SolveTimeout:
                if last or limit is None:
                    raise
                reason = "time"
        # out of the handler: what the failed attempt held is freed before the next one runs
    raise AssertionError("unreachable")
