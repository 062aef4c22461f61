"""What a recomputed unit keeps between its forward and its backward: the policies a plan
may name, defined once for the cost model (which operators' outputs stay) and for the apply
layer (which aten ops' outputs its checkpoint keeps, ``apply.checkpointing.checkpoint_context``).

* ``"full"``: the unit keeps its input and runs its whole forward again in backward.
* ``"op"``: per-operator selective recomputation, torchtitan's ``selective_ac_option = "op"``
  (its default for Llama 3): the unit keeps the outputs of its attention kernels and of every
  other matrix multiply of a linear layer (the first, third, ... in forward order, counted
  per unit), and recomputes the rest (norms, activations, rotary embeddings, the other
  matrix multiplies). Counted per recomputed forward as torchtitan counts ``aten.mm``; here
  ``aten.addmm`` (a linear with a bias) counts too. A captured ``aten.matmul`` of 2-D
  operands also runs an ``mm`` at run time but is not counted here: a block with one would
  be priced off by one in the count.
"""

from __future__ import annotations

from typing import Sequence

from .opgraph import OpGraph

__all__ = ["POLICIES", "check", "kept_outputs", "runtime_mm", "runtime_keeps"]

POLICIES = ("full", "op")

# operators (their captured aten op) that run one matrix multiply of a linear layer, and
# those that run one fused attention kernel
_LINEAR_ATEN = frozenset(("aten.linear.default", "aten.mm.default", "aten.addmm.default"))
_ATTENTION_ATEN = frozenset(("aten.scaled_dot_product_attention.default",))
# what they dispatch to at run time, as a checkpoint's dispatch mode sees it
_RUNTIME_MM = ("mm", "addmm")
_RUNTIME_ATTENTION = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                      "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")


def check(policy: str) -> str:
    """``policy``, if it is one of :data:`POLICIES`."""
    if policy not in POLICIES:
        raise ValueError(f"unknown recomputation policy {policy!r}: one of {POLICIES}")
    return policy


def kept_outputs(graph: OpGraph, ops: Sequence[int], policy: str) -> frozenset[int]:
    """The operators of a recomputed unit (``ops``, in forward order) whose outputs it keeps
    under ``policy``."""
    if check(policy) == "full":
        return frozenset()
    kept, mms = set(), 0
    for i in ops:
        aten = graph.operators[i].aten
        linears = sum(a in _LINEAR_ATEN for a in aten)
        mms += linears
        # an operator's output is a kept matrix multiply's only where it is one linear alone
        # (a fused group's linears count, but its output is another op's)
        if (linears == 1 and len(aten) == 1 and _keeps_nth_mm(mms)) or set(aten) & _ATTENTION_ATEN:
            kept.add(i)
    return frozenset(kept)


def runtime_mm(op: str) -> bool:
    """Whether the aten op named ``op`` (``"mm"``) is the matrix multiply of a linear layer,
    as a checkpoint's dispatch mode sees it at run time."""
    return op in _RUNTIME_MM


def runtime_keeps(policy: str, op: str, mms: int) -> bool:
    """Whether a recomputed unit under ``policy`` keeps the output of the aten op named
    ``op`` that it runs at run time; ``mms``: the linear matrix multiplies its forward has
    run so far, this one included (the apply layer's ``context_fn``)."""
    if check(policy) == "full":
        return False
    if runtime_mm(op):
        return _keeps_nth_mm(mms)
    return op in _RUNTIME_ATTENTION


def _keeps_nth_mm(n: int) -> bool:
    return n % 2 == 1
