"""What a measured profile prices beside the operators' curves: the framework's time per
operator, the optimizer's update per parameter, and curves keyed by operator kind.

No test asserts wall-clock timings: the fits are checked on synthetic measurements, the
pricing against the profile's figures it was given.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from tensoropt.calibration import step_features
from tensoropt.compute import ComputeModel, EfficiencyCurve, curve_key, operator_kind
from tensoropt.cost_terms import TERMS, CostTerms
from tensoropt.costmodel import CostModel
from tensoropt.hardware import get_device
from tensoropt.mesh import mesh_for, parse_devices
from tensoropt.profile import run as run_mod
from tensoropt.profile.data import ComputeMeasurement, Profile
from tensoropt.profile.measure import stats_from_samples
from tensoropt.strategy import OpConfig

OVERHEAD_S = 4e-5
UPDATE_S = 6e-9


def test_operator_kind_and_keys():
    assert operator_kind(("aten.gelu.default",)) == "gelu"
    assert operator_kind(("aten.scaled_dot_product_attention.default",)) == "scaled_dot_product_attention"
    assert operator_kind(("aten.mul.Tensor", "aten.add.Tensor")) is None      # a fused group
    assert curve_key("elementwise", "gelu") == "elementwise/gelu"
    assert curve_key("elementwise", None) == "elementwise"


def test_keyed_curve_else_family_curve():
    fam, gelu = EfficiencyCurve(0.1, 1e4), EfficiencyCurve(0.02, 1e4)
    cm = ComputeModel(curves={"elementwise": fam, "elementwise/gelu": gelu})
    assert cm.curve("elementwise", "gelu") is gelu
    assert cm.curve("elementwise", "add") is fam and cm.curve("elementwise") is fam
    dev = get_device("cpu")
    assert cm.time_s("elementwise", 1e8, 1.0, dev, kind="gelu") == pytest.approx(
        5 * cm.time_s("elementwise", 1e8, 1.0, dev, kind="add"))
    again = ComputeModel.from_dict(json.loads(json.dumps(
        dataclasses.replace(cm, op_overhead_s=OVERHEAD_S, update_s_per_param=UPDATE_S).to_dict())))
    assert again.curve("elementwise", "gelu") == gelu
    assert (again.op_overhead_s, again.update_s_per_param) == (OVERHEAD_S, UPDATE_S)
    with pytest.raises(ValueError, match="op_overhead_s"):
        ComputeModel(op_overhead_s=-1.0)


def _measurement(family, shape, calls, seconds):
    return ComputeMeasurement(family, "x", shape, "fp32", 0.0, 0.0, calls, stats_from_samples([seconds]))


def test_slopes_recover_overhead_and_update_rate():
    notes = []
    chains = [_measurement("framework", (n,), 3 * n, 2e-4 + 3 * n * OVERHEAD_S) for n in (4, 32)]
    assert run_mod._slope(chains, "calls", notes) == pytest.approx(OVERHEAD_S)
    steps = [_measurement("optimizer", (n, 8), 1, 1e-4 + n * UPDATE_S) for n in (2 ** 16, 2 ** 19, 2 ** 22)]
    assert run_mod._slope(steps, "numel", notes) == pytest.approx(UPDATE_S)
    assert notes == []
    assert run_mod._slope(steps[:1], "numel", notes) == 0.0 and "one size" in notes[0]
    falling = [_measurement("optimizer", (n, 8), 1, 1e-2 - n * 1e-9) for n in (2 ** 16, 2 ** 22)]
    assert run_mod._slope(falling, "numel", []) == 0.0          # never a negative price


def _gpt_tiny():
    from tensoropt.capture import capture
    from tensoropt.models import example_inputs, get_model

    return capture(get_model("gpt-tiny", device="meta"), example_inputs("gpt-tiny", 4, device="meta"), name="gpt-tiny")


def test_node_prices_overhead_in_both_passes_and_update_per_element():
    graph = _gpt_tiny()
    cluster = parse_devices("cpu:2")
    mesh = mesh_for((2,), cluster)
    plain = CostModel(cluster.device, ComputeModel())
    measured = CostModel(cluster.device, ComputeModel(op_overhead_s=OVERHEAD_S, update_s_per_param=UPDATE_S))
    linear = next(op for op in graph.operators if op.family == "linear" and any(op.param_names))
    for cfg in (OpConfig((None,)), OpConfig((linear.equation.split("->")[1][0],))):
        a, b = plain.node_cost(linear, cfg, mesh), measured.node_cost(linear, cfg, mesh)
        assert b.compute_s - a.compute_s == pytest.approx(OVERHEAD_S)
        assert b.forward_s - a.forward_s == pytest.approx(OVERHEAD_S / 2)    # what recomputation repeats
        assert a.update_s == 0.0
        params = sum(spec.numel for spec, p in zip(linear.operands, linear.param_names) if p)
        assert b.update_s == pytest.approx(UPDATE_S * params)               # replicated: every element
    sharded = measured.node_cost(linear, OpConfig((None,)), mesh, zero_stage=1)
    assert sharded.update_s == pytest.approx(b.update_s)                     # batch split only: nothing to shard
    # the terms scale each apart, and add to the update per parameter
    terms = CostTerms(framework_scale=3.0, update_scale=0.5, optimizer_s_per_param=1e-9)
    c = CostModel(cluster.device, measured.compute, training=measured.training, terms=terms).node_cost(
        linear, OpConfig((None,)), mesh)
    base = plain.node_cost(linear, OpConfig((None,)), mesh)
    assert c.compute_s - base.compute_s == pytest.approx(3 * OVERHEAD_S)
    assert c.update_s == pytest.approx((0.5 * UPDATE_S + 1e-9) * params)


def test_step_features_hold_the_new_terms(tmp_path):
    """A plan's framework_s is its operator count times the measured overhead, its update_s
    the elements its device updates times the measured rate; the terms predict its time."""
    import tensoropt

    base = Profile.load("data/profiles/cpu-2core.json", check_environment=False)
    prof = dataclasses.replace(base, op_overhead_s=OVERHEAD_S, update_s_per_param=UPDATE_S)
    path = str(prof.save(tmp_path / "p.json"))
    path0 = str(dataclasses.replace(base, op_overhead_s=0.0, update_s_per_param=0.0).save(tmp_path / "p0.json"))
    from tensoropt.models import example_inputs, get_model

    model = get_model("gpt-tiny", device="meta")
    inputs = example_inputs("gpt-tiny", 4, device="meta")
    f = tensoropt.frontier(model, "cpu:2", inputs=inputs, profile=path, zero=False, recompute=False,
                           pipeline=False, progress=False, references=False)
    graph = _gpt_tiny()
    plan = f.min_time()
    feats = step_features(plan, graph, path)
    assert set(TERMS.values()) - {"one"} <= set(feats)
    assert feats["framework_s"] == pytest.approx(len(graph.operators) * OVERHEAD_S)
    assert feats["update_s"] == pytest.approx(feats["local_params"] * UPDATE_S)
    assert CostTerms().predict(feats) == pytest.approx(plan.time_s, rel=1e-9)
    # the same plan priced without them is faster by exactly these two
    without = step_features(plan, graph, path0)
    assert without["framework_s"] == without["update_s"] == 0.0
    assert CostTerms().predict(feats) - CostTerms().predict(without) == pytest.approx(
        feats["framework_s"] + feats["update_s"], rel=1e-9)


def test_older_profiles_load_without_them():
    d = json.loads(open("data/profiles/cpu-2core.json", encoding="utf-8").read())
    d.pop("op_overhead_s", None)
    d.pop("update_s_per_param", None)
    prof = Profile.from_dict(d)
    assert (prof.op_overhead_s, prof.update_s_per_param) == (0.0, 0.0)
    assert prof.compute_model().op_overhead_s == 0.0


def test_per_parameter_tensor_terms():
    """Every parameter tensor on more than one device pays ``per_param_tensor_s``; those the
    DTensor runner holds ``per_dtensor_param_s`` too; a later user of a tied parameter nothing."""
    graph = _gpt_tiny()
    cluster = parse_devices("cpu:2")
    terms = CostTerms(per_param_tensor_s=1e-3, per_dtensor_param_s=2e-3)
    cm = CostModel(cluster.device, ComputeModel(), terms=terms)
    linear = next(op for op in graph.operators if op.family == "linear" and any(op.param_names))
    n = sum(p is not None for p in linear.param_names)
    two, one = mesh_for((2,), cluster), mesh_for((1,), parse_devices("cpu:1"))
    cfg = OpConfig((None,))
    assert cm.node_cost(linear, cfg, two).update_s == pytest.approx(3e-3 * n)
    assert cm.node_cost(linear, cfg, two, fsdp=True).update_s == pytest.approx(1e-3 * n)
    assert cm.node_cost(linear, cfg, two, owns_params=False).update_s == 0.0
    assert cm.node_cost(linear, cfg, one).update_s == 0.0


def test_fsdp_plan_prices_its_own_parameter_terms():
    """The plan FSDP2 runs holds no DTensor-runner parameters: its features say so, and its
    price is the terms' prediction (``MeshProblem.replicate_time_s`` carries the update)."""
    import tensoropt
    from tensoropt.execution import apply_mode
    from tensoropt.models import example_inputs, get_model

    graph = _gpt_tiny()
    f = tensoropt.frontier(get_model("gpt-tiny", device="meta"), "cpu:2",
                           inputs=example_inputs("gpt-tiny", 4, device="meta"), zero=False, recompute=False,
                           pipeline=False, progress=False)
    fsdp = [p for p in [*f.plans, *f.reference.values()] if p.world_size == 2 and apply_mode(graph, p) == "replicate"]
    runner = [p for p in f.plans if apply_mode(graph, p) == "dtensor"]
    assert fsdp and runner
    owned = len({p for op in graph.operators for p in op.param_names if p is not None})   # tied: once
    for plan, runner_params in ((fsdp[0], 0.0), (runner[0], owned)):
        feats = step_features(plan, graph)
        assert feats["param_tensors"] == owned and feats["dtensor_params"] == runner_params, plan.summary
        terms = CostTerms(per_param_tensor_s=1e-3, per_dtensor_param_s=2e-3)
        assert terms.predict(feats) == pytest.approx(CostTerms().predict(feats) + 1e-3 * owned + 2e-3 * runner_params)



