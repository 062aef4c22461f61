"""The features cost terms are fitted on: a plan's step time under each term alone.

A step's time is linear in :class:`~tensoropt.cost_terms.CostTerms` (see there), so a plan's
feature for a term is its time re-priced by the same cost model with that term 1 and every
other 0 (:func:`step_features`). The fit (``validate.fit``) therefore fits exactly what the
search prices with (``frontier(..., calibration=path)``).
"""

from __future__ import annotations

from .cost_terms import COST_TERMS_FORMAT, FEATURES, NEUTRAL, TERMS, CostTerms, feature_value
from .mesh import mesh_for, parse_devices
from .plan_builder import assignment_of
from .planner import build_problem
from .pricing import cost_models
from .strategy import OpConfig
from .training import TrainingConfig

__all__ = ["TERMS", "FEATURES", "NEUTRAL", "CostTerms", "COST_TERMS_FORMAT", "feature_value", "step_features",
           "calibrated_time", "has_model_axis"]


def step_features(plan, graph, profile: str | None = None) -> dict[str, float]:
    """Per feature of :data:`TERMS`, ``plan``'s time under that term alone (``"one"``: 1, or
    the ranks per core where they share the host's cores),
    and ``predicted_s``, the plan's own time. ``graph``: the captured model the plan was
    searched on; ``profile``: the measured profile it was priced with, if any. Pipeline plans
    are not re-priced (their stages are solved on sub-graphs)."""
    if plan.stages:
        raise ValueError("step features of pipeline plans are not computed (stages are priced on sub-graphs)")
    cluster = parse_devices(plan.devices)
    mesh = mesh_for(tuple(plan.mesh_shape), cluster)
    if mesh is None:
        raise ValueError(f"mesh {plan.mesh} does not fit {plan.devices}")
    training = TrainingConfig.of_plan(plan.training)
    feats: dict[str, float] = {}
    assignment = None
    for term, feature in TERMS.items():
        cm = cost_models(cluster, training, profile, CostTerms.unit(term))(mesh)
        if feature == "one":
            feats[feature] = cm.fixed_s
            continue
        problem = build_problem(graph, mesh, cm, zero_stage=plan.zero_stage, recompute=bool(plan.recompute),
                                recompute_policy=getattr(plan, "recompute_policy", "full") or "full")
        if assignment is None:
            assignment = assignment_of(plan, problem, graph)
        feats[feature] = problem.time_of(assignment)
    feats["predicted_s"] = float(plan.time_s)
    return feats


def calibrated_time(plan, model, inputs, calibration: str, profile: str | None = None) -> float:
    """``plan``'s step time priced with the cost terms saved at ``calibration``, as a search
    with them prices it (``model``, ``inputs``: what the plan was searched on)."""
    from .capture.recapture import capture_model

    graph, _, _ = capture_model(model, inputs)
    return CostTerms.load(calibration).predict(step_features(plan, graph, profile))


def has_model_axis(plan) -> bool:
    """Some mesh axis (size > 1) splits something other than the batch in some operator."""
    splits = [OpConfig.parse(o.config).splits for o in plan.ops]
    return any(n > 1 and a < len(s) and s[a] not in (None, "b")
               for a, n in enumerate(plan.mesh_shape) for s in splits)
