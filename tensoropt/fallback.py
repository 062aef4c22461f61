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

:func:`solve_in_turn` runs jobs one after another (the serial search, and each worker's group
of jobs): it skips those the frontier found so far dominates, and a job whose chain's job
before it (the ZeRO stages of one mesh: like graphs, like cost to solve) fell back starts at
the ε that one needed instead of repeating its failed attempts. While nothing has been found
yet, it gives a job ``PROBE_S`` to solve exactly first: one that needs longer is set aside,
with the rest of its chain, and solved after the others, against the frontier they found. A
job solved first has nothing to cut its partial plans against and can keep a frontier far
larger than the one it keeps after (GPT-3 175B on 128x8 A100, mesh 128x8 ZeRO stage 0 first:
more than 300,000 points in five minutes).
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from .engine import SolveTimeout, memguard
from .engine.bounds import dominated
from .engine.memguard import SearchCrowdedOut, SearchMemoryExceeded
from .engine.pareto import pareto

__all__ = ["solve_job", "solve_in_turn", "with_candidates", "FALLBACK_SHARE", "FALLBACK_STEPS", "PROBE_S",
           "PROBE_JOBS"]

# Under a time limit, the share of the time left that an attempt may take before the next one,
# with a larger ε, has the rest.
FALLBACK_SHARE = 0.5
# The attempts after the exact one: the fallback ε, then ten times it.
FALLBACK_STEPS = (1.0, 10.0)
# While the frontier found so far is empty: the seconds a job may take before it is set aside,
# and how many jobs a search sets aside at most (each costs up to PROBE_S of work thrown away).
PROBE_S = 10.0
PROBE_JOBS = 4


def solve_in_turn(jobs: list, indices: list[int], deadline, found: np.ndarray, prune: bool,
                  fallback: float | None, bar=None, probes: int = 0, found_elsewhere=None
                  ) -> tuple[dict[int, list | None], dict[int, dict], list[int]]:
    """Jobs ``indices`` in that order: per index its candidates, or None where ``prune`` and
    ``found`` (the frontier found so far, (time, peak) points; it grows with each job's) already
    dominate its bound; the records of those solved with ε (:func:`solve_job`); and the jobs
    set aside, in order: while ``found`` is empty, up to ``probes`` jobs that took more than
    ``PROBE_S`` to solve exactly, with the later jobs of their chains (left out of the first
    two); ``found_elsewhere()`` (a forked worker's: whether another worker has found plans since)
    ends such a probe at once. ``bar`` shows each job's label and advances once per job solved
    or skipped."""
    out: dict[int, list | None] = {}
    approx: dict[int, dict] = {}
    needed: dict[str, float] = {}          # chain -> the ε its last job fell back to
    aside: list[int] = []
    aside_chains: set[str] = set()
    n_probed_out = 0
    for i in indices:
        job = jobs[i]
        if job.chain in aside_chains:
            aside.append(i)
            continue
        if bar is not None:
            bar.set_postfix_str(job.label)
        memguard.check()
        if prune and dominated(job.bound.time_within, job.bound.memory_min, found):
            out[i] = None
        else:
            probe = PROBE_S if prune and not len(found) and n_probed_out < probes else None
            out[i], why = solve_job(job, deadline, found if prune else None, fallback,
                                    start=needed.get(job.chain) if job.chain else None, probe_s=probe,
                                    probe_ended=found_elsewhere)
            if out[i] is None:
                out.pop(i)
                aside.append(i)
                n_probed_out += 1
                if job.chain:
                    aside_chains.add(job.chain)
                continue
            if why is not None:
                approx[i] = why
                if job.chain:
                    needed[job.chain] = why["epsilon"]
            if out[i]:
                found = with_candidates(found, out[i])
        if bar is not None:
            bar.update(1)
    return out, approx, aside


@contextmanager
def _ends_when(ended):
    """Within the block, a solve stops (``SolveTimeout``) at its next check once ``ended()``."""
    if ended is None:
        yield
        return

    def stop() -> None:
        if ended():
            raise SolveTimeout("plans were found elsewhere meanwhile: the probe ends")
    with memguard.interrupt_when(stop):
        yield


def with_candidates(found: np.ndarray, candidates: list) -> np.ndarray:
    """The frontier found so far, (time, peak) points, grown by a job's candidates."""
    if not candidates:
        return found
    return pareto(np.vstack([found, [(c.time_s, c.peak_bytes) for c in candidates]]))


def solve_job(job, deadline, found: np.ndarray | None, fallback: float | None = None,
              start: float | None = None, probe_s: float | None = None,
              probe_ended=None) -> tuple[list | None, dict | None]:
    """``job``'s candidates and None -- or, where its exact solve passed the memory cap or
    ``FALLBACK_SHARE`` of the time left (``deadline``: the search's ``search_options.Deadline``)
    and ``fallback`` is an ε above the search's own, those of its (1+ε)-approximate solve and a
    record of it (``{"job", "epsilon", "reason"}``): ε is ``fallback``, or ten times it where
    that too passed the cap or its share of the time. ``start``: the ε the job before it in its
    chain fell back to; the attempts below it are skipped (reason ``"chain"``). Without
    ``fallback`` the job's errors end the search as they are. ``probe_s``: the exact solve
    gets at most that long, and where it needs more the job is set aside (None, None) -- where
    the time left would give it more than that; ``probe_ended()`` turning true sets it aside
    sooner (the job would be solved again against plans found meanwhile)."""
    attempts = [None] + ([] if fallback is None else [fallback * k for k in FALLBACK_STEPS])
    reason = None
    if start is not None and fallback is not None:
        attempts = [e for e in attempts[1:] if e >= start * (1 - 1e-9)] or attempts[-1:]
        reason = "chain"
    for n, eps in enumerate(attempts):
        last = n == len(attempts) - 1
        limit = deadline.remaining_s()
        with deadline.solving(_what(job, eps, reason)):
            share = limit if last or limit is None else limit * FALLBACK_SHARE
            probing = eps is None and probe_s is not None and (share is None or share > probe_s)
            try:
                if eps is None:
                    with _ends_when(probe_ended if probing else None):
                        return job.solve(probe_s if probing else share, found), None
                memguard.check()
                return job.solve(share, found, epsilon=eps), {"job": job.label, "epsilon": eps, "reason": reason}
            except SearchCrowdedOut:
                raise                 # not this job's size: the pool runs it again with fewer beside it
            except SearchMemoryExceeded:
                if last:
                    raise
                reason = "memory"
            except SolveTimeout:
                if probing:
                    return None, None
                if last or limit is None:
                    raise
                reason = "time"
        # out of the handler: what the failed attempt held is freed before the next one runs
    raise AssertionError("unreachable")


def _what(job, eps: float | None, reason: str | None) -> str:
    """The job's label for error messages, with the ε it is being solved with and why."""
    if eps is None:
        return job.label
    if reason == "chain":
        return f"{job.label} (with epsilon = {eps:g}, as the job before it on {job.chain} needed)"
    before = "its memory cap" if reason == "memory" else "its share of the time"
    return f"{job.label} (again with epsilon = {eps:g}, the solve before passing {before})"
