"""Capture a PyTorch model's training step as an :class:`~tensoropt.opgraph.OpGraph`.

``capture(model, inputs)`` exports ``model(*inputs)`` (whose forward returns the scalar loss)
with ``torch.export`` on meta tensors -- a model built under ``torch.device("meta")`` is
captured without allocating its parameters -- and turns the aten graph into operators.

What becomes an operator, what is folded
    * compute ops become operators: linear/addmm/mm/matmul/bmm/einsum ("linear" when an
      operand is a parameter, else "matmul"), scaled_dot_product_attention ("attention"),
      convolutions ("conv"), layer/rms/batch/group norms ("norm"), (log_)softmax, embedding,
      pooling, reductions (sum/mean/amax/var...), losses (cross_entropy/nll/mse/...), and
      pointwise ops incl. dropout, casts, cat/stack/repeat ("elementwise").
    * all pointwise (and, in a module whose class name contains "norm", reduction) ops of one
      call of a leaf module (no child modules) that expose a single result are fused into one
      operator: a hand-written RMSNorm is one "norm" operator, a tanh-GELU module one
      "elementwise" operator.
    * views fold into edges: view/reshape/flatten/unflatten/transpose/permute/t/expand/
      (un)squeeze/contiguous/clone/slice/select/split/chunk/unbind/getitem/same-dtype casts,
      of activations and of parameters (a parameter seen through a view keeps its FQN and
      appears with the viewed shape; a view that keeps only part of a parameter, e.g.
      ``pos_emb.weight[:T]``, is instead an "elementwise" operator over the whole parameter,
      so that ``OpGraph.params()`` sees its full size). ``Edge.dim_map`` gives, for each consumer-operand dim,
      the producer output dim whose split carries over: view (b,s,h)->(b,s,n,d) maps n<-h
      (the leading factor of a split dim inherits its sharding) and d<-None; a merge
      (b,s,h)->(b*s,h) maps bs<-b; transposes permute; a partial slice or expanded dim <-None.
    * constants (values computed only from buffers/constants/shapes, e.g. ``arange``, masks)
      are not operators; a constant or buffer feeding an operator is an operand with no edge
      (``param_names`` None), like a model input. Parameters are never operators.
    * an op with no rule becomes family "other": replicated only (nothing splittable) and its
      aten name is listed in ``OpGraph.unsupported``.

Label conventions (only relative labels within one operator matter, except 'b')
    'b' batch -- every dim that carries the model inputs' dim 0 (also when merged into b*s);
    's','t','u'.. further leading (sequence) dims; 'k' contracted dim of a linear/matmul;
    'n' output features of a linear ("bsk,nk,n->bsn"); 'i','j' rows/cols of an
    activation-activation matmul ("bnik,bnkj->bnij"); attention "bnsd,bntd,bnte->bnse"
    (n heads, s query / t key sequence, d qk head dim, e value head dim); 'h' hidden
    (embedding "bs,vh->bsh" with 'v' vocabulary, layer norm "bsh,h,h->bsh"); conv
    "bcxy,ocij,o->bopq" (c in / o out channels, x,y,z spatial, i,j,l kernel; an output spatial
    dim keeps its input label when its size is unchanged); pooling "bcxy->bcpq"; loss
    "bv,b->" (v classes). Within one operator a label always has one size: broadcast size-1
    dims, strided spatial dims, concatenated dims get fresh labels, which are never splittable.

Splittable labels (split with at most a partial-sum reduction)
    linear/matmul: all (contracted -> partial sums); attention: batch, heads, query sequence;
    softmax/layer/rms norm: all but the reduced axis; batch norm: batch (per-device statistics,
    as DDP without SyncBatchNorm) and channels; group norm: batch; conv: batch, in and out
    channels (groups == 1; a grouped or depthwise conv only the batch); embedding: all (vocab -> partial sums);
    pooling: batch and channels; sum/mean: all; max/var/..: the kept dims; cross-entropy /
    nll: batch and sequence (not classes); element-wise losses (mse, l1, bce): all dims.

FLOPs
    Measured per operator with ``torch.utils.flop_counter.FlopCounterMode`` by running the
    operator's aten ops forward and backward on meta tensors (so matmul-like backward is
    2x forward when input and weight both need grads, 1x when only one does; fused attention
    backward counts 2.5x). Ops the counter doesn't count use per-element estimates
    (``builder.ELEMENTWISE_FLOPS`` etc.) with backward = forward x ``NONMATMUL_BWD_RATIO``.

Saved activations
    The same meta run records what autograd saves (``saved_tensors_hooks``), matched to
    operands / the output by storage; other saved tensors (masks, mean/rstd, logsumexp,
    intermediates of a fused operator) go to ``saved_extra_bytes``. A tensor saved by several
    operators is attributed to the first one only (storage-level identity: views share it;
    a copying view such as a non-contiguous ``contiguous()`` makes a new tensor). Parameters,
    buffers and constants are never counted. Attention is probed through the fused
    flash/efficient kernels (saving q, k, v, out, logsumexp), not the math fallback.

Blocks
    Operators owned by ``{L}.{i}`` for an ``nn.ModuleList``/``nn.Sequential`` ``L`` (preferring
    one named ``layers``) form ``OpGraph.blocks`` when every block has the same operator
    sequence (family, equation, shapes, splittable, relative parameter names, edges).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
import re
import sys
import warnings

import torch
import torch.nn as nn
from typing import Any

from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ..opgraph import OpGraph, Operator
from .builder import Builder
from .program import Program, dispatched, program_from_export
from ._blocks import find_blocks, resolve_saved
from .inputs import batch_size_of, input_spec, loss_of, split_inputs, training_kwargs

__all__ = ["capture", "capture_program", "CaptureError", "Program"]


class CaptureError(ValueError):
    """The model could not be captured (export failed or forward raised)."""


_DATA_DEPENDENT = re.compile(
    r"data.dependent|GuardOnDataDependent|DataDependent|\.item\(\)|cannot be called on meta|"
    r"nonzero|Dynamic control flow|torch\.cond|unbacked", re.I)


def _has_meta_state(model: nn.Module) -> bool:
    for t in list(model.parameters()) + list(model.buffers()):
        return t.is_meta
    return False


def _prepare_inputs(model: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    meta = _has_meta_state(model)
    seen: set[int] = set()

    def conv(x):
        if not isinstance(x, torch.Tensor):
            return x
        dup = id(x) in seen
        seen.add(id(x))
        if meta:
            # meta copy: shape, strides, dtype, requires_grad; no data is touched
            y = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        elif x.is_meta:
            dev = next((t.device for t in model.parameters()), torch.device("cpu"))
            y = torch.zeros(x.shape, dtype=x.dtype, device=dev)
        elif dup:  # export would merge aliased inputs into one
            y = x.detach().clone()
        else:
            return x
        if x.requires_grad and (y.dtype.is_floating_point or y.dtype.is_complex):
            y.requires_grad_(True)
        return y

    return tree_map(conv, tuple(args)), tree_map(conv, dict(kwargs))


def _first_line(e: BaseException) -> str:
    msg = str(e).strip()
    for line in msg.splitlines():
        if line.strip():
            return f"{type(e).__name__}: {line.strip()}"
    return type(e).__name__


@contextlib.contextmanager
def _eager_attention_masks(kwargs: dict):
    """transformers builds its attention masks as it does in eager mode. Traced, it cannot read
    tensor values, so it keeps a mask it would drop: it takes the positions for packed
    sequences and skips neither the causal nor the bidirectional mask, and then it repeats
    grouped key/value heads instead of ``enable_gqa``. That saves other tensors for backward
    than the training run does, and rules out the flash kernel. In eager mode, with no
    ``position_ids`` given, the positions are a range, so no sequence is packed. With no
    padding mask and equal query and key lengths, the mask is dropped for ``is_causal``. The
    program is specialised to the example inputs' shapes, so the eager choice holds for it.
    Positions or a padding mask the caller passes are still read as unknown."""
    masking = sys.modules.get("transformers.masking_utils")
    names = {"is_torchdynamo_exporting": lambda: False}
    if kwargs.get("position_ids") is None:
        names["find_packed_sequence_indices"] = lambda *a, **k: None
    if masking is None or not all(hasattr(masking, n) for n in names):
        yield
        return
    before = {n: getattr(masking, n) for n in names}
    try:
        for n, f in names.items():
            setattr(masking, n, f)
        yield
    finally:
        for n, f in before.items():
            setattr(masking, n, f)


def _export(model: nn.Module, args: tuple, kwargs: dict, name: str):
    with warnings.catch_warnings(), _eager_attention_masks(kwargs):
        warnings.simplefilter("ignore")
        try:
            return torch.export.export(model, args, kwargs, strict=False)
        except Exception as e:
            first = _first_line(e)
            chain = " ".join(f"{type(x).__name__} {x}" for x in (e, e.__cause__) if x is not None)
            if _DATA_DEPENDENT.search(chain):
                raise CaptureError(
                    f"could not capture {name}: torch.export failed on data-dependent control flow "
                    f"({first}). The forward branches or loops on tensor values, which capture "
                    "cannot trace on meta tensors. Try: make the control flow static (depend on "
                    "shapes or config, not tensor values), pass example inputs of the right shapes, "
                    "or use torch.cond for a value-dependent branch.") from e
            raise CaptureError(
                f"could not capture {name}: the forward raised on the example inputs ({first}). "
                "Check the inputs' shapes and dtypes against what the model expects (pass example "
                "inputs of the right shapes); the forward must return the loss (a scalar tensor, or "
                "an output with a .loss such as a Hugging Face ModelOutput given labels).") from e


def _check_loss(program: Program, name: str) -> None:
    out = next(n for n in program.graph.nodes if n.op == "output")
    flat = list(out.args[0]) if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
    flat = [flat[i] for i in program.user_outputs]
    try:
        result = tree_unflatten(flat, program.out_spec)
    except Exception:  # an output type pytree cannot rebuild: look at the first leaf
        result = flat[0] if flat else None
    loss = loss_of(result)
    val = loss.meta.get("val") if isinstance(loss, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 0:
        what = "no loss" if loss is None else f"a loss of shape {tuple(val.shape) if val is not None else '?'}"
        raise CaptureError(
            f"could not capture {name}: the forward returned {what}. tensoropt plans a training step: the "
            "forward must return the scalar loss, or an output whose .loss is it (for a Hugging Face model, "
            "pass labels among the inputs, e.g. inputs={'input_ids': ids, 'labels': ids}).")


def _returned(program: Program, builder) -> tuple[int, ...]:
    """The operators whose floating-point outputs the forward returns beside the loss."""
    out = next(n for n in program.graph.nodes if n.op == "output")
    flat = list(out.args[0]) if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
    flat = [flat[i] for i in program.user_outputs]
    try:
        loss = loss_of(tree_unflatten(flat, program.out_spec))
    except Exception:  # noqa: BLE001 - as _check_loss: the first leaf
        loss = flat[0] if flat else None
    ops = []
    for n in flat:
        v = builder.vals.get(n) if isinstance(n, torch.fx.Node) and n is not loss else None
        if v is not None and v.kind == "op" and v.spec is not None and v.spec.dtype.startswith(("float", "bfloat")):
            ops.append(v.op)
    return tuple(sorted(set(ops)))


def _names(ops: list[dict]) -> list[str]:
    per_module: dict[str, int] = {}
    for o in ops:
        per_module[o["module"]] = per_module.get(o["module"], 0) + 1
    used: set[str] = set()
    count: dict[str, int] = {}
    out = []
    for o in ops:
        if o["module"] and per_module[o["module"]] == 1 and o["leaf"]:
            base = o["module"]
        else:
            base = f"{o['module']}:{o['short']}" if o["module"] else o["short"]
        n = base
        k = count.get(base, 0)
        if k:
            n = f"{base}_{k}"
        while n in used:
            k += 1
            n = f"{base}_{k}"
        count[base] = k + 1
        used.add(n)
        out.append(n)
    return out


def _with_dispatches(ops: list[Operator], program: Program) -> list[Operator]:
    """``ops`` with ``Operator.dispatches`` set: the calls between operators are shared out
    evenly, so that operators alike (a repeated block's) stay alike."""
    members = {m.split("[")[0] for o in ops for m in o.nodes}
    between = sum(dispatched(n) for n in program.graph.nodes if n.name not in members)
    share = between / len(ops) if ops else 0.0
    return [replace(o, dispatches=max(1, len(o.nodes)) + share) for o in ops]


def capture(model: nn.Module, inputs: Any, *, kwargs: dict | None = None, name: str | None = None) -> OpGraph:
    """Capture ``model``'s training step (its forward, returning the loss) as an operator graph.

    ``inputs``: the example inputs, positional (tuple/list, or one tensor) or keyword (a dict:
    ``{"input_ids": ids, "labels": ids}``). Meta-device models are captured on meta inputs
    (real inputs are converted without touching data); a real model with meta inputs gets
    zero-filled inputs on its device. The batch size is dim 0 of the first tensor input; every
    input whose dim 0 has that size is batched along dim 0. Raises :class:`CaptureError`
    when export fails or the forward returns no scalar loss. ``kwargs``: keyword inputs
    besides positional ``inputs``.
    """
    return capture_program(model, inputs, kwargs=kwargs, name=name)[0]


def capture_program(model: nn.Module, inputs: Any, *, kwargs: dict | None = None,
                    name: str | None = None) -> tuple[OpGraph, Program]:
    """:func:`capture`, and the flat exported program the graph was built from (which the
    apply layer runs)."""
    name = name or type(model).__name__
    args, given = split_inputs(inputs)
    kwargs = training_kwargs(model, {**given, **(kwargs or {})})
    args, kwargs = _prepare_inputs(model, args, kwargs)
    leaves = tree_flatten((args, kwargs))[0]
    flat = [t for t in leaves if isinstance(t, torch.Tensor)]
    batch_size = batch_size_of(args, kwargs)
    program = program_from_export(_export(model, args, kwargs, name))
    _check_loss(program, name)
    user_inputs = [n.name for n in program.placeholders() if program.input_kinds.get(n.name) == "input"]
    input_rg = {}
    if len(user_inputs) != len(leaves):
        raise CaptureError(f"could not capture {name}: {len(leaves)} inputs but the exported program "
                           f"takes {len(user_inputs)}")
    for n, t in zip(user_inputs, leaves):
        input_rg[n] = bool(getattr(t, "requires_grad", False))
    b = Builder(model, program, batch_size, input_rg)
    b.run()
    names = _names(b.ops)
    ops = [Operator(name=n, **{k: v for k, v in o.items() if k not in ("short", "leaf")})
           for n, o in zip(names, b.ops)]
    ops = _with_dispatches(resolve_saved(model, ops, b.save_claims), program)
    blocks, block_modules = find_blocks(model, ops, b.edges)
    graph = OpGraph(name=name, operators=tuple(ops), edges=tuple(b.edges),
                    blocks=blocks, block_modules=block_modules, batch_size=batch_size,
                    returned=_returned(program, b),
                    unsupported=tuple(b.unsupported),
                    input_bytes=sum(t.numel() * t.element_size() for t in flat),
                    inputs=input_spec(args, kwargs))
    return graph, program
