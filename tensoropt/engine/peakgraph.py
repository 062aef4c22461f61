"""The cost graph of a training step whose memory objective is the step's peak.

Node ``v`` picks one of ``K_v`` configurations. Costs are *terms*: tables over a small
scope of nodes. For an assignment ``x`` (one configuration per node):

* time ``T(x)`` and end-of-forward memory ``M(x)`` are sums of the *additive* terms
  (a table ``(..., 2)`` of (seconds, bytes) per joint configuration of its scope);
* the peak is ``P(x) = M(x) + max(0, D(x))``, where ``D`` is how far the backward pass
  rises above ``M``. Nodes are grouped into *regions*, consecutive runs of operators in
  execution order; backward visits them in reverse. Over the regions in forward order,

      E_g = E_{g-1} + Z_g
      C*_g = max(C*_{g-1}, E_g + C_g)
      D_g = max(D_{g-1} - H_g, X_g + E_g + L_g)
      then, at the end of a unit:  D_g = max(D_g, B_g + C*_g),  E_g = 0,  C*_g = -inf

  with ``D_0 = -inf``, ``E_0 = 0``, ``C*_0 = -inf``, and per region ``g`` sums ``H_g``
  (the activations it holds for backward, as the regions after it see them: one
  micro-batch's), ``X_g`` (what its backward holds beside them: pending gradients), ``Z_g``
  (rematerialised activations: seen by the later positions of its *unit* only), ``B_g``,
  and maxima ``L_g`` and ``C_g`` over its *positions* (moments of its backward, and of a
  unit's recomputed forward: a term's value is how far memory rises there). ``D - H`` is the
  rise of an earlier moment seen from later: the activations freed in between no longer
  count. A *unit* is a run of regions (``PeakGraph.units``; every other region is a unit of
  its own) whose rematerialised activations build up together and are freed together.

This is the recurrence the engine solves exactly; :meth:`PeakGraph.evaluate` computes it
for one assignment and is the reference the solver's results are checked against.
A region may have a *mode* node (recompute or keep): the engine treats each of its
configurations as a variant of the region. ``exclude`` names one combination of
configurations (one set per node) that the frontier leaves out: the assignments whose
every node takes a marked configuration (plans the caller prices another way).
No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Term", "SumTerm", "Region", "PeakGraph", "REGION_KINDS"]

# The per-region term lists and how each combines over its terms.
REGION_KINDS = ("held", "view", "remat", "local", "base", "rise")
_SUMS = ("held", "view", "remat", "base")


@dataclass(frozen=True)
class Term:
    scope: tuple[int, ...]
    table: np.ndarray          # shape (K_scope[0], ..., K_scope[-1]) or (..., 2) for additive terms

    def at(self, assignment: np.ndarray) -> np.ndarray:
        """The term's value for each assignment (rows of ``assignment``)."""
        return self.table[tuple(assignment[:, v] for v in self.scope)]

    def low(self) -> float:
        """Its least value (or a lower bound of it)."""
        return float(self.table.min())

    def high(self) -> float:
        """Its greatest value (or an upper bound of it)."""
        return float(self.table.max())


@dataclass(frozen=True, eq=False)
class SumTerm:
    """A term that is the sum of smaller ones: its joint table over the union of their scopes
    is built only when asked for (``table``), so that pricing plans never pays for it."""
    parts: tuple[Term, ...]
    sizes: tuple[int, ...] = ()        # configurations per node of ``scope``

    @property
    def scope(self) -> tuple[int, ...]:
        out: list[int] = []
        for p in self.parts:
            out += [v for v in p.scope if v not in out]
        return tuple(out)

    def at(self, assignment: np.ndarray) -> np.ndarray:
        return sum((p.at(assignment) for p in self.parts), np.zeros(len(assignment)))

    def low(self) -> float:
        return sum(p.low() for p in self.parts)

    def high(self) -> float:
        return sum(p.high() for p in self.parts)

    @property
    def table(self) -> np.ndarray:
        scope = self.scope
        total = np.zeros(self.sizes)
        for p in self.parts:
            perm = sorted(range(len(p.scope)), key=lambda i: scope.index(p.scope[i]))
            shape = [self.sizes[scope.index(v)] if v in p.scope else 1 for v in scope]
            total = total + np.transpose(p.table, perm).reshape(shape)
        return total

    @property
    def n_entries(self) -> int:
        return math.prod(self.sizes)


