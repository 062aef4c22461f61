"""A search's jobs built and solved in forked worker processes (``SearchOptions.workers``).

:func:`fork_map` builds the jobs (cost graphs and their bounds) in workers and sends them
back; :func:`run_parallel` solves them. Its workers are forked after every job is built, so
each has the jobs and all they refer to without pickling them; a worker sends back only what
it found. Objects that existed before
the fork travel as references (pickle's ``persistent_id``): a candidate's plan builder comes
back pointing at the parent's own problem and graph, not at a copy of them.

Jobs that share state in order (the ZeRO stages of one mesh hand on which peak search they
needed: ``Job.chain``) run in one worker, in the order the serial search runs them. The
parent hands each group the frontier found so far, so a group skips what it dominates as the
serial search would; skipping never changes the frontier (``search_jobs``). One memory cap
holds over the parent and every worker (``memguard.share_cap``). A group crowded out of it
by the others (``memguard.SearchCrowdedOut``) runs again later, and from then on fewer
groups run at once: at the end a group that runs alone meets the cap as one process would.
"""

from __future__ import annotations

import dataclasses
import io
import multiprocessing as mp
import os
import pickle
import sys
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from functools import partial

import numpy as np

from .engine import memguard
from .fallback import solve_in_turn, with_candidates

__all__ = ["usable_cpus", "can_fork", "fork_map", "run_parallel"]

