"""Pareto pruning in any number of objectives, for many point sets at once.

``vals`` has shape ``(rows, n, k)``: row ``r`` holds ``n`` points of ``k`` coordinates, all
minimised. Coordinate 0 is time; a point whose time is not finite is padding. A point is
dropped when another point of its row is ``<=`` in every coordinate (and, with ``group``,
has the same value in that coordinate: points of different groups never compete); of equal
points the lowest index stays. The compiled kernel (``native.py``) and the numpy code here
give the same result; kept points are ordered by (group, coordinates, index).
"""

from __future__ import annotations

import numpy as np

from .native import kernels

__all__ = ["kd_prune", "kd_prune_numpy"]


def kd_prune(vals: np.ndarray, group: int | None = None) -> np.ndarray:
    """Per row, the indices of the kept points (``(rows, width)``, -1 padded, width >= 1)."""
    vals = np.ascontiguousarray(vals, dtype=np.float64)
    rows, n, k = vals.shape
    lib = kernels()
    if lib is None or rows * n == 0:
        return kd_prune_numpy(vals, group)
    out = np.empty((rows, n), dtype=np.int64)
    if lib.kd_prune(rows, n, k, vals.ctypes.data, -1 if group is None else group, out.ctypes.data) != 0:
        raise MemoryError("kd_prune: out of memory")
    return _trim(out)


def kd_prune_numpy(vals: np.ndarray, group: int | None = None) -> np.ndarray:
    rows, n, k = vals.shape
    out = np.full((rows, max(n, 1)), -1, dtype=np.int64)
    coords = [d for d in range(k) if d != group]
    for r in range(rows):
        v = vals[r]
        live = np.flatnonzero(np.isfinite(v[:, 0]))
        if not len(live):
            continue
        keys = [live] + [v[live, d] for d in reversed(coords)] + ([v[live, group]] if group is not None else [])
        order = live[np.lexsort(keys)]
        p = v[order]
        kept: list[int] = []
        start = 0
        for a in range(len(order)):
            if group is not None and a > 0 and p[a, group] != p[a - 1, group]:
                start = len(kept)
            q = p[[kk for kk in kept[start:]]] if len(kept) > start else None
            if q is not None and np.any(np.all(q[:, coords] <= p[a, coords], axis=1)):
                continue
            kept.append(a)
        out[r, :len(kept)] = order[kept]
    return _trim(out)


def _trim(out: np.ndarray) -> np.ndarray:
    width = max(int((out >= 0).sum(axis=1).max(initial=0)), 1)
    return out[:, :width]
