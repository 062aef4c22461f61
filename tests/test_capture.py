"""Tests for tensoropt.capture: operator grouping, equations, FLOPs, saved activations, blocks."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tensoropt.capture import CaptureError, capture
from tensoropt.models import example_inputs, get_model
from tensoropt.opgraph import FAMILIES, OpGraph


# ---- tiny models -------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, d_in=16, d_h=32, d_out=8, norm=False):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_h)
        self.norm = nn.LayerNorm(d_h) if norm else nn.Identity()
        self.act = nn.ReLU() if not norm else nn.GELU()
        self.fc2 = nn.Linear(d_h, d_out)

    def forward(self, x, y):
        return F.mse_loss(self.fc2(self.act(self.norm(self.fc1(x)))), y)


class Attention(nn.Module):
    def __init__(self, d, nh):
        super().__init__()
        self.nh = nh
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.nh, d // self.nh).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class Block(nn.Module):
    def __init__(self, d, nh):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), Attention(d, nh), nn.LayerNorm(d)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=64, seq=16, d=32, nh=4, n_layers=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.layers = nn.ModuleList(Block(d, nh) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x, y):
        h = self.pool(F.relu(self.bn(self.conv(x))))
        return F.cross_entropy(self.fc(h.flatten(1)), y)


def _gpt_inputs(b=2, t=16, vocab=64, device="meta"):
    return (torch.zeros(b, t, dtype=torch.long, device=device),
            torch.zeros(b, t, dtype=torch.long, device=device))


# ---- invariants every captured graph must satisfy ------------------------------------------
def check_graph(g: OpGraph) -> None:
    names = [o.name for o in g.operators]
    assert len(set(names)) == len(names)
    for i, op in enumerate(g.operators):
        assert op.family in FAMILIES
        terms, out = op.terms
        assert len(terms) == len(op.operands) == len(op.param_names), op
        sizes: dict[str, int] = {}
        for term, spec in list(zip(terms, op.operands)) + [(out, op.output)]:
            assert len(term) == len(spec.shape), (op.name, op.equation)
            for lab, n in zip(term, spec.shape):
                assert sizes.setdefault(lab, n) == n, f"{op.name}: label {lab} has two sizes"
        assert set(op.splittable) <= set(sizes), op
        if op.family == "other":
            assert op.splittable == ""
        # activations first, then parameters
        kinds = [p is not None for p in op.param_names]
        assert kinds == sorted(kinds), op
        assert all(-1 <= k < len(op.operands) for k in op.saved_operands)
        assert all(op.param_names[k] is None for k in op.saved_operands if k >= 0)
        assert op.flops_fwd >= 0 and op.flops_bwd >= 0
    for e in g.edges:
        assert 0 <= e.src < e.dst < len(g.operators)
        dst = g.operators[e.dst]
        assert len(e.dim_map) == len(dst.operands[e.operand].shape)
        assert dst.param_names[e.operand] is None
        assert all(d is None or 0 <= d < len(g.operators[e.src].output.shape) for d in e.dim_map)
    for blk in g.blocks:
        assert len(blk) == len(g.blocks[0])


def saved_bytes(g: OpGraph) -> int:
    total = 0
    for op in g.operators:
        for k in op.saved_operands:
            total += (op.output if k == -1 else op.operands[k]).nbytes
        total += op.saved_extra_bytes
    return total


def real_saved_bytes(model: nn.Module, inputs) -> int:
    """Bytes of distinct non-parameter storages autograd saves in a real CPU forward
    (``inputs``: positional, or a dict of keyword inputs)."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    uniq = {}
    for t in saved:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            uniq[s.data_ptr()] = s.nbytes()
    return sum(uniq.values())


