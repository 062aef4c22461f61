"""The peak-memory terms that follow how plans really run (no torch.distributed needed):
FSDP2 replicate's parameter copy and unreduced gradients, the batch every rank is handed,
the buffers of layout moves in backward (gloo's all-to-all is an all-gather), and a recomputed
unit's second forward."""

from __future__ import annotations

import numpy as np
import pytest

import tensoropt
from tensoropt.capture import capture
from tensoropt.costmodel import CostModel, NodeCost, _axis_forward_bytes, _axis_transient_bytes
from tensoropt.execution import runs_replicated
from tensoropt.hardware import get_device
from tensoropt.models import example_inputs, get_model
from tensoropt.placement import parse_placements as L
from tensoropt.engine import CostGraph
from tensoropt.opgraph import Edge, Operator, OpGraph, TensorSpec
from tensoropt.peakmodel import peak_model
from tensoropt.planner import MeshProblem, build_problem
from tensoropt.strategy import OpConfig


@pytest.fixture(scope="module")
def mlp():
    model = get_model("mlp-tiny", device="meta", widths=(64, 128, 64))
    inputs = tuple(example_inputs("mlp-tiny", 16, device="meta", widths=(64, 128, 64)))
    graph = capture(model, inputs, name="mlp-tiny")
    f = tensoropt.frontier(model, "cpu:2", inputs=inputs, progress=False, zero=False, recompute=False)
    return graph, f


def _assignment(graph, problem, plan):
    return np.array([[str(c) for c in problem.configs[i]].index(o.config) for i, o in enumerate(plan.ops)])


def test_data_parallel_plan_holds_a_parameter_copy_and_unreduced_gradients(mlp):
    graph, f = mlp
    dp = f.reference["data parallel"]
    cfgs = [OpConfig.parse(o.config) for o in dp.ops]
    assert runs_replicated(graph, cfgs, dp.mesh_shape)
    tp = next(p for p in f.plans if not runs_replicated(graph, [OpConfig.parse(o.config) for o in p.ops],
                                                           p.mesh_shape))
    b = dp.breakdown
    # the copy of every parameter sits on top of the state all through backward
    assert b["transient_bytes"] > b["param_bytes"]
    assert tp.breakdown["transient_bytes"] < b["param_bytes"]


def test_replicate_terms_only_for_plans_run_by_replicate(mlp):
    graph, f = mlp
    cm = CostModel(get_device("cpu"))
    from tensoropt.hardware import get_link
    from tensoropt.mesh import Mesh
    mesh = Mesh((2,), ("m0",), (get_link("gloo-loopback"),))
    problem = build_problem(graph, mesh, cm, recompute=False)
    pm = peak_model(problem, graph)
    dp = f.reference["data parallel"]
    a = _assignment(graph, problem, dp)
    params = sum(problem.node_costs[i][a[i]].param_bytes for i in range(len(a)))
    grads = [problem.node_costs[i][a[i]].grad_bytes for i in range(len(a))]
    assert pm.is_replicate(a[None])[0]
    # the replicate graph holds the copy of every parameter and, at the first operator's
    # backward, every later operator's reduced gradients beside what the other graph holds
    rep = pm.evaluate(a[None])[0, 2]
    other = pm.exact.evaluate(a[None])[0, 2]
    assert rep - other >= params - 1e-6
    assert rep - other <= params + sum(grads[1:]) + 1e-6
    for p in f.plans:
        cfgs = [OpConfig.parse(o.config) for o in p.ops]
        assert pm.is_replicate(_assignment(graph, problem, p)[None])[0] == runs_replicated(graph, cfgs, p.mesh_shape)


def test_every_rank_is_charged_the_whole_batch(mlp):
    graph, f = mlp
    assert graph.input_bytes == 2 * 16 * 64 * 4                   # inputs and targets, fp32
    for p in f.plans:
        # an operator that keeps an input unsplit keeps that very tensor: charged once
        assert 0 <= p.breakdown["input_bytes"] <= graph.input_bytes
        assert p.peak_memory_bytes == pytest.approx(
            p.memory_bytes + p.breakdown["transient_bytes"] + p.breakdown["input_bytes"])
    dp = f.reference["data parallel"]
    assert dp.breakdown["input_bytes"] == graph.input_bytes       # the batch is split: a copy is kept


