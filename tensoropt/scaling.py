"""The device count as an axis: frontiers for 1, 2, 4, … N devices, merged.

``tensoropt.frontier(model, devices="up to 64xA100-80GB")`` searches every power-of-two
device count up to N (and N itself) and keeps the plans no other plan beats in all three
of time per iteration, memory per device and number of devices. Device-hours per
iteration (time × devices) is the cost of going faster: ``best(objective="device_hours")``
picks the cheapest plan that fits, ``best(objective="time")`` the fastest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .budget import InfeasibleBudget, budget_bytes, within_budget
from .frontiers import Frontier
from .plan import Plan
from .units import format_bytes

__all__ = ["ScalingFrontier", "parse_scaling", "device_counts"]

_UP_TO = re.compile(r"^\s*up\s*to\s+(?P<n>\d+)\s*[xX]\s*(?P<dev>\S+)\s*$", re.IGNORECASE)
_SECONDS_PER_HOUR = 3600.0


def parse_scaling(spec) -> tuple[int, str] | None:
    """``"up to 64xA100-80GB"`` → ``(64, "A100-80GB")``; anything else → None."""
    if not isinstance(spec, str):
        return None
    m = _UP_TO.match(spec)
    if m is None:
        return None
    n = int(m.group("n"))
    if n < 1:
        raise ValueError(f"device count in {spec!r} must be at least 1")
    return n, m.group("dev")


def device_counts(n: int) -> list[int]:
    counts, k = [], 1
    while k < n:
        counts.append(k)
        k *= 2
    counts.append(n)
    return counts


@dataclass
class ScalingFrontier:
    """Per device count its frontier, and the merged three-objective frontier."""
    model: str
    device: str
    frontiers: dict[int, Frontier]             # device count -> Frontier
    plans: list[Plan] = field(default_factory=list)

    @staticmethod
    def merge(model: str, device: str, frontiers: dict) -> "ScalingFrontier":
        cands = [p for f in frontiers.values() for p in f.plans]
        keep = []
        for p in cands:
            dominated = any(q is not p and q.time_s <= p.time_s and q.peak_memory_bytes <= p.peak_memory_bytes
                            and q.world_size <= p.world_size
                            and (q.time_s, q.peak_memory_bytes, q.world_size)
                            != (p.time_s, p.peak_memory_bytes, p.world_size)
                            for q in cands)
            if not dominated:
                keep.append(p)
        keep.sort(key=lambda p: (p.time_s, p.peak_memory_bytes, p.world_size))
        return ScalingFrontier(model, device, dict(frontiers), keep)

    def __len__(self) -> int:
        return len(self.plans)

    def __iter__(self):
        return iter(self.plans)

    def to_pandas(self):
        import pandas as pd

        rows = []
        for p in self.plans:
            rows.append({"devices": p.world_size, "time_s": p.time_s, "memory_bytes": p.peak_memory_bytes,
                         "device_hours": device_hours(p), "time_ms": p.time_s * 1e3,
                         "memory_gib": p.peak_memory_bytes / 2**30, "forward_end_bytes": p.memory_bytes,
                         "mesh": p.mesh, "summary": p.summary})
        return pd.DataFrame(rows)

    def best(self, memory_budget=None, max_devices: int | None = None, objective: str = "time") -> Plan:
        """The best plan whose peak memory fits ``memory_budget`` (default: the device's memory;
        see :mod:`tensoropt.budget`) on at most ``max_devices``: fastest (``objective="time"``)
        or cheapest in device-hours."""
        if objective not in ("time", "device_hours"):
            raise ValueError(f"objective must be 'time' or 'device_hours', got {objective!r}")
        any_f = next(iter(self.frontiers.values()))
        budget = any_f.device_memory_bytes if memory_budget is None else budget_bytes(memory_budget)
        pool = [p for p in self.plans if max_devices is None or p.world_size <= max_devices]
        if not pool:
            raise ValueError(f"no device count <= {max_devices} was searched; counts: {sorted(self.frontiers)}")
        fits = within_budget(pool, budget)
        if not fits:
            least = min(pool, key=lambda p: p.peak_memory_bytes)
            raise InfeasibleBudget(
                f"no plan for {self.model} on up to {max_devices or max(self.frontiers)} x {self.device} fits "
                f"{format_bytes(budget)} per device; the minimum achievable peak is "
                f"{format_bytes(least.peak_memory_bytes)} ({least.peak_memory_bytes:.0f} bytes, "
                f"{least.world_size} devices, plan {least.summary}).")
        key = (lambda p: (p.time_s, device_hours(p))) if objective == "time" else \
              (lambda p: (device_hours(p), p.time_s))
        return min(fits, key=key)

    def plot(self, ax=None, memory_budget=None):
        from .plots import plot_frontiers

        counts = sorted(self.frontiers)
        return plot_frontiers([self.frontiers[n] for n in counts], labels=[f"{n} devices" for n in counts],
                              ax=ax, memory_budget=memory_budget)

    def __repr__(self) -> str:
        counts = ", ".join(str(n) for n in sorted(self.frontiers))
        return f"ScalingFrontier({self.model} on up to {max(self.frontiers)} x {self.device}: counts {counts}; {len(self.plans)} plans)"


def device_hours(p: Plan) -> float:
    return p.time_s * p.world_size / _SECONDS_PER_HOUR

