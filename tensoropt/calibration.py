"""Whole-step calibration: terms a micro-benchmark profile cannot see, fitted on real steps.

The cost model prices a step as compute (+ recompute) + communication (gradient
reductions + re-layouts). A real step also pays costs that per-operator micro-benchmarks
miss: a fixed cost per step (Python, autograd engine, hooks), a fixed cost per collective
call (launch / gloo round trip beyond the fitted alpha), per-operator dispatch overhead of
operator-level (DTensor) layouts, the optimizer step, and a systematic compute scale. The
calibrated step time is::

    t = compute_scale * compute_s + comm_scale * comm_s
        + per_collective_s * collective_calls + per_sharded_op_s * sharded_ops
        + optimizer_s_per_param * local_params + fixed_s

Features come from the plan alone (what the planner knows): ``compute_s`` and ``comm_s``
from its breakdown, ``collective_calls`` from :func:`tensoropt.comms.predicted_collectives`
(the collectives the cost model prices), ``sharded_ops`` = operators when some mesh axis is
model-parallel (else 0), ``local_params`` = this rank's parameter elements. Terms not fitted
keep their neutral value (scales 1, the rest 0), so the uncalibrated model is the plan's own
time. ``validate.fit`` fits the terms on measured steps; :func:`recalibrate` re-prices a
frontier with them (``frontier(..., calibration=path)``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Mapping, Sequence

import numpy as np

from .comms import predicted_collectives
from .frontiers import Frontier
from .pipeline import split_stages, sub_graph
from .strategy import OpConfig
from .training import TrainingConfig

__all__ = ["TERMS", "FEATURES", "NEUTRAL", "StepCalibration", "CALIBRATION_FORMAT", "feature_value",
           "step_features", "has_model_axis", "calibrated_frontier", "recalibrate"]

CALIBRATION_FORMAT = "tensoropt.step_calibration/1"

# term -> feature it multiplies ("one" for the constant)
TERMS: dict[str, str] = {
    "compute_scale": "compute_s",
    "comm_scale": "comm_s",
    "per_collective_s": "collective_calls",
    "per_sharded_op_s": "sharded_ops",
    "optimizer_s_per_param": "local_params",
    "fixed_s": "one",
}
FEATURES = tuple(dict.fromkeys(TERMS.values()))
NEUTRAL = {"compute_scale": 1.0, "comm_scale": 1.0}


@dataclass
class StepCalibration:
    compute_scale: float = 1.0
    comm_scale: float = 1.0
    per_collective_s: float = 0.0
    per_sharded_op_s: float = 0.0
    optimizer_s_per_param: float = 0.0
    fixed_s: float = 0.0
    fitted: tuple[str, ...] = ()
    meta: dict | None = None

    def terms(self) -> dict[str, float]:
        return {t: float(getattr(self, t)) for t in TERMS}

    def predict(self, features: Mapping[str, float] | Sequence[Mapping[str, float]]):
        """Calibrated step time (s) for one feature dict, or an array for a sequence of them."""
        if isinstance(features, Mapping):
            return float(sum(getattr(self, t) * feature_value(features, f) for t, f in TERMS.items()))
        return np.array([self.predict(f) for f in features])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fitted"] = list(self.fitted)
        d["format"] = CALIBRATION_FORMAT
        d["formula"] = ("t = compute_scale*compute_s + comm_scale*comm_s + per_collective_s*collective_calls"
                        " + per_sharded_op_s*sharded_ops + optimizer_s_per_param*local_params + fixed_s")
        return d

    @staticmethod
    def from_dict(d: dict) -> "StepCalibration":
        if d.get("format") != CALIBRATION_FORMAT:
            raise ValueError(f"not a step calibration (format {d.get('format')!r})")
        kw = {f.name: d[f.name] for f in fields(StepCalibration) if f.name in d}
        kw["fitted"] = tuple(kw.get("fitted", ()))
        return StepCalibration(**kw)

    def save(self, path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=1)

    @staticmethod
    def load(path) -> "StepCalibration":
        with open(path, encoding="utf-8") as f:
            return StepCalibration.from_dict(json.load(f))


def feature_value(features: Mapping[str, float], name: str) -> float:
    return 1.0 if name == "one" else float(features.get(name, 0.0))


def step_features(plan, graph=None, apply_mode: str | None = None) -> dict[str, float]:
    """Features of one plan's step (see module doc). ``graph``: the captured OpGraph, needed
    for the collective count (without it ``collective_calls`` is 0).

    ``collective_calls`` follows how a step issues collectives: a plan whose every mesh axis
    is data-parallel reduces gradients in buckets, one per ``layers.<i>`` block with
    parameters plus one for the rest (FSDP2 ``replicate`` / ``fully_shard`` groups): one
    all-reduce per bucket (ZeRO 0), a reduce-scatter and an all-gather (ZeRO 1-2) or two
    all-gathers (ZeRO 3); any other plan issues every collective of
    :func:`tensoropt.comms.predicted_collectives` as its own call.

    ``apply_mode``: how ``tensoropt.apply`` lays the plan out (``plan_layout(...).mode``,
    known before running: "replicate" for all-data-parallel plans, else "dtensor", whose
    every operator runs through the operator-level layout and counts in ``sharded_ops``);
    inferred from the configurations when omitted (a mesh axis that splits anything but the
    batch makes it "dtensor").
    """
    b = plan.breakdown or {}
    comm = float(b.get("comm_s", 0.0)) + float(b.get("relayout_s", 0.0))
    compute = float(plan.time_s) - comm
    world = 1
    for n in plan.mesh_shape:
        world *= n
    if apply_mode is None:
        apply_mode = "dtensor" if has_model_axis(plan) else "replicate"
    if apply_mode not in ("replicate", "dtensor"):
        raise ValueError(f"apply_mode must be 'replicate' or 'dtensor', got {apply_mode!r}")
    model_parallel = world > 1 and apply_mode == "dtensor"
    calls = 0
    if world > 1 and apply_mode == "replicate":
        per_bucket = {0: 1, 1: 2, 2: 2, 3: 3}.get(int(plan.zero_stage or 0), 1)
        calls = _buckets(plan) * per_bucket
    elif graph is not None:
        calls = _priced_collectives(plan, graph)
    tc = TrainingConfig.of_plan(plan.training)
    per_param = tc.state_bytes_per_param[0]
    local_params = float(b.get("param_bytes", 0.0)) / per_param
    return {"compute_s": compute, "comm_s": comm, "collective_calls": float(calls),
            "sharded_ops": float(len(plan.ops)) if model_parallel else 0.0,
            "local_params": local_params, "predicted_s": float(plan.time_s)}


def _priced_collectives(plan, graph) -> int:
    """How many collectives the cost model prices for ``plan`` (``comms.predicted_collectives``);
    a pipeline plan's are its distinct stages' (first, middle, last) on their stage graphs."""
    if not plan.stages:
        return len(predicted_collectives(plan, graph))
    specs = split_stages(graph, plan.mesh_shape[0])
    return sum(len(predicted_collectives(stage, sub_graph(graph, spec.ops)[0]))
               for stage, spec in zip(plan.stages, specs))


def _buckets(plan) -> int:
    """Gradient buckets of a data-parallel plan: ``layers.<i>`` blocks with parameters, + 1."""
    blocks = set()
    rest = False
    for o in plan.ops:
        if o.param_bytes <= 0:
            continue
        parts = o.module.split(".")
        if len(parts) >= 2 and parts[0] == "layers" and parts[1].isdigit():
            blocks.add(parts[1])
        else:
            rest = True
    return len(blocks) + (1 if rest or not blocks else 0)


def has_model_axis(plan) -> bool:
    """Some mesh axis (size > 1) splits something other than the batch in some operator."""
    splits = [OpConfig.parse(o.config).splits for o in plan.ops]
    return any(n > 1 and a < len(s) and s[a] not in (None, "b")
               for a, n in enumerate(plan.mesh_shape) for s in splits)


def calibrated_frontier(plans: Sequence, calibration: StepCalibration, graph) -> list[tuple]:
    """Re-price plans with a whole-step calibration and keep the Pareto-optimal ones.

    Returns ``[(plan, calibrated_time_s), ...]`` sorted by calibrated time, peak memory
    strictly decreasing (plans' memory is unchanged). ``graph``: the model's captured OpGraph (for the
    collective counts). This is how a planner can use the fitted terms today, without a
    change to the cost model (the per-plan terms -- the fixed cost and the per-operator
    overhead of operator-level layouts -- are not per-operator quantities).
    """
    priced = sorted(((p, calibration.predict(step_features(p, graph))) for p in plans),
                    key=lambda x: (x[1], x[0].peak_memory_bytes))
    out, best_mem = [], float("inf")
    for p, t in priced:
        if p.peak_memory_bytes < best_mem:
            out.append((p, t))
            best_mem = p.peak_memory_bytes
    return out


def recalibrate(f: Frontier, path: str, graph) -> Frontier:
    """``f`` re-priced with the whole-step calibration saved at ``path``: its Pareto-optimal
    plans under the calibrated times (``breakdown["model_time_s"]`` keeps each plan's own)."""
    try:
        cal = StepCalibration.load(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no calibration at {path}; fit one with scripts/validate.py") from None

    def priced(p, t: float):
        return replace(p, time_s=float(t), breakdown={**p.breakdown, "model_time_s": p.time_s})

    plans = [priced(p, t) for p, t in calibrated_frontier(f.plans, cal, graph)]
    refs = {k: priced(p, cal.predict(step_features(p, graph))) for k, p in f.reference.items()}
    return Frontier(f.model, f.devices, plans, refs, f.device_memory_bytes, {**f.stats, "calibration": path})
