"""``tensoropt.frontier(model, devices)``: the time/memory Pareto frontier of training plans.

The search, step by step, each in the module that holds it:

1. capture the model on meta tensors, at its batch and at any other (``capture.recapture``);
2. a cost model per mesh, from the device's figures or a measured profile (``pricing``);
3. every mesh and ZeRO stage: cost graph (``planner``), a job (``mesh_search``);
4. pipeline stages over the repeated blocks, a job per shape (``pipeline``); every job
   bounded, then solved on the step's peak fastest bound first, those the frontier found so
   far dominates skipped (``search_jobs``, ``engine.bounds``, ``peak_search``);
5. one frontier over all candidates on (time, peak), their plans built (``plan_builder``),
   the reference plans (``references``) -> :class:`~tensoropt.frontiers.Frontier`;

Fitted cost terms (``calibration``, ``cost_terms``) enter at step 2: every node and edge is
priced with them, so the frontier is exact for the calibrated model.

``devices="up to 64xA100-80GB"`` runs it per device count and merges the frontiers
(``scaling``).
"""

from __future__ import annotations

import operator
import time
import warnings
from dataclasses import replace
from functools import partial
from typing import Any, Sequence

import numpy as np

from .accumulation import accumulation_counts, accumulation_jobs_on
from .allocator import reserved_ratio
from .budget import InfeasibleBudget
from .cost_terms import CostTerms
from .capture.recapture import Recapture, capture_model
from .capture.signature import param_signature
from .engine.pareto import prune_rows
from .frontiers import Frontier
from .mesh import Cluster, parse_devices
from .engine import memguard
from .engine.memguard import memory_cap
from .mesh_search import mesh_cases, mesh_jobs, mesh_jobs_on, show_progress, zero_stages
from .opgraph import OpGraph
from .pipeline import pipeline_job, pipeline_jobs, pipeline_shapes
from .plan import Plan
from .plan_builder import PlanContext
from .recompute import check as check_policy
from .pricing import cost_models
from .references import reference_plans
from .scaling import ScalingFrontier, device_counts, parse_scaling
from .search_jobs import run_jobs
from .search_pool import can_fork, fork_map
from .search_options import MEMORY_ADVICE, Deadline, SearchOptions
from .setups import Setup, setup_plan
from .space import SearchSpace
from .training import TrainingConfig

