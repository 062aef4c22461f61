"""A plan's predicted collectives, as data, following the cost model's rules (``costmodel``).

For one training step (forward + backward) of a :class:`~tensoropt.plan.Plan`:

* every edge (producer output -> consumer operand) is re-laid out per mesh axis as in the
  costmodel table (R->S: all-gather of the gradient in backward; S(d)->S(d'): all-to-all
  both ways; S->R: all-gather forward; P->R: all-reduce forward; P->S: reduce-scatter
  forward and all-gather backward), plus the partial-sum gradient (all-reduce, or
  reduce-scatter when the producer is sharded) when the consumer splits a label along the
  axis while this operand is replicated there;
* every parameter replicated along an axis over which its (first) user splits another
  label gets its gradient all-reduced there.

Bytes per collective follow ``apply.measure``: the full buffer on one rank -- the
all-reduced tensor, the gathered output of an all-gather, the input of a reduce-scatter, the
input (local shard) of an all-to-all. ``n`` is the tensor's bytes divided by the shards of
the *other* axes, as in ``costmodel._redistribute_s``.

Collectives the apply layer issues that the cost model does not price are listed with
``priced=False``: the reported loss value's all-reduce, and the re-layout of a tied
parameter for a later user that needs another layout than its first user's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass

from .costmodel import TrainingConfig
from .opgraph import OpGraph
from .plan import Plan
from .execution import batch_statistics_axes, batch_statistics_bytes
from .placement import Partial, Replicate, Shard
from .strategy import OpConfig, term_placements

__all__ = ["Collective", "predicted_collectives", "summarize", "compare"]


@dataclass(frozen=True)
class Collective:
    kind: str            # all_reduce, all_gather, reduce_scatter, all_to_all
    axis: int            # mesh axis
    bytes: float         # bytes per step (full buffer on one rank, see module doc)
    phase: str           # "forward" or "backward"
    where: str           # e.g. "edge layers.0 -> gelu", "grad layers.0.weight"
    priced: bool = True  # False: issued by the apply layer, not in the cost model

    def to_dict(self) -> dict:
        return asdict(self)


def _scale(spec, training: TrainingConfig) -> float:
    if spec.dtype.startswith("float") or spec.dtype.startswith("bfloat"):
        return training.activation_itemsize / spec.itemsize
    return 1.0


def _dim(p) -> int | None:
    return p.dim if isinstance(p, Shard) else None


def predicted_collectives(plan: Plan, graph: OpGraph, *, include_unpriced: bool = True,
                          apply_mode: str | None = None) -> list[Collective]:
    """Every collective one training step of ``plan`` issues according to the cost model.

    ``graph``: the model's captured OpGraph (``tensoropt.capture.capture`` or
    ``tensoropt.apply.capture_for_plan``). ``apply_mode``: "replicate" or "dtensor" (how
    ``tensoropt.apply`` lays the plan out) to add the apply layer's unpriced collectives.
    """
    if [o.name for o in graph.operators] != [o.name for o in plan.ops]:
        raise ValueError("plan and graph list different operators: capture the plan's own model")
    training = TrainingConfig(plan.training.get("precision", "fp32"), plan.training.get("optimizer", "adam"))
    shape = tuple(plan.mesh_shape)
    cfgs = [OpConfig.parse(o.config) for o in plan.ops]
    out: list[Collective] = []
    bp, bg, _ = training.state_bytes_per_param
    zero = getattr(plan, "zero_stage", 0) or 0
    seen_params: set[str] = set()
    for op, cfg in zip(graph.operators, cfgs):
        terms, _ = op.terms
        for t, spec, pname in zip(terms, op.operands, op.param_names):
            if pname is None or pname in seen_params:
                continue
            seen_params.add(pname)
            local = spec.numel / cfg.shards(t, shape)
            for axis, s in enumerate(cfg.splits):
                if s is None or s in t or shape[axis] == 1:
                    continue
                if zero == 0:
                    out.append(Collective("all_reduce", axis, bg * local, "backward", f"grad {pname}"))
                    continue
                # ZeRO: reduce-scatter the gradient; all-gather the parameter before forward
                # (and again before backward at stage 3)
                out.append(Collective("reduce_scatter", axis, bg * local, "backward", f"grad {pname}"))
                out.append(Collective("all_gather", axis, bp * local, "forward", f"param {pname}"))
                if zero == 3:
                    out.append(Collective("all_gather", axis, bp * local, "backward", f"param {pname}"))
    for op, cfg in zip(graph.operators, cfgs):
        stats = batch_statistics_bytes(op, cfg, shape)
        for a in batch_statistics_axes(op, cfg):
            if shape[a] > 1:
                out.append(Collective("all_reduce", a, stats, "forward", f"batch statistics of {op.name}"))
                out.append(Collective("all_reduce", a, stats, "backward", f"statistics gradients of {op.name}"))
    moved: set = set()
    for e in graph.edges:
        src, dst = graph.operators[e.src], graph.operators[e.dst]
        s_terms, s_out = src.terms
        contracted = "".join(c for t in s_terms for c in t if c not in s_out)
        d_term = dst.terms[0][e.operand]
        spec = dst.operands[e.operand]
        have = term_placements(cfgs[e.src], s_out, contracted)
        # consumers of one node wanting one layout share the move (tensoropt.apply does)
        want = term_placements(cfgs[e.dst], d_term)
        gpart = tuple(s is not None and s not in d_term for s in cfgs[e.dst].splits)
        node = dst.operand_nodes[e.operand] if dst.operand_nodes else f"{e.src}->{e.dst}:{e.operand}"
        if (node, want, gpart) in moved:
            continue
        moved.add((node, want, gpart))
        out += _relayout(have, cfgs[e.dst], d_term, spec.nbytes * _scale(spec, training), e.dim_map, shape,
                         f"edge {src.name} -> {dst.name}[{e.operand}]", True)
    if include_unpriced:
        # A tied parameter lives in its first user's layout; a later user needing another
        # layout re-lays it out like an edge (the cost model charges nothing for it).
        owner: dict[str, tuple[str, ...]] = {}
        first_move: dict[str, tuple] = {}
        for op, cfg in zip(graph.operators, cfgs):
            for k, (t, spec, pname) in enumerate(zip(op.terms[0], op.operands, op.param_names)):
                if pname is None:
                    continue
                gpart = tuple(s_ is not None and s_ not in t for s_ in cfg.splits)
                node = op.operand_nodes[k] if op.operand_nodes else None
                if pname not in owner:
                    owner[pname] = term_placements(cfg, t)
                    first_move[pname] = (node, owner[pname], gpart)
                    continue
                if owner[pname] == term_placements(cfg, t):
                    # same layout: the operator-level layout reduces this use's gradient on
                    # its own where the user leaves it partial (the planner prices that at the
                    # later user); FSDP2 ("replicate" mode) sums the uses before one reduction,
                    # and so does the operator-level layout when both uses read the parameter
                    # through one node (they share the move)
                    if apply_mode == "replicate" or (node is not None and first_move[pname] == (node, owner[pname], gpart)):
                        continue
                    local = spec.numel / cfg.shards(t, shape)
                    for a, s_ in enumerate(cfg.splits):
                        if s_ is not None and s_ not in t and shape[a] > 1:
                            out.append(Collective("all_reduce", a, bg * local, "backward",
                                                  f"grad of tied {pname} from {op.name}", True))
                    continue
                dim_map = tuple(range(len(t)))
                out += _relayout(owner[pname], cfg, t, spec.nbytes * _scale(spec, training), dim_map, shape,
                                 f"tied parameter {pname} for {op.name}", False)
    if include_unpriced and apply_mode is not None and math.prod(shape) > 1:
        loss_cfg = cfgs[-1]
        if apply_mode == "replicate":
            out.append(Collective("all_reduce", -1, 4, "forward", "reported loss value", priced=False))
        else:
            last = graph.operators[-1]
            lt, lo = last.terms
            contracted = "".join(c for t in lt for c in t if c not in lo)
            for a, p in enumerate(term_placements(loss_cfg, lo, contracted)):
                if isinstance(p, Partial) and shape[a] > 1:
                    out.append(Collective("all_reduce", a, 4, "forward", "reported loss value", priced=False))
    return out


def _relayout(have, dst_cfg: OpConfig, d_term: str, nbytes: float, dim_map, shape, where: str,
              priced: bool) -> list[Collective]:
    """The costmodel table for one producer layout -> consumer operand (see module doc)."""
    out = []
    want = term_placements(dst_cfg, d_term)
    gpart = tuple(s is not None and s not in d_term for s in dst_cfg.splits)
    for a, (h, w) in enumerate(zip(have, want)):
        p = shape[a]
        if p == 1:
            continue
        others = math.prod(shape[b] for b in range(len(have)) if b != a and isinstance(want[b], Shard))
        n = nbytes / others
        hs, ws = isinstance(h, Shard), isinstance(w, Shard)
        dh, dw = _dim(h), _dim(w)
        aligned = dh is not None and dw is not None and dw < len(dim_map) and dim_map[dw] == dh
        if isinstance(h, Replicate) and ws:
            out.append(Collective("all_gather", a, n, "backward", where, priced))
        elif hs and ws and not aligned:
            out.append(Collective("all_to_all", a, n / p, "forward", where, priced))
            out.append(Collective("all_to_all", a, n / p, "backward", where, priced))
        elif hs and isinstance(w, Replicate):
            out.append(Collective("all_gather", a, n, "forward", where, priced))
        elif isinstance(h, Partial) and isinstance(w, Replicate):
            out.append(Collective("all_reduce", a, n, "forward", where, priced))
        elif isinstance(h, Partial) and ws:
            out.append(Collective("reduce_scatter", a, n, "forward", where, priced))
            out.append(Collective("all_gather", a, n, "backward", where, priced))
        if gpart[a]:
            out.append(Collective("reduce_scatter" if hs else "all_reduce", a, n, "backward",
                                  where + " (partial gradient)", priced))
    return out


def summarize(colls: list[Collective]) -> dict[str, dict]:
    """``{kind: {"count", "bytes"}}`` over a list of collectives."""
    res: dict[str, dict] = defaultdict(lambda: {"count": 0, "bytes": 0.0})
    for c in colls:
        res[c.kind]["count"] += 1
        res[c.kind]["bytes"] += c.bytes
    return dict(res)


def compare(predicted: dict[str, dict], measured: dict[str, dict], *, gloo: bool = True) -> dict[str, dict]:
    """Per kind: predicted and measured count and bytes and the relative byte error.

    ``gloo``: gloo has no all-to-all; DTensor falls back to all-gather + chunk, whose full
    buffer is ``p`` times the all-to-all's input: predicted all-to-alls are compared as
    all-gathers of that size (``p`` unknown here: pass ``predicted`` from
    :func:`summarize_for_backend`)."""
    kinds = sorted(set(predicted) | set(measured))
    out = {}
    for k in kinds:
        p = predicted.get(k, {"count": 0, "bytes": 0.0})
        m = measured.get(k, {"count": 0, "bytes": 0})
        rel = abs(m["bytes"] - p["bytes"]) / p["bytes"] if p["bytes"] else (0.0 if not m["bytes"] else float("inf"))
        out[k] = {"predicted_count": p["count"], "measured_count": m["count"],
                  "predicted_bytes": p["bytes"], "measured_bytes": m["bytes"], "rel_bytes": rel}
    return out


def summarize_for_backend(colls: list[Collective], mesh_shape: tuple[int, ...], backend: str = "gloo") -> dict:
    """Like :func:`summarize`, with all-to-alls as the backend issues them (gloo: all-gather
    of the full ``n`` bytes)."""
    if backend != "gloo":
        return summarize(colls)
    conv = [Collective("all_gather", c.axis, c.bytes * mesh_shape[c.axis], c.phase, c.where, c.priced)
            if c.kind == "all_to_all" else c for c in colls]
    return summarize(conv)
