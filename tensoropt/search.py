"""``tensoropt.frontier(model, devices)``: the time/memory Pareto frontier of training plans.

Flow: capture the model (meta tensors) → for every mesh over the devices build the cost
graph (``planner``) and solve it (``engine``) → merge the per-mesh frontiers into one →
:class:`Frontier` of :class:`~tensoropt.plan.Plan` objects, plus reference plans (data
parallel, Megatron-style tensor parallel) priced by the same cost model.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .costmodel import CostModel, TrainingConfig
from .engine import SolveTimeout, solve
from .engine.pareto import prune_rows
from .mesh import Cluster, Mesh, parse_devices
from .opgraph import OpGraph
from .placement import format_placements
from .plan import OpChoice, Plan
from .planner import (MeshProblem, build_problem, peak_bytes, replicate_held_bytes, returned_ops, step_input_bytes,
                      transient_bytes)
from .space import SearchSpace, distinct_meshes
from .scaling import ScalingFrontier, device_counts, parse_scaling
from .strategy import label_sizes, term_placements
from .units import format_bytes, parse_bytes

__all__ = ["Frontier", "InfeasibleBudget", "frontier", "plan_from_assignment", "distinct_meshes"]


class InfeasibleBudget(ValueError):
    """No plan fits the memory budget."""


@dataclass
class Frontier:
    """Pareto-optimal plans sorted by time ascending (memory strictly descending)."""
    model: str
    devices: str
    plans: list[Plan]
    reference: dict[str, Plan] = field(default_factory=dict)
    device_memory_bytes: float = float("inf")
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.plans)

    def __iter__(self):
        return iter(self.plans)

    def __getitem__(self, i: int) -> Plan:
        return self.plans[i]

    @property
    def times_s(self) -> np.ndarray:
        return np.array([p.time_s for p in self.plans])

    @property
    def memories_bytes(self) -> np.ndarray:
        """Each plan's peak memory per device (``Plan.peak_memory_bytes``), the frontier's axis."""
        return np.array([p.peak_memory_bytes for p in self.plans])

    def min_time(self) -> Plan:
        return self.plans[0]

    def min_memory(self) -> Plan:
        return self.plans[-1]

    def best(self, memory_budget: int | float | str | None = None) -> Plan:
        """The fastest plan whose per-device peak memory (``Plan.peak_memory_bytes``: resident
        state, saved activations and the backward pass's rise) fits ``memory_budget`` (bytes or
        "40GB"); by default the device's own memory."""
        budget = self.device_memory_bytes if memory_budget is None else _budget_bytes(memory_budget)
        fits = [p for p in self.plans if p.peak_memory_bytes <= budget]
        if not fits:
            least = min(self.plans, key=lambda p: p.peak_memory_bytes)
            raise InfeasibleBudget(
                f"no plan for {self.model} on {self.devices} fits {format_bytes(budget)} per device; "
                f"the minimum achievable peak is {format_bytes(least.peak_memory_bytes)} "
                f"({least.peak_memory_bytes:.0f} bytes, plan {least.summary} on mesh {least.mesh}). "
                "Raise the budget, add devices, or lower the batch size.")
        return fits[0]

    def to_pandas(self):
        import pandas as pd

        rows = []
        for p in self.plans:
            rows.append(_row(p, self.device_memory_bytes))
        return pd.DataFrame(rows)

    def references_to_pandas(self):
        import pandas as pd

        return pd.DataFrame([dict(_row(p, self.device_memory_bytes), label=name)
                             for name, p in self.reference.items()])

    def plot(self, ax=None, memory_budget=None, **kw):
        """The trade-off curve with reference plans marked (matplotlib Axes)."""
        from .plots import plot_frontier

        return plot_frontier(self, ax=ax, memory_budget=memory_budget, **kw)

    def __repr__(self) -> str:
        return (f"Frontier({self.model} on {self.devices}: {len(self.plans)} plans, "
                f"{self.plans[0].time_s * 1e3:.3f}..{self.plans[-1].time_s * 1e3:.3f} ms, "
                f"{format_bytes(self.plans[0].peak_memory_bytes)}..{format_bytes(self.plans[-1].peak_memory_bytes)} "
                "peak per device)")


