"""Strategy space: the parallel configurations of one operator on a device mesh.

A configuration says, for every mesh axis, which label of the operator's equation is
split over that axis, or ``None`` (the operator is replicated along it). A label may be
split over several axes (its size must divide by their product). From a configuration
follow the layouts of every term, one :mod:`~tensoropt.placement` per mesh axis:

* ``Shard(d)``  — the axis splits a label at position ``d`` of the term;
* ``Partial()`` — output only: the axis splits a contracted label (partial sums);
* ``Replicate()`` — otherwise.

Which labels an operator may split is the operator's own ``splittable`` set (from
capture) narrowed by family (:data:`_FAMILY_LABELS`): matrix-unit operators split the
batch, their weight dimensions and contracted dimensions, not sequence dims (splitting
those only moves the batch split elsewhere); attention splits batch and heads;
element-wise, norm, softmax and loss operators may split any splittable label, which
is how sequence parallelism enters. An operator with nothing splittable ("other", or
a family without rule) has one configuration: replicated.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

from .mesh import Mesh
from .opgraph import Operator
from .placement import PARTIAL, REPLICATE, Placement, Shard

__all__ = ["OpConfig", "enumerate_configs", "label_sizes", "term_placements", "output_placements", "contracted_labels",
           "splittable_labels"]


@dataclass(frozen=True)
class OpConfig:
    splits: tuple[str | None, ...]       # per mesh axis: the label split over it, or None

    def __str__(self) -> str:
        return ",".join(s or "-" for s in self.splits)

    @staticmethod
    def parse(text: str) -> "OpConfig":
        return OpConfig(tuple(None if s == "-" else s for s in text.split(",")))

    def shards(self, labels: str, mesh_shape: tuple[int, ...]) -> int:
        """How many pieces a term with ``labels`` is cut into."""
        return math.prod(n for s, n in zip(self.splits, mesh_shape) if s is not None and s in labels)

    def work_shards(self, mesh_shape: tuple[int, ...]) -> int:
        """How many pieces the operator's work is cut into (replicated axes repeat it)."""
        return math.prod(n for s, n in zip(self.splits, mesh_shape) if s is not None)


def label_sizes(op: Operator) -> dict[str, int]:
    terms, out = op.terms
    sizes: dict[str, int] = {}
    for labels, spec in list(zip(terms, op.operands)) + [(out, op.output)]:
        for label, n in zip(labels, spec.shape):
            sizes.setdefault(label, n)
    return sizes


def _matrix_labels(op: Operator) -> set[str]:
    terms, out = op.terms
    acts = [t for t, p in zip(terms, op.param_names) if p is None]
    params = [t for t, p in zip(terms, op.param_names) if p is not None]
    keep = {"b"} | {c for t in params for c in t}
    if acts:
        keep |= set.intersection(*(set(t) for t in acts))        # batch-like (heads)
    keep |= {c for t in terms for c in t if c not in out}        # contracted
    return keep


def _attention_labels(op: Operator) -> set[str]:
    terms, _ = op.terms
    return set.intersection(*(set(t) for t in terms))            # batch and heads


_FAMILY_LABELS: dict[str, Callable[[Operator], set[str]]] = {
    "linear": _matrix_labels,
    "matmul": _matrix_labels,
    "conv": _matrix_labels,
    "attention": _attention_labels,
}
_ANY_LABEL_FAMILIES = ("norm", "softmax", "elementwise", "embedding", "pool", "reduction", "loss")


def splittable_labels(op: Operator) -> str:
    """The labels this operator may split, in equation order."""
    if op.family in _FAMILY_LABELS:
        allowed = _FAMILY_LABELS[op.family](op)
    elif op.family in _ANY_LABEL_FAMILIES:
        allowed = set(op.splittable)
    else:
        allowed = set()
    seen: list[str] = []
    for c in op.equation.replace(",", "").replace("->", ""):
        if c in op.splittable and c in allowed and c not in seen:
            seen.append(c)
    return "".join(seen)


def enumerate_configs(op: Operator, mesh: Mesh) -> list[OpConfig]:
    """Every valid configuration, replicated first, in a fixed order.

    Only the batch may be split over several mesh axes. A feature dimension split over two
    axes is laid out by DTensor with the axes nested in a fixed order, so moving to or from
    it costs more than the per-axis collectives the cost model prices (an extra all-gather
    and reduce-scatter); the same split is available on a mesh with one larger axis.
    """
    labels = splittable_labels(op)
    sizes = label_sizes(op)
    out = []
    for splits in itertools.product((None, *labels), repeat=mesh.ndim):
        cfg = OpConfig(tuple(splits))
        used = [s for s in splits if s is not None and s != "b"]
        if len(used) != len(set(used)):
            continue
        if all(sizes[c] % cfg.shards(c, mesh.shape) == 0 for c in labels):
            out.append(cfg)
    return out


def term_placements(cfg: OpConfig, labels: str, contracted: str = "") -> tuple[Placement, ...]:
    """Placement per mesh axis of a term with ``labels``; ``contracted`` (outputs only) gives
    ``Partial()``."""
    out = []
    for s in cfg.splits:
        if s is not None and s in labels:
            out.append(Shard(labels.index(s)))
        elif s is not None and s in contracted:
            out.append(PARTIAL)
        else:
            out.append(REPLICATE)
    return tuple(out)


def contracted_labels(op: Operator) -> str:
    """The labels of ``op``'s operands that its output lacks (reduced: split, they leave
    partial sums), each once, in equation order."""
    terms, out = op.terms
    return "".join(dict.fromkeys(c for t in terms for c in t if c not in out))


def output_placements(op: Operator, cfg: OpConfig) -> tuple[Placement, ...]:
    """Placement per mesh axis of ``op``'s output in ``cfg`` (``Partial()`` where a contracted
    label is split)."""
    return term_placements(cfg, op.terms[1], contracted_labels(op))