__all__ = ["Frontier", "InfeasibleBudget", "SearchOptions", "frontier", "search", "unpriced_ops", "plan_for",
           "UnpricedOpsWarning"]


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
    epsilon_fallback: float | None = 0.01,
    max_mesh_dims: int = 3,
    coarse: bool | None = None,
    zero: bool = True,
    recompute: bool = True,
    recompute_policy: str = "full",
    pipeline: bool = True,
    accumulate: Sequence[int] = (),
    time_limit_s: float | None = None,
    progress: bool | None = None,
    references: bool = True,
    memory_limit: float | str | None = None,
    prune_meshes: bool = True,
    workers: int | None = None,
) -> "Frontier | ScalingFrontier":
    """The Pareto frontier of (per-iteration time, per-device peak memory) over training plans.

    ``model``: an ``nn.Module`` whose ``forward(*inputs)`` returns the loss (build it under
    ``torch.device("meta")`` to plan without allocating), or a zoo name such as ``"gpt2"``.
    ``devices``: ``"8xA100-80GB"``, ``"4x8xH100"``, ``"cpu:4"`` or a :class:`Cluster`;
    ``"up to 64xA100-80GB"`` searches 1, 2, 4, … 64 devices and returns a
    :class:`~tensoropt.scaling.ScalingFrontier` (the device count as a third objective).
    ``calibration``: cost terms fitted on measured runs (``scripts/validate.py`` on CPU steps,
    ``scripts/validate_published.py`` on published GPU runs; :class:`~tensoropt.cost_terms.CostTerms`)
    that price every operator and edge during the search: achieved-efficiency scales,
    per-collective and per-operator overheads, the optimizer step, a fixed cost per step.
    The other keywords are :class:`~tensoropt.search_options.SearchOptions`' fields:
    ``precision`` (``"bf16-mixed"``, the default on GPUs, or ``"fp32"``, on CPU), ``optimizer``,
    ``profile`` (a measured profile, ``tensoropt profile``, to price compute and collectives
    with), ``epsilon > 0`` (a (1+ε)-approximate frontier), ``epsilon_fallback`` (the ε of a
    second solve of a mesh or pipeline shape whose exact solve passed the memory cap or half
    the time left, instead of an error: those plans are (1+ε)-approximate, and
    ``stats["approximated"]`` lists the jobs; None turns it off), ``max_mesh_dims``, ``coarse`` (the
    coarse plan space of ``tensoropt.space``: only the outermost mesh axis crosses nodes and it
    splits only the batch, repeated blocks tied in 8 groups; None turns it on above 64
    devices; ``stats["search_space"]`` says which space was searched), ``zero`` (ZeRO stages 2
    and 3 on the data-parallel axes; stage 1 moves the same bytes as stage 2 and keeps more, so
    it never reaches the frontier), ``recompute`` (activation recomputation per repeated block),
    ``recompute_policy`` (what a recomputed block keeps, ``tensoropt.recompute``: ``"full"``
    its input; ``"op"`` torchtitan's per-operator selective policy, also the outputs of its
    attention kernels and of every other linear), ``pipeline`` (pipeline stages over the repeated blocks, 1F1B), ``accumulate``
    (micro-batch counts, e.g. ``(2, 4)``, of gradient accumulation without pipeline stages to
    try on every mesh and ZeRO stage, ``tensoropt.accumulation``; none by default), ``time_limit_s``,
    ``progress``, ``references``, ``memory_limit`` (the resident memory the search may hold,
    e.g. ``"8GB"``; by default 80 % of what the machine has available: past it the search stops
    with :class:`~tensoropt.engine.memguard.SearchMemoryExceeded`, saying what to change) and
    ``prune_meshes`` (skip a mesh or pipeline shape whose lower bound the frontier found so far
    already dominates; the frontier is the same, ``stats["skipped"]`` counts them) and
    ``workers`` (processes that build and solve meshes and pipeline shapes at once, forked on
    Linux, one process elsewhere; None: every CPU this process may use, or one in a rank of an
    initialized ``torch.distributed`` group; the frontier is the same, and the memory limit
    holds over all of them together).

    Memory is the step's peak per device (``Plan.peak_memory_bytes``): what a device holds when
    the forward pass ends -- parameters, gradients, optimizer state and saved activations, a sum
    over operators and edges (``Plan.memory_bytes``) -- plus how far backward rises above it
    for a while (an operator's gradients during its backward, ZeRO-3's gathered parameters, a
    recomputed unit's second forward: a maximum, not a sum, which ``peakmodel`` defines;
    ``Plan.breakdown["transient_bytes"]``) and the input batch. Each mesh problem is searched on
    the peak where that search stays within its limits, else on the end-of-forward sum
    (``peak_search``); the per-mesh, per-ZeRO-stage and pipeline frontiers are merged on the
    peak, so no returned plan is dominated in (time, peak).
    """
    options = SearchOptions(precision=precision, optimizer=optimizer, profile=profile, calibration=calibration,
                            epsilon=epsilon, epsilon_fallback=epsilon_fallback,
                            max_mesh_dims=max_mesh_dims, coarse=coarse, zero=zero, recompute=recompute,
                            recompute_policy=check_policy(recompute_policy), pipeline=pipeline,
                            accumulate=_counts(accumulate), time_limit_s=time_limit_s, progress=progress, references=references,
                            memory_limit=memory_limit, prune_meshes=prune_meshes, workers=workers)
    options.fallback()                       # a bad epsilon_fallback fails before capture
    start = time.monotonic()
    graph, module, recapture = capture_model(model, inputs, batch_size)
    warn_unpriced(graph)
    scaling = parse_scaling(devices)
    if scaling is None:
        return search(graph, param_signature(module), recapture, devices, options, start)
    n_max, device = scaling
    per_count = {n: search(graph, param_signature(module), recapture, f"{n}x{device}", options, start)
                 for n in device_counts(n_max)}
    return ScalingFrontier.merge(graph.name, device, per_count)


def plan_for(model: Any, devices: str | Cluster = "8xA100-80GB", inputs: Sequence[Any] | None = None, *,
             tp: int = 1, pp: int = 1, dp: int | None = None, microbatches: int = 1, recompute: str = "none",
             zero: int = 0, sequence_parallel: bool = False, batch_size: int | None = None,
             precision: str | None = None, optimizer: str = "adam", profile: str | None = None,
             calibration: str | None = None, label: str = "yours") -> Plan:
    """The plan a user already runs, priced by the frontier's cost model, to compare with it
    (``Frontier.plot(yours=plan)``). ``tp``, ``pp``, ``dp``, ``microbatches`` (per step),
    ``recompute`` ("none", "selective", "full" or "op"), ``zero`` (stage over dp) and
    ``sequence_parallel``: see :class:`tensoropt.setups.Setup`; ``model``, ``devices``,
    ``inputs``, ``batch_size`` (the global batch), ``precision``, ``optimizer``, ``profile``
    and ``calibration`` as for :func:`frontier`."""
    setup = Setup(tp=tp, pp=pp, dp=dp, microbatches=microbatches, recompute=recompute, zero=zero,
                  sequence_parallel=sequence_parallel)
    cluster = parse_devices(devices)
    setup.degrees(cluster.world_size)
    graph, module, recapture = capture_model(model, inputs, batch_size)
    warn_unpriced(graph)
    training = _training(SearchOptions(precision=precision, optimizer=optimizer), cluster)
    label_devices = devices if isinstance(devices, str) else str(cluster)
    terms = CostTerms.load(calibration) if calibration else CostTerms()
    ctx = PlanContext(graph, training, param_signature(module), 0.0, label_devices)
    return setup_plan(ctx, recapture, cluster, setup, cost_models(cluster, training, profile, terms), label=label)


