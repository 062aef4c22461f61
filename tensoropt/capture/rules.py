"""Per-family equation rules: label the dims of one operator's operands and output.

Every rule keeps one size per label within an operator: where sizes differ (a broadcast
size-1 dim, a strided conv's output spatial dim, a concatenated dim) the dim gets a fresh
label, which is never splittable.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

# ---- op tables (aten overload-packet names, trailing "_" of in-place ops stripped) --------
LINEAR = frozenset(("linear", "addmm", "mm", "matmul", "bmm", "baddbmm", "addbmm", "addmv", "mv",
                    "einsum"))
ATTENTION = frozenset(("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                       "_scaled_dot_product_efficient_attention",
                       "_scaled_dot_product_flash_attention_for_cpu",
                       "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math"))
CONV = frozenset(("conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d",
                  "conv_transpose2d", "conv_transpose3d"))
NORM = frozenset(("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "batch_norm",
                  "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                  "_native_batch_norm_legit_no_training", "cudnn_batch_norm", "group_norm",
                  "native_group_norm", "instance_norm"))
SOFTMAX = frozenset(("softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"))
EMBEDDING = frozenset(("embedding",))
POOL = frozenset(("max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices",
                  "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d", "avg_pool3d",
                  "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
                  "_adaptive_avg_pool2d", "adaptive_max_pool1d", "adaptive_max_pool2d"))
SUM_REDUCTIONS = frozenset(("sum", "mean", "nansum", "nanmean"))
REDUCTIONS = SUM_REDUCTIONS | frozenset(("amax", "amin", "max", "min", "var", "std", "var_mean",
                                         "std_mean", "logsumexp", "norm", "linalg_vector_norm",
                                         "prod", "argmax", "argmin", "any", "all"))
CLASS_LOSSES = frozenset(("cross_entropy_loss", "nll_loss", "nll_loss_nd", "nll_loss2d",
                          "nll_loss_forward", "nll_loss2d_forward"))
ELEM_LOSSES = frozenset(("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
                         "binary_cross_entropy_with_logits", "kl_div", "soft_margin_loss"))
POINTWISE = frozenset((
    "add", "sub", "rsub", "mul", "div", "neg", "exp", "exp2", "expm1", "log", "log1p", "log2",
    "sqrt", "rsqrt", "pow", "square", "tanh", "sigmoid", "relu", "relu6", "gelu", "silu", "mish",
    "softplus", "hardtanh", "hardswish", "hardsigmoid", "leaky_relu", "elu", "selu", "celu", "glu",
    "clamp", "clamp_min", "clamp_max", "clip", "where", "masked_fill", "abs", "sin", "cos", "tan",
    "reciprocal", "erf", "erfc", "sign", "floor", "ceil", "round", "trunc", "frac", "maximum",
    "minimum", "fmax", "fmin", "eq", "ne", "lt", "gt", "le", "ge", "logical_and", "logical_or",
    "logical_not", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_not", "bitwise_xor",
    "dropout", "native_dropout", "feature_dropout", "alpha_dropout", "addcmul", "addcdiv", "lerp",
    "fill", "copy", "_to_copy", "to", "type_as", "nan_to_num", "isnan", "isinf", "remainder",
    "fmod", "floor_divide", "true_divide", "atan", "atan2", "asin", "acos", "sinh", "cosh",
    "logit", "threshold", "hardshrink", "softshrink", "tril", "triu", "cat", "concat", "stack",
    "repeat", "repeat_interleave", "tile", "roll", "flip", "pad", "constant_pad_nd",
    "reflection_pad1d", "reflection_pad2d", "replication_pad2d", "cumsum", "cumprod",
))
# ops whose output depends on an activation's shape only, never on its values: constants
CONST_LIKE = frozenset(("zeros_like", "ones_like", "empty_like", "full_like", "rand_like",
                        "randn_like", "randint_like", "new_zeros", "new_ones", "new_empty", "new_full",
                        "scalar_tensor", "sym_size", "sym_numel", "sym_stride"))
SCAN_OR_SHIFT = frozenset(("cumsum", "cumprod", "roll", "flip", "tril", "triu"))


# ---- labelling context ---------------------------------------------------------------------
@dataclass
class Ctx:
    name: str                       # aten packet name
    args: tuple                     # node args with tensor operands replaced by OperandRef
    kwargs: dict
    shapes: list[tuple]             # operand shapes
    bdims: list[int | None]         # operand batch dims
    is_param: list[bool]
    out_shape: tuple
    terms: list[list[str] | None] = field(default_factory=list)
    used: set = field(default_factory=lambda: {"b"})
    sizes: dict = field(default_factory=dict)
    out: list[str] = field(default_factory=list)
    split: set = field(default_factory=set)
    family: str = "other"
    out_bdim: int | None = None

    def __post_init__(self):
        self.terms = [None] * len(self.shapes)

    # letters
    def take(self, prefs: str = "", size: int | None = None) -> str:
        for c in prefs + string.ascii_lowercase + string.ascii_uppercase:
            if c not in self.used:
                self.used.add(c)
                if size is not None:
                    self.sizes[c] = size
                return c
        raise ValueError("operator has more than 51 distinct dims")

    def name_dims(self, shape, bdim, prefs: str) -> list[str]:
        out = []
        for k, n in enumerate(shape):
            if k == bdim and self.sizes.get("b", n) == n:
                self.sizes["b"] = n
                out.append("b")
            else:
                out.append(self.take(prefs, n))
        return out

    def reuse(self, label: str, size: int) -> str:
        """`label` if it has this size here, else a fresh label."""
        if self.sizes.get(label) == size:
            return label
        return self.take("", size)

    def align(self, shape, labels, lshape) -> list[str]:
        """Label `shape` right-aligned against dims `labels` of size `lshape` (broadcasting)."""
        off = len(lshape) - len(shape)
        res = []
        for k, n in enumerate(shape):
            j = k + off
            res.append(labels[j] if 0 <= j < len(labels) and lshape[j] == n else self.take("", n))
        return res

    def arg(self, pos):
        """Operand index of positional arg `pos` (or kwarg name), None if not a tensor."""
        a = None
        if isinstance(pos, int):
            if pos < len(self.args):
                a = self.args[pos]
        else:
            a = self.kwargs.get(pos)
        return a.index if isinstance(a, OperandRef) else None

    def argv(self, pos, kw: str | None = None, default: Any = None):
        if pos < len(self.args):
            return self.args[pos]
        if kw is not None and kw in self.kwargs:
            return self.kwargs[kw]
        return default

    def out_bdim_from(self, i: int | None, labels_in: list[str] | None = None):
        if i is None:
            return
        b = self.bdims[i]
        if b is not None and labels_in is not None and labels_in[b] == "b" and "b" in self.out:
            self.out_bdim = self.out.index("b")


@dataclass(frozen=True)
class OperandRef:
    index: int


def _norm(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _dims(x, rank) -> list[int]:
    if x is None:
        return list(range(rank))
    if isinstance(x, int):
        x = [x]
    x = list(x)
    if not x:
        return list(range(rank))
    return sorted({_norm(int(d), rank) for d in x})


# ---- rules ---------------------------------------------------------------------------------
def elementwise(c: Ctx, unsplit_dims: tuple[int, ...] = ()) -> None:
    """Output labelled by position (b = batch); operands right-aligned (broadcast)."""
    c.family = "elementwise"
    ob = None
    for i, s in enumerate(c.shapes):
        b = c.bdims[i]
        if b is not None:
            j = b + len(c.out_shape) - len(s)
            if 0 <= j < len(c.out_shape) and c.out_shape[j] == s[b]:
                ob = j
                break
    c.out = c.name_dims(c.out_shape, ob, "shdnxyzuvw")
    c.out_bdim = ob
    for i, s in enumerate(c.shapes):
        c.terms[i] = c.align(s, c.out, c.out_shape)
    # a label only the output has (repeat_interleave's repeated heads, a padded dim) is computed
    # whole on every rank from whole operands: never split
    read = {lab for t in c.terms if t is not None for lab in t}
    c.split = {lab for k, lab in enumerate(c.out)
               if k not in unsplit_dims and c.out_shape[k] != 1 and (lab in read or not c.shapes)}


def other(c: Ctx) -> None:
    """Unknown op: replicated only (nothing splittable); 'b' still marks known batch dims."""
    c.family = "other"
    for i, s in enumerate(c.shapes):
        c.terms[i] = c.name_dims(s, c.bdims[i], "")
    ob = None
    for i, s in enumerate(c.shapes):
        b = c.bdims[i]
        if b is not None and b < len(c.out_shape) and c.out_shape[b] == s[b]:
            ob = b
            break
    c.out = c.name_dims(c.out_shape, ob, "")
    c.out_bdim = ob
    c.split = set()


def linear_rule(c: Ctx) -> None:
    n = c.name
    if n == "linear":
        x, w, bias = c.arg(0), c.arg(1), c.arg(2)
        xs = c.shapes[x]
        lead = c.name_dims(xs[:-1], c.bdims[x], "stuvw")
        k = c.take("k", xs[-1])
        nn_ = c.take("n", c.shapes[w][0])
        c.terms[x] = lead + [k]
        c.terms[w] = [nn_, k]
        if bias is not None:
            c.terms[bias] = c.align(c.shapes[bias], lead + [nn_], xs[:-1] + (c.shapes[w][0],))
        c.out = lead + [nn_]
        c.family = "linear"
    elif n == "einsum":
        return einsum_rule(c)
    else:
        if n in ("addmm", "baddbmm", "addbmm", "addmv"):
            bias, a, b = c.arg(0), c.arg(1), c.arg(2)
        else:
            bias, a, b = None, c.arg(0), c.arg(1)
        if a is None or b is None:
            return other(c)
        sa, sb = c.shapes[a], c.shapes[b]
        weightish = c.is_param[b] or c.is_param[a]
        c.family = "linear" if weightish else "matmul"
        out = c.out_shape
        if n == "addbmm":  # sum over the batch of matmuls
            return other(c)
        # out = (*batch, M?, N?)
        a_m = len(sa) >= 2
        b_n = len(sb) >= 2
        nb = len(out) - int(a_m) - int(b_n)
        kk = c.take("k", sa[-1])
        if weightish and not c.is_param[a] and len(sb) == 2:
            # activation @ weight: like linear, all of a's leading dims are "rows"
            lead = c.name_dims(sa[:-1], c.bdims[a], "stuvw")
            nn_ = c.take("n", sb[-1])
            c.terms[a] = lead + [kk]
            c.terms[b] = [kk, nn_]
            c.out = lead + [nn_]
        else:
            a_batch = sa[:-2] if a_m else ()
            ob = None
            ba = c.bdims[a]
            if ba is not None and ba < len(a_batch):
                ob = ba + nb - len(a_batch)
            bl = c.name_dims(out[:nb], ob, "nghe")
            m = []
            if a_m:
                if ba == len(sa) - 2 and c.sizes.get("b", sa[-2]) == sa[-2] and "b" not in bl:
                    c.sizes["b"] = sa[-2]
                    m = ["b"]
                else:
                    m = [c.take("i", sa[-2])]
            j = [c.take("j", sb[-1])] if b_n else []
            c.terms[a] = c.align(a_batch, bl, out[:nb]) + m + [kk]
            if b_n:
                c.terms[b] = c.align(sb[:-2], bl, out[:nb]) + [c.reuse(kk, sb[-2])] + j
            else:
                c.terms[b] = [c.reuse(kk, sb[0])]
            c.out = bl + m + j
        if bias is not None:
            c.terms[bias] = c.align(c.shapes[bias], c.out, out)
    c.split = {lab for t in c.terms if t for lab in t if c.sizes.get(lab, 0) != 1 and _common(c, lab)}
    c.out_bdim = c.out.index("b") if "b" in c.out else None


def _common(c: Ctx, lab: str) -> bool:
    """A label is splittable in a contraction if it isn't a broadcast-only fresh label."""
    n = sum(lab in t for t in c.terms if t) + (lab in c.out)
    return n >= 2