def _budget_bytes(budget: int | float | str) -> float:
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        if not (budget > 0 and np.isfinite(budget)):
            raise ValueError(f"memory budget must be a positive number of bytes, got {budget!r}")
        return float(budget)                 # plan memories may be fractional: no rounding
    return float(parse_bytes(budget))


def _row(p: Plan, device_memory: float) -> dict:
    """One table row: memory is the step's peak per device; ``forward_end_bytes`` is what the
    device holds when the forward pass ends (state and saved activations, ``Plan.memory_bytes``)."""
    b = p.breakdown
    return {
        "time_s": p.time_s,
        "memory_bytes": p.peak_memory_bytes,
        "time_ms": p.time_s * 1e3,
        "memory_gib": p.peak_memory_bytes / 2**30,
        "forward_end_bytes": p.memory_bytes,
        "forward_end_gib": p.memory_bytes / 2**30,
        "mesh": p.mesh,
        "summary": p.summary,
        "fits_device": p.peak_memory_bytes <= device_memory,
        **{k: v for k, v in b.items()},
    }


# ---------------------------------------------------------------------------------- search


def frontier(
    model: Any,
    devices: str | Cluster = "8xA100-80GB",
    inputs: Sequence[Any] | None = None,
    *,
    batch_size: int | None = None,
    precision: str | None = None,
    optimizer: str = "adam",
    profile: str | None = None,
    calibration: str | None = None,
    epsilon: float = 0.0,
    max_mesh_dims: int = 3,
    coarse: bool | None = None,
    zero: bool = True,
    recompute: bool = True,
    pipeline: bool = True,
    time_limit_s: float | None = None,
    progress: bool | None = None,
    references: bool = True,
) -> "Frontier | ScalingFrontier":
    """The Pareto frontier of (per-iteration time, per-device peak memory) over training plans.

    ``model``: an ``nn.Module`` whose ``forward(*inputs)`` returns the loss (build it under
    ``torch.device("meta")`` to plan without allocating), or a zoo name such as ``"gpt2"``.
    ``devices``: ``"8xA100-80GB"``, ``"4x8xH100"``, ``"cpu:4"`` or a :class:`Cluster`;
    ``"up to 64xA100-80GB"`` searches 1, 2, 4, … 64 devices and returns a
    :class:`~tensoropt.scaling.ScalingFrontier` (the device count as a third objective).
    ``precision``: ``"bf16-mixed"`` (default on GPUs) or ``"fp32"`` (default on CPU).
    ``profile``: path of a measured profile (``tensoropt profile``) to price compute and
    collectives with. ``calibration``: a whole-step calibration fitted on measured runs
    (``scripts/validate.py``) that re-prices the frontier's plans afterwards (compute scale,
    per-collective and per-operator overheads, fixed cost per step) and keeps the Pareto-optimal
    ones; plans pruned during the search are not revisited, so this is an approximation
    (``breakdown["model_time_s"]`` keeps each plan's uncalibrated time).
    ``epsilon > 0``: a (1+ε)-approximate frontier (see ``engine.solve``).
    ``coarse``: search the coarse plan space of ``tensoropt.space`` (only the outermost mesh
    axis crosses nodes and it splits only the batch; repeated blocks tied in 8 groups);
    None turns it on above 64 devices. ``stats["search_space"]`` says which space was searched.
    ``zero``: also search ZeRO stages 2 and 3 on the data-parallel axes (stage 1 moves the same
    bytes as stage 2 and keeps more, so it never reaches the frontier in this cost model).
    ``recompute``: activation recomputation per ``layers.<i>`` module as a searched choice.
    ``pipeline``: also search pipeline stages over the repeated blocks (1F1B; see ``pipeline``).

    Memory is the step's peak per device (``Plan.peak_memory_bytes``): what a device holds when
    the forward pass ends -- parameters, gradients, optimizer state and saved activations, a sum
    over operators and edges (``Plan.memory_bytes``) -- plus how far backward rises above it
    for a while (an operator's gradients during its backward, ZeRO-3's gathered parameters, a
    recomputed unit's second forward: a maximum, not a sum; ``planner.transient_bytes``) and
    the input batch. Each mesh's engine search is on the sum; the per-mesh, per-ZeRO-stage and
    pipeline frontiers are merged on the peak, so no returned plan is dominated in (time, peak).
    """
    start = time.monotonic()
    scaling = parse_scaling(devices)
    if scaling is not None:
        n_max, device = scaling
        graph, module, recapture = _capture(model, inputs, batch_size)
        per_count = {}
        for n in device_counts(n_max):
            per_count[n] = _search(graph, module, recapture if pipeline else None, f"{n}x{device}", precision,
                                   optimizer, profile, epsilon, max_mesh_dims, coarse, zero, recompute, time_limit_s,
                                   progress, references, start)
        if calibration is not None:
            per_count = {n: _calibrate(f, calibration, graph) for n, f in per_count.items()}
        return ScalingFrontier.merge(graph.name, device, per_count)
    graph, module, recapture = _capture(model, inputs, batch_size)
    f = _search(graph, module, recapture if pipeline else None, devices, precision, optimizer, profile,
                epsilon, max_mesh_dims, coarse, zero, recompute, time_limit_s, progress, references, start)
    return f if calibration is None else _calibrate(f, calibration, graph)


