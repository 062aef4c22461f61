"""What a training step communicates, as values: one rule per source of communication.

Each rule turns (an operator or an edge, its configuration, the mesh shape) into a list of
:class:`Collective` values; no torch, no prices:

* :func:`operator_collectives` -- a parameter replicated along an axis over which its
  operator splits another label ends the step with partial gradients there: all-reduced
  (ZeRO 0), or reduce-scattered with the parameter all-gathered before forward (ZeRO 1-2)
  and again before backward (ZeRO 3); a BatchNorm over a split batch all-reduces its
  statistics forward and their gradients backward (``execution.batch_statistics_axes``);
* :func:`relayout_collectives` -- a tensor moved from a producer's layout to a consumer's,
  per mesh axis, forward and backward:

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
  (reduce-scatter when the producer is sharded) in backward — Megatron's ``f``;
* :func:`edge_collectives` -- one edge of the graph: its producer's output re-laid out for
  its consumer's operand;
* :func:`tied_use_collectives` -- a later user of a tied parameter (lm_head using
  tok_emb.weight), priced as if the first user's copy were replicated (``planner``); the
  memory of the copy it works on (:func:`tied_copy`) follows the first user's real layout.

Bytes are the full buffer on one rank: the all-reduced tensor, the gathered output of an
all-gather, the input of a reduce-scatter, the input (local shard) of an all-to-all. A
tensor moved over one axis is divided by the shards the consumer wants on the other axes
(:func:`axis_moves`). Axes of one device issue nothing.

A *move* is the collectives of one tensor's move on one axis (a gather forward, its
gradient's reduction backward) or of one parameter's gradient on one axis (with its ZeRO
gathers): the rules return lists of moves (``*_moves``), or the same collectives one after
another (``*_collectives``). The cost model prices a list (``CostModel.price``: the sum of
each collective's α–β time, added up move by move) for the search and for the calibration's
features (``calibration.step_features`` re-prices a plan); ``comms.predicted_collectives``
concatenates them over a plan and ``comms.issued_collectives`` lists them as the apply layer
runs it, so the search, the listed collectives and the calibration read one set of rules.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterator, Mapping, Sequence

from .execution import batch_statistics_axes, batch_statistics_bytes, groups_parameter_collectives
from .opgraph import Edge, Operator, OpGraph
from .placement import REPLICATE, Partial, Placement, Replicate, Shard, zero_storage
from .strategy import OpConfig, output_placements, term_placements
from .training import TrainingConfig

__all__ = ["Collective", "Move", "is_gradient_reduction", "is_parameter_collective", "flatten", "operator_moves",
           "operator_collectives", "relayout_moves",
           "axis_relayout_moves", "relayout_collectives", "edge_collectives", "tied_use_moves",
           "tied_use_collectives", "axis_moves", "axis_divisor", "aligned", "grad_partial", "owners", "tied_uses",
           "tied_grad_move", "tied_use_label"]


@dataclass(frozen=True)
class Collective:
    kind: str            # all_reduce, all_gather, reduce_scatter, all_to_all
    axis: int            # mesh axis (-1: every axis at once, see ``comms.issued_collectives``)
    bytes: float         # the full buffer on one rank (see module doc)
    phase: str           # "forward" or "backward"
    where: str = ""      # e.g. "edge layers.0 -> gelu[0]", "grad layers.0.weight"
    priced: bool = True  # False: issued by the apply layer, not in the cost model
    # the share of the collective's fixed costs (α, per-call overhead) it carries: below 1 for
    # a parameter's collectives issued with its group's (``execution.latency_shares``)
    latency_share: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)


Move = tuple[Collective, ...]


def is_gradient_reduction(c: Collective) -> bool:
    """A parameter's gradient reduction (``operator_moves``: "grad NAME"), not a tied use's
    own gradient move ("grad of ...", :func:`tied_grad_move`)."""
    return c.where.startswith("grad ") and not c.where.startswith("grad of ")


def is_parameter_collective(c: Collective) -> bool:
    """A parameter's gradient reduction or one of its ZeRO gathers (``operator_moves``): what a
    step that syncs gradients once (``execution.syncs_gradients_once``) issues once."""
    return is_gradient_reduction(c) or c.where.startswith("param ")


def flatten(moves: list[Move]) -> list[Collective]:
    return [c for move in moves for c in move]


def operator_moves(op: Operator, cfg: OpConfig, shape: Sequence[int], training: TrainingConfig,
                   owns_params: bool = True, zero_stage: int = 0,
                   latency_shares: Mapping[str, float] | None = None, fsdp: bool = False) -> list[Move]:
    """An operator's own collectives in configuration ``cfg`` (see module doc), one move per
    parameter and axis (its gradient's reduction and its ZeRO gathers) and per axis its
    BatchNorm statistics cross; ``owns_params=False`` for a later user of a tied parameter
    (its gradient is reduced at the first user). ``latency_shares``: per parameter, the
    share of the fixed costs its collectives carry where they go out with its group's
    (``execution.latency_shares``, ``execution.groups_parameter_collectives``); None: each
    pays them in full. ``fsdp``: the plan runs under FSDP2 (``execution.runs_replicated``)."""
    out: list[Move] = []
    terms, _ = op.terms
    bp, bg, _ = training.state_bytes_per_param
    grouped = latency_shares is not None and groups_parameter_collectives(cfg, shape, zero_stage, fsdp)
    for t, spec, pname in zip(terms, op.operands, op.param_names):
        if pname is None or not owns_params:
            continue
        local = spec.numel / cfg.shards(t, shape)
        share = latency_shares.get(pname, 1.0) if grouped else 1.0
        for axis, s in enumerate(cfg.splits):
            if s is None or s in t or shape[axis] == 1:
                continue
            grad = Collective("all_reduce" if zero_stage == 0 else "reduce_scatter", axis, bg * local, "backward",
                              f"grad {pname}", latency_share=share)
            gather = Collective("all_gather", axis, bp * local, "forward", f"param {pname}", latency_share=share)
            if zero_stage == 0:
                out.append((grad,))
            elif zero_stage == 3:
                # the two gathers first: a move's prices add up in this order, as rs + 2 * ag
                out.append((gather, Collective("all_gather", axis, bp * local, "backward", f"param {pname}",
                                               latency_share=share), grad))
            else:
                out.append((grad, gather))
    stats = None
    for axis in batch_statistics_axes(op, cfg):
        if shape[axis] == 1:
            continue
        stats = batch_statistics_bytes(op, cfg, shape) if stats is None else stats
        out.append((Collective("all_reduce", axis, stats, "forward", f"batch statistics of {op.name}"),
                    Collective("all_reduce", axis, stats, "backward", f"statistics gradients of {op.name}")))
    return out


def operator_collectives(op: Operator, cfg: OpConfig, shape: Sequence[int], training: TrainingConfig,
                         owns_params: bool = True, zero_stage: int = 0,
                         latency_shares: Mapping[str, float] | None = None, fsdp: bool = False
                         ) -> list[Collective]:
    """:func:`operator_moves`, one collective after another."""
    return flatten(operator_moves(op, cfg, shape, training, owns_params, zero_stage, latency_shares, fsdp))


def axis_divisor(want: Sequence[Placement], shape: Sequence[int], a: int) -> int:
    """The shards the consumer wants on the mesh axes other than ``a``, which divide what a
    move over ``a`` carries (:func:`axis_moves`)."""
    return math.prod(shape[b] for b in range(len(want)) if b != a and isinstance(want[b], Shard))


def axis_moves(nbytes: float, have: Sequence[Placement], want: Sequence[Placement],
               shape: Sequence[int]) -> Iterator[tuple[int, int, float, Placement, Placement]]:
    """Per mesh axis of more than one device: ``(axis, size, bytes it moves, have, want)``;
    the other axes' sharding divides what this axis moves."""
    for a, (h, w) in enumerate(zip(have, want)):
        p = shape[a]
        if p == 1:
            continue
        yield a, p, nbytes / axis_divisor(want, shape, a), h, w


def aligned(have: Placement, want: Placement, dim_map: Sequence[int | None]) -> bool:
    """Both shard, and the consumer's dimension is the producer's seen through the views
    between them (``Edge.dim_map``)."""
    return (isinstance(have, Shard) and isinstance(want, Shard) and want.dim < len(dim_map)
            and dim_map[want.dim] == have.dim)


def grad_partial(cfg: OpConfig, term: str) -> tuple[bool, ...]:
    """Per mesh axis: the consumer splits a label this operand lacks, so the operand's
    gradient arrives there as partial sums."""
    return tuple(s is not None and s not in term for s in cfg.splits)


def relayout_moves(nbytes: float, have: Sequence[Placement], want: Sequence[Placement],
                   is_aligned: Sequence[bool], partial: Sequence[bool], shape: Sequence[int],
                   where: str = "") -> list[Move]:
    """The forward and backward collectives that move a tensor of ``nbytes`` (whole) from
    placements ``have`` to ``want``, per axis (:func:`axis_relayout_moves`). ``is_aligned[a]``:
    both shard the same dimension on axis ``a``; ``partial[a]``: the gradient is partial there
    (see module doc)."""
    out: list[Move] = []
    for a, p, n, h, w in axis_moves(nbytes, have, want, shape):
        out += axis_relayout_moves(a, p, n, h, w, is_aligned[a], partial[a], where)
    return out


def axis_relayout_moves(a: int, p: int, n: float, h: Placement, w: Placement, is_aligned: bool, partial: bool,
                        where: str = "") -> list[Move]:
    """On mesh axis ``a`` of ``p`` devices, moving ``n`` bytes (what this axis moves, see
    :func:`axis_moves`) from ``h`` to ``w``: the move itself, and its gradient's reduction
    where it arrives as partial sums (at most two moves, in that order)."""
    out: list[Move] = []
    hs, ws = isinstance(h, Shard), isinstance(w, Shard)
    if isinstance(h, Replicate) and ws:
        out.append((Collective("all_gather", a, n, "backward", where),))
    elif hs and ws and not is_aligned:
        out.append((Collective("all_to_all", a, n / p, "forward", where),
                    Collective("all_to_all", a, n / p, "backward", where)))
    elif hs and isinstance(w, Replicate):
        out.append((Collective("all_gather", a, n, "forward", where),))
    elif isinstance(h, Partial) and isinstance(w, Replicate):
        out.append((Collective("all_reduce", a, n, "forward", where),))
    elif isinstance(h, Partial) and ws:
        out.append((Collective("reduce_scatter", a, n, "forward", where),
                    Collective("all_gather", a, n, "backward", where)))
    if partial:
        out.append((Collective("reduce_scatter" if hs else "all_reduce", a, n, "backward",
                               f"{where} (partial gradient)" if where else "partial gradient"),))
    return out


def relayout_collectives(nbytes: float, have: Sequence[Placement], want: Sequence[Placement],
                         is_aligned: Sequence[bool], partial: Sequence[bool], shape: Sequence[int],
                         where: str = "") -> list[Collective]:
    """:func:`relayout_moves`, one collective after another."""
    return flatten(relayout_moves(nbytes, have, want, is_aligned, partial, shape, where))


def edge_collectives(graph: OpGraph, edge: Edge, src_cfg: OpConfig, dst_cfg: OpConfig, shape: Sequence[int],
                     training: TrainingConfig) -> list[Collective]:
    """The re-layout of ``edge``'s tensor from its producer's output layout to its consumer's
    operand layout."""
    src, dst = graph.operators[edge.src], graph.operators[edge.dst]
    d_term = dst.terms[0][edge.operand]
    spec = dst.operands[edge.operand]
    have = output_placements(src, src_cfg)
    want = term_placements(dst_cfg, d_term)
    return relayout_collectives(spec.nbytes * training.scale(spec), have, want,
                                tuple(aligned(h, w, edge.dim_map) for h, w in zip(have, want)),
                                grad_partial(dst_cfg, d_term), shape,
                                f"edge {src.name} -> {dst.name}[{edge.operand}]")


def owners(graph: OpGraph) -> list[bool]:
    """Per operator: whether it is the first user of all its parameters (a tied parameter's
    state and gradient are charged once, at its first user)."""
    seen: set[str] = set()
    out = []
    for op in graph.operators:
        names = [p for p in op.param_names if p is not None]
        out.append(not any(p in seen for p in names))
        seen.update(names)
    return out


def tied_uses(graph: OpGraph) -> list[tuple[int, int]]:
    """``(operator, operand)`` of every use of a parameter after its first user's (tied weights)."""
    seen: set[str] = set()
    out = []
    for i, op in enumerate(graph.operators):
        for k, pname in enumerate(op.param_names):
            if pname is None:
                continue
            if pname in seen:
                out.append((i, k))
            seen.add(pname)
    return out


def tied_use_moves(op: Operator, operand: int, cfg: OpConfig, shape: Sequence[int],
                   training: TrainingConfig) -> list[Move]:
    """A later user of a tied parameter works on the first user's copy, priced as if that
    copy were replicated: slicing is free forward, the gradient of a sharded use is gathered
    back, and the gradient this user's own splits leave partial is all-reduced (one move over
    those axes)."""
    term = op.terms[0][operand]
    spec = op.operands[operand]
    ndim = len(shape)
    out = relayout_moves(spec.nbytes * training.scale(spec), (REPLICATE,) * ndim, term_placements(cfg, term),
                         (False,) * ndim, (False,) * ndim, shape, tied_use_label(op, operand))
    reduce = tied_grad_move(op, operand, cfg, shape, training)
    return out + [reduce] if reduce else out


def tied_copy(first: Operator, first_operand: int, first_cfg: OpConfig, op: Operator, operand: int,
              cfg: OpConfig, shape: Sequence[int], training: TrainingConfig, zero_stage: int) -> tuple[float, bool]:
    """The copy of a tied parameter that its later user ``op`` works on: (its bytes on one
    device, whether ZeRO-3 regathers it for backward instead of keeping it from forward).
    The parameter is stored as its first user lays it out (and, under ZeRO, sharded over
    that user's data-parallel axes: ``placement.zero_storage``); where ``op`` wants another
    layout, moving it there makes a copy that autograd saves. None where both users split
    only the batch: such plans run under FSDP2, whose one unsharded parameter serves both."""
    spec, first_spec = op.operands[operand], first.operands[first_operand]
    term, first_term = op.terms[0][operand], first.terms[0][first_operand]
    live = [a for a, n in enumerate(shape) if n > 1]
    if all(first_cfg.splits[a] in (None, "b") and cfg.splits[a] in (None, "b") for a in live):
        return 0.0, False
    stored, axes = term_placements(first_cfg, first_term), ()
    if zero_stage:
        stored, axes = zero_storage(stored, grad_partial(first_cfg, first_term), first_spec.shape, shape)
    want = term_placements(cfg, term)
    comparable = tuple(spec.shape) == tuple(first_spec.shape)
    if not comparable and len(spec.shape) == 2 and tuple(spec.shape) == tuple(first_spec.shape)[::-1]:
        want = tuple(Shard(1 - p.dim) if isinstance(p, Shard) else p for p in want)     # used transposed
        comparable = True
    if comparable and stored == want:
        return 0.0, False
    bp, _, _ = training.state_bytes_per_param
    return bp * spec.numel / cfg.shards(term, shape), zero_stage >= 3 and bool(axes)


def tied_use_label(op: Operator, operand: int) -> str:
    return f"tied parameter {op.param_names[operand]} for {op.name}"


def tied_grad_move(op: Operator, operand: int, cfg: OpConfig, shape: Sequence[int],
                   training: TrainingConfig) -> Move:
    """The all-reduce of the parameter gradient a tied parameter's later user leaves partial
    (over the axes where it splits another label), one move over those axes."""
    term = op.terms[0][operand]
    _, bg, _ = training.state_bytes_per_param
    grad = bg * op.operands[operand].numel / cfg.shards(term, shape)
    return tuple(Collective("all_reduce", a, grad, "backward", f"grad of {tied_use_label(op, operand)}")
                 for a, s in enumerate(cfg.splits) if s is not None and s not in term and shape[a] > 1)


def tied_use_collectives(op: Operator, operand: int, cfg: OpConfig, shape: Sequence[int],
                         training: TrainingConfig) -> list[Collective]:
    """:func:`tied_use_moves`, one collective after another."""
    return flatten(tied_use_moves(op, operand, cfg, shape, training))
