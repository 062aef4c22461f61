"""Accuracy statistics and plots for predicted-vs-measured pairs."""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["rel_errors", "median_abs_rel_error", "max_abs_rel_error", "spearman", "rankdata",
           "summarize", "plot_predicted_vs_measured"]


def rel_errors(predicted: Sequence[float], measured: Sequence[float]) -> np.ndarray:
    """(predicted - measured) / measured, per pair."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    if p.shape != m.shape:
        raise ValueError(f"{p.shape} predictions, {m.shape} measurements")
    return (p - m) / m


def median_abs_rel_error(predicted, measured) -> float:
    e = rel_errors(predicted, measured)
    return float(np.median(np.abs(e))) if e.size else float("nan")


def max_abs_rel_error(predicted, measured) -> float:
    e = rel_errors(predicted, measured)
    return float(np.max(np.abs(e))) if e.size else float("nan")


def rankdata(x: Sequence[float]) -> np.ndarray:
    """Ranks 1..n, ties get the average of their ranks."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    sx = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson correlation of average ranks); nan if undefined."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError("sequences differ in length")
    if a.size < 2:
        return float("nan")
    ra, rb = rankdata(a), rankdata(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def summarize(pred_t, meas_t, pred_m=None, meas_m=None) -> dict:
    out = {"n": int(len(meas_t)),
           "median_abs_time_error": median_abs_rel_error(pred_t, meas_t),
           "max_abs_time_error": max_abs_rel_error(pred_t, meas_t),
           "spearman_time": spearman(pred_t, meas_t)}
    if pred_m is not None:
        out["median_abs_memory_error"] = median_abs_rel_error(pred_m, meas_m)
        out["max_abs_memory_error"] = max_abs_rel_error(pred_m, meas_m)
        out["spearman_memory"] = spearman(pred_m, meas_m)
    return out


def plot_predicted_vs_measured(pairs: list[dict], path: str, title: str = "") -> None:
    """Three panels: wall step time and process CPU time per step (profile-only and
    calibrated predictions; calibrated points of the fit split green, held-out red), and peak
    memory; log-log with the y = x line and a ±15 % (time) / ±10 % (memory) band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 5.4))
    models = sorted({p["model"] for p in pairs})
    markers = dict(zip(models, "osD^vP*X"))
    panels = (("wall", "measured_time_s", "measured_time_q25_s", "measured_time_q75_s", "calibrated_time_s",
               "measured step time (ms): median of slowest rank, IQR"),
              ("cpu", "measured_cpu_time_s", "measured_cpu_time_q25_s", "measured_cpu_time_q75_s",
               "calibrated_cpu_time_s", "measured CPU time per step (ms): median, IQR"))
    for ax, (metric, key, q25, q75, cal_key, ylabel) in zip(axes, panels):
        for mdl in models:
            ps = [p for p in pairs if p["model"] == mdl and key in p]
            if not ps:
                continue
            mt = np.array([p[key] for p in ps]) * 1e3
            lo = np.array([p.get(q25, p[key]) for p in ps]) * 1e3
            hi = np.array([p.get(q75, p[key]) for p in ps]) * 1e3
            pt = np.array([p["predicted_time_s"] for p in ps]) * 1e3
            ax.errorbar(pt, mt, yerr=[mt - lo, hi - mt], fmt=markers[mdl], mfc="none", color="C0", alpha=0.7)
            if all(cal_key in p for p in ps):
                ct = np.array([p[cal_key] for p in ps]) * 1e3
                ax.errorbar(ct, mt, yerr=[mt - lo, hi - mt], fmt="none", ecolor="0.6", alpha=0.5)
                ax.scatter(ct, mt, marker=markers[mdl], s=30,
                           c=["C3" if p.get("split") == "test" else "C2" for p in ps])
        for mdl in models:
            ax.scatter([], [], marker=markers[mdl], c="k", label=mdl)
        ax.scatter([], [], marker="o", facecolors="none", edgecolors="C0", label="profile only (uncalibrated)")
        ax.scatter([], [], marker="o", c="C2", label="calibrated, fit pair")
        ax.scatter([], [], marker="o", c="C3", label="calibrated, held-out pair")
        _diag(ax, 0.15)
        ax.set_xlabel("predicted step time (ms)")
        ax.set_ylabel(ylabel)
        ax.set_title("time per iteration: " + ("wall clock" if metric == "wall" else "process CPU time"))
        ax.legend(fontsize=7)
    ax = axes[2]
    for mdl in models:
        ps = [p for p in pairs if p["model"] == mdl]
        ax.scatter([p["predicted_memory_bytes"] / 2**20 for p in ps],
                   [p["measured_memory_bytes"] / 2**20 for p in ps], marker=markers[mdl], facecolors="none",
                   edgecolors="C0")
        if all("calibrated_memory_bytes" in p for p in ps):
            ax.scatter([p["calibrated_memory_bytes"] / 2**20 for p in ps],
                       [p["measured_memory_bytes"] / 2**20 for p in ps], marker=markers[mdl], s=30,
                       c=["C3" if p.get("split") == "test" else "C2" for p in ps])
    for mdl in models:
        ax.scatter([], [], marker=markers[mdl], c="k", label=mdl)
    ax.scatter([], [], marker="o", facecolors="none", edgecolors="C0", label="cost model (uncalibrated)")
    ax.scatter([], [], marker="o", c="C2", label="+ whole-step memory terms, fit pair")
    ax.scatter([], [], marker="o", c="C3", label="+ whole-step memory terms, held-out pair")
    _diag(ax, 0.10)
    ax.set_xlabel("predicted peak memory per device (MiB)")  # noqa: E501
    ax.set_ylabel("measured peak memory, max over ranks (MiB, MemTracker)")
    ax.set_title("peak memory (whole step)")
    ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _diag(ax, band: float) -> None:
    import matplotlib.ticker  # noqa: F401

    import matplotlib
    ax.set_xscale("log")
    ax.set_yscale("log")
    lo = min(ax.get_xlim()[0], ax.get_ylim()[0])
    hi = max(ax.get_xlim()[1], ax.get_ylim()[1])
    xs = np.geomspace(lo, hi, 50)
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, xs * (1 - band), xs * (1 + band), color="grey", alpha=0.15,
                    label=f"±{band:.0%}")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    from matplotlib.ticker import LogLocator, ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        f = ScalarFormatter()
        f.set_scientific(False)
        axis.set_major_formatter(f)
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
