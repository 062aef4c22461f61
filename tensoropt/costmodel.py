"""Analytical cost of one training iteration, per operator configuration and per edge.

Time (seconds, one forward + backward, no overlap assumed):

* compute — forward and backward FLOPs and bytes of the local shard, priced by the
  :class:`~tensoropt.compute.ComputeModel` (work is divided by the mesh axes that split
  some label; an axis that splits nothing repeats the work);
* parameter-gradient all-reduce — a parameter replicated along an axis over which the
  operator splits another label (batch, say) ends the step with partial gradients there;
* re-layout on every edge (:func:`edge_tables`), per mesh axis, producer output
  placement → consumer operand placement, forward and backward:

  ===============  =======================  ======================================
  producer→consumer forward                 backward
  ===============  =======================  ======================================
  R → R            —                         —
  R → S            slice (free)              all-gather of the gradient
  S(d) → S(d)      —                         —
  S(d) → S(d')     all-to-all                all-to-all
  S → R            all-gather                slice (free)
  P → R            all-reduce                —
  P → S            reduce-scatter            all-gather
  ===============  =======================  ======================================

  and when the consumer splits some label along the axis while this operand is
  replicated there, the operand's gradient arrives as partial sums: an all-reduce
  (reduce-scatter when the producer is sharded) in backward — Megatron's ``f``.

Memory (bytes per device, resident at the peak at the end of the forward pass):
parameters, gradients and optimizer state of the local parameter shard
(:class:`TrainingConfig` gives bytes per parameter), plus the activations each operator
saves for backward, sharded like the term they belong to. A parameter used by several
operators (tied weights) is charged once, at its first user.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .collectives import CollectiveModel
from .execution import batch_statistics_axes, batch_statistics_bytes
from .compute import ComputeModel, default_compute_model
from .hardware import Device
from .mesh import CPU_LINK_NAME, Mesh
from .opgraph import Edge, Operator, OpGraph
from .placement import Partial, Placement, Replicate, Shard
from .strategy import OpConfig, term_placements

__all__ = ["TrainingConfig", "CostModel", "NodeCost", "PRECISIONS", "OPTIMIZERS", "ZERO_STAGES"]

ZERO_STAGES = (0, 1, 2, 3)

PRECISIONS = ("fp32", "bf16-mixed")
OPTIMIZERS = ("adam", "sgd", "sgd-momentum")

# Bytes per parameter: (parameter, gradient, optimizer state). Mixed precision keeps an
# fp32 master copy in the optimizer state: 2 + 2 + 12 = 16 for Adam (ZeRO paper, costs.md).
_STATE_BYTES = {
    ("fp32", "adam"): (4, 4, 8),
    ("fp32", "sgd"): (4, 4, 0),
    ("fp32", "sgd-momentum"): (4, 4, 4),
    ("bf16-mixed", "adam"): (2, 2, 12),
    ("bf16-mixed", "sgd"): (2, 2, 4),
    ("bf16-mixed", "sgd-momentum"): (2, 2, 8),
}
_BACKWARD_BYTES_FACTOR = 2.0   # backward reads the forward's operands and writes their gradients


@dataclass(frozen=True)
class TrainingConfig:
    precision: str = "fp32"      # "fp32" or "bf16-mixed"
    optimizer: str = "adam"

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {PRECISIONS}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {OPTIMIZERS}")

    @property
    def state_bytes_per_param(self) -> tuple[int, int, int]:
        """(parameter, gradient, optimizer state) bytes per parameter."""
        return _STATE_BYTES[(self.precision, self.optimizer)]

    @property
    def activation_itemsize(self) -> int:
        return 2 if self.precision == "bf16-mixed" else 4

    @property
    def compute_dtype(self) -> str:
        return "bf16" if self.precision == "bf16-mixed" else "fp32"


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

    @property
    def time_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def memory_bytes(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes


@dataclass(frozen=True)
class CostModel:
    device: Device
    compute: ComputeModel | None = None          # None: datasheet defaults for the device
    collectives: CollectiveModel = field(default_factory=CollectiveModel)
    training: TrainingConfig = field(default_factory=TrainingConfig)

    def __post_init__(self):
        if self.compute is None:
            object.__setattr__(self, "compute", default_compute_model(self.device, self.training.compute_dtype))

    # ------------------------------------------------------------------ nodes

    def node_cost(self, op: Operator, cfg: OpConfig, mesh: Mesh, owns_params: bool = True,
                  zero_stage: int = 0) -> NodeCost:
        """Cost of ``op`` in configuration ``cfg``; ``owns_params=False`` for a later user of a
        tied parameter (its state is charged at the first user). ``zero_stage`` shards the
        optimizer state (1), + gradients (2), + parameters (3) over the axes where the
        parameter is replicated while the operator splits something else."""
        if zero_stage not in ZERO_STAGES:
            raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, got {zero_stage!r}")
        return _node_cost(self, op, cfg, mesh, owns_params, zero_stage)

    def _scale(self, spec) -> float:
        """Bytes of a captured float tensor at the training precision (integers keep theirs)."""
        if spec.dtype.startswith("float") or spec.dtype.startswith("bfloat"):
            return self.training.activation_itemsize / spec.itemsize
        return 1.0

    # ------------------------------------------------------------------ edges

    def redistribute_s(self, nbytes: float, have: tuple[Placement, ...], want: tuple[Placement, ...],
                       aligned: tuple[bool, ...], grad_partial: tuple[bool, ...], mesh: Mesh) -> float:
        """Forward + backward time to move a tensor of ``nbytes`` (full size) from placements
        ``have`` to ``want``; ``aligned[a]``: have and want shard the same dimension on axis a."""
        return _redistribute_s(self.collectives, nbytes, have, want, aligned, grad_partial, mesh)


def _node_cost(cm: CostModel, op: Operator, cfg: OpConfig, mesh: Mesh, owns_params: bool,
               zero_stage: int) -> NodeCost:
    shape = mesh.shape
    terms, out = op.terms
    ws = cfg.work_shards(shape)
    dtype = cm.training.compute_dtype
    local_bytes = sum(spec.nbytes * cm._scale(spec) / cfg.shards(t, shape) for t, spec in zip(terms, op.operands))
    local_bytes += op.output.nbytes * cm._scale(op.output) / cfg.shards(out, shape)
    forward = cm.compute.time_s(op.family, op.flops_fwd / ws, local_bytes, cm.device, dtype)
    compute = forward + cm.compute.time_s(op.family, op.flops_bwd / ws, _BACKWARD_BYTES_FACTOR * local_bytes,
                                          cm.device, dtype)
    comm = 0.0
    p_bytes = g_bytes = o_bytes = gathered = fresh = regathered = 0.0
    bp, bg, bo = cm.training.state_bytes_per_param
    for t, spec, pname in zip(terms, op.operands, op.param_names):
        if pname is None or not owns_params:
            continue
        local_numel = spec.numel / cfg.shards(t, shape)
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
        fresh += bg * local_numel / (d if zero_stage >= 3 else 1)   # ZeRO-3: the rest is in ``gathered``
        o_bytes += bo * local_numel / (d if zero_stage >= 1 else 1)
        for axis in data_axes:
            if zero_stage == 0:
                comm += cm.collectives.time_s("all_reduce", bg * local_numel, mesh, axis)
            else:
                # reduce-scatter the gradients; all-gather the parameters once after the step
                # (stages 1-2) or before forward and again before backward (stage 3)
                gathers = 2 if zero_stage == 3 else 1
                comm += (cm.collectives.time_s("reduce_scatter", bg * local_numel, mesh, axis)
                         + gathers * cm.collectives.time_s("all_gather", bp * local_numel, mesh, axis))
    # Batch statistics over a split batch are synchronised (SyncBatchNorm): per local channel
    # the sums of x and x^2 all-reduced forward, of dy and dy*xhat backward.
    for axis in batch_statistics_axes(op, cfg):
        comm += 2 * cm.collectives.time_s("all_reduce", batch_statistics_bytes(op, cfg, shape), mesh, axis)
    act = 0.0
    for i in op.saved_operands:
        t, spec = (out, op.output) if i == -1 else (terms[i], op.operands[i])
        act += spec.nbytes * cm._scale(spec) / cfg.shards(t, shape)
    # Extras (masks, statistics) are sharded like the output; a loss's scalar output has no
    # dims, and its extras (the log-softmax) are shaped like its first input.
    extra_term = out or terms[0]
    act += op.saved_extra_bytes * cm._scale(op.output) / cfg.shards(extra_term, shape)
    grad_out = op.output.nbytes * cm._scale(op.output) / cfg.shards(out, shape) if out else 0.0
    grad_in = max((spec.nbytes * cm._scale(spec) / cfg.shards(t, shape)
                   for t, spec, pname in zip(terms, op.operands, op.param_names) if pname is None), default=0.0)
    # what capture measured beyond these (cross-entropy's second gradient of the logits, through
    # nll_loss then log_softmax; attention's three input gradients; a fused group's intermediates)
    grad_in += op.backward_extra_bytes * cm._scale(op.output) / cfg.shards(extra_term, shape)
    return NodeCost(compute, comm, forward, p_bytes, g_bytes, o_bytes, act, grad_out + grad_in + fresh + gathered,
                    grad_out, regathered)


def _axis_moves(nbytes: float, have, want, mesh: Mesh):
    """Per mesh axis of more than one device: ``(axis, size, bytes it moves, have, want)``;
    the other axes' sharding divides what this axis moves."""
    for a, (h, w) in enumerate(zip(have, want)):
        p = mesh.shape[a]
        if p == 1:
            continue
        others = math.prod(mesh.shape[b] for b in range(len(have)) if b != a and isinstance(want[b], Shard))
        yield a, p, nbytes / others, h, w


