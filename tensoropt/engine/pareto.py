"""Pareto frontiers of (time, memory), many at once.

A *frontier table* holds one frontier per row: arrays ``t`` and ``m`` of shape
``(rows, width)`` padded with ``inf``. After :func:`prune_rows` every row is sorted by
time ascending with memory strictly descending, and no point dominates another.
Both objectives are minimised.
"""

from __future__ import annotations

import numpy as np


def prune_rows(t: np.ndarray, m: np.ndarray, delta: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keep the non-dominated points of each row.

    Returns ``(t, m, src)`` of shape ``(rows, width')`` where ``src`` is each kept point's
    column in the input (``-1`` on padding). Among points with equal (time, memory) the
    lowest column is kept, so the result does not depend on anything but the input.

    ``delta > 0`` additionally keeps only the fastest point in each memory cell
    ``[(1+delta)^k, (1+delta)^(k+1))``: every dropped point ``q`` is then covered by a kept
    point ``p`` with ``t_p <= t_q`` and ``m_p < (1+delta) m_q``.
    """
    rows, width = t.shape
    if width == 0:
        return t, m, np.zeros((rows, 0), dtype=np.int64)
    order = np.lexsort((np.broadcast_to(np.arange(width), t.shape), m, t), axis=-1)
    ts = np.take_along_axis(t, order, axis=-1)
    ms = np.take_along_axis(m, order, axis=-1)
    best_before = np.empty_like(ms)
    best_before[:, 0] = np.inf
    np.minimum.accumulate(ms[:, :-1], axis=-1, out=best_before[:, 1:])
    keep = (ms < best_before) & np.isfinite(ts)
    if delta > 0:
        keep = _keep_one_per_cell(ms, keep, delta)
    n_kept = keep.sum(axis=-1)
    new_width = max(int(n_kept.max(initial=0)), 1)
    pos = np.argsort(~keep, axis=-1, kind="stable")[:, :new_width]
    kept = np.take_along_axis(keep, pos, axis=-1)
    out_t = np.where(kept, np.take_along_axis(ts, pos, axis=-1), np.inf)
    out_m = np.where(kept, np.take_along_axis(ms, pos, axis=-1), np.inf)
    src = np.where(kept, np.take_along_axis(order, pos, axis=-1), -1)
    return out_t, out_m, src


def _keep_one_per_cell(ms: np.ndarray, keep: np.ndarray, delta: float) -> np.ndarray:
    # Along a pruned row memory strictly falls, so cells never rise: keep a point when its
    # cell differs from the cell of the previous kept point.
    with np.errstate(divide="ignore", invalid="ignore"):
        cell = np.floor(np.log(ms) / np.log1p(delta))
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
