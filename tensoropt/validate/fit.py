"""Fitting calibrations on measured runs: the cost terms of :mod:`tensoropt.cost_terms`
(on the features of :func:`tensoropt.calibration.step_features`) and the memory terms below.

The fit minimises the sum of squared *relative* residuals with non-negative terms
(``scipy.optimize.nnls`` on rows scaled by 1/measured).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..calibration import has_model_axis, step_features
from ..cost_terms import COST_TERMS_FORMAT, FEATURES, NEUTRAL, TERMS, CostTerms, feature_value
from ..placement import Shard, parse_placements

__all__ = ["TERMS", "FEATURES", "CostTerms", "fit_calibration", "step_features", "COST_TERMS_FORMAT",
           "MEMORY_TERMS", "MemoryCalibration", "memory_features", "fit_memory_calibration"]


def fit_calibration(features: Sequence[Mapping[str, float]], measured_s: Iterable[float],
                    terms: Sequence[str] = tuple(TERMS)) -> CostTerms:
    """Fit ``terms`` (others neutral) to minimise sum(((t_pred - t_meas) / t_meas)^2), terms >= 0."""
    from scipy.optimize import nnls

    y = np.asarray(list(measured_s), dtype=float)
    if len(features) != len(y):
        raise ValueError(f"{len(features)} feature rows, {len(y)} measurements")
    if np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("measured times must be positive and finite")
    unknown = [t for t in terms if t not in TERMS]
    if unknown:
        raise ValueError(f"unknown terms {unknown}; known: {list(TERMS)}")
    terms = tuple(t for t in TERMS if t in terms)
    if not terms:
        return CostTerms()
    fixed = [t for t in TERMS if t not in terms]
    offset = np.array([sum(NEUTRAL.get(t, 0.0) * feature_value(f, TERMS[t]) for t in fixed) for f in features])
    A = np.array([[feature_value(f, TERMS[t]) for t in terms] for f in features], dtype=float)
    w = 1.0 / y
    # Scale columns to unit norm for conditioning, then undo.
    Aw = A * w[:, None]
    norms = np.linalg.norm(Aw, axis=0)
    norms[norms == 0] = 1.0
    x, _ = nnls(Aw / norms, (y - offset) * w)
    x = x / norms
    return CostTerms(**{t: float(v) for t, v in zip(terms, x)}, fitted=terms)


# ---------------------------------------------------------------------------------- memory

MEMORY_TERMS: dict[str, str] = {
    "temp_factor": "max_local_tensor_bytes",          # transients at the peak, in largest-tensor units
    "replicate_param_copies": "replicate_param_bytes",  # extra parameter copies of the data-parallel wrapper
}


@dataclass
class MemoryCalibration:
    """Whole-step memory terms the per-operator model does not price::

        peak = predicted_memory_bytes + temp_factor * max_local_tensor_bytes
               + replicate_param_copies * replicate_param_bytes

    ``max_local_tensor_bytes``: the largest operator output of the plan, local shard (a
    temporary of that size -- its gradient, say -- is alive at the peak);
    ``replicate_param_bytes``: the plan's parameter bytes when the apply layer wraps it in
    FSDP2 (``apply_mode == "replicate"``), else 0. ``predicted_memory_bytes`` is the plan's
    ``peak_memory_bytes``, which already holds the cost model's own backward peak.
    """
    temp_factor: float = 0.0
    replicate_param_copies: float = 0.0

    def predict(self, features: Mapping[str, float]) -> float:
        return float(features["predicted_memory_bytes"]
                     + sum(getattr(self, t) * float(features.get(f, 0.0)) for t, f in MEMORY_TERMS.items()))

    def terms(self) -> dict[str, float]:
        return {t: float(getattr(self, t)) for t in MEMORY_TERMS}


def memory_features(plan, graph, apply_mode: str | None = None) -> dict[str, float]:
    """Features of :class:`MemoryCalibration` for one plan (``graph``: its captured OpGraph)."""
    if [o.name for o in graph.operators] != [o.name for o in plan.ops]:
        raise ValueError("plan and graph list different operators")
    largest = 0.0
    for op, choice in zip(graph.operators, plan.ops):
        shards = 1
        for a, p in enumerate(parse_placements(choice.placements)):
            if isinstance(p, Shard) and a < len(plan.mesh_shape):
                shards *= plan.mesh_shape[a]
        largest = max(largest, float(op.output.nbytes) / shards)
    if apply_mode is None:
        apply_mode = "dtensor" if has_model_axis(plan) else "replicate"
    b = plan.breakdown or {}
    return {"predicted_memory_bytes": float(plan.peak_memory_bytes), "max_local_tensor_bytes": largest,
            "replicate_param_bytes": float(b.get("param_bytes", 0.0)) if apply_mode == "replicate" else 0.0}


def fit_memory_calibration(features: Sequence[Mapping[str, float]], measured_bytes: Iterable[float],
                           terms: Sequence[str] = tuple(MEMORY_TERMS)) -> MemoryCalibration:
    """Non-negative least squares on relative residuals (as :func:`fit_calibration`)."""
    from scipy.optimize import nnls

    y = np.asarray(list(measured_bytes), dtype=float)
    if len(features) != len(y) or np.any(y <= 0):
        raise ValueError("need one positive measurement per feature row")
    terms = tuple(t for t in MEMORY_TERMS if t in terms)
    cal = MemoryCalibration()
    if not terms:
        return cal
    base = np.array([f["predicted_memory_bytes"] for f in features], dtype=float)
    A = np.array([[float(f.get(MEMORY_TERMS[t], 0.0)) for t in terms] for f in features]) / y[:, None]
    norms = np.linalg.norm(A, axis=0)
    norms[norms == 0] = 1.0
    x, _ = nnls(A / norms, (y - base) / y)
    for t, v in zip(terms, x / norms):
        setattr(cal, t, float(v))
    return cal
