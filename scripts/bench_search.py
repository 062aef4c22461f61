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

# Cluster-scale targets (search time, peak RSS under 4 GiB): each row runs in its own process
# with memory_limit="4GiB", so a search that would pass it stops and says so in the row.
# LLaMA-3-8B at the global batch 16 (the zoo's default is 8), seq 8192; "hf:" rows
# are the transformers definition built on meta (``target_model``).
TARGETS = [
    ("llama3-8b", "8x8xH100", dict(max_mesh_dims=3, batch_size=16), 30),
    ("llama3-8b", "8x8xH100", dict(max_mesh_dims=2, batch_size=16), 30),
    ("hf:llama3-8b", "8x8xH100", dict(max_mesh_dims=3), 30),
    ("hf:llama3-8b", "8x8xH100", dict(max_mesh_dims=2), 30),
    ("resnet50", "8x8xA100-80GB", dict(max_mesh_dims=3), 30),
    ("gpt3-175b", "128x8xA100-80GB", dict(max_mesh_dims=2, coarse=False), 60),
    ("hf:llama3-70b", "64x8xH100", dict(max_mesh_dims=2), 120),
    ("hf:convnext-tiny", "8x8xA100-80GB", dict(max_mesh_dims=3), 30),
]
TARGET_MEMORY = "4GiB"


def target_model(name: str):
    """(model, inputs) for a target row: a zoo name as it is, or a transformers definition
    built on meta: ``hf:llama3-8b`` (LlamaForCausalLM at LLaMA-3-8B's sizes, batch 16 of 8192
    tokens), ``hf:llama3-70b`` (LLaMA-3-70B's sizes, batch 512 of 8192 tokens: 4 M tokens a
    step) or ``hf:convnext-tiny`` (ConvNextForImageClassification's default configuration,
    ConvNeXt-T, batch 256 of 224 x 224 images, as the zoo's ResNet-50)."""
    if not name.startswith("hf:"):
        return name, None
    import torch
    import transformers as T

    llama = {"hf:llama3-8b": (dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32), 16),
             "hf:llama3-70b": (dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                    num_attention_heads=64), 512)}
    if name in llama:
        sizes, batch = llama[name]
        cfg = T.LlamaConfig(vocab_size=128256, num_key_value_heads=8, max_position_embeddings=8192,
                            rope_theta=500000.0, tie_word_embeddings=False, **sizes)
        with torch.device("meta"):
            model = T.LlamaForCausalLM(cfg)
        ids = torch.zeros(batch, 8192, dtype=torch.long, device="meta")
        return model, {"input_ids": ids, "labels": ids}
    if name == "hf:convnext-tiny":
        with torch.device("meta"):
            model = T.ConvNextForImageClassification(T.ConvNextConfig(drop_path_rate=0.0))
        return model, {"pixel_values": torch.zeros(256, 3, 224, 224, device="meta"),
                       "labels": torch.zeros(256, dtype=torch.long, device="meta")}
    raise ValueError(f"unknown target model {name!r}")


