"""The operator graph: what capture produces and the strategy space consumes.

Plain frozen dataclasses, no torch. Every operator is described by an einsum-like
``equation`` over named dimensions, one term per operand (activations first, then
parameters) and one for the output, e.g. a linear layer ``"bsk,nk->bsn"``. A label
missing from the output is a reduction dimension: splitting it leaves partial sums.
Only labels in ``splittable`` may be split over a mesh axis (a softmax's reduced
axis, a convolution's spatial dims and a norm's normalised axis may not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

_ITEMSIZE = {
    "complex128": 16, "complex64": 8, "complex32": 4,
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}

FAMILIES = (
    "linear", "matmul", "attention", "conv", "norm", "softmax", "elementwise",
    "embedding", "pool", "reduction", "loss", "other",
)


def operator_kind(aten) -> str | None:
    """The kind a curve may be keyed by: the aten name of an operator of one aten op
    (``("aten.gelu.default",)`` -> ``"gelu"``); None for a fused group."""
    if len(aten) != 1:
        return None
    parts = aten[0].split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else parts[0]


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str = "float32"  # torch dtype name without the "torch." prefix

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> int:
        try:
            return _ITEMSIZE[self.dtype]
        except KeyError:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {sorted(_ITEMSIZE)}") from None

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Operator:
    name: str                          # unique within the graph
    family: str                        # one of FAMILIES
    equation: str                      # "bsk,nk->bsn": one term per operand, then the output
    operands: tuple[TensorSpec, ...]   # activation inputs first, then parameters, in equation order
    param_names: tuple[str | None, ...]  # per operand: parameter FQN, or None for an activation
    output: TensorSpec
    splittable: str                    # labels that may be split over a mesh axis
    flops_fwd: float
    flops_bwd: float
    saved_operands: tuple[int, ...] = ()  # operands autograd keeps for backward; -1 is the output
    # operands it saves too that another operator is charged for (one tensor on one device):
    # (operand, how many operators back the previous saver of that tensor is, that saver's
    # operand or -1 for its output). On a mesh, a saver that moves the tensor to another
    # layout keeps a copy of its own (``planner``).
    resaved: tuple[tuple[int, int, int], ...] = ()
    saved_extra_bytes: int = 0         # other saved tensors (masks, statistics), sharded like the output
    # held during its backward beyond the output's gradient, the largest input gradient and the
    # parameters' gradients (a fused group's intermediate gradients), sharded like the output
    backward_extra_bytes: int = 0
    module: str = ""                   # FQN of the innermost nn.Module that owns it
    module_type: str = ""              # its class name, e.g. "Linear"
    aten: tuple[str, ...] = ()         # the aten ops grouped into this operator
    # Where it sits in the captured program (``capture.Program``): its nodes in order (a
    # piece of a split written "name[k]") and, per operand, the node that feeds it.
    nodes: tuple[str, ...] = ()
    operand_nodes: tuple[str, ...] = ()
    # torch ops that replaying the program dispatches for it: its own nodes and, spread evenly
    # over the operators, the views and other calls between operators (a DTensor runner pays
    # DTensor's dispatch on each)
    dispatches: float = 1.0
    # a fused group's aten ops, which eager PyTorch runs one kernel each: per op, its kind
    # (:func:`operator_kind`) and the bytes it reads and writes; () for a single op
    members: tuple[tuple[str, int], ...] = ()

    @property
    def terms(self) -> tuple[tuple[str, ...], str]:
        lhs, out = self.equation.split("->")
        return tuple(lhs.split(",")), out

    @property
    def batched(self) -> bool:
        """Whether one of its dimensions is the batch (label ``b``)."""
        terms, out = self.terms
        return any("b" in t for t in (*terms, out))

    @property
    def param_bytes(self) -> int:
        return sum(t.nbytes for t, p in zip(self.operands, self.param_names) if p is not None)


@dataclass(frozen=True)
class Edge:
    src: int       # producing operator (index into OpGraph.operators)
    dst: int       # consuming operator
    operand: int   # which operand of dst the tensor feeds
    # For each dim of the consumer's operand: the producer output dim whose split carries
    # over through the views between them (reshape, transpose), or None where a view merges
    # or splits dims so that no split carries over.
    dim_map: tuple[int | None, ...]


@dataclass(frozen=True)
class OpGraph:
    name: str
    operators: tuple[Operator, ...]    # in topological order
    edges: tuple[Edge, ...]
    # Operator indices of identical repeated blocks (transformer layers), in order; () if none.
    blocks: tuple[tuple[int, ...], ...] = ()
    block_modules: tuple[str, ...] = ()  # FQN of each block's module, e.g. "model.layers.3"
    batch_size: int = 1
    unsupported: tuple[str, ...] = field(default=())  # aten ops captured as family "other"
    input_bytes: int = 0               # the step's input tensors (the batch), as fed to the model
    # Operators whose outputs the forward returns beside the loss (a language model's logits):
    # the caller holds them until the step ends.
    returned: tuple[int, ...] = ()
    # The example inputs as JSON (``capture.inputs.input_spec``): what capturing again needs.
    inputs: dict = field(default_factory=dict, compare=False)

    def params(self) -> dict[str, TensorSpec]:
        """Unique parameters by FQN (a tied weight appears once)."""
        out: dict[str, TensorSpec] = {}
        for op in self.operators:
            for t, p in zip(op.operands, op.param_names):
                if p is not None:
                    out.setdefault(p, t)
        return out

    @cached_property
    def batched_ops(self) -> np.ndarray:
        """Per operator, whether one of its dimensions is the batch."""
        return np.array([op.batched for op in self.operators], dtype=bool)

    @cached_property
    def weighted_ops(self) -> np.ndarray:
        """Per operator, whether it is a linear, conv or embedding with a parameter."""
        return np.array([op.family in ("linear", "conv", "embedding") and any(p is not None for p in op.param_names)
                         for op in self.operators], dtype=bool)

    @property
    def param_count(self) -> int:
        return sum(t.numel for t in self.params().values())


def rebatch_spec(spec: dict, batch: int, b: int) -> dict:
    """An input spec (``OpGraph.inputs``) with every tensor's dim 0 of size ``batch`` made ``b``."""
    def cut(s: dict) -> dict:
        if "tensor" in s and s["tensor"] and s["tensor"][0] == batch:
            return {**s, "tensor": [b, *s["tensor"][1:]]}
        return s
    return {"args": [cut(s) for s in spec.get("args", ())],
            "kwargs": {k: cut(s) for k, s in spec.get("kwargs", {}).items()}}