def _redistribute_s(col: CollectiveModel, nbytes, have, want, aligned, grad_partial, mesh: Mesh) -> float:
    total = 0.0
    for a, p, n, h, w in _axis_moves(nbytes, have, want, mesh):
        hs, ws = isinstance(h, Shard), isinstance(w, Shard)
        if isinstance(h, Replicate) and ws:
            total += col.time_s("all_gather", n, mesh, a)                      # backward
        elif hs and ws and not aligned[a]:
            total += 2 * col.time_s("all_to_all", n / p, mesh, a)
        elif hs and isinstance(w, Replicate):
            total += col.time_s("all_gather", n, mesh, a)                      # forward
        elif isinstance(h, Partial) and isinstance(w, Replicate):
            total += col.time_s("all_reduce", n, mesh, a)
        elif isinstance(h, Partial) and ws:
            total += col.time_s("reduce_scatter", n, mesh, a) + col.time_s("all_gather", n, mesh, a)
        if grad_partial[a]:
            kind = "reduce_scatter" if hs else "all_reduce"
            total += col.time_s(kind, n, mesh, a)
    return total


def _relayout_transient_bytes(nbytes: float, have, want, aligned, mesh: Mesh) -> float:
    """What the backward of a layout move holds (the largest over the axes, which move one
    after another): the local gradient and, for the gradient of a slice, that gradient
    gathered whole; for an all-to-all one more local-size buffer, or on gloo, which has none,
    the whole tensor gathered and the chunks it keeps concatenated (two whole-tensor buffers)."""
    most = 0.0
    for a, p, n, h, w in _axis_moves(nbytes, have, want, mesh):
        hs, ws = isinstance(h, Shard), isinstance(w, Shard)
        if isinstance(h, Replicate) and ws:
            most = max(most, n + n / p)
        elif hs and ws and not aligned[a]:
            most = max(most, (2 * n if mesh.links[a].name == CPU_LINK_NAME else n / p) + n / p)
    return most


