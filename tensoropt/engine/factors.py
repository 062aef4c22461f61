"""Frontier factors: tables of frontiers indexed by the configurations of a few nodes.

A factor over scope ``(v1, ..., vr)`` holds, for every joint configuration of those
nodes, the Pareto frontier of the partial cost of everything already folded into it.
Two operations build every factor the solver makes:

- :func:`combine` — series sum ⊕ over the union of the scopes, optionally folding one
  node out by choice ∪ over its configurations in the same step (variable elimination);
- :func:`chain_product` (in ``blocks``) — the same, for repeated blocks.

Each point records where it came from (``src``), so one assignment per frontier point is
recovered by walking the factors back (:func:`reconstruct`) instead of searching again.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass, field

import numpy as np

from .pareto import prune_rows

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
    delta: float = 0.0,
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
    per_lead = max(rows // max(lead, 1), 1) * points_per_row
    step = max(1, CHUNK_POINTS // max(per_lead, 1))
    pieces = []
    for a0 in range(0, lead, step):
        if deadline is not None and _time.monotonic() > deadline:
            raise SolveTimeout("time limit reached during a combine")
        sl = slice(a0, min(a0 + step, lead))
        tt = _rows(ft, sl, out_dims)[..., :, None] + _rows(gt, sl, out_dims)[..., None, :]
        mm = _rows(fm, sl, out_dims)[..., :, None] + _rows(gm, sl, out_dims)[..., None, :]
        chunk_dims = tt.shape[: len(order)]
        if eliminate is not None:
            chunk_dims = chunk_dims[:-1]
        tt = np.broadcast_to(tt, chunk_dims + (n_elim,) * (eliminate is not None) + (wf, wg))
        mm = np.broadcast_to(mm, tt.shape)
        n_rows = int(np.prod(chunk_dims, dtype=np.int64))
        pt, pm, ps = prune_rows(tt.reshape(n_rows, points_per_row), mm.reshape(n_rows, points_per_row), delta)
        pieces.append((chunk_dims, pt, pm, ps))
    width = max(p[1].shape[1] for p in pieces)
    t_out = np.concatenate([_pad(p[1], width, np.inf).reshape(p[0] + (width,)) for p in pieces], axis=0 if out_dims else -1)
    m_out = np.concatenate([_pad(p[2], width, np.inf).reshape(p[0] + (width,)) for p in pieces], axis=0 if out_dims else -1)
    s_out = np.concatenate([_pad(p[3], width, -1).reshape(p[0] + (width,)) for p in pieces], axis=0 if out_dims else -1)
    return Factor(kept, t_out, m_out, s_out, "combine", (f, g), eliminate, max(f.depth, g.depth) + 1)


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
        code = f.src[idx]
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