def test_ranks_beyond_the_cores_share_them():
    """On a CPU host with fewer cores than ranks, each rank's own work takes ranks/cores as
    long; collectives (measured with their ranks on the host) and memory do not change."""
    from tensoropt.pricing import cost_models, host_share
    from tensoropt.training import TrainingConfig

    prof = Profile.load("data/profiles/cpu-2core.json", check_environment=False)
    cores, threads = prof.machine.cpu_count, prof.machine.threads_per_rank
    four = parse_devices("cpu:4")
    meshes = {n: mesh_for((n,), four) for n in (2, 4)}
    assert host_share(prof, meshes[4]) == max(1.0, 4 * threads / cores)
    assert host_share(prof, meshes[2]) == max(1.0, 2 * threads / cores)
    gpu = dataclasses.replace(prof, machine=dataclasses.replace(prof.machine, device_kind="cuda"))
    assert host_share(gpu, meshes[4]) == 1.0
    graph = _gpt_tiny()
    linear = next(op for op in graph.operators if op.family == "linear" and any(op.param_names))
    terms = CostTerms(per_dtensor_op_s=1e-3, per_param_tensor_s=1e-3)
    cm = cost_models(four, TrainingConfig(), "data/profiles/cpu-2core.json", terms)(meshes[4])
    assert cm.host_share == host_share(prof, meshes[4]) > 1
    alone = dataclasses.replace(cm, host_share=1.0)
    cfg = OpConfig((None,))
    a, b = alone.node_cost(linear, cfg, meshes[4]), cm.node_cost(linear, cfg, meshes[4])
    k = cm.host_share
    assert (b.compute_s, b.forward_s, b.update_s) == pytest.approx((k * a.compute_s, k * a.forward_s, k * a.update_s))
    assert b.comm_s == a.comm_s and b.memory_bytes == a.memory_bytes
    fixed = dataclasses.replace(cm, terms=CostTerms(fixed_s=0.25))
    assert fixed.fixed_s == pytest.approx(0.25 * k) and dataclasses.replace(fixed, host_share=1.0).fixed_s == 0.25
    with pytest.raises(ValueError, match="host_share"):
        dataclasses.replace(cm, host_share=0.5)


