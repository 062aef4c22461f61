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

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["plot_frontier", "plot_frontiers", "plot_strategy_map", "plot_memory_breakdown",
           "plot_time_breakdown", "sample_plans", "strategy_table"]

_GIB = 2**30

# one colour per split label (a letter per mesh axis in a configuration string)
_LABEL_COLOURS = {
    "b": "#4C78A8",   # batch: data parallel
    "n": "#F58518",   # output features / heads: column-wise tensor parallel
    "k": "#54A24B",   # contracted dim: row-wise tensor parallel (partial sums)
    "h": "#B279A2",   # hidden
    "c": "#9D755D",   # input channels
    "o": "#E45756",   # output channels
    "s": "#72B7B2",   # sequence / spatial
    "v": "#EECA3B",   # vocabulary
}
_EXTRA_COLOURS = ["#FF9DA6", "#BAB0AC", "#2E86AB", "#A23B72", "#F18F01", "#C73E1D", "#3B1F2B",
                  "#6A994E", "#BC4749", "#386641", "#7F5539", "#5E548E", "#9F86C0", "#E09F3E",
                  "#335C67", "#99582A", "#540B0E", "#0081A7", "#F07167", "#00AFB9"]
_REPLICATED = "#E6E6E6"
_LEGEND_NOTE = ("one letter per mesh axis: the dimension split over it\n"
                "b batch (data parallel) · n output features/heads · k contracted dim\n"
                "(tensor parallel) · h hidden · c/o in/out channels · s sequence/spatial\n"
                "- replicated")

_MEMORY_PARTS = (("param_bytes", "parameters", "#4C78A8"), ("grad_bytes", "gradients", "#F58518"),
                 ("optimizer_bytes", "optimizer state", "#54A24B"),
                 ("activation_bytes", "activations", "#E45756"),
                 ("transient_bytes", "backward's rise (in flight)", "#B279A2"), ("input_bytes", "input batch", "#72B7B2"))
_TIME_PARTS = (("compute_s", "compute", "#4C78A8"), ("recompute_s", "recompute", "#B279A2"),
               ("comm_s", "gradient/weight communication", "#F58518"),
               ("relayout_s", "re-layout (activations)", "#54A24B"))


# ---------------------------------------------------------------------------------- helpers


def _plt():
    import matplotlib

    if not _has_display() and matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "ps", "cairo") \
            and "inline" not in matplotlib.get_backend().lower():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _has_display() -> bool:
    import os
    import sys

    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return True
    if sys.platform in ("darwin", "win32"):
        return True
    return "inline" in os.environ.get("MPLBACKEND", "")


def _new_axes(ax, figsize):
    plt = _plt()
    if ax is None:
        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def _time_scale(times_s: Iterable[float]) -> tuple[float, str]:
    times_s = list(times_s)
    return (1.0, "s") if max(times_s, default=0) >= 1.0 else (1e3, "ms")


def _fmt_time(t_s: float, scale: float, unit: str) -> str:
    v = t_s * scale
    return f"{v:.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"


def _fmt_gib(b: float) -> str:
    g = b / _GIB
    if g == 0:
        return "0 GiB"
    if g < 0.01:
        return f"{b / 2**20:.3g} MiB"
    return f"{g:.3g} GiB" if g < 100 else f"{g:.0f} GiB"


def _mem_scale(mems_bytes: Iterable[float]) -> tuple[float, str]:
    """GiB, or MiB when every value is below 0.1 GiB (tiny models)."""
    m = max(list(mems_bytes), default=0)
    return (1 / 2**20, "MiB") if 0 < m < 0.1 * _GIB else (1 / _GIB, "GiB")


def _budget(memory_budget) -> float | None:
    if memory_budget is None:
        return None
    if isinstance(memory_budget, (int, float)) and not isinstance(memory_budget, bool):
        return float(memory_budget)
    from .units import parse_bytes

    return float(parse_bytes(memory_budget))


def _fits(plans, budget: float):
    fits = [p for p in plans if p.peak_memory_bytes <= budget]
    return min(fits, key=lambda p: p.time_s) if fits else None


def _batch(plan) -> int | None:
    return (getattr(plan, "training", None) or {}).get("batch_size")


def _as_frontiers(frontiers) -> tuple[list, list[str] | None]:
    """A list of Frontier objects, expanding a ScalingFrontier (``.frontiers`` dict)."""
    if hasattr(frontiers, "frontiers") and isinstance(frontiers.frontiers, Mapping):
        counts = sorted(frontiers.frontiers)
        return [frontiers.frontiers[n] for n in counts], [f"{n} devices" for n in counts]
    if hasattr(frontiers, "plans") and not isinstance(frontiers, (list, tuple)):
        return [frontiers], None
    return list(frontiers), None


