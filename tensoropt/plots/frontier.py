"""Frontiers as trade-off curves: one frontier with its reference plans and a memory budget
(:func:`plot_frontier`), several on one axes (:func:`plot_frontiers`)."""

from __future__ import annotations

from typing import Mapping, Sequence

from ..budget import budget_bytes, fastest_within
from .style import GIB, batch_of, fmt_gib, fmt_time, mem_scale, new_axes, time_scale

__all__ = ["plot_frontier", "plot_frontiers"]


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
    batches = {batch_of(f.plans[0]) if f.plans else None for f in frontiers}
    labels = []
    for f in frontiers:
        parts = []
        if len(models) > 1:
            parts.append(f.model)
        if len(devices) > 1 or len(batches) <= 1:
            parts.append(f.devices)
        if len(batches) > 1:
            parts.append(f"batch {batch_of(f.plans[0])}")
        labels.append(", ".join(parts))
    return labels


def plot_frontier(frontier, ax=None, memory_budget=None, label: str | None = None, references: bool = True,
                  color=None, annotate: bool = True, title: str | None = None, yours=None):
    """The trade-off curve of one frontier.

    x: time per iteration (ms, or s); y: peak memory per device over the training step
    (``Plan.peak_memory_bytes``; GiB, MiB for tiny models).
    The staircase runs through the Pareto-optimal plans (every plan left of and below the
    curve is impossible, every plan above and right of it is wasteful); reference plans
    (data parallel, Megatron) are marked; ``memory_budget`` ("40GB", bytes) draws the budget,
    shades what exceeds it and stars the fastest plan that fits. With ``annotate`` the
    fastest and the leanest plans are labelled and a box states what the memory buys:
    the slowdown per GiB saved. A top axis reads the slowdown against the fastest plan.
    ``yours``: a plan or plans someone runs (``tensoropt.plan_for``), marked by their labels
    with how much slower each is than the fastest frontier plan within its memory.
    """
    import numpy as np

    ax = new_axes(ax, (9, 6.5))
    plans = list(frontier.plans)
    if not plans:
        raise ValueError("empty frontier: nothing to plot")
    refs = list(frontier.reference.items()) if references else []
    mine = _yours(yours)
    refs += mine
    budget = None if memory_budget is None else budget_bytes(memory_budget)
    times = np.array([p.time_s for p in plans])
    mems = np.array([p.peak_memory_bytes for p in plans])
    scale, unit = time_scale(list(times) + [p.time_s for _, p in refs])
    ref_mems = [p.peak_memory_bytes for _, p in refs]
    mscale, munit = mem_scale(list(mems) + ref_mems)
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
    n_refs = len(refs) - len(mine)
    for i, (rname, p) in enumerate(refs):
        t, m = p.time_s * scale, p.peak_memory_bytes * mscale
        own = i >= n_refs
        mk = "P" if own else markers[i % len(markers)]
        txt = f"{rname}: {fmt_time(p.time_s, scale, unit)}, {m:.3g} {munit}"
        if own:
            txt += _versus_text(frontier, p)
        if t <= x_hi and m <= y_hi:
            ax.scatter([t], [m], marker=mk, s=110 if own else 60, color="crimson" if own else "black", zorder=6,
                       label=txt, gid="yours" if own else None)
            ax.annotate(rname, (t, m), textcoords="offset points", xytext=(6, 4), fontsize=9)
        else:                                   # off the chart: pin to the edge with an arrow
            pt, pm = min(t, x_hi), min(m, y_hi)
            ax.scatter([pt], [pm], marker=mk, s=60, color="white", edgecolor="black", zorder=5, clip_on=False,
                       label=txt + " (off the chart)")
            arrow = ("→" if t > x_hi else "") + ("↑" if m > y_hi else "")
            ax.annotate(f"{rname} {arrow}\n{fmt_time(p.time_s, scale, unit)}, {m:.3g} {munit}", (pt, pm),
                        textcoords="offset points", xytext=(-8, -6 - 24 * pinned), ha="right", va="top",
                        fontsize=8, color="dimgray")
            pinned += 1                         # the next pinned label goes below this one
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(0, y_hi)
    top = y_hi

    if show_dev:
        y = dev * mscale
        ax.axhline(y, color="firebrick", linewidth=1.2, zorder=2)
        ax.annotate(f"device memory {fmt_gib(dev)}", (0, y), xycoords=("axes fraction", "data"),
                    xytext=(4, 3), textcoords="offset points", ha="left", fontsize=9, color="firebrick")

    if budget is not None:
        chosen = fastest_within(plans, budget)
        y = budget * mscale
        if y <= top:
            ax.axhline(y, linestyle="--", color="dimgray", linewidth=1.2, zorder=2,
                       label=f"memory budget {fmt_gib(budget)}")
            ax.axhspan(y, top * 10, color="red", alpha=0.05, zorder=0)
            ax.annotate(f"budget {fmt_gib(budget)}: plans above the line do not fit", (1, y),
                        xycoords=("axes fraction", "data"), xytext=(-4, 3), textcoords="offset points",
                        ha="right", fontsize=9, color="dimgray")
        else:
            ax.annotate(f"budget {fmt_gib(budget)} (off the chart): every plan fits", (0, 1),
                        xycoords="axes fraction", xytext=(4, -12), textcoords="offset points",
                        fontsize=9, color="dimgray")
        if chosen is not None:
            ax.scatter([chosen.time_s * scale], [chosen.peak_memory_bytes * mscale], marker="*", s=260,
                       color="gold", edgecolor="black", zorder=6,
                       label=f"fastest within budget: {fmt_time(chosen.time_s, scale, unit)}, "
                             f"{chosen.peak_memory_bytes * mscale:.3g} {munit} ({chosen.summary})")
        else:
            ax.annotate(f"no plan fits {fmt_gib(budget)}: the minimum is {fmt_gib(mems.min())}",
                        (0.5, 0.5), xycoords="axes fraction", ha="center", fontsize=11, color="firebrick",
                        bbox=dict(boxstyle="round", fc="white", ec="firebrick"))

    if annotate:
        fast, lean = plans[0], plans[-1]
        ax.annotate(f"fastest\n{fmt_time(fast.time_s, scale, unit)}, {fast.peak_memory_bytes * mscale:.3g} {munit}",
                    (fast.time_s * scale, fast.peak_memory_bytes * mscale), textcoords="offset points",
                    xytext=(8, 8), fontsize=9, color=colour,
                    arrowprops=dict(arrowstyle="-", color=colour, lw=0.8))
        if len(plans) > 1:
            ax.annotate(f"least memory\n{fmt_time(lean.time_s, scale, unit)}, "
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
    batch = batch_of(plans[0])
    ax.set_title(title or f"{frontier.model} on {frontier.devices}"
                 f"{f', batch {batch}' if batch else ''}: time vs memory per device"
                 + (f"\n(1+ε)-approximate, ε = {frontier.epsilon:g}" if frontier.epsilon else ""), fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=8, frameon=False, ncol=2)
    return ax


def _yours(yours) -> list:
    if yours is None:
        return []
    plans = [yours] if hasattr(yours, "peak_memory_bytes") else list(yours)
    return [(p.label or "yours", p) for p in plans]


def _versus_text(frontier, plan) -> str:
    best = frontier.fastest_within(plan.peak_memory_bytes)
    if best is None:
        return " (no frontier plan holds as little)"
    return f" ({plan.time_s / best.time_s:.2f}x the frontier's time at its memory)"


def _tradeoff_text(plans, scale, unit) -> str:
    fast, lean = plans[0], plans[-1]
    saved = (fast.peak_memory_bytes - lean.peak_memory_bytes) / GIB
    extra = (lean.time_s - fast.time_s) * scale
    pct = (lean.time_s / fast.time_s - 1) * 100 if fast.time_s > 0 else float("nan")
    lines = [f"{len(plans)} Pareto-optimal plans",
             f"fastest → least memory: −{fmt_gib(fast.peak_memory_bytes - lean.peak_memory_bytes)} per device",
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
    ax = new_axes(ax, (9, 6.5))
    budget = None if memory_budget is None else budget_bytes(memory_budget)

    def div(f):
        b = batch_of(f.plans[0]) if per_sample else None
        return float(b) if b else 1.0

    all_t = [p.time_s / div(f) for f in frontiers for p in f.plans]
    scale, unit = time_scale(all_t)
    mscale, munit = mem_scale([p.peak_memory_bytes for f in frontiers for p in f.plans])
    chosen_any = False
    for f, lab in zip(frontiers, labels):
        if not f.plans:
            continue
        d = div(f)
        t = np.array([p.time_s for p in f.plans]) / d * scale
        m = np.array([p.peak_memory_bytes for p in f.plans]) * mscale
        line, = ax.step(t, m, where="post", linewidth=1.8, marker="o", markersize=3 if len(t) > 50 else 4,
                        gid=f"frontier-{len(ax.lines)}",
                        label=f"{lab}: {fmt_time(f.plans[0].time_s / d, scale, unit)} at "
                              f"{f.plans[0].peak_memory_bytes * mscale:.3g} {munit} … "
                              f"{fmt_time(f.plans[-1].time_s / d, scale, unit)} at "
                              f"{f.plans[-1].peak_memory_bytes * mscale:.3g} {munit}")
        c = line.get_color()
        ax.annotate(lab, (t[0], m[0]), textcoords="offset points", xytext=(4, 6), fontsize=9, color=c,
                    fontweight="bold")
        if budget is not None and fastest_within(f.plans, budget) is None:
            line.set_label(line.get_label() + " — none fits the budget")
        if references and "data parallel" in getattr(f, "reference", {}):
            p = f.reference["data parallel"]
            ax.scatter([p.time_s / d * scale], [p.peak_memory_bytes * mscale], marker="X", s=60, color=c,
                       edgecolor="black", zorder=5)
        if budget is not None:
            ch = fastest_within(f.plans, budget)
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
            ax.axhline(y, linestyle="--", color="dimgray", linewidth=1.2, label=f"memory budget {fmt_gib(budget)}")
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