# ---- MLP ---------------------------------------------------------------------------------
def test_mlp_operators_equations_params():
    m = MLP()
    g = capture(m, (torch.randn(4, 16), torch.randn(4, 8)))
    check_graph(g)
    assert g.name == "MLP" and g.batch_size == 4
    assert [o.family for o in g.operators] == ["linear", "elementwise", "linear", "loss"]
    fc1, act, fc2, loss = g.operators
    assert fc1.name == "fc1" and fc2.name == "fc2" and act.name == "act"
    assert fc1.equation == "bk,nk,n->bn" and fc1.splittable == "bkn"
    assert fc2.equation == "bk,nk,n->bn"
    assert act.equation == "bh->bh" or act.equation.split("->")[0] == act.equation.split("->")[1]
    assert loss.equation.endswith("->") and "b" in loss.splittable
    assert [str(s) for s in fc1.operands] == ["float32[4,16]", "float32[32,16]", "float32[32]"]
    assert fc1.param_names == (None, "fc1.weight", "fc1.bias")
    assert str(fc2.output) == "float32[4,8]" and str(loss.output) == "float32[]"
    assert set(g.params()) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert g.param_count == sum(p.numel() for p in m.parameters())
    assert [(e.src, e.dst, e.operand, e.dim_map) for e in g.edges] == [
        (0, 1, 0, (0, 1)), (1, 2, 0, (0, 1)), (2, 3, 0, (0, 1))]
    assert fc1.module == "fc1" and fc1.module_type == "Linear" and fc1.aten == ("aten.linear.default",)
    assert g.unsupported == () and g.blocks == ()


def test_linear_flops():
    m, k, n, h = 4, 16, 8, 32
    g = capture(MLP(k, h, n), (torch.randn(m, k), torch.randn(m, n)))
    fc1, _, fc2, _ = g.operators
    assert fc1.flops_fwd == 2 * m * h * k and fc2.flops_fwd == 2 * m * n * h
    # fc2: input grad + weight grad = 2x forward
    assert fc2.flops_bwd == 4 * m * n * h
    # fc1's input is a model input that needs no grad: only the weight grad is computed
    assert fc1.flops_bwd == 2 * m * h * k
    g2 = capture(MLP(k, h, n), (torch.randn(m, k, requires_grad=True), torch.randn(m, n)))
    assert g2.operators[0].flops_bwd == 4 * m * h * k
    # non-matmul ops get a per-element estimate with backward ~ forward
    act = g.operators[1]
    assert act.flops_fwd == m * h and act.flops_bwd == act.flops_fwd


@pytest.mark.parametrize("norm", [False, True])
def test_saved_activations_match_real_autograd(norm):
    torch.manual_seed(0)
    m = MLP(norm=norm)
    x, y = torch.randn(4, 16), torch.randn(4, 8)
    g = capture(m, (x, y))
    check_graph(g)
    assert saved_bytes(g) == real_saved_bytes(m, (x, y))
    # the same on a meta copy of the model
    with torch.device("meta"):
        mm = MLP(norm=norm)
    assert saved_bytes(capture(mm, (x, y))) == saved_bytes(g)
    if norm:
        ln = next(o for o in g.operators if o.family == "norm")
        assert ln.saved_operands == (0,) and ln.saved_extra_bytes == 2 * 4 * 4  # mean, rstd
    else:  # relu keeps its output; fc2 needs the same tensor, counted once (at relu)
        assert g.operators[1].saved_operands == (-1,) and g.operators[2].saved_operands == ()


def test_gpt_saved_activations_close_to_real_autograd():
    # CPU sdpa takes the flash path too; the remaining difference is the size of the
    # attention statistics (logsumexp, rng state), a few bytes per attention
    torch.manual_seed(0)
    m = GPT()
    x = (torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16)))
    ours, real = saved_bytes(capture(m, x)), real_saved_bytes(m, x)
    assert abs(ours - real) <= 0.002 * real


# ---- GPT ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt_graph():
    with torch.device("meta"):
        m = GPT()
    return capture(m, _gpt_inputs(), name="gpt")