def _default_labels(frontiers) -> list[str]:
    models = {f.model for f in frontiers}
    devices = {f.devices for f in frontiers}
    batches = {_batch(f.plans[0]) if f.plans else None for f in frontiers}
    labels = []
    for f in frontiers:
        parts = []
        if len(models) > 1:
            parts.append(f.model)
        if len(devices) > 1 or len(batches) <= 1:
            parts.append(f.devices)
        if len(batches) > 1:
            parts.append(f"batch {_batch(f.plans[0])}")
        labels.append(", ".join(parts))
    return labels


# ---------------------------------------------------------------------------------- frontier


def plot_frontier(frontier, ax=None, memory_budget=None, label: str | None = None, references: bool = True,
                  color=None, annotate: bool = True, title: str | None = None):
    """The trade-off curve of one frontier.

    x: time per iteration (ms, or s); y: peak memory per device over the training step
    (``Plan.peak_memory_bytes``; GiB, MiB for tiny models).
    The staircase runs through the Pareto-optimal plans (every plan left of and below the
    curve is impossible, every plan above and right of it is wasteful); reference plans
    (data parallel, Megatron) are marked; ``memory_budget`` ("40GB", bytes) draws the budget,
    shades what exceeds it and stars the fastest plan that fits. With ``annotate`` the
    fastest and the leanest plans are labelled and a box states what the memory buys:
    the slowdown per GiB saved. A top axis reads the slowdown against the fastest plan.
    """
    import numpy as np

    ax = _new_axes(ax, (9, 6.5))
    plans = list(frontier.plans)
    if not plans:
        raise ValueError("empty frontier: nothing to plot")
    refs = list(frontier.reference.items()) if references else []
    budget = _budget(memory_budget)
    times = np.array([p.time_s for p in plans])
    mems = np.array([p.peak_memory_bytes for p in plans])
    scale, unit = _time_scale(list(times) + [p.time_s for _, p in refs])
    ref_mems = [p.peak_memory_bytes for _, p in refs]
    mscale, munit = _mem_scale(list(mems) + ref_mems)
    name = label or f"{frontier.model} on {frontier.devices}"

    line, = ax.step(times * scale, mems * mscale, where="post", color=color, linewidth=1.8, zorder=3,
                    label=f"frontier: {name} ({len(plans)} plans)")
    colour = line.get_color()
    ax.plot(times * scale, mems * mscale, "o", color=colour, markersize=3 if len(plans) > 50 else 5, zorder=4,
            gid="frontier-points")
    # which plans reach their point with more than per-operator sharding
    for what, uses, mk, c in (("pipeline stages", lambda p: bool(p.stages), "^", "tab:red"),
                              ("activation recomputation", lambda p: bool(p.recompute), "s", "tab:green"),
                              ("ZeRO-2/3", lambda p: p.zero_stage >= 2, "D", "tab:purple")):
        sel = np.array([uses(p) for p in plans])
        if sel.any():
            ax.scatter(times[sel] * scale, mems[sel] * mscale, marker=mk, s=28, facecolors="none", edgecolors=c,
                       linewidths=0.9, zorder=4, label=f"uses {what} ({int(sel.sum())})", gid=f"uses-{what}")
    # the region no plan reaches: below-left of the staircase
    far_t, far_m = times.max() * scale * 10, mems.max() * mscale * 10
    xs = np.concatenate([[0], times * scale, [far_t]])
    ys = np.concatenate([[far_m], mems * mscale, [mems[-1] * mscale]])
    ax.fill_between(xs, 0, ys, step="post", color=colour, alpha=0.07, zorder=1, linewidth=0,
                    label="unreachable: no plan is both faster and leaner")

    # the view: the frontier's own box; reference plans close to it widen it, farther ones
    # are pinned to the edge with their values (so a far-away baseline cannot squash the curve)
    lo_t, hi_t = times.min() * scale, times.max() * scale
    span_t = (hi_t - lo_t) or hi_t * 0.1
    hi_m = mems.max() * mscale
    x_hi, y_hi = hi_t + 0.25 * span_t, hi_m * 1.3
    for _, p in refs:
        t, m = p.time_s * scale, p.peak_memory_bytes * mscale
        if t <= hi_t + 1.5 * span_t:
            x_hi = max(x_hi, t + 0.25 * span_t)
        if m <= hi_m * 2.5:
            y_hi = max(y_hi, m * 1.15)
    x_lo = max(lo_t - 0.2 * span_t, 0)
    for _, p in refs:
        if p.time_s * scale < lo_t:
            x_lo = max(min(x_lo, p.time_s * scale - 0.1 * span_t), 0)
    # the device-memory line widens the view before off-chart references are pinned to its edge
    dev = getattr(frontier, "device_memory_bytes", float("inf"))
    show_dev = bool(np.isfinite(dev) and dev * mscale <= y_hi * 1.5)
    if show_dev:
        y_hi = max(y_hi, dev * mscale * 1.08)
    markers = ["X", "D", "^", "s", "v", "P", "*"]
    pinned = 0
    for i, (rname, p) in enumerate(refs):
        t, m = p.time_s * scale, p.peak_memory_bytes * mscale
        mk = markers[i % len(markers)]
        txt = f"{rname}: {_fmt_time(p.time_s, scale, unit)}, {m:.3g} {munit}"
        if t <= x_hi and m <= y_hi:
            ax.scatter([t], [m], marker=mk, s=60, color="black", zorder=5, label=txt)
            ax.annotate(rname, (t, m), textcoords="offset points", xytext=(6, 4), fontsize=9)
        else:                                   # off the chart: pin to the edge with an arrow
            pt, pm = min(t, x_hi), min(m, y_hi)
            ax.scatter([pt], [pm], marker=mk, s=60, color="white", edgecolor="black", zorder=5, clip_on=False,
                       label=txt + " (off the chart)")
            arrow = ("→" if t > x_hi else "") + ("↑" if m > y_hi else "")
            ax.annotate(f"{rname} {arrow}\n{_fmt_time(p.time_s, scale, unit)}, {m:.3g} {munit}", (pt, pm),
                        textcoords="offset points", xytext=(-8, -6 - 24 * pinned), ha="right", va="top",
                        fontsize=8, color="dimgray")
            pinned += 1                         # the next pinned label goes below this one
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(0, y_hi)
    top = y_hi

    if show_dev:
        y = dev * mscale
        ax.axhline(y, color="firebrick", linewidth=1.2, zorder=2)
        ax.annotate(f"device memory {_fmt_gib(dev)}", (0, y), xycoords=("axes fraction", "data"),
                    xytext=(4, 3), textcoords="offset points", ha="left", fontsize=9, color="firebrick")

    if budget is not None:
        chosen = _fits(plans, budget)
        y = budget * mscale
        if y <= top:
            ax.axhline(y, linestyle="--", color="dimgray", linewidth=1.2, zorder=2,
                       label=f"memory budget {_fmt_gib(budget)}")
            ax.axhspan(y, top * 10, color="red", alpha=0.05, zorder=0)
            ax.annotate(f"budget {_fmt_gib(budget)}: plans above the line do not fit", (1, y),
                        xycoords=("axes fraction", "data"), xytext=(-4, 3), textcoords="offset points",
                        ha="right", fontsize=9, color="dimgray")
        else:
            ax.annotate(f"budget {_fmt_gib(budget)} (off the chart): every plan fits", (0, 1),
                        xycoords="axes fraction", xytext=(4, -12), textcoords="offset points",
                        fontsize=9, color="dimgray")
        if chosen is not None:
            ax.scatter([chosen.time_s * scale], [chosen.peak_memory_bytes * mscale], marker="*", s=260,
                       color="gold", edgecolor="black", zorder=6,
                       label=f"fastest within budget: {_fmt_time(chosen.time_s, scale, unit)}, "
                             f"{chosen.peak_memory_bytes * mscale:.3g} {munit} ({chosen.summary})")
        else:
            ax.annotate(f"no plan fits {_fmt_gib(budget)}: the minimum is {_fmt_gib(mems.min())}",
                        (0.5, 0.5), xycoords="axes fraction", ha="center", fontsize=11, color="firebrick",
                        bbox=dict(boxstyle="round", fc="white", ec="firebrick"))

    if annotate:
        fast, lean = plans[0], plans[-1]
        ax.annotate(f"fastest\n{_fmt_time(fast.time_s, scale, unit)}, {fast.peak_memory_bytes * mscale:.3g} {munit}",
                    (fast.time_s * scale, fast.peak_memory_bytes * mscale), textcoords="offset points",
                    xytext=(8, 8), fontsize=9, color=colour,
                    arrowprops=dict(arrowstyle="-", color=colour, lw=0.8))
        if len(plans) > 1:
            ax.annotate(f"least memory\n{_fmt_time(lean.time_s, scale, unit)}, "
                        f"{lean.peak_memory_bytes * mscale:.3g} {munit}",
                        (lean.time_s * scale, lean.peak_memory_bytes * mscale), textcoords="offset points",
                        xytext=(6, 18), ha="left", fontsize=9, color=colour,
                        arrowprops=dict(arrowstyle="-", color=colour, lw=0.8))
            ax.text(0.015, 0.03, _tradeoff_text(plans, scale, unit), transform=ax.transAxes, ha="left",
                    va="bottom", fontsize=9, bbox=dict(boxstyle="round", fc="white", ec="lightgray", alpha=0.9),
                    zorder=7)
        t0 = fast.time_s * scale
        if t0 > 0:
            sec = ax.secondary_xaxis("top", functions=(lambda x: (x / t0 - 1) * 100,
                                                       lambda s: (s / 100 + 1) * t0))
            sec.set_xlabel("slowdown vs the fastest plan (%)", fontsize=9)
            sec.tick_params(labelsize=8)

    ax.set_xlabel(f"time per training iteration ({unit})")
    ax.set_ylabel(f"peak memory per device ({munit})")
    batch = _batch(plans[0])
    ax.set_title(title or f"{frontier.model} on {frontier.devices}"
                 f"{f', batch {batch}' if batch else ''}: time vs memory per device", fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=8, frameon=False, ncol=2)
    return ax