def run_target(model: str, devices: str, settings: dict, time_limit_s: float, memory_limit: str = TARGET_MEMORY) -> dict:
    """One target row in a fresh process: its peak RSS is the search's own (model included);
    with worker processes, ``worker_peak_rss_bytes`` is the largest worker's (pages it shares
    with the parent counted) and ``pool_peak_resident_bytes`` what parent and workers held
    together at the search's memory checks (``search_pool``)."""
    import subprocess

    code = ("import json, resource, sys, time, tensoropt\n"
            f"sys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
            "from bench_search import target_model\n"
            "t0 = time.monotonic()\n"
            "try:\n"
            f"    model, inputs = target_model({model!r})\n"
            f"    f = tensoropt.frontier(model, {devices!r}, inputs=inputs, progress=False, time_limit_s={time_limit_s},"
            f" memory_limit={memory_limit!r}, **{settings!r})\n"
            "    r = {'plans': len(f), 'jobs': f.stats['jobs'], 'skipped': f.stats['skipped'],"
            " 'peak_search': f.stats['peak_search'], 'min_time': [f.min_time().time_s, f.min_time().summary],"
            " 'min_memory': [f.min_memory().peak_memory_bytes, f.min_memory().summary],"
            " 'search_space': f.stats['search_space'], 'workers': f.stats['workers'],"
            " 'pool_peak_resident_bytes': f.stats.get('peak_resident_bytes'),"
            " 'approximated': f.stats['approximated'], 'set_aside': f.stats.get('set_aside'),"
            " 'crowded_out': f.stats.get('crowded_out'), 'concurrency': f.stats.get('concurrency'),"
            " 'caption': f.caption()}\n"
            "except Exception as err:\n"
            "    r = {'error': f'{type(err).__name__}: {err}'}\n"
            "r['search_s'] = time.monotonic() - t0\n"
            "r['peak_rss_bytes'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024\n"
            "r['worker_peak_rss_bytes'] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024\n"
            "print('RESULT', json.dumps(r))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    r = json.loads(line[-1][7:]) if line else {"error": done.stderr[-2000:]}
    return {"model": model, "devices": devices, "settings": settings, "memory_limit": memory_limit, **r}


# Where a target row searches the coarse space (on by default above space.COARSE_ABOVE
# devices), the same model on 64-128 devices in both spaces: what the coarse one gives up.
SPACE_CHECKS = [("hf:llama3-70b", "8x8xH100", dict(max_mesh_dims=2))]


def space_check(model: str, devices: str, settings: dict, time_limit_s: float) -> dict:
    """The fine and the coarse frontier of one model: per fine plan, the least time of a
    coarse plan within its peak memory over its own time (1.0: nothing lost there)."""
    import numpy as np

    net, inputs = target_model(model)
    out = {"model": model, "devices": devices, "settings": settings}
    fronts = {}
    for coarse in (False, True):
        t0 = time.monotonic()
        key = "coarse" if coarse else "fine"
        try:
            f = tensoropt.frontier(net, devices, inputs=inputs, progress=False, time_limit_s=time_limit_s,
                                   coarse=coarse, **settings)
        except Exception as err:              # e.g. the fine space past its time limit: no comparison
            out[key] = {"search_s": time.monotonic() - t0, "error": f"{type(err).__name__}: {err}"}
            return out
        out[key] = {"search_s": time.monotonic() - t0, "plans": len(f), "search_space": f.stats["search_space"],
                    "approximated": f.stats["approximated"], "caption": f.caption()}
        fronts[key] = np.array([(p.time_s, p.peak_memory_bytes) for p in f.plans])
    fine, coarse = fronts["fine"], fronts["coarse"]
    ratios = []
    for t, m in fine:
        within = coarse[coarse[:, 1] <= m]
        ratios.append(float(within[:, 0].min() / t) if len(within) else float("inf"))
    ratios = np.array(ratios)
    out["fine_plans_matched"] = int((ratios <= 1.0 + 1e-9).sum())
    out["worst_time_ratio"] = float(ratios.max())
    out["median_time_ratio"] = float(np.median(ratios))
    out["fine_plans_below_coarse_least_memory"] = int(np.isinf(ratios).sum())
    return out


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
    return {"time_s": plan.time_s, "peak_memory_bytes": plan.peak_memory_bytes, "memory_bytes": plan.memory_bytes,
            "mesh": plan.mesh, "summary": plan.summary, "degrees": degrees(plan)}


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
                                   "min_peak_memory_bytes": ops_only.min_memory().peak_memory_bytes,
                                   "min_time_s": ops_only.min_time().time_s},
        "memory_reduction_vs_operator_sharding":
            1.0 - full.min_memory().peak_memory_bytes / ops_only.min_memory().peak_memory_bytes,
        "reference": {name: point(p) for name, p in full.reference.items()},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(ROOT / "data" / "bench" / "search.json"))
    ap.add_argument("--quick", action="store_true", help="one tiny case (for a smoke run)")
    ap.add_argument("--only", default=None, help="comma-separated model names")
    ap.add_argument("--time-limit", type=float, default=1800.0, help="per search, seconds")
    ap.add_argument("--no-baseline", action="store_true", help="skip the operator-sharding-only search")
    ap.add_argument("--targets", action="store_true", help="the cluster-scale target rows (key 'targets')")
    ap.add_argument("--space-checks", action="store_true",
                    help="fine against coarse space where both finish (key 'space_checks')")
    ap.add_argument("--memory-limit", default=TARGET_MEMORY,
                    help=f"the searches' memory cap for --targets (the targets' own: {TARGET_MEMORY}; another "
                         "cap is recorded as a row of its own)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.space_checks:
        checks = []
        for model, devices, settings in SPACE_CHECKS:
            print(f"{model} on {devices} {settings}, fine and coarse ...", flush=True)
            started = {"commit": _commit(), "date": _now()}      # what ran: the code as the check began
            checks.append({**space_check(model, devices, settings, args.time_limit), **started})
            print(json.dumps(checks[-1]), flush=True)
            doc = json.loads(out.read_text()) if out.exists() else {"results": [], "targets": []}
            doc["space_checks"] = checks
            out.write_text(json.dumps(doc, indent=1) + "\n")
        return 0
    if args.targets:
        doc = json.loads(out.read_text()) if out.exists() else {"results": []}
        rows = []
        for model, devices, settings, target_s in TARGETS:
            if args.only and model not in args.only.split(","):
                continue
            print(f"{model} on {devices} {settings} ...", flush=True)
            r = {**run_target(model, devices, settings, args.time_limit, args.memory_limit), "target_s": target_s,
                 "commit": _commit(), "date": _now()}
            print(json.dumps(r), flush=True)
            rows.append(r)
            done = {_key(x) for x in rows}
            _write(out, doc["results"], [*rows, *[t for t in doc.get("targets", []) if _key(t) not in done]])
        return 0
    cases = QUICK if args.quick else CASES
    if args.only:
        keep = set(args.only.split(","))
        cases = [c for c in cases if c[0] in keep]
    results = json.loads(out.read_text())["results"] if out.exists() and args.only else []
    results = [r for r in results if not any(r["model"] == c[0] for c in cases)]
    for model, devices, settings in cases:
        print(f"{model} on {devices} {settings} ...", flush=True)
        try:
            r = run_case(model, devices, settings, args.time_limit, baseline=not args.no_baseline)
        except Exception as err:                      # recorded, not hidden
            r = {"model": model, "devices": devices, "settings": settings, "error": f"{type(err).__name__}: {err}"}
        r["commit"] = _commit()
        print(json.dumps(r, indent=1)[:2000], flush=True)
        results.append(r)
        _write(out, results, json.loads(out.read_text()).get("targets", []) if out.exists() else [])
    return 0


def _key(row: dict) -> tuple:
    return row["model"], row["devices"], json.dumps(row["settings"], sort_keys=True), row.get("memory_limit")


def _commit() -> str | None:
    """The checked-out commit (with "+changes" where the code, ``tensoropt/`` or ``scripts/``,
    differs from it; the data this script writes does not count), None outside git."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "tensoropt", "scripts"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if dirty else "")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _write(out: Path, results: list, targets: list) -> None:
    import numpy
    import torch

    doc = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                    "torch": torch.__version__, "numpy": numpy.__version__},
        "date": _now(),
        "command": "python scripts/bench_search.py",
        "results": results,
        "targets": targets,
    }
    if out.exists():                     # kept from the file: rows this run does not write
        doc.update({k: v for k, v in json.loads(out.read_text()).items() if k == "space_checks"})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out)


if __name__ == "__main__":
    sys.exit(main())
