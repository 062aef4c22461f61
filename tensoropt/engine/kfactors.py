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

import time as _time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .factors import SolveTimeout
from .kprune import kd_prune

__all__ = ["KFactor", "Rule", "leaf", "combine", "reconstruct", "CHUNK_VALUES"]

# Largest number of candidate coordinates materialised at once before a combine is chunked.
CHUNK_VALUES = 1 << 24


@dataclass(frozen=True)
class Rule:
    """How the points of two factors merge: ``merge(a, b)`` takes broadcastable arrays
    ``(..., k_a)`` and ``(..., k_b)`` and returns ``(..., k)``; ``group``: the coordinate
    that splits a row into groups that never dominate each other (or None)."""
    merge: Callable[[np.ndarray, np.ndarray], np.ndarray]
    k: int
    group: int | None = None
    neutral: np.ndarray | None = None   # a point that merges as the identity, where one exists


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
            deadline: float | None = None, transform: Callable[[np.ndarray], np.ndarray] | None = None) -> KFactor:
    """``f`` and ``g`` merged over the union of their scopes, the nodes in ``eliminate``
    folded out. ``transform`` maps the candidates' coordinates before pruning (a clamp that
    leaves every final result unchanged). Back-pointer of a point: ``(e * wf + i) * wg + j``,
    ``e`` the eliminated nodes' joint configuration (row-major), ``i``/``j`` the points of
    ``f``/``g`` it sums."""
    union = f.scope + tuple(v for v in g.scope if v not in f.scope)
    sizes: dict[int, int] = {}
    for fac in (f, g):
        for v, d in zip(fac.scope, fac.dims):
            if sizes.setdefault(v, d) != d:
                raise AssertionError(f"node {v} has {d} and {sizes[v]} configurations in two factors")
    elim = tuple(v for v in union if v in eliminate)
    kept = tuple(v for v in union if v not in elim)
    order = kept + elim
    fa, ga = _aligned(f, order), _aligned(g, order)
    out_dims = tuple(sizes[v] for v in kept)
    e_dims = tuple(sizes[v] for v in elim)
    n_e = int(np.prod(e_dims, dtype=np.int64))
    rows = int(np.prod(out_dims, dtype=np.int64))
    wf, wg, k = fa.shape[-2], ga.shape[-2], rule.k
    lead = out_dims[0] if out_dims else 1
    per_lead = max(rows // max(lead, 1), 1) * n_e * wf * wg * max(k, fa.shape[-1], ga.shape[-1])
    step = max(1, CHUNK_VALUES // max(per_lead, 1))
    pieces = []
    for a0 in range(0, lead, step):
        if deadline is not None and _time.monotonic() > deadline:
            raise SolveTimeout("time limit reached during a combine")
        sl = slice(a0, min(a0 + step, lead))
        fs = fa[sl] if out_dims and fa.shape[0] > 1 else fa
        gs = ga[sl] if out_dims and ga.shape[0] > 1 else ga
        chunk = ((min(a0 + step, lead) - a0),) + out_dims[1:] if out_dims else ()
        n_rows = int(np.prod(chunk, dtype=np.int64))
        fb = np.broadcast_to(fs, chunk + e_dims + fs.shape[-2:]).reshape(n_rows, n_e, wf, 1, fs.shape[-1])
        gb = np.broadcast_to(gs, chunk + e_dims + gs.shape[-2:]).reshape(n_rows, n_e, 1, wg, gs.shape[-1])
        cand = rule.merge(fb, gb).reshape(n_rows, n_e * wf * wg, k)
        if transform is not None:
            cand = transform(cand)
        keep = kd_prune(cand, rule.group)
        vals = np.take_along_axis(cand, np.maximum(keep, 0)[..., None], axis=1)
        pad = keep < 0
        vals[pad] = 0.0
        vals[..., 0][pad] = np.inf
        pieces.append((chunk, vals, keep))
    width = max(p[1].shape[1] for p in pieces)
    vals = np.concatenate([_pad(p[1], width).reshape(p[0] + (width, k)) for p in pieces], axis=0) if out_dims \
        else _pad(pieces[0][1], width).reshape((width, k))
    src = np.concatenate([_pad_src(p[2], width).reshape(p[0] + (width,)) for p in pieces], axis=0) if out_dims \
        else _pad_src(pieces[0][2], width).reshape((width,))
    return KFactor(kept, vals, src, "combine", (f, g), elim, e_dims)


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
