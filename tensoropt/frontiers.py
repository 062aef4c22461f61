"""The result of a search: :class:`Frontier`, the Pareto-optimal plans of one device set."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .budget import InfeasibleBudget, budget_bytes, fastest_within, fits
from .plan import Plan
from .units import format_bytes

__all__ = ["Frontier", "plan_row"]


@dataclass
class Frontier:
    """Pareto-optimal plans sorted by time ascending (peak memory strictly descending)."""
    model: str
    devices: str
    plans: list[Plan]
    reference: dict[str, Plan] = field(default_factory=dict)
    device_memory_bytes: float = float("inf")
    stats: dict = field(default_factory=dict)
    #: the device's reserved over allocated peak bytes (``tensoropt.allocator.reserved_ratio``)
    reserved_ratio: float = 1.0

    def __len__(self) -> int:
        return len(self.plans)

    def __iter__(self):
        return iter(self.plans)

    def __getitem__(self, i: int) -> Plan:
        return self.plans[i]

    @property
    def times_s(self) -> np.ndarray:
        return np.array([p.time_s for p in self.plans])

    @property
    def memories_bytes(self) -> np.ndarray:
        """Each plan's peak memory per device (``Plan.peak_memory_bytes``), the frontier's axis."""
        return np.array([p.peak_memory_bytes for p in self.plans])

    def min_time(self) -> Plan:
        return self.plans[0]

    def min_memory(self) -> Plan:
        return self.plans[-1]

    def best(self, memory_budget: int | float | str | None = None) -> Plan:
        """The fastest plan whose per-device peak memory (``Plan.peak_memory_bytes``: resident
        state, saved activations and the backward pass's rise) fits ``memory_budget`` (bytes or
        "40GB"; see :mod:`tensoropt.budget`); by default the device's own memory."""
        budget = self.device_memory_bytes if memory_budget is None else budget_bytes(memory_budget)
        plan = fastest_within(self.plans, budget)
        if plan is None:
            least = min(self.plans, key=lambda p: p.peak_memory_bytes)
            raise InfeasibleBudget(
                f"no plan for {self.model} on {self.devices} fits {format_bytes(budget)} per device; "
                f"the minimum achievable peak is {format_bytes(least.peak_memory_bytes)} "
                f"({least.peak_memory_bytes:.0f} bytes, plan {least.summary} on mesh {least.mesh}). "
                "Raise the budget, add devices, or lower the batch size.")
        return plan

    def fastest_within(self, memory_bytes: float) -> Plan | None:
        """The fastest plan whose peak is at most ``memory_bytes`` (None if none is), e.g. to
        hold a plan someone runs (``tensoropt.plan_for``) against the frontier at its memory."""
        return fastest_within(self.plans, memory_bytes)

    @property
    def epsilon(self) -> float:
        """0 where the frontier is exact, else its ε: the largest a plan was searched with, as
        asked or where a job fell back to one (``stats["approximated"]``)."""
        fell = self.stats.get("approximated") or []
        return max([p.epsilon for p in self.plans] + [r["epsilon"] for r in fell], default=0.0)

    def caption(self) -> str:
        """How exact the frontier is: exact, (1+ε)-approximate as asked, or approximate where
        jobs fell back to an ε (``stats["approximated"]``) -- and what that bound says."""
        eps = self.epsilon
        if eps == 0:
            return "exact frontier"
        fell = self.stats.get("approximated") or []
        text = (f"(1+ε)-approximate frontier, ε = {eps:g}: every plan the exact search would return has one "
                f"here no slower with at most {1 + eps:g}x its memory (its peak where its job's peak search was "
                "exact, stats['peak_search'])")
        if fell:
            why = {"memory": "their exact solve passed the memory cap", "time": "their exact solve passed half the "
                   "time left", "chain": "the job before them on their mesh fell back"}
            counts = Counter(r["reason"] for r in fell)
            text += (f"; {len(fell)} of {self.stats.get('jobs', '?')} jobs solved with ε (stats['approximated']): "
                     + ", ".join(f"{n} as {why[r]}" for r, n in sorted(counts.items())))
        return text

    def to_pandas(self):
        """One row per plan (:func:`plan_row`); ``attrs["caption"]`` says how exact the frontier
        is (:meth:`caption`)."""
        import pandas as pd

        df = pd.DataFrame([plan_row(p, self.device_memory_bytes, self.reserved_ratio) for p in self.plans])
        df.attrs["caption"] = self.caption()
        return df

    def references_to_pandas(self):
        import pandas as pd

        return pd.DataFrame([dict(plan_row(p, self.device_memory_bytes, self.reserved_ratio), label=name)
                             for name, p in self.reference.items()])

    def plot(self, ax=None, memory_budget=None, **kw):
        """The trade-off curve with reference plans marked (matplotlib Axes)."""
        from .plots import plot_frontier

        return plot_frontier(self, ax=ax, memory_budget=memory_budget, **kw)

    def __repr__(self) -> str:
        approx = f", ε = {self.epsilon:g}" if self.epsilon else ""
        return (f"Frontier({self.model} on {self.devices}: {len(self.plans)} plans, "
                f"{self.plans[0].time_s * 1e3:.3f}..{self.plans[-1].time_s * 1e3:.3f} ms, "
                f"{format_bytes(self.plans[0].peak_memory_bytes)}..{format_bytes(self.plans[-1].peak_memory_bytes)} "
                f"peak per device{approx})")


def plan_row(p: Plan, device_memory: float, reserved_ratio: float = 1.0) -> dict:
    """One table row: memory is the step's peak per device; ``forward_end_bytes`` is what the
    device holds when the forward pass ends (state and saved activations, ``Plan.memory_bytes``);
    ``reserved_bytes`` is what the device's caching allocator would reserve at that peak
    (``tensoropt.allocator``), the figure training logs print."""
    return {
        "time_s": p.time_s,
        "memory_bytes": p.peak_memory_bytes,
        "time_ms": p.time_s * 1e3,
        "memory_gib": p.peak_memory_bytes / 2**30,
        "forward_end_bytes": p.memory_bytes,
        "forward_end_gib": p.memory_bytes / 2**30,
        "reserved_bytes": p.peak_memory_bytes * reserved_ratio,
        "reserved_gib": p.peak_memory_bytes * reserved_ratio / 2**30,
        "mesh": p.mesh,
        "summary": p.summary,
        "fits_device": fits(p, device_memory),
        "epsilon": p.epsilon,
        **p.breakdown,
    }
