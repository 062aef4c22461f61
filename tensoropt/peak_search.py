"""The (time, peak memory) frontier of one mesh problem.

:func:`solve_problem` solves the problem's peak graphs (``peakmodel``): the main one, which
leaves out the plans that run under FSDP2 ``replicate``, and those plans' own. Every point
it returns is priced by the exact peak model, and what it returns is the Pareto set of those
prices. Where the main search ran on the block graph (a large problem), the points are
re-priced exactly and the set is the Pareto set of the plans that search found; the block
graph never undercounts a plan's peak, so no plan it dropped is cheaper in time and lower
in its block peak than one returned. ``PeakSolution.stats`` says which graph was searched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .engine.kprune import kd_prune
from .engine.peaksolve import solve_peak
from .peakmodel import EXACT_SEARCH_ROWS, PeakModel, peak_model
from .planner import MeshProblem

__all__ = ["PeakSolution", "solve_problem"]


@dataclass(frozen=True)
class PeakSolution:
    model: PeakModel
    times: np.ndarray          # (n,) seconds, ascending
    memories: np.ndarray       # (n,) end-of-forward bytes
    peaks: np.ndarray          # (n,) the step's peak per device, strictly descending
    assignments: np.ndarray    # (n, nodes): configuration per operator, then per recompute unit
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.times)


def solve_problem(problem: MeshProblem, graph, microbatches: int = 1, time_limit_s: float | None = None,
                  exact_rows: int = EXACT_SEARCH_ROWS) -> PeakSolution:
    """The frontier of (time, peak) of ``problem`` (``graph``: the operator graph it was built
    from; ``microbatches``: the input batch a pipeline stage is handed)."""
    pm = peak_model(problem, graph, microbatches, exact_rows)
    found = solve_peak(pm.search, time_limit_s=time_limit_s)
    parts = [found.assignments]
    stats = {"peak_search": "exact" if pm.search_is_exact else "block", "seconds": found.stats["seconds"]}
    if pm.replicate is not None:
        rep = solve_peak(pm.replicate, time_limit_s=time_limit_s)
        parts.append(pm.expand(rep.assignments))
        stats["seconds"] += rep.stats["seconds"]
    a = np.concatenate(parts, axis=0) if parts else np.zeros((0, pm.exact.n_nodes), dtype=np.int64)
    priced = pm.evaluate(a) if len(a) else np.zeros((0, 3))
    if not pm.search_is_exact and len(found.points):
        stats["block_excess_max"] = float(np.max(found.points[:, 1] / priced[:len(found.points), 2] - 1))
    keep = kd_prune(priced[None, :, [0, 2]])[0]
    keep = keep[keep >= 0]
    return PeakSolution(pm, priced[keep, 0], priced[keep, 1], priced[keep, 2], a[keep], stats)