def test_layout_move_buffers_follow_the_backend():
    n = 4096.0
    # all-to-all: gloo gathers the whole tensor and concatenates; a native one a local buffer
    assert _axis_transient_bytes(4, n, L("S(0)")[0], L("S(1)")[0], False, on_cpu=True) == pytest.approx(2 * n + n / 4)
    assert _axis_transient_bytes(4, n, L("S(0)")[0], L("S(1)")[0], False, on_cpu=False) == pytest.approx(2 * n / 4)
    # a slice's gradient is gathered whole; an aligned or unchanged layout moves nothing
    assert _axis_transient_bytes(4, n, L("R")[0], L("S(0)")[0], False, on_cpu=False) == pytest.approx(n + n / 4)
    assert _axis_transient_bytes(4, n, L("S(0)")[0], L("S(0)")[0], True, on_cpu=True) == 0.0
    assert _axis_transient_bytes(4, n, L("R")[0], L("R")[0], False, on_cpu=True) == 0.0


def test_forward_layout_moves_hold_what_dtensor_allocates():
    n = 4096.0
    # DTensor gathers along dimension 0: another dimension is concatenated from the chunks
    assert _axis_forward_bytes(4, n, L("S(0)")[0], L("R")[0], False, on_cpu=True) == pytest.approx(n)
    assert _axis_forward_bytes(4, n, L("S(2)")[0], L("R")[0], False, on_cpu=True) == pytest.approx(2 * n)
    assert _axis_forward_bytes(4, n, L("P")[0], L("R")[0], False, on_cpu=True) == pytest.approx(n)
    assert _axis_forward_bytes(4, n, L("P")[0], L("S(0)")[0], False, on_cpu=True) == pytest.approx(n / 4)
    assert _axis_forward_bytes(4, n, L("R")[0], L("S(1)")[0], False, on_cpu=True) == pytest.approx(n / 4)
    assert _axis_forward_bytes(4, n, L("S(1)")[0], L("S(1)")[0], True, on_cpu=True) == 0.0


def _unit_problem(move: float) -> tuple[MeshProblem, OpGraph]:
    """Three operators in one recompute unit (``layers.0``); the move into the last one holds
    ``move`` bytes in forward and nothing in backward."""
    from tensoropt.hardware import get_link
    from tensoropt.mesh import Mesh
    mesh = Mesh((2,), ("m0",), (get_link("gloo-loopback"),))
    cost = NodeCost(compute_s=1.0, comm_s=0.0, forward_s=0.5, param_bytes=0.0, grad_bytes=0.0,
                    optimizer_bytes=0.0, activation_bytes=100.0, transient_bytes=50.0, output_bytes=10.0)
    spec = TensorSpec((4, 4))
    ops = tuple(Operator(f"op{i}", "elementwise", "bh->bh", (spec,), (None,), spec, "bh", 16.0, 16.0,
                         module=f"layers.0.f{i}") for i in range(3))
    graph = OpGraph("unit", ops, (Edge(0, 1, 0, (0, 1)), Edge(1, 2, 0, (0, 1))))
    unit = np.zeros((2, 1, 2))
    unit[0, :, 1] = 100.0                       # kept: its activations
    unit[1, :, 0] = 0.5                         # recomputed: a second forward
    first = unit.copy()
    first[1, :, 1] = 5.0                        # and the unit's input, kept by the checkpoint
    nodes = [np.array([[1.0, 0.0]])] * 3 + [np.zeros((2, 2))]
    edges = [(3, 0, first), (3, 1, unit), (3, 2, unit), (0, 1, np.zeros((1, 1, 2))), (1, 2, np.zeros((1, 1, 2)))]
    cg = CostGraph.build(nodes, edges)
    cfg = (OpConfig.parse("b"),)
    problem = MeshProblem(mesh, 0, (cfg,) * 3, ((cost,),) * 3, (("layers.0", (0, 1, 2)),), ((5.0,),),
                          cost_graph=cg, edge_transients=((1, 2, np.zeros((1, 1)), np.full((1, 1), move)),))
    return problem, graph


