#!/usr/bin/env python
"""Hold the GPU cost model against real training steps on one GPU.

    .venv/bin/python scripts/validate_device.py plans            # here: the plans, priced for 1 x H100
    python3 scripts/validate_device.py run --out DIR             # on the GPU: measure every plan
    .venv/bin/python scripts/validate_device.py report --measured DIR/measured.json [--profile P]

``plans`` prices every case of ``tensoropt.validate.device_cases`` with each of its
recomputation settings (``plan_for``, bf16 mixed precision, Adam) on ``--devices`` and saves
the plans under ``--dir`` (default data/validation/h100). ``run`` builds each model on the
GPU, recomputes what its plan recomputes and trains it as the plan is priced
(``tensoropt.validate.device_step``), writing measured step times and peak memory.
``report`` compares them with the predictions of the datasheet model and, with
``--profile``, of a measured profile; it writes report.json and a plot beside the plans.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import sys
import traceback

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

DEFAULT_DIR = os.path.join(ROOT, "data", "validation", "h100")


def _plan_path(directory: str, case: str, policy: str) -> str:
    return os.path.join(directory, "plans", f"{case}_{policy}.json")


def cmd_plans(args) -> int:
    from tensoropt import plan_for
    from tensoropt.validate.device_cases import CASES, get_case

    names = args.cases or list(CASES)
    os.makedirs(os.path.join(args.dir, "plans"), exist_ok=True)
    for name in names:
        case = get_case(name)
        model = case.build("meta")
        inputs = case.inputs("meta")
        for policy in case.policies:
            plan = plan_for(model, args.devices, inputs=inputs, recompute=policy, precision="bf16-mixed",
                            label=f"{name} rc:{policy}")
            plan.save(_plan_path(args.dir, name, policy))
            print(f"{name:12s} {policy:5s} {plan.time_s * 1e3:8.1f} ms {plan.peak_memory_bytes / 2 ** 30:7.2f} GiB "
                  f"{plan.summary}", flush=True)
    return 0


def cmd_run_isolated(args) -> int:
    """Every (case, policy) in a process of its own, rows merged into one measured.json: what
    one case leaves allocated pins segments of the caching allocator, so only a fresh process's
    reserved peak is the case's own."""
    import subprocess
    import tempfile

    from tensoropt.validate.device_cases import CASES, get_case

    os.makedirs(args.out, exist_ok=True)
    out_path = os.path.join(args.out, "measured.json")
    machine, rows, rc = None, [], 0
    for name in args.cases or list(CASES):
        for policy in get_case(name).policies:
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [sys.executable, os.path.abspath(__file__), "run", "--cases", name, "--policies", policy,
                       "--dir", args.dir, "--out", tmp, "--device", args.device,
                       "--steps", str(args.steps), "--warmup", str(args.warmup)]
                rc |= subprocess.run(cmd).returncode
                try:
                    got = json.load(open(os.path.join(tmp, "measured.json")))
                except (OSError, ValueError):
                    rows.append({"case": name, "policy": policy, "ok": False, "error": "the process wrote no row"})
                    continue
            machine = got["machine"] | {"isolated": True}
            rows += got["rows"]
            with open(out_path, "w") as f:
                json.dump({"machine": machine, "rows": rows}, f, indent=1)
    return rc


