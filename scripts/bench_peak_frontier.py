"""The frontier searched on the step's peak against the one searched on end-of-forward memory
and priced on the peak afterwards (every problem sent straight to the ``forward-end`` search,
as tensoropt did before the peak search): plans gained and lost, the fastest plan under five
budgets, and what the search costs.

    .venv/bin/python scripts/bench_peak_frontier.py [--quick] [--out data/bench/peak_frontier.json]

A plan is *gained* when no plan of the other frontier is at least as fast and as small in
peak, *lost* the other way round. Every number is measured on the machine that runs it; the
JSON records that machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

import tensoropt
import tensoropt.mesh_search as mesh_search
import tensoropt.pipeline as pipeline
from tensoropt.peak_search import solve_problem

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    ("gpt2", "8xA100-80GB", dict(max_mesh_dims=2)),
    ("bert-large", "8xA100-80GB", dict(max_mesh_dims=2, epsilon=0.01)),
    ("llama3-8b", "8xH100", dict(max_mesh_dims=2, epsilon=0.01)),
]
QUICK = [("gpt-tiny", "4xA100-80GB", dict(max_mesh_dims=2))]


def _search(model: str, devices: str, settings: dict, forward_end: bool):
    solver = partial(solve_problem, start_at="forward-end") if forward_end else solve_problem
    saved = mesh_search.solve_problem, pipeline.solve_problem
    mesh_search.solve_problem = pipeline.solve_problem = solver
    try:
        t0 = time.monotonic()
        f = tensoropt.frontier(model, devices, progress=False, **settings)
        return f, time.monotonic() - t0
    finally:
        mesh_search.solve_problem, pipeline.solve_problem = saved


def _covered(pts: np.ndarray, by: np.ndarray) -> np.ndarray:
    """Per point of ``pts``: whether a point of ``by`` is no slower and no larger."""
    return np.array([bool(((by[:, 0] <= t * (1 + 1e-12)) & (by[:, 1] <= m * (1 + 1e-12))).any()) for t, m in pts])


def run_case(model: str, devices: str, settings: dict) -> dict:
    peak, peak_s = _search(model, devices, settings, forward_end=False)
    old, old_s = _search(model, devices, settings, forward_end=True)
    a = np.array([(p.time_s, p.peak_memory_bytes) for p in peak.plans])
    b = np.array([(p.time_s, p.peak_memory_bytes) for p in old.plans])
    lo, hi = min(a[:, 1].min(), b[:, 1].min()), max(a[:, 1].max(), b[:, 1].max())
    budgets = np.geomspace(lo * 1.02, hi, 5)
    rows = []
    for budget in budgets:
        fast_a = a[a[:, 1] <= budget, 0].min() if (a[:, 1] <= budget).any() else None
        fast_b = b[b[:, 1] <= budget, 0].min() if (b[:, 1] <= budget).any() else None
        rows.append({"budget_bytes": float(budget), "peak_search_time_s": fast_a, "forward_end_time_s": fast_b,
                     "speedup": (fast_b / fast_a) if fast_a and fast_b else None})
    return {"model": model, "devices": devices, "settings": settings,
            "peak_search": {"plans": len(a), "search_s": round(peak_s, 2), "searches": peak.stats["peak_search"],
                            "min_peak_bytes": float(a[:, 1].min()), "min_time_s": float(a[:, 0].min())},
            "forward_end": {"plans": len(b), "search_s": round(old_s, 2),
                            "min_peak_bytes": float(b[:, 1].min()), "min_time_s": float(b[:, 0].min())},
            "plans_gained": int((~_covered(a, b)).sum()), "plans_lost": int((~_covered(b, a)).sum()),
            "fastest_under_budget": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one small case")
    ap.add_argument("--models", default="", help="comma-separated: only these models of the cases")
    ap.add_argument("--out", default=str(ROOT / "data" / "bench" / "peak_frontier.json"))
    args = ap.parse_args()
    results = []
    only = set(filter(None, args.models.split(",")))
    for model, devices, settings in (QUICK if args.quick else CASES):
        if only and model not in only:
            continue
        r = run_case(model, devices, settings)
        print(json.dumps({k: r[k] for k in ("model", "devices", "peak_search", "forward_end", "plans_gained",
                                            "plans_lost")}), flush=True)
        results.append(r)
    out = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                       "cpus": os.cpu_count(), "torch": torch.__version__},
           "date": datetime.date.today().isoformat(), "results": results}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
