"""Analytical cost of one training iteration, per operator configuration and per edge.

Time (seconds, one forward + backward, no overlap assumed):

* compute — forward and backward FLOPs and bytes of the local shard, priced by the
  :class:`~tensoropt.compute.ComputeModel` (work is divided by the mesh axes that split
  some label; an axis that splits nothing repeats the work);
* communication — the collectives ``traffic`` lists for the operator's configuration
  (parameter-gradient reductions, ZeRO gathers, BatchNorm statistics) and for every edge's
  re-layout (:func:`edge_tables`), each priced by the
  :class:`~tensoropt.collectives.CollectiveModel` (:meth:`CostModel.price`).

Memory (bytes per device, resident at the peak at the end of the forward pass):
parameters, gradients and optimizer state of the local parameter shard
(:class:`~tensoropt.training.TrainingConfig` gives bytes per parameter), plus the
activations each operator saves for backward, sharded like the term they belong to. A
parameter used by several operators (tied weights) is charged once, at its first user.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from .collectives import CollectiveModel
from .compute import (ALIGNED_BYTES, ALIGNED_FAMILIES, MATMUL_FAMILIES, ComputeModel, alignment_bytes,
                      default_compute_model, operator_kind)
from .cost_terms import CostTerms
from .execution import model_parallel
from .hardware import Device
from .mesh import CPU_LINK_NAME, Mesh
from .opgraph import Edge, Operator, OpGraph
from .placement import Partial, Placement, Replicate, Shard
from .strategy import OpConfig, output_placements, term_placements
from .traffic import (Collective, Move, aligned, axis_divisor, axis_relayout_moves, grad_partial,
                      is_parameter_collective, operator_moves)
from .training import OPTIMIZERS, PRECISIONS, ZERO_STAGES, TrainingConfig

__all__ = ["TrainingConfig", "CostModel", "NodeCost", "PRECISIONS", "OPTIMIZERS", "ZERO_STAGES"]

_BACKWARD_BYTES_FACTOR = 2.0   # backward reads the forward's operands and writes their gradients


@dataclass(frozen=True)
class NodeCost:
    compute_s: float
    comm_s: float
    forward_s: float           # the forward part of compute_s (what recomputation repeats)
    param_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    activation_bytes: float
    # Held only while this operator runs backward: the gradients of its output and of its
    # largest activation input, its parameters' fresh gradients before they are added to the
    # kept ones, and under ZeRO-3 its gathered parameters and their gradient.
    transient_bytes: float = 0.0
    output_bytes: float = 0.0  # its output on this device (what the output's gradient takes)
    # ZeRO-3: its gathered parameters, which a recomputed forward keeps from the recomputation
    # until this operator's backward (only a first forward re-gathers them for backward)
    regathered_bytes: float = 0.0
    # once per step like comm_s: the optimizer's update of its parameters, as a measured
    # profile prices it (``ComputeModel.update_s_per_param``) and the fitted terms add to it
    update_s: float = 0.0

    @property
    def time_s(self) -> float:
        return self.compute_s + self.comm_s + self.update_s

    @property
    def memory_bytes(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes


@dataclass(frozen=True)
class CostModel:
    device: Device
    compute: ComputeModel | None = None          # None: datasheet defaults for the device
    collectives: CollectiveModel = field(default_factory=CollectiveModel)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    terms: CostTerms = field(default_factory=CostTerms)   # fitted terms (neutral: the model alone)
    # Ranks per core where a CPU host runs more ranks than it has cores (``pricing.host_share``):
    # every rank's own work -- compute, the framework's, the optimizer's, DTensor's per
    # operator and parameter, the fixed cost per step -- takes that many times as long.
    # Collectives are measured with their ranks sharing the host already.
    host_share: float = 1.0
    # what planner.build_problem prices once per cost model, as every ZeRO stage and pipeline
    # stage asks for the same: per operator signature and mesh, its configurations and costs
    # (node_cache); per like edge, its tables (edge_cache)
    node_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    edge_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def fixed_s(self) -> float:
        """The fixed cost per step (``CostTerms.fixed_s``): each rank's own work, so it takes
        ``host_share`` times as long where ranks share a core."""
        return self.terms.fixed_s * self.host_share

    def __post_init__(self):
        if self.compute is None:
            object.__setattr__(self, "compute", default_compute_model(self.device, self.training.compute_dtype))
        if not self.host_share >= 1:
            raise ValueError(f"host_share must be at least 1, got {self.host_share!r}")

    # ------------------------------------------------------------------ nodes

    def node_cost(self, op: Operator, cfg: OpConfig, mesh: Mesh, owns_params: bool = True,
                  zero_stage: int = 0, latency_shares: Mapping[str, float] | None = None,
                  fsdp: bool = False) -> NodeCost:
        """Cost of ``op`` in configuration ``cfg``; ``owns_params=False`` for a later user of a
        tied parameter (its state is charged at the first user). ``zero_stage`` shards the
        optimizer state (1), + gradients (2), + parameters (3) over the axes where the
        parameter is replicated while the operator splits something else.
        ``latency_shares``: its graph's ``execution.latency_shares`` (None: every parameter's
        collectives pay their fixed costs in full); ``fsdp``: priced as FSDP2 runs a plan
        whose operators split nothing but the batch (``execution.runs_replicated``), its
        parameter collectives grouped."""
        if zero_stage not in ZERO_STAGES:
            raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, got {zero_stage!r}")
        return _node_cost(self, op, cfg, mesh, owns_params, zero_stage, latency_shares, fsdp)

    def price(self, items: Iterable[Collective | Move], mesh: Mesh) -> float:
        """The time of collectives on ``mesh``: the sum of each one's α–β price. Items may be
        moves (``traffic``: tuples of collectives), each summed before it is added."""
        col = self.collectives
        total = 0.0
        for item in items:
            if isinstance(item, Collective):
                total += col.time_s(item.kind, item.bytes, mesh, item.axis, item.latency_share)
            else:
                total += sum(col.time_s(c.kind, c.bytes, mesh, c.axis, c.latency_share) for c in item)
        return total

    def moves_s(self, items: Iterable[Collective | Move], mesh: Mesh) -> float:
        """The time of a layout move's collectives (an edge's, a tied parameter's), with the
        fitted terms (:meth:`fitted_moves_s`)."""
        items = list(items)
        return self.fitted_moves_s(self.price(items, mesh), _calls(items))

    def fitted_moves_s(self, priced_s, calls):
        """Layout moves priced ``priced_s`` in ``calls`` collectives, with the fitted terms:
        scaled, and a fixed cost per call (numbers or arrays)."""
        t = self.terms
        return t.relayout_scale * priced_s + t.per_collective_s * calls


def _calls(items) -> float:
    """Collective calls, a collective issued with its group's counting as its share."""
    return sum(i.latency_share if isinstance(i, Collective) else sum(c.latency_share for c in i) for i in items)


