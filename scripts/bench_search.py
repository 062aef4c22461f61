"""Frontier search on zoo models: search time, frontier size, the min-time plan's degrees, and
how far pipeline / recomputation / ZeRO push the memory end below operator sharding alone.

    .venv/bin/python scripts/bench_search.py [--quick] [--out data/bench/search.json]

Every number is measured on the machine that runs it; the JSON records that machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import tensoropt

ROOT = Path(__file__).resolve().parents[1]

# (model, devices, search settings). Large clusters are searched with 2-D meshes per stage and
# epsilon = 0.01 to bound the time; the settings are recorded with each result.
CASES = [
    ("gpt2", "8xA100-80GB", dict(max_mesh_dims=2)),
    ("bert-large", "8xA100-80GB", dict(max_mesh_dims=2, epsilon=0.01)),
    ("llama3-8b", "8xH100", dict(max_mesh_dims=2, epsilon=0.01)),
    ("resnet50", "8xA100-80GB", dict(max_mesh_dims=2, epsilon=0.01)),
    ("vgg16", "8xA100-80GB", dict(max_mesh_dims=2, epsilon=0.01)),
    ("gpt3-175b", "128x8xA100-80GB", dict(max_mesh_dims=2, epsilon=0.01)),        # coarse space (auto)
]
QUICK = [("gpt-tiny", "4xA100-80GB", dict(max_mesh_dims=2))]


def degrees(plan) -> dict:
    """Pipeline, data and tensor degrees from the plan's mesh and per-axis roles."""
    pp = plan.mesh_shape[0] if plan.stages else 1
    stage = plan.stages[0] if plan.stages else plan
    roles = stage.summary.split(" ")[0].split("·")
    dp = tp = other = 1
    for role, size in zip(roles, stage.mesh_shape):
        if role.startswith("dp"):
            dp *= size
        elif role.startswith("tp"):
            tp *= size
        elif not role.startswith("rep"):
            other *= size
    return {"pipeline": pp, "data": dp, "tensor": tp, "mixed": other, "microbatches": plan.microbatches,
            "zero_stage": plan.zero_stage, "recomputed_modules": len(plan.recompute)}


def point(plan) -> dict:
    return {"time_s": plan.time_s, "memory_bytes": plan.memory_bytes, "mesh": plan.mesh,
            "summary": plan.summary, "degrees": degrees(plan)}


def run_case(model: str, devices: str, settings: dict, time_limit_s: float, baseline: bool = True) -> dict:
    t0 = time.monotonic()
    full = tensoropt.frontier(model, devices, progress=False, time_limit_s=time_limit_s, **settings)
    full_s = time.monotonic() - t0
    if not baseline:
        return {"model": model, "devices": devices, "settings": settings, "search_s": full_s,
                "frontier_size": len(full), "meshes": full.stats["meshes"], "min_time": point(full.min_time()),
                "min_memory": point(full.min_memory()),
                "reference": {name: point(p) for name, p in full.reference.items()}}
    t0 = time.monotonic()
    ops_only = tensoropt.frontier(model, devices, progress=False, time_limit_s=time_limit_s, zero=False,
                                  recompute=False, pipeline=False, references=False, **settings)
    ops_s = time.monotonic() - t0
    return {
        "model": model, "devices": devices, "settings": settings,
        "search_s": full_s, "frontier_size": len(full), "meshes": full.stats["meshes"],
        "min_time": point(full.min_time()), "min_memory": point(full.min_memory()),
        "operator_sharding_only": {"search_s": ops_s, "frontier_size": len(ops_only),
                                   "min_memory_bytes": ops_only.min_memory().memory_bytes,
                                   "min_time_s": ops_only.min_time().time_s},
        "memory_reduction_vs_operator_sharding":
            1.0 - full.min_memory().memory_bytes / ops_only.min_memory().memory_bytes,
        "reference": {name: point(p) for name, p in full.reference.items()},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(ROOT / "data" / "bench" / "search.json"))
    ap.add_argument("--quick", action="store_true", help="one tiny case (for a smoke run)")
    ap.add_argument("--only", default=None, help="comma-separated model names")
    ap.add_argument("--time-limit", type=float, default=1800.0, help="per search, seconds")
    ap.add_argument("--no-baseline", action="store_true", help="skip the operator-sharding-only search")
    args = ap.parse_args(argv)
    cases = QUICK if args.quick else CASES
    if args.only:
        keep = set(args.only.split(","))
        cases = [c for c in cases if c[0] in keep]
    out = Path(args.out)
    results = json.loads(out.read_text())["results"] if out.exists() and args.only else []
    results = [r for r in results if not any(r["model"] == c[0] for c in cases)]
    for model, devices, settings in cases:
        print(f"{model} on {devices} {settings} ...", flush=True)
        try:
            r = run_case(model, devices, settings, args.time_limit, baseline=not args.no_baseline)
        except Exception as err:                      # recorded, not hidden
            r = {"model": model, "devices": devices, "settings": settings, "error": f"{type(err).__name__}: {err}"}
        print(json.dumps(r, indent=1)[:2000], flush=True)
        results.append(r)
        _write(out, results)
    return 0


def _write(out: Path, results: list) -> None:
    import numpy
    import torch

    doc = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                    "torch": torch.__version__, "numpy": numpy.__version__},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python scripts/bench_search.py",
        "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out)


if __name__ == "__main__":
    sys.exit(main())