def _tradeoff_text(plans, scale, unit) -> str:
    fast, lean = plans[0], plans[-1]
    saved = (fast.peak_memory_bytes - lean.peak_memory_bytes) / _GIB
    extra = (lean.time_s - fast.time_s) * scale
    pct = (lean.time_s / fast.time_s - 1) * 100 if fast.time_s > 0 else float("nan")
    lines = [f"{len(plans)} Pareto-optimal plans",
             f"fastest → least memory: −{_fmt_gib(fast.peak_memory_bytes - lean.peak_memory_bytes)} per device",
             f"costs +{extra:.3g} {unit} per iteration (+{pct:.0f}%)"]
    if saved > 0:
        per = extra / saved
        lines.append(f"≈ {per:.3g} {unit} slower per GiB saved" if saved >= 0.01
                     else f"≈ {extra / (saved * 1024):.3g} {unit} slower per MiB saved")
    return "\n".join(lines)


def plot_frontiers(frontiers, labels: Sequence[str] | None = None, ax=None, memory_budget=None,
                   per_sample: bool = False, references: bool = False, title: str | None = None,
                   logx: bool = False):
    """Several frontiers on one axes: how the trade-off moves with device count, batch size
    or model. ``frontiers``: a list of Frontier objects or a ScalingFrontier. ``labels``:
    one per frontier (default: what differs between them: devices, batch, model).
    ``per_sample``: time per training sample (iteration time / batch size), so that batch
    sizes compare on throughput. ``memory_budget``: draws the budget and stars, per curve,
    the fastest plan that fits. ``references``: also mark each frontier's data-parallel plan."""
    import numpy as np

    frontiers, auto = _as_frontiers(frontiers)
    frontiers = [f for f in frontiers]
    if not frontiers:
        raise ValueError("no frontiers to plot")
    if labels is None:
        labels = auto or _default_labels(frontiers)
    labels = list(labels)
    if len(labels) != len(frontiers):
        raise ValueError(f"{len(labels)} labels for {len(frontiers)} frontiers")
    ax = _new_axes(ax, (9, 6.5))
    budget = _budget(memory_budget)

    def div(f):
        b = _batch(f.plans[0]) if per_sample else None
        return float(b) if b else 1.0

    all_t = [p.time_s / div(f) for f in frontiers for p in f.plans]
    scale, unit = _time_scale(all_t)
    mscale, munit = _mem_scale([p.peak_memory_bytes for f in frontiers for p in f.plans])
    chosen_any = False
    for f, lab in zip(frontiers, labels):
        if not f.plans:
            continue
        d = div(f)
        t = np.array([p.time_s for p in f.plans]) / d * scale
        m = np.array([p.peak_memory_bytes for p in f.plans]) * mscale
        line, = ax.step(t, m, where="post", linewidth=1.8, marker="o", markersize=3 if len(t) > 50 else 4,
                        gid=f"frontier-{len(ax.lines)}",
                        label=f"{lab}: {_fmt_time(f.plans[0].time_s / d, scale, unit)} at "
                              f"{f.plans[0].peak_memory_bytes * mscale:.3g} {munit} … "
                              f"{_fmt_time(f.plans[-1].time_s / d, scale, unit)} at "
                              f"{f.plans[-1].peak_memory_bytes * mscale:.3g} {munit}")
        c = line.get_color()
        ax.annotate(lab, (t[0], m[0]), textcoords="offset points", xytext=(4, 6), fontsize=9, color=c,
                    fontweight="bold")
        if budget is not None and _fits(f.plans, budget) is None:
            line.set_label(line.get_label() + " — none fits the budget")
        if references and "data parallel" in getattr(f, "reference", {}):
            p = f.reference["data parallel"]
            ax.scatter([p.time_s / d * scale], [p.peak_memory_bytes * mscale], marker="X", s=60, color=c,
                       edgecolor="black", zorder=5)
        if budget is not None:
            ch = _fits(f.plans, budget)
            if ch is not None:
                chosen_any = True
                ax.scatter([ch.time_s / d * scale], [ch.peak_memory_bytes * mscale], marker="*", s=220, color=c,
                           edgecolor="black", zorder=6)
    if references:
        ax.scatter([], [], marker="X", s=60, color="white", edgecolor="black", label="data parallel (reference)")
    ymax = ax.get_ylim()[1]
    ax.set_ylim(0, ymax)
    if budget is not None:
        y = budget * mscale
        if y <= ymax * 1.5:
            ax.axhline(y, linestyle="--", color="dimgray", linewidth=1.2, label=f"memory budget {_fmt_gib(budget)}")
            ax.set_ylim(0, max(ymax, y * 1.08))
            ax.axhspan(y, max(ymax, y * 1.08) * 10, color="red", alpha=0.06, zorder=0)
        if chosen_any:
            ax.scatter([], [], marker="*", s=160, color="white", edgecolor="black",
                       label="fastest plan within budget")
    if logx:
        ax.set_xscale("log")
    what = "time per training sample" if per_sample else "time per training iteration"
    ax.set_xlabel(f"{what} ({unit})")
    ax.set_ylabel(f"peak memory per device ({munit})")
    models = sorted({f.model for f in frontiers})
    ax.set_title(title or f"{', '.join(models)}: frontiers compared (down-left is better)", fontsize=11)
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=8, frameon=False,
              ncol=1 if len(frontiers) > 3 else 2)
    return ax


