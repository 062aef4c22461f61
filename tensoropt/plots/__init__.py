"""Plots of frontiers and plans (matplotlib, imported lazily; work without a display).

Axes use milliseconds (or seconds, for iterations of a second or more) for time and GiB
(2**30 bytes) for memory. Every function draws on ``ax`` when given, else on a new
figure sized for a laptop screen, and returns the Axes.

* :func:`plot_frontier` — one frontier: peak memory per device against time per iteration,
  reference plans, a memory budget and the plan it selects, and what memory buys in time.
* :func:`plot_frontiers` — several frontiers (device counts, batch sizes, models) on one axes.
* :func:`plot_strategy_map` — operators × frontier plans, each cell coloured by the
  operator's configuration; repeated blocks (``layers.<i>``) folded into one row each.
* :func:`plot_memory_breakdown` / :func:`plot_time_breakdown` — stacked bars per plan.
* :func:`sample_plans` — a few plans spread along a frontier (for the bar charts).
"""

from .breakdown import plot_memory_breakdown, plot_time_breakdown, sample_plans
from .frontier import plot_frontier, plot_frontiers
from .strategy import plot_strategy_map, strategy_table

__all__ = ["plot_frontier", "plot_frontiers", "plot_strategy_map", "plot_memory_breakdown",
           "plot_time_breakdown", "sample_plans", "strategy_table"]