@dataclass(frozen=True)
class Region:
    nodes: tuple[int, ...]                  # its nodes (the mode node among them, if any)
    mode: int | None = None
    held: tuple[Term, ...] = ()
    view: tuple[Term, ...] = ()
    remat: tuple[Term, ...] = ()
    local: tuple[Term, ...] = ()
    base: tuple[Term, ...] = ()
    rise: tuple[Term, ...] = ()
    name: str = ""

    def terms(self, kind: str) -> tuple[Term, ...]:
        return getattr(self, kind)


@dataclass(frozen=True)
class PeakGraph:
    names: tuple[str, ...]
    n_configs: tuple[int, ...]
    additive: tuple[Term, ...]
    regions: tuple[Region, ...]
    # Consecutive regions declared identical (a chain of repeated blocks), by region index.
    chain: tuple[int, ...] = ()
    # Runs of regions (first, last) that form one unit each; other regions are units alone.
    units: tuple[tuple[int, int], ...] = ()
    # Per node, a boolean mask of configurations; None when nothing is excluded.
    exclude: tuple[np.ndarray, ...] | None = None
    region_of: tuple[int, ...] = field(default=(), compare=False)

    @staticmethod
    def build(names: Sequence[str], n_configs: Sequence[int], additive: Sequence[Term],
              regions: Sequence[Region], chain: Sequence[int] = (),
              exclude: Sequence[np.ndarray] | None = None,
              units: Sequence[tuple[int, int]] = ()) -> "PeakGraph":
        """Check and freeze a graph (tables are copied and made read-only; read-only float64
        tables are kept as they are, shared)."""
        names = tuple(names)
        ks = tuple(int(k) for k in n_configs)
        n = len(ks)
        if len(names) != n or len(set(names)) != n:
            raise ValueError("node names must be unique, one per node")
        if any(k < 1 for k in ks):
            raise ValueError("every node needs at least one configuration")
        region_of = [-1] * n
        for g, reg in enumerate(regions):
            for v in reg.nodes:
                if not 0 <= v < n:
                    raise ValueError(f"region {g}: node {v} out of range")
                if region_of[v] != -1:
                    raise ValueError(f"node {names[v]!r} is in two regions")
                region_of[v] = g
            if reg.mode is not None and reg.mode not in reg.nodes:
                raise ValueError(f"region {g}: its mode node is not one of its nodes")
        if -1 in region_of:
            raise ValueError(f"node {names[region_of.index(-1)]!r} belongs to no region")
        adds = tuple(_frozen(t, ks, names, additive=True) for t in additive)
        regs = []
        for g, reg in enumerate(regions):
            lists = {}
            for kind in REGION_KINDS:
                terms = tuple(_frozen(t, ks, names) for t in reg.terms(kind))
                for t in terms:
                    late = max(region_of[v] for v in t.scope) if t.scope else g
                    if late > g:
                        raise ValueError(f"region {g} ({reg.name}): a {kind} term reads node "
                                         f"{names[max(t.scope, key=lambda v: region_of[v])]!r} of a later region")
                tables = [p.table.ravel() for t in terms for p in (t.parts if isinstance(t, SumTerm) else (t,))]
                values = np.concatenate(tables) if tables else np.zeros(0)
                if kind == "local" or kind == "rise":
                    if np.isnan(values).any() or np.isposinf(values).any():
                        raise ValueError(f"region {g}: {kind} term with NaN or +inf")
                elif not np.isfinite(values).all():
                    raise ValueError(f"region {g}: {kind} term with a non-finite value")
                lists[kind] = terms
            regs.append(Region(tuple(reg.nodes), reg.mode, name=reg.name, **lists))
        if exclude is not None:
            exclude = tuple(np.array(e, dtype=bool) for e in exclude)
            if len(exclude) != n or any(e.shape != (k,) for e, k in zip(exclude, ks)):
                raise ValueError("exclude needs one boolean mask per node, one entry per configuration")
            for e in exclude:
                e.setflags(write=False)
        chain = tuple(int(g) for g in chain)
        if chain and (any(b != a + 1 for a, b in zip(chain, chain[1:])) or len(chain) < 2):
            raise ValueError("a chain is at least two consecutive regions")
        units = tuple((int(a), int(b)) for a, b in units)
        end = -1
        for a, b in units:
            if not (end < a < b < len(regs)):
                raise ValueError(f"units must be ordered, disjoint runs of at least two regions, got {units}")
            end = b
            for g in range(a, b + 1):
                if regs[g].mode is not None:
                    raise ValueError(f"region {g} of a unit has a mode node of its own")
                if g < b and regs[g].base:
                    raise ValueError(f"region {g}: base terms belong to the last region of its unit")
        for g, reg in enumerate(regs):
            if any(t.low() < 0 for t in reg.remat):
                raise ValueError(f"region {g}: rematerialised activations must be >= 0")
        return PeakGraph(names=names, n_configs=ks, additive=adds, regions=tuple(regs), chain=chain, units=units,
                         exclude=exclude, region_of=tuple(region_of))

    @property
    def n_nodes(self) -> int:
        return len(self.n_configs)

    @property
    def n_assignments(self) -> int:
        n = 1
        for k in self.n_configs:
            n *= k
        return n

    def evaluate(self, assignments: np.ndarray) -> np.ndarray:
        """(time, end-of-forward memory, peak) of each assignment (one per row): the
        recurrence of the module docstring, term by term."""
        a = np.atleast_2d(np.asarray(assignments, dtype=np.int64))
        if a.shape[1] != self.n_nodes:
            raise ValueError(f"assignments need {self.n_nodes} columns, got {a.shape[1]}")
        if (a < 0).any() or (a >= np.array(self.n_configs)).any():
            raise ValueError("configuration index out of range")
        tm = np.zeros((len(a), 2))
        for term in self.additive:
            tm += term.at(a)
        low = np.full(len(a), -np.inf)
        d, e, cs = low, np.zeros(len(a)), low
        inside = {g for a0, b in self.units for g in range(a0, b)}
        for g, reg in enumerate(self.regions):
            h, x, z, b = (sum((t.at(a) for t in reg.terms(k)), np.zeros(len(a))) for k in _SUMS)
            lo = np.max([t.at(a) for t in reg.local], axis=0) if reg.local else low
            c = np.max([t.at(a) for t in reg.rise], axis=0) if reg.rise else low
            e = e + z
            cs = np.maximum(cs, e + c)
            d = np.maximum(d - h, x + e + lo)
            if g not in inside:
                d = np.maximum(d, b + cs)
                e, cs = np.zeros(len(a)), low
        peak = tm[:, 1] + np.maximum(d, 0.0)
        return np.column_stack([tm, peak])

    def excluded(self, assignments: np.ndarray) -> np.ndarray:
        """Whether each assignment is the excluded combination."""
        a = np.atleast_2d(np.asarray(assignments, dtype=np.int64))
        if self.exclude is None:
            return np.zeros(len(a), dtype=bool)
        return np.logical_and.reduce([e[a[:, v]] for v, e in enumerate(self.exclude)])


