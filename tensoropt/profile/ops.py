"""Operator micro-benchmarks: one ``OpCase`` per (family, op, shape), swept over sizes.

FLOPs follow the operator graph's conventions: 2·m·n·k per GEMM (torch's flop counter),
4·b·h·s²·d for attention forward, and for the non-matmul families the per-element counts of
``tensoropt.capture`` (norm 5, softmax 5, elementwise 1, ... per element; embedding 0).
``nbytes`` is operands read plus output written by one kernel call; for the embedding it is
the rows gathered (not the whole table). A fwd+bwd GEMM run is 3 GEMMs of the same FLOPs and
bytes (forward, input grad, weight grad), so it counts ``calls = 3``.

Besides the family sweeps: forward-and-backward runs of single operators whose family curve
cannot hold them, keyed ``family/kind`` (:func:`_keyed_cases`), and what a training step
pays besides its kernels, fitted apart from the curves: the framework's time per operator
(:func:`framework_cases`) and the optimizer's update per parameter (:func:`optimizer_cases`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["OpCase", "op_cases", "alignment_cases", "copy_cases", "peak_cases", "framework_cases", "optimizer_cases",
           "FAMILIES_PROFILED", "CHAIN_OPS_PER_LAYER", "per_element_flops", "linear_builder"]

#: families the sweep covers (every family of the operator graph)
FAMILIES_PROFILED = ("linear", "matmul", "attention", "conv", "norm", "softmax", "elementwise",
                     "embedding", "pool", "reduction", "loss")
_GEMM_CALLS_FWD_BWD = 3
#: attention's backward FLOPs over its forward's, as the graph capture counts them
ATTENTION_BWD_RATIO = 2.5
#: operators per layer of the framework-overhead chain (linear, gelu, layer_norm)
CHAIN_OPS_PER_LAYER = 3
_INDEX_BYTES = 8          # int64 indices / targets


def per_element_flops() -> dict[str, float]:
    """Forward FLOPs per element of the non-matmul families, as the graph capture counts them."""
    from ..capture import builder as b

    return {"elementwise": b.ELEMENTWISE_FLOPS, "norm": b.NORM_FLOPS, "softmax": b.SOFTMAX_FLOPS,
            "reduction": b.REDUCTION_FLOPS, "pool": b.POOL_FLOPS, "loss": b.LOSS_FLOPS,
            "embedding": b.EMBEDDING_FLOPS}


@dataclass(frozen=True)
class OpCase:
    family: str
    op: str
    shape: tuple[int, ...]
    flops: float                 # per kernel call
    nbytes: float                # per kernel call
    calls: int                   # kernel calls per timed run
    alloc_bytes: float           # memory the case allocates (for the can-it-fit check)
    build: Callable[[object, object], Callable[[], object]]   # (torch.device, dtype) -> fn

    @property
    def label(self) -> str:
        return f"{self.op}{list(self.shape)}"


# ------------------------------------------------------------------------------ builders

def linear_builder(m, k, n, backward):
    def build(device, dtype):
        import torch
        import torch.nn.functional as F
        x = torch.randn(m, k, device=device, dtype=dtype, requires_grad=backward)
        w = torch.randn(n, k, device=device, dtype=dtype, requires_grad=backward)
        if not backward:
            return lambda: F.linear(x, w)
        gy = torch.randn(m, n, device=device, dtype=dtype)
        return lambda: torch.autograd.grad(F.linear(x, w), (x, w), gy)
    return build


def _bmm(b, m, k, n, backward):
    def build(device, dtype):
        import torch
        x = torch.randn(b, m, k, device=device, dtype=dtype, requires_grad=backward)
        y = torch.randn(b, k, n, device=device, dtype=dtype, requires_grad=backward)
        if not backward:
            return lambda: torch.bmm(x, y)
        g = torch.randn(b, m, n, device=device, dtype=dtype)
        return lambda: torch.autograd.grad(torch.bmm(x, y), (x, y), g)
    return build


def _sdpa(b, h, s, d):
    def build(device, dtype):
        import torch
        import torch.nn.functional as F
        q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype) for _ in range(3))
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=False)
    return build


def _conv(n, cin, hw, cout, ks):
    def build(device, dtype):
        import torch
        import torch.nn.functional as F
        x = torch.randn(n, cin, hw, hw, device=device, dtype=dtype)
        w = torch.randn(cout, cin, ks, ks, device=device, dtype=dtype)
        return lambda: F.conv2d(x, w, padding=ks // 2)
    return build


def _unary(fn_name, rows, cols):
    def build(device, dtype):
        import torch
        import torch.nn.functional as F
        x = torch.randn(rows, cols, device=device, dtype=dtype)
        if fn_name == "layer_norm":
            w = torch.ones(cols, device=device, dtype=dtype)
            bias = torch.zeros(cols, device=device, dtype=dtype)
            return lambda: F.layer_norm(x, (cols,), w, bias)
        if fn_name == "softmax":
            return lambda: torch.softmax(x, dim=-1)
        if fn_name == "gelu":
            return lambda: F.gelu(x)
        if fn_name == "add":
            y = torch.randn(rows, cols, device=device, dtype=dtype)
            return lambda: torch.add(x, y)
        if fn_name == "sum":
            return lambda: x.sum(dim=-1)
        if fn_name == "cross_entropy":
            t = torch.randint(0, cols, (rows,), device=device)
            return lambda: F.cross_entropy(x, t)
        if fn_name == "copy":
            y = torch.empty_like(x)
            return lambda: y.copy_(x)
        raise ValueError(fn_name)
    return build


def _embedding(vocab, dim, count):
    def build(device, dtype):
        import torch
        import torch.nn.functional as F
        w = torch.randn(vocab, dim, device=device, dtype=dtype)
        idx = torch.randint(0, vocab, (count,), device=device)
        return lambda: F.embedding(idx, w)
    return build


def _pool(n, c, hw):
    def build(device, dtype):
        import torch
        import torch.nn.functional as F
        x = torch.randn(n, c, hw, hw, device=device, dtype=dtype)
        return lambda: F.max_pool2d(x, 2)
    return build


# ------------------------------------------------------------------------------ sweeps

# What a GPU adds to a full sweep: the sizes training runs at, where its matrix units reach their
# plateau (a 1024-cube matmul is launch-bound there), and tensors far beyond its caches.
_GPU_LINEAR = ((2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 768, 3072),
               (8192, 4096, 14336), (8192, 2048, 8192))
_GPU_BMM = ((64, 1024, 128, 1024), (96, 2048, 128, 2048))
_GPU_ATTENTION = ((8, 16, 2048, 128), (4, 32, 4096, 128))
_GPU_CONV = ((64, 64, 56, 64, 3), (64, 256, 14, 256, 3), (128, 64, 56, 256, 1))
_GPU_ROWWISE_EXPS = (26, 28)
_GPU_LOSS = ((8192, 50304), (4096, 128256))


def _linear_cases(s, quick, gpu=False):
    squares = (32, 128, 512) if quick else (32, 64, 128, 256, 384, 512, 768, 1024)
    gemv = ((1, 512, 512),) if quick else ((1, 1024, 1024), (1, 2048, 2048), (1, 4096, 4096), (4, 4096, 4096))
    shapes = [(n, n, n) for n in squares] + list(gemv) + ([] if quick else [(256, 768, 3072), (1024, 1024, 256)])
    shapes += list(_GPU_LINEAR) if gpu and not quick else []
    out = []
    for m, k, n in shapes:
        flops = 2.0 * m * k * n
        nbytes = float(m * k + n * k + m * n) * s
        out.append(OpCase("linear", "linear_fwd", (m, k, n), flops, nbytes, 1, nbytes, linear_builder(m, k, n, False)))
        if m >= 32:
            out.append(OpCase("linear", "linear_fwd_bwd", (m, k, n), flops, nbytes, _GEMM_CALLS_FWD_BWD,
                              2 * nbytes, linear_builder(m, k, n, True)))
    return out


def _matmul_cases(s, quick, gpu=False):
    shapes = [(8, 32, 32, 32), (8, 128, 64, 128), (4, 256, 256, 256)] if quick else \
        [(8, 16, 16, 16), (8, 32, 32, 32), (8, 64, 64, 64), (12, 128, 64, 128), (8, 128, 128, 128),
         (8, 256, 256, 256), (4, 512, 512, 512), (48, 256, 64, 256), (1, 1, 4096, 4096)]
    shapes += list(_GPU_BMM) if gpu and not quick else []
    out = []
    for b, m, k, n in shapes:
        flops = 2.0 * b * m * k * n
        nbytes = float(b * (m * k + k * n + m * n)) * s
        out.append(OpCase("matmul", "bmm_fwd", (b, m, k, n), flops, nbytes, 1, nbytes, _bmm(b, m, k, n, False)))
        if m >= 32 and (gpu or b * m * k * n <= 2 ** 27):
            out.append(OpCase("matmul", "bmm_fwd_bwd", (b, m, k, n), flops, nbytes, _GEMM_CALLS_FWD_BWD,
                              2 * nbytes, _bmm(b, m, k, n, True)))
    return out


def _attention_cases(s, quick, gpu=False):
    shapes = [(1, 4, 64, 32), (1, 4, 256, 64)] if quick else \
        [(1, 4, 32, 64), (1, 8, 64, 64), (1, 8, 128, 64), (2, 8, 256, 64), (1, 12, 512, 64), (1, 8, 1024, 64)]
    shapes += list(_GPU_ATTENTION) if gpu and not quick else []
    return [OpCase("attention", "sdpa", (b, h, sq, d), 4.0 * b * h * sq * sq * d, 4.0 * b * h * sq * d * s, 1,
                   4.0 * b * h * sq * d * s + b * h * sq * sq * s, _sdpa(b, h, sq, d)) for b, h, sq, d in shapes]


def _conv_cases(s, quick, gpu=False):
    shapes = [(2, 8, 16, 8, 3), (4, 32, 32, 32, 3)] if quick else \
        [(1, 3, 32, 16, 3), (8, 16, 32, 16, 3), (8, 32, 32, 32, 3), (8, 64, 16, 64, 3), (8, 128, 8, 128, 3),
         (8, 64, 56, 64, 1), (4, 64, 56, 64, 3)]
    shapes += list(_GPU_CONV) if gpu and not quick else []
    out = []
    for n, cin, hw, cout, ks in shapes:
        flops = 2.0 * n * cout * hw * hw * cin * ks * ks
        nbytes = float(n * cin * hw * hw + cout * cin * ks * ks + n * cout * hw * hw) * s
        out.append(OpCase("conv", "conv2d", (n, cin, hw, cout, ks), flops, nbytes, 1, 2 * nbytes,
                          _conv(n, cin, hw, cout, ks)))
    return out


def _rowwise_sizes(quick, gpu=False):
    """(rows, cols) from 4 Ki to 16 Mi elements (quick: to 1 Mi; a GPU's full sweep: to 256 Mi)."""
    cols = 1024
    exps = (12, 16, 20) if quick else (10, 12, 14, 16, 18, 20, 22, 24) + (_GPU_ROWWISE_EXPS if gpu else ())
    return [(max(1, 2 ** e // cols), min(cols, 2 ** e)) for e in exps]


def _pointwise_cases(s, quick, gpu=False):
    fl = per_element_flops()
    out = []
    for rows, cols in _rowwise_sizes(quick, gpu):
        numel = rows * cols
        out.append(OpCase("norm", "layer_norm", (rows, cols), fl["norm"] * numel, (2.0 * numel + 2 * cols) * s, 1,
                          2.0 * numel * s, _unary("layer_norm", rows, cols)))
        out.append(OpCase("softmax", "softmax", (rows, cols), fl["softmax"] * numel, 2.0 * numel * s, 1,
                          2.0 * numel * s, _unary("softmax", rows, cols)))
        out.append(OpCase("elementwise", "gelu", (rows, cols), fl["elementwise"] * numel, 2.0 * numel * s, 1,
                          2.0 * numel * s, _unary("gelu", rows, cols)))
        out.append(OpCase("elementwise", "add", (rows, cols), fl["elementwise"] * numel, 3.0 * numel * s, 1,
                          3.0 * numel * s, _unary("add", rows, cols)))
        out.append(OpCase("reduction", "sum", (rows, cols), fl["reduction"] * numel, (numel + rows) * s, 1,
                          1.0 * numel * s, _unary("sum", rows, cols)))
    for rows, vocab in ([(8, 1024), (64, 8192)] if quick else
                        [(8, 1024), (32, 4096), (128, 8192), (256, 32768), (512, 50304)]
                        + (list(_GPU_LOSS) if gpu else [])):
        numel = rows * vocab
        out.append(OpCase("loss", "cross_entropy", (rows, vocab), fl["loss"] * numel,
                          numel * s + rows * _INDEX_BYTES + s, 1, 2.0 * numel * s, _unary("cross_entropy", rows, vocab)))
    for n, c, hw in ([(1, 8, 16), (4, 32, 64)] if quick else
                     [(1, 8, 16), (4, 16, 32), (8, 32, 56), (8, 64, 112), (16, 64, 112)]):
        numel = n * c * hw * hw
        out.append(OpCase("pool", "max_pool2d", (n, c, hw), fl["pool"] * numel, 1.25 * numel * s, 1,
                          1.25 * numel * s, _pool(n, c, hw)))
    vocab, dim = (8192, 256) if quick else (50304, 768)
    for count in ((16, 1024, 8192) if quick else (16, 128, 1024, 4096, 16384)):
        nbytes = float(count * _INDEX_BYTES + 2 * count * dim * s)
        out.append(OpCase("embedding", "embedding", (vocab, dim, count), fl["embedding"] * count * dim, nbytes, 1,
                          vocab * dim * s + nbytes, _embedding(vocab, dim, count)))
    return out


def _grad_fn(kind, shape):
    """A forward and backward of one operator of ``kind`` on inputs of ``shape`` that need
    gradients, as a training step runs it (weights of norms need theirs too)."""
    def build(device, dtype):
        import torch
        import torch.nn.functional as F

        def leaf(*sh):
            return torch.randn(*sh, device=device, dtype=dtype, requires_grad=True)
        if kind == "scaled_dot_product_attention":
            q, k, v = (leaf(*shape) for _ in range(3))
            ins, fwd = (q, k, v), lambda: F.scaled_dot_product_attention(q, k, v)
        elif kind == "conv2d":
            n, cin, hw, cout, ks = shape
            x, w = leaf(n, cin, hw, hw), leaf(cout, cin, ks, ks)
            ins, fwd = (x, w), lambda: F.conv2d(x, w, padding=ks // 2)
        elif kind == "batch_norm":
            n, c, hw = shape
            x, w, b = leaf(n, c, hw, hw), leaf(c), leaf(c)
            rm, rv = torch.zeros(c, device=device, dtype=dtype), torch.ones(c, device=device, dtype=dtype)
            ins, fwd = (x, w, b), lambda: F.batch_norm(x, rm, rv, w, b, training=True)
        elif kind == "cross_entropy_loss":
            rows, vocab = shape
            x, t = leaf(rows, vocab), torch.randint(0, vocab, (rows,), device=device)
            ins, fwd = (x,), lambda: F.cross_entropy(x, t)
        else:
            rows, cols = shape
            x = leaf(rows, cols)
            if kind in ("layer_norm", "rms_norm"):
                w = leaf(cols)
                ins = (x, w)
                fwd = ((lambda: F.layer_norm(x, (cols,), w)) if kind == "layer_norm"
                       else (lambda: F.rms_norm(x, (cols,), w)))
            elif kind in ("add", "mul"):
                y = leaf(rows, cols)
                ins, fwd = (x, y), (lambda: x + y) if kind == "add" else (lambda: x * y)
            else:
                ins, fwd = (x,), (lambda: getattr(F, kind)(x))
        out = fwd()
        g = torch.randn_like(out)
        return lambda: torch.autograd.grad(fwd(), ins, g)
    return build


#: operators timed forward and backward for a curve of their own (``compute.curve_key``):
#: where a family's members differ in time per FLOP and byte (a CPU's GELU against its add)
KEYED_POINTWISE = (("elementwise", "gelu"), ("elementwise", "silu"), ("elementwise", "relu"),
                   ("elementwise", "add"), ("elementwise", "mul"), ("norm", "layer_norm"), ("norm", "rms_norm"))


def _keyed_cases(s, quick, gpu=False) -> list[OpCase]:
    """Forward and backward of the operators of :data:`KEYED_POINTWISE`, attention, convolution,
    batch norm and cross-entropy, each keyed ``family/kind``. A run is priced as the cost model
    prices the operator: the forward's FLOPs and bytes, then the backward's (FLOPs times the
    family's backward ratio, twice the bytes), here as ``calls`` calls of their mean."""
    from ..capture import builder as b
    from ..compute import curve_key

    fl = per_element_flops()
    out = []

    def case(family, kind, shape, flops_fwd, bwd_ratio, fwd_bytes, calls=2):
        flops = flops_fwd * (1 + bwd_ratio) / calls
        nbytes = fwd_bytes * 3 / calls
        out.append(OpCase(curve_key(family, kind), f"{kind}_fwd_bwd", shape, flops, nbytes, calls, 4 * fwd_bytes,
                          _grad_fn(kind, shape)))

    for rows, cols in _rowwise_sizes(quick, gpu):
        numel = rows * cols
        for family, kind in KEYED_POINTWISE:
            operands = 2 if kind in ("add", "mul") else 1
            case(family, kind, (rows, cols), fl[family] * numel, b.NONMATMUL_BWD_RATIO,
                 (operands + 1.0) * numel * s)
    for rows, vocab in ([(8, 1024), (64, 8192)] if quick else
                        [(8, 1024), (32, 4096), (128, 8192), (256, 32768)] + (list(_GPU_LOSS) if gpu else [])):
        numel = rows * vocab
        case("loss", "cross_entropy_loss", (rows, vocab), fl["loss"] * numel, b.NONMATMUL_BWD_RATIO,
             numel * s + rows * _INDEX_BYTES)
    for n, c, hw in ([(4, 16, 16)] if quick else [(4, 16, 16), (8, 32, 32), (16, 64, 56)]):
        numel = n * c * hw * hw
        case("norm", "batch_norm", (n, c, hw), fl["norm"] * numel, b.NONMATMUL_BWD_RATIO, 2.0 * numel * s)
    # many short sequences as well as long ones: a kernel's cost per (batch, head) shows there
    att = [(1, 4, 64, 32), (1, 4, 256, 64)] if quick else \
        [(64, 4, 16, 32), (16, 8, 64, 64), (1, 4, 32, 64), (1, 8, 64, 64), (2, 8, 128, 64), (2, 8, 256, 64),
         (1, 8, 1024, 64)]
    for bb, h, sq, d in att + (list(_GPU_ATTENTION) if gpu and not quick else []):
        case("attention", "scaled_dot_product_attention", (bb, h, sq, d), 4.0 * bb * h * sq * sq * d,
             ATTENTION_BWD_RATIO, 4.0 * bb * h * sq * d * s)
    convs = [(2, 8, 16, 8, 3), (4, 32, 32, 32, 3)] if quick else \
        [(8, 16, 32, 16, 3), (8, 32, 32, 32, 3), (8, 64, 16, 64, 3), (4, 64, 56, 64, 3)]
    for n, cin, hw, cout, ks in convs + (list(_GPU_CONV) if gpu and not quick else []):
        flops = 2.0 * n * cout * hw * hw * cin * ks * ks
        nbytes = float(n * cin * hw * hw + cout * cin * ks * ks + n * cout * hw * hw) * s
        case("conv", "conv2d", (n, cin, hw, cout, ks), flops, 2.0, nbytes, calls=3)
    return out


def op_cases(itemsize: int, quick: bool, kind: str = "cpu") -> list[OpCase]:
    """Every operator benchmark, smallest first within each family (``kind="cuda"``: a full
    sweep adds the sizes a GPU trains at)."""
    gpu = kind == "cuda"
    cases = (_linear_cases(itemsize, quick, gpu) + _matmul_cases(itemsize, quick, gpu)
             + _attention_cases(itemsize, quick, gpu) + _conv_cases(itemsize, quick, gpu)
             + _pointwise_cases(itemsize, quick, gpu) + _keyed_cases(itemsize, quick, gpu))
    return cases


#: how far the last dimension of the alignment probes is from a multiple of 8 elements
_MISALIGNMENTS = (0, 1, 2, 4)


def alignment_cases(itemsize: int, quick: bool) -> list[OpCase]:
    """Linear forward and backward with a last dimension 0, 1, 2 and 4 elements past a
    multiple of 8: their rates against the aligned one give ``ComputeModel.misaligned_efficiency``."""
    m, k, n = (2048, 1024, 1024) if quick else (8192, 4096, 4096)
    out = []
    for extra in _MISALIGNMENTS:
        nn = n + extra
        flops = 2.0 * m * k * nn
        nbytes = float(m * k + nn * k + m * nn) * itemsize
        out.append(OpCase("alignment", "linear_fwd_bwd", (m, k, nn), flops, nbytes, _GEMM_CALLS_FWD_BWD, 2 * nbytes,
                          linear_builder(m, k, nn, True)))
    return out


def copy_cases(itemsize: int, quick: bool, min_stream_bytes: float) -> list[OpCase]:
    """Copy probes; those of at least ``min_stream_bytes`` (beyond the caches) set the bandwidth."""
    top = int(min_stream_bytes * (1 if quick else 4))
    sizes = sorted({int(min_stream_bytes) // 16, int(min_stream_bytes), top})
    out = []
    for nbytes_one in sizes:
        numel = max(1, nbytes_one // itemsize)
        cols = 1024
        rows = max(1, numel // cols)
        numel = rows * cols
        out.append(OpCase("copy", "copy", (rows, cols), 0.0, 2.0 * numel * itemsize, 1, 2.0 * numel * itemsize,
                          _unary("copy", rows, cols)))
    return out


def peak_cases(quick: bool, kind: str = "cpu") -> list[int]:
    """Square sizes for the per-dtype matmul peak probe (a GPU needs large ones to reach its peak)."""
    if kind == "cuda":
        return [4096] if quick else [4096, 8192]
    return [512] if quick else [512, 1024]


# ------------------------------------------------------------------------------ step costs

def _chain(layers: int, width: int, rows: int):
    def build(device, dtype):
        import torch
        import torch.nn.functional as F
        x = torch.randn(rows, width, device=device, dtype=dtype, requires_grad=True)
        ws = [torch.randn(width, width, device=device, dtype=dtype, requires_grad=True) for _ in range(layers)]

        def run():
            y = x
            for w in ws:
                y = F.layer_norm(F.gelu(F.linear(y, w)), (width,))
            y.sum().backward()
        return run
    return build


def framework_cases(quick: bool) -> list[OpCase]:
    """Forward and backward of two chains of tiny operators (linear, gelu, layer_norm per
    layer, each linear with a weight of its own, gradients accumulated as a training step
    accumulates them): the difference of their times over the difference of their operator
    counts is the framework's time per operator besides its kernels."""
    width, rows = 16, 8
    out = []
    for layers in ((2, 8) if quick else (4, 32)):
        ops = CHAIN_OPS_PER_LAYER * layers
        out.append(OpCase("framework", "linear_gelu_layer_norm_chain", (layers, rows, width), 0.0, 0.0, ops,
                          4.0 * (layers + 4) * width * width * 4, _chain(layers, width, rows)))
    return out


def _adam(numel: int, tensors: int):
    def build(device, dtype):
        import torch
        ps = [torch.nn.Parameter(torch.randn(numel // tensors, device=device, dtype=dtype)) for _ in range(tensors)]
        for p in ps:
            p.grad = torch.randn_like(p)
        opt = torch.optim.Adam(ps, lr=1e-6)     # as the apply layer's users and the validation build it
        return opt.step
    return build


def optimizer_cases(itemsize: int, quick: bool) -> list[OpCase]:
    """Adam's step over 8 parameters of growing total size: the slope of its time in the
    element count is the update's time per parameter element."""
    tensors = 8
    out = []
    for numel in ((2 ** 14, 2 ** 20) if quick else (2 ** 16, 2 ** 19, 2 ** 22)):
        nbytes = 7.0 * numel * itemsize      # reads parameter, gradient and two moments, writes three
        out.append(OpCase("optimizer", "adam_step", (numel, tensors), 0.0, nbytes, 1, 4.0 * numel * itemsize,
                          _adam(numel, tensors)))
    return out
