"""A plan: one point of the frontier, with every operator's configuration and cost.

Plain data, JSON round trip exact (floats are written with ``repr`` precision).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields

from .units import format_bytes, format_time

__all__ = ["Plan", "OpChoice", "PLAN_FORMAT"]

PLAN_FORMAT = "tensoropt.plan/1"


@dataclass(frozen=True, kw_only=True)
class OpChoice:
    name: str
    module: str
    family: str
    config: str              # per mesh axis the label split over it, "-" = replicated; e.g. "b,n"
    placements: str          # output placement per mesh axis, e.g. "S(0),S(2)"
    compute_s: float
    comm_s: float            # its own collectives: gradient reductions, ZeRO gathers, BatchNorm statistics
    relayout_s: float        # re-layout of its inputs (edges into it) and of the tied parameters it uses again
    param_bytes: float       # parameters + gradients + optimizer state of its local shard
    activation_bytes: float  # saved for backward
    update_s: float = 0.0    # the optimizer's update of its parameters, once per step (0 where not priced)


@dataclass(frozen=True, kw_only=True)
class Plan:
    model: str
    devices: str
    mesh_shape: tuple[int, ...]
    mesh_links: tuple[str, ...]
    time_s: float
    memory_bytes: float
    summary: str
    ops: tuple[OpChoice, ...]
    breakdown: dict = field(default_factory=dict)   # time and memory by category (see costmodel)
    training: dict = field(default_factory=dict)    # precision, optimizer
    param_signature: str = ""
    label: str = ""                                  # e.g. "data parallel" for a reference plan
    epsilon: float = 0.0
    zero_stage: int = 0                              # ZeRO stage on the data-parallel axes
    recompute: tuple[str, ...] = ()                  # modules whose activations are recomputed
    recompute_policy: str = "full"                   # what they keep (``tensoropt.recompute.POLICIES``)
    # Pipeline plans: mesh axis 0 is the pipeline axis; one plan per distinct stage (first,
    # a middle one standing for all middle stages, last), each per micro-batch. ``ops`` then
    # lists those stages' operators with configs on the stage sub-mesh (mesh_shape[1:]).
    stages: tuple["Plan", ...] = ()
    microbatches: int = 1
    # The example inputs the model was captured with (``capture.inputs.input_spec``: shapes and
    # dtypes at the global batch, keyword names): what ``parallelize`` needs to capture again.
    inputs: dict = field(default_factory=dict)

    @property
    def peak_memory_bytes(self) -> float:
        """The frontier's memory axis: ``memory_bytes`` (resident state and saved activations
        when the forward pass ends) plus the
        backward pass's rise above it (``breakdown["transient_bytes"]``) and the step's input
        batch (``breakdown["input_bytes"]``: ``tensoropt.apply`` hands every rank the whole
        batch); for a pipeline the largest over its stages (each with one micro-batch's
        inputs). The scope is a training step that keeps gradients between steps
        (``zero_grad(set_to_none=False)``); see ``tensoropt.apply.step_peak_memory``."""
        if self.stages:
            return max(s.peak_memory_bytes for s in self.stages)
        return (self.memory_bytes + float(self.breakdown.get("transient_bytes", 0.0))
                + float(self.breakdown.get("input_bytes", 0.0)))

    @property
    def mesh_axis_names(self) -> tuple[str, ...]:
        return tuple(f"m{i}" for i in range(len(self.mesh_shape)))

    @property
    def mesh(self) -> str:
        return "x".join(map(str, self.mesh_shape))

    @property
    def world_size(self) -> int:
        return math.prod(self.mesh_shape)

    def op(self, name: str) -> OpChoice:
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(f"no operator {name!r} in this plan")

    def configs(self) -> dict[str, str]:
        return {o.name: o.config for o in self.ops}

    # ------------------------------------------------------------------ text

    def __str__(self) -> str:
        label = f"{self.label}: " if self.label else ""
        return (f"{label}{self.summary} on {self.devices} (mesh {self.mesh}): "
                f"{format_time(self.time_s)}/iteration, {format_bytes(self.peak_memory_bytes)} peak per device")

    def describe(self, max_rows: int | None = None) -> str:
        """A per-operator table: configuration, time, memory and communication."""
        head = [str(self), _breakdown_line(self.breakdown), ""]
        cols = ("operator", "family", "config", "output", "compute", "comm", "relayout", "state", "activations")
        rows = [cols]
        for o in self.ops[:max_rows]:
            rows.append((o.name, o.family, o.config, o.placements, _ms(o.compute_s), _ms(o.comm_s),
                         _ms(o.relayout_s), _mib(o.param_bytes), _mib(o.activation_bytes)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        if max_rows is not None and len(self.ops) > max_rows:
            lines.append(f"... {len(self.ops) - max_rows} more operators")
        return "\n".join(head + lines)

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict:
        d = asdict(self)
        d["format"] = PLAN_FORMAT
        return d

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @staticmethod
    def from_dict(d: dict) -> "Plan":
        if not isinstance(d, dict) or d.get("format") != PLAN_FORMAT:
            raise ValueError(f"not a tensoropt plan (expected format {PLAN_FORMAT!r}, "
                             f"got {d.get('format') if isinstance(d, dict) else type(d).__name__!r})")
        try:
            kw = {f.name: d[f.name] for f in fields(Plan) if f.name in d}
            kw["mesh_shape"] = tuple(int(x) for x in d["mesh_shape"])
            kw["mesh_links"] = tuple(d["mesh_links"])
            kw["ops"] = tuple(OpChoice(**o) for o in d["ops"])
            kw["recompute"] = tuple(d.get("recompute", ()))
            kw["stages"] = tuple(Plan.from_dict({**st, "format": PLAN_FORMAT}) for st in d.get("stages", ()))
            return Plan(**kw)
        except (KeyError, TypeError) as err:
            raise ValueError(f"corrupt plan: {err}") from None

    @staticmethod
    def from_json(text: str) -> "Plan":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"corrupt plan JSON: {err}") from None
        return Plan.from_dict(d)

    def save(self, path) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())

    @staticmethod
    def load(path) -> "Plan":
        with open(path, encoding="utf-8") as f:
            return Plan.from_json(f.read())


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms"


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f} MiB"


def _breakdown_line(b: dict) -> str:
    if not b:
        return ""
    t = ", ".join(f"{k[:-2]} {format_time(v)}" for k, v in b.items() if k.endswith("_s"))
    m = ", ".join(f"{k[:-6]} {format_bytes(v)}" for k, v in b.items() if k.endswith("_bytes"))
    return f"time: {t}; memory: {m}"
