"""Where a tensor lives on one mesh axis, in DTensor's vocabulary, without torch.

* ``Shard(d)``  -- split along tensor dimension ``d`` (``d >= 0``);
* ``Replicate()`` -- a whole copy on every device of the axis;
* ``Partial()`` -- partial sums to be reduced (an output whose contracted label is split).

A term's layout is one placement per mesh axis (``strategy.term_placements``). On disk
(``OpChoice.placements``) a layout is written ``"S(0),R"``: :func:`format_placements` writes
it and :func:`parse_placements` reads it back; they are the only place the text form is
handled. The apply layer maps these to ``torch.distributed.tensor`` placements.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Union

__all__ = ["Shard", "Replicate", "Partial", "Placement", "REPLICATE", "PARTIAL", "parse_placement",
           "parse_placements", "format_placements", "zero_storage"]


@dataclass(frozen=True, slots=True)
class Shard:
    dim: int

    def __post_init__(self):
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 0:
            raise ValueError(f"Shard needs a tensor dimension >= 0, got {self.dim!r}")

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True, slots=True)
class Replicate:
    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True, slots=True)
class Partial:
    def __str__(self) -> str:
        return "P"


Placement = Union[Shard, Replicate, Partial]
REPLICATE = Replicate()
PARTIAL = Partial()

_SHARD = re.compile(r"S\((\d+)\)")


def parse_placement(text: str) -> Placement:
    """``"R"``, ``"P"`` or ``"S(d)"`` (``d >= 0``); ValueError otherwise."""
    t = text.strip() if isinstance(text, str) else text
    if t == "R":
        return REPLICATE
    if t == "P":
        return PARTIAL
    m = _SHARD.fullmatch(t) if isinstance(t, str) else None
    if m is None:
        raise ValueError(f"unknown placement {text!r}: expected 'R', 'P' or 'S(d)' with d >= 0")
    return Shard(int(m.group(1)))


def parse_placements(text: str) -> tuple[Placement, ...]:
    """A layout written ``"S(0),R"`` (one placement per mesh axis)."""
    return tuple(parse_placement(p) for p in text.split(","))


def format_placements(placements: Iterable[Placement]) -> str:
    return ",".join(str(p) for p in placements)


def zero_storage(want: Iterable[Placement], partial: Iterable[bool], shape: Iterable[int],
                 mesh_shape: Iterable[int]) -> tuple[tuple[Placement, ...], tuple[int, ...]]:
    """How ZeRO stores a parameter (whole ``shape``) that its operator uses in layout
    ``want``: on every axis of more than one device where the parameter is replicated while
    its gradient arrives as partial sums (a data-parallel axis), sharded along the first
    dimension that no later axis shards and that still splits evenly (DTensor nests the
    shards of one dimension in mesh-axis order, so sharding one a later axis shards too would
    gather the whole tensor to undo). Returns the stored layout and the axes ZeRO shards."""
    want, partial, mesh_shape = list(want), list(partial), list(mesh_shape)
    local = list(shape)
    for a, pl in enumerate(want):
        if isinstance(pl, Shard):
            local[pl.dim] //= mesh_shape[a]
    axes = []
    for a, n in enumerate(mesh_shape):
        if not (partial[a] and n > 1 and isinstance(want[a], Replicate)):
            continue
        later = {p.dim for b, p in enumerate(want) if isinstance(p, Shard) and b > a}
        d = next((d for d in range(len(local)) if d not in later and local[d] % n == 0), None)
        if d is None:
            continue
        local[d] //= n
        want[a] = Shard(d)
        axes.append(a)
    return tuple(want), tuple(axes)