def _local_alignment(op: Operator, cfg: OpConfig, shape: tuple[int, ...], itemsize: int) -> int:
    """The alignment (bytes) of a matrix multiply's contiguous dimensions on one device: the
    last dimension of every operand and of the output, split as ``cfg`` splits it."""
    if op.family not in ALIGNED_FAMILIES:
        return ALIGNED_BYTES
    terms, out = op.terms
    dims = [spec.shape[-1] / cfg.shards(t[-1], shape)
            for t, spec in zip((*terms, out), (*op.operands, op.output)) if t and spec.shape]
    return alignment_bytes(dims, itemsize)


def _node_cost(cm: CostModel, op: Operator, cfg: OpConfig, mesh: Mesh, owns_params: bool,
               zero_stage: int, latency_shares: Mapping[str, float] | None, fsdp: bool) -> NodeCost:
    shape = mesh.shape
    terms, out = op.terms
    ws = cfg.work_shards(shape)
    dtype = cm.training.compute_dtype
    local_bytes = sum(spec.nbytes * cm.training.scale(spec) / cfg.shards(t, shape) for t, spec in zip(terms, op.operands))
    local_bytes += op.output.nbytes * cm.training.scale(op.output) / cfg.shards(out, shape)
    tt = cm.terms
    scale = tt.matmul_scale if op.family in MATMUL_FAMILIES else tt.other_compute_scale
    align = _local_alignment(op, cfg, shape, cm.training.activation_itemsize)
    raw_forward, raw_backward = _kernels_s(cm, op, ws, local_bytes, dtype, align)
    # the framework's own time per operator (dispatch, autograd), half of it in each pass
    half_overhead = tt.framework_scale * cm.compute.op_overhead_s / 2
    forward = scale * raw_forward + half_overhead
    compute = forward + scale * raw_backward + half_overhead
    # operator-level layouts (something besides the batch split over a mesh axis) pay a
    # dispatch cost per operator
    sharded_op = model_parallel(cfg, shape)
    if sharded_op:
        compute += tt.per_sharded_op_s
    if not fsdp and any(n > 1 for n in shape):
        # the DTensor runner runs every operator of the plan on DTensor (all but FSDP2's
        # plan), and DTensor dispatches each of its torch ops
        compute += tt.per_dtensor_op_s * op.dispatches
    p_bytes = g_bytes = o_bytes = gathered = fresh = regathered = updated = 0.0
    # on more than one device every parameter is a DTensor, dispatched per tensor by the
    # optimizer (and FSDP2's hooks) whatever its size; the DTensor runner handles each apart too
    per_tensor = 0.0
    if owns_params and any(n > 1 for n in shape):
        per_tensor = tt.per_param_tensor_s + (0.0 if fsdp else tt.per_dtensor_param_s)
    bp, bg, bo = cm.training.state_bytes_per_param
    for t, spec, pname in zip(terms, op.operands, op.param_names):
        if pname is None:
            continue
        local_numel = spec.numel / cfg.shards(t, shape)
        if not owns_params:
            # a tied parameter used again: its state is charged at the first user, but this
            # use's gradient is a buffer of its own before it is added to the kept one
            fresh += bg * local_numel
            continue
        # Axes where this parameter is replicated while the operator splits another label:
        # its gradient ends the step as partial sums there (data parallelism).
        data_axes = [a for a, s in enumerate(cfg.splits) if s is not None and s not in t]
        d = math.prod(shape[a] for a in data_axes)
        p_bytes += bp * local_numel / (d if zero_stage >= 3 else 1)
        if zero_stage >= 3:
            # its gathered parameter and unreduced gradient, and the next layer's parameter
            # prefetched meanwhile (FSDP2 prefetches one all-gather ahead; taken as this size)
            gathered += (2 * bp + bg) * local_numel * (1 - 1 / d)
            regathered += bp * local_numel if d > 1 else 0.0
        g_bytes += bg * local_numel / (d if zero_stage >= 2 else 1)
        if zero_stage == 1 and d > 1:
            # ZeRO-1 holds the step's gathered parameters and whole gradients (reduce-scattered
            # once, after the last micro-batch) beside their stored shards (the apply layer's
            # ``ProgramRunner._held``; FSDP2 kept unsharded through the micro-batches)
            p_bytes += bp * local_numel / d
            g_bytes += bg * local_numel / d
        fresh += bg * local_numel / (d if zero_stage >= 3 else 1)   # ZeRO-3: the rest is in ``gathered``
        o_bytes += bo * local_numel / (d if zero_stage >= 1 else 1)
        updated += local_numel / (d if zero_stage >= 1 else 1)
    moves = list(operator_moves(op, cfg, shape, cm.training, owns_params, zero_stage, latency_shares, fsdp))
    if tt.grad_comm_overlap > 0:
        # a parameter's collectives go out beside compute (FSDP2 prefetches the next gather,
        # reductions leave during backward): what passes the overlap's share of the operator's
        # own compute, as the uncalibrated model prices it, is exposed
        own = [m for m in moves if is_parameter_collective(m[0])]
        hidden = tt.grad_comm_overlap * (raw_forward + raw_backward)
        comm = tt.grad_comm_scale * (max(0.0, cm.price(own, mesh) - hidden)
                                     + cm.price([m for m in moves if not is_parameter_collective(m[0])], mesh))
    else:
        comm = tt.grad_comm_scale * cm.price(moves, mesh)
    # a fixed cost per call: a collective issued with its group's carries its share of one
    comm += tt.per_collective_s * _calls(moves)
    act = 0.0
    tensor_scale = cm.training.loss_scale if op.family == "loss" else cm.training.scale
    for i in op.saved_operands:
        t, spec = (out, op.output) if i == -1 else (terms[i], op.operands[i])
        act += spec.nbytes * tensor_scale(spec) / cfg.shards(t, shape)
    # Extras (masks, statistics) are sharded like the output; a loss's scalar output has no
    # dims, and its extras (the log-softmax) are shaped like its first input.
    extra_term = out or terms[0]
    extra_scale = (cm.training.intermediate_scale(op.output, op.aten) if op.family == "elementwise"
                   else tensor_scale(op.output))
    act += op.saved_extra_bytes * extra_scale / cfg.shards(extra_term, shape)
    grad_out = op.output.nbytes * tensor_scale(op.output) / cfg.shards(out, shape) if out else 0.0
    inputs = [(t, spec) for t, spec, pname in zip(terms, op.operands, op.param_names) if pname is None]
    grad_in = max((spec.nbytes * tensor_scale(spec) / cfg.shards(t, shape) for t, spec in inputs), default=0.0)
    # what capture measured beyond these (cross-entropy's second gradient of the logits, through
    # nll_loss then log_softmax; attention's three input gradients; a fused group's intermediates)
    grad_in += op.backward_extra_bytes * extra_scale / cfg.shards(extra_term, shape)
    update = ((tt.update_scale * cm.compute.update_s_per_param + tt.optimizer_s_per_param) * updated
              + per_tensor * sum(p is not None for p in op.param_names))
    share = cm.host_share
    return NodeCost(share * compute, comm, share * forward, p_bytes, g_bytes, o_bytes, act,
                    grad_out + grad_in + fresh + gathered, grad_out, regathered, share * update)