def einsum_rule(c: Ctx) -> None:
    eq = c.args[0]
    ops = [a.index for a in c.args[1] if isinstance(a, OperandRef)] if isinstance(c.args[1], (list, tuple)) else []
    if not isinstance(eq, str) or "..." in eq or len(ops) != len(c.shapes):
        return other(c)
    eq = eq.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    ins = lhs.split(",")
    if not rhs and "->" not in eq:
        counts: dict[str, int] = {}
        for t in ins:
            for ch in t:
                counts[ch] = counts.get(ch, 0) + 1
        rhs = "".join(sorted(ch for ch, k in counts.items() if k == 1))
    # relabel so that the batch dim is 'b' and no other dim uses 'b'
    mapping: dict[str, str] = {}
    for i, t in zip(ops, ins):
        b = c.bdims[i]
        if b is not None and t[b] not in mapping:
            mapping[t[b]] = "b"
            c.sizes["b"] = c.shapes[i][b]
            break
    for i, t in zip(ops, ins):
        for ch, n in zip(t, c.shapes[i]):
            if ch not in mapping:
                mapping[ch] = c.take(ch.lower() if ch.lower() != "b" else "", n)
    for i, t in zip(ops, ins):
        c.terms[i] = [mapping[ch] for ch in t]
    c.out = [mapping.get(ch) or c.take("", 1) for ch in rhs]
    c.family = "linear" if any(c.is_param) else "matmul"
    c.split = {lab for t in c.terms for lab in t}
    c.out_bdim = c.out.index("b") if "b" in c.out else None