def _relayout_forward_bytes(nbytes: float, have, want, aligned, mesh: Mesh) -> float:
    """What a layout move holds in forward beside its input (the largest over the axes): a
    gather's whole tensor, and when it gathers a dimension other than the first, the chunks
    concatenated (DTensor gathers along dimension 0); a reduction's new output; an all-to-all
    as in :func:`_relayout_transient_bytes`; a slice's local copy."""
    most = 0.0
    for a, p, n, h, w in _axis_moves(nbytes, have, want, mesh):
        hs, ws = isinstance(h, Shard), isinstance(w, Shard)
        if hs and isinstance(w, Replicate):
            most = max(most, n if h.dim == 0 else 2 * n)
        elif hs and ws and not aligned[a]:
            most = max(most, (2 * n if mesh.links[a].name == CPU_LINK_NAME else n / p) + n / p)
        elif isinstance(h, Partial):
            most = max(most, n / p if ws else n)
        elif isinstance(h, Replicate) and ws:
            most = max(most, n / p)
    return most


def edge_tables(cm: CostModel, graph: OpGraph, edge: Edge, src_cfgs: list[OpConfig],
                dst_cfgs: list[OpConfig], mesh: Mesh) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For one edge: the ``(K_src, K_dst, 2)`` table of (time_s, memory_bytes) the engine adds
    up, and the ``(K_src, K_dst)`` bytes the layout move holds in backward
    (:func:`_relayout_transient_bytes`) and in forward (:func:`_relayout_forward_bytes`)."""
    src, dst = graph.operators[edge.src], graph.operators[edge.dst]
    s_terms, s_out = src.terms
    contracted = "".join(c for t in s_terms for c in t if c not in s_out)
    d_terms, _ = dst.terms
    d_term = d_terms[edge.operand]
    spec = dst.operands[edge.operand]
    nbytes = spec.nbytes * cm._scale(spec)
    have = [term_placements(c, s_out, contracted) for c in src_cfgs]
    want = [term_placements(c, d_term) for c in dst_cfgs]
    partial = [tuple(s is not None and s not in d_term for s in c.splits) for c in dst_cfgs]
    h_keys = {h: i for i, h in enumerate(dict.fromkeys(have))}
    w_keys = {w: i for i, w in enumerate(dict.fromkeys(zip(want, partial)))}
    times = np.zeros((len(h_keys), len(w_keys)))
    held = np.zeros((len(h_keys), len(w_keys)))
    ahead = np.zeros((len(h_keys), len(w_keys)))
    for h, i in h_keys.items():
        for (w, gp), j in w_keys.items():
            aligned = tuple(_aligned(hp, wp, edge.dim_map) for hp, wp in zip(h, w))
            times[i, j] = cm.redistribute_s(nbytes, h, w, aligned, gp, mesh)
            held[i, j] = _relayout_transient_bytes(nbytes, h, w, aligned, mesh)
            ahead[i, j] = _relayout_forward_bytes(nbytes, h, w, aligned, mesh)
    pick = np.ix_([h_keys[h] for h in have], [w_keys[k] for k in zip(want, partial)])
    table = np.zeros((len(src_cfgs), len(dst_cfgs), 2))
    table[..., 0] = times[pick]
    return table, held[pick], ahead[pick]


def _aligned(have: Placement, want: Placement, dim_map: tuple[int | None, ...]) -> bool:
    """Both shard, and the consumer's dimension is the producer's seen through the views."""
    return (isinstance(have, Shard) and isinstance(want, Shard) and want.dim < len(dim_map)
            and dim_map[want.dim] == have.dim)