def _kernels_s(cm: CostModel, op: Operator, ws: float, local_bytes: float, dtype: str,
               align: int) -> tuple[float, float]:
    """(forward, backward) kernel time of ``op`` on one device (``ws``: its work shards,
    ``local_bytes``: its operands' and output's local bytes). A fused group runs its members
    one kernel each, as eager PyTorch does, each priced by its own kind's curve on its share
    of the group's FLOPs and its own bytes, laid out as the group's (pointwise ops and simple
    reductions: the elementwise curves)."""
    if not op.members:
        kind = operator_kind(op.aten)
        return (cm.compute.time_s(op.family, op.flops_fwd / ws, local_bytes, cm.device, dtype, align, kind),
                cm.compute.time_s(op.family, op.flops_bwd / ws, _BACKWARD_BYTES_FACTOR * local_bytes,
                                  cm.device, dtype, align, kind))
    moved = sum(b for _, b in op.members)
    whole = sum(s.nbytes for s in op.operands) + op.output.nbytes
    local = local_bytes / whole if whole else 0.0        # sharding and precision, as the group's
    fwd = bwd = 0.0
    for kind, b in op.members:
        share = b / moved if moved else 1.0 / len(op.members)
        fwd += cm.compute.time_s("elementwise", op.flops_fwd * share / ws, b * local, cm.device, dtype, align, kind)
        bwd += cm.compute.time_s("elementwise", op.flops_bwd * share / ws, _BACKWARD_BYTES_FACTOR * b * local,
                                 cm.device, dtype, align, kind)
    return fwd, bwd