def attention_rule(c: Ctx) -> None:
    q, k, v = c.arg(0), c.arg(1), c.arg(2)
    mask = c.arg(3) if c.arg(3) is not None else c.arg("attn_mask")
    if mask is None and c.name == "_scaled_dot_product_efficient_attention":
        mask = c.arg("attn_bias")
    sq, sk, sv = c.shapes[q], c.shapes[k], c.shapes[v]
    lead = c.name_dims(sq[:-2], c.bdims[q] if c.bdims[q] is not None and c.bdims[q] < len(sq) - 2 else None, "nghe")
    s, d = c.take("s", sq[-2]), c.take("d", sq[-1])
    t = c.take("t", sk[-2])
    e = c.take("e", sv[-1])
    c.terms[q] = lead + [s, d]
    c.terms[k] = c.align(sk[:-2], lead, sq[:-2]) + [t, c.reuse(d, sk[-1])]
    c.terms[v] = c.align(sv[:-2], lead, sq[:-2]) + [c.reuse(t, sv[-2]), e]
    if mask is not None:
        c.terms[mask] = c.align(c.shapes[mask], lead + [s, t], sq[:-2] + (sq[-2], sk[-2]))
    c.out = lead + [s, e]
    c.family = "attention"
    c.split = {lab for lab in lead if lab in c.terms[k] and lab in c.terms[v]} | {s}
    c.out_bdim = c.out.index("b") if "b" in c.out else None


