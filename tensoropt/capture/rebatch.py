"""The same model at another batch size without exporting it again.

Two captures of one model at batches ``B1 != B2`` fix how every operator depends on the
batch: dims labelled ``b`` in its equation scale with it, FLOPs and extra saved bytes are
affine in it (e.g. attention's per-row statistics plus a constant seed). When the two
captures agree on everything else (operators, equations, edges, blocks, the other dims),
the graph at any batch ``b`` follows from them; otherwise ``interpolator`` returns None and
the caller captures again. A batch of one is always captured: views of unit dims are
labelled differently there. Exporting GPT-3's 96 layers takes seconds; this takes
milliseconds, which matters when a pipeline search needs one graph per micro-batch size.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..opgraph import OpGraph, Operator, TensorSpec, rebatch_spec

__all__ = ["interpolator"]


def _b_dims(op: Operator) -> list[tuple[int, ...]]:
    """Per operand, then the output: the positions of the batch label."""
    terms, out = op.terms
    return [tuple(i for i, c in enumerate(t) if c == "b") for t in (*terms, out)]


def _spec(spec: TensorSpec, dims: tuple[int, ...], scale) -> TensorSpec | None:
    shape = list(spec.shape)
    for d in dims:
        new = scale(shape[d])
        if new is None:
            return None
        shape[d] = new
    return TensorSpec(tuple(shape), spec.dtype)


def _scaled(op: Operator, b1: int, b: int) -> Operator | None:
    def scale(n: int):
        return n * b // b1 if (n * b) % b1 == 0 else None
    dims = _b_dims(op)
    operands = [_spec(s, d, scale) for s, d in zip(op.operands, dims[:-1])]
    output = _spec(op.output, dims[-1], scale)
    if output is None or any(s is None for s in operands):
        return None
    return replace(op, operands=tuple(operands), output=output)


def _unsized(op: Operator) -> Operator:
    """``op`` without what grows with the batch by other than its shapes (affine in it)."""
    return replace(op, flops_fwd=0.0, flops_bwd=0.0, saved_extra_bytes=0, backward_extra_bytes=0,
                   members=tuple((k, 0) for k, _ in op.members))


def interpolator(g1: OpGraph, g2: OpGraph) -> Callable[[int], OpGraph | None] | None:
    """``at(b)``: the graph at batch ``b`` (None where a dim would not be whole), or None
    when the two captures do not differ by the batch alone."""
    b1, b2 = g1.batch_size, g2.batch_size
    if b1 == b2 or min(b1, b2) < 2 or len(g1.operators) != len(g2.operators) or g1.edges != g2.edges or g1.blocks != g2.blocks:
        return None
    for o1, o2 in zip(g1.operators, g2.operators):
        moved = _scaled(o1, b1, b2)
        if moved is None or _unsized(o2) != _unsized(moved) or len(o1.members) != len(o2.members):
            return None

    def affine(v1: float, v2: float, b: int) -> float:
        return v1 + (v2 - v1) * (b - b1) / (b2 - b1)

    def at(b: int) -> OpGraph | None:
        if b < 2:          # a batch of one is captured differently (views drop unit dims)
            return None
        ops = []
        for o1, o2 in zip(g1.operators, g2.operators):
            op = _scaled(o1, b1, b)
            if op is None:
                return None
            extra = affine(o1.saved_extra_bytes, o2.saved_extra_bytes, b)
            bwd = affine(o1.backward_extra_bytes, o2.backward_extra_bytes, b)
            if extra < 0 or not float(extra).is_integer() or bwd < 0 or not float(bwd).is_integer():
                return None
            members = [(k, affine(m1, m2, b)) for (k, m1), (_, m2) in zip(o1.members, o2.members)]
            if any(m < 0 or not float(m).is_integer() for _, m in members):
                return None
            ops.append(replace(op, flops_fwd=affine(o1.flops_fwd, o2.flops_fwd, b),
                               flops_bwd=affine(o1.flops_bwd, o2.flops_bwd, b), saved_extra_bytes=int(extra),
                               backward_extra_bytes=int(bwd), members=tuple((k, int(m)) for k, m in members)))
        inputs = affine(g1.input_bytes, g2.input_bytes, b)
        if inputs < 0 or not float(inputs).is_integer():
            return None
        return replace(g1, operators=tuple(ops), batch_size=b, input_bytes=int(inputs),
                       inputs=rebatch_spec(g1.inputs, b1, b))
    return at
