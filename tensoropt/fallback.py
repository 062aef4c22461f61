"""The ε fallback of a search's jobs: a job whose exact solve would end the search is solved
again (1+ε)-approximately.

:func:`solve_job` runs one job (``search_jobs.Job``) for ``search_jobs.run_jobs`` and for the
forked workers of ``search_pool``. Where the exact solve passes the search's memory cap, or
``FALLBACK_SHARE`` of the time the search has left, the job is solved again with the fallback
ε, whose grid keeps every set of partial plans smaller (``engine.solve``,
``engine.peaksolve.solve_peak``): each plan the exact solve would return then has one no slower
within a factor (1 + ε) of its memory, in the memory the job searched. The caller records
which jobs fell back and why (``Frontier.stats["approximated"]``, ``Frontier.caption``).
"""

from __future__ import annotations

import numpy as np

from .engine import SolveTimeout, memguard
from .engine.memguard import SearchMemoryExceeded

__all__ = ["solve_job", "FALLBACK_SHARE"]

# Under a time limit, the share of the time left that a job's exact solve may take before the
# job is solved again with the fallback ε (which then has the rest).
FALLBACK_SHARE = 0.5


def solve_job(job, deadline, found: np.ndarray | None, fallback: float | None = None
              ) -> tuple[list, dict | None]:
    """``job``'s candidates and None -- or, where its exact solve passed the memory cap or
    ``FALLBACK_SHARE`` of the time left (``deadline``: the search's ``search_options.Deadline``)
    and ``fallback`` is an ε above the search's own, those of its (1+ε)-approximate solve and a
    record of why (``{"job", "epsilon", "reason"}``). Without ``fallback`` the job's errors end
    the search as they are."""
    limit = deadline.remaining_s()
    first = limit if fallback is None or limit is None else limit * FALLBACK_SHARE
    reason = None
    with deadline.solving(job.label):
        try:
            return job.solve(first, found), None
        except SearchMemoryExceeded:
            if fallback is None:
                raise
            reason = "memory"
        except SolveTimeout:
            if fallback is None or first == limit:
                raise
            reason = "time"
    # out of the handler: what the failed solve held is freed before the second one runs
    with deadline.solving(f"{job.label} (again with epsilon = {fallback:g}, the exact solve passing "
                          f"{'its memory cap' if reason == 'memory' else 'its share of the time'})"):
        memguard.check()
        out = job.solve(deadline.remaining_s(), found, epsilon=fallback)
    return out, {"job": job.label, "epsilon": fallback, "reason": reason}