def conv_rule(c: Ctx) -> None:
    x, w, bias = c.arg(0), c.arg(1), c.arg(2)
    if x is None or w is None:
        return other(c)
    n = c.name
    if n == "convolution" or n == "_convolution":
        transposed, groups = bool(c.argv(6, "transposed", False)), int(c.argv(8, "groups", 1))
    elif n.startswith("conv_transpose"):
        transposed, groups = True, int(c.argv(6, "groups", 1))
    else:
        transposed, groups = False, int(c.argv(6, "groups", 1))
    xs, ws, out = c.shapes[x], c.shapes[w], c.out_shape
    nsp = len(ws) - 2
    batched = len(xs) == len(ws)
    bl = ["b" if c.bdims[x] == 0 else c.take("a", xs[0])] if batched else []
    if bl == ["b"]:
        c.sizes["b"] = xs[0]
    ch = c.take("c", xs[len(bl)])
    o = c.take("o", out[len(bl)])
    sp = [c.take("xyz", n_) for n_ in xs[len(bl) + 1:]]
    osp = [c.reuse(sp[i], out[len(bl) + 1 + i]) if c.sizes.get(sp[i]) == out[len(bl) + 1 + i] else c.take("pqr", out[len(bl) + 1 + i]) for i in range(nsp)]
    kern = [c.take("ijl", n_) for n_ in ws[2:]]
    if transposed:
        c.terms[w] = [c.reuse(ch, ws[0]), c.reuse(o, ws[1])] + kern
    else:
        c.terms[w] = [c.reuse(o, ws[0]), c.reuse(ch, ws[1])] + kern
    c.terms[x] = bl + [ch] + sp
    if bias is not None:
        c.terms[bias] = [o]
    c.out = bl + [o] + osp
    c.family = "conv"
    # a grouped (depthwise) convolution ties each output channel to its group's input
    # channels: only the batch splits without moving groups across devices
    c.split = set(bl) | ({o, ch} if groups == 1 else set())
    c.out_bdim = 0 if bl == ["b"] else None