def _rise(move: float) -> np.ndarray:
    problem, graph = _unit_problem(move)
    got = peak_model(problem, graph).evaluate(np.array([[0, 0, 0, 0], [0, 0, 0, 1]]))
    return got[:, 2] - got[:, 1]


def test_a_recomputed_units_second_forward_is_a_peak_of_its_own():
    kept, recomputed = _rise(move=1000.0)
    # kept: the last backward sees the three activations and its own transient
    assert kept == pytest.approx(300 + 50 - 300)
    # recomputed: when the last operator's backward is due the unit runs forward again beside
    # its input (5) and its output's gradient (10); at the last operator, the two activations
    # rematerialised before it and its own (300), its output (10) and the move into it (1000)
    assert recomputed == pytest.approx(5 + 10 + 300 + 10 + 1000 - 5)
    # without the move, the backward of the last operator is the peak again
    _, quiet = _rise(move=0.0)
    assert quiet == pytest.approx(5 + 300 + 50 - 5)


def test_outputs_the_forward_returns_are_held_to_the_end_of_the_step():
    """A Hugging Face LM returns its logits beside the loss; the caller holds them through
    backward (measured: the 4 x 8 x 96 logits of the suite's Falcon stayed live at the peak)."""
    from dataclasses import replace

    from tensoropt.hardware import get_link
    from tensoropt.mesh import Mesh
    from tests.third_party.families import BATCH, FAMILIES

    fam = FAMILIES["gpt2"]
    graph = capture(fam.build("meta"), fam.inputs(BATCH, "meta"))
    assert [graph.operators[i].name for i in graph.returned] == ["lm_head"]
    mesh = Mesh((2,), ("m0",), (get_link("gloo-loopback"),))
    cm = CostModel(get_device("cpu"))
    (i,) = graph.returned
    held = build_problem(graph, mesh, cm, recompute=False)
    bare = build_problem(replace(graph, returned=()), mesh, cm, recompute=False)
    extra = held.cost_graph.node_costs[i][:, 1] - bare.cost_graph.node_costs[i][:, 1]
    out = np.array([c.output_bytes for c in held.node_costs[i]])
    assert np.all(out > 0) and extra == pytest.approx(out)
    # a pipeline stage's schedule keeps only the loss
    stage = build_problem(graph, mesh, cm, recompute=False, accumulates=True)
    stage_bare = build_problem(replace(graph, returned=()), mesh, cm, recompute=False, accumulates=True)
    assert np.array_equal(stage.cost_graph.node_costs[i], stage_bare.cost_graph.node_costs[i])