# ---------------------------------------------------------------------------------- strategy map

_BLOCK = re.compile(r"^layers\.(\d+)([.:].*)$")
_BLOCK_MODES = ("collapse", "per-block", "first", "all")


def _row_key(name: str, blocks: str) -> tuple[str, int | None]:
    m = _BLOCK.match(name)
    if m is None:
        return name, None
    if blocks == "collapse":
        return "layers.*" + m.group(2), int(m.group(1))
    if blocks == "per-block":
        return f"layers.{m.group(1)}", int(m.group(1))
    return name, int(m.group(1))


def strategy_table(frontier_or_plans, blocks: str = "collapse", only_changing: bool = False,
                   families: Sequence[str] | None = None):
    """Per operator (rows) and plan (columns) the configuration string, as a pandas DataFrame.

    ``blocks="collapse"``: operators of repeated blocks ``layers.<i>...`` share one row
    ``layers.*...``; a cell holds the configuration when every block agrees, else the most
    common one followed by ``*`` (e.g. ``"b*"``). ``blocks="per-block"``: one row per block
    ``layers.<i>`` holding the most common configuration of its operators (``*`` when they
    differ): compact for deep networks. ``blocks="first"``: only block 0 is shown;
    ``"all"``: every operator. ``only_changing``: drop rows that never change along the
    frontier. ``families``: keep only these operator families (e.g. ``("linear", "attention")``)."""
    import collections

    import pandas as pd

    plans = list(getattr(frontier_or_plans, "plans", frontier_or_plans))
    if blocks not in _BLOCK_MODES:
        raise ValueError(f"blocks must be one of {', '.join(map(repr, _BLOCK_MODES))}, got {blocks!r}")
    order: list[str] = []
    fam: dict[str, str] = {}
    columns = []
    for p in plans:
        cells: dict[str, collections.Counter] = {}
        for o in p.ops:
            if families is not None and o.family not in families:
                continue
            key, block = _row_key(o.name, blocks)
            if blocks == "first" and block not in (None, 0):
                continue
            if key not in fam:
                fam[key] = "block" if blocks == "per-block" and block is not None else o.family
                order.append(key)
            cells.setdefault(key, collections.Counter())[o.config] += 1
        col = {}
        for key, counter in cells.items():
            (top, n), = counter.most_common(1)
            col[key] = top if n == sum(counter.values()) else top + "*"
        columns.append(col)
    df = pd.DataFrame(columns, columns=order).T
    df.columns = list(range(len(plans)))
    if only_changing and len(df.columns) > 1:
        df = df[df.nunique(axis=1) > 1]
    df.insert(0, "family", [fam[k] for k in df.index])
    return df


