"""A search's own memory cap: checked where the engine grows, so that a search too large for
the machine stops with an error that says what to change, and never by the kernel's OOM
killer.

:func:`memory_cap` sets the cap for the code it wraps; :func:`check` (called at every chunk
of every combine) raises :class:`SearchMemoryExceeded` once the process's resident memory is
past it. Resident memory is read from ``/proc/self/statm``; elsewhere the check is skipped.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

__all__ = ["SearchMemoryExceeded", "memory_cap", "check", "resident_bytes", "available_bytes"]


class SearchMemoryExceeded(MemoryError):
    """A search went past its memory cap."""


_cap: list[tuple[float, str]] = []          # innermost last: (bytes, what to say when it is passed)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


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


def check() -> None:
    if not _cap:
        return
    limit, advice = _cap[-1]
    rss = resident_bytes()
    if rss is not None and rss > limit:
        raise SearchMemoryExceeded(
            f"the search holds {rss / 2**30:.2f} GiB, past its memory cap of {limit / 2**30:.2f} GiB"
            + (f". {advice}" if advice else ""))