def test_gpt_block_structure(gpt_graph):
    g = gpt_graph
    check_graph(g)
    assert g.name == "gpt" and g.batch_size == 2 and g.unsupported == ()
    assert len(g.blocks) == 2
    fams = [[g.operators[i].family for i in blk] for blk in g.blocks]
    assert fams[0] == fams[1] == [
        "norm", "linear", "linear", "linear", "attention", "linear", "elementwise",
        "norm", "linear", "elementwise", "linear", "elementwise"]
    names = [g.operators[i].name for i in g.blocks[1]]
    assert names[:5] == ["layers.1.ln1", "layers.1.attn.q_proj", "layers.1.attn.k_proj",
                         "layers.1.attn.v_proj", "layers.1.attn:scaled_dot_product_attention"]
    b0, b1 = ([g.operators[i] for i in blk] for blk in g.blocks)
    for o0, o1 in zip(b0, b1):
        assert (o0.equation, o0.operands, o0.flops_fwd, o0.saved_operands) == \
               (o1.equation, o1.operands, o1.flops_fwd, o1.saved_operands)
    attn = b0[4]
    assert attn.equation == "bnsd,bntd,bnte->bnse" and attn.splittable == "bns"
    assert attn.flops_fwd == 4 * 2 * 4 * 16 * 16 * 8  # QK^T and PV
    # q, k, v, out kept; logsumexp (+ rng state) is extra
    assert attn.saved_operands == (0, 1, 2, -1) and attn.saved_extra_bytes >= 2 * 4 * 16 * 4
    assert b0[1].equation == "bsk,nk,n->bsn"
    # tied weight under one name; embedding and loss equations
    assert g.operators[0].param_names == (None, "wte.weight")
    assert g.operators[0].equation == "bs,vh->bsh"
    assert g.operators[-2].param_names == (None, "wte.weight")
    assert g.operators[-1].family == "loss" and g.operators[-1].equation == "bv,b->"
    assert g.operators[-1].splittable == "b"
    assert g.param_count == sum(p.numel() for p in GPT().parameters())


def test_gpt_attention_edges(gpt_graph):
    g = gpt_graph
    blk = g.blocks[0]
    q, k, v, attn, o = blk[1], blk[2], blk[3], blk[4], blk[5]
    into_attn = {e.operand: e for e in g.edges if e.dst == attn}
    # (b,s,h) -view-> (b,s,n,d) -transpose-> (b,n,s,d): n inherits h's split, d none
    for operand, src in ((0, q), (1, k), (2, v)):
        assert into_attn[operand].src == src and into_attn[operand].dim_map == (0, 2, 1, None)
    (e,) = [e for e in g.edges if e.dst == o and e.operand == 0]
    # (b,n,s,e) -transpose-> (b,s,n,e) -view-> (b,s,h): the merged dim inherits the heads split
    assert e.src == attn and e.dim_map == (0, 2, 1)
    # the ln1 output feeds q, k and v; it is saved once, by q_proj
    saved = [g.operators[i].saved_operands for i in (q, k, v)]
    assert saved == [(0,), (), ()]
    # loss input is the (b*s, v) merge of the head output: the merged dim carries 'b'
    (e,) = [e for e in g.edges if e.dst == len(g.operators) - 1]
    assert e.dim_map == (0, 2)


def test_batch_label_marks_batch_everywhere(gpt_graph):
    for op in gpt_graph.operators:
        terms, out = op.terms
        if op.name == "wpe":
            continue  # position embedding: no batch dim
        assert "b" in op.equation and "b" in op.splittable, op