def test_the_fixed_cost_per_step_shares_the_cores_in_a_search(tmp_path):
    """Searched with only a fixed cost per step, every plan costs its uncalibrated time plus
    that cost times its ranks per core (the 2-core profile's host: a 4-rank mesh twice it; a
    pipeline of two 2-rank stages once, a stage counting its own ranks); its features say
    so, and the terms price each plan as the search did."""
    import tensoropt
    from tensoropt.capture import capture
    from tensoropt.models import example_inputs, get_model
    from tensoropt.pricing import host_share

    profile = "data/profiles/cpu-2core.json"
    prof = Profile.load(profile, check_environment=False)
    path = tmp_path / "terms.json"
    CostTerms(fixed_s=0.5).save(path)
    kw = dict(progress=False, max_mesh_dims=1, profile=profile)
    four = parse_devices("cpu:4")

    def key(p):
        return (tuple(p.mesh_shape), tuple(o.config for o in p.ops), p.zero_stage, tuple(p.recompute),
                p.microbatches, tuple(tuple(o.config for o in s.ops) for s in p.stages))

    shares = set()
    for model in ("mlp-tiny", "gpt-tiny"):
        plain = {key(p): p for p in tensoropt.frontier(model, "cpu:4", **kw).plans}
        fixed = tensoropt.frontier(model, "cpu:4", calibration=str(path), **kw).plans
        graph = capture(get_model(model), tuple(example_inputs(model)), name=model)
        for p in fixed:
            share = host_share(prof, mesh_for(tuple(p.mesh_shape[1:] if p.stages else p.mesh_shape), four))
            if key(p) in plain:
                shares.add((bool(p.stages), share))
                assert p.time_s == pytest.approx(plain[key(p)].time_s + 0.5 * share), p.summary
            if not p.stages:
                feats = step_features(p, graph, profile)
                assert feats["one"] == pytest.approx(share)
                assert CostTerms(fixed_s=0.5).predict(feats) == pytest.approx(p.time_s, rel=1e-9)
    # plans found by both searches: 4-rank meshes, and pipelines whose stages have a core a rank
    assert shares == {(False, 4 * prof.machine.threads_per_rank / prof.machine.cpu_count), (True, 1.0)}, shares