def _counts(accumulate: Sequence[int]) -> tuple[int, ...]:
    out, bad = [], []
    for m in accumulate:
        try:
            v = operator.index(m)
        except TypeError:
            v = None
        (bad if v is None or isinstance(m, bool) or v < 1 else out).append(m if v is None else v)
    if bad:
        raise ValueError(f"accumulate takes micro-batch counts (positive integers, e.g. (2, 4)), got {bad}")
    return tuple(out)


def _training(options: SearchOptions, cluster: Cluster) -> TrainingConfig:
    precision = options.precision
    if precision is None:
        precision = "fp32" if cluster.device.placeholder else "bf16-mixed"
    return TrainingConfig(precision, options.optimizer)


def search(graph: OpGraph, signature: str, recapture: Recapture | None, devices: str | Cluster,
           options: SearchOptions, start: float | None = None) -> Frontier:
    """The frontier of a captured model on one device set (``recapture``: the model at other
    batch sizes, for pipeline plans; ``start``: when the time limit began to run)."""
    cluster = parse_devices(devices)
    label = devices if isinstance(devices, str) else str(cluster)
    space = SearchSpace.for_cluster(cluster, options.max_mesh_dims, options.coarse)
    training = _training(options, cluster)
    terms = CostTerms.load(options.calibration) if options.calibration else CostTerms()
    cost_for = cost_models(cluster, training, options.profile, terms)
    deadline = Deadline(options.time_limit_s, f"{graph.name} on {devices}", start)
    ctx = PlanContext(graph, training, signature, options.epsilon, label)

    # micro-batch counts of gradient accumulation that divide the batch (the model is captured at each)
    counts = accumulation_counts(graph.batch_size, options.accumulate) if recapture is not None else []
    # (workers need no advice: where they pass the cap together, they run fewer at once)
    with memory_cap(options.memory_cap_bytes(), MEMORY_ADVICE):
        problems, candidates, job_stats = _solve_jobs(ctx, recapture, cluster, space, cost_for, options, counts,
                                                      deadline)
    # one frontier over the step's peak: each candidate's, as its plan will state it
    pts = np.array([(c.time_s, c.peak_bytes) for c in candidates])
    _, _, src = prune_rows(pts[None, :, 0], pts[None, :, 1])
    plans = [candidates[int(s)].build() for s in src[0] if s >= 0]
    refs = reference_plans(ctx, problems, cluster.per_node) if options.references else {}
    stats = {"search_s": deadline.elapsed_s(), "meshes": sorted({str(p.mesh) for p in problems}),
             "operators": len(graph.operators), "candidates": len(candidates), **job_stats,
             "search_space": space.describe(), "peak_search": dict(ctx.peak_searches),
             "unsupported_ops": list(graph.unsupported), "unpriced_ops": unpriced_ops(graph),
             "accumulate": counts,
             "calibration": options.calibration}
    return Frontier(graph.name, label, plans, refs, float(cluster.device.memory_bytes), stats,
                    reserved_ratio=reserved_ratio(cluster.device))