def norm_rule(c: Ctx) -> None:
    n = c.name
    x = c.arg(0)
    xs = c.shapes[x]
    c.family = "norm"
    if n in ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm"):
        nd = len(c.argv(1, "normalized_shape", [xs[-1]]))
        lead = c.name_dims(xs[:-nd], c.bdims[x], "stuvw")
        normed = [c.take("hgf", s) for s in xs[len(xs) - nd:]]
        c.terms[x] = lead + normed
        c.out = lead + normed
        for i in range(len(c.shapes)):
            if i != x:
                c.terms[i] = c.align(c.shapes[i], c.out, xs)
        c.split = set(lead)
    else:  # batch / group / instance norm: (B, C, *spatial)
        bl = c.name_dims(xs[:1], c.bdims[x], "a")
        ch = c.take("c", xs[1]) if len(xs) > 1 else None
        sp = [c.take("xyz", s) for s in xs[2:]]
        c.terms[x] = bl + ([ch] if ch else []) + sp
        c.out = list(c.terms[x])
        for i in range(len(c.shapes)):
            if i != x:
                s = c.shapes[i]
                c.terms[i] = [c.reuse(ch, s[0])] + [c.take("", d) for d in s[1:]] if ch and len(s) >= 1 else c.align(s, c.out, xs)
        if "group_norm" in n:
            c.split = set(bl)
        else:  # batch statistics are per-device (as DDP without SyncBatchNorm)
            c.split = set(bl) | ({ch} if ch else set())
    c.out_bdim = c.out.index("b") if "b" in c.out else None


def softmax_rule(c: Ctx) -> None:
    x = c.arg(0)
    d = _norm(int(c.argv(1, "dim", -1)), len(c.shapes[x]))
    elementwise(c, unsplit_dims=(d,))
    c.family = "softmax"


def embedding_rule(c: Ctx) -> None:
    w, idx = c.arg(0), c.arg(1)
    if w is None or idx is None:
        return other(c)
    lead = c.name_dims(c.shapes[idx], c.bdims[idx], "stuvw")
    v = c.take("v", c.shapes[w][0])
    h = c.take("h", c.shapes[w][1])
    c.terms[idx] = lead
    c.terms[w] = [v, h]
    c.out = lead + [h]
    c.family = "embedding"
    c.split = set(lead) | {v, h}
    c.out_bdim = c.out.index("b") if "b" in c.out else None


