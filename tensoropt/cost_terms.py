"""Fitted terms the cost model prices every operator and edge with (plain data, no torch).

A micro-benchmark profile and a datasheet leave out what a real step pays besides: achieved
efficiency below the curves, per-call overheads, the optimizer step, a fixed cost per step.
:class:`CostTerms` holds those terms; :class:`~tensoropt.costmodel.CostModel` applies them
while it prices nodes and edges, so a search with them (``frontier(..., calibration=path)``)
is exact for the calibrated model. A step's time is linear in the terms::

    t = matmul_scale · matmul_s + other_compute_scale · other_compute_s
        + relayout_scale · relayout_s + grad_comm_scale · grad_comm_s + p2p_scale · p2p_s
        + framework_scale · framework_s + update_scale · update_s
        + per_collective_s · collective_calls + per_sharded_op_s · sharded_ops
        + per_dtensor_op_s · dtensor_ops + per_param_tensor_s · param_tensors
        + per_dtensor_param_s · dtensor_params + optimizer_s_per_param · local_params + fixed_s

where each feature is what the uncalibrated cost model adds up: compute of matrix-unit
operators (linear, matmul, attention, conv) and of the rest, layout moves on edges and tied
parameters, an operator's own collectives (gradient reductions, ZeRO gathers), pipeline
sends; collective calls, one per collective, a parameter collective issued with its
group's (``execution.groups_parameter_collectives``) counting its share of one; operators
that split something other than the batch over a mesh axis (operator-level layouts);
the torch ops the DTensor runner dispatches one by one, on a mesh of more than one device
for every plan but the one FSDP2 runs on the model's own code
(``execution.runs_replicated``: DTensor's dispatch and sharding propagation per op, forward
and backward; ``Operator.dispatches``: an operator's own ops and its share of the views
between operators); the parameter tensors a device holds where there is more than one
device (each is a DTensor, under FSDP2 as on the DTensor runner: the optimizer's every
operation on it, and FSDP2's hooks, dispatch per tensor whatever its size), and those of
them the DTensor runner holds, which it also reduces and lays out one by one; the parameter
elements this device updates; and a fixed cost per step, each rank's own work, so that, like
the rest of it, it takes ``CostModel.host_share`` times as long where ranks share a core.
``validate.fit`` fits them on measured steps, ``scripts/validate_published.py`` on published
GPU runs.

One term is not linear: ``grad_comm_overlap``, the share of an operator's own compute behind
which its parameter collectives (gradient reductions, ZeRO gathers) hide. Where it is above 0,
``grad_comm_s`` counts per operator only the traffic past that share
(``validate.published.grad_comm_exposed``); the published fit tries it on a grid.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Mapping, Sequence

__all__ = ["CostTerms", "TERMS", "FEATURES", "NEUTRAL", "COST_TERMS_FORMAT", "feature_value"]

COST_TERMS_FORMAT = "tensoropt.cost_terms/1"

#: term -> the feature it multiplies ("one" for the constant)
TERMS: dict[str, str] = {
    "matmul_scale": "matmul_s",
    "other_compute_scale": "other_compute_s",
    "relayout_scale": "relayout_s",
    "grad_comm_scale": "grad_comm_s",
    "p2p_scale": "p2p_s",
    "framework_scale": "framework_s",
    "update_scale": "update_s",
    "per_collective_s": "collective_calls",
    "per_sharded_op_s": "sharded_ops",
    "per_dtensor_op_s": "dtensor_ops",
    "per_param_tensor_s": "param_tensors",
    "per_dtensor_param_s": "dtensor_params",
    "optimizer_s_per_param": "local_params",
    "fixed_s": "one",
}
FEATURES = tuple(dict.fromkeys(TERMS.values()))
NEUTRAL = {"matmul_scale": 1.0, "other_compute_scale": 1.0, "relayout_scale": 1.0, "grad_comm_scale": 1.0,
           "p2p_scale": 1.0, "framework_scale": 1.0, "update_scale": 1.0}


@dataclass(frozen=True)
class CostTerms:
    matmul_scale: float = 1.0
    other_compute_scale: float = 1.0
    relayout_scale: float = 1.0
    grad_comm_scale: float = 1.0
    p2p_scale: float = 1.0
    framework_scale: float = 1.0
    update_scale: float = 1.0
    per_collective_s: float = 0.0
    per_sharded_op_s: float = 0.0
    per_dtensor_op_s: float = 0.0
    per_param_tensor_s: float = 0.0
    per_dtensor_param_s: float = 0.0
    optimizer_s_per_param: float = 0.0
    fixed_s: float = 0.0
    # the share of an operator's own compute (uncalibrated) behind which its parameter
    # collectives hide; only what passes it counts, then times grad_comm_scale (not a linear term)
    grad_comm_overlap: float = 0.0
    fitted: tuple[str, ...] = ()
    meta: dict | None = None

    def __post_init__(self):
        bad = [t for t in TERMS if not getattr(self, t) >= 0]
        if bad:
            raise ValueError(f"cost terms must be non-negative: {bad}")
        if not self.grad_comm_overlap >= 0:
            raise ValueError(f"grad_comm_overlap must be non-negative, got {self.grad_comm_overlap!r}")
        object.__setattr__(self, "fitted", tuple(self.fitted))

    def terms(self) -> dict[str, float]:
        return {t: float(getattr(self, t)) for t in TERMS}

    @property
    def neutral(self) -> bool:
        return all(getattr(self, t) == NEUTRAL.get(t, 0.0) for t in TERMS) and self.grad_comm_overlap == 0

    @staticmethod
    def unit(term: str) -> "CostTerms":
        """Every term 0 but ``term`` 1: a step priced with it is that term's feature."""
        if term not in TERMS:
            raise ValueError(f"unknown term {term!r}; known: {list(TERMS)}")
        return CostTerms(**{t: (1.0 if t == term else 0.0) for t in TERMS})

    def predict(self, features: Mapping[str, float] | Sequence[Mapping[str, float]]):
        """Step time (s) for one feature dict, or a list for a sequence of them."""
        if isinstance(features, Mapping):
            return float(sum(getattr(self, t) * feature_value(features, f) for t, f in TERMS.items()))
        return [self.predict(f) for f in features]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fitted"] = list(self.fitted)
        d["format"] = COST_TERMS_FORMAT
        return d

    @staticmethod
    def from_dict(d: dict) -> "CostTerms":
        if d.get("format") != COST_TERMS_FORMAT:
            raise ValueError(f"not cost terms (format {d.get('format')!r}, expected {COST_TERMS_FORMAT!r}); "
                             "fit them with scripts/validate.py or scripts/validate_published.py")
        kw = {f.name: d[f.name] for f in fields(CostTerms) if f.name in d}
        return CostTerms(**kw)

    def save(self, path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=1)

    @staticmethod
    def load(path) -> "CostTerms":
        try:
            with open(path, encoding="utf-8") as f:
                return CostTerms.from_dict(json.load(f))
        except FileNotFoundError:
            raise FileNotFoundError(f"no cost terms at {path}; fit them with scripts/validate.py (CPU runs) "
                                    "or scripts/validate_published.py (published GPU runs)") from None


def feature_value(features: Mapping[str, float], name: str) -> float:
    """A feature's value; the constant's (``"one"``) is 1 where it is not given."""
    return float(features.get(name, 1.0 if name == "one" else 0.0))
