#!/usr/bin/env python
"""Third-party model families end to end: capture, frontier, and plans run under torchrun.

    .venv/bin/python scripts/run_families.py                  # the conformance suite's families, 2 and 4 ranks
    .venv/bin/python scripts/run_families.py --extra          # families beyond the suite, 2 ranks
    .venv/bin/python scripts/run_families.py --families llama,t5 --worlds 2

For each family of ``tests/third_party/families.py`` (``FAMILIES``, or ``EXTRA`` with
``--extra``): the blocks capture finds, the operators it could not price, the frontier on
``cpu:N``, and plans picked along it (``families.spread``, six: the fastest, the least memory
and those adding the most operator layouts and settings, a pipeline plan among them; the
suite runs four; ``--ends``: the fastest, the first pipeline plan and the least memory)
saved and run by ``tests/dist_scripts/conformance_worker.py``: parity with single-process
training and measured peak memory against ``Plan.peak_memory_bytes``.
Writes ``data/families/<suite|extra>.json`` and prints the README's table rows.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import tensoropt  # noqa: E402
from tensoropt.capture import capture  # noqa: E402
from tensoropt.launch import run_cases  # noqa: E402
from tensoropt.search import unpriced_ops  # noqa: E402
from tests.third_party.families import BATCH, EXTRA, FAMILIES, MEMORY_TOL, TOL, spread  # noqa: E402

WORKER = os.path.join(ROOT, "tests", "dist_scripts", "conformance_worker.py")


def _ends(plans) -> list[int]:
    pick = {0, len(plans) - 1}
    pipes = [i for i, p in enumerate(plans) if p.stages]
    if pipes:
        pick.add(pipes[0])
    return sorted(pick)


def _explore(fam, worlds, picker, plan_dir) -> tuple[dict, dict[int, list[str]]]:
    out: dict = {"kind": fam.kind, "expected_blocks": fam.layers}
    cases: dict[int, list[str]] = {}
    try:
        graph = capture(fam.build("meta"), fam.inputs(BATCH, "meta"))
    except Exception as e:  # noqa: BLE001 - reported
        out["capture_error"] = f"{type(e).__name__}: {str(e)[:400]}"
        return out, cases
    out.update(blocks=len(graph.blocks), block_modules=list(graph.block_modules),
               unsupported=list(graph.unsupported), unpriced=unpriced_ops(graph))
    for world in worlds:
        try:
            f = tensoropt.frontier(fam.build("meta"), f"cpu:{world}", inputs=fam.inputs(BATCH, "meta"),
                                   progress=False)
        except Exception as e:  # noqa: BLE001 - reported
            out[f"frontier_error_{world}"] = f"{type(e).__name__}: {str(e)[:400]}"
            continue
        out[f"frontier_{world}"] = {"plans": len(f.plans), "pipeline_plans": sum(bool(p.stages) for p in f.plans)}
        d = os.path.join(plan_dir, str(world))
        os.makedirs(d, exist_ok=True)
        for k in picker(f.plans):
            f.plans[k].save(os.path.join(d, f"{fam.name}-{k}.json"))
            cases.setdefault(world, []).append(f"{fam.name}:{k}")
    return out, cases


def _verdict(res: dict) -> dict:
    if not res.get("ok"):
        return {"plan": res.get("plan"), "ok": False, "error": res.get("error", "")[:600]}
    parity = (not res["grad_missing"] and res["loss_rel"] < TOL and res["grad_max_rel"] < TOL
              and res["loss3_rel"] < TOL)
    mem = res["peak_bytes"] / res["predicted_peak_bytes"] - 1
    return {"plan": res["plan"], "ok": True, "stages": res["stages"], "parity": parity,
            "loss_rel": res["loss_rel"], "grad_max_rel": res["grad_max_rel"], "loss3_rel": res["loss3_rel"],
            "peak_bytes": res["peak_bytes"], "predicted_peak_bytes": res["predicted_peak_bytes"],
            "memory_error": round(mem, 4), "memory_within_10pct": abs(mem) < MEMORY_TOL}


def _row(name: str, r: dict, worlds) -> str:
    if "capture_error" in r:
        return f"| {name} | capture fails: {r['capture_error'][:120]} |"
    cells = [f"{r['blocks']} of {r['expected_blocks']}"]
    for w in worlds:
        runs = r.get(f"runs_{w}", {})
        if not runs:
            cells.append(r.get(f"frontier_error_{w}", "not run")[:80])
            continue
        par = sum(v.get("parity", False) for v in runs.values())
        mem = [v["memory_error"] for v in runs.values() if v.get("ok")]
        within = sum(abs(m) < MEMORY_TOL for m in mem)
        worst = max(mem, key=abs) if mem else float("nan")
        cells.append(f"{par}/{len(runs)} parity, {within}/{len(runs)} memory (worst {worst:+.0%})")
    return f"| {name} | " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--extra", action="store_true", help="the families beyond the suite (EXTRA)")
    ap.add_argument("--families", default="", help="comma-separated names (default: all of the set)")
    ap.add_argument("--worlds", default="", help="comma-separated rank counts (default 2,4; --extra: 2)")
    ap.add_argument("--ends", action="store_true", help="run the fastest, a pipeline and the least-memory plan "
                    "(default with --extra) instead of the suite's spread")
    ap.add_argument("--out", default="", help="output JSON (default data/families/<suite|extra>.json)")
    args = ap.parse_args()
    pool = EXTRA if args.extra else FAMILIES
    names = [n for n in args.families.split(",") if n] or list(pool)
    unknown = [n for n in names if n not in {**FAMILIES, **EXTRA}]
    if unknown:
        ap.error(f"unknown families {unknown}; known: {', '.join([*FAMILIES, *EXTRA])}")
    worlds = [int(w) for w in (args.worlds or ("2" if args.extra else "2,4")).split(",")]
    picker = _ends if (args.ends or args.extra) else spread
    out_path = args.out or os.path.join(ROOT, "data", "families", ("extra" if args.extra else "suite") + ".json")

    t0 = time.time()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as plan_dir:
        all_cases: dict[int, list[str]] = {}
        for name in names:
            results[name], cases = _explore({**FAMILIES, **EXTRA}[name], worlds, picker, plan_dir)
            for w, c in cases.items():
                all_cases.setdefault(w, []).extend(c)
            print(name, {k: v for k, v in results[name].items() if k not in ("unpriced", "block_modules")},
                  flush=True)
        for world, cases in all_cases.items():
            runs = run_cases(WORKER, cases, ["--plans", os.path.join(plan_dir, str(world))], nproc=world,
                             timeout=3000)
            for case, res in runs.items():
                name, k = case.split(":")
                results[name].setdefault(f"runs_{world}", {})[k] = _verdict(res)
    doc = {"date": _dt.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
           f"{platform.system()} (gloo, CPU)", "torch": torch.__version__,
           "transformers": __import__("transformers").__version__, "batch": BATCH, "worlds": worlds,
           "picked": "ends" if picker is _ends else "spread", "seconds": round(time.time() - t0, 1),
           "families": results}
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {out_path} ({doc['seconds']} s)")
    print("| family | blocks | " + " | ".join(f"{w} ranks" for w in worlds) + " |")
    for name, r in results.items():
        print(_row(name, r, worlds))


if __name__ == "__main__":
    main()