def pool_rule(c: Ctx) -> None:
    x = c.arg(0)
    xs, out = c.shapes[x], c.out_shape
    nsp = int(c.name[-2]) if c.name[-2:-1].isdigit() else 2
    nl = len(xs) - nsp - 1
    lead = c.name_dims(xs[:nl], c.bdims[x] if c.bdims[x] is not None and c.bdims[x] < nl else None, "a")
    ch = c.take("c", xs[nl])
    sp = [c.take("xyz", s) for s in xs[nl + 1:]]
    osp = [sp[i] if xs[nl + 1 + i] == out[nl + 1 + i] else c.take("pqr", out[nl + 1 + i]) for i in range(nsp)]
    c.terms[x] = lead + [ch] + sp
    c.out = lead + [ch] + osp
    c.family = "pool"
    c.split = set(lead) | {ch}
    c.out_bdim = c.out.index("b") if "b" in c.out else None


def reduction_rule(c: Ctx) -> None:
    x = c.arg(0)
    xs = c.shapes[x]
    n = c.name
    if n in ("var", "std", "var_mean", "std_mean"):
        dims = c.argv(1, "dim", None)
        keep = bool(c.kwargs.get("keepdim", c.args[3] if len(c.args) > 3 and isinstance(c.args[3], bool) else False))
    elif n in ("linalg_vector_norm", "norm"):
        dims = c.argv(2, "dim", None)
        keep = bool(c.argv(3, "keepdim", False))
    else:
        dims = c.argv(1, "dim", None)
        keep = bool(c.argv(2, "keepdim", False))
    if isinstance(dims, OperandRef):
        return other(c)
    red = _dims(dims, len(xs))
    lab = c.name_dims(xs, c.bdims[x], "shdnxyzuvw")
    c.terms[x] = lab
    c.out = [lab[k] if k not in red else c.take("", 1) for k in range(len(xs))] if keep else \
        [lab[k] for k in range(len(xs)) if k not in red]
    expect = [xs[lab.index(l)] if l in lab else 1 for l in c.out]
    if list(c.out_shape) != expect:
        return other(c)
    c.family = "reduction"
    kept = {lab[k] for k in range(len(xs)) if k not in red and xs[k] != 1}
    c.split = kept | ({lab[k] for k in red if xs[k] != 1} if n in SUM_REDUCTIONS else set())
    c.out_bdim = c.out.index("b") if "b" in c.out else None


def loss_rule(c: Ctx) -> None:
    n = c.name
    c.family = "loss"
    reduction = None
    if n in CLASS_LOSSES:
        x, tgt = c.arg(0), c.arg(1)
        xs = c.shapes[x]
        cls = 1 if len(xs) >= 2 else 0
        lab = []
        for k, s in enumerate(xs):
            if k == cls:
                lab.append(c.take("v", s))
            elif k == c.bdims[x] or (k == 0 and c.bdims[x] is None and c.bdims[tgt] == 0):
                c.sizes["b"] = s
                lab.append("b")
            else:
                lab.append(c.take("stu", s))
        c.terms[x] = lab
        ts = c.shapes[tgt]
        tl = [l for k, l in enumerate(lab) if k != cls]
        c.terms[tgt] = tl if len(ts) == len(tl) and all(c.sizes.get(l) == s for l, s in zip(tl, ts)) \
            else c.align(ts, lab, xs)
        for i in range(len(c.shapes)):
            if c.terms[i] is None:
                c.terms[i] = c.align(c.shapes[i], lab, xs)
        c.split = set(tl)
        if len(c.out_shape) == len(tl):
            c.out = tl
    else:
        a = c.arg(0)
        xs = c.shapes[a]
        lab = c.name_dims(xs, c.bdims[a], "shdnxyz")
        for i in range(len(c.shapes)):
            c.terms[i] = c.align(c.shapes[i], lab, xs)
        c.split = {l for l, s in zip(lab, xs) if s != 1}
        if tuple(c.out_shape) == tuple(xs):
            c.out = lab
    if not c.out and c.out_shape:
        c.out = [c.take("", s) for s in c.out_shape]
    c.out_bdim = c.out.index("b") if "b" in c.out else None