def test_a_consumer_that_moves_a_tensor_another_is_charged_for_keeps_its_own_copy():
    """k_proj and v_proj save the normalised input q_proj is charged for: on a mesh, one
    that takes it in another layout keeps the moved copy -- once for both when they take it
    alike (the apply layer moves it once) -- and none where it takes the producer's."""
    from tensoropt.hardware import get_link
    from tensoropt.mesh import Mesh

    graph = capture(get_model("gpt-tiny"), tuple(example_inputs("gpt-tiny")), name="gpt-tiny")
    names = [op.name for op in graph.operators]
    q, k, v = (names.index(f"layers.0.attn.{p}_proj") for p in "qkv")
    assert 0 in graph.operators[q].saved_operands
    assert graph.operators[k].resaved == ((0, k - q, 0),) and graph.operators[v].resaved == ((0, v - k, 0),)
    mesh = Mesh((2,), ("m0",), (get_link("gloo-loopback"),))
    problem = build_problem(graph, mesh, CostModel(get_device("cpu")), recompute=False)
    tables = {scope[1:]: (scope, t) for scope, t in problem.resaved}
    (src, _, _), at_k = tables[q, k]
    (_, _, _), at_v = tables[k, v]
    cfg = lambda i, label: [str(c) for c in problem.configs[i]].index(label)   # noqa: E731
    p_b = cfg(src, "b")
    spec = graph.operators[k].operands[0]
    whole = spec.nbytes
    # the producer splits the batch; q takes it so (no move), k and v want it whole
    assert at_k[p_b, cfg(q, "b"), cfg(k, "n")] == whole
    assert at_v[p_b, cfg(k, "n"), cfg(v, "n")] == 0.0          # k's move serves v
    assert at_v[p_b, cfg(k, "b"), cfg(v, "n")] == whole
    assert at_k[p_b, cfg(q, "b"), cfg(k, "b")] == 0.0          # the producer's tensor itself
    # and the peak model holds it at the end of forward, once, beyond what the cost graph adds up
    pm = peak_model(problem, graph)
    a = np.array([cfg(i, "b") for i in range(len(graph.operators))])
    b = a.copy()
    b[k] = b[v] = cfg(k, "n")
    held = pm.evaluate(np.stack([a, b]))[:, 1]
    summed = [problem.cost_graph.cost(x)[1] for x in (a, b)]
    assert (held[1] - held[0]) - (summed[1] - summed[0]) == whole


def test_like_blocks_and_zero_stages_share_their_tables():
    # the repeated blocks of a problem and its ZeRO stages hold one copy of each like table
    # (what keeps a 64-device search of a 32-layer model within memory)
    from tensoropt.engine.peakgraph import SumTerm
    from tensoropt.mesh import parse_devices
    from tensoropt.space import distinct_meshes

    graph = capture(get_model("llama-tiny"), tuple(example_inputs("llama-tiny")), name="llama-tiny")
    cluster = parse_devices("8xA100-80GB")
    mesh = next(m for m in distinct_meshes(cluster, 2) if m.ndim == 2)
    cm = CostModel(cluster.device)
    p0, p3 = build_problem(graph, mesh, cm, zero_stage=0), build_problem(graph, mesh, cm, zero_stage=3)
    n_ops = len(graph.operators)
    e0 = {k: t for k, t in p0.cost_graph.edge_costs.items() if max(k) < n_ops}     # not recompute units'
    e3 = {k: t for k, t in p3.cost_graph.edge_costs.items() if max(k) < n_ops}
    assert e0.keys() == e3.keys() and all(e0[k] is e3[k] for k in e0)
    assert len({id(t) for t in e0.values()}) < len(e0) / 2
    assert len(graph.blocks) >= 2 and p0.resaved
    first, second = set(graph.blocks[0]), set(graph.blocks[1])
    in_first = [t for s, t in p0.resaved if s[-1] in first]
    in_second = [t for s, t in p0.resaved if s[-1] in second]
    assert in_first and len(in_first) == len(in_second)
    assert all(a is b for a, b in zip(in_first, in_second))
    terms = [p for t in peak_model(p0, graph).exact.additive for p in (t.parts if isinstance(t, SumTerm) else (t,))]
    of_first = {id(t.table) for t in terms if len(t.scope) > 1 and set(t.scope) <= first}
    of_second = [t.table for t in terms if len(t.scope) > 1 and set(t.scope) <= second]
    assert of_second and all(id(t) in of_first for t in of_second)


