"""Pareto frontiers of (time, memory), many at once.

A *frontier table* holds one frontier per row: arrays ``t`` and ``m`` of shape
``(rows, width)`` padded with ``inf``. After :func:`prune_rows` every row is sorted by
time ascending with memory strictly descending, and no point dominates another.
Both objectives are minimised.
"""

from __future__ import annotations

import numpy as np


def prune_rows(
    t: np.ndarray, m: np.ndarray, ratio: float = 0.0, prefilter: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keep the non-dominated points of each row.

    Returns ``(t, m, src)`` of shape ``(rows, width')`` where ``src`` is each kept point's
    column in the input (``-1`` on padding). Among points with equal (time, memory) the
    lowest column is kept, so the result does not depend on anything but the input.

    ``ratio > 0`` additionally keeps only the fastest point in each memory cell
    ``[(1+ratio)^k, (1+ratio)^(k+1))`` (memory 0 is a cell of its own): every dropped point
    ``q`` is then covered by a kept point ``p`` with ``t_p <= t_q`` and
    ``m_p < (1+ratio)·m_q``. Memory must not be negative.
    """
    rows, width = t.shape
    if width == 0 or rows == 0:
        return t, m, np.full(t.shape, -1, dtype=np.int64)
    if prefilter and width >= _PREFILTER_MIN_WIDTH:
        survivors = _prefilter(t, m)
        if survivors is not None:
            st, sm, cols = survivors
            out_t, out_m, src = prune_rows(st, sm, ratio, prefilter=False)
            src = np.where(src >= 0, np.take_along_axis(cols, np.maximum(src, 0), axis=-1), -1)
            return out_t, out_m, src
    # One unstable sort by time; runs of equal time are then resolved without sorting
    # (a 3-key lexsort costs about three times as much).
    order = np.argsort(t, axis=-1)
    ts = np.take_along_axis(t, order, axis=-1)
    ms = np.take_along_axis(m, order, axis=-1)
    col = np.arange(width)
    run_start = np.ones(ts.shape, dtype=bool)
    np.not_equal(ts[:, 1:], ts[:, :-1], out=run_start[:, 1:])
    before = np.empty_like(ms)  # min memory over the points strictly faster
    before[:, 0] = np.inf
    np.minimum.accumulate(ms[:, :-1], axis=-1, out=before[:, 1:])
    keep = ms < before
    if not run_start.all():
        # Within a run of equal times: only the least memory survives, and only the copy
        # from the lowest input column; "strictly faster" means before the run starts.
        first = np.maximum.accumulate(np.where(run_start, col, 0), axis=-1)
        before = np.take_along_axis(before, first, axis=-1)
        starts = np.flatnonzero(run_start.ravel())
        run_id = np.repeat(np.arange(len(starts)), np.diff(starts, append=run_start.size))
        run_min = np.minimum.reduceat(ms.ravel(), starts)[run_id].reshape(ms.shape)
        cand = (ms == run_min) & (ms < before)
        low = np.minimum.reduceat(np.where(cand, order, width).ravel(), starts)[run_id].reshape(ms.shape)
        keep = cand & (order == low)
    keep &= np.isfinite(ts)
    if ratio > 0:
        keep = keep_one_per_cell(ms, keep, ratio)
    return compact(keep, ts, ms, order)


def compact(keep: np.ndarray, ts: np.ndarray, ms: np.ndarray, order: np.ndarray):
    """The ``keep`` points of each row moved to its front, in order, as ``(t, m, src)``
    (``src``: their ``order`` values); the rest inf and -1."""
    r, c = np.nonzero(keep)
    pos = positions_in_rows(r, keep.shape[0])
    new_width = max(int(pos.max(initial=-1)) + 1, 1)
    out_t = np.full((keep.shape[0], new_width), np.inf)
    out_m = np.full((keep.shape[0], new_width), np.inf)
    src = np.full((keep.shape[0], new_width), -1, dtype=np.int64)
    out_t[r, pos] = ts[r, c]
    out_m[r, pos] = ms[r, c]
    src[r, pos] = order[r, c]
    return out_t, out_m, src


def positions_in_rows(r: np.ndarray, rows: int) -> np.ndarray:
    """For row indices ``r`` sorted ascending, each entry's position within its row."""
    counts = np.bincount(r, minlength=rows)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.arange(len(r)) - starts[r]


# Rows at least this wide are first thinned by a cheap staircase test (:func:`_prefilter`).
_PREFILTER_MIN_WIDTH = 512
_PREFILTER_SAMPLE = 16   # one candidate in this many builds the staircase
_PREFILTER_BUCKETS = 512


class Staircase:
    """Per-row staircases (pruned rows, inf-padded) in a form that tests points in O(1).

    Time is cut into buckets per row; ``best[b]`` is the least staircase memory among points
    at least one whole bucket faster than bucket ``b`` starts, so a point in bucket ``b`` with
    more memory than ``best[b]`` is strictly dominated by a staircase point, whatever the
    rounding of the bucket arithmetic.
    """

    def __init__(self, st: np.ndarray, sm: np.ndarray, buckets: int = 512):
        rows = st.shape[0]
        finite = np.isfinite(st)
        self.t_lo = np.where(finite[:, 0], st[:, 0], np.inf)
        t_hi = np.max(np.where(finite, st, -np.inf), axis=1)
        span = np.where(finite[:, 0], t_hi - self.t_lo, 0.0)
        self.scale = (buckets - 2) / np.where(span > 0, span, 1.0)
        self.buckets = buckets
        with np.errstate(invalid="ignore"):
            first = np.ceil((st - self.t_lo[:, None]) * self.scale[:, None]) + 1
        first = np.where(finite, np.minimum(first, buckets), buckets).astype(np.int64)
        best = np.full((rows, buckets + 1), np.inf)
        rr = np.broadcast_to(np.arange(rows)[:, None], st.shape)
        np.minimum.at(best, (rr, first), sm)
        np.minimum.accumulate(best, axis=1, out=best)
        best[:, buckets] = np.inf  # the bucket of points faster than the whole staircase
        self.best = best


def strictly_dominated(t: np.ndarray, m: np.ndarray, stairs: Staircase) -> np.ndarray:
    """Whether each point of row ``r`` (``t``, ``m``: (rows, n)) is strictly dominated by a
    point of staircase row ``r`` (False is always safe: it only means "not shown")."""
    b = stairs.buckets
    with np.errstate(invalid="ignore"):
        bucket = np.floor((t - stairs.t_lo[:, None]) * stairs.scale[:, None])
    bucket = np.where((bucket >= 0) & (bucket < b), bucket, np.where(bucket >= b, b - 1, b))
    return m > np.take_along_axis(stairs.best, bucket.astype(np.int64), axis=1)


def _prefilter(t: np.ndarray, m: np.ndarray):
    """Drop points strictly dominated by a staircase built from a sample of each row
    (the exact frontier of every ``_PREFILTER_SAMPLE``-th point; see :class:`Staircase`).
    Returns ``(t, m, cols)`` of the survivors, padded with inf and column -1 (or None when
    too few points would go).
    """
    rows, width = t.shape
    st, sm, _ = prune_rows(t[:, ::_PREFILTER_SAMPLE], m[:, ::_PREFILTER_SAMPLE])
    alive = ~strictly_dominated(t, m, Staircase(st, sm)) & np.isfinite(t)
    r, c = np.nonzero(alive)
    if len(r) > 0.5 * t.size:
        return None
    pos = positions_in_rows(r, rows)
    new_width = max(int(pos.max(initial=-1)) + 1, 1)
    out_t = np.full((rows, new_width), np.inf)
    out_m = np.full((rows, new_width), np.inf)
    cols = np.full((rows, new_width), -1, dtype=np.int64)
    out_t[r, pos] = t[r, c]
    out_m[r, pos] = m[r, c]
    cols[r, pos] = c
    return out_t, out_m, cols


def keep_one_per_cell(ms: np.ndarray, keep: np.ndarray, ratio: float) -> np.ndarray:
    # Along a pruned row memory strictly falls, so cells never rise: keep a point when its
    # cell differs from the cell of the previous kept point.
    with np.errstate(divide="ignore", invalid="ignore"):
        cell = np.floor(np.log(ms) / np.log1p(ratio))
    cell = np.where(keep, cell, np.nan)
    idx = np.where(keep, np.arange(ms.shape[1]), -1)
    last = np.maximum.accumulate(idx, axis=-1)
    prev = np.full_like(last, -1)
    prev[:, 1:] = last[:, :-1]
    prev_cell = np.where(prev >= 0, np.take_along_axis(cell, np.maximum(prev, 0), axis=-1), np.nan)
    same = (prev >= 0) & (cell == prev_cell)
    return keep & ~same


def pareto(points: np.ndarray) -> np.ndarray:
    """The non-dominated subset of an ``(n, 2)`` array, sorted by time ascending."""
    points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    t, m, src = prune_rows(points[None, :, 0], points[None, :, 1])
    ok = src[0] >= 0
    return np.stack([t[0, ok], m[0, ok]], axis=1)


def series_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A ⊕ B: the frontier of all sums of a point of ``a`` and a point of ``b``."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 2)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 2)
    return pareto((a[:, None, :] + b[None, :, :]).reshape(-1, 2))


def choice(*fronts: np.ndarray) -> np.ndarray:
    """A ∪ B: the frontier of the union."""
    return pareto(np.concatenate([np.asarray(f, dtype=np.float64).reshape(-1, 2) for f in fronts]))


def covers(approx: np.ndarray, exact: np.ndarray, epsilon: float) -> bool:
    """Whether every point of ``exact`` has a point of ``approx`` within (1+epsilon) in both objectives."""
    approx = np.asarray(approx).reshape(-1, 2)
    exact = np.asarray(exact).reshape(-1, 2)
    scale = 1.0 + epsilon
    ok = (approx[None, :, 0] <= exact[:, None, 0] * scale * (1 + 1e-12)) & (
        approx[None, :, 1] <= exact[:, None, 1] * scale * (1 + 1e-12)
    )
    return bool(ok.any(axis=1).all())
