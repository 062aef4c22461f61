"""The captured program: ``torch.export`` of a model's forward, flattened for analysis and replay.

Capture reads the program's graph to build operators; the apply layer runs the same graph
(re-exported from the same model and input shapes, so node names agree) with a plan's
layouts. Both need one flat graph: regions that ``torch.export`` wraps in higher-order ops
(``wrap_with_set_grad_enabled`` for ``torch.no_grad()`` code such as a rotary table,
``wrap_with_autocast``) are inlined, their nodes tagged with the grad mode / autocast state
they ran under (``meta["tensoropt_grad"]``, ``meta["tensoropt_autocast"]``).
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils._pytree import TreeSpec

from .views import SPLIT_VIEWS, identity, op_name, piece_map, view_map

__all__ = ["Program", "program_from_export", "inline_regions", "call_node", "module_paths", "is_skipped",
           "dispatched", "GRAD_KEY", "AUTOCAST_KEY"]

GRAD_KEY = "tensoropt_grad"
AUTOCAST_KEY = "tensoropt_autocast"
_SKIP_PREFIXES = ("_assert", "sym_constrain")


def is_skipped(n: fx.Node) -> bool:
    """A check export left in the program (an assertion on metadata, a symbolic-size
    constraint) that nothing reads: replaying the program leaves it out."""
    name = getattr(n.target, "__name__", "") or str(n.target)
    return n.op == "call_function" and not n.users and name.lstrip("_").startswith(
        tuple(p.lstrip("_") for p in _SKIP_PREFIXES))


def dispatched(n: fx.Node) -> bool:
    """A node that replaying the program hands to torch's dispatcher (on a mesh, to DTensor's
    dispatch and sharding propagation): a torch op not left out; Python's own calls on
    tuples (``getitem``) are not."""
    return (n.op == "call_function" and isinstance(n.target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))
            and not is_skipped(n))


@dataclass
class Program:
    """A flat exported forward: ``graph`` with placeholders in signature order."""
    gm: fx.GraphModule
    input_kinds: dict[str, str]          # placeholder name -> "param" | "buffer" | "constant" | "input"
    input_targets: dict[str, str]        # placeholder name -> parameter/buffer FQN or constant name
    constants: dict[str, Any]            # lifted constant tensors by name
    in_spec: TreeSpec                    # pytree spec of (args, kwargs)
    out_spec: TreeSpec
    user_outputs: tuple[int, ...]        # positions in the output node's tuple that out_spec covers

    @property
    def graph(self) -> fx.Graph:
        return self.gm.graph

    def placeholders(self) -> list[fx.Node]:
        return [n for n in self.graph.nodes if n.op == "placeholder"]

    def source_dims(self, name: str) -> tuple[str, tuple[int | None, ...]]:
        """(the placeholder a node views, per dim of the node the placeholder dim it shows or
        None): how a parameter reaches an operator through views (a transpose, an expand)."""

        by_name = {n.name: n for n in self.graph.nodes}
        node = by_name[name]
        out = node.meta["val"]
        dims: tuple[int | None, ...] = identity(out.dim())
        while node.op != "placeholder":
            kind = op_name(node)
            if kind == "getitem":
                src = node.args[0]
                piece = node.meta["val"]
                m = piece_map(op_name(src), tuple(src.args), tuple(src.args[0].meta["val"].shape), tuple(piece.shape)) \
                    if op_name(src) in SPLIT_VIEWS else None
                node = src.args[0] if m is not None else src
            else:
                src = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
                if src is None:
                    break
                m = view_map(kind, tuple(node.args), dict(node.kwargs), tuple(src.meta["val"].shape),
                             tuple(node.meta["val"].shape))
                node = src
            if m is None:
                return node.name, (None,) * len(dims)
            dims = tuple(m[d] if d is not None and d < len(m) else None for d in dims)
        return node.name, dims

    def user_inputs(self) -> list[str]:
        return [n for n, k in self.input_kinds.items() if k == "input"]


_KINDS = {InputKind.PARAMETER: "param", InputKind.BUFFER: "buffer",
          InputKind.CONSTANT_TENSOR: "constant", InputKind.USER_INPUT: "input"}


def program_from_export(ep) -> Program:
    gm = copy.deepcopy(ep.graph_module)
    inline_regions(gm)
    kinds, targets = {}, {}
    for spec in ep.graph_signature.input_specs:
        name = getattr(spec.arg, "name", None)
        if name is None:
            continue
        kinds[name] = _KINDS.get(spec.kind, "constant")
        if spec.target is not None:
            targets[name] = spec.target
    users = tuple(i for i, spec in enumerate(ep.graph_signature.output_specs) if spec.kind == OutputKind.USER_OUTPUT)
    return Program(gm, kinds, targets, dict(ep.constants), ep.call_spec.in_spec, ep.call_spec.out_spec, users)


def _hop_region(node: fx.Node) -> tuple[fx.Node, tuple, dict] | None:
    """(submodule node, region inputs, meta tags) of a wrapping higher-order op, else None."""
    if node.op != "call_function":
        return None
    name = getattr(node.target, "__name__", "") or str(node.target)
    if "wrap_with_set_grad_enabled" in name:
        return node.args[1], tuple(node.args[2:]), {GRAD_KEY: bool(node.args[0])}
    if "wrap_with_autocast" in name:
        device_type, dtype, enabled, cache = node.args[:4]
        return node.args[4], tuple(node.args[5:]), {AUTOCAST_KEY: (device_type, dtype, bool(enabled), cache)}
    return None


def inline_regions(gm: fx.GraphModule) -> None:
    """Inline every set-grad / autocast region of ``gm`` (recursively), in place."""
    graph = gm.graph
    for node in list(graph.nodes):
        region = _hop_region(node)
        if region is None:
            continue
        sub_node, inputs, tags = region
        sub = getattr(gm, sub_node.target)
        inline_regions(sub)
        env: dict[fx.Node, Any] = {}
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        for ph, a in zip(placeholders, inputs):
            env[ph] = a
        outputs: Any = None
        with graph.inserting_before(node):
            for sn in sub.graph.nodes:
                if sn.op == "placeholder":
                    continue
                if sn.op == "output":
                    outputs = fx.node.map_arg(sn.args[0], lambda x: env[x])
                    break
                if sn.op == "get_attr":
                    attr = f"_tensoropt_{sub_node.target}_{sn.target}".replace(".", "_")
                    setattr(gm, attr, getattr(sub, sn.target))
                    new = graph.get_attr(attr)
                    new.meta = dict(sn.meta)
                else:
                    new = graph.node_copy(sn, lambda x: env[x])
                    new.meta = dict(sn.meta)
                for k, v in tags.items():
                    new.meta.setdefault(k, v)
                env[sn] = new
        outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(outs[user.args[1]])
                graph.erase_node(user)
        if node.users:
            raise RuntimeError(f"cannot inline {node.name}: its result is used other than by indexing")
        graph.erase_node(node)
        if not sub_node.users:
            graph.erase_node(sub_node)
            if hasattr(gm, sub_node.target):
                delattr(gm, sub_node.target)
    graph.lint()
    gm.recompile()


def call_node(node: fx.Node, args: tuple, kwargs: dict) -> Any:
    """Run one call_function node with its region's grad mode and autocast state."""
    grad = node.meta.get(GRAD_KEY)
    autocast = node.meta.get(AUTOCAST_KEY)
    if grad is None and autocast is None:
        return _call(node.target, args, kwargs)
    with torch.set_grad_enabled(grad if grad is not None else torch.is_grad_enabled()):
        if autocast is not None:
            device_type, dtype, enabled, cache = autocast
            with torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache):
                return _call(node.target, args, kwargs)
        return _call(node.target, args, kwargs)


def _call(target, args: tuple, kwargs: dict) -> Any:
    try:
        return target(*args, **kwargs)
    except RuntimeError:
        # The program was traced with one memory layout, and tracing drops a contiguous()
        # of what was contiguous there: a kernel or a shard may lay the tensor out otherwise
        # here, where the view then needs the copy reshape makes (same values, same gradient).
        if target is not torch.ops.aten.view.default:
            raise
        return torch.ops.aten.reshape.default(*args, **kwargs)


def module_paths(node: fx.Node) -> tuple[str, ...]:
    """FQNs of the modules whose call a node ran inside, outermost first."""
    stack = node.meta.get("nn_module_stack") or {}
    return tuple(str(path).split("@")[0] for path, _ in stack.values())
