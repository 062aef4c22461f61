"""Walk an exported graph: fold views into edges, group aten ops into operators."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.fx as fx
import torch.nn as nn

from ..opgraph import Edge, TensorSpec, operator_kind
from . import rules as R
from .probe import ProbeInput, probe, signature
from .program import Program
from .views import COPYING, SPLIT_VIEWS, VIEW_NAMES, identity, op_name, piece_map, view_map

# ---- FLOP estimates for ops torch's flop counter doesn't count (per element) ---------------
#: forward FLOPs per output element of a pointwise aten op (a fused group sums its ops)
ELEMENTWISE_FLOPS = 1
#: forward FLOPs per element of a normalisation (mean, variance, scale, shift)
NORM_FLOPS = 5
#: forward FLOPs per element of a softmax (max, sub, exp, sum, div)
SOFTMAX_FLOPS = 5
#: per input element of a reduction / pooling window visit
REDUCTION_FLOPS = 1
POOL_FLOPS = 1
#: per input (logit) element of a loss (log-softmax + gather for cross-entropy)
LOSS_FLOPS = 4
#: an embedding lookup is a gather: no arithmetic forward; its backward scatter-adds (1/elem)
EMBEDDING_FLOPS = 0
#: real FLOPs per complex element op (a complex multiply, as in a rotary embedding: 4 mul + 2 add)
COMPLEX_FLOPS = 6
OTHER_FLOPS = 1
#: backward/forward FLOP ratio of non-matmul families (the gradient is another pass of
#: comparable arithmetic). Matmul-like families use the flop counter's backward count instead:
#: 2x forward when every operand needs a gradient (input and weight grads), 1x when only one
#: does (e.g. the first linear over a model input: weight grad only); attention's fused
#: backward counts 2.5x (dQ, dK, dV plus the recomputed scores).
NONMATMUL_BWD_RATIO = 1.0

_PER_ELEM = {"elementwise": ELEMENTWISE_FLOPS, "norm": NORM_FLOPS, "softmax": SOFTMAX_FLOPS,
             "reduction": REDUCTION_FLOPS, "pool": POOL_FLOPS, "loss": LOSS_FLOPS,
             "embedding": EMBEDDING_FLOPS, "other": OTHER_FLOPS}


#: views replayed on a kernel's own output layout (Builder._kernel_layout)
_LAYOUT_VIEWS = frozenset(("transpose", "permute", "view", "reshape", "_unsafe_view", "unsqueeze", "squeeze",
                           "flatten", "unflatten", "alias", "detach", "t"))
#: views that act the same on a shard as on the whole tensor (inside a fused operator)
_LOCAL_VIEWS = frozenset(("contiguous", "clone", "alias", "detach", "_to_copy", "to", "type_as", "getitem"))


@dataclass
class Val:
    kind: str                     # "op" | "input" | "param" | "const" | "interior"
    spec: TensorSpec | None
    op: int | None = None         # producing operator (kind "op")
    dim_map: tuple = ()           # per dim: producer output dim whose split carries over
    param: str | None = None
    bdim: int | None = None
    rg: bool = False              # requires grad
    store: object = None          # storage root (for counting saved tensors once)


def _spec(t) -> TensorSpec | None:
    if not isinstance(t, torch.Tensor):
        return None
    return TensorSpec(tuple(int(s) for s in t.shape), str(t.dtype).removeprefix("torch."))


def aten_name(node: fx.Node) -> str:
    return str(node.target) if not callable(node.target) or hasattr(node.target, "_overloadpacket") \
        else getattr(node.target, "__name__", str(node.target))


def _is_float(spec: TensorSpec | None) -> bool:
    return spec is not None and spec.dtype in ("float64", "float32", "float16", "bfloat16")


def _kernels(nodes: list[fx.Node]) -> tuple[tuple[str, int], ...]:
    """``Operator.members`` of a group of compute nodes: () for one node."""
    if len(nodes) < 2:
        return ()

    def nbytes(v) -> int:
        return sum(t.numel() * t.element_size() for t in (v if isinstance(v, (tuple, list)) else (v,))
                   if isinstance(t, torch.Tensor))
    return tuple((operator_kind((aten_name(n),)), nbytes(n.meta.get("val"))
                  + sum(nbytes(a.meta.get("val")) for a in n.all_input_nodes)) for n in nodes)


def module_of(node: fx.Node) -> tuple[str, str, tuple]:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", "", ()
    path, ty = list(stack.values())[-1]
    path = str(path).split("@")[0]
    ty = ty if isinstance(ty, str) else getattr(ty, "__name__", str(ty))
    return path, ty.rsplit(".", 1)[-1], tuple(stack.keys())


class Builder:
    def __init__(self, model: nn.Module, program: Program, batch_size: int, input_rg: dict[str, bool]):
        self.model = model
        self.program = program
        self.graph = program.graph
        self.batch_size = batch_size
        self.input_rg = input_rg
        self.vals: dict[fx.Node, object] = {}
        self.ops: list[dict] = []
        self.edges: list[Edge] = []
        self.unsupported: list[str] = []
        self.save_claims: list[tuple] = []     # per operator: what autograd saves, by storage
        self._layouts: dict[fx.Node, torch.Tensor | None] = {}   # see _kernel_layout
        self._cache: dict = {}
        self._leaf_cache: dict[str, bool] = {}
        canon: dict[int, str] = {}
        for fqn, p in model.named_parameters():
            canon.setdefault(id(p), fqn)
        self.canon = canon

    # ---- helpers -------------------------------------------------------------------------
    def _param_fqn(self, target: str) -> str:
        try:
            return self.canon.get(id(self.model.get_parameter(target)), target)
        except (AttributeError, KeyError):
            return target

    def _module_info(self, path: str, ty: str) -> tuple[str, bool]:
        if path not in self._leaf_cache:
            try:
                m = self.model.get_submodule(path)
                self._leaf_cache[path] = next(m.children(), None) is None
            except AttributeError:
                self._leaf_cache[path] = False
        return ty, self._leaf_cache[path]

    def _val(self, a) -> Val | None:
        v = self.vals.get(a) if isinstance(a, fx.Node) else None
        return v if isinstance(v, Val) else None

    # ---- classification pass -------------------------------------------------------------
    def classify(self) -> None:
        self.kind: dict[fx.Node, str] = {}   # "const" | "view" | "compute" | "skip" | "split"
        for n in self.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "get_attr":          # a constant of an inlined region
                self.kind[n] = "const"
                continue
            if n.op != "call_function":
                self.kind[n] = "skip"
                continue
            val = n.meta.get("val")
            name = op_name(n)
            ins = [a for a in n.all_input_nodes]
            if name in R.CONST_LIKE or all(self._const_node(a) for a in ins):
                self.kind[n] = "const"
            elif val is None or (not isinstance(val, torch.Tensor) and not (
                    isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val))):
                self.kind[n] = "skip"
            elif name == "getitem":
                self.kind[n] = "view"
            elif name in SPLIT_VIEWS:
                self.kind[n] = "split"
            elif name == "broadcast_tensors":
                self.kind[n] = "bcast"
            elif name in VIEW_NAMES or (name in ("_to_copy", "to", "type_as") and self._same_type(n)):
                self.kind[n] = "view"
            else:
                self.kind[n] = "compute"

    def _const_node(self, a: fx.Node) -> bool:
        if a.op == "placeholder":
            return self.ph_kind.get(a.name) == "const"
        return self.kind.get(a) == "const"

    @staticmethod
    def _same_type(n: fx.Node) -> bool:
        src = n.args[0].meta.get("val") if n.args and isinstance(n.args[0], fx.Node) else None
        out = n.meta.get("val")
        return isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor) and \
            src.dtype == out.dtype and src.device == out.device

    # ---- fusion of leaf-module pointwise / norm code ---------------------------------------
    def find_groups(self) -> None:
        """Consecutive ops of one call of a leaf module (no child modules) that are all
        pointwise (or, in a module whose class name contains "norm", pointwise + reductions)
        and expose a single result become one operator."""
        self.group_of: dict[fx.Node, int] = {}
        self.groups: list[dict] = []
        run: list[fx.Node] = []
        key = None
        for n in self.graph.nodes:
            k = self.kind.get(n)
            if k not in ("view", "compute", "split", "bcast"):
                continue
            mk = module_of(n)
            if mk != key:
                self._close(run, key)
                run, key = [], mk
            run.append(n)
        self._close(run, key)

    def _close(self, run: list[fx.Node], key) -> None:
        if not run or key is None or not key[0]:
            return
        path, ty, _ = key
        ty2, leaf = self._module_info(path, ty)
        if not leaf:
            return
        normish = "norm" in ty.lower()
        allowed = R.POINTWISE | ((R.REDUCTIONS | R.NORM) if normish else frozenset())
        compute = [n for n in run if self.kind[n] == "compute"]
        if len(compute) < 2 or any(op_name(n) not in allowed for n in compute):
            return
        inrun = set(run)
        root: dict[fx.Node, fx.Node | None] = {}
        for n in run:
            if self.kind[n] == "compute":
                root[n] = n
            else:
                a = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
                root[n] = root.get(a) if a in inrun else None
        exposed = set()
        for n in run:
            if any(u not in inrun and self.kind.get(u) != "skip" for u in n.users):
                r = root[n]
                if r is not None:
                    exposed.add(r)
        if len(exposed) != 1:
            return
        members = [n for n in run if root[n] is not None]
        out = next(iter(exposed))
        gid = len(self.groups)
        self.groups.append(dict(members=members, out=out, normish=normish, last=members[-1],
                                module=path, module_type=ty))
        for n in members:
            self.group_of[n] = gid

    # ---- main walk -------------------------------------------------------------------------
    def run(self) -> None:
        self.ph_kind: dict[str, str] = {}
        ph_target: dict[str, str] = {}
        for name, kind in self.program.input_kinds.items():
            if kind == "param":
                self.ph_kind[name] = "param"
                ph_target[name] = self.program.input_targets[name]
            else:
                self.ph_kind[name] = "input" if kind == "input" else "const"
        self.classify()
        self.find_groups()
        for n in self.graph.nodes:
            if n.op == "placeholder":
                self._placeholder(n, ph_target)
            elif n.op == "call_function":
                k = self.kind[n]
                if n in self.group_of:
                    g = self.groups[self.group_of[n]]
                    self.vals[n] = Val("interior", _spec(n.meta.get("val")))
                    if n is g["last"]:
                        self._operator(g["members"], g["out"], group=g)
                        # views of the result inside the group (a closing ``type_as``) are
                        # what later operators read: they carry the operator's output
                        after = g["members"][g["members"].index(g["out"]) + 1:]
                        for m in after:
                            if self.kind[m] == "view":
                                self._view(m)
                elif k == "const":
                    self.vals[n] = Val("const", _spec(n.meta.get("val")))
                elif k == "view":
                    self._view(n)
                elif k == "split":
                    self._split(n)
                elif k == "bcast":
                    self._bcast(n)
                elif k == "compute" and self._derived(n):
                    spec = _spec(n.meta.get("val"))
                    b = 0 if spec.shape and spec.shape[0] == self.batch_size else None
                    self.vals[n] = Val("input", spec, bdim=b, store=("in", n.name),
                                       dim_map=identity(len(spec.shape)))
                elif k == "compute":
                    self._operator([n], n)

    def _derived(self, n: fx.Node) -> bool:
        """A parameter-free op of model inputs and constants that needs no gradient (a padding
        mask, position ids, the shifted labels) is derived input, not an operator: every rank
        computes it from the batch it is handed, as it does a constant."""
        if not isinstance(n.meta.get("val"), torch.Tensor):
            return False
        vals = [self._val(a) for a in n.all_input_nodes]
        return bool(vals) and all(v is not None and v.kind in ("input", "const") and not v.rg for v in vals) \
            and any(v.kind == "input" for v in vals)

    def _placeholder(self, n: fx.Node, ph_target: dict[str, str]) -> None:
        val = n.meta.get("val")
        spec = _spec(val)
        if spec is None:
            return
        kind = self.ph_kind.get(n.name, "const")
        if kind == "param":
            fqn = self._param_fqn(ph_target[n.name])
            try:
                rg = self.model.get_parameter(ph_target[n.name]).requires_grad
            except AttributeError:
                rg = True
            self.vals[n] = Val("param", spec, param=fqn, rg=rg)
        elif kind == "input":
            b = 0 if spec.shape and spec.shape[0] == self.batch_size else None
            self.vals[n] = Val("input", spec, bdim=b, rg=self.input_rg.get(n.name, False),
                               store=("in", n.name), dim_map=identity(len(spec.shape)))
        else:
            self.vals[n] = Val("const", spec)

    def _derive(self, v: Val, spec: TensorSpec, m: tuple, *, copy: bool, node: fx.Node,
                rg: bool | None = None) -> Val:
        dm = tuple(v.dim_map[k] if k is not None and k < len(v.dim_map) else None for k in m) \
            if v.kind == "op" or v.kind == "input" else ()
        bdim = m.index(v.bdim) if v.bdim is not None and v.bdim in m else None
        store = ("copy", node.name) if copy and v.store is not None else v.store
        return replace(v, spec=spec, dim_map=dm, bdim=bdim, store=store,
                       rg=v.rg if rg is None else rg)

    def _view(self, n: fx.Node) -> None:
        val = n.meta.get("val")
        spec = _spec(val)
        src = n.args[0]
        if op_name(n) == "getitem":
            sv = self.vals.get(src)
            self.vals[n] = sv[n.args[1]] if isinstance(sv, tuple) and n.args[1] < len(sv) else \
                Val("const", spec)
            return
        v = self._val(src)
        if v is None or spec is None:
            self.vals[n] = Val("const", spec)
            return
        if v.kind == "interior":
            self.vals[n] = Val("interior", spec)
            return
        name = op_name(n)
        in_shape = v.spec.shape
        m = view_map(name, tuple(n.args), dict(n.kwargs), in_shape, spec.shape)
        if m is None or len(m) != len(spec.shape):
            m = (None,) * len(spec.shape)
        if v.kind == "param" and spec.numel < v.spec.numel:
            self.vals[n] = self._param_slice(n, v, spec, m)
            return
        copy = name in COPYING and self._copies(n, src)
        self.vals[n] = self._derive(v, spec, m, copy=copy, node=n,
                                    rg=False if name == "detach" else None)

    @staticmethod
    def _source_name(n: fx.Node) -> str:
        return n.args[0].name

    def _param_slice(self, n: fx.Node, v: Val, spec: TensorSpec, m: tuple, piece: int | None = None) -> Val:
        """A part of a parameter (``pos_emb.weight[:T]``, a chunk of a fused weight) becomes an
        elementwise operator over the whole parameter, so that its full size is accounted."""
        idx = len(self.ops)
        c = R.Ctx("slice", (), {}, [v.spec.shape], [None], [True], spec.shape)
        lab = c.name_dims(v.spec.shape, None, "vhstu")
        out = [lab[k] if k is not None and v.spec.shape[k] == spec.shape[j] else c.take("", spec.shape[j])
               for j, k in enumerate(m)]
        mod, mty, _ = module_of(n)
        self.ops.append(dict(
            family="elementwise", equation="".join(lab) + "->" + "".join(out), operands=(v.spec,),
            param_names=(v.param,), output=spec, splittable="".join(x for x in out if x in lab),
            flops_fwd=float(spec.numel * ELEMENTWISE_FLOPS), flops_bwd=float(spec.numel * ELEMENTWISE_FLOPS),
            saved_operands=(), saved_extra_bytes=0, module=mod,
            module_type=mty or type(self.model).__name__, aten=(aten_name(n),),
            nodes=(n.name if piece is None else f"{n.name}[{piece}]",), operand_nodes=(self._source_name(n),),
            short=op_name(n),
            leaf=bool(mod) and self._module_info(mod, mty)[1]))
        self.save_claims.append(())
        return Val("op", spec, op=idx, dim_map=identity(len(spec.shape)), rg=v.rg, store=("op", idx))

    def _copies(self, n: fx.Node, src: fx.Node) -> bool:
        """Does this view-like op materialise a new tensor?"""
        a, out = self._kernel_layout(src), n.meta.get("val")
        if a is None:
            a = src.meta.get("val")
        if not isinstance(a, torch.Tensor) or not isinstance(out, torch.Tensor):
            return True
        name = op_name(n)
        if name == "contiguous":
            return not a.is_contiguous()
        if name in ("reshape", "flatten", "reshape_as"):
            try:
                torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta").view(out.shape)
                return False
            except RuntimeError:
                return True
        if name in ("_to_copy", "to", "type_as"):
            return False  # same dtype and device: returns the input itself
        return True

    def _kernel_layout(self, node: fx.Node) -> torch.Tensor | None:
        """A meta tensor with the strides the training run's kernel gives ``node``'s value, where
        they may differ from the traced ones: the flash attention kernels (CPU and CUDA) lay their
        output out in the query's dimension order (``empty_like``), where the traced composite
        returns it contiguous. A query projected as (batch, seq, heads, dim) and transposed
        gives an output whose usual ``transpose(1, 2).contiguous()`` copies nothing. None
        elsewhere."""
        if node in self._layouts:
            return self._layouts[node]
        val, out = node.meta.get("val"), None
        source = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        if isinstance(val, torch.Tensor) and source is not None:
            query = source.meta.get("val")
            if (node.target is torch.ops.aten.scaled_dot_product_attention.default and val.dim() == 4
                    and isinstance(query, torch.Tensor) and query.dim() == 4):
                order = sorted(range(4), key=lambda k: (-query.stride(k), k))   # outermost first
                laid = torch.empty([val.shape[k] for k in order], dtype=val.dtype, device="meta")
                out = laid.permute([order.index(k) for k in range(4)])
            elif op_name(node) in _LAYOUT_VIEWS:
                base = self._kernel_layout(source)
                if base is not None:
                    try:
                        out = node.target(base, *node.args[1:], **node.kwargs)
                    except RuntimeError:     # a view the kernel's layout cannot take: reshape copies
                        out = None
                    out = out if isinstance(out, torch.Tensor) and out.shape == val.shape else None
        self._layouts[node] = out
        return out

    def _split(self, n: fx.Node) -> None:
        v = self._val(n.args[0])
        val = n.meta.get("val")
        if v is None:
            self.vals[n] = tuple(Val("const", _spec(t)) for t in val)
            return
        if v.kind == "interior":
            self.vals[n] = tuple(Val("interior", _spec(t)) for t in val)
            return
        out = []
        for k, t in enumerate(val):
            spec = _spec(t)
            m = piece_map(op_name(n), tuple(n.args), v.spec.shape, spec.shape)
            if v.kind == "param" and spec.numel < v.spec.numel:
                out.append(self._param_slice(n, v, spec, m, piece=k))
            else:
                out.append(self._derive(v, spec, m, copy=False, node=n))
        self.vals[n] = tuple(out)

    def _bcast(self, n: fx.Node) -> None:
        """broadcast_tensors: piece k is input k expanded (a view)."""
        out = []
        for a, t in zip(n.args[0], n.meta.get("val")):
            v, spec = self._val(a), _spec(t)
            if v is None or v.kind == "interior":
                out.append(Val("const" if v is None else "interior", spec))
                continue
            m = view_map("expand", (None, list(spec.shape)), {}, v.spec.shape, spec.shape)
            out.append(self._derive(v, spec, m, copy=False, node=n))
        self.vals[n] = tuple(out)

    # ---- operators -----------------------------------------------------------------------
    def _operator(self, members: list[fx.Node], out_node: fx.Node, group: dict | None = None) -> None:
        inrun = set(members)
        # operands: tensor args in order (duplicates kept for a single op, de-duplicated in a group)
        occ: list[fx.Node] = []

        def visit(a):
            if isinstance(a, fx.Node) and a not in inrun and self._val(a) is not None:
                if group is None or a not in occ:
                    occ.append(a)
            return a

        for n in members:
            fx.node.map_aggregate(n.args, visit)
            fx.node.map_aggregate(n.kwargs, visit)
        vals = [self._val(a) for a in occ]
        order = sorted(range(len(occ)), key=lambda i: vals[i].kind == "param")
        pos_of = {}  # occurrence index -> operand index
        for new, old in enumerate(order):
            pos_of[old] = new
        operands = [occ[i] for i in order]
        ovals = [vals[i] for i in order]
        out_val = out_node.meta.get("val")
        out_t = out_val if isinstance(out_val, torch.Tensor) else next(
            (t for t in out_val if isinstance(t, torch.Tensor)), None)
        out_spec = _spec(out_t)
        idx = len(self.ops)

        # equation
        if group is None:
            node = members[0]
            counter = iter(range(len(occ)))

            def ref(a):
                if isinstance(a, fx.Node) and self._val(a) is not None:
                    return R.OperandRef(pos_of[next(counter)])
                return a

            args = fx.node.map_aggregate(node.args, ref)
            kwargs = fx.node.map_aggregate(node.kwargs, ref)
            name = op_name(node)
        else:
            args, kwargs, name = (), {}, "fused"
        c = R.Ctx(name, tuple(args) if isinstance(args, (tuple, list)) else (args,), dict(kwargs),
                  [v.spec.shape for v in ovals], [v.bdim for v in ovals],
                  [v.kind == "param" for v in ovals], out_spec.shape)
        if group is None:
            R.label(c)
        else:
            R.elementwise(c, unsplit_dims=self._group_reduced(group, out_spec))
            for i, t in enumerate(c.terms):
                if t is None:
                    c.terms[i] = [c.take("", s) for s in c.shapes[i]]
            if any(self.kind[n] == "view" and op_name(n) not in _LOCAL_VIEWS for n in members):
                c.split = set()      # a view with explicit sizes does not run on a shard
            if group["normish"]:
                c.family = "norm"
        family = c.family
        if family == "other":
            for n in members:
                a = aten_name(n)
                if a not in self.unsupported:
                    self.unsupported.append(a)
        eq = ",".join("".join(t) for t in c.terms) + "->" + "".join(c.out)
        seen = []
        for ch in eq:
            if ch in c.split and ch not in seen:
                seen.append(ch)
        splittable = "".join(seen)

        # flops + saved tensors
        pins = [ProbeInput(v.spec.shape, v.spec.dtype, bool(v.rg and _is_float(v.spec)), v.kind == "param")
                for v in ovals]
        key = signature(members, out_node, operands, pins)
        pr = self._cache.get(key)
        if pr is None:
            pr = probe(members, out_node, operands, pins)
            self._cache[key] = pr
        any_rg = any(p.requires_grad for p in pins)
        if pr.ok and pr.flops_fwd > 0:
            ff, fb = pr.flops_fwd, pr.flops_bwd
        else:
            ff, fb = self._estimate(family, members, c, ovals, out_spec)
            fb = fb if any_rg else 0.0
        if pr.ok:
            saved_raw, extra, bwd_extra = pr.saved, pr.extra_bytes, pr.backward_extra_bytes
        else:
            saved_raw = tuple(i for i, v in enumerate(ovals) if v.kind not in ("param", "const") and any_rg)
            extra = bwd_extra = 0
        claims = []                 # (operand index or -1, storage key): settled by _blocks.resolve_saved
        for i in saved_raw:
            if i == -1:
                k = ("op", idx)
            else:
                v = ovals[i]
                if v.kind in ("param", "const") or v.store is None:
                    continue
                k = v.store
            claims.append((i, k))
        self.save_claims.append(tuple(claims))

        # module
        if group is not None:
            mod, mty = group["module"], group["module_type"]
        else:
            mod, mty, _ = module_of(out_node)
        if not mty and not mod:
            mty = type(self.model).__name__
        short = group["module_type"].lower() if group is not None else op_name(out_node)
        self.ops.append(dict(
            family=family, equation=eq, operands=tuple(v.spec for v in ovals),
            param_names=tuple(v.param if v.kind == "param" else None for v in ovals),
            output=out_spec, splittable=splittable, flops_fwd=float(ff), flops_bwd=float(fb),
            saved_operands=(), saved_extra_bytes=int(extra), backward_extra_bytes=int(bwd_extra), module=mod,
            module_type=mty, aten=tuple(aten_name(n) for n in members if self.kind[n] == "compute"),
            members=_kernels([n for n in members if self.kind[n] == "compute"]),
            nodes=tuple(n.name for n in members), operand_nodes=tuple(a.name for a in operands),
            short=short, leaf=bool(mod) and self._module_info(mod, mty)[1]))
        for i, v in enumerate(ovals):
            if v.kind == "op":
                self.edges.append(Edge(v.op, idx, i, tuple(v.dim_map)))
        rg = any_rg and _is_float(out_spec)
        ov = Val("op", out_spec, op=idx, dim_map=identity(len(out_spec.shape)), bdim=c.out_bdim, rg=rg,
                 store=("op", idx))
        if isinstance(out_val, (tuple, list)):
            vs = []
            for k, t in enumerate(out_val):
                s = _spec(t)
                if t is out_t:
                    vs.append(ov)
                elif s is None:
                    vs.append(None)
                else:
                    vs.append(Val("op", s, op=idx, dim_map=(None,) * len(s.shape), rg=rg and _is_float(s),
                                  store=("op", idx, k)))
            self.vals[out_node] = tuple(vs)
        else:
            self.vals[out_node] = ov

    def _group_reduced(self, group: dict, out_spec: TensorSpec) -> tuple[int, ...]:
        rank = len(out_spec.shape)
        red: set[int] = set()
        for n in group["members"]:
            name = op_name(n)
            if name in R.REDUCTIONS or name in R.NORM:
                a = n.args[0].meta.get("val") if n.args and isinstance(n.args[0], fx.Node) else None
                r = a.dim() if isinstance(a, torch.Tensor) else rank
                if name in R.NORM:
                    dims = list(range(r - 1, r)) if "layer" in name or "rms" in name else list(range(r))
                else:
                    d = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
                    dims = R._dims(d, r) if not isinstance(d, fx.Node) else list(range(r))
                if r != rank:
                    dims = list(range(rank))
                red |= {x + rank - r for x in dims if 0 <= x + rank - r < rank}
        return tuple(sorted(red))

    def _estimate(self, family, members, c, ovals, out_spec) -> tuple[float, float]:
        if family in ("linear", "matmul", "attention", "conv"):
            sizes: dict[str, int] = {}
            for t, v in zip(c.terms, ovals):
                for lab, s in zip(t, v.spec.shape):
                    sizes[lab] = max(sizes.get(lab, 1), s)
            for lab, s in zip(c.out, out_spec.shape):
                sizes[lab] = max(sizes.get(lab, 1), s)
            f = 2.0
            for s in sizes.values():
                f *= s
            if family == "attention":
                f *= 2  # QK^T and PV
            return f, 2 * f
        if family in ("reduction", "loss", "pool"):
            base = max((v.spec.numel for v in ovals), default=out_spec.numel)
            f = base * _PER_ELEM[family]
            return float(f), float(f * NONMATMUL_BWD_RATIO)
        if family == "embedding":
            return 0.0, float(out_spec.numel)
        n_compute = sum(1 for n in members if self.kind[n] == "compute")
        if family == "norm" and n_compute > 1:
            f = out_spec.numel * ELEMENTWISE_FLOPS * n_compute
        else:
            f = out_spec.numel * _PER_ELEM.get(family, OTHER_FLOPS)
        if out_spec.dtype.startswith("complex"):
            f *= COMPLEX_FLOPS
        return float(f), float(f * NONMATMUL_BWD_RATIO)