def _blend(colour: str, towards_white: float) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    return (r + (1 - r) * towards_white, g + (1 - g) * towards_white, b + (1 - b) * towards_white)


def _config_colours(configs: Iterable[str]) -> dict[str, Any]:
    """A colour per configuration string: the split label's own colour (b blue, n orange,
    k green, ...), lighter when some mesh axes replicate (``"n,-"`` lighter than ``"n,n"``);
    grey when replicated everywhere; other colours for mixed splits (``"b,n"``)."""
    import collections

    counts = collections.Counter(configs)
    out, extra = {}, iter(_EXTRA_COLOURS * 4)

    def sort_key(cfg):
        letters = cfg.split(",")
        split = sorted({s for s in letters if s != "-"})
        return (len(split) != 1, "".join(split), letters.count("-"), cfg)

    for cfg in sorted(counts, key=sort_key):
        letters = cfg.split(",")
        split = {s for s in letters if s != "-"}
        if not split:
            out[cfg] = _REPLICATED
        elif len(split) == 1 and next(iter(split)) in _LABEL_COLOURS:
            out[cfg] = _blend(_LABEL_COLOURS[next(iter(split))], 0.5 * letters.count("-") / len(letters))
        else:
            out[cfg] = next(extra)
    return out


def _spread(n: int, k: int) -> list[int]:
    if n <= k:
        return list(range(n))
    import numpy as np

    return sorted({int(round(x)) for x in np.linspace(0, n - 1, k)})