def _solve_jobs(ctx: PlanContext, recapture: Recapture | None, cluster: Cluster, space: SearchSpace, cost_for,
                options: SearchOptions, counts: Sequence[int], deadline: Deadline):
    """Every mesh problem and pipeline shape, and every mesh at each of ``counts``
    accumulated micro-batches, as a job (``search_jobs``), bounded, then solved fastest bound
    first; one progress bar over both phases."""
    shapes = pipeline_shapes(ctx.graph, cluster, space) if options.pipeline and recapture is not None else []
    accumulating = [(m, mesh) for m in counts for mesh in space.meshes(cluster)]
    n_jobs = (len(mesh_cases(cluster, space, options)) + len(shapes)
              + sum(len(zero_stages(mesh, options)) for _, mesh in accumulating))
    bar = None
    if show_progress(options.progress):
        from tqdm.auto import tqdm

        bar = tqdm(total=2 * n_jobs, desc=f"{ctx.graph.name} on {ctx.devices}", unit="job", leave=False)
    try:
        if bar is not None:
            bar.set_postfix_str("bounding")
        workers = options.worker_count()
        if workers > 1 and can_fork() and n_jobs > 1:
            problems, jobs = _built_in_workers(ctx, recapture, cluster, space, cost_for, options, shapes,
                                               accumulating, workers, bar)
        else:
            problems, jobs = mesh_jobs(ctx, cluster, space, cost_for, options, bar)
            memguard.check()
            if shapes:
                jobs += pipeline_jobs(ctx, recapture, cluster, space, cost_for, options, bar)
            for m, mesh in accumulating:
                built = accumulation_jobs_on(replace(ctx, graph=recapture(ctx.graph.batch_size // m)), ctx.graph,
                                             cluster, space, cost_for, options, m, mesh)
                jobs += built
                if bar is not None:
                    bar.update(len(built))
        candidates, stats = run_jobs(jobs, deadline, bar, prune=options.prune_meshes, workers=workers,
                                     fallback=options.fallback())
    finally:
        if bar is not None:
            bar.close()
    return problems, candidates, stats


def _built_in_workers(ctx: PlanContext, recapture: Recapture | None, cluster: Cluster, space: SearchSpace,
                      cost_for, options: SearchOptions, shapes, accumulating, workers: int, bar):
    """What ``mesh_jobs``, ``pipeline_jobs`` and the accumulation jobs build, in the same
    order, built in forked workers (``search_pool.fork_map``). The first workers capture the
    model at the micro-batch sizes that need a capture of their own (``Recapture.captures_for``:
    each takes as long as the first capture, so they start first and side by side) and build
    the meshes' jobs, which need the model at its own batch only; the other micro-batch sizes
    are interpolated here, and the pipeline and accumulation jobs are built by workers forked
    after. Where this process has initialised CUDA, the captures run here while the workers
    build (``Recapture.runs_forked``)."""
    mb_ctx = {}
    counts = [m for _, m, _ in shapes] + [m for m, _ in accumulating]
    in_workers = bool(counts) and recapture.runs_forked()
    captured = recapture.captures_for([ctx.graph.batch_size // m for m in counts]) if in_workers else []

    def capture_micro_batches() -> None:
        for m in counts:
            if m not in mb_ctx:
                mb_ctx[m] = replace(ctx, graph=recapture(ctx.graph.batch_size // m))
        memguard.check()

    def done(result) -> None:
        if bar is not None and not isinstance(result, OpGraph):
            bar.update(len(result[1]) if isinstance(result, tuple) else len(result) if isinstance(result, list) else 1)
    meshes = [partial(mesh_jobs_on, ctx, cluster, space, cost_for, options, mesh) for mesh in space.meshes(cluster)]
    built = fork_map([partial(recapture.capture_at, b) for b in captured] + meshes, workers, done,
                     meanwhile=None if in_workers else capture_micro_batches)
    for b, graph in zip(captured, built):
        recapture.add(b, graph)
    built = built[len(captured):]
    capture_micro_batches()
    calls = [partial(pipeline_job, mb_ctx[m], cluster, space, cost_for, options, p, m, mesh) for p, m, mesh in shapes]
    calls += [partial(accumulation_jobs_on, mb_ctx[m], ctx.graph, cluster, space, cost_for, options, m, mesh)
              for m, mesh in accumulating]
    if calls:
        built += fork_map(calls, workers, done)
    problems, jobs = [], []
    for result in built:
        if isinstance(result, tuple):
            problems += result[0]
            jobs += result[1]
        elif isinstance(result, list):
            jobs += result
        else:
            jobs.append(result)
    return problems, jobs


class UnpricedOpsWarning(UserWarning):
    """The model has operators capture has no rule for: the times they cost are estimates."""


def warn_unpriced(graph: OpGraph) -> None:
    """Warn, once per call, where ``graph`` holds operators without a pricing rule
    (:func:`unpriced_ops`): a plan's time leaves out what they really cost, which for a
    mixture of experts' routed matmuls can be most of the step."""
    ops = unpriced_ops(graph)
    if not ops:
        return
    aten = sorted({a for u in ops for a in u["aten"]})
    names = ", ".join(u["operator"] for u in ops[:3]) + (f" and {len(ops) - 3} more" if len(ops) > 3 else "")
    warnings.warn(f"{graph.name}: {len(ops)} operators have no pricing rule ({', '.join(aten)}): {names}. "
                  "They are kept replicated on every device and priced by a per-element estimate, so every "
                  "plan's time leaves out what they really cost; stats['unpriced_ops'] lists their FLOPs "
                  "and bytes", UnpricedOpsWarning, stacklevel=3)


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
