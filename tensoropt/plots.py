"""Plots of frontiers and plans (matplotlib, imported lazily; work without a display).

Axes use milliseconds (or seconds) for time and GiB for memory.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["plot_frontier"]

_GIB = 2**30


def _plt():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg",) and not _has_display():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _has_display() -> bool:
    import os

    return bool(os.environ.get("DISPLAY")) or "inline" in os.environ.get("MPLBACKEND", "")


def _time_scale(times_s: Sequence[float]) -> tuple[float, str]:
    return (1.0, "s") if max(times_s, default=0) >= 1.0 else (1e3, "ms")


def plot_frontier(frontier, ax=None, memory_budget=None, label: str | None = None, references: bool = True,
                  color=None):
    """The trade-off curve: per-device memory (GiB) against time per iteration, as a
    staircase through the frontier's points, reference plans marked, an optional budget line."""
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    times = [p.time_s for p in frontier.plans]
    refs = list(frontier.reference.items()) if references else []
    scale, unit = _time_scale(times + [p.time_s for _, p in refs])
    mem = [p.memory_bytes / _GIB for p in frontier.plans]
    line = ax.step([t * scale for t in times], mem, where="post", marker="o", markersize=3,
                   label=label or f"{frontier.model} on {frontier.devices}", color=color)
    for name, p in refs:
        ax.scatter([p.time_s * scale], [p.memory_bytes / _GIB], marker="x", s=50, zorder=3)
        ax.annotate(name, (p.time_s * scale, p.memory_bytes / _GIB), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)
    if memory_budget is not None:
        from .units import parse_bytes

        b = parse_bytes(memory_budget) / _GIB
        ax.axhline(b, linestyle="--", color="gray", linewidth=1)
        ax.annotate(f"budget {b:.1f} GiB", (ax.get_xlim()[0], b), textcoords="offset points", xytext=(4, 4),
                    fontsize=8, color="gray")
    ax.set_xlabel(f"time per iteration ({unit})")
    ax.set_ylabel("peak memory per device (GiB)")
    ax.set_title(f"{frontier.model} on {frontier.devices}: time/memory frontier")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    return ax
