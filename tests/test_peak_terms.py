"""The peak-memory terms that follow how plans really run (no torch.distributed needed):
FSDP2 replicate's parameter copy and unreduced gradients, the batch every rank is handed,
and the buffers of layout moves in backward (gloo's all-to-all is an all-gather)."""

from __future__ import annotations

import numpy as np
import pytest

import tensoropt
from tensoropt.capture import capture
from tensoropt.costmodel import CostModel, _relayout_transient_bytes
from tensoropt.execution import runs_replicated
from tensoropt.hardware import get_device
from tensoropt.models import example_inputs, get_model
from tensoropt.planner import build_problem, replicate_held_bytes, step_input_bytes
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
    dp = f.reference["data parallel"]
    a = _assignment(graph, problem, dp)
    held = replicate_held_bytes(problem, graph, a)
    params = sum(problem.node_costs[i][a[i]].param_bytes for i in range(len(a)))
    grads = [problem.node_costs[i][a[i]].grad_bytes for i in range(len(a))]
    assert held is not None
    assert held[-1] == pytest.approx(params)                     # nothing done yet: the copy alone
    assert held[0] == pytest.approx(params + sum(grads[1:]))     # the first op's backward: all others'
    assert np.all(np.diff(held) <= 0)
    for p in f.plans:
        cfgs = [OpConfig.parse(o.config) for o in p.ops]
        got = replicate_held_bytes(problem, graph, _assignment(graph, problem, p))
        assert (got is None) == (not runs_replicated(graph, cfgs, p.mesh_shape))


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
    from tensoropt.hardware import get_link
    from tensoropt.mesh import Mesh
    gloo = Mesh((4,), ("m0",), (get_link("gloo-loopback"),))
    nccl = Mesh((4,), ("m0",), (get_link("nvlink4"),))
    n = 4096.0
    # all-to-all: gloo gathers the whole tensor and concatenates; a native one a local buffer
    assert _relayout_transient_bytes(n, ("S(0)",), ("S(1)",), (False,), gloo) == pytest.approx(2 * n + n / 4)
    assert _relayout_transient_bytes(n, ("S(0)",), ("S(1)",), (False,), nccl) == pytest.approx(2 * n / 4)
    # a slice's gradient is gathered whole; an aligned or unchanged layout moves nothing
    assert _relayout_transient_bytes(n, ("R",), ("S(0)",), (False,), nccl) == pytest.approx(n + n / 4)
    assert _relayout_transient_bytes(n, ("S(0)",), ("S(0)",), (True,), gloo) == 0.0
    assert _relayout_transient_bytes(n, ("R",), ("R",), (False,), gloo) == 0.0
