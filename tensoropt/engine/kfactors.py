"""Factors whose entries are Pareto sets of points with any number of coordinates.

A factor over the nodes ``scope`` holds, for every joint configuration of them, a set of
non-dominated points (``vals``: ``(*dims, width, k)``, padded with points whose time,
coordinate 0, is ``inf``) and, per point, a back-pointer (``src``). :func:`combine` joins two
factors over the union of their scopes and may fold nodes out (the union over their
configurations); how two points' coordinates merge is a *rule* (``Rule``), and the result
keeps what :func:`~tensoropt.engine.kprune.kd_prune` keeps. All coordinates are minimised
(a coordinate to maximise is stored negated). No torch here.
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import memguard
from .factors import SolveTimeout
from .kprune import kd_prune
from .native import kernels

__all__ = ["KFactor", "Rule", "Limits", "SearchTooLarge", "leaf", "combine", "reconstruct", "CHUNK_VALUES"]

# Largest number of candidate coordinates materialised at once before a combine is chunked.
CHUNK_VALUES = 1 << 24


class SearchTooLarge(Exception):
    """A search would go past its :class:`Limits` of work or memory."""


@dataclass
class Limits:
    """What a search may spend: a deadline (``time.monotonic()`` seconds), merged point pairs
    (``candidates``, the work of every combine summed; checked before a combine runs, so the
    outcome does not depend on the machine's speed) and the bytes of one factor's points."""
    deadline: float | None = None
    candidates: float = float("inf")
    factor_bytes: float = float("inf")
    spent: int = 0

    def check_time(self) -> None:
        if self.deadline is not None and _time.monotonic() > self.deadline:
            raise SolveTimeout("time limit reached during a combine")
        memguard.check()

    def spend(self, candidates: int) -> None:
        self.spent += candidates
        if self.spent > self.candidates:
            raise SearchTooLarge(f"more than {self.candidates:.3g} point pairs to merge")

    def check_bytes(self, nbytes: float) -> None:
        if nbytes > self.factor_bytes:
            raise SearchTooLarge(f"a factor of {nbytes / 1e9:.2f} GB, over the {self.factor_bytes / 1e9:.2f} GB allowed")


@dataclass(frozen=True)
class Rule:
    """How the points of two factors merge: ``merge(a, b)`` takes broadcastable arrays
    ``(..., k_a)`` and ``(..., k_b)`` and returns ``(..., k)``; ``group``: the coordinate
    that splits a row into groups that never dominate each other (or None). ``native``
    names the same rule for the compiled kernel: ``("coords", ops)`` (per coordinate 0 sum,
    1 max, 2 min), ``("fold", floor)`` (``peaksolve``'s state-and-piece rule) or
    ``("unit", (close, floor))`` (its rule inside a recomputed unit)."""
    merge: Callable[[np.ndarray, np.ndarray], np.ndarray]
    k: int
    group: int | None = None
    neutral: np.ndarray | None = None   # a point that merges as the identity, where one exists
    native: tuple | None = None


@dataclass(eq=False)
class KFactor:
    scope: tuple[int, ...]
    vals: np.ndarray | None     # (*dims, width, k)
    src: np.ndarray | None      # (*dims, width) int64
    kind: str                   # "leaf" | "combine" | "custom"
    inputs: tuple["KFactor", ...] = ()
    eliminated: tuple[int, ...] = ()
    elim_sizes: tuple[int, ...] = ()
    extra: dict = field(default_factory=dict)

    @property
    def dims(self) -> tuple[int, ...]:
        return self.vals.shape[:-2]

    @property
    def width(self) -> int:
        return self.vals.shape[-2] if self.vals is not None else self.extra["width"]

    @property
    def k(self) -> int:
        return self.vals.shape[-1]

    def release(self) -> None:
        """Drop the points once consumed; back-pointers and width stay for reconstruction."""
        if self.kind != "leaf" and self.vals is not None:
            self.extra["width"] = self.width
            self.vals = None


def leaf(scope: tuple[int, ...], vals: np.ndarray) -> KFactor:
    """One point per joint configuration: ``vals`` is ``(*dims, k)``."""
    v = np.ascontiguousarray(vals, dtype=np.float64)[..., None, :]
    return KFactor(tuple(scope), v, np.zeros(v.shape[:-1], dtype=np.int64), "leaf")


def _aligned(f: KFactor, order: tuple[int, ...]) -> np.ndarray:
    """``f.vals`` with axes in ``order`` (size 1 where ``f`` lacks a node), then (width, k)."""
    perm = [f.scope.index(v) for v in order if v in f.scope]
    nd = len(f.scope)
    out = np.transpose(f.vals, perm + [nd, nd + 1])
    shape = [f.dims[f.scope.index(v)] if v in f.scope else 1 for v in order] + list(f.vals.shape[-2:])
    return out.reshape(shape)


def combine(f: KFactor, g: KFactor, rule: Rule, eliminate: tuple[int, ...] = (),
            limits: Limits | None = None) -> KFactor:
    """``f`` and ``g`` merged over the union of their scopes, the nodes in ``eliminate``
    folded out. Back-pointer of a point: ``(e * wf + i) * wg + j``, ``e`` the eliminated
    nodes' joint configuration (row-major), ``i``/``j`` the points of ``f``/``g`` it merges."""
    union = f.scope + tuple(v for v in g.scope if v not in f.scope)
    sizes: dict[int, int] = {}
    for fac in (f, g):
        for v, d in zip(fac.scope, fac.dims):
            if sizes.setdefault(v, d) != d:
                raise AssertionError(f"node {v} has {d} and {sizes[v]} configurations in two factors")
    elim = tuple(v for v in union if v in eliminate)
    kept = tuple(v for v in union if v not in elim)
    order = kept + elim
    out_dims = tuple(sizes[v] for v in kept)
    e_dims = tuple(sizes[v] for v in elim)
    fa, f_row, f_e = _addressed(f, order, out_dims, e_dims)
    ga, g_row, g_e = _addressed(g, order, out_dims, e_dims)
    n_e = math.prod(e_dims)
    rows = math.prod(out_dims)
    wf, wg, k = f.width, g.width, rule.k
    n = n_e * wf * wg
    step = max(1, CHUNK_VALUES // max(n * (k + 1), 1))
    lib = kernels() if rule.native is not None else None
    limits = limits or Limits()
    limits.spend(rows * n)
    vals_parts, src_parts = [], []
    width = 1
    for r0 in range(0, rows, step):
        limits.check_time()
        rs = slice(r0, min(r0 + step, rows))
        if lib is not None:
            vals, keep = _native(lib, rule, fa, f_row[rs], f_e, f.k, ga, g_row[rs], g_e, g.k, n_e, wf, wg)
        else:
            vals, keep = _numpy(rule, fa, f_row[rs], f_e, f.k, ga, g_row[rs], g_e, g.k, n_e, wf, wg)
        vals_parts.append(vals)
        src_parts.append(keep)
        width = max(width, vals.shape[1])
        limits.check_bytes(rows * width * (k + 1) * 8.0)   # the padded result, at least
    width = max(p.shape[1] for p in vals_parts)
    vals = np.concatenate([_pad(p, width) for p in vals_parts], axis=0).reshape(out_dims + (width, k))
    src = np.concatenate([_pad_src(p, width) for p in src_parts], axis=0).reshape(out_dims + (width,))
    return KFactor(kept, vals, src, "combine", (f, g), elim, e_dims)


def _addressed(f: KFactor, order: tuple[int, ...], out_dims, e_dims):
    """``f``'s points as one flat array, and per output row and per eliminated joint
    configuration the offset (in doubles) where that row's points start."""
    flat = np.ascontiguousarray(f.vals).ravel()
    point = f.vals.shape[-2] * f.vals.shape[-1]
    strides = {v: math.prod(f.dims[i + 1:]) * point for i, v in enumerate(f.scope)}
    n_kept = len(out_dims)

    def offsets(nodes, dims):
        off = np.zeros(math.prod(dims), dtype=np.int64)
        if not dims:
            return off
        grid = np.indices(dims).reshape(len(dims), -1)
        for axis, v in enumerate(nodes):
            if v in strides:
                off += grid[axis] * strides[v]
        return off
    return flat, offsets(order[:n_kept], out_dims), offsets(order[n_kept:], e_dims)


_RULE_COORDS, _RULE_UNIT, _RULE_UNIT_CLOSE = 0, 2, 3     # kd_combine's rule codes (_kernels.c)


def _native(lib, rule, fa, f_row, f_e, kf_, ga, g_row, g_e, kg, n_e, wf, wg):
    rows, k, n = len(f_row), rule.k, n_e * wf * wg
    out_vals = np.empty((rows, max(n, 1), k))
    out_src = np.empty((rows, max(n, 1)), dtype=np.int64)
    count = np.empty(rows, dtype=np.int64)
    kind, arg = rule.native
    ops = np.ascontiguousarray(arg if kind == "coords" else np.zeros(k), dtype=np.int32)
    floor = float(arg) if kind == "fold" else float(arg[1]) if kind == "unit" else 0.0
    code = (_RULE_UNIT_CLOSE if arg[0] else _RULE_UNIT) if kind == "unit" else _RULE_COORDS
    f_row, g_row = np.ascontiguousarray(f_row), np.ascontiguousarray(g_row)
    f_e, g_e = np.ascontiguousarray(f_e), np.ascontiguousarray(g_e)
    group = -1 if rule.group is None else rule.group
    if kind == "fold":
        status = lib.kd_fold(rows, n_e, wf, wg, fa.ctypes.data, f_row.ctypes.data, f_e.ctypes.data,
                             ga.ctypes.data, g_row.ctypes.data, g_e.ctypes.data, k, group, floor, max(n, 1),
                             out_vals.ctypes.data, out_src.ctypes.data, count.ctypes.data)
    else:
        status = lib.kd_combine(rows, n_e, wf, wg, fa.ctypes.data, f_row.ctypes.data, f_e.ctypes.data, kf_,
                                ga.ctypes.data, g_row.ctypes.data, g_e.ctypes.data, kg, k, code, ops.ctypes.data,
                                group, floor, max(n, 1), out_vals.ctypes.data, out_src.ctypes.data,
                                count.ctypes.data)
    if status != 0:
        raise MemoryError("kd_combine: out of memory")
    width = max(int(count.max(initial=0)), 1)
    vals, src = out_vals[:, :width], out_src[:, :width].copy()
    live = np.arange(width)[None, :] < count[:, None]
    src[~live] = -1
    vals = vals.copy()
    vals[~live] = 0.0
    vals[..., 0][~live] = np.inf
    return vals, src


def _numpy(rule, fa, f_row, f_e, kf_, ga, g_row, g_e, kg, n_e, wf, wg):
    rows = len(f_row)
    fi = f_row[:, None, None, None] + f_e[None, :, None, None] + (np.arange(wf) * kf_)[None, None, :, None] \
        + np.arange(kf_)[None, None, None, :]
    gi = g_row[:, None, None, None] + g_e[None, :, None, None] + (np.arange(wg) * kg)[None, None, :, None] \
        + np.arange(kg)[None, None, None, :]
    fb = fa[fi][:, :, :, None, :]
    gb = ga[gi][:, :, None, :, :]
    cand = rule.merge(fb, gb).reshape(rows, n_e * wf * wg, rule.k)
    keep = kd_prune(cand, rule.group)
    vals = np.take_along_axis(cand, np.maximum(keep, 0)[..., None], axis=1)
    pad = keep < 0
    vals[pad] = 0.0
    vals[..., 0][pad] = np.inf
    return vals, keep


def _pad(vals: np.ndarray, width: int) -> np.ndarray:
    if vals.shape[1] == width:
        return vals
    out = np.zeros((vals.shape[0], width, vals.shape[2]))
    out[:, :, 0] = np.inf
    out[:, :vals.shape[1]] = vals
    return out


def _pad_src(src: np.ndarray, width: int) -> np.ndarray:
    if src.shape[1] == width:
        return src
    out = np.full((src.shape[0], width), -1, dtype=np.int64)
    out[:, :src.shape[1]] = src
    return out


def reconstruct(root: KFactor, points: np.ndarray, assignment: dict[int, np.ndarray]) -> None:
    """Fill ``assignment`` with the configuration of every node folded out beneath ``root``
    for many points at once; ``assignment`` must already hold ``root.scope``'s."""
    points = np.asarray(points, dtype=np.int64)
    stack = [(root, points, {v: np.asarray(assignment[v]) for v in root.scope})]
    while stack:
        f, p, ctx = stack.pop()
        if f.kind == "leaf":
            continue
        idx = tuple(np.broadcast_to(ctx[v], p.shape) for v in f.scope) + (p,)
        code = f.src[idx]
        if (code < 0).any():
            raise AssertionError("back-pointer to a padding point")
        if f.kind == "custom":
            f.extra["reconstruct"](ctx, code, assignment, stack)
            continue
        a, b = f.inputs
        e, rest = np.divmod(code, a.width * b.width)
        i, j = np.divmod(rest, b.width)
        if f.eliminated:
            ctx = dict(ctx)
            for v, c in zip(f.eliminated, np.unravel_index(e, f.elim_sizes)):
                ctx[v] = c
                assignment[v] = c
        stack.append((a, i, {v: ctx[v] for v in a.scope}))
        stack.append((b, j, {v: ctx[v] for v in b.scope}))
