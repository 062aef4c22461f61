"""Predicted vs published: large-scale GPU training runs (data/published/) as plans.

    .venv/bin/python scripts/validate_published.py            # price every case, fit, report
    .venv/bin/python scripts/validate_published.py --reuse    # fit and report on the saved prices

Every row whose kernels the cost model prices alike becomes a plan (``tensoropt.plan_for``
with the row's degrees, ``tensoropt.validate.published``); its predicted iteration time is
split into the parts the GPU-side terms scale (matrix-unit compute per device generation,
other compute, tensor-parallel re-layouts, gradient traffic, pipeline sends). The terms are
fitted on every other case of each source (non-negative least squares on relative error, at
each overlap of gradient traffic with compute on a grid, keeping the one that fits best) and
judged on the cases held out. Writes data/validation/published.json,
data/validation/published_vs_predicted.png and the fitted terms as cost terms per device
generation, data/validation/gpu_terms_{a100,h100}.json (``frontier(..., calibration=path)``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tensoropt.cost_terms import CostTerms  # noqa: E402
from tensoropt.validate.published import (OVERLAP_GRID, TIME_TERMS, cases, frontier_of,  # noqa: E402
                                         grad_comm_exposed, price, time_features)

OUT = ROOT / "data" / "validation" / "published.json"
# pipeline sends are a few percent of any row's time: their scale stays the datasheet's
FITTED = ("matmul_a100", "matmul_h100", "other_compute", "relayout", "grad_comm")
PLOT = ROOT / "data" / "validation" / "published_vs_predicted.png"


def priced_rows(reuse: bool, only: list[str] | None) -> tuple[list[dict], list[dict]]:
    found, skipped = cases()
    unknown = sorted(set(only or ()) - {c.case_id for c in found})
    if unknown:
        raise SystemExit(f"unknown case ids {unknown}; cases: {sorted(c.case_id for c in found)}")
    old = {}
    if (reuse or only) and OUT.exists():
        old = {r["case_id"]: r for r in json.loads(OUT.read_text())["cases"]}
    rows = []
    for case in found:
        if only and case.case_id not in only:
            if case.case_id in old:                    # the cases not asked for keep their prices
                rows.append(old[case.case_id])
            continue
        if reuse and case.case_id in old and "predicted_s" in old[case.case_id]:
            rows.append(old[case.case_id])
            continue
        start = time.time()
        row = {"case_id": case.case_id, "source": case.source, "devices": case.devices, "setup": case.setup,
               "model": {"zoo": case.zoo, **case.overrides}, "global_batch": case.global_batch,
               "published_s": case.published_s, "published_memory_bytes": case.published_memory_bytes,
               "memory_kind": case.memory_kind, "assumptions": list(case.assumptions)}
        try:
            plan = price(case)
        except Exception as err:                       # recorded, never silently dropped
            row["error"] = f"{type(err).__name__}: {err}"
            print(f"{case.case_id}: {row['error']}", flush=True)
            rows.append(row)
            continue
        row.update(plan=plan.summary, predicted_s=plan.time_s, predicted_peak_bytes=plan.peak_memory_bytes,
                   features=time_features(plan, case.devices.split("x")[-1]),
                   grad_comm_exposed=grad_comm_exposed(plan), price_s=time.time() - start)
        print(f"{case.case_id}: predicted {plan.time_s:.2f} s, published {case.published_s} s "
              f"({row['price_s']:.0f} s to price)", flush=True)
        rows.append(row)
        save(rows, skipped, None)                      # progress survives an interruption
    return rows, skipped


def split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """Every other case of each source, in case order, to fit; the rest held out."""
    train, held = [], []
    by_source: dict[str, list[dict]] = {}
    for r in rows:
        by_source.setdefault(r["source"], []).append(r)
    for group in by_source.values():
        for k, r in enumerate(sorted(group, key=lambda r: r["case_id"])):
            (train if k % 2 == 0 else held).append(r)
    return train, held


def features(r: dict, overlap: float) -> dict[str, float]:
    """The row's time features with its gradient traffic exposed past ``overlap`` of each
    operator's compute (``OVERLAP_GRID``'s entries)."""
    f = dict(r["features"])
    exposed = r.get("grad_comm_exposed")
    if overlap:
        if exposed is None:
            raise SystemExit(f"{r['case_id']}: no grad_comm_exposed feature; price the rows again (without --reuse)")
        f["grad_comm"] = exposed[OVERLAP_GRID.index(overlap)]
    return f


def fit_at(train: list[dict], overlap: float) -> tuple[dict[str, float], float]:
    """The terms NNLS fits on ``train`` at one overlap, and their squared relative residual."""
    from scipy.optimize import nnls

    feats = [features(r, overlap) for r in train]
    used = [t for t in FITTED if any(f[t] > 0 for f in feats)]
    fixed = [t for t in TIME_TERMS if t not in used]
    y = np.array([r["published_s"] for r in train])
    rest = np.array([sum(f[t] for t in fixed) for f in feats])
    a = np.array([[f[t] for t in used] for f in feats]) / y[:, None]
    theta, residual = nnls(a, 1 - rest / y)
    terms = {t: (float(theta[used.index(t)]) if t in used else 1.0) for t in TIME_TERMS}
    terms["grad_comm_overlap"] = overlap
    return terms, float(residual) ** 2


def fit(train: list[dict]) -> dict[str, float]:
    """The terms of the overlap whose NNLS fit leaves the least residual on ``train`` (the
    overlap is not linear in the time: each is fitted in turn)."""
    return min((fit_at(train, w) for w in OVERLAP_GRID), key=lambda tr: tr[1])[0]


def predict(r: dict, terms: dict[str, float]) -> float:
    f = features(r, terms.get("grad_comm_overlap", 0.0))
    return sum(terms[t] * f[t] for t in TIME_TERMS)


def errors(rows: list[dict], terms: dict[str, float] | None) -> dict:
    from scipy.stats import spearmanr

    if not rows:
        return {}
    pred = np.array([predict(r, terms) if terms else r["predicted_s"] for r in rows])
    pub = np.array([r["published_s"] for r in rows])
    rel = pred / pub - 1
    out = {"cases": len(rows), "median_abs_error": float(np.median(np.abs(rel))),
           "max_abs_error": float(np.max(np.abs(rel))), "mean_error": float(np.mean(rel))}
    if len(rows) > 2:
        out["spearman"] = float(spearmanr(pred, pub).statistic)
    return out


def save(rows, skipped, summary) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    doc = {"what": "published GPU training runs priced as plans (scripts/validate_published.py)",
           "cases": rows, "left_out": skipped}
    if OUT.exists():                                   # frontier checks are kept (run with --frontier)
        old = json.loads(OUT.read_text())
        if "frontier_checks" in old:
            doc["frontier_checks"] = old["frontier_checks"]
    if summary is not None:
        doc.update(summary)
    OUT.write_text(json.dumps(doc, indent=1))


def plot(rows, terms, held_ids) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    for ax, calibrated in zip(axes, (False, True)):
        for r in rows:
            pred = predict(r, terms) if calibrated else r["predicted_s"]
            held = r["case_id"] in held_ids
            mk = "o" if r["source"].startswith("megatron_sc21") else ("s" if r["source"].startswith("korth")
                                                                       else ("^" if "h100_2024" in r["source"]
                                                                             else "D"))
            ax.scatter(r["published_s"], pred, marker=mk, s=40, facecolors="none" if held else "tab:blue",
                       edgecolors="tab:red" if held else "tab:blue")
        lo = min(min(r["published_s"] for r in rows), 0.3)
        hi = max(r["published_s"] for r in rows) * 1.5
        ax.plot([lo, hi], [lo, hi], "k--", linewidth=0.8)
        ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="gray", alpha=0.12,
                        label="±15 %")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("published iteration time (s)")
        ax.set_ylabel("predicted iteration time (s)")
        ax.set_title("datasheet model" if not calibrated else "GPU terms fitted on filled points; "
                                                                "open red = held out")
        ax.grid(True, alpha=0.3, which="both")
    axes[0].legend(handles=[
        plt.Line2D([], [], marker="o", linestyle="", color="tab:blue", label="Megatron SC'21 (A100)"),
        plt.Line2D([], [], marker="s", linestyle="", color="tab:blue", label="Korthikanti 2022 (A100)"),
        plt.Line2D([], [], marker="^", linestyle="", color="tab:blue", label="Megatron on H100"),
        plt.Line2D([], [], marker="D", linestyle="", color="tab:blue", label="torchtitan (H100)")], fontsize=8)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def frontier_checks(ids: list[str], max_mesh_dims: int, datasheet: bool = False,
                    accumulate: tuple[int, ...] = ()) -> None:
    """Each case's plan, priced with the fitted terms, against the frontier searched with the
    same terms at its memory: on the frontier, within 5 %, or how much faster the frontier
    is and with which plan (``datasheet``: both priced by the datasheet model instead, to
    tell a win of the layout from one of the fitted terms; ``accumulate``: micro-batch counts
    of gradient accumulation the search tries too). Stored under
    ``frontier_checks`` in published.json."""
    doc = json.loads(OUT.read_text())
    found = {c.case_id: c for c in cases()[0]}
    unknown = [cid for cid in ids if cid not in found]
    if unknown:
        raise SystemExit(f"unknown case ids {unknown}; cases: {sorted(found)}")
    checks = {(c["case_id"], c.get("model")): c for c in doc.get("frontier_checks", [])}
    for cid in ids:
        case = found[cid]
        gen = "h100" if case.devices.endswith("H100") else "a100"
        terms = None if datasheet else str(OUT.parent / f"gpu_terms_{gen}.json")
        start = time.time()
        mine = price(case, calibration=terms)
        # a per-operator recomputation plan is held against the frontier of that policy
        policy = "op" if case.setup.get("recompute") == "op" else "full"
        f = frontier_of(case, calibration=terms, max_mesh_dims=max_mesh_dims, progress=False,
                        recompute_policy=policy, accumulate=accumulate)
        best = f.fastest_within(mine.peak_memory_bytes)
        row = {"case_id": cid, "model": "datasheet" if datasheet else f"gpu_terms_{gen}.json", "devices": case.devices, "setup": case.setup, "max_mesh_dims": max_mesh_dims,
               "recompute_policy": policy, "accumulate": list(accumulate),
               "search_space": f.stats.get("search_space"), "search_s": time.time() - start,
               "published_plan": mine.summary, "published_plan_s": mine.time_s,
               "published_plan_peak_bytes": mine.peak_memory_bytes, "frontier_plans": len(f.plans)}
        if best is None:
            row["verdict"] = "no frontier plan holds as little"
        else:
            ratio = mine.time_s / best.time_s
            row.update(frontier_plan=best.summary, frontier_plan_s=best.time_s,
                       frontier_plan_peak_bytes=best.peak_memory_bytes, time_ratio=ratio,
                       frontier_breakdown={k: v for k, v in best.breakdown.items() if k.endswith("_s")},
                       published_breakdown={k: v for k, v in mine.breakdown.items() if k.endswith("_s")},
                       verdict=verdict(ratio))
        print(json.dumps(row, default=str), flush=True)
        checks[(cid, row["model"])] = row
        doc["frontier_checks"] = list(checks.values())
        OUT.write_text(json.dumps(doc, indent=1, default=str))


def memory_rows(rows: list[dict]) -> tuple[list[dict], dict]:
    """Each published peak against its prediction, like with like: a reserved figure against
    ``allocator.reserved_bytes`` of the predicted (allocated) peak. Also the reserved over
    allocated ratio fitted on the fit split's reserved rows (their median), held to the
    ``allocator.RESERVED_OVER_ALLOCATED`` the library prices with."""
    from tensoropt.allocator import RESERVED_OVER_ALLOCATED, reserved_bytes
    from tensoropt.mesh import parse_devices

    memory = []
    for r in rows:
        if "predicted_s" not in r or not r.get("published_memory_bytes"):
            continue
        allocated = r["predicted_peak_bytes"]
        reserved = r["memory_kind"] == "reserved"
        predicted = reserved_bytes(allocated, parse_devices(r["devices"]).device) if reserved else allocated
        memory.append({"case_id": r["case_id"], "role": r.get("role"), "predicted_peak_bytes": allocated,
                       "predicted_bytes": predicted, "published_bytes": r["published_memory_bytes"],
                       "published_kind": r["memory_kind"] or "allocated",
                       "error": predicted / r["published_memory_bytes"] - 1,
                       "allocated_error": allocated / r["published_memory_bytes"] - 1})
    fit_on = [m for m in memory if m["published_kind"] == "reserved" and m["role"] == "fit"]
    fitted = float(np.median([m["published_bytes"] / m["predicted_peak_bytes"] for m in fit_on])) if fit_on else None
    held = [m for m in memory if m["published_kind"] == "reserved" and m["role"] != "fit"]
    if fitted is not None and round(fitted, 4) != RESERVED_OVER_ALLOCATED:
        print(f"warning: the fit split's reserved/allocated ratio is {fitted:.4f}; "
              f"tensoropt.allocator.RESERVED_OVER_ALLOCATED is {RESERVED_OVER_ALLOCATED}", flush=True)
    return memory, {"reserved_over_allocated": fitted, "priced_with": RESERVED_OVER_ALLOCATED,
                    "fitted_on": [m["case_id"] for m in fit_on], "held_out": [m["case_id"] for m in held],
                    "held_out_max_abs_error": max((abs(m["error"]) for m in held), default=None),
                    "max_abs_error": max((abs(m["error"]) for m in memory), default=None)}


def verdict(ratio: float) -> str:
    """How a published plan (time ``ratio`` to the frontier's fastest plan at its memory)
    stands: faster than every frontier plan means it lies outside the searched space."""
    if ratio < 1 - 1e-9:
        return "faster than the frontier: outside the searched space"
    if ratio <= 1 + 1e-9:
        return "on the frontier"
    return "within 5 %" if ratio <= 1.05 else "frontier faster"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reuse", action="store_true", help="keep the prices already in published.json")
    ap.add_argument("--only", nargs="*", help="case ids to price again (the others keep their saved prices)")
    ap.add_argument("--frontier", nargs="*", help="case ids whose plan to hold against the frontier "
                                                  "(searched with the fitted terms)")
    ap.add_argument("--max-mesh-dims", type=int, default=2)
    ap.add_argument("--datasheet", action="store_true", help="frontier checks with the datasheet model")
    ap.add_argument("--accumulate", type=int, nargs="*", default=(),
                    help="frontier checks: micro-batch counts of gradient accumulation to search too")
    args = ap.parse_args()
    if args.frontier:
        frontier_checks(args.frontier, args.max_mesh_dims, args.datasheet, tuple(args.accumulate))
        return
    rows, skipped = priced_rows(args.reuse, args.only)
    timed = [r for r in rows if "predicted_s" in r and r.get("published_s")]
    train, held = split(timed)
    terms = fit(train)
    held_ids = {r["case_id"] for r in held}
    for r in rows:
        if "predicted_s" in r:
            r["role"] = "held out" if r["case_id"] in held_ids else "fit"
            r["calibrated_s"] = predict(r, terms)
    memory, memory_fit = memory_rows(rows)
    summary = {"terms": terms, "term_meaning": "multipliers of the predicted time's parts (1 = datasheet model); grad_comm_overlap: "
               "the share of each operator's compute its parameter collectives hide behind (grad_comm then "
               "multiplies what is left)",
               "datasheet": {"all": errors(timed, None), "held_out": errors(held, None)},
               "fitted": {"fit": errors(train, terms), "held_out": errors(held, terms)},
               "memory": memory, "memory_fit": memory_fit,
               "machine": "priced on a 2-core CPU machine (no GPU); the published figures are the authors'"}
    save(rows, skipped, summary)
    plot(timed, terms, held_ids)
    for gen in ("a100", "h100"):
        CostTerms(matmul_scale=terms[f"matmul_{gen}"], other_compute_scale=terms["other_compute"],
                  relayout_scale=terms["relayout"], grad_comm_scale=terms["grad_comm"], p2p_scale=terms["p2p"],
                  grad_comm_overlap=terms["grad_comm_overlap"],
                  fitted=tuple(f"{t}" for t in FITTED),
                  meta={"fitted_on": sorted(r["case_id"] for r in train), "source": "scripts/validate_published.py",
                        "device": gen.upper()}).save(OUT.parent / f"gpu_terms_{gen}.json")
    print(json.dumps({k: summary[k] for k in ("terms", "datasheet", "fitted", "memory", "memory_fit")}, indent=1))


if __name__ == "__main__":
    main()
