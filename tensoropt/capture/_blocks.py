"""Repeated blocks, and the one place each saved tensor is charged.

Blocks are the children ``{L}.{i}`` of a container module ``L`` (``nn.ModuleList``,
``nn.Sequential`` or ``nn.ModuleDict``: ``model.layers``, ``transformer.h``,
``encoder.layer``, ``blocks``) whose operators are identical in everything the cost model
reads. Of the containers that qualify, the one whose blocks hold the most operators wins
(T5's decoder blocks over its encoder blocks, ConvNeXt's deepest stage), then one named
``layers``, then the shallower.

A tensor autograd saves is charged once, to the first operator that saves it (the others
list it in ``Operator.resaved``: on a mesh they may keep copies of their own) -- except a
tensor that operators of several blocks save (a rotary table, a mask or an encoder output
handed to every layer): charging the first block would make it unlike the others. Such a
tensor is charged to the operator that produced it (its output), outside the blocks; one
that no operator produced (a model input) is charged to none, as the batch is already
counted in ``OpGraph.input_bytes``.
"""

from __future__ import annotations

from dataclasses import replace

import torch.nn as nn

from ..opgraph import Edge, Operator

__all__ = ["containers", "find_blocks", "resolve_saved"]

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def containers(model: nn.Module) -> list[tuple[str, list[str]]]:
    """(container FQN, its children's FQNs) for every container of two or more children."""
    out = []
    for fqn, m in model.named_modules():
        if fqn and isinstance(m, _CONTAINERS) and len(m) >= 2:
            out.append((fqn, [f"{fqn}.{k}" for k, _ in m.named_children()]))
    return out


def _owner(module: str, prefixes: list[str]) -> int | None:
    for b, p in enumerate(prefixes):
        if module == p or module.startswith(p + "."):
            return b
    return None


def resolve_saved(model: nn.Module, ops: list[Operator], claims: list[tuple]) -> list[Operator]:
    """``saved_operands`` of every operator from its claims ``(operand index or -1, storage key)``.

    A saved operand that is part of a larger storage (one of the pieces a fused projection's
    output is split into, key ``("op", producer)``) keeps the whole storage alive: the first
    operator to save it is charged the rest as saved extra bytes."""
    whole = [0] * len(ops)
    lists = containers(model)
    claimants: dict[object, list[int]] = {}
    for i, cl in enumerate(claims):
        for _, key in cl:
            claimants.setdefault(key, []).append(i)
    shared = set()
    for key, who in claimants.items():
        for _, prefixes in lists:
            owners = {_owner(ops[i].module, prefixes) for i in who}
            if len(owners - {None}) >= 2:
                shared.add(key)
                break
    saved: list[list[int]] = [[] for _ in ops]
    again: list[list[tuple[int, int, int]]] = [[] for _ in ops]
    done: set = set()
    last: dict = {}
    for i, cl in enumerate(claims):
        for j, key in cl:
            if key in done:
                prev = last[key]
                if key not in shared and j != -1 and prev[0] != i:
                    again[i].append((j, i - prev[0], prev[1]))
                last[key] = (i, j)
                continue
            done.add(key)
            last[key] = (i, j)
            if key not in shared:
                saved[i].append(j)
                if j >= 0 and key[0] == "op" and len(key) == 2:
                    whole[i] += max(0, ops[key[1]].output.nbytes - ops[i].operands[j].nbytes)
            elif key[0] == "op":
                saved[key[1]].append(-1)
    for i in range(len(ops)):       # the producer's -1 may come after its own claims
        saved[i] = list(dict.fromkeys(saved[i]))
    return [replace(op, saved_operands=tuple(s), resaved=tuple(dict.fromkeys(r)),
                    saved_extra_bytes=op.saved_extra_bytes + w)
            for op, s, r, w in zip(ops, saved, again, whole)]


def find_blocks(model: nn.Module, ops: list[Operator], edges: list[Edge]) -> tuple[tuple, tuple[str, ...]]:
    """(blocks, their module FQNs): the longest run of identical consecutive children of one
    container (see module doc)."""
    into: dict[int, list[Edge]] = {}
    for e in edges:
        into.setdefault(e.dst, []).append(e)
    best: tuple | None = None
    for fqn, prefixes in containers(model):
        blocks: list[list[int]] = [[] for _ in prefixes]
        for i, op in enumerate(ops):
            b = _owner(op.module, prefixes)
            if b is not None:
                blocks[b].append(i)
        position = {i: (b, k) for b, block in enumerate(blocks) for k, i in enumerate(block)}

        def sig(b: int, external: bool):
            # Edges within the block, and from the block before, must match; what the first
            # block of a run receives from outside may differ (OPT reshapes the stream
            # between blocks; a stage's first block follows a downsampling layer).
            p = prefixes[b] + "."
            out = []
            for i in blocks[b]:
                op = ops[i]
                es = []
                for e in into.get(i, []):
                    bs, ks = position.get(e.src, (None, None))
                    if bs == b:
                        es.append((e.operand, "in", ks, e.dim_map))
                    elif external:
                        es.append((e.operand, "prev" if bs == b - 1 else "out", ks if bs == b - 1 else -1,
                                   e.dim_map))
                out.append((op.family, op.equation, op.operands, op.output, op.splittable,
                            tuple(None if n is None else n.removeprefix(p) for n in op.param_names),
                            op.module.removeprefix(prefixes[b]), op.aten, op.saved_operands,
                            op.saved_extra_bytes, op.backward_extra_bytes, op.flops_fwd, op.flops_bwd,
                            op.dispatches, op.members,
                            tuple(sorted(es, key=repr))))
            return out

        inner = [sig(b, False) for b in range(len(blocks))]
        outer = [sig(b, True) for b in range(len(blocks))]
        i = 0
        while i < len(blocks):
            j = i + 1
            while j < len(blocks) and blocks[i] and inner[j] == inner[i] and (j == i + 1 or outer[j] == outer[i + 1]):
                j += 1
            if j - i >= 2:
                run = tuple(tuple(b) for b in blocks[i:j])
                key = (sum(map(len, run)), fqn.rsplit(".", 1)[-1] == "layers", -fqn.count("."), -i)
                if best is None or key > best[0]:
                    best = (key, run, tuple(prefixes[i:j]))
            i = j
    return (best[1], best[2]) if best is not None else ((), ())