def cmd_run(args) -> int:
    if args.isolate:
        return cmd_run_isolated(args)
    import torch

    from tensoropt.plan import Plan
    from tensoropt.validate.device_cases import CASES, get_case
    from tensoropt.validate.device_step import measure_step, recompute_as_planned

    device = args.device
    names = args.cases or list(CASES)
    os.makedirs(args.out, exist_ok=True)
    out_path = os.path.join(args.out, "measured.json")
    info = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "python": sys.version.split()[0], "platform": platform.platform(),
            "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "steps": args.steps, "warmup": args.warmup}
    rows = []
    for name in names:
        case = get_case(name)
        for policy in case.policies:
            if args.policies and policy not in args.policies:
                continue
            path = _plan_path(args.dir, name, policy)
            row = {"case": name, "policy": policy, "plan_file": os.path.relpath(path, ROOT)}
            model = None
            try:
                plan = Plan.load(path)
                if device == "cuda":
                    row["allocated_before_bytes"] = torch.cuda.memory_allocated()
                    # segments earlier cases' leftovers pin stay reserved: the case's own reserved peak is above these
                    row["reserved_before_bytes"] = torch.cuda.memory_reserved()
                model = case.build(device)
                row["recomputed"] = len(recompute_as_planned(model, plan))
                row.update(measure_step(model, case.inputs(device), steps=args.steps, warmup=args.warmup))
                row["ok"] = True
            except Exception as err:      # one case's failure is recorded, the others still run
                row.update(ok=False, error=f"{type(err).__name__}: {err}", trace=traceback.format_exc()[-2000:])
            finally:
                # a checkpointed module's forward refers to the module: only the collector frees it,
                # and what it holds would count in the next case's peak
                model = None
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
            rows.append(row)
            brief = (f"{row['step_s'] * 1e3:8.1f} ms {row['peak_bytes'] / 2 ** 30:7.2f} GiB"
                     if row["ok"] else row["error"][:200])
            print(f"{name:12s} {policy:5s} {brief}", flush=True)
            with open(out_path, "w") as f:
                json.dump({"machine": info, "rows": rows}, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


FIT_TERMS = ("matmul_scale", "other_compute_scale", "optimizer_s_per_param", "fixed_s")
PUBLISHED_TERMS = os.path.join(ROOT, "data", "validation", "gpu_terms_h100.json")


def _summary(pred, meas) -> dict:
    from tensoropt.validate.report import median_abs_rel_error, rel_errors, spearman

    errs = [float(e) for e in rel_errors(pred, meas)]
    return {"pairs": len(errs), "median_abs_rel_error": median_abs_rel_error(pred, meas),
            "max_abs_rel_error": max(abs(e) for e in errs),
            "median_rel_error": float(sorted(errs)[len(errs) // 2]),
            "spearman": spearman(pred, meas) if len(errs) > 2 else None}


def _own_reserved(row: dict) -> int | None:
    """What the case itself reserved: its reserved peak above what was reserved before its
    model was built. Runs that did not record that (before 2026-11-26) count only where
    nothing was held before: earlier cases' leftover tensors pin whole segments."""
    if "peak_reserved_bytes" not in row:
        return None
    if "reserved_before_bytes" in row:
        return row["peak_reserved_bytes"] - row["reserved_before_bytes"]
    return row["peak_reserved_bytes"] if row.get("allocated_before_bytes", 0) == 0 else None


def cmd_report(args) -> int:
    from tensoropt.allocator import reserved_bytes
    from tensoropt.capture.recapture import capture_model
    from tensoropt.mesh import parse_devices
    from tensoropt.cost_terms import CostTerms
    from tensoropt.plan import Plan
    from tensoropt.validate.device_cases import get_case
    from tensoropt.validate.fit import fit_calibration, step_features

    measured = json.load(open(args.measured))
    rows = [r for r in measured["rows"] if r.get("ok")]
    published = CostTerms.load(PUBLISHED_TERMS)
    out, graphs = [], {}
    for r in rows:
        plan = Plan.load(os.path.join(ROOT, r["plan_file"]))
        if r["case"] not in graphs:
            case = get_case(r["case"])
            graphs[r["case"]] = capture_model(case.build("meta"), case.inputs("meta"), None)[0]
        graph = graphs[r["case"]]
        feats = step_features(plan, graph)
        # what the case itself allocated: the step's peak above what was held before the model was built
        peak = r["peak_bytes"] - r.get("allocated_before_bytes", 0)
        row = {"case": r["case"], "policy": r["policy"], "summary": plan.summary,
               "measured_step_s": r["step_s"], "measured_forward_backward_s": r["forward_backward_s"],
               "measured_optimizer_s": r["optimizer_s"], "measured_kernel_s": r.get("kernel_s"),
               "measured_peak_bytes": peak, "measured_tensor_peak_bytes": r.get("tensor_peak_bytes"),
               "measured_tensor_peak_by_category": r.get("tensor_peak_by_category"),
               "predicted_step_s": plan.time_s, "predicted_peak_bytes": plan.peak_memory_bytes,
               "measured_reserved_bytes": _own_reserved(r),
               "predicted_reserved_bytes": reserved_bytes(plan.peak_memory_bytes, parse_devices(plan.devices).device),
               "predicted_breakdown": {k: float(v) for k, v in plan.breakdown.items()},
               "published_terms_step_s": float(published.predict(feats)), "features": feats}
        if args.profile:
            row["profiled_step_s"] = float(CostTerms().predict(step_features(plan, graph, args.profile)))
        out.append(row)
        print(f"{row['case']:12s} {row['policy']:5s} time {row['measured_step_s'] * 1e3:6.1f} ms measured "
              f"(GPU busy {row['measured_kernel_s'] * 1e3:6.1f}), {row['predicted_step_s'] * 1e3:6.1f} datasheet, "
              f"{row['published_terms_step_s'] * 1e3:6.1f} published terms"
              + (f", {row['profiled_step_s'] * 1e3:6.1f} profiled" if args.profile else "")
              + f"; peak {peak / 2 ** 30:6.2f} GiB measured, {row['predicted_peak_bytes'] / 2 ** 30:6.2f} predicted "
              f"({row['predicted_peak_bytes'] / peak - 1:+.1%})", flush=True)

    # held out by model: each case's pairs are predicted by terms fitted on the other cases
    cases = list(dict.fromkeys(o["case"] for o in out))
    for case in cases:
        train = [o for o in out if o["case"] != case]
        terms = fit_calibration([o["features"] for o in train], [o["measured_step_s"] for o in train], FIT_TERMS)
        for o in out:
            if o["case"] == case:
                o["held_out_step_s"] = float(terms.predict(o["features"]))
    fitted = fit_calibration([o["features"] for o in out], [o["measured_step_s"] for o in out], FIT_TERMS)
    fitted = CostTerms(**{**fitted.terms(), "fitted": fitted.fitted,
                          "meta": {"fitted_on": [f"{o['case']}:{o['policy']}" for o in out],
                                   "measured": os.path.relpath(args.measured, ROOT),
                                   "machine": measured["machine"].get("device", "")}})
    fitted.save(os.path.join(args.dir, "terms_1gpu.json"))

    meas_t = [o["measured_step_s"] for o in out]
    clean = [o for o in out if o["measured_reserved_bytes"] is not None]
    report = {"machine": measured["machine"], "measured_file": os.path.relpath(args.measured, ROOT),
              "step_time": {"datasheet": _summary([o["predicted_step_s"] for o in out], meas_t),
                            "published_terms": _summary([o["published_terms_step_s"] for o in out], meas_t),
                            "held_out_by_model": _summary([o["held_out_step_s"] for o in out], meas_t)},
              "datasheet_vs_gpu_busy": _summary([o["predicted_step_s"] for o in out],
                                                [o["measured_kernel_s"] for o in out]),
              "peak_memory": _summary([o["predicted_peak_bytes"] for o in out], [o["measured_peak_bytes"] for o in out]),
              "reserved_memory": _summary([o["predicted_reserved_bytes"] for o in clean],
                                          [o["measured_reserved_bytes"] for o in clean]) if clean else None,
              "fitted_terms": {t: getattr(fitted, t) for t in FIT_TERMS},
              "rows": out, "failed": [r for r in measured["rows"] if not r.get("ok")]}
    if args.profile:
        report["profile"] = os.path.relpath(args.profile, ROOT)
        report["step_time"]["profiled"] = _summary([o["profiled_step_s"] for o in out], meas_t)
    with open(os.path.join(args.dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    for key, s in [*report["step_time"].items(), ("datasheet_vs_gpu_busy", report["datasheet_vs_gpu_busy"]),
                   ("peak_memory", report["peak_memory"])] + ([("reserved_memory", report["reserved_memory"])]
                                                                 if clean else []):
        print(f"{key:22s} median |error| {s['median_abs_rel_error']:6.1%} (median {s['median_rel_error']:+.1%}), "
              f"worst {s['max_abs_rel_error']:6.1%}, Spearman {s['spearman'] if s['spearman'] is None else round(s['spearman'], 2)} "
              f"({s['pairs']} pairs)")
    print("fitted on every pair:", {t: f"{getattr(fitted, t):.3g}" for t in FIT_TERMS})
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plans")
    p.add_argument("--devices", default="1xH100")
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--device", default="cuda")
    r.add_argument("--steps", type=int, default=10)
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--policies", nargs="*", default=None, help="only these recomputation policies")
    r.add_argument("--isolate", action="store_true", help="every plan in a fresh process (clean reserved peaks)")
    rep = sub.add_parser("report")
    rep.add_argument("--measured", required=True)
    rep.add_argument("--profile", default=None)
    for q in (p, r, rep):
        q.add_argument("--dir", default=DEFAULT_DIR)
        q.add_argument("--cases", nargs="*", default=None)
    args = ap.parse_args(argv)
    return {"plans": cmd_plans, "run": cmd_run, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