def test_a_loss_keeps_fp32_log_probabilities_under_mixed_precision():
    """transformers' causal-LM loss upcasts the logits: a bf16 model saves fp32
    log-probabilities for backward. Under bf16-mixed the cost model prices the loss so (and
    its backward's gradients of the logits), the rest of the model in bf16."""
    import torch
    import transformers
    from tensoropt.mesh import Mesh
    from tensoropt.training import TrainingConfig

    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    ids = torch.randint(0, 512, (3, 16))
    saved = []

    def pack(t):
        saved.append(t)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    # [tokens, vocab] tensors saved for backward: the fp32 log-probabilities (the bf16 logits
    # themselves are saved by nothing: the linear saves its input)
    wide = [t for t in saved if t.dim() and t.shape[-1] == 512 and t.numel() >= 3 * 15 * 512]
    assert {t.dtype for t in wide} == {torch.float32}
    measured = sum(t.untyped_storage().nbytes() for t in {t.data_ptr(): t for t in wide}.values())

    graph = capture(transformers.LlamaForCausalLM(cfg), (), kwargs=dict(input_ids=ids, labels=ids))
    loss = next(i for i, op in enumerate(graph.operators) if op.family == "loss")
    mesh = Mesh((1,), ("m0",), (get_link_loopback(),))
    bf16 = CostModel(get_device("A100-80GB"), training=TrainingConfig("bf16-mixed"))
    problem = build_problem(graph, mesh, bf16, recompute=False)
    cost = problem.node_costs[loss][0]             # one device: every configuration holds it whole
    assert cost.activation_bytes == pytest.approx(measured, rel=0.1)
    lm_head = next(i for i, op in enumerate(graph.operators) if op.name == "lm_head")
    assert problem.node_costs[lm_head][0].output_bytes == pytest.approx(measured / 2, rel=0.1)   # bf16 logits


def get_link_loopback():
    from tensoropt.hardware import get_link
    return get_link("gloo-loopback")


def _elementwise(aten: tuple[str, ...], extra: int) -> Operator:
    x = TensorSpec((8, 16, 64))
    return Operator("act", "elementwise", "bsf->bsf", (x,), (None,), x, "bsf", 0.0, 0.0,
                    saved_operands=(0,), saved_extra_bytes=extra, backward_extra_bytes=extra, aten=aten)


def test_an_elementwise_group_with_an_op_autocast_runs_in_fp32_keeps_its_intermediates_in_fp32():
    # transformers' GPT-2 GELU: 0.5 * x * (1 + tanh(c * (x + 0.044715 * pow(x, 3)))); autocast
    # runs pow in fp32 and the rest of the chain promotes to it (on one H200, bf16-mixed: the
    # model's activations 1.45 GiB above the price that counted them at 2 bytes)
    gelu = ("aten.mul.Tensor", "aten.pow.Tensor_Scalar", "aten.mul.Tensor", "aten.add.Tensor",
            "aten.mul.Tensor", "aten.tanh.default", "aten.add.Tensor", "aten.mul.Tensor")
    from tensoropt.mesh import Mesh
    from tensoropt.training import TrainingConfig

    plain = ("aten.gelu.default",)
    extra = 3 * 8 * 16 * 64 * 4                      # three fp32 intermediates as captured
    mesh = Mesh((1,), ("m0",), (get_link_loopback(),))
    cfg = OpConfig((None,))
    bf16 = CostModel(get_device("A100-80GB"), training=TrainingConfig("bf16-mixed"))
    fp32 = CostModel(get_device("A100-80GB"))
    x_bf16 = 8 * 16 * 64 * 2
    assert bf16.node_cost(_elementwise(gelu, extra), cfg, mesh).activation_bytes == x_bf16 + extra
    assert bf16.node_cost(_elementwise(plain, extra), cfg, mesh).activation_bytes == x_bf16 + extra / 2
    for aten in (gelu, plain):                       # without autocast nothing changes
        assert fp32.node_cost(_elementwise(aten, extra), cfg, mesh).activation_bytes == 2 * x_bf16 + extra


def test_transformers_gelu_new_is_captured_as_a_group_autocast_runs_partly_in_fp32():
    import torch
    from transformers.activations import NewGELUActivation
    from tensoropt.training import runs_in_fp32

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act, self.proj = torch.nn.Linear(8, 32), NewGELUActivation(), torch.nn.Linear(32, 8)

        def forward(self, x):
            return self.proj(self.act(self.fc(x))).sum()

    graph = capture(MLP(), (torch.randn(4, 8),))
    act = next(op for op in graph.operators if op.module.endswith("act"))
    assert runs_in_fp32(act.aten) and act.saved_extra_bytes > 0
    assert not any(runs_in_fp32(op.aten) for op in graph.operators if op.family == "linear")
