"""A plan someone already runs, described as Megatron-LM and torchtitan describe theirs, and
priced by the same cost model as the frontier's plans.

A :class:`Setup` names the degrees: tensor parallelism ``tp`` on the innermost mesh axis
(inside a node), data parallelism ``dp`` outside it (ZeRO stage ``zero`` over it), pipeline
stages ``pp`` outermost with ``microbatches`` per step (1F1B; with ``pp == 1`` they are
gradient-accumulation steps), activation recomputation and sequence parallelism.

Each operator's configuration follows from those degrees, as Megatron lays a transformer
out: on the tensor-parallel axis column-parallel linears split their output features,
row-parallel ones the features they reduce (their output is a partial sum), attention
splits heads, the embedding its vocabulary; an operator outside those keeps the layout its
input arrives in where that is a split it can hold, and otherwise is replicated, or, under
sequence parallelism, splits the sequence. On the data-parallel axis every operator that
has a batch splits it. Recomputation ``"full"`` recomputes every repeated block;
``"selective"`` (Korthikanti et al. 2022: recompute the attention core) keeps what a fused
attention kernel keeps, which is what capture prices for attention, so it is priced as
``"none"``. ``"op"`` is torchtitan's per-operator selective recomputation of every repeated
block (``tensoropt.recompute``: it keeps the attention kernels' outputs and every other
linear's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from .accumulation import accumulated_plan, accumulation_problem
from .mesh import Cluster, mesh_for
from .opgraph import OpGraph
from .pipeline import pipeline_plan_of, stage_cluster
from .placement import Shard
from .plan import Plan
from .plan_builder import PlanContext, plan_from_assignment
from .planner import MeshProblem, build_problem
from .strategy import output_placements

__all__ = ["Setup", "RECOMPUTE", "setup_plan", "setup_assignment", "COLUMN_PARALLEL", "ROW_PARALLEL"]

RECOMPUTE = ("none", "selective", "full", "op")

#: linears Megatron splits by output features (their leaf module name)
COLUMN_PARALLEL = frozenset(("q_proj", "k_proj", "v_proj", "fc1", "gate_proj", "up_proj", "query", "key", "value",
                             "c_fc", "c_attn", "qkv", "query_key_value", "wq", "wk", "wv", "w1", "w3", "wqkv",
                             "fc_in", "dense_h_to_4h", "linear_fc1", "linear_qkv"))
#: linears Megatron splits by input features (partial sums reduced after them)
ROW_PARALLEL = frozenset(("o_proj", "fc2", "down_proj", "out_proj", "c_proj", "wo", "w2", "fc_out",
                          "dense_4h_to_h", "linear_fc2", "linear_proj"))


@dataclass(frozen=True)
class Setup:
    """A parallel layout as its users name it."""
    tp: int = 1
    pp: int = 1
    dp: int | None = None              # None: what the devices leave, world / (tp · pp)
    microbatches: int = 1              # per step (1F1B micro-batches; gradient accumulation when pp == 1)
    recompute: str = "none"            # one of RECOMPUTE
    zero: int = 0                      # ZeRO stage over the data-parallel axis
    sequence_parallel: bool = False

    def degrees(self, world: int) -> tuple[int, int, int]:
        """(pp, dp, tp), checked against ``world`` devices."""
        for name in ("tp", "pp", "microbatches"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, got {self.recompute!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be 0, 1, 2 or 3, got {self.zero!r}")
        dp = self.dp if self.dp is not None else world // (self.tp * self.pp)
        if dp < 1 or self.tp * self.pp * dp != world:
            raise ValueError(f"tp={self.tp} x pp={self.pp} x dp={dp} = {self.tp * self.pp * dp} devices, "
                             f"but the device set has {world}")
        if self.zero and dp == 1:
            raise ValueError(f"ZeRO stage {self.zero} shards over data parallelism, but dp = 1")
        return self.pp, dp, self.tp

    def describe(self, world: int) -> str:
        pp, dp, tp = self.degrees(world)
        parts = [f"{k}{v}" for k, v in (("pp", pp), ("dp", dp), ("tp", tp)) if v > 1] or ["1 device"]
        text = "·".join(parts)
        if self.microbatches > 1:
            text += f" mb{self.microbatches}"
        if self.zero:
            text += f" zero{self.zero}"
        if self.recompute != "none":
            text += f" rc:{self.recompute}"
        if self.sequence_parallel:
            text += " sp"
        return text


def setup_plan(ctx: PlanContext, recapture: Callable[[int], OpGraph], cluster: Cluster, setup: Setup, cost_for,
               label: str = "yours") -> Plan:
    """``setup`` on ``cluster`` as a priced :class:`Plan`. ``ctx.graph``: the model at the
    global batch; ``recapture(b)``: the model at batch ``b`` (the micro-batch size, when
    ``microbatches > 1``); ``cost_for``: mesh -> CostModel."""
    pp, dp, tp = setup.degrees(cluster.world_size)
    graph = ctx.graph
    if graph.batch_size % setup.microbatches:
        raise ValueError(f"{setup.microbatches} micro-batches do not divide the batch of {graph.batch_size}")
    if (graph.batch_size // setup.microbatches) % dp:
        raise ValueError(f"a micro-batch of {graph.batch_size // setup.microbatches} (batch {graph.batch_size} / "
                         f"{setup.microbatches} micro-batches) does not split over dp={dp}")
    if setup.recompute in ("full", "op") and not graph.blocks:
        raise ValueError(f"recompute={setup.recompute!r} recomputes repeated blocks, and {graph.name} has none found")
    if setup.sequence_parallel and tp == 1:
        raise ValueError("sequence parallelism splits the sequence over the tensor-parallel axis; tp = 1")
    shape = tuple(n for n in (dp, tp) if n > 1) or (1,)
    roles = tuple(r for r, n in (("dp", dp), ("tp", tp)) if n > 1) or ("dp",)
    mesh = mesh_for(shape, stage_cluster(cluster, pp)[0] if pp > 1 else cluster)
    if mesh is None:
        raise ValueError(f"a {'x'.join(map(str, shape))} mesh (dp x tp) does not fit nodes of "
                         f"{cluster.per_node} devices: keep tp within a node")
    cm = cost_for(mesh)
    recompute = setup.recompute in ("full", "op")
    policy = "op" if setup.recompute == "op" else "full"
    # ZeRO-1 reduce-scatters gradients once per step (``execution.syncs_gradients_once``): with
    # one micro-batch that is what ZeRO-2 does, and the apply layer runs (and prices) it so
    zero = 2 if setup.zero == 1 and pp == 1 and setup.microbatches == 1 else setup.zero

    micro = recapture(graph.batch_size // setup.microbatches) if setup.microbatches > 1 else None

    def choose(g: OpGraph, problem: MeshProblem) -> list[int]:
        return setup_assignment(g, problem, roles, setup.sequence_parallel, recompute)

    if pp > 1:
        plan = pipeline_plan_of(replace(ctx, graph=micro), cluster, pp, setup.microbatches, mesh, cm, choose,
                                zero_stage=zero, recompute=recompute, recompute_policy=policy)
    elif setup.microbatches > 1:
        plan = _accumulated(ctx, micro, mesh, cm, setup.microbatches, choose, zero, recompute, policy)
    else:
        problem = build_problem(graph, mesh, cm, zero_stage=zero, recompute=recompute, recompute_policy=policy)
        plan = plan_from_assignment(ctx, problem, choose(graph, problem))
    return replace(plan, label=label, summary=f"{plan.summary} [{setup.describe(cluster.world_size)}]")


def _accumulated(ctx: PlanContext, micro: OpGraph, mesh, cm, m: int, choose, zero: int, recompute: bool,
                 policy: str) -> Plan:
    """Gradient accumulation over ``m`` micro-batches (``tensoropt.accumulation``)."""
    problem = accumulation_problem(micro, mesh, cm, m, zero, recompute, policy)
    return accumulated_plan(replace(ctx, graph=micro), ctx.graph, problem, choose(micro, problem), m)


def setup_assignment(graph: OpGraph, problem: MeshProblem, roles: Sequence[str], sequence_parallel: bool,
                     recompute: bool) -> list[int]:
    """Per operator the index of its configuration under ``roles`` (per mesh axis "dp" or
    "tp", see the module doc), then per recompute unit 1 (recomputed) or 0."""
    by_dst: dict[int, list] = {}
    for e in graph.edges:
        by_dst.setdefault(e.dst, []).append(e)
    chosen: list = []
    out = []
    for i, op in enumerate(graph.operators):
        index = {c.splits: j for j, c in enumerate(problem.configs[i])}
        want = []
        for axis, role in enumerate(roles):
            if role == "dp":
                want.append("b" if any(c.splits[axis] == "b" for c in problem.configs[i]) else None)
            else:
                want.append(_tp_label(op, i, axis, by_dst.get(i, ()), graph, chosen, sequence_parallel,
                                      {c.splits[axis] for c in problem.configs[i]}))
        splits = tuple(want)
        if splits not in index:
            # a split the operator cannot take at this size (e.g. heads that do not divide)
            splits = tuple(None if r == "tp" else s for r, s in zip(roles, want))
        if splits not in index:
            raise ValueError(f"operator {op.name} has no configuration {splits} on mesh {problem.mesh}")
        chosen.append(problem.configs[i][index[splits]])
        out.append(index[splits])
    return out + [1 if recompute else 0] * len(problem.units)


def _tp_label(op, i: int, axis: int, edges, graph: OpGraph, chosen: list, sequence_parallel: bool,
              possible: set) -> str | None:
    leaf = op.module.rsplit(".", 1)[-1]
    arriving = _arriving_label(op, axis, edges, graph, chosen)
    if op.family == "linear":
        if leaf in ROW_PARALLEL or (leaf not in COLUMN_PARALLEL and arriving == "k"):
            return "k"
        return "n"
    if op.family == "attention":
        # the heads: (..., heads, sequence, head dim); a capture at batch one labels its unit
        # batch dim "n" and the heads otherwise
        out = op.terms[1]
        return out[-3] if len(out) >= 4 else "n"
    if op.family == "embedding":
        return "v" if "v" in possible else None
    if arriving is not None and arriving in possible:
        return arriving
    if sequence_parallel and "s" in possible:
        return "s"
    return None


def _arriving_label(op, axis: int, edges, graph: OpGraph, chosen: list) -> str | None:
    """The label of ``op`` that its first split input arrives split on along ``axis``."""
    terms = op.terms[0]
    for e in sorted(edges, key=lambda e: e.operand):
        src = graph.operators[e.src]
        have = output_placements(src, chosen[e.src])[axis]
        if isinstance(have, Shard):
            for d, mapped in enumerate(e.dim_map):
                if mapped == have.dim:
                    return terms[e.operand][d]
    return None
