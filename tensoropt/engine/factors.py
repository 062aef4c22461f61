"""Frontier factors: tables of frontiers indexed by the configurations of a few nodes.

A factor over scope ``(v1, ..., vr)`` holds, for every joint configuration of those
nodes, the Pareto frontier of the partial cost of everything already folded into it.
One operation builds every factor the solver makes (repeated blocks included):
:func:`combine` — series sum ⊕ over the union of the scopes, optionally folding one node
out by choice ∪ over its configurations in the same step (variable elimination). Its
arithmetic is :func:`sum_prune`.

Each point records where it came from (``src``), so one assignment per frontier point is
recovered by walking the factors back (:func:`reconstruct`) instead of searching again.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass, field

import numpy as np

from . import memguard
from .native import kernels
from .pareto import Staircase, compact, keep_one_per_cell, positions_in_rows, prune_rows, strictly_dominated

# Largest number of candidate points materialised at once before a combine is chunked.
CHUNK_POINTS = 1 << 22


class SolveTimeout(TimeoutError):
    """The solve ran past its time limit."""


@dataclass(eq=False)
class Factor:
    scope: tuple[int, ...]
    t: np.ndarray            # (*dims, width)
    m: np.ndarray            # (*dims, width)
    src: np.ndarray          # (*dims, width) int64; meaning depends on ``kind``
    kind: str                # "leaf" | "combine" | "chain"
    inputs: tuple["Factor", ...] = ()
    eliminated: int | None = None   # node folded out by this combine, if any
    depth: int = 0                  # prunes on the longest path from a leaf
    extra: dict = field(default_factory=dict)

    @property
    def dims(self) -> tuple[int, ...]:
        return self.t.shape[:-1]

    @property
    def width(self) -> int:
        return self.t.shape[-1] if self.t is not None else self.extra["width"]


def leaf(scope: tuple[int, ...], costs: np.ndarray) -> Factor:
    """A node table (K, 2) or edge table (K_u, K_v, 2) as a factor of single points."""
    t = np.ascontiguousarray(costs[..., 0:1], dtype=np.float64)
    m = np.ascontiguousarray(costs[..., 1:2], dtype=np.float64)
    return Factor(scope, t, m, np.zeros(t.shape, dtype=np.int64), "leaf")


def _aligned(f: Factor, scope: tuple[int, ...], arr: np.ndarray) -> np.ndarray:
    """View ``arr`` (f's dims + points) with axes in ``scope`` order; size 1 where f lacks a node."""
    perm = [f.scope.index(v) for v in scope if v in f.scope] + [len(f.scope)]
    out = np.transpose(arr, perm)
    shape = [f.dims[f.scope.index(v)] if v in f.scope else 1 for v in scope] + [arr.shape[-1]]
    return out.reshape(shape)


def combine(
    f: Factor,
    g: Factor,
    eliminate: int | None = None,
    ratio: float = 0.0,
    deadline: float | None = None,
) -> Factor:
    """f ⊕ g over the union of their scopes; with ``eliminate``, ∪ over that node's configurations.

    ``src`` of a point encodes ``(c, i, j)`` as ``(c * wf + i) * wg + j``: the eliminated node's
    configuration ``c`` (0 if none), and the points ``i`` of f and ``j`` of g that were summed.
    """
    union = f.scope + tuple(v for v in g.scope if v not in f.scope)
    sizes = {v: d for s, dims in ((f.scope, f.dims), (g.scope, g.dims)) for v, d in zip(s, dims)}
    for s, dims in ((f.scope, f.dims), (g.scope, g.dims)):
        for v, d in zip(s, dims):
            if sizes[v] != d:
                raise AssertionError(f"node {v} has {d} and {sizes[v]} configurations in two factors")
    if eliminate is not None:
        # The eliminated node goes last so that its axis folds into the points axis.
        kept = tuple(v for v in union if v != eliminate)
        order = kept + (eliminate,)
    else:
        kept = order = union
    wf, wg = f.width, g.width
    ft, fm = _aligned(f, order, f.t), _aligned(f, order, f.m)
    gt, gm = _aligned(g, order, g.t), _aligned(g, order, g.m)
    out_dims = tuple(sizes[v] for v in kept)
    n_elim = sizes[eliminate] if eliminate is not None else 1
    points_per_row = n_elim * wf * wg
    rows = int(np.prod(out_dims, dtype=np.int64))

    # Chunk over the first kept axis (or do it at once for scalar scopes).
    lead = out_dims[0] if out_dims else 1
    # What a chunk materialises: every candidate for dense sums, the two operands and the
    # segment pairs' ideal points for block-pruned ones (see sum_prune).
    if kernels() is not None:
        points_per_row = min(points_per_row, _native_cap(n_elim, wf, wg))
    elif points_per_row >= BLOCK_MIN_POINTS:
        points_per_row = n_elim * (8 * (wf + wg) + (wf // _SEG_F + 1) * (wg // _SEG_G + 1))
    per_lead = max(rows // max(lead, 1), 1) * points_per_row
    step = max(1, CHUNK_POINTS // max(per_lead, 1))
    pieces = []
    for a0 in range(0, lead, step):
        if deadline is not None and _time.monotonic() > deadline:
            raise SolveTimeout("time limit reached during a combine")
        memguard.check()
        sl = slice(a0, min(a0 + step, lead))
        parts = [_rows(a, sl, out_dims) for a in (ft, fm, gt, gm)]
        full = np.broadcast_shapes(parts[0].shape[:-1], parts[2].shape[:-1])
        chunk_dims = full[:-1] if eliminate is not None else full
        n_rows = int(np.prod(chunk_dims, dtype=np.int64))
        f_t, f_m = (np.broadcast_to(a, full + (wf,)).reshape(n_rows, n_elim, wf) for a in parts[:2])
        g_t, g_m = (np.broadcast_to(a, full + (wg,)).reshape(n_rows, n_elim, wg) for a in parts[2:])
        pt, pm, ps = sum_prune(f_t, f_m, g_t, g_m, ratio)
        pieces.append((chunk_dims, pt, pm, ps))
    width = max(p[1].shape[1] for p in pieces)
    t_out = np.concatenate([_pad(p[1], width, np.inf).reshape(p[0] + (width,)) for p in pieces], axis=0 if out_dims else -1)
    m_out = np.concatenate([_pad(p[2], width, np.inf).reshape(p[0] + (width,)) for p in pieces], axis=0 if out_dims else -1)
    s_out = np.concatenate([_pad(p[3], width, -1).reshape(p[0] + (width,)) for p in pieces], axis=0 if out_dims else -1)
    return Factor(kept, t_out, m_out, s_out, "combine", (f, g), eliminate, max(f.depth, g.depth) + 1)


# Sums with at least this many candidates per row are built block by block (see sum_prune).
BLOCK_MIN_POINTS = 1 << 14
_SEG_F, _SEG_G = 16, 8
PREFILTER_SURVIVORS = True


def sum_prune(f_t, f_m, g_t, g_m, ratio: float = 0.0):
    """Row ``r`` of the result: the pruned union over ``c`` of ``f[r, c] ⊕ g[r, c]``.

    ``f_*``: (rows, n_c, wf), ``g_*``: (rows, n_c, wg), frontiers sorted by time, inf-padded.
    Returns ``prune_rows``' ``(t, m, src)`` with ``src = (c * wf + i) * wg + j``.

    Wide sums are not materialised: both frontiers are cut into segments of consecutive
    points, and a pair of segments is skipped when its ideal point (least time, least
    memory of the pair) is strictly dominated by the row's *supported* points — the optima
    of a few weighted sums ``t + λ m``, which separate over ``f`` and ``g`` and so cost
    O(wf + wg) per ``c`` and weight. Skipped pairs hold only dominated points: exact.
    With the compiled kernels (``native.py``) the sum is ``_kernels.c``'s ``pareto_sum2``,
    which gives the same points; among exactly equal ones it keeps the lowest ``src``.
    """
    rows, n_c, wf = f_t.shape
    wg = g_t.shape[2]
    lib = kernels()
    if lib is not None:
        return _sum_prune_native(lib, f_t, f_m, g_t, g_m, ratio)
    if n_c * wf * wg < BLOCK_MIN_POINTS or wf < 2 * _SEG_F:
        t = (f_t[..., :, None] + g_t[..., None, :]).reshape(rows, -1)
        m = (f_m[..., :, None] + g_m[..., None, :]).reshape(rows, -1)
        return prune_rows(t, m, ratio)
    stairs = Staircase(*prune_rows(*_supported_points(f_t, f_m, g_t, g_m))[:2])
    bg = min(_SEG_G, wg)
    ft, fm = (_pad_to(a, _SEG_F) for a in (f_t, f_m))
    gt, gm = (_pad_to(a, bg) for a in (g_t, g_m))
    nf, ng = ft.shape[2] // _SEG_F, gt.shape[2] // bg
    ft, fm = ft.reshape(rows, n_c, nf, _SEG_F), fm.reshape(rows, n_c, nf, _SEG_F)
    gt, gm = gt.reshape(rows, n_c, ng, bg), gm.reshape(rows, n_c, ng, bg)
    ideal_t = (ft.min(-1)[..., :, None] + gt.min(-1)[..., None, :]).reshape(rows, -1)
    ideal_m = (fm.min(-1)[..., :, None] + gm.min(-1)[..., None, :]).reshape(rows, -1)
    alive = np.isfinite(ideal_t) & ~strictly_dominated(ideal_t, ideal_m, stairs)
    r, blk = np.nonzero(alive)
    r, blk = _second_round(r, blk, rows, ideal_t, ideal_m, ft, fm, gt, gm, (n_c, nf, ng))
    c, sf, sg = np.unravel_index(blk, (n_c, nf, ng))
    q, cand_t, cand_m, i, j = _refine(r, rows, ft[r, c, sf], fm[r, c, sf], gt[r, c, sg], gm[r, c, sg])
    i = sf[q][:, None] * _SEG_F + i
    j = sg[q][:, None] * bg + j
    code = ((c[q][:, None, None] * wf + i[:, :, None]) * wg + j[:, None, :]).reshape(len(q), -1)
    r = r[q]
    pos = positions_in_rows(r, rows)
    n_blocks = max(int(pos.max(initial=-1)) + 1, 1)
    per = cand_t.shape[1]
    t = np.full((rows, n_blocks, per), np.inf)
    m = np.full((rows, n_blocks, per), np.inf)
    codes = np.full((rows, n_blocks, per), -1, dtype=np.int64)
    t[r, pos], m[r, pos], codes[r, pos] = cand_t, cand_m, code
    pt, pm, ps = prune_rows(t.reshape(rows, -1), m.reshape(rows, -1), ratio, prefilter=PREFILTER_SURVIVORS)
    src = np.where(ps >= 0, np.take_along_axis(codes.reshape(rows, -1), np.maximum(ps, 0), axis=-1), -1)
    return pt, pm, src


def _native_cap(n_c: int, wf: int, wg: int) -> int:
    # Room per row for the result: a sum of two frontiers rarely keeps more points than
    # both hold together; a row that does makes the kernel say so, and it runs again.
    return min(n_c * wf * wg, n_c * (wf + wg) + 64)


def _sum_prune_native(lib, f_t, f_m, g_t, g_m, ratio: float):
    rows, n_c, wf = f_t.shape
    wg = g_t.shape[2]
    args = [np.ascontiguousarray(a, dtype=np.float64) for a in (f_t, f_m, g_t, g_m)]
    cap = _native_cap(n_c, wf, wg)
    count = np.zeros(rows, dtype=np.int64)
    while True:
        t = np.empty((rows, max(cap, 1)))
        m = np.empty((rows, max(cap, 1)))
        src = np.empty((rows, max(cap, 1)), dtype=np.int64)
        status = lib.pareto_sum2(rows, n_c, wf, wg, *(a.ctypes.data for a in args), cap,
                                 t.ctypes.data, m.ctypes.data, src.ctypes.data, count.ctypes.data)
        if status < 0:
            raise MemoryError("pareto_sum2: out of memory")
        if status == 0:
            break
        cap = int(count.max())
        memguard.check()
    width = max(int(count.max(initial=0)), 1)
    # copies, not views: a view would keep the kernel's rows x cap buffers alive as long
    # as the result (a combine holds every chunk's until it joins them)
    t, m, src = t[:, :width].copy(), m[:, :width].copy(), src[:, :width].copy()
    pad = np.arange(width)[None, :] >= count[:, None]
    t[pad], m[pad], src[pad] = np.inf, np.inf, -1
    if ratio > 0:
        return compact(keep_one_per_cell(m, ~pad, ratio), t, m, src)
    return t, m, src


def _refine(r, rows, f_t, f_m, g_t, g_m):
    """Cut each surviving segment pair into sub-pairs and keep those whose ideal point no
    sub-pair corner of the row strictly dominates.

    ``f_*``: (n, SEG_F), ``g_*``: (n, bg) the segments of the n surviving pairs (pair ``q``
    in row ``r[q]``, rows ascending). Returns ``(q, t, m, i, j)``: for each kept sub-pair, its
    pair, its candidates (flattened i-major) and their positions within the segments.
    """
    n, sf_len = f_t.shape
    sg_len = g_t.shape[1]
    sub_f = next(d for d in (4, 2, 1) if sf_len % d == 0)
    sub_g = next(d for d in (2, 1) if sg_len % d == 0)
    nsf, nsg = sf_len // sub_f, sg_len // sub_g
    fs_t, fs_m = f_t.reshape(n, nsf, sub_f), f_m.reshape(n, nsf, sub_f)
    gs_t, gs_m = g_t.reshape(n, nsg, sub_g), g_m.reshape(n, nsg, sub_g)
    ideal_t = fs_t.min(-1)[:, :, None] + gs_t.min(-1)[:, None, :]
    ideal_m = fs_m.min(-1)[:, :, None] + gs_m.min(-1)[:, None, :]
    corner_t = np.stack([fs_t[..., 0][:, :, None] + gs_t[..., 0][:, None, :],
                         fs_t[..., -1][:, :, None] + gs_t[..., -1][:, None, :]], axis=-1)
    corner_m = np.stack([fs_m[..., 0][:, :, None] + gs_m[..., 0][:, None, :],
                         fs_m[..., -1][:, :, None] + gs_m[..., -1][:, None, :]], axis=-1)
    pos = positions_in_rows(r, rows)
    width = int(pos.max(initial=0)) + 1
    per = nsf * nsg
    ct = np.full((rows, width, per * 2), np.inf)
    cm = np.full((rows, width, per * 2), np.inf)
    ct[r, pos], cm[r, pos] = corner_t.reshape(n, -1), corner_m.reshape(n, -1)
    stairs = Staircase(*prune_rows(ct.reshape(rows, -1), cm.reshape(rows, -1))[:2])
    it = np.full((rows, width, per), np.inf)
    im = np.full((rows, width, per), np.inf)
    it[r, pos], im[r, pos] = ideal_t.reshape(n, -1), ideal_m.reshape(n, -1)
    alive = np.isfinite(it) & ~strictly_dominated(it.reshape(rows, -1), im.reshape(rows, -1), stairs).reshape(it.shape)
    q, a, b = np.nonzero(alive[r, pos].reshape(n, nsf, nsg))
    t = (fs_t[q, a][:, :, None] + gs_t[q, b][:, None, :]).reshape(len(q), -1)
    m = (fs_m[q, a][:, :, None] + gs_m[q, b][:, None, :]).reshape(len(q), -1)
    i = a[:, None] * sub_f + np.arange(sub_f)[None, :]
    j = b[:, None] * sub_g + np.arange(sub_g)[None, :]
    return q, t, m, i, j


def _second_round(r, blk, rows, ideal_t, ideal_m, ft, fm, gt, gm, shape):
    """Test the surviving segment pairs again, against a staircase of their own corner
    points (first, middle and last point of each segment: real candidates close to the
    frontier wherever it is not convex)."""
    if len(r) == 0:
        return r, blk
    c, sf, sg = np.unravel_index(blk, shape)
    fi = np.array([0, ft.shape[-1] // 2, ft.shape[-1] - 1])
    gi = np.array([0, gt.shape[-1] // 2, gt.shape[-1] - 1])
    corner_t = ft[r, c, sf][:, fi] + gt[r, c, sg][:, gi]
    corner_m = fm[r, c, sf][:, fi] + gm[r, c, sg][:, gi]
    pos = positions_in_rows(r, rows)
    width = int(pos.max()) + 1
    ct = np.full((rows, width, 3), np.inf)
    cm = np.full((rows, width, 3), np.inf)
    ct[r, pos], cm[r, pos] = corner_t, corner_m
    stairs = Staircase(*prune_rows(ct.reshape(rows, -1), cm.reshape(rows, -1))[:2])
    it = np.full((rows, width), np.inf)
    im = np.full((rows, width), np.inf)
    it[r, pos], im[r, pos] = ideal_t[r, blk], ideal_m[r, blk]
    keep = ~strictly_dominated(it, im, stairs)[r, pos]
    return r[keep], blk[keep]


def _supported_points(f_t, f_m, g_t, g_m):
    """Per row, the candidates minimising ``a t + b m`` for a spread of weights (real points)."""
    rows = f_t.shape[0]
    finite_t = f_t[np.isfinite(f_t)]
    finite_m = f_m[np.isfinite(f_m)]
    t_span = float(np.ptp(finite_t)) if finite_t.size else 1.0
    m_span = float(np.ptp(finite_m)) if finite_m.size else 1.0
    ratio = (t_span or 1.0) / (m_span or 1.0)
    weights = [(1.0, 0.0), (0.0, 1.0)] + [(1.0, ratio * 2.0**k) for k in range(-6, 7, 2)]
    pts_t, pts_m = [], []
    rows_i = np.arange(rows)
    for a, b in weights:
        # Lexicographic tie-break for the pure objectives keeps the optimum a real frontier point.
        fs = _score(f_t, f_m, a, b)
        gs = _score(g_t, g_m, a, b)
        i = np.argmin(fs, axis=-1)
        j = np.argmin(gs, axis=-1)
        tot = np.take_along_axis(fs, i[..., None], -1)[..., 0] + np.take_along_axis(gs, j[..., None], -1)[..., 0]
        c = np.argmin(tot, axis=-1)
        ic, jc = i[rows_i, c], j[rows_i, c]
        pts_t.append(f_t[rows_i, c, ic] + g_t[rows_i, c, jc])
        pts_m.append(f_m[rows_i, c, ic] + g_m[rows_i, c, jc])
    return np.stack(pts_t, axis=1), np.stack(pts_m, axis=1)


def _score(t, m, a, b):
    with np.errstate(invalid="ignore"):
        s = a * t + b * m if a and b else (t if a else m)
    return np.where(np.isfinite(t), s, np.inf)


def _pad_to(a: np.ndarray, seg: int) -> np.ndarray:
    extra = -a.shape[-1] % seg
    if not extra:
        return a
    pad = np.full(a.shape[:-1] + (extra,), np.inf if a.dtype.kind == "f" else -1, dtype=a.dtype)
    return np.concatenate([a, pad], axis=-1)


def _rows(arr: np.ndarray, sl: slice, out_dims: tuple[int, ...]) -> np.ndarray:
    # Slice the leading kept axis; a factor without that node broadcasts along it.
    if not out_dims or arr.shape[0] == 1:
        return arr
    return arr[sl]


def _pad(a: np.ndarray, width: int, fill) -> np.ndarray:
    if a.shape[1] == width:
        return a
    out = np.full((a.shape[0], width), fill, dtype=a.dtype)
    out[:, : a.shape[1]] = a
    return out


def back_pointers(f: Factor, idx) -> np.ndarray:
    """``f``'s back-pointers at ``idx`` as int64 (a released factor keeps them in 32 bits
    where they fit, ``solver._release``)."""
    return f.src[idx].astype(np.int64, copy=False)


def reconstruct(root: Factor, points: np.ndarray, assignment: dict[int, np.ndarray]) -> None:
    """Fill ``assignment`` with the configuration of every node folded out beneath ``root``,
    for many frontier points at once (``points`` and every ``assignment`` value are arrays
    of the same length).

    ``assignment`` must already hold the configurations of ``root.scope``.
    """
    points = np.asarray(points, dtype=np.int64)
    stack = [(root, points, {v: np.asarray(assignment[v]) for v in root.scope})]
    while stack:
        f, p, ctx = stack.pop()
        if f.kind == "leaf":
            continue
        idx = tuple(ctx[v] for v in f.scope) + (p,)
        code = back_pointers(f, idx)
        if (code < 0).any():
            raise AssertionError("back-pointer to a padding point")
        if f.kind == "chain":
            f.extra["reconstruct"](ctx, code, assignment, stack)
            continue
        a, b = f.inputs
        c, rest = np.divmod(code, a.width * b.width)
        i, j = np.divmod(rest, b.width)
        if f.eliminated is not None:
            ctx = dict(ctx)
            ctx[f.eliminated] = c
            assignment[f.eliminated] = c
        stack.append((a, i, {v: ctx[v] for v in a.scope}))
        stack.append((b, j, {v: ctx[v] for v in b.scope}))