_PRIMITIVE = (type(None), bool, int, float, complex, str, bytes, np.ndarray, np.generic)
_STATE: dict = {}            # set in the parent just before the workers fork; they read it


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether workers may be forked: on Linux (macOS forks, but a forked child of a process
    that has used its system frameworks may crash, which is why Python spawns there)."""
    return sys.platform.startswith("linux") and "fork" in mp.get_all_start_methods()


def _references(jobs) -> dict[int, object]:
    """The objects the jobs' solvers hold (their arguments, and the items of argument lists
    and tuples, three levels down), by ``id``: what results may refer to without a copy."""
    return _references_of([job.solve for job in jobs])


def _references_of(calls) -> dict[int, object]:
    """The same for calls: the arguments of partials, the defaults and closure variables of
    functions, the items of lists and tuples and the fields of dataclasses among them (a
    context's graph, the graph's operators), a few levels down."""
    refs: dict[int, object] = {}

    def walk(x, depth: int) -> None:
        if isinstance(x, _PRIMITIVE) or isinstance(x, dict) or id(x) in refs:
            return
        if isinstance(x, (list, tuple)):
            for y in (x if depth > 0 else ()):
                walk(y, depth - 1)
            return
        refs[id(x)] = x
        if isinstance(x, partial):
            for y in (x.func, *x.args, *x.keywords.values()):
                walk(y, depth)
        elif callable(x) and hasattr(x, "__code__"):
            for y in (x.__defaults__ or ()):
                walk(y, depth)
            for cell in (x.__closure__ or ()):
                try:
                    walk(cell.cell_contents, depth)
                except ValueError:          # an empty cell
                    pass
        elif depth > 0 and dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name, None), depth - 1)
    for call in calls:
        walk(call, 4)
    return refs


def _counters(refs: dict[int, object]) -> dict[int, Counter]:
    """Counters the solvers fill as they run (``PlanContext.peak_searches``), by ``id``."""
    out = {}
    for obj in refs.values():
        c = getattr(obj, "peak_searches", None)
        if isinstance(c, Counter):
            out[id(c)] = c
    return out


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        return id(obj) if id(obj) in _STATE["refs"] and not isinstance(obj, _PRIMITIVE) else None


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        return _STATE["refs"][pid]


class _SharedCap:
    """What the parent and its forked workers share to hold one memory cap: each worker's
    growth since it forked (a slot each; the last one the parent's own growth since then),
    the largest total seen, and how many calls or groups run now."""

    def __init__(self, workers: int):
        fork = mp.get_context("fork")
        self.parent_bytes = memguard.resident_bytes() or 0.0
        self.growth = fork.RawArray("d", workers + 1)
        self.next_slot = fork.Value("i", 0)
        self.peak = fork.RawValue("d", self.parent_bytes)
        self.running = fork.RawValue("i", 0)
        self.found = fork.RawValue("i", 0)          # whether the parent holds found plans

    def held(self) -> float:
        """In the parent: what the parent and every worker hold together (its own growth
        written where the workers count it)."""
        rss = memguard.resident_bytes()
        if rss is not None:
            self.growth[len(self.growth) - 1] = max(rss - self.parent_bytes, 0.0)
        total = self.parent_bytes + sum(self.growth[:])
        self.peak.value = max(self.peak.value, total)
        return total

    def counting(self):
        return memguard.counting(self.held, lambda: self.running.value > 1)

    def pool(self, workers: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"), initializer=_start_worker,
                                   initargs=(self.growth, self.next_slot, self.parent_bytes, self.peak, self.running,
                                             self.found))


def _start_worker(growth, next_slot, parent_bytes: float, peak, running, found=None) -> None:
    _STATE["found_flag"] = found
    with next_slot.get_lock():
        slot = next_slot.value
        next_slot.value += 1
    memguard.share_cap(growth, slot, parent_bytes, peak, running)


def _solve_group(indices: list[int], found: np.ndarray, probes: int) -> bytes:
    """Run one group's jobs in order (in a worker); their candidates (None: skipped), how much
    each counter grew and the jobs set aside (``fallback.solve_in_turn``'s ``probes``),
    pickled with references to what the parent holds; None where the group was crowded out
    (its results are dropped: it runs again)."""
    jobs, deadline, prune, fallback = _STATE["jobs"], _STATE["deadline"], _STATE["prune"], _STATE["fallback"]
    counters = _STATE["counters"]
    flag = _STATE.get("found_flag")
    before = {k: Counter(c) for k, c in counters.items()}
    try:
        result = solve_in_turn(jobs, indices, deadline, found, prune, fallback, probes=probes,
                               found_elsewhere=None if flag is None else (lambda: flag.value > 0))
    except memguard.SearchCrowdedOut:
        result = None
    if result is None:
        for k, c in counters.items():
            c.clear()
            c.update(before[k])
        memguard.release()
        return pickle.dumps(None)
    out, approx, aside = result
    grown = {k: c - before[k] for k, c in counters.items()}
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump((out, approx, grown, aside))
    del result, out
    memguard.release()
    return buf.getvalue()


def _call(i: int) -> bytes:
    """``calls[i]()`` (in a worker), pickled as (False, result), or (True, None) where it was
    crowded out of the memory cap (it runs again)."""
    try:
        result = (False, _STATE["calls"][i]())
    except memguard.SearchCrowdedOut:
        result = (True, None)
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(result)
    del result
    memguard.release()
    return buf.getvalue()


def fork_map(calls: list, workers: int, done=None, meanwhile=None) -> list:
    """``[call() for call in calls]`` in forked workers, in order; results refer to what the
    calls' arguments held before the fork (not copies). ``done(result)`` runs in the parent
    as each result arrives; ``meanwhile()``, if given, runs in the parent once the workers
    are forked, before it waits for them (what the calls do not need, e.g. torch work that
    stays in the parent). A call crowded out of the memory cap runs again later, with fewer
    calls beside it from then on."""
    workers = max(1, min(workers, len(calls)))
    _STATE.update(calls=calls, refs=_references_of(calls))
    shared = _SharedCap(workers)
    out: list = [None] * len(calls)
    # every call is queued at once, so that workers go on while the parent works meanwhile;
    # after a call is crowded out, those not started yet are taken back and fed ``limit`` at a time
    queue, pending, limit = list(range(len(calls))), {}, len(calls)
    try:
        with shared.counting(), shared.pool(workers) as pool:
            try:
                def submit() -> None:
                    while queue and len(pending) < limit:
                        i = queue.pop(0)
                        pending[pool.submit(_call, i)] = i
                    shared.running.value = min(len(pending), workers)
                submit()
                if meanwhile is not None:        # the workers exist: they forked at the first submit
                    meanwhile()
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        i = pending.pop(fut)
                        shared.running.value = min(len(pending), workers)
                        crowded, result = _Unpickler(io.BytesIO(fut.result())).load()
                        if crowded:
                            taken_back = [j for f, j in list(pending.items()) if f.cancel()]
                            pending = {f: j for f, j in pending.items() if not f.cancelled()}
                            limit = max(1, min(limit - 1, workers - 1, len(pending)))
                            queue[:0] = sorted([i, *taken_back])
                            continue
                        out[i] = result
                        if done is not None:
                            done(result)
                    memguard.check()
                    submit()
            except BaseException:
                _stop(pool)
                raise
    finally:
        _STATE.clear()
    return out


def _stop(pool) -> None:
    """End a pool at once: a worker's error (a time limit, the memory cap) ends the search."""
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


def groups_of(jobs, order: list[int]) -> list[list[int]]:
    """Jobs grouped by ``Job.chain`` (a job without one is its own group), each group in
    ``order`` and the groups in the order of their first job."""
    groups: dict[object, list[int]] = {}
    for i in order:
        groups.setdefault(jobs[i].chain or ("job", i), []).append(i)
    return list(groups.values())


def run_parallel(jobs, order: list[int], deadline, bar, prune: bool, workers: int,
                 fallback: float | None = None, probes: int = 0) -> tuple[list, int, dict, dict]:
    """Per job its candidates (or [] where skipped), how many were skipped, the jobs solved
    with the ``fallback`` ε (index -> ``fallback.solve_job``'s record), and stats of the
    pool: workers, the most memory parent and workers held together at any check, and how
    many jobs were set aside and how many groups were crowded out of the memory cap (run
    again with fewer beside them; ``concurrency`` is how many could run at once at the end).
    A job started with nothing to cut against can keep a frontier
    many times the size it keeps in one process: until something is found, groups start with
    ``fallback.PROBE_S`` to solve their first job and are set aside where it needs longer, or
    as soon as another group has found plans, up to ``probes`` of them; past that, such a
    group runs alone. A group set aside runs again next once plans are found (before the
    groups not started yet: it is long, and they can run beside it)."""
    groups = groups_of(jobs, order)
    workers = max(1, min(workers, len(groups)))
    refs = _references(jobs)
    counters = _counters(refs)
    shared = _SharedCap(workers)
    running = shared.running
    _STATE.update(jobs=jobs, deadline=deadline, prune=prune, refs=refs, counters=counters, fallback=fallback)
    results: list[list] = [[] for _ in jobs]
    skipped = 0
    approximated: dict[int, dict] = {}
    found = np.zeros((0, 2))
    pending: dict = {}                     # future -> (its group, whether it probes)
    queue = list(groups)
    aside: list[list[int]] = []
    limit, crowded = workers, 0            # how many groups may run at once; how often one was crowded out
    try:
        with shared.counting(), shared.pool(workers) as pool:
            try:
                while queue or pending:
                    while queue and len(pending) < limit:
                        # a group set aside goes first once there is something to cut against:
                        # it is known to be long, and the others can run beside it
                        k = next((k for k, g in enumerate(queue) if g in aside), 0) if len(found) else 0
                        group = queue[k]
                        probe = (not len(found) and group not in aside
                                 and probes > len(aside) + sum(p for _, p in pending.values()))
                        if not len(found) and not probe and pending:
                            break      # with nothing to cut against and no time limit, it runs alone
                        queue.pop(k)
                        fut = pool.submit(_solve_group, group, found, int(probe))
                        pending[fut] = (group, probe)
                        running.value = len(pending)
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in done:
                        group, _ = pending.pop(fut)
                        running.value = len(pending)
                        result = _Unpickler(io.BytesIO(fut.result())).load()
                        if result is None:
                            crowded += 1
                            limit = max(1, min(limit - 1, len(pending)))
                            queue.insert(0, group)
                            continue
                        out, approx, grown, set_aside = result
                        if set_aside:
                            aside.append(set_aside)
                            queue.append(set_aside)
                        approximated.update(approx)
                        for k, delta in grown.items():
                            counters[k].update(delta)
                        for i, cands in out.items():
                            if cands is None:
                                skipped += 1
                            else:
                                results[i] = cands
                                if cands:
                                    found = with_candidates(found, cands)
                                    shared.found.value = 1       # a probe running elsewhere ends
                        if bar is not None:
                            bar.update(len(group) - len(set_aside))
                    memguard.check()
            except BaseException:
                _stop(pool)
                raise
    finally:
        _STATE.clear()
    return results, skipped, approximated, {"workers": workers, "peak_resident_bytes": float(shared.peak.value),
                                            "set_aside": sum(map(len, aside)), "crowded_out": crowded,
                                            "concurrency": limit}
