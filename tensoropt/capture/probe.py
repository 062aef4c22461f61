"""Run one operator's aten ops on meta tensors to measure FLOPs and what autograd saves.

Nothing is allocated: inputs are fresh meta tensors of the operands' shapes and dtypes (those
that require grad in the real graph get requires_grad). Forward and backward run under
``torch.utils.flop_counter.FlopCounterMode``; the forward also under
``torch.autograd.graph.saved_tensors_hooks``, and each saved tensor is matched to an operand or
the output by storage identity (views of an operand count as the operand). Saved tensors that
are neither (masks, mean/rstd, logsumexp, intermediates of a fused group) add to extra bytes;
saved parameters are ignored.

``dropout`` is probed as ``native_dropout`` (bool mask, as on GPU), and
``scaled_dot_product_attention`` is probed through its fused kernels
(``_scaled_dot_product_flash_attention``, or ``..._efficient_attention`` when there is a mask;
grouped key/value heads, ``enable_gqa``, go to the flash kernel unrepeated):
on meta/CPU the composite would take the math path, which saves the full (s, t) probability
matrix -- not what a GPU training run keeps.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten


@dataclass(frozen=True)
class ProbeInput:
    shape: tuple[int, ...]
    dtype: str
    requires_grad: bool
    is_param: bool


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    flops_fwd: float = 0.0
    flops_bwd: float = 0.0
    saved: tuple[int, ...] = ()     # operand indices; -1 = output
    extra_bytes: int = 0
    backward_extra_bytes: int = 0   # held during backward beyond the gradients the cost model counts
    error: str = ""


_META = torch.device("meta")


def _meta_tensor(p: ProbeInput) -> torch.Tensor:
    dt = getattr(torch, p.dtype)
    t = torch.empty(p.shape, dtype=dt, device=_META)
    if p.requires_grad and (dt.is_floating_point or dt.is_complex):
        t.requires_grad_(True)
    return t


def _sid(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)):
        for v in x:
            if isinstance(v, torch.Tensor):
                return v
    return None


def _sdpa_fused(args, kwargs):
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    a = dict(zip(names, args))
    a.update(kwargs)
    q, k, v = a["query"], a["key"], a["value"]
    mask, p, causal, scale = a.get("attn_mask"), a.get("dropout_p", 0.0), a.get("is_causal", False), a.get("scale")
    if q.dim() != 4 or k.shape[:-2] != v.shape[:-2]:
        return None
    if a.get("enable_gqa"):
        # grouped key/value heads: the flash kernels take them unrepeated (the others repeat them)
        if mask is not None or q.shape[0] != k.shape[0] or q.shape[1] % k.shape[1] or q.shape[-1] != v.shape[-1]:
            return None
        return aten._scaled_dot_product_flash_attention(q, k, v, p, causal, False, scale=scale)[0]
    if q.shape[:-2] != k.shape[:-2]:
        return None
    if mask is None and q.shape[-1] == v.shape[-1]:
        return aten._scaled_dot_product_flash_attention(q, k, v, p, causal, False, scale=scale)[0]
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=_META)  # additive bias, same shape
    return aten._scaled_dot_product_efficient_attention(q, k, v, mask, True, p, causal, scale=scale)[0]


def _fix_device(a):
    return _META if isinstance(a, torch.device) else a


def probe(nodes: list[fx.Node], out_node: fx.Node, externals: list[fx.Node],
          inputs: list[ProbeInput]) -> ProbeResult:
    """Execute `nodes` (in order) with `externals[i]` bound to a meta tensor for `inputs[i]`."""
    try:
        return _probe(nodes, out_node, externals, inputs)
    except Exception as e:  # pragma: no cover - depends on torch meta coverage
        return ProbeResult(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def _probe(nodes, out_node, externals, inputs) -> ProbeResult:
    tensors = [_meta_tensor(p) for p in inputs]
    env: dict[fx.Node, object] = dict(zip(externals, tensors))
    saved: list[torch.Tensor] = []

    def pack(t):
        saved.append(t)
        return t

    def load(a):
        if isinstance(a, fx.Node):
            if a not in env:
                raise KeyError(f"value {a.name} not available to the probe")
            return env[a]
        return _fix_device(a)

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with FlopCounterMode(display=False) as fwd:
            for n in nodes:
                args = fx.node.map_aggregate(n.args, load)
                kwargs = fx.node.map_aggregate(n.kwargs, load)
                res = None
                pk = getattr(n.target, "_overloadpacket", None)
                if len(nodes) == 1 and pk is aten.scaled_dot_product_attention:
                    res = _sdpa_fused(args, kwargs)
                elif pk is aten.dropout and len(args) >= 3 and args[2] and 0 < args[1] < 1:
                    # the CPU composite saves a float mask; GPU kernels keep a bool mask
                    res = aten.native_dropout(args[0], args[1], True)[0]
                env[n] = res if res is not None else n.target(*args, **kwargs)
    out = _first_tensor(env[out_node])
    ff = float(fwd.get_total_flops())

    param_sids = {_sid(t) for t, p in zip(tensors, inputs) if p.is_param}
    in_sids: dict[int, int] = {}
    for i, (t, p) in enumerate(zip(tensors, inputs)):
        if not p.is_param:
            in_sids.setdefault(_sid(t), i)
    out_sid = _sid(out) if out is not None else None
    ops: list[int] = []
    extra: dict[int, int] = {}
    held = _LiveBytes()           # the saved tensors no operand is: freed as the backward goes
    for t in saved:
        if not isinstance(t, torch.Tensor):
            continue
        s = _sid(t)
        if s in param_sids:
            continue
        if s in in_sids:
            if in_sids[s] not in ops:
                ops.append(in_sids[s])
            continue
        if s == out_sid:
            if -1 not in ops:
                ops.append(-1)
        else:
            extra[s] = max(extra.get(s, 0), t.untyped_storage().nbytes(), t.numel() * t.element_size())
        held.track(t)
    # only autograd's graph keeps the intermediates now, as in the training run
    del saved[:]
    env.clear()
    t = args = kwargs = res = None
    at_start = held.total

    fb = 0.0
    bwd_extra = 0
    leaves = [t for t in tensors if t.requires_grad]
    if out is not None and out.requires_grad and leaves:
        held.peak = at_start
        with FlopCounterMode(display=False) as bwd, held:
            torch.autograd.grad(out, leaves, grad_outputs=torch.empty_like(out), allow_unused=True)
        fb = float(bwd.get_total_flops())
        # what the backward holds beyond what the forward saved (the cost model keeps it until
        # the operator's backward ends), the output's gradient, the largest input gradient and
        # the parameters' gradients (the cost model's own terms): a fused group's intermediates,
        # less the saved ones its backward has already let go of at its peak
        def nbytes(t):
            return t.numel() * t.element_size()
        covered = nbytes(out) + max((nbytes(t) for t, p in zip(tensors, inputs) if t.requires_grad and not p.is_param),
                                    default=0) + sum(nbytes(t) for t, p in zip(tensors, inputs)
                                                     if t.requires_grad and p.is_param)
        bwd_extra = max(0, held.peak - at_start - covered)
    return ProbeResult(ok=True, flops_fwd=ff, flops_bwd=fb, saved=tuple(sorted(ops, key=lambda i: (i < 0, i))),
                       extra_bytes=int(sum(extra.values())), backward_extra_bytes=int(bwd_extra))


class _LiveBytes(TorchDispatchMode):
    """Peak bytes of the tensors created while it is active and still alive (meta storages
    are freed like real ones, so liveness is that of the real backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.total = self.peak = 0
        self.refs: list = []

    def track(self, t) -> None:
        if not isinstance(t, torch.Tensor):
            return
        st = t.untyped_storage()
        key = st._cdata
        if key in self.live:
            return
        n = max(st.nbytes(), t.numel() * t.element_size())
        self.live[key] = n
        self.total += n

        def gone(_ref, key=key):
            self.total -= self.live.pop(key, 0)
        self.refs.append(weakref.ref(st, gone))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        if not any(r.alias_info is not None for r in returns):          # views share storage
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                self.track(t)
        self.peak = max(self.peak, self.total)
        return out


def signature(nodes: list[fx.Node], out_node: fx.Node, externals: list[fx.Node],
              inputs: list[ProbeInput]):
    """Hashable structure of an operator (for caching probe results across repeated blocks)."""
    local = {n: ("x", i) for i, n in enumerate(externals)}
    local.update({n: ("n", i) for i, n in enumerate(nodes)})

    def conv(a):
        if isinstance(a, fx.Node):
            return local.get(a, ("?", a.name))
        if isinstance(a, (list, tuple)):
            return tuple(conv(v) for v in a)
        if isinstance(a, dict):
            return tuple(sorted((k, conv(v)) for k, v in a.items()))
        if isinstance(a, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                          torch.memory_format)):
            return a
        return repr(a)

    return (tuple((str(n.target), conv(n.args), conv(n.kwargs)) for n in nodes),
            local[out_node], tuple(inputs))

