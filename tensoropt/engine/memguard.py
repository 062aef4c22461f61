"""A search's own memory cap: checked where the engine grows, so that a search too large for
the machine stops with an error that says what to change, and never by the kernel's OOM
killer.

:func:`memory_cap` sets the cap for the code it wraps; :func:`check` (called at every chunk
of every combine) raises :class:`SearchMemoryExceeded` once the process's resident memory is
past it. Resident memory is read from ``/proc/self/statm``; elsewhere the check is skipped.
A search split over forked workers (``search_pool``) holds one cap over all of them: each
worker's :func:`share_cap` counts what the parent held when it forked plus every worker's
growth since, kept in memory the workers share. Where they pass the cap together while
several run, a worker raises :class:`SearchCrowdedOut` instead: the pool runs its work again
with fewer beside it, so that running jobs side by side never changes what a search finds.
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager

__all__ = ["SearchMemoryExceeded", "SearchCrowdedOut", "memory_cap", "check", "resident_bytes",
           "available_bytes", "share_cap", "counting", "release", "interrupt_when"]


class SearchMemoryExceeded(MemoryError):
    """A search went past its memory cap."""


class SearchCrowdedOut(SearchMemoryExceeded):
    """A worker's search passed the cap together with the others running beside it: its work
    is run again with fewer of them (``search_pool``), not approximated or given up."""


_cap: list[tuple[float, str]] = []          # innermost last: (bytes, what to say when it is passed)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_held = None          # in a worker: () -> the memory held by the parent and all workers together
_crowded = None       # in a worker: () -> whether other workers are solving beside it now
_defer = None         # in their parent: () -> whether several workers run (they judge the cap then)
_interrupts: list = []  # innermost last: () -> None, raising to stop the solve that runs


def resident_bytes() -> float | None:
    """This process's resident memory (None where it cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def available_bytes() -> float | None:
    """Memory the system can still give (``MemAvailable``), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


@contextmanager
def memory_cap(limit_bytes: float | None, advice: str = ""):
    """Within the block, :func:`check` raises once resident memory passes ``limit_bytes``
    (None: no cap); ``advice`` ends the error message."""
    if limit_bytes is None:
        yield
        return
    _cap.append((float(limit_bytes), advice))
    try:
        yield
    finally:
        _cap.pop()


def share_cap(growth, slot: int, parent_bytes: float, peak=None, running=None) -> None:
    """In a forked worker: :func:`check` counts ``parent_bytes`` (the parent's resident memory
    when it forked) plus the sum of ``growth`` (a shared array of doubles, one per worker),
    where this worker writes its own growth above its resident memory now at ``slot``;
    ``peak`` (a shared double), if given, keeps the largest total seen; ``running`` (a shared
    int), if given, counts the workers solving now: past the cap with others beside it, the
    worker is crowded out (:class:`SearchCrowdedOut`)."""
    global _held, _crowded, _defer
    _defer = None                     # the parent's, copied by the fork
    base = resident_bytes()
    if base is None:
        return

    def held() -> float:
        rss = resident_bytes()
        growth[slot] = max(rss - base, 0.0)
        total = parent_bytes + sum(growth[:])
        if peak is not None and total > peak.value:
            peak.value = total
        return total
    _held = held
    _crowded = None if running is None else (lambda: running.value > 1)


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim``, loaded once (None off glibc)."""
    try:
        import ctypes
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release() -> None:
    """Hand memory the process freed back to the system (glibc's ``malloc_trim``: freed heap
    pages otherwise stay resident and count against the cap while a worker waits for its next
    job), and count this worker's growth again."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    if _held is not None:
        _held()


@contextmanager
def counting(held, workers_running=None):
    """Within the block, :func:`check` compares ``held()`` (bytes) with the cap, not this
    process's resident memory alone (the parent of forked workers counts theirs too); while
    ``workers_running()`` says several workers run, it does not raise: one of them steps back
    (:class:`SearchCrowdedOut`), which the parent cannot do."""
    global _held, _defer
    before = _held, _defer
    _held, _defer = held, workers_running
    try:
        yield
    finally:
        _held, _defer = before


@contextmanager
def interrupt_when(stop):
    """Within the block, :func:`check` also calls ``stop()``, which may raise: :func:`check`
    runs at every chunk of every combine, so that is where a solve can be stopped from outside
    (a forked worker's probe, once another worker has found plans: ``search_pool``)."""
    _interrupts.append(stop)
    try:
        yield
    finally:
        _interrupts.pop()


def check() -> None:
    if _interrupts:
        _interrupts[-1]()
    if not _cap:
        if _held is not None:
            _held()
        return
    limit, advice = _cap[-1]
    rss = _held() if _held is not None else resident_bytes()
    if rss is not None and rss > limit:
        if _defer is not None and _defer():
            return
        if _crowded is not None and _crowded():
            raise SearchCrowdedOut(f"the search's workers hold {rss / 2**30:.2f} GiB together, past its memory cap "
                                   f"of {limit / 2**30:.2f} GiB")
        raise SearchMemoryExceeded(
            f"the search holds {rss / 2**30:.2f} GiB, past its memory cap of {limit / 2**30:.2f} GiB"
            + (f". {advice}" if advice else ""))
