"""Where a frontier search spends its time: capture, building the cost graphs and their
bounds, the peak models, solving (the FT engine and the peak searches) and, within it, the
Pareto-sum kernel; and the jobs that took longest.

    .venv/bin/python scripts/profile_search.py [--only llama3-8b:8x8xH100:2] [--workers 1,2]
        [--out data/bench/search_profile.json]

In one process (``workers`` 1, the default) the phases cover the whole search; they nest (a
job's solve holds its peak model and its kernel calls), so each is inclusive of what it
calls. With more workers the phases only count what the parent process does, and the
``timeline`` (in both) says when the parent's steps ran: the capture, the job builds in
workers (``fork_map``, with the recaptures it runs meanwhile), the solves (``run_jobs``) and
the reference plans. Wall-clock timers around the functions, not a profiler: the overhead is
a few calls per timed function. Every number is measured on the machine that runs it; the
JSON records it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

import tensoropt
import tensoropt.capture as capture
import tensoropt.fallback as fallback
import tensoropt.mesh_search as mesh_search
import tensoropt.peak_search as peak_search
import tensoropt.pipeline as pipeline
import tensoropt.planner as planner
import tensoropt.search as search
from tensoropt.engine import factors

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search import target_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = ["llama3-8b:8x8xH100:2", "llama3-8b:8x8xH100:3"]
# a Pareto sum with at least this many candidate pairs counts as large
LARGE = 1e8

_PATCHED: list = []          # (module, name, the function before): put back after each row


def _patch(module, name: str, f) -> None:
    _PATCHED.append((module, name, getattr(module, name)))
    setattr(module, name, f)


def _unpatch() -> None:
    while _PATCHED:
        module, name, f = _PATCHED.pop()
        setattr(module, name, f)


def _timed(module, name: str, key: str, spent: dict, calls: dict, on_result=None) -> None:
    f = getattr(module, name)

    def wrapped(*args, **kw):
        t = time.perf_counter()
        out = f(*args, **kw)
        dt = time.perf_counter() - t
        spent[key] += dt
        calls[key] += 1
        if on_result is not None:
            on_result(args, out, dt)
        return out
    _patch(module, name, wrapped)


def _on_timeline(timeline: list, start: float) -> None:
    """Record when the parent's steps ran, seconds from ``start``."""
    for name in ("capture_model", "run_jobs", "reference_plans"):
        _timed(search, name, name, defaultdict(float), defaultdict(int),
               lambda args, out, dt, name=name: timeline.append(
                   {"step": name, "end_s": time.perf_counter() - start, "s": dt}))
    fork_map = search.fork_map

    def timed_fork_map(calls, workers, done=None, meanwhile=None):
        t = time.perf_counter()
        def inner():
            t1 = time.perf_counter()
            meanwhile()
            timeline.append({"step": "recapture (meanwhile)", "end_s": time.perf_counter() - start,
                             "s": time.perf_counter() - t1})
        out = fork_map(calls, workers, done, meanwhile=None if meanwhile is None else inner)
        timeline.append({"step": f"build {len(calls)} calls", "end_s": time.perf_counter() - start,
                         "s": time.perf_counter() - t})
        return out
    _patch(search, "fork_map", timed_fork_map)


def profile(model: str, devices: str, dims: int, batch_size: int | None, workers: int) -> dict:
    spent: dict = defaultdict(float)
    calls: dict = defaultdict(int)
    jobs: list = []
    timeline: list = []

    def job_done(args, out, dt):
        found = out[0]
        jobs.append({"job": args[0].label, "s": dt, "points": None if found is None else len(found)})

    def kernel_done(args, out, dt):
        f_t, g_t = args[1], args[3]
        if f_t.shape[0] * f_t.shape[1] * f_t.shape[2] * g_t.shape[2] >= LARGE:
            spent["pareto_sum_large_s"] += dt
            calls["pareto_sum_large_s"] += 1

    _timed(capture, "capture_program", "capture_s", spent, calls)
    for module in (mesh_search, pipeline):
        _timed(module, "build_problem", "build_problem_s", spent, calls)
    _timed(planner, "lower_bound", "lower_bound_s", spent, calls)
    _timed(peak_search, "peak_model", "peak_model_s", spent, calls)
    _timed(peak_search, "solve", "ft_solve_s", spent, calls)
    _timed(peak_search, "solve_peak", "peak_solve_s", spent, calls)
    _timed(fallback, "solve_job", "jobs_s", spent, calls, job_done)
    _timed(factors, "_sum_prune_native", "pareto_sum_s", spent, calls, kernel_done)
    start = time.perf_counter()
    _on_timeline(timeline, start)
    try:
        if model.startswith("hf:"):          # a transformers target of bench_search, its own batch
            net, inputs = target_model(model)
            timeline.append({"step": "build model", "end_s": time.perf_counter() - start,
                             "s": time.perf_counter() - start})
            f = tensoropt.frontier(net, devices=devices, inputs=inputs, max_mesh_dims=dims, workers=workers,
                                   progress=False, memory_limit="4GiB")
        else:
            f = tensoropt.frontier(model, devices=devices, batch_size=batch_size, max_mesh_dims=dims,
                                   workers=workers, progress=False, memory_limit="4GiB")
    finally:
        _unpatch()
    wall = time.perf_counter() - start
    jobs.sort(key=lambda j: -j["s"])
    return {"model": model, "devices": devices, "max_mesh_dims": dims, "batch_size": batch_size,
            "workers": workers, "wall_s": wall, "timeline": timeline, "plans": len(f.plans),
            "phases_s": dict(spent), "calls": dict(calls),
            "jobs": len(jobs), "skipped": f.stats.get("skipped"), "set_aside": f.stats.get("set_aside"),
            "peak_search": f.stats.get("peak_search"), "slowest_jobs": jobs[:12]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(CASES), help="model:devices:max_mesh_dims, comma-separated; a model is a zoo name or "
                    "a transformers target of bench_search (hf:llama3-70b)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", default="1", help="worker counts, comma-separated: a row each")
    ap.add_argument("--out", default=str(ROOT / "data" / "bench" / "search_profile.json"))
    args = ap.parse_args()
    rows = []
    for case in args.only.split(","):
        model, devices, dims = (case.rsplit(":", 2) + ["", ""])[:3]
        if not dims.isdigit() or not devices:
            ap.error(f"--only takes model:devices:max_mesh_dims (e.g. hf:llama3-70b:64x8xH100:2), got {case!r}")
        for workers in map(int, args.workers.split(",")):
            row = profile(model, devices, int(dims), args.batch_size, workers)
            print(json.dumps({k: row[k] for k in ("model", "devices", "max_mesh_dims", "workers", "wall_s",
                                                  "phases_s", "timeline")}))
            rows.append(row)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    out = {"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                       "python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__},
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": commit, "command": f"python scripts/profile_search.py --only {args.only} --workers {args.workers}",
           "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