# ---- CNN ---------------------------------------------------------------------------------
def test_cnn_equations():
    g = capture(CNN(), (torch.randn(2, 3, 8, 8), torch.zeros(2, dtype=torch.long)))
    check_graph(g)
    fams = [o.family for o in g.operators]
    assert fams == ["conv", "norm", "elementwise", "pool", "linear", "loss"]
    conv, bn, relu, pool, fc, loss = g.operators
    assert conv.equation == "bcxy,ocij,o->boxy" and set(conv.splittable) == set("bco")
    assert conv.flops_fwd == 2 * 2 * 8 * 8 * 8 * 3 * 3 * 3
    assert bn.equation == "bcxy,c,c,c,c->bcxy" and bn.param_names[-2:] == ("bn.weight", "bn.bias")
    assert set(pool.splittable) == set("bc") and pool.equation == "bcxy->bcpq"
    assert relu.saved_operands == (-1,) and pool.saved_operands == ()  # relu output counted once
    assert pool.saved_extra_bytes == 2 * 8 * 4 * 4 * 8  # int64 argmax indices
    (e,) = [e for e in g.edges if e.dst == 4]
    assert e.dim_map == (0, 1)  # flatten (b,c,x,y)->(b,cxy): c carries


# ---- fusion, unknown ops -----------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Odd(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = RMSNorm(8)
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.norm(x)
        h = torch.sort(h, dim=-1).values  # no rule: replicated "other"
        return self.fc(h).sum()


def test_fused_norm_and_unknown_op():
    g = capture(Odd(), (torch.randn(3, 5, 8),))
    check_graph(g)
    norm = g.operators[0]
    assert norm.name == "norm" and norm.family == "norm" and len(norm.aten) >= 4
    assert norm.equation == "bsh,h->bsh" and norm.splittable == "bs"
    assert norm.param_names == (None, "norm.weight")
    other = g.operators[1]
    assert other.family == "other" and other.splittable == ""
    assert "aten.sort.default" in g.unsupported
    assert [o.family for o in g.operators[2:]] == ["linear", "reduction"]


# ---- errors ------------------------------------------------------------------------------
class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x).sum()
        return self.fc(x).mean()


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_data_dependent_control_flow(device):
    m = DataDependent().to(device)
    with pytest.raises(CaptureError) as ei:
        capture(m, (torch.randn(2, 4, device=device),))
    msg = str(ei.value)
    assert isinstance(ei.value, ValueError)
    assert "data-dependent" in msg and "torch.cond" in msg and "static" in msg
    assert "Could not guard on data-dependent expression" in msg  # torch's first line


def test_wrong_input_shape():
    with pytest.raises(CaptureError) as ei:
        capture(MLP(), (torch.randn(4, 5), torch.randn(4, 8)))
    msg = str(ei.value)
    assert "same reduction dim, but got [4, 5] X [16, 32]" in msg  # torch's message
    assert "shapes" in msg


# ---- meta / scale / zoo ------------------------------------------------------------------
def _peak_rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def test_gpt3_175b_on_meta_allocates_nothing():
    m = get_model("gpt3-175b", device="meta")
    x = example_inputs("gpt3-175b", 8, device="meta")
    before = _peak_rss_kb()
    g = capture(m, x, name="gpt3-175b")
    assert _peak_rss_kb() - before < 2_000_000  # < 2 GB (the weights are 700 GB)
    assert all(p.is_meta for p in m.parameters()) and all(t.is_meta for t in x)
    check_graph(g)
    assert abs(g.param_count - 174.6e9) < 0.1e9
    assert len(g.blocks) == 96 and g.unsupported == ()
    per_block = len(g.blocks[0])
    assert len(g.operators) - 96 * per_block < 10


def test_capture_cost_linear_in_depth():
    import time
    ts = []
    for n_layers in (4, 16):
        m = get_model("gpt2", n_layers=n_layers)
        x = example_inputs("gpt2", 2)
        t0 = time.perf_counter()
        g = capture(m, x)
        ts.append(time.perf_counter() - t0)
        assert len(g.blocks) == n_layers
    assert ts[1] < 4 * ts[0] * 2  # generous: 4x the layers, well under quadratic


@pytest.mark.parametrize("name", ["mlp-tiny", "cnn-tiny", "gpt-tiny", "bert-tiny", "llama-tiny",
                                  "resnet50"])
