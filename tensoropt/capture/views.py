"""View-like aten ops folded into edges: each returns, for every output dim, the input dim
whose split carries over (or None)."""

from __future__ import annotations

import operator
from typing import Any, Sequence

DimMap = tuple  # tuple[int | None, ...]


def op_name(node) -> str:
    """A graph node's op: the aten overload packet's name without a trailing in-place
    underscore (``add_`` -> ``add``), or "getitem"."""
    t = node.target
    if t is operator.getitem:
        return "getitem"
    pk = getattr(t, "_overloadpacket", None)
    n = pk.__name__ if pk is not None else getattr(t, "__name__", str(t))
    if n.endswith("_") and not n.endswith("__") and n != "_":
        n = n[:-1]
    return n


def _norm(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def reshape_map(src: Sequence[int], dst: Sequence[int]) -> DimMap:
    """(b,s,h)->(b,s,nh,hd): nh<-h, hd<-None (leading factor of a split inherits the split);
    (b,s,h)->(b*s,h): bs<-b (a merge inherits its leading input dim); size-1 dims map None."""
    res: list[int | None] = [None] * len(dst)
    i = j = 0
    try:
        while True:
            while i < len(src) and src[i] == 1:
                i += 1
            while j < len(dst) and dst[j] == 1:
                j += 1
            if i >= len(src) or j >= len(dst):
                break
            gi, gj = i, j
            ps, pd = src[i], dst[j]
            i += 1
            j += 1
            while ps != pd:
                if ps < pd:
                    ps *= src[i]
                    i += 1
                else:
                    pd *= dst[j]
                    j += 1
            res[gj] = gi
    except IndexError:  # shapes with zero-size dims or inconsistent sizes: nothing carries
        return (None,) * len(dst)
    return tuple(res)


def identity(rank: int) -> DimMap:
    return tuple(range(rank))


def _ints(x: Any) -> list[int]:
    if isinstance(x, int):
        return [x]
    return [int(v) for v in x]


def view_map(name: str, args: tuple, kwargs: dict, in_shape: tuple, out_shape: tuple) -> DimMap | None:
    """Map for a single-output view op `name` (aten packet name), or None if `name` is no view."""
    ri, ro = len(in_shape), len(out_shape)
    if name in ("view", "reshape", "_unsafe_view", "flatten", "unflatten", "_reshape_alias",
                "view_as", "reshape_as"):
        return reshape_map(in_shape, out_shape)
    if name in ("contiguous", "clone", "alias", "detach", "lift_fresh_copy", "lift_fresh",
                "_to_copy", "to", "type_as", "resolve_conj", "resolve_neg", "dropout_identity"):
        return identity(ro) if ri == ro else reshape_map(in_shape, out_shape)
    if name in ("transpose", "swapaxes", "swapdims"):
        d0, d1 = _norm(args[1], ri), _norm(args[2], ri)
        m = list(range(ri))
        m[d0], m[d1] = m[d1], m[d0]
        return tuple(m)
    if name in ("t", "numpy_T", "mT"):
        m = list(range(ri))
        if ri >= 2:
            m[-1], m[-2] = m[-2], m[-1]
        return tuple(m)
    if name == "permute":
        return tuple(_norm(d, ri) for d in _ints(args[1]))
    if name == "movedim":
        src = [_norm(d, ri) for d in _ints(args[1])]
        dst = [_norm(d, ri) for d in _ints(args[2])]
        order: list[int | None] = [None] * ri
        for s, d in zip(src, dst):
            order[d] = s
        rest = iter(d for d in range(ri) if d not in src)
        return tuple(o if o is not None else next(rest) for o in order)
    if name == "unsqueeze":
        d = _norm(args[1], ro)
        return tuple(None if k == d else (k if k < d else k - 1) for k in range(ro))
    if name == "squeeze":
        dims = args[1] if len(args) > 1 else None
        keep = [k for k in range(ri)
                if not (in_shape[k] == 1 and (dims is None or k in [_norm(x, ri) for x in _ints(dims)]))]
        return tuple(keep) if len(keep) == ro else reshape_map(in_shape, out_shape)
    if name in ("expand", "expand_as", "broadcast_to"):
        off = ro - ri
        return tuple(None if k < off or in_shape[k - off] != out_shape[k] else k - off for k in range(ro))
    if name in ("slice", "narrow", "diagonal"):
        if name == "diagonal" or ri != ro:
            return reshape_map(in_shape, out_shape) if ri == ro else (None,) * ro
        return tuple(k if in_shape[k] == out_shape[k] else None for k in range(ro))
    if name == "view_as_complex":           # (..., n, 2) real -> (..., n) complex
        return tuple(range(ro))
    if name == "view_as_real":              # (..., n) complex -> (..., n, 2) real
        return tuple(k if k < ri else None for k in range(ro))
    if name == "select":
        d = _norm(args[1], ri)
        return tuple(k if k < d else k + 1 for k in range(ro))
    return None


# multi-output views: the op's result is a tuple; getitem picks one piece
SPLIT_VIEWS = ("split", "split_with_sizes", "chunk", "unbind", "tensor_split", "unsafe_split",
               "unsafe_chunk")


def piece_map(name: str, args: tuple, in_shape: tuple, out_shape: tuple) -> DimMap:
    ri, ro = len(in_shape), len(out_shape)
    if name == "unbind":
        d = _norm(args[1] if len(args) > 1 else 0, ri)
        return tuple(k if k < d else k + 1 for k in range(ro))
    if ri != ro:
        return (None,) * ro
    return tuple(k if in_shape[k] == out_shape[k] else None for k in range(ro))


VIEW_NAMES = frozenset((
    "view", "reshape", "_unsafe_view", "flatten", "unflatten", "_reshape_alias", "view_as",
    "reshape_as", "contiguous", "clone", "alias", "detach", "lift_fresh_copy", "lift_fresh",
    "resolve_conj", "resolve_neg", "transpose", "swapaxes", "swapdims", "t", "numpy_T", "mT",
    "permute", "movedim", "unsqueeze", "squeeze", "expand", "expand_as", "broadcast_to",
    "slice", "narrow", "select", "diagonal", "view_as_complex", "view_as_real",
)) | frozenset(SPLIT_VIEWS)

# views that materialise a new tensor (matters for de-duplicating saved activations)
COPYING = frozenset(("clone", "contiguous", "reshape", "flatten", "_to_copy", "to", "type_as",
                     "lift_fresh_copy", "reshape_as"))
