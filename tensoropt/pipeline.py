"""Pipeline stages with replication (DAPPLE-style) inside the frontier.

The repeated blocks of the model are cut into ``p`` stages of equal runs, or of one block
more in the later stages (:func:`stage_blocks`; the first stage also holds what comes
before the blocks, the last what comes after); each stage runs on its own
sub-mesh of ``world / p`` devices with its own per-operator plan (data and tensor
parallelism inside the stage, searched by the same engine). The global batch is split
into ``m >= p`` micro-batches run with the 1F1B schedule:

* time  = (m + p − 1) · (slowest stage's time per micro-batch + its send/recv), i.e. the
  bubble fraction is (p − 1)/(m + p − 1) (Narayanan et al. 2021); each stage's parameter
  gradient traffic happens once per iteration, so it enters the per-micro-batch stage
  cost divided by (m + p − 1);
* memory = max over stages, stage ``s`` (0-based) keeping the activations of up to
  ``p − s`` micro-batches in flight (DAPPLE; the first stage is the peak).

Stages are solved separately and composed exactly under (max, max): for every memory
threshold μ each stage takes its fastest plan within μ. Stages between the first and the
last are planned with stage 1's in-flight count (p − 1), an upper bound for later ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

import numpy as np

from .collectives import send_recv_s
from .costmodel import CostModel
from .engine import memguard
from .engine.bounds import LowerBound
from .engine.pareto import prune_rows
from .mesh import Cluster, Mesh
from .opgraph import Edge, OpGraph, rebatch_spec
from .plan import Plan
from .plan_builder import Candidate, PlanContext, plan_from_assignment
from .peak_search import solve_problem, time_left
from .peakmodel import peak_model
from .planner import build_problem
from .search_jobs import Job
from .search_options import SearchOptions
from .space import SearchSpace

__all__ = ["stage_counts", "stage_blocks", "stage_operators", "microbatch_counts", "split_stages", "compose_stages",
           "StageSpec", "stage_buffer_bytes", "pipeline_plans", "pipeline_candidates", "pipeline_shapes",
           "pipeline_jobs", "pipeline_job", "StagesBound", "Candidate", "check_pipeline", "sub_graph", "boundary_bytes",
           "stage_cluster", "pipeline_plan_of"]


def stage_counts(n_blocks: int, world: int) -> list[int]:
    """Stage counts p > 1 that divide the device count and split the blocks (:func:`stage_blocks`)."""
    return [p for p in range(2, min(n_blocks, world) + 1) if world % p == 0 and stage_blocks(n_blocks, p)]


def stage_blocks(n_blocks: int, stages: int) -> tuple[int, ...] | None:
    """Blocks per stage, first to last, or None where they do not split so that every middle
    stage holds as many as the others (one middle stage's plan stands for all of them).
    Equal runs where the stages divide the blocks; else one block more in every stage but the
    first, where that is all the remainder (a first layer that differs from the rest, which
    capture leaves out of the blocks, then runs in the first stage), or in the last alone
    where one block remains."""
    if stages < 2 or n_blocks < stages:
        return None
    per, extra = divmod(n_blocks, stages)
    if extra == 0:
        return (per,) * stages
    if extra == stages - 1:
        return (per,) + (per + 1,) * (stages - 1)
    if extra == 1:
        return (per,) * (stages - 1) + (per + 1,)
    return None


def stage_operators(graph: OpGraph, stages: int) -> list[tuple[int, ...]]:
    """Operator indices per stage (:func:`stage_blocks` runs of blocks; the first stage also
    holds the operators before the first block, the last those after the last block):
    what the search prices and what ``tensoropt.apply`` runs."""
    n = len(graph.blocks)
    counts = stage_blocks(n, stages)
    if counts is None:
        fitting = [p for p in range(2, n + 1) if stage_blocks(n, p)]
        raise ValueError(f"{n} blocks do not split into {stages} stages "
                         f"(stage counts that do: {', '.join(map(str, fitting)) or 'none'})")
    first, last = min(graph.blocks[0]), max(graph.blocks[-1])
    out, at = [], 0
    for s, k in enumerate(counts):
        ops = [i for b in graph.blocks[at:at + k] for i in b]
        at += k
        if s == 0:
            ops = list(range(first)) + ops
        if s == stages - 1:
            ops = ops + list(range(last + 1, len(graph.operators)))
        out.append(tuple(sorted(ops)))
    return out


def microbatch_counts(batch: int, p: int, options: tuple[int, ...] = (1, 2, 4)) -> list[int]:
    """m = k·p for k in ``options`` where m divides the batch (1F1B needs m >= p)."""
    return [k * p for k in options if batch % (k * p) == 0]


@dataclass(frozen=True)
class StageSpec:
    index: int                 # 0 = first
    ops: tuple[int, ...]       # operator indices (of the full graph) in this stage
    in_flight: int             # micro-batches of activations kept (1F1B)


def check_pipeline(graph: OpGraph, stages: int, microbatches: int, batch: int) -> None:
    """``batch``: the global batch the micro-batches split."""
    n = len(graph.blocks)
    if stages > max(n, 1):
        raise ValueError(f"{stages} pipeline stages but the model has only {n} repeated blocks "
                         f"(layers); use at most {n} stages")
    if stage_blocks(n, stages) is None:
        raise ValueError(f"{n} blocks do not split into {stages} stages with equal middle stages")
    if batch % microbatches:
        raise ValueError(f"{microbatches} micro-batches do not divide the batch of {batch}")
    if microbatches < stages:
        raise ValueError(f"1F1B needs at least as many micro-batches as stages ({microbatches} < {stages})")


def split_stages(graph: OpGraph, stages: int) -> list[StageSpec]:
    """The distinct stages of :func:`stage_operators`: first, middle, last. Stage 1 stands for
    every middle stage (they hold as many blocks, and stage 1 the most micro-batches in flight)."""
    out = [StageSpec(s, ops, stages - s) for s, ops in enumerate(stage_operators(graph, stages))]
    keep = [0] + ([1] if stages > 2 else []) + [stages - 1]
    return [out[s] for s in keep]


def sub_graph(graph: OpGraph, ops: tuple[int, ...]) -> tuple[OpGraph, dict[int, int]]:
    index = {old: new for new, old in enumerate(ops)}
    operators = tuple(graph.operators[i] for i in ops)
    edges = tuple(Edge(index[e.src], index[e.dst], e.operand, e.dim_map) for e in graph.edges
                  if e.src in index and e.dst in index)
    blocks = tuple(tuple(index[i] for i in b) for b in graph.blocks if all(i in index for i in b))
    modules = tuple(m for m in graph.block_modules
                    if any(op.module == m or op.module.startswith(m + ".") for op in operators))
    sub = replace(graph, operators=operators, edges=edges, blocks=blocks if len(blocks) > 1 else (),
                  block_modules=modules, returned=tuple(index[i] for i in graph.returned if i in index))
    return sub, index


def boundary_bytes(graph: OpGraph, stage_ops: tuple[int, ...], itemsize_scale) -> float:
    """Bytes of the activations that cross into this stage from earlier stages."""
    inside = set(stage_ops)
    total = 0.0
    seen = set()
    for e in graph.edges:
        if e.dst in inside and e.src not in inside and e.src not in seen:
            seen.add(e.src)
            out = graph.operators[e.src].output
            total += out.nbytes * itemsize_scale(out)
    return total


def stage_buffer_bytes(graph: OpGraph, specs: list[StageSpec], microbatches: int, itemsize_scale,
                       devices: int = 1) -> list[float]:
    """Per distinct stage, what ``torch.distributed.pipelining`` holds for the boundaries on
    every device of it (each of a stage's ``devices`` holds its share, as ``tensoropt.apply``
    sends it): a stage after the first keeps one receive buffer per micro-batch; a stage
    before the last keeps one buffer per micro-batch for the gradients it receives, and its
    outputs of the micro-batches in flight."""
    into = [boundary_bytes(graph, spec.ops, itemsize_scale) / devices if k else 0.0 for k, spec in enumerate(specs)]
    out = []
    for k, spec in enumerate(specs):
        if k == len(specs) - 1:
            sent = 0.0
        elif k == 0:
            sent = into[1]
        else:
            sent = into[k]                     # a middle stage passes on what it receives
        out.append(microbatches * into[k] + (microbatches + spec.in_flight) * sent)
    return out


def stage_cluster(cluster: Cluster, stages: int) -> tuple[Cluster, object]:
    """The sub-cluster one stage runs on, and the link between consecutive stages."""
    per_stage = cluster.world_size // stages
    if per_stage >= cluster.per_node:
        sub = replace(cluster, n_nodes=per_stage // cluster.per_node)
        return sub, cluster.inter_link
    sub = replace(cluster, n_nodes=1, per_node=per_stage)
    link = cluster.intra_link if cluster.per_node % (per_stage * stages) == 0 or cluster.n_nodes == 1 \
        else cluster.inter_link
    return sub, link


def compose_stages(fronts: list[np.ndarray], scale: float, p2p_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(max, max) composition. ``fronts[k]``: (n_k, 2) stage frontier, time ascending.
    Returns the composite frontier (time = scale · (max stage time + p2p), memory = max) and,
    per composite point, the index chosen in each stage frontier."""
    thresholds = np.unique(np.concatenate([f[:, 1] for f in fronts]))
    rows, picks = [], []
    for mu in thresholds:
        choice = []
        for f in fronts:
            ok = np.flatnonzero(f[:, 1] <= mu)
            if len(ok) == 0:
                break
            choice.append(int(ok[0]))           # fastest point within mu (time ascending)
        else:
            t = scale * (max(f[c, 0] for f, c in zip(fronts, choice)) + p2p_s)
            m = max(f[c, 1] for f, c in zip(fronts, choice))
            rows.append((t, m))
            picks.append(choice)
    if not rows:           # a stage with no point (the ceiling dominated them all): no plan
        return np.zeros((0, 2)), np.zeros((0, len(fronts)), dtype=np.int64)
    pts = np.array(rows)
    _, _, src = prune_rows(pts[None, :, 0], pts[None, :, 1])
    keep = [int(s) for s in src[0] if s >= 0]
    return pts[keep], np.array([picks[k] for k in keep])


def pipeline_plans(*args, **kw) -> list[Plan]:
    """The frontier plans of one (stage count, micro-batch count) choice (see
    :func:`pipeline_candidates`)."""
    return [c.build() for c in pipeline_candidates(*args, **kw)]


def pipeline_shapes(graph: OpGraph, cluster: Cluster, space: SearchSpace) -> list[tuple[int, int, Mesh]]:
    """Every (stage count, micro-batch count, stage mesh) the search tries: stage counts that
    divide the devices and split the blocks (:func:`stage_blocks`), micro-batch counts of
    :func:`microbatch_counts`."""
    if not graph.blocks or cluster.world_size <= 1:
        return []
    return [(p, m, mesh) for p in stage_counts(len(graph.blocks), cluster.world_size)
            for m in microbatch_counts(graph.batch_size, p)
            for mesh in space.meshes(stage_cluster(cluster, p)[0])]


def pipeline_jobs(ctx: PlanContext, recapture: Callable[[int], OpGraph], cluster: Cluster, space: SearchSpace,
                  cost_for: Callable[[Mesh], CostModel], options: SearchOptions, bar=None) -> list[Job]:
    """A job per :func:`pipeline_shapes` entry; ``ctx.graph`` is the model at the global
    batch, ``recapture(b)`` the model at batch ``b``; ``bar`` advances per job built."""
    graph = ctx.graph
    jobs: list[Job] = []
    for p, m, mesh in pipeline_shapes(graph, cluster, space):
        mb_ctx = replace(ctx, graph=recapture(graph.batch_size // m))
        memguard.check()
        jobs.append(pipeline_job(mb_ctx, cluster, space, cost_for, options, p, m, mesh))
        if bar is not None:
            bar.update(1)
    return jobs


def pipeline_job(mb_ctx: PlanContext, cluster: Cluster, space: SearchSpace, cost_for: Callable[[Mesh], CostModel],
                 options: SearchOptions, stages: int, microbatches: int, mesh: Mesh) -> Job:
    """The job of one :func:`pipeline_shapes` entry (``mb_ctx.graph``: the model at the
    micro-batch size)."""
    return _stage_job(mb_ctx, cluster, stages, microbatches, mesh, cost_for(mesh), space, options.recompute,
                      options.recompute_policy)


def pipeline_candidates(ctx: PlanContext, cluster: Cluster, stages: int, microbatches: int,
                        cost_for: Callable[[Mesh], CostModel], space: SearchSpace, recompute: bool,
                        recompute_policy: str = "full",
                        time_limit_s: float | None = None) -> list[Candidate]:
    """The frontier points of one (stage count, micro-batch count) choice over every stage
    mesh; ``ctx.graph`` is the model captured at the micro-batch size."""
    out = []
    for mesh in space.meshes(stage_cluster(cluster, stages)[0]):
        job = _stage_job(ctx, cluster, stages, microbatches, mesh, cost_for(mesh), space, recompute, recompute_policy)
        out += job.solve(time_limit_s, None)
    return out


@dataclass(frozen=True)
class StagesBound:
    """A lower bound on pipeline plans from their stages' (``engine.bounds``): the slowest
    stage within a memory budget sets the time, the stage holding most sets the memory."""
    stages: tuple[LowerBound, ...]     # each shifted by its stage's boundary buffers and least rise
    scale: float                       # micro-batches + stages - 1
    p2p_s: float

    def time_within(self, budget: float) -> float:
        return self.scale * (max(b.time_within(budget) for b in self.stages) + self.p2p_s)

    @property
    def time_min(self) -> float:
        return self.time_within(float("inf"))

    @property
    def memory_min(self) -> float:
        return max(b.memory_min for b in self.stages)


def _stage_job(ctx: PlanContext, cluster: Cluster, stages: int, microbatches: int, mesh: Mesh, cm: CostModel,
               space: SearchSpace, recompute: bool, recompute_policy: str = "full") -> Job:
    """One stage mesh of one (stage count, micro-batch count): its stage problems built and
    bounded; solving them composes their frontiers."""
    mb_graph = ctx.graph
    check_pipeline(mb_graph, stages, microbatches, mb_graph.batch_size * microbatches)
    sub, link = stage_cluster(cluster, stages)
    specs = split_stages(mb_graph, stages)
    scale = microbatches + stages - 1
    built = []
    for spec in specs:
        g, _ = sub_graph(mb_graph, spec.ops)
        problem = build_problem(g, mesh, cm, zero_stage=0, recompute=recompute,
                                activation_factor=spec.in_flight, comm_factor=1.0 / scale,
                                batch_only_axes=space.batch_only_axes(mesh, sub), accumulates=True,
                                pipeline_stage=True, recompute_policy=recompute_policy)
        built.append((g, problem))
    p2p, buffers = _boundaries(mb_graph, specs, microbatches, mesh, link, cm)
    bound = StagesBound(tuple(problem.lower_bound().shifted(b) for (_, problem), b in zip(built, buffers)),
                        float(scale), p2p)
    label = f"{stages} pipeline stages, {microbatches} micro-batches, stage mesh {mesh}"
    return Job(label, bound, partial(_solve_stages, ctx, sub, link, mesh, specs, built, p2p, buffers,
                                     stages, microbatches, space.block_groups))


def _boundaries(mb_graph: OpGraph, specs, microbatches: int, mesh: Mesh, link, cm: CostModel
                ) -> tuple[float, list[float]]:
    """(time to cross the slowest stage boundary per micro-batch, per distinct stage the
    buffers its boundaries hold): activations cross each boundary forward and their
    gradients backward, each device sending its share."""
    p2p = cm.terms.p2p_scale * max(2 * send_recv_s(boundary_bytes(mb_graph, spec.ops, cm.training.scale) / mesh.size,
                                                   2, link.latency_s, link.bandwidth_bytes_per_s) for spec in specs[1:])
    return p2p, stage_buffer_bytes(mb_graph, specs, microbatches, cm.training.scale, mesh.size)


def _solve_stages(ctx: PlanContext, sub: Cluster, link, mesh: Mesh, specs, built, p2p: float, buffers,
                  stages: int, microbatches: int, block_groups, time_limit_s: float | None,
                  ceiling: np.ndarray | None = None, epsilon: float | None = None) -> list[Candidate]:
    ctx = ctx.approximate(epsilon)
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s   # for all the stages
    scale = microbatches + stages - 1
    fronts, solved = [], []
    start_at = "exact"           # a stage no larger than the one before needs no more
    for (g, problem), held in zip(built, buffers):
        # a stage point (t, m) gives plans of time >= scale * (t + p2p) and peak >= m + held
        stage_ceiling = None if ceiling is None else ceiling / [scale, 1.0] - [p2p, held]
        res = solve_problem(problem, g, microbatches, epsilon=ctx.epsilon, time_limit_s=time_left(deadline),
                            block_groups=block_groups, start_at=start_at, ceiling=stage_ceiling)
        ctx.peak_searches[res.stats["peak_search"]] += 1
        start_at = res.stats["peak_search"]
        fronts.append(np.column_stack([res.times, res.memories, res.peaks]))
        solved.append((g, problem, (res.assignments, res.memories, res.peaks)))   # not its peak model
    fronts = [f + np.array([0.0, b, b]) for f, b in zip(fronts, buffers)]
    # stages compose on their peaks, each stage's as its plan will state it
    points, picks = compose_stages([f[:, [0, 2]] for f in fronts], scale, p2p)
    out = []
    stage_plans: dict = {}          # plans of one job share their stages' plans
    for (t, peak), pick in zip(points, picks):
        m = max(f[k, 1] for f, k in zip(fronts, pick))
        t = float(t) + solved[0][1].fixed_s
        build = partial(_build_plan, ctx, sub, link, mesh, specs, solved, tuple(pick), t, p2p,
                        stages, microbatches, buffers, built=stage_plans)
        out.append(Candidate(t, float(m), float(peak), build))
    return out


def pipeline_plan_of(ctx: PlanContext, cluster: Cluster, stages: int, microbatches: int, mesh: Mesh,
                     cm: CostModel, choose: Callable[[OpGraph, object], list[int]], zero_stage: int = 0,
                     recompute: bool = False, recompute_policy: str = "full") -> Plan:
    """The pipeline plan whose every stage takes the assignment ``choose(stage graph, stage
    problem)`` returns, priced as searched pipeline plans are (``ctx.graph``: the model at the
    micro-batch size). ZeRO shards the stages' state over their data-parallel axes; its
    gathers and reductions are priced once per iteration, as FSDP2 runs a stage that keeps
    its gathered parameters over the micro-batches."""
    mb_graph = ctx.graph
    check_pipeline(mb_graph, stages, microbatches, mb_graph.batch_size * microbatches)
    sub, link = stage_cluster(cluster, stages)
    specs = split_stages(mb_graph, stages)
    scale = microbatches + stages - 1
    solved, times = [], []
    for spec in specs:
        g, _ = sub_graph(mb_graph, spec.ops)
        problem = build_problem(g, mesh, cm, zero_stage=zero_stage, recompute=recompute,
                                activation_factor=spec.in_flight, comm_factor=1.0 / scale, accumulates=True,
                                pipeline_stage=True, recompute_policy=recompute_policy)
        a = list(choose(g, problem))
        held, peak = peak_model(problem, g, microbatches).evaluate(np.array([a]))[0, 1:]
        times.append(problem.cost_graph.cost(a)[0])
        solved.append((g, problem, ([a], [float(held)], [float(peak)])))
    p2p, buffers = _boundaries(mb_graph, specs, microbatches, mesh, link, cm)
    t = scale * (max(times) + p2p) + cm.fixed_s
    return _build_plan(ctx, sub, link, mesh, specs, solved, (0,) * len(specs), float(t), p2p, stages,
                       microbatches, buffers, zero_stage)


def _build_plan(ctx: PlanContext, sub: Cluster, link, mesh: Mesh, specs, solved, pick, t: float,
                p2p: float, stages: int, microbatches: int, buffers, zero_stage: int = 0,
                built: dict | None = None) -> Plan:
    """The pipeline plan of stage points ``pick``; ``built``: stage plans by (stage, point),
    kept for the other plans of the same job (plans are immutable)."""
    mb_graph = ctx.graph
    built = {} if built is None else built
    stage_plans = []
    for s, (spec, (g, problem, (assignments, memories, peaks)), k, held) in enumerate(zip(specs, solved, pick,
                                                                                          buffers)):
        if (s, k) not in built:
            sp = plan_from_assignment(replace(ctx, graph=g), problem, assignments[k], fixed_s=0.0,
                                      label=f"stage {spec.index}", microbatches=microbatches,
                                      held_peak=(memories[k], peaks[k]))
            built[s, k] = replace(sp, memory_bytes=sp.memory_bytes + held,
                                  breakdown={**sp.breakdown, "pipeline_buffer_bytes": held})
        stage_plans.append(built[s, k])
    slowest = max(sp.time_s for sp in stage_plans)
    peak = max(stage_plans, key=lambda sp: sp.peak_memory_bytes)
    breakdown = {"stage_s": slowest, "p2p_s": p2p, "bubble_s": (stages - 1) * (slowest + p2p),
                 **{k: v for k, v in peak.breakdown.items() if k.endswith("_bytes")}}
    summary = f"pp{stages}·{stage_plans[0].summary.split(' ')[0]} mb{microbatches}"
    if zero_stage:
        summary += f" zero{zero_stage}"
    policy = next((sp.recompute_policy for sp in stage_plans if sp.recompute), "full")
    if any(sp.recompute for sp in stage_plans):
        summary += " rc" if policy == "full" else f" rc:{policy}"
    training = ctx.training
    return Plan(model=mb_graph.name, devices=ctx.devices, mesh_shape=(stages, *mesh.shape),
                mesh_links=(link.name, *(lk.name for lk in mesh.links)), time_s=t,
                memory_bytes=max(sp.memory_bytes for sp in stage_plans), summary=summary,
                ops=tuple(o for sp in stage_plans for o in sp.ops), breakdown=breakdown,
                training={"precision": training.precision, "optimizer": training.optimizer,
                          "batch_size": mb_graph.batch_size * microbatches},
                param_signature=ctx.param_signature, label="", epsilon=ctx.epsilon, zero_stage=zero_stage,
                recompute=tuple(r for sp in stage_plans for r in sp.recompute), recompute_policy=policy,
                stages=tuple(stage_plans),
                microbatches=microbatches,
                inputs=rebatch_spec(mb_graph.inputs, mb_graph.batch_size, mb_graph.batch_size * microbatches))
