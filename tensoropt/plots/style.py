"""What every plot shares: a matplotlib that works without a display, new axes sized for a
laptop screen, and time and memory units (milliseconds or seconds; GiB, or MiB for tiny models)."""

from __future__ import annotations

from typing import Iterable

__all__ = ["GIB", "pyplot", "has_display", "new_axes", "time_scale", "fmt_time", "fmt_gib", "mem_scale",
           "batch_of", "spread"]

GIB = 2**30


def pyplot():
    import matplotlib

    if not has_display() and matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "ps", "cairo") \
            and "inline" not in matplotlib.get_backend().lower():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def has_display() -> bool:
    import os
    import sys

    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return True
    if sys.platform in ("darwin", "win32"):
        return True
    return "inline" in os.environ.get("MPLBACKEND", "")


def new_axes(ax, figsize):
    plt = pyplot()
    if ax is None:
        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def time_scale(times_s: Iterable[float]) -> tuple[float, str]:
    times_s = list(times_s)
    return (1.0, "s") if max(times_s, default=0) >= 1.0 else (1e3, "ms")


def fmt_time(t_s: float, scale: float, unit: str) -> str:
    v = t_s * scale
    return f"{v:.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"


def fmt_gib(b: float) -> str:
    g = b / GIB
    if g == 0:
        return "0 GiB"
    if g < 0.01:
        return f"{b / 2**20:.3g} MiB"
    return f"{g:.3g} GiB" if g < 100 else f"{g:.0f} GiB"


def mem_scale(mems_bytes: Iterable[float]) -> tuple[float, str]:
    """GiB, or MiB when every value is below 0.1 GiB (tiny models)."""
    m = max(list(mems_bytes), default=0)
    return (1 / 2**20, "MiB") if 0 < m < 0.1 * GIB else (1 / GIB, "GiB")


def batch_of(plan) -> int | None:
    return (getattr(plan, "training", None) or {}).get("batch_size")


def spread(n: int, k: int) -> list[int]:
    if n <= k:
        return list(range(n))
    import numpy as np

    return sorted({int(round(x)) for x in np.linspace(0, n - 1, k)})
