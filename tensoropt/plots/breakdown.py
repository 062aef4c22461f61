"""Where a plan's time and memory go: stacked bars per plan (:func:`plot_memory_breakdown`,
:func:`plot_time_breakdown`) for plans picked along a frontier (:func:`sample_plans`)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..budget import budget_bytes
from .style import fmt_gib, fmt_time, mem_scale, new_axes, time_scale

__all__ = ["sample_plans", "plot_memory_breakdown", "plot_time_breakdown"]

_MEMORY_PARTS = (("param_bytes", "parameters", "#4C78A8"), ("grad_bytes", "gradients", "#F58518"),
                 ("optimizer_bytes", "optimizer state", "#54A24B"),
                 ("activation_bytes", "activations", "#E45756"),
                 ("transient_bytes", "backward's rise (in flight)", "#B279A2"), ("input_bytes", "input batch", "#72B7B2"))


_TIME_PARTS = (("compute_s", "compute", "#4C78A8"), ("recompute_s", "recompute", "#B279A2"),
               ("comm_s", "gradient/weight communication", "#F58518"),
               ("relayout_s", "re-layout (activations)", "#54A24B"))


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
    ax = new_axes(ax, (min(max(7.0, 1.3 * len(plans) + 2), 12.0), 5))
    mscale, munit = mem_scale([p.peak_memory_bytes for p in plans])
    tscale, tunit = time_scale([p.time_s for p in plans])
    top = _stacked(ax, plans, labels, _MEMORY_PARTS, lambda p, k: float(p.breakdown.get(k, 0.0)), mscale, munit,
                   f"peak memory per device ({munit})",
                   title or f"{plans[0].model} on {plans[0].devices}: memory per device by kind",
                   lambda p: p.peak_memory_bytes,
                   lambda p: f"{p.peak_memory_bytes * mscale:.3g} {munit}\n{fmt_time(p.time_s, tscale, tunit)}/iter")
    budget = None if memory_budget is None else budget_bytes(memory_budget)
    if budget is not None:
        y = budget * mscale
        if y <= top * 1.5:
            ax.axhline(y, linestyle="--", color="dimgray", linewidth=1.2, label=f"budget {fmt_gib(budget)}")
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
    ax = new_axes(ax, (min(max(7.0, 1.3 * len(plans) + 2), 12.0), 5))
    tscale, tunit = time_scale([p.time_s for p in plans])
    _stacked(ax, plans, labels, _TIME_PARTS, lambda p, k: float(p.breakdown.get(k, 0.0)), tscale, tunit,
             f"time per training iteration ({tunit})",
             title or f"{plans[0].model} on {plans[0].devices}: time per iteration by kind",
             lambda p: p.time_s,
             lambda p: f"{fmt_time(p.time_s, tscale, tunit)}\n{fmt_gib(p.peak_memory_bytes)}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return ax
