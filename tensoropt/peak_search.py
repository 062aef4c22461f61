"""The (time, peak memory) frontier of one mesh problem.

:func:`solve_problem` solves the problem's peak graphs (``peakmodel``): the main one, which
leaves out the plans that run under FSDP2 ``replicate``, and those plans' own. Every point
it returns is priced by the exact peak model, and what it returns is the Pareto set of those
prices. Where the main search ran on the block graph (a large problem), the points are
re-priced exactly and the set is the Pareto set of the plans that search found; the block
graph never undercounts a plan's peak, so no plan it dropped is cheaper in time and lower
in its block peak than one returned. Where even that would cost too much, the engine's
search on end-of-forward memory supplies the plans. ``PeakSolution.stats`` says which
search ran.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from .engine import SolveTimeout, solve
from .engine.kfactors import SearchTooLarge
from .engine.kprune import kd_prune
from .engine.peaksolve import solve_peak
from .peakmodel import EXACT_SEARCH_ROWS, PeakModel, peak_model
from .planner import MeshProblem

__all__ = ["PeakSolution", "solve_problem", "time_left", "SEARCHES", "PEAK_SEARCH_CANDIDATES", "MAX_FACTOR_BYTES"]

SEARCHES = ("exact", "block", "forward-end")

# What one peak search may spend before the next, cheaper one is tried: point pairs merged
# (a few million a second on one core of a laptop) and bytes of one factor's points.
PEAK_SEARCH_CANDIDATES = 3e6
MAX_FACTOR_BYTES = 5e8


@dataclass(frozen=True)
class PeakSolution:
    model: PeakModel
    times: np.ndarray          # (n,) seconds, ascending
    memories: np.ndarray       # (n,) end-of-forward bytes, the step's input batch included
    peaks: np.ndarray          # (n,) the step's peak per device, strictly descending
    assignments: np.ndarray    # (n, nodes): configuration per operator, then per recompute unit
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.times)


def solve_problem(problem: MeshProblem, graph, microbatches: int = 1, epsilon: float = 0.0,
                  time_limit_s: float | None = None, exact_rows: int = EXACT_SEARCH_ROWS,
                  max_candidates: float = PEAK_SEARCH_CANDIDATES, block_groups: int | None = None,
                  start_at: str = "exact", ceiling: np.ndarray | None = None) -> PeakSolution:
    """The frontier of (time, peak) of ``problem`` (``graph``: the operator graph it was built
    from; ``microbatches``: the input batch a pipeline stage is handed; ``epsilon``: see
    ``engine.peaksolve.solve_peak``).

    The searches, in order, until one stays within ``max_candidates`` point pairs merged and
    ``MAX_FACTOR_BYTES`` per factor: the exact peak graph (where its cuts stay under
    ``exact_rows``), the block graph, and last the engine's search in (time, end-of-forward
    memory) (``block_groups`` as in ``engine.solve``), whose plans are then priced on their
    peak: not the peak frontier, and ``stats["peak_search"]`` says so. ``start_at`` skips the
    searches before it (a like problem found them too large). ``ceiling``: (time, memory)
    points found elsewhere; the search on end-of-forward memory leaves out the plans one of
    them strictly dominates in (time, end-of-forward memory), which could not beat it on the
    peak either (a plan's peak is never below its end-of-forward memory)."""
    pm = peak_model(problem, graph, microbatches, exact_rows)
    start = time.monotonic()
    deadline = None if time_limit_s is None else start + time_limit_s
    stats: dict = {"tried": []}
    parts: list[np.ndarray] = []
    order = SEARCHES.index(start_at)
    graphs = []
    if order < SEARCHES.index("forward-end"):     # else no peak graph to search is built
        if not pm.search_is_exact:
            graphs = [("block", pm.search)]
        else:   # a one-device mesh has no block graph of its own: the exact one is all there is
            graphs = [("exact", pm.exact)] + ([("block", None)] if pm.build_block is not None else [])
        graphs = [(name, g) for name, g in graphs if SEARCHES.index(name) >= order]
    found = None
    for name, g in graphs:
        try:
            if name == "exact" and pm.parts:
                found = _solve_parts(pm, epsilon, deadline, max_candidates)
            else:
                found = solve_peak(g if g is not None else pm.block(), epsilon=epsilon,
                                   time_limit_s=time_left(deadline), max_candidates=max_candidates,
                                   max_factor_bytes=MAX_FACTOR_BYTES)
        except SearchTooLarge as err:
            stats["tried"].append(f"{name}: {err}")
            continue
        stats["peak_search"] = name
        parts.append(found.assignments)
        break
    if found is None:
        graphs = g = None
        pm.release_search()                        # its peak graphs are too large to search
        stats["peak_search"] = "forward-end"
        fwd = solve(problem.cost_graph, epsilon=epsilon, time_limit_s=time_left(deadline), progress=False,
                    block_groups=block_groups, ceiling=ceiling)
        parts.append(fwd.assignments)
    if pm.replicate is not None:
        # the main graphs leave these plans out (the peak graphs) or price them as the
        # DTensor runner would run them (the cost graph): their own graph prices them
        rep = solve_peak(pm.replicate, epsilon=epsilon, time_limit_s=time_left(deadline))
        parts.append(pm.expand(rep.assignments))
    a = np.concatenate(parts, axis=0) if parts else np.zeros((0, pm.exact.n_nodes), dtype=np.int64)
    priced = pm.evaluate(a) if len(a) else np.zeros((0, 3))
    if stats["peak_search"] == "block" and len(found.points):
        stats["block_excess_max"] = float(np.max(found.points[:, 1] / priced[:len(found.points), 2] - 1))
    stats["seconds"] = time.monotonic() - start
    keep = kd_prune(priced[None, :, [0, 2]])[0]
    keep = keep[keep >= 0]
    return PeakSolution(pm, priced[keep, 0], priced[keep, 1], priced[keep, 2], a[keep], stats)


def _solve_parts(pm: PeakModel, epsilon: float, deadline: float | None, max_candidates: float):
    """The exact search as one search per class of a tied parameter's first user
    (``PeakModel.parts``), assignments mapped back to that operator's configurations."""
    found = []
    for v, sub, g in pm.parts:
        part = solve_peak(g, epsilon=epsilon, time_limit_s=time_left(deadline), max_candidates=max_candidates,
                          max_factor_bytes=MAX_FACTOR_BYTES)
        a = part.assignments.copy()
        a[:, v] = sub[a[:, v]]
        found.append(a)
    return SimpleNamespace(assignments=np.concatenate(found, axis=0))


def time_left(deadline: float | None) -> float | None:
    """Seconds to ``deadline`` (a ``time.monotonic()`` instant; None: no limit), or
    :class:`SolveTimeout` where it has passed: what each of several solves under one limit gets."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise SolveTimeout("time limit reached")
    return left