def _axis_transient_bytes(p: int, n: float, h: Placement, w: Placement, is_aligned: bool, on_cpu: bool) -> float:
    """What the backward of a layout move holds on one axis (a move holds the largest over
    its axes, which move one after another): the local gradient and, for the gradient of a
    slice, that gradient gathered whole; for an all-to-all one more local-size buffer, or on
    gloo, which has none, the whole tensor gathered and the chunks it keeps concatenated (two
    whole-tensor buffers)."""
    hs, ws = isinstance(h, Shard), isinstance(w, Shard)
    if isinstance(h, Replicate) and ws:
        return n + n / p
    if hs and ws and not is_aligned:
        return (2 * n if on_cpu else n / p) + n / p
    return 0.0


def _axis_forward_bytes(p: int, n: float, h: Placement, w: Placement, is_aligned: bool, on_cpu: bool) -> float:
    """What a layout move holds in forward beside its input, on one axis (the move: the
    largest over its axes): a gather's whole tensor, and when it gathers a dimension other
    than the first, the chunks concatenated (DTensor gathers along dimension 0); a
    reduction's new output; an all-to-all as in :func:`_axis_transient_bytes`; a slice's
    local copy."""
    hs, ws = isinstance(h, Shard), isinstance(w, Shard)
    if hs and isinstance(w, Replicate):
        return n if h.dim == 0 else 2 * n
    if hs and ws and not is_aligned:
        return (2 * n if on_cpu else n / p) + n / p
    if isinstance(h, Partial):
        return n / p if ws else n
    if isinstance(h, Replicate) and ws:
        return n / p
    return 0.0


