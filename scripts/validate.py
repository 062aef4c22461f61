#!/usr/bin/env python
"""Validate the cost model against real training steps; fit whole-step calibration terms.

    .venv/bin/python scripts/validate.py                       # world size 2, all models
    .venv/bin/python scripts/validate.py --world 2,4 --steps 12
    .venv/bin/python scripts/validate.py --refit               # re-analyse data/validation/report.json

For each validation model (``tensoropt.validate.cases.MODELS``) and world size: the frontier
over ``cpu:N`` priced with the measured profile, its min-time / min-memory / middle points
(with and without ZeRO/recomputation in the search) and the reference plans, each run for
real by the torchrun worker (``tensoropt/validate/worker.py``: median step time of the
slowest rank, MemTracker peak memory per rank). Then the whole-step calibration
(``tensoropt.validate.fit``) is fitted on a training half of the pairs and evaluated on the
other half (per model alternate pairs, by predicted time), with cumulative and drop-one
ablations of every term; the terms refitted on all pairs go to ``step_calibration.json``.

Outputs (``--out``, default data/validation): report.json, predicted_vs_measured.png,
step_calibration.json, plans/<model>_w<N>_<i>.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import platform
import shlex
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from tensoropt.validate.fit import TERMS, CostTerms, fit_calibration  # noqa: E402
from tensoropt.validate.report import plot_predicted_vs_measured, rel_errors, summarize  # noqa: E402

ABLATION_ORDER = ("fixed_s", "matmul_scale", "other_compute_scale", "per_collective_s", "per_dtensor_op_s",
                  "per_param_tensor_s", "per_dtensor_param_s", "per_sharded_op_s", "optimizer_s_per_param",
                  "grad_comm_scale", "relayout_scale", "framework_scale", "update_scale")
DEFAULT_TERMS = ("fixed_s", "matmul_scale", "other_compute_scale", "per_collective_s", "per_sharded_op_s",
                 "per_dtensor_op_s", "per_param_tensor_s", "per_dtensor_param_s")
NOTES = [
    "Wall times come from a 2-core machine; the 1-minute load average while timing is recorded in "
    "overall.*.loadavg_1min_during_timing (other jobs on the machine inflate wall time over process CPU "
    "time, and the wall-time compute_scale absorbs that contention). The CPU-time metric "
    "(calibration_cpu_time) is far less sensitive to it but excludes time spent waiting in collectives.",
    "Predicted memory is Plan.peak_memory_bytes: resident state and saved activations, the backward "
    "pass's rise above them (planner.transient_bytes: gradients in flight, fresh parameter gradients, "
    "FSDP2 replicate's parameter copy and unreduced gradients, layout moves' buffers) and the input batch "
    "every rank is handed. The memory_calibration terms predate these and no longer improve held-out pairs.",
    "Split: per (model, world), pairs sorted by predicted time alternate train/test; the calibration is fitted "
    "on train and evaluated on test ('calibrated.test'); step_calibration.json is refitted on all pairs.",
    "Features are the plan's time under each cost term alone (tensoropt.calibration.step_features), the "
    "terms the search prices every node and edge with: collective_calls counts the calls of layout moves, "
    "of model-parallel operators and, under ZeRO-2/3 on the DTensor runner, of every parameter (a grouped "
    "gradient reduction, FSDP2's or the DTensor runner's buckets, counts its share of one call; fixed_s "
    "absorbs the rest), sharded_ops the operators that split something besides the batch, dtensor_ops the "
    "operators the DTensor runner runs one by one (every operator of a plan FSDP2 does not run), "
    "param_tensors the parameter tensors a device holds (DTensors under FSDP2 and on the DTensor runner "
    "alike), dtensor_params those the DTensor runner holds, framework_s and update_s what the measured "
    "profile prices per operator besides its kernels and for the optimizer's update "
    "(ComputeModel.op_overhead_s, update_s_per_param). "
    "'earlier_run_calibration' evaluates terms fitted on an earlier run on this run's pairs.",
    "Pipeline plans (pp...) are skipped: tensoropt.parallelize does not lay them out (PlanNotApplicable).",
    "Memory: MemTracker categories at the step's peak are compared with the predicted breakdown per pair "
    "(memory_by_category); memory_resident_error_rank0 is a diagnostic over the priced categories only.",
]


def measure(args) -> tuple[list[dict], list[dict]]:
    from tensoropt.launch import run_torchrun
    from tensoropt.validate.cases import capture_graph, select_plans
    from tensoropt.validate.fit import step_features

    plan_dir = os.path.join(args.out, "plans")
    os.makedirs(plan_dir, exist_ok=True)
    pairs, skipped = [], []
    worker = os.path.join(ROOT, "tensoropt", "validate", "worker.py")
    for world in args.world:
        for key in args.models:
            t0 = time.monotonic()
            cands = select_plans(key, world, args.profile, max_plans=args.max_plans)
            graph = capture_graph(key)
            files, meta = [], {}
            for i, c in enumerate(cands):
                if not c.applicable:
                    skipped.append({"model": key, "world": world, "role": c.role, "plan": c.plan.summary,
                                    "predicted_time_s": c.plan.time_s,
                                    "predicted_memory_bytes": c.plan.peak_memory_bytes, "reason": c.reason})
                    continue
                path = os.path.join(plan_dir, f"{key}_w{world}_{i}.json")
                c.plan.save(path)
                files.append(path)
                meta[os.path.basename(path)] = (c, step_features(c.plan, graph, args.profile))
            print(f"[validate] {key} world {world}: {len(files)} plans "
                  f"({len(cands) - len(files)} not applicable), running ...", flush=True)
            res = run_torchrun(worker, ["--model", key, "--plans", ",".join(files), "--steps", str(args.steps),
                                        "--warmup", str(args.warmup)], nproc=world, timeout=args.timeout)
            if not res.ok:
                print(res.summary(), file=sys.stderr)
            got = {r["plan_file"]: r for r in res.results}
            for f in files:
                base = os.path.basename(f)
                c, feats = meta[base]
                r = got.get(base)
                if r is None or not r.get("ok"):
                    skipped.append({"model": key, "world": world, "role": c.role, "plan": c.plan.summary,
                                    "reason": (r or {}).get("error", "worker failed: " + res.summary(800))})
                    continue
                pairs.append({
                    "model": key, "zoo": c.plan.model, "world": world, "role": c.role, "plan": c.plan.summary,
                    "label": c.plan.label, "mesh": list(c.plan.mesh_shape), "zero_stage": c.plan.zero_stage,
                    "recompute": list(c.plan.recompute), "apply_mode": r.get("mode"), "plan_file": f"plans/{base}",
                    "predicted_time_s": c.plan.time_s, "predicted_breakdown": c.plan.breakdown,
                    "predicted_memory_bytes": c.plan.peak_memory_bytes,
                    "predicted_resident_bytes": c.plan.memory_bytes,
                    "measured_time_s": r["time_median_s"], "measured_time_q25_s": r["time_q25_s"],
                    "measured_time_q75_s": r["time_q75_s"], "measured_time_min_s": r["time_min_s"],
                    "measured_time_max_s": r["time_max_s"], "step_times_s": r["step_times_s"],
                    "measured_cpu_time_s": r["cpu_time_median_s"], "measured_cpu_time_q25_s": r["cpu_time_q25_s"],
                    "measured_cpu_time_q75_s": r["cpu_time_q75_s"], "step_cpu_times_s": r["cpu_times_s"],
                    "loadavg_1min": r["loadavg_1min"],
                    "measured_memory_bytes": r["peak_bytes"], "measured_memory_fwd_bwd_bytes": r["peak_fwd_bwd_bytes"],
                    "measured_memory_by_category_rank0": r["peak_by_category_rank0"],
                    "measured_collectives": r["collectives"], "measured_collective_calls": r["collective_calls"],
                    "features": feats, "loss_first": r["loss_first"], "loss_last": r["loss_last"],
                })
            print(f"[validate] {key} world {world}: done in {time.monotonic() - t0:.0f} s", flush=True)
    return pairs, skipped


def split(pairs: list[dict]) -> None:
    """Per (model, world): sort by predicted time, alternate train / test (train first)."""
    groups: dict = {}
    for p in pairs:
        groups.setdefault((p["model"], p["world"]), []).append(p)
    for g in groups.values():
        for i, p in enumerate(sorted(g, key=lambda q: q["predicted_time_s"])):
            p["split"] = "train" if i % 2 == 0 else "test"


METRICS = {"wall": "measured_time_s", "cpu": "measured_cpu_time_s"}


def evaluate(cal: CostTerms, pairs: list[dict], key: str = "measured_time_s") -> dict:
    if not pairs:
        return {"n": 0}
    pred = cal.predict([p["features"] for p in pairs])
    meas = [p[key] for p in pairs]
    return summarize(pred, meas)


def analyse(pairs: list[dict], terms: tuple[str, ...], metric: str = "wall") -> dict:
    """Fit on the train split, evaluate on the test split, ablations; ``metric``: wall or cpu."""
    key = METRICS[metric]
    split(pairs)
    train = [p for p in pairs if p["split"] == "train"]
    test = [p for p in pairs if p["split"] == "test"]
    y_train = [p[key] for p in train]

    def ev(cal, ps):
        return evaluate(cal, ps, key)

    raw = CostTerms()
    out: dict = {"metric": metric, "measured": key, "terms": list(terms), "train_pairs": len(train), "test_pairs": len(test),
                 "uncalibrated": {"train": ev(raw, train), "test": ev(raw, test),
                                  "all": ev(raw, pairs)}}
    cumulative, used = [], []
    for t in ABLATION_ORDER:          # every term, in order, whether or not it is in ``terms``
        used.append(t)
        cal = fit_calibration([p["features"] for p in train], y_train, used)
        cumulative.append({"terms": list(used), "added": t, "fitted": cal.terms(),
                           "train": ev(cal, train), "test": ev(cal, test)})
    out["cumulative"] = cumulative
    full = fit_calibration([p["features"] for p in train], y_train, terms)
    out["fit_on_train"] = full.terms()
    out["calibrated"] = {"train": ev(full, train), "test": ev(full, test), "all": ev(full, pairs)}
    drop = []
    for t in terms:
        rest = [u for u in terms if u != t]
        cal = fit_calibration([p["features"] for p in train], y_train, rest)
        e = ev(cal, test)
        drop.append({"dropped": t, "test": e,
                     "test_median_error_change": e.get("median_abs_time_error", float("nan"))
                     - out["calibrated"]["test"].get("median_abs_time_error", float("nan"))})
    out["drop_one"] = drop
    suffix = "" if metric == "wall" else f"_{metric}"
    for p in pairs:
        p[f"calibrated{suffix}_time_s"] = full.predict(p["features"])
        p[f"calibrated{suffix}_time_error"] = (p[f"calibrated{suffix}_time_s"] - p[key]) / p[key]
    all_fit = fit_calibration([p["features"] for p in pairs], [p[key] for p in pairs], terms)
    out["fit_on_all"] = all_fit.terms()
    return out, all_fit


def analyse_memory(pairs: list[dict], out_dir: str) -> dict:
    """Whole-step memory terms (``fit.MemoryCalibration``) on the same train/test split."""
    from tensoropt.plan import Plan
    from tensoropt.validate.cases import capture_graph
    from tensoropt.validate.fit import MEMORY_TERMS, MemoryCalibration, fit_memory_calibration, memory_features

    graphs: dict = {}
    for p in pairs:
        if p["model"] not in graphs:
            graphs[p["model"]] = capture_graph(p["model"])
        plan = Plan.load(os.path.join(out_dir, p["plan_file"]))
        p["memory_features"] = memory_features(plan, graphs[p["model"]], p.get("apply_mode"))
    key = "measured_memory_bytes"
    train = [p for p in pairs if p["split"] == "train"]
    test = [p for p in pairs if p["split"] == "test"]

    def ev(cal, ps):
        if not ps:
            return {"n": 0}
        s = summarize([cal.predict(p["memory_features"]) for p in ps], [p[key] for p in ps])
        return {k.replace("time", "memory"): v for k, v in s.items()}

    raw = MemoryCalibration()
    out = {"terms": list(MEMORY_TERMS), "uncalibrated": {"train": ev(raw, train), "test": ev(raw, test)},
           "cumulative": []}
    used = []
    for t in MEMORY_TERMS:
        used.append(t)
        cal = fit_memory_calibration([p["memory_features"] for p in train], [p[key] for p in train], used)
        out["cumulative"].append({"added": t, "fitted": cal.terms(), "train": ev(cal, train), "test": ev(cal, test)})
    full = fit_memory_calibration([p["memory_features"] for p in train], [p[key] for p in train])
    out["fit_on_train"] = full.terms()
    out["calibrated"] = {"train": ev(full, train), "test": ev(full, test), "all": ev(full, pairs)}
    for p in pairs:
        p["calibrated_memory_bytes"] = full.predict(p["memory_features"])
        p["calibrated_memory_error"] = (p["calibrated_memory_bytes"] - p[key]) / p[key]
    all_fit = fit_memory_calibration([p["memory_features"] for p in pairs], [p[key] for p in pairs])
    out["fit_on_all"] = all_fit.terms()
    with open(os.path.join(out_dir, "memory_calibration.json"), "w") as f:
        json.dump({"format": "tensoropt.memory_calibration/1", **all_fit.terms(),
                   "formula": "peak = predicted_memory_bytes + temp_factor*max_local_tensor_bytes"
                              " + replicate_param_copies*replicate_param_bytes (tensoropt.validate.fit;"
                              " predicted_memory_bytes is Plan.peak_memory_bytes)",
                   "fitted_on_pairs": len(pairs)}, f, indent=1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,gpt,llama,cnn,gpt-wide")
    ap.add_argument("--world", default="2", help="comma-separated world sizes")
    ap.add_argument("--profile", default="data/profiles/cpu-2core.json")
    ap.add_argument("--steps", type=int, default=40,
                    help="timed steps per plan (per-step spread on a shared 2-core machine is 10-30 %%)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-plans", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--terms", default=",".join(DEFAULT_TERMS),
                    help=f"calibration terms to fit (of {','.join(TERMS)})")
    ap.add_argument("--out", default="data/validation")
    ap.add_argument("--refit", action="store_true", help="reuse the measurements in OUT/report.json")
    ap.add_argument("--calibration", default=None,
                    help="also evaluate this step_calibration.json (fitted on an earlier run) on every pair")
    args = ap.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    args.world = [int(w) for w in args.world.split(",") if w]
    terms = tuple(t for t in args.terms.split(",") if t)
    os.makedirs(args.out, exist_ok=True)
    report_path = os.path.join(args.out, "report.json")
    t0 = time.monotonic()
    if args.refit:
        with open(report_path) as f:
            old = json.load(f)
        pairs, skipped, measured_by = old["pairs"], old["skipped"], old.get("measured_by", {})
        from tensoropt.plan import Plan
        from tensoropt.validate.cases import capture_graph
        from tensoropt.validate.fit import step_features

        graphs: dict = {}
        for p in pairs:          # features from the saved plans (the feature definitions may have changed)
            if p["model"] not in graphs:
                graphs[p["model"]] = capture_graph(p["model"])
            plan = Plan.load(os.path.join(args.out, p["plan_file"]))
            p["features"] = step_features(plan, graphs[p["model"]], args.profile)
        measured_by["refit_command"] = " ".join(shlex.quote(a) for a in sys.argv)
    else:
        pairs, skipped = measure(args)
        measured_by = {"command": " ".join(shlex.quote(a) for a in [os.path.relpath(sys.executable, ROOT)
                                                                       if sys.executable.startswith(ROOT)
                                                                       else sys.executable, *sys.argv]),
                       "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                       "measure_wall_s": round(time.monotonic() - t0, 1)}
    if not pairs:
        raise SystemExit("no pair was measured")
    calib, all_fit = analyse(pairs, terms, "wall")
    calib_mem = analyse_memory(pairs, args.out)
    if args.calibration:
        prev = CostTerms.load(args.calibration)
        calib["earlier_run_calibration"] = {"file": args.calibration, "terms": prev.terms(), "meta": prev.meta,
                                            "all_pairs": evaluate(prev, pairs)}
        for p in pairs:
            p["earlier_calibration_time_s"] = prev.predict(p["features"])
    calib_cpu, all_fit_cpu = analyse(pairs, terms, "cpu")
    for p in pairs:
        p["time_error"] = float(rel_errors([p["predicted_time_s"]], [p["measured_time_s"]])[0])
        p["memory_error"] = float(rel_errors([p["predicted_memory_bytes"]], [p["measured_memory_bytes"]])[0])
        p["memory_fwd_bwd_error"] = float(rel_errors([p["predicted_memory_bytes"]],
                                                      [p["measured_memory_fwd_bwd_bytes"]])[0])
        p["cpu_time_error"] = float(rel_errors([p["predicted_time_s"]], [p["measured_cpu_time_s"]])[0])
        p["memory_by_category"] = memory_categories(p)
        resident = sum(v["measured_rank0"] for k, v in p["memory_by_category"].items() if k in _CATEGORIES)
        # diagnostic: the categories the cost model prices (rank 0's PARAM+GRAD+OPT+ACT at the peak)
        predicted = p.get("predicted_resident_bytes", p["predicted_memory_bytes"])
        p["memory_resident_error_rank0"] = (predicted - resident) / resident if resident else None
    overall = {}
    for w in sorted({p["world"] for p in pairs}):
        ps = [p for p in pairs if p["world"] == w]
        s = summarize([p["predicted_time_s"] for p in ps], [p["measured_time_s"] for p in ps],
                      [p["predicted_memory_bytes"] for p in ps], [p["measured_memory_bytes"] for p in ps])
        s["calibrated_test"] = evaluate_split(ps, "test")
        cpu = summarize([p["predicted_time_s"] for p in ps], [p["measured_cpu_time_s"] for p in ps])
        s["cpu_time"] = {"uncalibrated": cpu, "calibrated_test": evaluate_split(ps, "test", "cpu")}
        s["loadavg_1min_during_timing"] = [min(p["loadavg_1min"][0] for p in ps),
                                           max(p["loadavg_1min"][1] for p in ps)]
        s["per_model"] = per_model_bias(ps)
        held = s["calibrated_test"]
        s["targets"] = {"pairs>=12": s["n"] >= 12, "median_abs_time_error<=0.15": s["median_abs_time_error"] <= 0.15,
                        "spearman>=0.8": s["spearman_time"] >= 0.8,
                        "every_memory_error<=0.10": s["max_abs_memory_error"] <= 0.10,
                        # the GPU cost-model issue's CPU item: held-out pairs, five families or more
                        "families>=5": len(s["per_model"]) >= 5,
                        "held_out_median_abs_time_error<=0.10": held.get("median_abs_time_error", 1.0) <= 0.10,
                        "held_out_spearman>=0.9": held.get("spearman_time", 0.0) >= 0.9}
        if args.calibration:
            # every pair is held out from terms fitted on another run (another world size)
            other = calib["earlier_run_calibration"]["all_pairs"]
            s["targets"]["earlier_calibration_median_abs_time_error<=0.10"] = other["median_abs_time_error"] <= 0.10
            s["targets"]["earlier_calibration_spearman>=0.9"] = other["spearman_time"] >= 0.9
        overall[f"world{w}"] = s
    import torch

    report = {
        "format": "tensoropt.validation/1",
        "overall": overall, "calibration": calib, "calibration_cpu_time": calib_cpu,
        "memory_calibration": calib_mem, "pairs": pairs, "skipped": skipped,
        "measured_by": measured_by, "notes": NOTES,
        "environment": {"machine": platform.machine(), "processor": platform.processor(),
                        "cpus": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version(), "torch": torch.__version__,
                        "profile": args.profile, "threads_per_rank": 1, "backend": "gloo"},
        "method": {
            "time": "median over timed steps of the slowest rank's wall time of tensoropt.train_step(model, "
                    "*batch) (the forward's outputs held through the backward; keyword inputs with "
                    "use_cache=False); Adam step; zero_grad(set_to_none=False); barrier before each step; "
                    "IQR as spread",
            "memory": "tensoropt.apply.step_peak_memory: torch.distributed._tools.MemTracker peak of live "
                      "tensor storage over one whole step (forward, backward, Adam step, "
                      "zero_grad(set_to_none=False)) begun with gradients and optimizer state resident, model "
                      "and optimizer tracked, median of three steps per rank, max over ranks; excludes allocator "
                      "fragmentation and gloo's C++ buffers",
            "predicted": "tensoropt.frontier(model, 'cpu:N', inputs=..., profile=PROFILE): Plan.time_s, "
                         "Plan.peak_memory_bytes (resident state and saved activations, the backward "
                         "pass's rise above them, the input batch)",
            "calibration": "tensoropt.validate.fit (see step_calibration.json)",
        },
    }
    with open(report_path + ".tmp", "w") as f:
        json.dump(report, f, indent=1, default=float)
    os.replace(report_path + ".tmp", report_path)
    meta = {"fitted_on_pairs": len(pairs), "profile": args.profile, "report": "report.json",
            "date": measured_by.get("date")}
    dataclasses.replace(all_fit, meta=meta).save(os.path.join(args.out, "step_calibration.json"))
    dataclasses.replace(all_fit_cpu, meta=dict(meta, metric="process CPU time per step")).save(
        os.path.join(args.out, "step_calibration_cpu.json"))
    w0 = overall[next(iter(overall))]
    plot_predicted_vs_measured(pairs, os.path.join(args.out, "predicted_vs_measured.png"),
                               title=f"{len(pairs)} (model, plan) pairs, torch {torch.__version__}, "
                                     f"{os.cpu_count()} CPUs, gloo; raw median |err| "
                                     f"{w0['median_abs_time_error']:.0%}, Spearman {w0['spearman_time']:.2f}; "
                                     f"calibrated held-out median |err| "
                                     f"{calib['calibrated']['test'].get('median_abs_time_error', float('nan')):.0%}")
    print(json.dumps({"overall": overall, "uncalibrated": calib["uncalibrated"], "calibrated": calib["calibrated"],
                      "fit_on_train": calib["fit_on_train"], "cpu_calibrated": calib_cpu["calibrated"],
                      "cpu_fit_on_train": calib_cpu["fit_on_train"]}, indent=1, default=float))
    print(f"[validate] wrote {report_path} ({len(pairs)} pairs, {len(skipped)} skipped)")


def per_model_bias(pairs: list[dict]) -> dict:
    """Per model: its pairs and the median signed relative error (predicted over measured, less
    one) of calibrated time on its held-out and on all its pairs, of uncalibrated time and of
    peak memory: which way the model leans for each family."""
    out = {}
    for model in sorted({p["model"] for p in pairs}):
        ps = [p for p in pairs if p["model"] == model]
        test = [p for p in ps if p.get("split") == "test"]

        def bias(pred, meas, group):
            return float(np.median(rel_errors([p[pred] for p in group], [p[meas] for p in group]))) if group else None

        out[model] = {"pairs": len(ps), "held_out_pairs": len(test),
                      "calibrated_time_bias_held_out": bias("calibrated_time_s", "measured_time_s", test),
                      "calibrated_time_bias": bias("calibrated_time_s", "measured_time_s", ps),
                      "uncalibrated_time_bias": bias("predicted_time_s", "measured_time_s", ps),
                      # the terms of another run (``--calibration``), which saw none of these pairs
                      "earlier_calibration_time_bias": (bias("earlier_calibration_time_s", "measured_time_s", ps)
                                                        if all("earlier_calibration_time_s" in p for p in ps)
                                                        else None),
                      "memory_bias": bias("predicted_memory_bytes", "measured_memory_bytes", ps)}
    return out


def evaluate_split(pairs: list[dict], which: str, metric: str = "wall") -> dict:
    ps = [p for p in pairs if p.get("split") == which]
    if not ps:
        return {"n": 0}
    suffix = "" if metric == "wall" else f"_{metric}"
    return summarize([p[f"calibrated{suffix}_time_s"] for p in ps], [p[METRICS[metric]] for p in ps])


_CATEGORIES = {"param_bytes": "PARAM", "grad_bytes": "GRAD", "optimizer_bytes": "OPT", "activation_bytes": "ACT"}


def memory_categories(p: dict) -> dict:
    """Predicted breakdown next to rank 0's MemTracker categories at the step's peak (TEMP,
    BUFFER and OTH have no predicted counterpart)."""
    b, m = p["predicted_breakdown"], p["measured_memory_by_category_rank0"]
    out = {k: {"predicted": float(b.get(k, 0.0)), "measured_rank0": int(m.get(v, 0))} for k, v in _CATEGORIES.items()}
    out["temporaries"] = {"predicted": 0.0, "measured_rank0": int(m.get("TEMP", 0))}
    out["buffers_other"] = {"predicted": 0.0, "measured_rank0": int(m.get("BUFFER", 0)) + int(m.get("OTH", 0))}
    return out


if __name__ == "__main__":
    main()
