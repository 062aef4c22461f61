"""The memory budget rule: what a budget is, and which plans fit it.

A budget is a positive, finite number of bytes (plan memories may be fractional, so a number
is not rounded) or a string such as "40GB" / "30 GiB" (``units.parse_bytes``). A plan fits
when its step's peak per device, ``Plan.peak_memory_bytes``, is at most the budget.
``Frontier.best``, ``ScalingFrontier.best`` and the plots all choose by this rule.
"""

from __future__ import annotations

import math
from typing import Iterable

from .plan import Plan
from .units import parse_bytes

__all__ = ["InfeasibleBudget", "budget_bytes", "fits", "within_budget", "fastest_within"]


class InfeasibleBudget(ValueError):
    """No plan fits the memory budget."""


def budget_bytes(budget: int | float | str) -> float:
    """A budget in bytes; ValueError unless it is positive and finite."""
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        if not (budget > 0 and math.isfinite(budget)):
            raise ValueError(f"memory budget must be a positive number of bytes, got {budget!r}")
        return float(budget)
    return float(parse_bytes(budget))


def fits(plan: Plan, budget: float) -> bool:
    return plan.peak_memory_bytes <= budget


def within_budget(plans: Iterable[Plan], budget: float) -> list[Plan]:
    """The plans that fit ``budget`` (bytes), in their order."""
    return [p for p in plans if fits(p, budget)]


def fastest_within(plans: Iterable[Plan], budget: float) -> Plan | None:
    """The fastest plan that fits ``budget`` (the first of equally fast ones), or None."""
    return min(within_budget(plans, budget), key=lambda p: p.time_s, default=None)