def test_zoo_models(name):
    m = get_model(name)
    x = example_inputs(name, 2)
    g = capture(m, x, name=name)
    check_graph(g)
    assert g.unsupported == ()
    assert g.param_count == sum(p.numel() for p in m.parameters())
    assert g.operators[-1].family == "loss" and g.operators[-1].output.shape == ()
    fams = {o.family for o in g.operators}
    if name in ("gpt-tiny", "bert-tiny", "llama-tiny"):
        assert len(g.blocks) == 2 and {"attention", "embedding", "norm", "linear"} <= fams
        # every operator touching batched data splits on 'b' (the data-parallel plan)
        for op in g.operators:
            if "b" in op.equation:
                assert "b" in op.splittable, op
    if name in ("cnn-tiny", "resnet50"):
        assert {"conv", "norm"} <= fams


# ---- transformers definitions: what their eager training step saves ------------------------
def _hf_tiny(kind: str):
    """A tiny transformers model in train mode and its keyword inputs (the loss inside)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "llama":      # grouped key/value heads: 4 query heads share 2
        cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        model = transformers.LlamaForCausalLM(cfg)
    else:                    # one fused q/k/v projection split three ways, a tanh GELU of 8 ops
        cfg = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 128, (4, 32))
    return model.train(), {"input_ids": ids, "labels": ids}


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_transformers_saved_activations_match_real_autograd(kind):
    """Traced, transformers would build a causal mask and repeat grouped key/value heads, which
    its eager step does not; a saved piece of a split projection keeps its whole storage."""
    from tensoropt.capture.inputs import training_kwargs

    model, inputs = _hf_tiny(kind)
    g = capture(model, inputs)
    attention = [o for o in g.operators if o.family == "attention"]
    assert len(attention) == 2 and all(len(o.operands) == 3 for o in attention)    # no mask operand
    if kind == "llama":
        assert [o.operands[1].shape[1] for o in attention] == [2, 2]             # key heads unrepeated
    real = real_saved_bytes(model, training_kwargs(model, inputs))
    # Llama's rotary tables are computed from positions, not charged: 4 KiB here
    assert abs(saved_bytes(g) - real) <= 0.005 * real


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_transformers_step_peak_on_one_device_matches_the_plan(kind):
    """The whole step's measured peak (outputs held through the backward, as ``train_step``
    holds them) against the one-device plan's ``peak_memory_bytes``: the saved tensors above,
    the attention output the projection after it reads in place, and a fused group's backward
    that frees what it saved as it goes."""
    import tensoropt
    from tensoropt.apply import train_step
    from tensoropt.apply.measure import step_peak_memory
    from tensoropt.capture.inputs import training_kwargs

    model, inputs = _hf_tiny(kind)
    plan = tensoropt.frontier(model, "cpu:1", inputs=inputs, zero=False, recompute=False, pipeline=False,
                              progress=False).min_time()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    measured = step_peak_memory(lambda: train_step(model, **training_kwargs(model, inputs)), opt, model)
    assert plan.peak_memory_bytes == pytest.approx(measured["peak_bytes"], rel=0.03)


def test_a_dim_only_the_output_has_is_never_split():
    """GQA's ``repeat_interleave`` makes 4 query-side heads of 2 key/value heads: each rank
    would compute all 4 from its whole input, so splitting them would lay out a tensor 4
    times too large (it crashed the Megatron tp4 plan of a 2-KV-head model). A padded dim is
    the same; dims the operand has stay splittable."""
    g = capture(get_model("llama-tiny", device="meta"), example_inputs("llama-tiny", 8, device="meta"))
    reps = [op for op in g.operators if op.name.endswith("repeat_interleave")]
    assert reps
    for op in reps:
        (term,), out = op.terms
        only_out = [lab for lab in out if lab not in term]
        assert only_out and not set(only_out) & set(op.splittable)
        assert "b" in op.splittable

    class Pad(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(5, 6)

        def forward(self, x):
            return F.pad(self.lin(x), (0, 3)).sum()

    (pad,) = [op for op in capture(Pad(), (torch.zeros(4, 5, device="meta"),)).operators if op.name == "pad"]
    (term,), out = pad.terms
    assert out[0] == term[0] and out[0] in pad.splittable and out[1] not in term and out[1] not in pad.splittable


def test_dispatches_count_the_programs_torch_ops_and_keep_blocks_alike():
    """``Operator.dispatches``: the torch ops replaying the program dispatches, an operator's
    own and, shared evenly, the views between operators (transformers' GPT-2 reshapes its
    heads with views between its projections); Python's getitem and export's metadata
    assertions are not dispatched. Operators of like blocks stay alike."""
    from tensoropt.capture import capture_program
    from tensoropt.capture.program import dispatched

    model, inputs = _hf_tiny("gpt2")
    g, program = capture_program(model, inputs)
    calls = [n for n in program.graph.nodes if n.op == "call_function"]
    torch_ops = [n for n in calls if isinstance(n.target, torch._ops.OpOverload)]
    asserts = [n for n in torch_ops if n.target.__name__.startswith("_assert") and not n.users]
    assert asserts and len(calls) > len(torch_ops)            # both kinds occur here
    assert sum(map(dispatched, calls)) == len(torch_ops) - len(asserts)
    assert sum(o.dispatches for o in g.operators) == pytest.approx(len(torch_ops) - len(asserts))
    members = {m.split("[")[0] for o in g.operators for m in o.nodes}
    views = [n for n in torch_ops if n.name not in members and "view" in n.target.__name__]
    assert views and sum(o.dispatches for o in g.operators) >= len(g.operators) + len(views)
    assert len(g.blocks) == 2
    first, second = ([g.operators[i].dispatches for i in b] for b in g.blocks)
    assert first == second


def test_a_fused_group_records_its_kernels_and_is_priced_by_them():
    """Transformers' tanh GELU is one operator of eight aten ops, which eager PyTorch runs as
    eight kernels: capture records each (its kind, the bytes it reads and writes), and the
    cost model prices the group as those kernels, each on its own curve, not as one pass
    over the group's tensors. Single ops record none. Interpolated to another batch, the
    graph equals a fresh capture there."""
    import dataclasses

    from tensoropt.capture.recapture import capture_model
    from tensoropt.costmodel import CostModel
    from tensoropt.hardware import get_device
    from tensoropt.mesh import mesh_for, parse_devices
    from tensoropt.strategy import OpConfig

    model, _ = _hf_tiny("gpt2")
    ids = torch.randint(0, 128, (8, 32))
    graph, _, recapture = capture_model(model, {"input_ids": ids, "labels": ids})
    groups = [o for o in graph.operators if len(o.aten) > 1]
    assert groups and all(not o.members for o in graph.operators if len(o.aten) == 1)
    act = next(o for o in groups if o.module.endswith("mlp.act"))
    assert [k for k, _ in act.members] == [a.split(".")[1] for a in act.aten]
    out = act.output.nbytes
    assert all(out <= b <= 3 * out for _, b in act.members)       # each member reads and writes the tensor
    cm = CostModel(get_device("A100-80GB"))
    mesh = mesh_for((1,), parse_devices("1xA100-80GB"))
    cfg = OpConfig((None,))
    as_kernels = cm.node_cost(act, cfg, mesh).compute_s
    as_one_pass = cm.node_cost(dataclasses.replace(act, members=()), cfg, mesh).compute_s
    # each kernel pays at least its curve's per-call overhead and one pass over its bytes
    assert as_kernels > as_one_pass
    assert as_kernels >= 2 * len(act.members) * cm.compute.curve("elementwise").overhead_s
    half = recapture(4)
    assert recapture.at is not None and half.batch_size == 4
    interpolated = recapture.at(2)
    assert interpolated is not None and interpolated == recapture.capture_at(2)