def edge_tables(cm: CostModel, graph: OpGraph, edge: Edge, src_cfgs: list[OpConfig],
                dst_cfgs: list[OpConfig], mesh: Mesh) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For one edge: the ``(K_src, K_dst, 2)`` table of (time_s, memory_bytes) the engine adds
    up, and the ``(K_src, K_dst)`` bytes the layout move holds in backward
    (:func:`_axis_transient_bytes`) and in forward (:func:`_axis_forward_bytes`).

    A move is priced axis by axis (``traffic.relayout_moves``) and what one axis does depends
    only on the producer's placement there and on the consumer's placement, partial gradient
    and other axes' shards, so each axis is priced once per distinct pair of those and the
    table is their sum (times, in the order ``CostModel.moves_s`` adds them) or maximum (bytes)."""
    src, dst = graph.operators[edge.src], graph.operators[edge.dst]
    d_term = dst.terms[0][edge.operand]
    spec = dst.operands[edge.operand]
    nbytes = spec.nbytes * cm.training.scale(spec)
    have = [output_placements(src, c) for c in src_cfgs]
    want = [term_placements(c, d_term) for c in dst_cfgs]
    partial = [grad_partial(c, d_term) for c in dst_cfgs]
    price = cm.collectives.time_s
    total = np.zeros((len(have), len(want)))
    calls = np.zeros((len(have), len(want)))
    held = np.zeros((len(have), len(want)))
    ahead = np.zeros((len(have), len(want)))
    for a, p in enumerate(mesh.shape):
        if p == 1:
            continue
        on_cpu = mesh.links[a].name == CPU_LINK_NAME
        h_ids: dict = {}
        w_ids: dict = {}
        hi = np.array([h_ids.setdefault(h[a], len(h_ids)) for h in have])
        wi = np.array([w_ids.setdefault((w[a], gp[a], axis_divisor(w, mesh.shape, a)), len(w_ids))
                       for w, gp in zip(want, partial)])
        # per pair: its (at most two) moves' prices in order, calls, held and ahead bytes
        per = np.zeros((5, len(h_ids), len(w_ids)))
        for h, i in h_ids.items():
            for (w, gp, divisor), j in w_ids.items():
                n = nbytes / divisor
                same = aligned(h, w, edge.dim_map)
                moves = axis_relayout_moves(a, p, n, h, w, same, gp)
                for k, move in enumerate(moves):
                    per[k, i, j] = sum(price(c.kind, c.bytes, mesh, c.axis) for c in move)
                per[2, i, j] = sum(len(m) for m in moves)
                per[3, i, j] = _axis_transient_bytes(p, n, h, w, same, on_cpu)
                per[4, i, j] = _axis_forward_bytes(p, n, h, w, same, on_cpu)
        pick = np.ix_(hi, wi)
        total = total + per[0][pick]
        total = total + per[1][pick]
        calls += per[2][pick]
        held = np.maximum(held, per[3][pick])
        ahead = np.maximum(ahead, per[4][pick])
    table = np.zeros((len(src_cfgs), len(dst_cfgs), 2))
    table[..., 0] = cm.fitted_moves_s(total, calls)
    return table, held, ahead
