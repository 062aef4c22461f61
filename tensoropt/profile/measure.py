"""Timing of one benchmark: warm-up, auto-ranged repeats, median and spread.

CPU: ``time.perf_counter`` around ``calls_per_repeat`` calls. CUDA: events recorded on the
benchmark device's current stream around the calls, that device synchronised before reading
them (not the current device, which may be another GPU). Each repeat's time is divided by its
call count, so TimeStats are per call of ``fn``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from .data import TimeStats

__all__ = ["TimingBudget", "time_fn", "stats_from_samples"]


@dataclass(frozen=True)
class TimingBudget:
    warmup_calls: int = 2          # at least this many untimed calls first
    warmup_s: float = 0.02         # ... and at least this long
    min_repeat_s: float = 1e-3     # a repeat runs enough calls to last this long
    target_s: float = 0.3          # total timed seconds to aim for
    min_repeats: int = 5
    max_repeats: int = 50


QUICK_BUDGET = TimingBudget(warmup_calls=1, warmup_s=0.005, min_repeat_s=5e-4, target_s=0.03,
                            min_repeats=3, max_repeats=10)
FULL_BUDGET = TimingBudget()


def stats_from_samples(samples_s: list[float], calls_per_repeat: int = 1) -> TimeStats:
    import numpy as np
    if not samples_s:
        raise ValueError("no timing samples")
    a = np.asarray(samples_s, dtype=float)
    q25, med, q75 = (float(v) for v in np.percentile(a, [25, 50, 75]))
    return TimeStats(median_s=med, q25_s=q25, q75_s=q75, min_s=float(a.min()), max_s=float(a.max()),
                     repeats=len(samples_s), calls_per_repeat=calls_per_repeat)


def time_fn(fn: Callable[[], object], *, cuda: bool = False, budget: TimingBudget = FULL_BUDGET,
            device=None) -> TimeStats:
    """Per-call time of ``fn`` (median and spread over repeats); ``cuda``: of its kernels on
    ``device`` (None: the current CUDA device)."""
    sync = (lambda: _cuda_sync(device)) if cuda else _no_sync
    # warm-up, which also estimates the per-call time
    t0 = time.perf_counter()
    n = 0
    while n < budget.warmup_calls or time.perf_counter() - t0 < budget.warmup_s:
        fn()
        sync()
        n += 1
    est_s = max((time.perf_counter() - t0) / n, 1e-9)
    calls = max(1, math.ceil(budget.min_repeat_s / est_s))
    repeats = int(min(budget.max_repeats, max(budget.min_repeats, budget.target_s // (calls * est_s))))
    samples = _repeat_cuda(fn, calls, repeats, device) if cuda else _repeat_cpu(fn, calls, repeats)
    return stats_from_samples(samples, calls)


def _no_sync() -> None:
    return None


def _cuda_sync(device=None) -> None:
    import torch
    torch.cuda.synchronize(device)


def _repeat_cpu(fn, calls: int, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    return out


def _repeat_cuda(fn, calls: int, repeats: int, device=None) -> list[float]:
    import torch
    stream = torch.cuda.current_stream(device)     # where fn's kernels on ``device`` run
    out = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record(stream)
        for _ in range(calls):
            fn()
        end.record(stream)
        torch.cuda.synchronize(device)
        out.append(start.elapsed_time(end) / 1e3 / calls)   # elapsed_time is in ms
    return out
