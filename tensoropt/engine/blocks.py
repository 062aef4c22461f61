"""Repeated structure: a chain of L identical blocks, one block solved once.

Let X be the positions of a block whose nodes have edges into the next block. The
*transfer factor* A(x_i, x_{i+1}) is the frontier table of one block's cost with
everything but its X nodes folded out, given the X configuration of the block before.
Read as a matrix over joint X configurations, the chain of blocks 1..L-1 is A^(L-1)
under (∪, ⊕). The solver (``solver._ChainBuilder``) applies it to the factor of
everything before the chain one block at a time: exact frontiers widen with every block,
and a vector-matrix product costs K_X times less than the matrix-matrix products of
repeated squaring at the same widths. This module lays out the blocks (``CostGraph.build``
checks that they are identical).
"""

from __future__ import annotations

from dataclasses import dataclass

from .costgraph import CostGraph


@dataclass(frozen=True)
class ChainLayout:
    """How a graph's blocks attach, when they form a chain the solver can fold block by block."""
    blocks: tuple[tuple[int, ...], ...]
    exits: tuple[int, ...]          # positions with edges into the next block (the X nodes)
    interior: frozenset[int]        # nodes of blocks 1..L-1 that the chain factor folds out

    @property
    def first_exits(self) -> tuple[int, ...]:
        return tuple(self.blocks[0][p] for p in self.exits)

    @property
    def last_exits(self) -> tuple[int, ...]:
        return tuple(self.blocks[-1][p] for p in self.exits)


def chain_layout(graph: CostGraph) -> ChainLayout | None:
    """The chain layout, or None when edges attach the blocks in another way (then the
    general solver handles the graph, still exactly)."""
    blocks = graph.blocks
    if len(blocks) < 2:
        return None
    where = {v: (b, p) for b, block in enumerate(blocks) for p, v in enumerate(block)}
    last = len(blocks) - 1
    exits: set[int] = set()
    for (u, v) in graph.edge_costs:
        bu, pu = where.get(u, (None, None))
        bv, pv = where.get(v, (None, None))
        if bu is not None and bv is not None:
            if bv == bu:
                continue
            if bv != bu + 1:
                return None
            exits.add(pu)
        elif bv is not None:          # outside -> block
            if bv != 0:
                return None
        elif bu is not None:          # block -> outside
            if bu == 0:
                continue
            if bu != last:
                return None
    if not exits:
        return None
    exits_t = tuple(sorted(exits))
    # Edges from the last block to the outside must leave from exit positions.
    for (u, v) in graph.edge_costs:
        bu, pu = where.get(u, (None, None))
        if bu == last and v not in where and pu not in exits:
            return None
    interior = frozenset(v for block in blocks[1:] for v in block) - frozenset(blocks[-1][p] for p in exits_t)
    return ChainLayout(tuple(blocks), exits_t, interior)
