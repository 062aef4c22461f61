"""Measured collectives and peak memory of one training step (per rank).

``count_collectives(step_fn)`` runs ``step_fn()`` under a subclass of DTensor's
``CommDebugMode`` (a TorchDispatchMode). It sees the functional collectives that DTensor
redistributions and the TP styles issue (``_c10d_functional.all_reduce`` /
``all_gather_into_tensor`` / ``reduce_scatter_tensor`` / ``all_to_all_single`` ...) and the c10d
ops that FSDP2 (``fully_shard``) and the FSDP2-based ``replicate`` issue
(``c10d._allgather_base_``, ``c10d._reduce_scatter_base_``, ``c10d.allreduce_``...). It does NOT
see communication a C++ reducer issues outside the dispatcher (classic ``DistributedDataParallel``
buckets), nor point-to-point ops. Bytes are the size of the *full* buffer of each collective on
this rank: the all-reduced tensor, the gathered output of an all-gather, the input of a
reduce-scatter, the input of an all-to-all.

``peak_memory(step_fn, *track)``: on CUDA the allocator's peak (``max_memory_allocated``) during
the step; on CPU ``torch.distributed._tools.MemTracker`` -- the peak of live tensor storage
(parameters, gradients, optimizer state, activations, temporaries) seen by a dispatch mode
during the step, per rank. It counts storages, so views are not double counted; it does not
count allocator fragmentation, communication buffers allocated inside C++ (gloo), or memory
freed before the step. Tensors that already exist (model, optimizer state) are counted when
passed in ``track`` (``MemTracker.track_external``) and otherwise only once touched.

``step_peak_memory(forward_backward, optimizer, *track)``: the peak of one whole training step
in the scope ``Plan.peak_memory_bytes`` predicts -- forward and backward, the optimizer step
and ``zero_grad(set_to_none=False)``, begun with parameters, gradients and optimizer state
resident (an unmeasured step first makes them so); the median of three such steps. Loops
that drop gradients between steps (``set_to_none=True``, PyTorch's default) peak lower, by up
to the gradients' bytes.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.debug._comm_mode import NATIVE_TO_PY_MAPPING, c10d_collective_ops
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_KIND = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce", "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "_allgather_base_": "all_gather", "allgather_": "all_gather", "allgather_coalesced_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "all_to_all_single": "all_to_all", "alltoall_": "all_to_all", "alltoall_base_": "all_to_all",
    "shard_dim_alltoall": "all_to_all",
    "broadcast": "broadcast", "broadcast_": "broadcast",
    "gather_": "gather", "scatter_": "scatter", "reduce_": "reduce",
}


def _nbytes(obj: Any) -> int:
    leaves, _ = tree_flatten(obj)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


class CollectiveCounter(CommDebugMode):
    """CommDebugMode that also records bytes and forward/backward per collective kind.

    It keeps CommDebugMode's op registry, its DTensor handling (return ``NotImplemented`` so
    DTensor desugars into plain collectives, which are seen on the way back) and its
    ``get_comm_counts()``, but not its per-module tracker (a global ModTracker whose hook
    bookkeeping breaks under FSDP2 + TP). Forward vs backward comes from the autograd engine
    (``torch._C._current_graph_task_id() != -1`` inside backward; recomputation under
    activation checkpointing therefore counts as backward).
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict] = []

    def __enter__(self):
        self.records = []
        self.comm_counts.clear()
        TorchDispatchMode.__enter__(self)
        return self

    def __exit__(self, *args):
        return TorchDispatchMode.__exit__(self, *args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(t == DTensor for t in types):
            return NotImplemented
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in self.comm_registry or packet in c10d_collective_ops:
            packet = NATIVE_TO_PY_MAPPING.get(packet, packet)
            self.comm_counts[packet] += 1
            qual = packet._qualified_op_name
            name = qual.split("::")[-1]
            # Full buffer: the largest of the tensor arguments and (functional ops) the result.
            sizes = [_nbytes(a) for a in args] + [_nbytes(v) for v in kwargs.values()]
            if not qual.startswith("c10d::"):
                sizes.append(_nbytes(out))
            in_bw = torch._C._current_graph_task_id() != -1
            self.records.append({"op": qual, "kind": _KIND.get(name, name), "bytes": max(sizes or [0]),
                                 "phase": "backward" if in_bw else "forward"})
        return out

    def summary(self) -> dict[str, dict]:
        res: dict[str, dict] = {}
        for r in self.records:
            d = res.setdefault(r["kind"], {"count": 0, "bytes": 0, "forward": 0, "backward": 0,
                                           "ops": defaultdict(int)})
            d["count"] += 1
            d["bytes"] += r["bytes"]
            d[r["phase"]] += 1
            d["ops"][r["op"]] += 1
        for d in res.values():
            d["ops"] = dict(d["ops"])
        return res


def count_collectives(step_fn: Callable[[], Any]) -> dict[str, dict]:
    """Run ``step_fn()`` once and return ``{kind: {count, bytes, forward, backward, ops}}`` for this rank.

    kinds: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, ... ``ops`` maps the
    exact op names (e.g. ``c10d_functional::all_reduce``, ``c10d::_allgather_base_``) to counts.
    ``count_collectives.last_comm_counts`` keeps CommDebugMode's own ``get_comm_counts()``.
    """
    mode = CollectiveCounter()
    with mode:
        step_fn()
    count_collectives.last_comm_counts = {str(k): v for k, v in mode.get_comm_counts().items()}
    return mode.summary()


class _NoModTracker:
    """Stands in for MemTracker's module tracker (``modules=False``): no module hooks, so
    forwards that end early by an exception (pipeline stages) are measured too; backward is
    recognised from the autograd engine."""

    parents: set = set()

    def register_user_hooks(self, *a, **k):
        pass

    def clear_user_hooks(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return None

    def get_known_fqn(self, mod):
        return None

    @property
    def is_bw(self) -> bool:
        return torch._C._current_graph_task_id() != -1


def peak_memory(step_fn: Callable[[], Any], *track: Any, modules: bool = True,
                tensors: bool = False) -> dict[str, Any]:
    """Run ``step_fn()`` once; return this rank's peak memory of the step.

    ``track``: modules / optimizers (or tensors) whose existing tensors should count
    (MemTracker only). ``modules=False``: MemTracker without its per-module hooks (same
    totals; needed for pipeline stages). ``tensors=True``: MemTracker's live tensors by
    category on CUDA too, instead of the allocator's peak (which also holds library
    workspaces). Returns ``{"peak_bytes": int, "method": str, "by_category": {...}}``. A
    tracked model that accumulates micro-batches (``tensoropt.parallelize``) runs each module
    once per micro-batch, which MemTracker's per-module hooks refuse: it is measured without
    them.
    """
    if any(getattr(t, "_tensoropt_accumulate", None) for t in track):
        modules = False
    if not tensors and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step_fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        return {"peak_bytes": int(peak), "step_peak_above_start": int(peak - base),
                "method": "torch.cuda.max_memory_allocated", "by_category": {}}
    from torch.distributed._tools.mem_tracker import MemTracker

    mt = MemTracker()
    if not modules:
        mt._mod_tracker = _NoModTracker()     # type: ignore[assignment]
    if track:
        mt.track_external(*track)
    with mt:
        step_fn()
    snap = mt.get_tracker_snapshot("peak")
    by_cat: dict[str, int] = defaultdict(int)
    total = 0
    for _dev, cats in snap.items():
        for k, v in cats.items():
            if k == "Total":
                total += int(v)
            else:
                by_cat[getattr(k, "name", str(k))] += int(v)
    return {"peak_bytes": total, "method": "torch.distributed._tools.MemTracker", "by_category": dict(by_cat)}


def step_peak_memory(forward_backward: Callable[[], Any], optimizer: torch.optim.Optimizer, *track: Any,
                     modules: bool = True, repeats: int = 3) -> dict[str, Any]:
    """Peak of one training step with gradients kept between steps (see the module docstring):
    the median over ``repeats`` measured steps (``"peak_bytes_each"`` lists them), after one
    unmeasured step. On CPU a step's peak can differ by one buffer from run to run: gloo's
    background thread releases a collective's tensors when the collective completes, which
    is not always before the next allocation."""
    def step():
        loss = forward_backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        return loss

    step()
    runs = [peak_memory(step, *track, optimizer, modules=modules) for _ in range(max(1, repeats))]
    runs_sorted = sorted(runs, key=lambda r: r["peak_bytes"])
    out = dict(runs_sorted[(len(runs) - 1) // 2])
    out["peak_bytes_each"] = [r["peak_bytes"] for r in runs]
    return out