def _frozen(term, ks: tuple[int, ...], names, additive: bool = False):
    if isinstance(term, SumTerm):
        if additive:
            raise ValueError("additive terms are plain tables")
        parts = tuple(_frozen(p, ks, names) for p in term.parts)
        scope = SumTerm(parts).scope
        return SumTerm(parts, tuple(ks[v] for v in scope))
    scope = term.scope
    # a Term of int nodes over a read-only float64 table is already frozen: kept as it is
    same = type(term) is Term and type(scope) is tuple and all(type(v) is int for v in scope)
    if not same:
        scope = tuple(map(int, scope))
    if len(scope) > 1 and len(set(scope)) != len(scope):
        raise ValueError(f"a term's scope repeats a node: {scope}")
    if scope and not (0 <= min(scope) and max(scope) < len(ks)):
        raise ValueError(f"a term reads a node out of range: {scope}")
    table = term.table
    if not (type(table) is np.ndarray and table.dtype == np.float64 and not table.flags.writeable):
        table = np.array(table, dtype=np.float64)      # a read-only table is shared, not copied
        same = False
    want = tuple([ks[v] for v in scope] + ([2] if additive else []))
    if table.shape != want:
        label = ", ".join(names[v] for v in scope)
        raise ValueError(f"term over ({label}): table shape {table.shape}, expected {want}")
    if additive:
        if not np.isfinite(table).all() or (table[..., 0] < 0).any():
            raise ValueError(f"additive term over {scope}: costs must be finite, times >= 0")
    if same:
        return term
    table.setflags(write=False)
    return Term(scope, table)
