#!/usr/bin/env python
"""Which of a search's jobs put plans on the final frontier, and what the others cost.

    .venv/bin/python scripts/job_yield.py [--model llama3-8b] [--devices 8x8xH100] [--dims 2]
        [--batch-size 16] [--out data/bench/job_yield.json]

Runs one frontier search in one process (``workers=1``, so every job's solve is timed where
it runs) and records per solved job: its solve seconds, the points it returned, how many of
them are plans of the final frontier, its lower bound (least time, least end-of-forward
memory) beside the least time and peak it found, and its *margin*: the least, over its points, of the
largest factor by which some frontier plan beats that point in both time and peak memory
(1.0 for a job with a plan on the frontier). A job with nothing on the frontier and a margin
well above 1 is work a tighter lower bound (``search_jobs``) could have skipped. Every number
is measured on the machine that runs it; the JSON records it.
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
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tensoropt  # noqa: E402
import tensoropt.fallback as fallback  # noqa: E402


def margin(points: list[tuple[float, float]], times: np.ndarray, peaks: np.ndarray) -> float:
    """Least over ``points`` of max over frontier plans at or below a point of
    min(t / plan time, m / plan peak)."""
    best = np.inf
    for t, m in points:
        below = (times <= t) & (peaks <= m)
        best = min(best, float(np.max(np.minimum(t / times[below], m / peaks[below]))) if below.any() else 1.0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--devices", default="8x8xH100")
    ap.add_argument("--dims", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "data" / "bench" / "job_yield.json"))
    args = ap.parse_args()

    solved: list[dict] = []
    solve_job = fallback.solve_job

    def timed(job, *a, **kw):
        t = time.perf_counter()
        out = solve_job(job, *a, **kw)
        solved.append({"job": job.label, "s": time.perf_counter() - t,
                       "points": [(c.time_s, c.peak_bytes) for c in (out[0] or [])],
                       "bound": (job.bound.time_min, job.bound.memory_min)})
        return out
    fallback.solve_job = timed
    t0 = time.perf_counter()
    f = tensoropt.frontier(args.model, devices=args.devices, max_mesh_dims=args.dims, batch_size=args.batch_size,
                           workers=1, progress=False, memory_limit="4GiB")
    wall = time.perf_counter() - t0
    fallback.solve_job = solve_job

    times = np.array([p.time_s for p in f.plans])
    peaks = np.array([p.peak_memory_bytes for p in f.plans])
    rows = []
    for r in solved:
        on = sum(bool(np.any(np.isclose(times, t, rtol=1e-12, atol=0) & np.isclose(peaks, m, rtol=1e-9, atol=0)))
                 for t, m in r["points"])
        rows.append({"job": r["job"], "solve_s": round(r["s"], 3), "points": len(r["points"]), "on_frontier": on,
                     "margin": round(margin(r["points"], times, peaks), 4) if r["points"] else None,
                     # the job's lower bound against what it found: least time, least memory
                     "bound": r["bound"], "found_min": [min((t for t, _ in r["points"]), default=None),
                                                        min((m for _, m in r["points"]), default=None)]})
    rows.sort(key=lambda r: -r["solve_s"])
    idle = [r for r in rows if not r["on_frontier"]]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    machine = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version()}
    doc = {"machine": machine,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
           "command": "python scripts/job_yield.py " + " ".join(sys.argv[1:]),
           "model": args.model, "devices": args.devices, "max_mesh_dims": args.dims, "batch_size": args.batch_size,
           "wall_s": round(wall, 1), "plans": len(f.plans), "jobs": f.stats.get("jobs"),
           "skipped": f.stats.get("skipped"), "solved": len(rows),
           "solve_s": round(sum(r["solve_s"] for r in rows), 1),
           "solve_s_of_jobs_off_the_frontier": round(sum(r["solve_s"] for r in idle), 1),
           "jobs_off_the_frontier": len(idle),
           "of_which_margin_above_1_05": sum(1 for r in idle if (r["margin"] or 1) > 1.05),
           "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"{doc['solved']} jobs solved in {doc['solve_s']} s; {len(idle)} put nothing on the frontier "
          f"({doc['solve_s_of_jobs_off_the_frontier']} s), {doc['of_which_margin_above_1_05']} of them beaten "
          f"by more than 5 % in both objectives; wrote {args.out}")


if __name__ == "__main__":
    main()
