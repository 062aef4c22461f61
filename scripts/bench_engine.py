"""Benchmark the Frontier Tracking engine against one ILP solve on transformer-shaped graphs.

For each block count: the whole exact frontier (FT, epsilon=0) versus a single Alpa-style
ILP solve (``reference.ilp_min_time``) at one memory budget (the frontier's median memory)
on the same graph, plus an epsilon=0.01 run with its measured approximation error against
the exact frontier. Writes ``data/bench/engine.json``.

    .venv/bin/python scripts/bench_engine.py [--blocks 12 24 48 96] [--ilp-time-limit-s S]

Both wall-clock and process CPU seconds are recorded: on a shared machine the CPU seconds
are the steadier number (HiGHS and numpy here run single-threaded).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tensoropt.engine import solve  # noqa: E402
from tensoropt.engine.reference import ilp_min_time  # noqa: E402
from tensoropt.engine.synthetic import transformer_graph  # noqa: E402

K_RANGE = (8, 36)
ILP_MIN_LIMIT_S = 60.0
ILP_LIMIT_OVER_FT = 1.5


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def achieved_epsilon(approx: np.ndarray, exact: np.ndarray) -> float:
    """The smallest eps such that every exact point has an approx point within (1+eps) in both."""
    ratio = np.maximum(approx[None, :, 0] / exact[:, None, 0], approx[None, :, 1] / exact[:, None, 1])
    return float(max(ratio.min(axis=1).max() - 1.0, 0.0))


def bench_one(n_blocks: int, seed: int, ilp_limit_s: float | None, epsilon: float) -> dict:
    g = transformer_graph(n_blocks, k_range=K_RANGE, seed=seed)
    exact, ft_wall, ft_cpu = _timed(lambda: solve(g))
    mems = exact.points[:, 1]
    budget = float(np.median(mems))
    ft_best = float(exact.points[mems <= budget, 0].min())
    if ilp_limit_s is None:  # enough to tell: well past the FT time, capped in absolute terms
        ilp_limit_s = max(ILP_MIN_LIMIT_S, ILP_LIMIT_OVER_FT * ft_wall)

    def run_ilp():
        try:
            t, m, _ = ilp_min_time(g, budget, time_limit_s=ilp_limit_s)
            return t, m, True
        except TimeoutError:  # not even a feasible assignment within the limit
            return None, None, False

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (ilp_t, ilp_m, found), ilp_wall, ilp_cpu = _timed(run_ilp)
    hit_limit = not found or any("before proving optimality" in str(w.message) for w in caught)

    approx, eps_wall, eps_cpu = _timed(lambda: solve(g, epsilon=epsilon))
    row = {
        "n_blocks": n_blocks,
        "n_nodes": g.n_nodes,
        "configs_per_node": [int(min(g.n_configs)), int(max(g.n_configs))],
        "log10_assignments": float(sum(np.log10(g.n_configs))),
        "ft_exact": {
            "wall_s": ft_wall,
            "cpu_s": ft_cpu,
            "frontier_points": len(exact.points),
            "time_range": [float(exact.points[0, 0]), float(exact.points[-1, 0])],
            "memory_range": [float(mems[-1]), float(mems[0])],
        },
        "ilp_one_budget": {
            "memory_budget": budget,
            "wall_s": ilp_wall,
            "cpu_s": ilp_cpu,
            "time_limit_s": ilp_limit_s,
            "hit_time_limit": hit_limit,
            "found_feasible": found,
            "min_time": ilp_t,
            "memory": ilp_m,
            "ft_min_time_under_budget": ft_best,
            "agrees_with_ft": found and bool(abs(ilp_t - ft_best) <= 1e-6 * max(ft_best, 1.0)),
        },
        "ft_over_ilp_wall": ft_wall / ilp_wall,
        "ft_over_ilp_cpu": ft_cpu / ilp_cpu,
        "ft_epsilon": {
            "epsilon": epsilon,
            "wall_s": eps_wall,
            "cpu_s": eps_cpu,
            "frontier_points": len(approx.points),
            "measured_error": achieved_epsilon(approx.points, exact.points),
        },
    }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[12, 24, 48, 96])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ilp-time-limit-s", type=float, default=None,
        help=f"default: max({ILP_MIN_LIMIT_S:g} s, {ILP_LIMIT_OVER_FT:g} x the FT wall time on the same graph)",
    )
    parser.add_argument("--epsilon", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "data/bench/engine.json")
    args = parser.parse_args()

    started = dt.datetime.now(dt.timezone.utc)
    load_before = os.getloadavg()
    rows = []
    for n in args.blocks:
        row = bench_one(n, args.seed, args.ilp_time_limit_s, args.epsilon)
        rows.append(row)
        _write(args, started, load_before, rows)
        ft, ilp = row["ft_exact"], row["ilp_one_budget"]
        print(
            f"{n:3d} blocks: FT {ft['wall_s']:7.1f} s wall / {ft['cpu_s']:7.1f} s cpu, {ft['frontier_points']} points; "
            f"ILP {ilp['wall_s']:7.1f} s wall / {ilp['cpu_s']:7.1f} s cpu"
            f"{' (time limit' + ('' if ilp['found_feasible'] else ', no feasible point') + ')' if ilp['hit_time_limit'] else ''}; "
            f"ratio {row['ft_over_ilp_wall']:.3f} wall / {row['ft_over_ilp_cpu']:.3f} cpu; "
            f"eps={args.epsilon}: {row['ft_epsilon']['wall_s']:.1f} s, {row['ft_epsilon']['frontier_points']} points, "
            f"error {row['ft_epsilon']['measured_error']:.2e}",
            flush=True,
        )
    print(f"wrote {args.out}")


def _write(args, started, load_before, rows) -> None:
    report = {
        "what": "FT whole exact frontier vs one ILP solve (ilp_min_time at the frontier's median memory) "
        "on synthetic transformer graphs (tensoropt.engine.synthetic.transformer_graph)",
        "date_utc": started.isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
        },
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__},
        "settings": {
            "k_range": list(K_RANGE),
            "seed": args.seed,
            "ilp_time_limit_s": args.ilp_time_limit_s
            or f"max({ILP_MIN_LIMIT_S:g} s, {ILP_LIMIT_OVER_FT:g} x FT wall time); a hit limit makes ft_over_ilp an upper bound",
        },
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