def index_rule(c: Ctx) -> None:
    """``x[..., idx, ...]`` with one 1-D index tensor: a gather along that dim, whose label
    is fresh (never split); the other dims pass through."""
    x, idxs = c.arg(0), c.argv(1, "indices", None)
    if x is None or not isinstance(idxs, (list, tuple)):
        return other(c)
    refs = [(d, a) for d, a in enumerate(idxs) if a is not None]
    if len(refs) != 1 or not isinstance(refs[0][1], OperandRef) or len(c.shapes[refs[0][1].index]) != 1:
        return other(c)
    d, ref = refs[0]
    xs = c.shapes[x]
    lab = c.name_dims(xs, c.bdims[x], "shdnxyzuvw")
    picked = c.take("", c.shapes[ref.index][0])
    c.terms[x] = lab
    c.terms[ref.index] = [picked]
    c.out = lab[:d] + [picked] + lab[d + 1:]
    if [c.sizes.get(lb, 0) for lb in c.out] != list(c.out_shape):
        return other(c)
    c.family = "elementwise"
    c.split = {lb for k, lb in enumerate(lab) if k != d and xs[k] != 1}
    c.out_bdim = c.out.index("b") if "b" in c.out else None


def cat_rule(c: Ctx) -> None:
    d = c.argv(1, "dim", 0)
    rank = len(c.out_shape)
    if c.name == "stack":
        elementwise(c)
        for i, s in enumerate(c.shapes):  # stacked operands lack the new dim
            d2 = _norm(int(d), rank)
            others = [l for k, l in enumerate(c.out) if k != d2]
            c.terms[i] = [o if c.sizes.get(o) == n else c.take("", n) for o, n in zip(others, s)]
        c.split.discard(c.out[_norm(int(d), rank)])
        return
    elementwise(c, unsplit_dims=(_norm(int(d), rank),))


RULES = {}
for _n in LINEAR:
    RULES[_n] = linear_rule
for _n in ATTENTION:
    RULES[_n] = attention_rule
for _n in CONV:
    RULES[_n] = conv_rule
for _n in NORM:
    RULES[_n] = norm_rule
for _n in SOFTMAX:
    RULES[_n] = softmax_rule
RULES["embedding"] = embedding_rule
for _n in POOL:
    RULES[_n] = pool_rule
for _n in REDUCTIONS:
    RULES[_n] = reduction_rule
for _n in CLASS_LOSSES | ELEM_LOSSES:
    RULES[_n] = loss_rule
for _n in ("cat", "concat", "stack"):
    RULES[_n] = cat_rule
RULES["index"] = index_rule
for _n in ("tril", "triu"):      # the diagonal is relative to the last two dims' origin
    RULES[_n] = lambda c: elementwise(c, unsplit_dims=(len(c.out_shape) - 2, len(c.out_shape) - 1))
for _n in ("cumsum", "cumprod", "roll", "flip"):
    RULES[_n] = lambda c: elementwise(c, unsplit_dims=tuple(
        _dims(c.argv(1, "dim", None) if c.name != "roll" else c.argv(2, "dims", None), len(c.out_shape))))


def label(c: Ctx) -> Ctx:
    """Fill c.terms/out/split/family using the rule for c.name (elementwise / other fallback)."""
    rule = RULES.get(c.name)
    if rule is None:
        rule = elementwise if c.name in POINTWISE else other
    try:
        rule(c)
    except Exception:  # a rule that doesn't understand this call: stay honest, replicate
        c2 = Ctx(c.name, c.args, c.kwargs, c.shapes, c.bdims, c.is_param, c.out_shape)
        other(c2)
        c.__dict__.update(c2.__dict__)
        c.family = "other"
    for i, t in enumerate(c.terms):
        if t is None:
            c.terms[i] = [c.take("", s) for s in c.shapes[i]]
    return c