def plot_strategy_map(frontier, ax=None, max_plans: int = 24, blocks: str = "collapse",
                      only_changing: bool = True, families: Sequence[str] | None = None,
                      cell_text: bool | None = None, title: str | None = None):
    """How each operator is parallelised along the frontier: operators (rows) × plans
    (columns, fastest on the left to least memory on the right), each cell coloured by the
    operator's configuration (the label split over each mesh axis; grey = replicated).

    Readable with many operators: repeated blocks ``layers.<i>`` fold into one row per
    block operator (``blocks="collapse"``; a hatched cell with ``*`` means the blocks
    disagree and shows the most common configuration), ``blocks="per-block"`` gives one row
    per block (its operators' most common configuration), ``blocks="first"`` shows block 0
    only, and ``only_changing`` keeps the rows whose configuration changes along the
    frontier. At most ``max_plans`` columns, spread evenly over the frontier. Rows on top
    give the mesh, the ZeRO stage and how many blocks recompute their activations."""
    import numpy as np
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch, Rectangle

    plans = list(frontier.plans)
    if not plans:
        raise ValueError("empty frontier: nothing to plot")
    cols = _spread(len(plans), max_plans)
    sel = [plans[i] for i in cols]
    table = strategy_table(sel, blocks=blocks, only_changing=only_changing, families=families)
    configs = table.drop(columns="family")
    # meta rows: what changes besides operator configurations
    meta: list[tuple[str, list[str]]] = []
    meshes = [p.mesh for p in sel]
    if len(set(meshes)) > 1:
        meta.append(("mesh", meshes))
    zs = [getattr(p, "zero_stage", 0) for p in sel]
    if any(zs):
        meta.append(("ZeRO stage", [f"Z{z}" if z else "-" for z in zs]))
    rc = [len(getattr(p, "recompute", ()) or ()) for p in sel]
    if any(rc):
        meta.append(("recomputed blocks", [str(r) if r else "-" for r in rc]))

    n_rows, n_cols = len(meta) + len(configs), len(sel)
    if ax is None:
        plt = _plt()
        w = min(max(7.0, 3.2 + 0.42 * n_cols), 16.0)
        h = min(max(3.5, 1.9 + 0.24 * n_rows), 22.0)
        _, ax = plt.subplots(figsize=(w, h), layout="constrained")
    raw = [str(v).rstrip("*") for v in configs.to_numpy().ravel() if isinstance(v, str)]
    colours = _config_colours(raw)
    img = np.ones((n_rows, n_cols, 3))
    greys = {}
    for r, (_, vals) in enumerate(meta):
        uniq = sorted(set(vals), key=lambda v: (v != "-", len(v), v))
        for j, v in enumerate(vals):
            g = 0.97 - 0.45 * uniq.index(v) / max(len(uniq) - 1, 1) if v != "-" else 1.0
            greys[(r, j)] = g
            img[r, j] = (g, g, g)
    mixed = []
    for i, (key, row) in enumerate(configs.iterrows()):
        r = len(meta) + i
        for j, v in enumerate(row.tolist()):
            if not isinstance(v, str):
                continue              # operator absent from this plan
            img[r, j] = to_rgb(colours[v.rstrip("*")])
            if v.endswith("*"):
                mixed.append((r, j))
    ax.imshow(img, aspect="auto", interpolation="nearest")
    for r, j in mixed:
        ax.add_patch(Rectangle((j - 0.5, r - 0.5), 1, 1, fill=False, hatch="///", edgecolor="white", linewidth=0))
    # grid lines between cells
    ax.set_xticks(np.arange(-0.5, n_cols, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, n_rows, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.8)
    ax.tick_params(which="minor", length=0)
    if meta:
        ax.axhline(len(meta) - 0.5, color="black", linewidth=1.5)
    show_text = cell_text if cell_text is not None else (n_cols <= 30 and n_rows <= 60)
    if show_text:
        fs = 7 if n_cols > 16 else 8
        for r, (_, vals) in enumerate(meta):
            for j, v in enumerate(vals):
                ax.text(j, r, v, ha="center", va="center", fontsize=fs - 1, color="black")
        for i, (key, row) in enumerate(configs.iterrows()):
            for j, v in enumerate(row.tolist()):
                if isinstance(v, str):
                    rgb = to_rgb(colours[v.rstrip("*")])
                    dark = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 0.55
                    ax.text(j, len(meta) + i, v, ha="center", va="center", fontsize=fs,
                            color="white" if dark else "black")
    ylabels = [m for m, _ in meta] + [f"{k}  ({f})" for k, f in zip(configs.index, table["family"])]
    ax.set_yticks(range(n_rows))
    ax.set_yticklabels(ylabels, fontsize=8 if n_rows <= 40 else 6)
    scale, unit = _time_scale([p.time_s for p in sel])
    mscale, munit = _mem_scale([p.peak_memory_bytes for p in sel])
    ax.set_xticks(range(n_cols))
    ax.set_xticklabels([f"{p.time_s * scale:.3g} {unit}\n{p.peak_memory_bytes * mscale:.3g} {munit}" for p in sel],
                       fontsize=7, rotation=90)
    ax.set_xlabel(f"frontier plans ({len(sel)} of {len(plans)}): fastest on the left → least memory on the right",
                  fontsize=9)
    handles = [Patch(facecolor=c, edgecolor="gray", label=cfg) for cfg, c in colours.items()]
    if mixed:
        differ = "operators of the block differ" if blocks == "per-block" else "blocks differ"
        handles.append(Patch(facecolor="white", edgecolor="gray", hatch="///",
                             label=f"* {differ}\n(most common shown)"))
    ax.legend(handles=handles, title="configuration", loc="upper left", bbox_to_anchor=(1.01, 1),
              fontsize=8, title_fontsize=9, frameon=False, ncol=1 if len(handles) <= 24 else 2)
    ax.annotate(_LEGEND_NOTE, (1.01, 0), xycoords="axes fraction", fontsize=7, va="bottom", color="dimgray")
    if not len(configs):
        ax.text(n_cols / 2 - 0.5, max(n_rows - 1, 0) / 2, "no operator changes configuration along the frontier",
                ha="center", va="center", fontsize=10)
    what = "operators that change" if only_changing else "operators"
    ax.set_title(title or f"{frontier.model} on {frontier.devices}: configuration of the {what} along the "
                 f"frontier", fontsize=11)
    return ax


# ---------------------------------------------------------------------------------- breakdowns


def sample_plans(frontier, n: int = 5, references: bool = True) -> dict[str, Any]:
    """Up to ``n`` frontier plans spread evenly in memory from the fastest to the leanest,
    labelled by rank, time and memory, plus (``references``) the reference plans."""
    import numpy as np

    plans = list(frontier.plans)
    out: dict[str, Any] = {}
    if plans:
        mems = np.array([p.peak_memory_bytes for p in plans])
        picks = []
        for target in np.linspace(mems[0], mems[-1], max(min(n, len(plans)), 1)):
            i = int(np.argmin(np.abs(mems - target)))
            if i not in picks:
                picks.append(i)
        for k, i in enumerate(sorted(picks)):
            tag = "fastest" if i == 0 else ("least memory" if i == len(plans) - 1 else f"plan {i}")
            out[f"{tag}\n{plans[i].summary}"] = plans[i]
    if references:
        for name, p in getattr(frontier, "reference", {}).items():
            out[name] = p
    return out


def _plans_and_labels(plans, labels, n, references):
    if hasattr(plans, "plans") and not isinstance(plans, (list, tuple, dict)):
        plans = sample_plans(plans, n=n, references=references)
    if isinstance(plans, Mapping):
        return list(plans.values()), list(labels or plans.keys())
    plans = list(plans)
    if labels is None:
        labels = [p.label or p.summary for p in plans]
    return plans, list(labels)


def _stacked(ax, plans, labels, parts, value, scale, unit, ylabel, title, total, total_text):
    import numpy as np

    x = np.arange(len(plans))
    bottom = np.zeros(len(plans))
    for key, name, colour in parts:
        vals = np.array([value(p, key) for p in plans]) * scale
        if not vals.any():
            continue
        ax.bar(x, vals, bottom=bottom, color=colour, label=name, width=0.65, edgecolor="white", linewidth=0.5)
        bottom += vals
    # whatever the total holds beyond the named parts (e.g. transient peaks)
    tot = np.array([total(p) for p in plans]) * scale
    rest = tot - bottom
    if (rest > 1e-6 * max(tot.max(), 1e-30)).any():
        ax.bar(x, np.clip(rest, 0, None), bottom=bottom, color="#BAB0AC", label="other", width=0.65,
               edgecolor="white", linewidth=0.5)
    top = max(tot.max(), bottom.max())
    for xi, p, t in zip(x, plans, tot):
        ax.annotate(total_text(p), (xi, t), textcoords="offset points", xytext=(0, 3), ha="center",
                    fontsize=8)
    refs = [i for i, p in enumerate(plans) if getattr(p, "label", "")]
    if refs and len(refs) < len(plans) and refs == list(range(refs[0], len(plans))):
        ax.axvline(refs[0] - 0.5, color="gray", linestyle=":", linewidth=1)     # frontier | references
        ax.annotate("reference plans", (refs[0] - 0.45, 1), xycoords=("data", "axes fraction"), xytext=(2, -12),
                    textcoords="offset points", fontsize=8, color="gray")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8, rotation=0 if len(plans) <= 5 else 30,
                       ha="center" if len(plans) <= 5 else "right")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, top * 1.2 if top > 0 else 1)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(title, fontsize=11)
    return top


