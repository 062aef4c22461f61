"""Random peak graphs (``tensoropt.engine.PeakGraph``) small enough to enumerate.

Operators run in order and are cut into regions; some regions carry a mode node
(keep / recompute). Costs are small integers, so every sum is exact and points compare
exactly with brute force. Terms reach back to earlier regions (residuals, values that
later positions depend on), and local and rise terms may be negative (shifted
positions) or ``-inf`` (a position that does not exist in one mode).
"""

from __future__ import annotations

import numpy as np

from tensoropt.engine.peakgraph import PeakGraph, Region, Term


def random_peak_graph(seed: int, n_ops: int = 6, k_range=(1, 3), regions: int = 3, modes: bool = True,
                      exclude: bool = False, skip_prob: float = 0.4, chain: int = 0, units: bool = False) -> PeakGraph:
    """``chain`` > 1 builds that many identical regions (same tables, same shape of terms
    relative to the region) after the first ``regions`` ones. ``units``: a region with a
    mode node is cut into one region per operator, the run of them a unit."""
    rng = np.random.default_rng(seed)
    ks: list[int] = []
    names: list[str] = []
    additive: list[Term] = []
    regs: list[Region] = []
    unit_spans: list[tuple[int, int]] = []
    order: list[int] = []          # operators in execution order

    def new_node(name: str, k: int) -> int:
        ks.append(k)
        names.append(name)
        return len(ks) - 1

    def table(shape, low=0, high=6):
        return rng.integers(low, high, size=shape).astype(float)

    def region(ops: list[int], mode: int | None, name: str, template=None):
        kinds: dict[str, list[Term]] = {k: [] for k in ("held", "view", "local", "base", "rise")}
        earlier = [v for v in order if v not in ops]
        for i, op in enumerate(ops):
            prev = ops[i - 1] if i else (earlier[-1] if earlier else None)
            additive.append(Term((op,), table((ks[op], 2))))
            if prev is not None and rng.random() < 0.8:
                additive.append(Term((prev, op), table((ks[prev], ks[op], 2))))
            if earlier and rng.random() < skip_prob:
                src = int(rng.choice(earlier))
                if src != prev:
                    additive.append(Term((src, op), table((ks[src], ks[op], 2))))
            scope = (mode, op) if mode is not None else (op,)
            kinds["held"].append(Term(scope, _mode_zero(table(tuple(ks[v] for v in scope)), mode is not None, 1)))
            if mode is not None:
                kinds["view"].append(Term(scope, _mode_zero(table(tuple(ks[v] for v in scope)), True, 0)))
            reach = [v for v in order + ops[:i] if v != op]
            lscope = (op,) + tuple(int(v) for v in rng.choice(reach, size=min(len(reach), rng.integers(0, 3)),
                                                               replace=False))
            if mode is not None and rng.random() < 0.5:
                lscope = lscope + (mode,)
            kinds["local"].append(Term(lscope, table(tuple(ks[v] for v in lscope), -3, 8)))
            if mode is not None:
                rs = (mode, op) + ((prev,) if prev is not None and prev != op and rng.random() < 0.5 else ())
                t = table(tuple(ks[v] for v in rs), -2, 6)
                t[0] = -np.inf
                kinds["rise"].append(Term(rs, t))
        if mode is not None:
            kinds["base"].append(Term((mode, ops[-1]), _mode_zero(table((2, ks[ops[-1]])), True, 0)))
            additive.append(Term((mode, ops[0]), table((2, ks[ops[0]], 2))))
            if units and len(ops) > 1:
                kinds["remat"] = kinds.pop("view")
                _split(regs, unit_spans, ops, mode, kinds, name)
                order.extend(ops)
                return
            kinds["remat"] = kinds.pop("view")
        regs.append(Region(tuple(ops) + ((mode,) if mode is not None else ()), mode,
                           **{k: tuple(v) for k, v in kinds.items()}, name=name))
        order.extend(ops)

    sizes = np.full(regions, n_ops // regions)
    sizes[: n_ops % regions] += 1
    for g, size in enumerate(sizes):
        ops = [new_node(f"op{len(order) + j}", int(rng.integers(k_range[0], k_range[1] + 1))) for j in range(size)]
        mode = new_node(f"mode{g}", 2) if modes and rng.random() < 0.6 else None
        region(ops, mode, f"r{g}")
    first_chain = len(regs)
    if chain > 1:
        _chain(rng, chain, ks, names, additive, regs, order, new_node, modes)
    exc = None
    if exclude:
        exc = [rng.random(k) < 0.6 for k in ks]
        for e in exc:
            e[rng.integers(len(e))] = True         # the excluded combination exists
    return PeakGraph.build(names, ks, additive, regs, chain=tuple(range(first_chain, len(regs))) if chain > 1 else (),
                           exclude=exc, units=unit_spans)


def _split(regs, unit_spans, ops, mode, kinds, name):
    """One region per operator, the mode node in the first, base terms in the last; every
    term goes to the region of its latest operator."""
    first = len(regs)
    per: list[dict[str, list[Term]]] = [{k: [] for k in kinds} for _ in ops]
    at = {op: i for i, op in enumerate(ops)}
    for kind, terms in kinds.items():
        for t in terms:
            i = max((at[v] for v in t.scope if v in at), default=0)
            per[len(ops) - 1 if kind == "base" else i][kind].append(t)
    for i, op in enumerate(ops):
        nodes = (op, mode) if i == 0 else (op,)
        regs.append(Region(nodes, None, **{k: tuple(v) for k, v in per[i].items()}, name=f"{name}.{i}"))
    unit_spans.append((first, len(regs) - 1))


def _mode_zero(t: np.ndarray, has_mode: bool, zero_at: int) -> np.ndarray:
    """A table over (mode, ...) that is 0 in mode ``zero_at``: held activations vanish when
    recomputed (mode 1), the view's extra and the base when kept (mode 0)."""
    if has_mode:
        t = t.copy()
        t[zero_at] = 0.0
    return t


def _chain(rng, n_blocks, ks, names, additive, regs, order, new_node, modes):
    """Identical regions: one template of terms over (previous block's exit, own nodes)."""
    size = int(rng.integers(2, 4))
    kk = [int(rng.integers(1, 3)) for _ in range(size)]
    has_mode = modes and rng.random() < 0.7
    entry = order[-1]
    kx = kk[-1]
    # template tables
    node_t = [rng.integers(0, 6, size=(k, 2)).astype(float) for k in kk]
    edge_t = [rng.integers(0, 6, size=(kk[i - 1], kk[i], 2)).astype(float) for i in range(1, size)]
    into = rng.integers(0, 6, size=(kx, kk[0], 2)).astype(float)
    skip = rng.integers(0, 6, size=(kx, kk[-1], 2)).astype(float)
    held = [rng.integers(0, 5, size=((2,) if has_mode else ()) + (k,)).astype(float) for k in kk]
    view = [rng.integers(0, 5, size=(2, k)).astype(float) for k in kk]
    local = [rng.integers(-3, 8, size=(k, kx)).astype(float) for k in kk]
    rise = [rng.integers(-2, 6, size=(2, k)).astype(float) for k in kk]
    for t in rise:
        t[0] = -np.inf
    if has_mode:
        for t in held:
            t[1] = 0.0
        for t in view:
            t[0] = 0.0
    first = True
    for b in range(n_blocks):
        ops = [new_node(f"b{b}.{j}", kk[j]) for j in range(size)]
        mode = new_node(f"b{b}.mode", 2) if has_mode else None
        if first and ks[entry] != kx:
            into_b = rng.integers(0, 6, size=(ks[entry], kk[0], 2)).astype(float)
            skip_b = rng.integers(0, 6, size=(ks[entry], kk[-1], 2)).astype(float)
            local_b = [rng.integers(-3, 8, size=(k, ks[entry])).astype(float) for k in kk]
        else:
            into_b, skip_b, local_b = into, skip, local
        for j, op in enumerate(ops):
            additive.append(Term((op,), node_t[j]))
            if j:
                additive.append(Term((ops[j - 1], op), edge_t[j - 1]))
        additive.append(Term((entry, ops[0]), into_b))
        additive.append(Term((entry, ops[-1]), skip_b))
        kinds = {"held": [], "view": [], "local": [], "base": [], "rise": []}
        for j, op in enumerate(ops):
            kinds["held"].append(Term((mode, op) if has_mode else (op,), held[j]))
            kinds["local"].append(Term((op, entry), local_b[j]))
            if has_mode:
                kinds["view"].append(Term((mode, op), view[j]))
                kinds["rise"].append(Term((mode, op), rise[j]))
        regs.append(Region(tuple(ops) + ((mode,) if has_mode else ()), mode,
                           **{k: tuple(v) for k, v in kinds.items()}, name=f"block{b}"))
        order.extend(ops)
        entry = ops[-1]
        first = False