def _calibrate(f: Frontier, path: str, graph: OpGraph) -> Frontier:
    """Re-price a frontier with a whole-step calibration (see ``frontier``)."""
    from dataclasses import replace as _replace

    from .validate.fit import StepCalibration, calibrated_frontier, step_features

    try:
        cal = StepCalibration.load(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no calibration at {path}; fit one with scripts/validate.py") from None

    def priced(p: Plan, t: float) -> Plan:
        return _replace(p, time_s=float(t), breakdown={**p.breakdown, "model_time_s": p.time_s})

    plans = [priced(p, t) for p, t in calibrated_frontier(f.plans, cal, graph)]
    refs = {k: priced(p, cal.predict(step_features(p, graph))) for k, p in f.reference.items()}
    return Frontier(f.model, f.devices, plans, refs, f.device_memory_bytes, {**f.stats, "calibration": path})


def _search(graph, module, recapture, devices, precision, optimizer, profile, epsilon, max_mesh_dims, coarse,
            zero, recompute, time_limit_s, progress, references, start) -> Frontier:
    cluster = parse_devices(devices)
    space = SearchSpace.for_cluster(cluster, max_mesh_dims, coarse)
    if precision is None:
        precision = "fp32" if cluster.device.placeholder else "bf16-mixed"
    cost_for = _cost_models(cluster, TrainingConfig(precision, optimizer), profile)
    meshes = space.meshes(cluster)
    signature = _param_signature(module)
    plans: list[Plan] = []
    problems: list[MeshProblem] = []
    points, peaks, owners_ = [], [], []
    cases = [(mesh, z) for mesh in meshes for z in ((0, 2, 3) if zero and mesh.size > 1 else (0,))]
    if _show(progress):
        from tqdm.auto import tqdm

        bar = tqdm(cases, desc="meshes", leave=False)
    else:
        bar = None
    for mesh, z in (bar if bar is not None else cases):
        if bar is not None:
            bar.set_postfix_str(f"{mesh} zero {z}")
        problem = build_problem(graph, mesh, cost_for(mesh), zero_stage=z, recompute=recompute,
                                batch_only_axes=space.batch_only_axes(mesh, cluster))
        remaining = None if time_limit_s is None else max(time_limit_s - (time.monotonic() - start), 1e-3)
        with _overall_limit(graph, devices, time_limit_s, start, f"mesh {mesh}, ZeRO stage {z}"):
            result = solve(problem.cost_graph, epsilon=epsilon, time_limit_s=remaining, progress=progress,
                           block_groups=space.block_groups)
        problems.append(problem)
        if len(result.points):
            peaks.extend(peak_bytes(problem, graph, result.assignments, result.points[:, 1]))
        for pt, a in zip(result.points, result.assignments):
            points.append(pt)
            owners_.append((len(problems) - 1, a))
    label = devices if isinstance(devices, str) else str(cluster)
    ready = []
    if recapture is not None and graph.blocks and cluster.world_size > 1:
        from .pipeline import microbatch_counts, pipeline_candidates, stage_counts

        for p in stage_counts(len(graph.blocks), cluster.world_size):
            for m in microbatch_counts(graph.batch_size, p):
                remaining = None if time_limit_s is None else max(time_limit_s - (time.monotonic() - start), 1e-3)
                with _overall_limit(graph, devices, time_limit_s, start, f"{p} pipeline stages, {m} micro-batches"):
                    ready += pipeline_candidates(recapture(graph.batch_size // m), cluster, p, m, cost_for,
                                                 TrainingConfig(precision, optimizer), signature, label, epsilon,
                                                 space, recompute, remaining)
    # the frontier is over the step's peak: each candidate's, as its plan will state it
    pts = np.array([(pt[0], pk) for pt, pk in zip(points, peaks)] + [(c.time_s, c.peak_bytes) for c in ready])
    _, _, src = prune_rows(pts[None, :, 0], pts[None, :, 1])
    keep = [int(s) for s in src[0] if s >= 0]
    ctx = _Context(graph, cluster, cost_for(meshes[0]), signature, epsilon, label)
    for s in keep:
        if s >= len(points):
            plans.append(ready[s - len(points)].build())
            continue
        m, a = owners_[s]
        plans.append(plan_from_assignment(ctx, problems[m], a))
    refs = _reference_plans(ctx, problems) if references else {}
    stats = {"search_s": time.monotonic() - start, "meshes": sorted({str(p.mesh) for p in problems}),
             "operators": len(graph.operators), "candidates": len(points),
             "search_space": space.describe(),
             "unsupported_ops": list(graph.unsupported), "unpriced_ops": unpriced_ops(graph)}
    return Frontier(graph.name, ctx.devices, plans, refs, float(cluster.device.memory_bytes), stats)


def unpriced_ops(graph: OpGraph) -> list[dict]:
    """Operators capture has no rule for (family "other"): kept replicated on every device and
    priced by a per-element estimate only. Their FLOPs and bytes say how much that can matter."""
    out = []
    for op in graph.operators:
        if op.family == "other":
            out.append({"operator": op.name, "aten": list(op.aten), "module": op.module,
                        "flops_fwd": op.flops_fwd, "flops_bwd": op.flops_bwd,
                        "operand_bytes": sum(t.nbytes for t in op.operands), "output_bytes": op.output.nbytes})
    return out


@contextmanager
def _overall_limit(graph, devices, time_limit_s, start, what: str):
    """A solve's timeout restated for the whole search (its own limit is what was left)."""
    try:
        yield
    except SolveTimeout as err:
        raise SolveTimeout(
            f"the frontier search of {graph.name} on {devices} stopped after {time.monotonic() - start:.1f} s "
            f"of time_limit_s={time_limit_s}, while solving {what} (at {str(err).split(' at ', 1)[-1].split('. ')[0]})."
            " Raise time_limit_s, pass epsilon > 0, "
            "search fewer meshes (max_mesh_dims) or the coarse space (coarse=True).") from None


def _show(progress: bool | None) -> bool:
    import sys

    return progress if progress is not None else sys.stderr.isatty()


def _capture(model, inputs, batch_size):
    """(graph, module, recapture): ``recapture(b)`` captures the same model at batch ``b``."""
    import torch

    from .capture import capture
    from .capture.inputs import rebatch, split_inputs

    if isinstance(model, str):
        from .models import example_inputs, get_model

        name = model
        given = inputs is not None
        args, kwargs = split_inputs(inputs) if given else (tuple(example_inputs(name, batch_size)), {})
        module = get_model(name)
        graph = capture(module, args, kwargs=kwargs, name=name)
        # other batch sizes keep given inputs' other dims (sequence length)
        inputs_at = (lambda b: rebatch(args, kwargs, graph.batch_size, b)) if given else \
            (lambda b: (tuple(example_inputs(name, b)), {}))
        return graph, module, _Recapture(graph, lambda b: capture(module, inputs_at(b)[0], kwargs=inputs_at(b)[1],
                                                                  name=name))
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be an nn.Module or a zoo model name, got {type(model).__name__}")
    if inputs is None:
        raise ValueError("pass example inputs: tensoropt.frontier(model, devices, inputs=(x, ...)) or, for "
                         "keyword inputs, inputs={'input_ids': ids, 'labels': ids}; meta tensors are fine "
                         "(torch.empty(shape, device='meta'))")
    if batch_size is not None:
        raise ValueError("batch_size applies to zoo model names; for a module, size the example inputs")
    args, kwargs = split_inputs(inputs)
    graph = capture(model, args, kwargs=kwargs)

    def at(b):
        a, k = rebatch(args, kwargs, graph.batch_size, b)
        return capture(model, a, kwargs=k)
    return graph, model, _Recapture(graph, at)


class _Recapture:
    """``self(b)``: the model's graph at batch ``b``; after one capture at another batch the
    rest come from ``capture.rebatch`` when the two captures allow it."""

    def __init__(self, graph: OpGraph, capture_at):
        self.graphs = {graph.batch_size: graph}
        self.capture_at = capture_at
        self.at = None
        self.tried = False

    def __call__(self, b: int) -> OpGraph:
        if b not in self.graphs:
            g = self.at(b) if self.at is not None else None
            if g is None:
                g = self.capture_at(b)
                if not self.tried:
                    from .capture.rebatch import interpolator

                    self.tried = True
                    self.at = interpolator(next(iter(self.graphs.values())), g)
            self.graphs[b] = g
        return self.graphs[b]


def _param_signature(module) -> str:
    from .apply._validate import param_signature

    return param_signature(module)


def _cost_models(cluster: Cluster, training: TrainingConfig, profile: str | None):
    """mesh -> CostModel. A measured profile replaces the device's peak figures, the compute
    curves and, per mesh, the collectives' α and B (the fit of the mesh's group size where
    all its axes have one measured size, else the joint fit over group sizes)."""
    if profile is None:
        model = CostModel(cluster.device, training=training)
        return lambda mesh: model
    from .profile import Profile

    prof = Profile.load(profile)
    device = prof.device(cluster.device)
    compute = prof.compute_model()

    def for_mesh(mesh: Mesh) -> CostModel:
        sizes = set(mesh.shape)
        group = sizes.pop() if len(sizes) == 1 else None
        links = {link.name for link in mesh.links}
        if len(links) != 1:
            raise ValueError(f"profile {profile} measured one link; mesh {mesh} spans several "
                             f"({sorted(links)}): profiles are for single-node device sets")
        try:
            collectives = prof.collective_model(mesh.links[0], group_size=group)
        except ValueError:
            collectives = prof.collective_model(mesh.links[0])
        return CostModel(device, compute, collectives, training)

    return for_mesh


# ---------------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class _Context:
    graph: OpGraph
    cluster: Cluster
    cost_model: CostModel
    param_signature: str
    epsilon: float
    devices: str


def plan_from_assignment(ctx: _Context, problem: MeshProblem, assignment: Sequence[int], label: str = "",
                         microbatches: int = 1) -> Plan:
    """Price one assignment (configuration index per operator) into a :class:`Plan`."""
    graph, mesh = ctx.graph, problem.mesh
    n_ops = len(graph.operators)
    a = [int(x) for x in assignment]
    if len(a) == n_ops:                        # operators only: keep every unit's activations
        a += [0] * len(problem.units)
    relayout = np.zeros(n_ops)
    for (u, v), table in problem.cost_graph.edge_costs.items():
        if u < n_ops:
            relayout[v] += table[a[u], a[v], 0]
    for i, times in (problem.tied_s or {}).items():
        relayout[i] += times[a[i]]
    recomputed_ops: set[int] = set()
    recomputed, kept_inputs = [], 0.0
    for k, (name, unit_ops) in enumerate(problem.units):
        if a[problem.recompute_node(k)] == 1:
            recomputed.append(name)
            recomputed_ops.update(unit_ops)
            kept_inputs += problem.activation_factor * problem.unit_input_bytes[k][a[unit_ops[0]]]
    kept = returned_ops(graph, problem.accumulates)
    ops, totals = [], dict(compute_s=0.0, recompute_s=0.0, comm_s=0.0, relayout_s=0.0, param_bytes=0.0,
                           grad_bytes=0.0, optimizer_bytes=0.0, activation_bytes=kept_inputs)
    for i, op in enumerate(graph.operators):
        cfg = problem.configs[i][a[i]]
        cost = problem.node_costs[i][a[i]]
        terms, out = op.terms
        contracted = "".join(c for t in terms for c in t if c not in out)
        again = i in recomputed_ops
        act = 0.0 if again else problem.activation_factor * cost.activation_bytes
        act += cost.output_bytes if i in kept else 0.0
        ops.append(OpChoice(op.name, op.module, op.family, str(cfg), format_placements(term_placements(cfg, out, contracted)),
                            cost.compute_s + (cost.forward_s if again else 0.0), cost.comm_s, float(relayout[i]),
                            cost.param_bytes + cost.grad_bytes + cost.optimizer_bytes, act))
        totals["compute_s"] += cost.compute_s
        totals["recompute_s"] += cost.forward_s if again else 0.0
        totals["comm_s"] += cost.comm_s
        totals["param_bytes"] += cost.param_bytes
        totals["grad_bytes"] += cost.grad_bytes
        totals["optimizer_bytes"] += cost.optimizer_bytes
        totals["activation_bytes"] += act
    totals["relayout_s"] = float(relayout.sum())
    t, m = problem.cost_graph.cost(a)
    totals["transient_bytes"] = float(transient_bytes(problem, a, replicate_held_bytes(problem, graph, a))[0])
    totals["input_bytes"] = step_input_bytes(problem, graph, a, microbatches)
    tr = ctx.cost_model.training
    summary = summarize(graph, problem, a)
    if problem.zero_stage:
        summary += f" zero{problem.zero_stage}"
    if recomputed:
        summary += f" rc{len(recomputed)}/{len(problem.units)}"
    return Plan(graph.name, ctx.devices, mesh.shape, tuple(link.name for link in mesh.links), float(t), float(m),
                summary, tuple(ops), totals,
                {"precision": tr.precision, "optimizer": tr.optimizer, "batch_size": graph.batch_size},
                ctx.param_signature, label, ctx.epsilon, problem.zero_stage, tuple(recomputed),
                inputs=graph.inputs)


def summarize(graph: OpGraph, problem: MeshProblem, assignment: Sequence[int]) -> str:
    """Per mesh axis its role: ``dp`` when every batched operator splits the batch over it,
    ``tp`` when weight-carrying operators split weights over it, ``rep`` when nothing is
    split, else ``mix``; e.g. ``dp2·tp4``."""
    parts = []
    n_ops = len(graph.operators)
    for axis, size in enumerate(problem.mesh.shape):
        splits = [problem.configs[i][a].splits[axis] for i, a in enumerate(assignment[:n_ops])]
        batched = [s for op, s in zip(graph.operators, splits) if "b" in label_sizes(op)]
        weighted = [s for op, s in zip(graph.operators, splits)
                    if op.family in ("linear", "conv", "embedding") and any(p is not None for p in op.param_names)]
        if all(s is None for s in splits):
            role = "rep"
        elif batched and all(s == "b" for s in batched):
            role = "dp"
        elif weighted and sum(s not in (None, "b") for s in weighted) * 2 >= len(weighted):
            role = "tp"
        elif batched and sum(s == "b" for s in batched) * 2 >= len(batched):
            role = "dp~"
        else:
            role = "mix"
        parts.append(f"{role}{size}")
    return "·".join(parts)


# ---------------------------------------------------------------------------------- references

_COLUMN = ("q_proj", "k_proj", "v_proj", "fc1", "gate_proj", "up_proj", "query", "key", "value", "c_fc")
_ROW = ("o_proj", "fc2", "down_proj", "out_proj", "c_proj")


def _megatron_choice(op, cfg_splits_axis: str | None) -> bool:
    """Whether an operator's split on the tensor-parallel axis is Megatron's."""
    leaf = op.module.rsplit(".", 1)[-1]
    if op.family == "linear":
        if leaf in _COLUMN:
            return cfg_splits_axis == "n"
        if leaf in _ROW:
            return cfg_splits_axis == "k"
        return cfg_splits_axis is None
    if op.family == "attention":
        return cfg_splits_axis == "n"
    return True


def _reference_plans(ctx: _Context, problems: list[MeshProblem]) -> dict[str, Plan]:
    refs: dict[str, Plan] = {}
    graph = ctx.graph
    for problem in problems:
        mesh = problem.mesh
        if problem.zero_stage != 0:
            continue
        if mesh.ndim == 1:
            a = []
            for i, op in enumerate(graph.operators):
                cfgs = problem.configs[i]
                want = [j for j, c in enumerate(cfgs) if c.splits == ("b",)]
                a.append(want[0] if want else 0)
            refs["data parallel"] = plan_from_assignment(ctx, problem, a, "data parallel")
        # Megatron keeps tensor parallelism inside a node
        if mesh.ndim <= 2 and mesh.shape[-1] <= ctx.cluster.per_node:
            tp_axis = mesh.ndim - 1
            allowed = []
            for i, op in enumerate(graph.operators):
                ok = []
                for j, c in enumerate(problem.configs[i]):
                    dp_ok = mesh.ndim == 1 or c.splits[0] == ("b" if _has_b(problem, i) else None)
                    if dp_ok and _megatron_choice(op, c.splits[tp_axis]):
                        ok.append(j)
                allowed.append(ok or [0])
            a = _restricted_min_time(problem, allowed + _keep_all(problem))
            dp = mesh.shape[0] if mesh.ndim == 2 else 1
            name = f"megatron dp{dp}·tp{mesh.shape[tp_axis]}"
            refs[name] = plan_from_assignment(ctx, problem, a, name)
    return refs


def _has_b(problem: MeshProblem, i: int) -> bool:
    return any(c.splits[0] == "b" for c in problem.configs[i])


def _restricted_min_time(problem: MeshProblem, allowed: list[list[int]]) -> list[int]:
    from .engine import CostGraph

    cg = problem.cost_graph
    nodes = [(n, c[idx]) for n, c, idx in zip(cg.names, cg.node_costs, allowed)]
    edges = [(u, v, t[np.ix_(allowed[u], allowed[v])]) for (u, v), t in cg.edge_costs.items()]
    sub = CostGraph.build(nodes, edges, blocks=cg.blocks)
    res = solve(sub)
    return [allowed[v][c] for v, c in enumerate(res.assignments[0])]


def _keep_all(problem: MeshProblem) -> list[list[int]]:
    return [[0]] * len(problem.units)