def plot_memory_breakdown(plans, labels: Sequence[str] | None = None, ax=None, memory_budget=None,
                          n: int = 5, references: bool = True, title: str | None = None):
    """Per-device memory of several plans as stacked bars: parameters, gradients, optimizer
    state and activations (GiB); the time per iteration is written above each bar.

    ``plans``: a list of Plans, a ``{label: plan}`` dict, or a Frontier (then
    :func:`sample_plans` picks ``n`` plans along it, plus the reference plans)."""
    plans, labels = _plans_and_labels(plans, labels, n, references)
    if not plans:
        raise ValueError("no plans to plot")
    ax = _new_axes(ax, (min(max(7.0, 1.3 * len(plans) + 2), 12.0), 5))
    mscale, munit = _mem_scale([p.peak_memory_bytes for p in plans])
    tscale, tunit = _time_scale([p.time_s for p in plans])
    top = _stacked(ax, plans, labels, _MEMORY_PARTS, lambda p, k: float(p.breakdown.get(k, 0.0)), mscale, munit,
                   f"peak memory per device ({munit})",
                   title or f"{plans[0].model} on {plans[0].devices}: memory per device by kind",
                   lambda p: p.peak_memory_bytes,
                   lambda p: f"{p.peak_memory_bytes * mscale:.3g} {munit}\n{_fmt_time(p.time_s, tscale, tunit)}/iter")
    budget = _budget(memory_budget)
    if budget is not None:
        y = budget * mscale
        if y <= top * 1.5:
            ax.axhline(y, linestyle="--", color="dimgray", linewidth=1.2, label=f"budget {_fmt_gib(budget)}")
            ax.set_ylim(0, max(ax.get_ylim()[1], y * 1.1))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return ax


def plot_time_breakdown(plans, labels: Sequence[str] | None = None, ax=None, n: int = 5,
                        references: bool = True, title: str | None = None):
    """Time per iteration of several plans as stacked bars: compute, recomputation,
    parameter/gradient communication and activation re-layouts (ms or s). Same ``plans``
    forms as :func:`plot_memory_breakdown`; per-device memory is written above each bar."""
    plans, labels = _plans_and_labels(plans, labels, n, references)
    if not plans:
        raise ValueError("no plans to plot")
    ax = _new_axes(ax, (min(max(7.0, 1.3 * len(plans) + 2), 12.0), 5))
    tscale, tunit = _time_scale([p.time_s for p in plans])
    _stacked(ax, plans, labels, _TIME_PARTS, lambda p, k: float(p.breakdown.get(k, 0.0)), tscale, tunit,
             f"time per training iteration ({tunit})",
             title or f"{plans[0].model} on {plans[0].devices}: time per iteration by kind",
             lambda p: p.time_s,
             lambda p: f"{_fmt_time(p.time_s, tscale, tunit)}\n{_fmt_gib(p.peak_memory_bytes)}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return ax
