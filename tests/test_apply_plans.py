"""``tensoropt.parallelize(model, plan)`` for frontier plans: validation (single process),
predicted collectives (``tensoropt.comms``), and real torchrun launches (CPU/gloo, one 2-rank
and one 4-rank launch, cases batched) comparing against single-process training:

* first-step loss and every parameter's gradient within 1e-5 relative (fp32; a gradient is
  compared relative to its own max, floored at 1e-4 of the largest gradient of the model);
* loss after 3 Adam steps within 1e-4;
* one step's collectives (CommDebugMode-based counter) by kind, bytes within 5 % of the
  collectives the plan issues as laid out (``tensoropt.comms.issued_collectives``: the cost
  model's rules as the apply layer runs them, all-to-all as gloo issues it);
* per-rank peak memory (MemTracker) within 10 % of the plan's predicted memory for the
  ``mlp-big`` cases (mlp widths 512-1024-1024-512, batch 256: parameters, gradients, Adam state
  and activations are 36 MB of 36.5 MB), where fixed overheads do not dominate.

Models (tests/dist_scripts/plan_worker.py): mlp (mlp-tiny widened to 16-64-32-64-16),
gpt (gpt-tiny), cnn (cnn-tiny). Plans: reference data parallel (also with ZeRO-2/3, and with
every block recomputed, which must run the blocks' forward twice), tensor parallel (first
all-tp frontier plan), the 2x2 Megatron hybrid, min-time and min-memory points of the frontier.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import tensoropt
from dist_cases import launch_cases
from tensoropt.apply import PlanNotApplicable, load_plan, param_signature, parallelize, plan_layout
from tensoropt.capture import capture
from tensoropt.comms import predicted_collectives, summarize
from tensoropt.models import example_inputs, get_model
from tensoropt.placement import format_placements

SCRIPTS = Path(__file__).parent / "dist_scripts"
WORKER = SCRIPTS / "plan_worker.py"
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

CASES_2 = ["mlp:dp", "mlp:dp_zero2", "mlp:dp_zero3", "mlp:tp_plain", "mlp:min_time", "mlp:min_memory_plain",
           "mlp:min_memory", "gpt:dp", "gpt:dp_rc", "gpt:tp_plain", "gpt:min_time", "gpt:min_memory_plain",
           "cnn:dp", "cnn:min_time", "cnn:min_memory_plain",
           "mlp-big:dp", "mlp-big:tp_plain", "mlp-big:min_memory_plain"]
CASES_4 = ["mlp:dp", "mlp:tp_plain", "mlp:hybrid", "mlp:min_time", "mlp:min_memory_plain",
           "gpt:dp", "gpt:tp_plain", "gpt:hybrid", "gpt:min_time", "gpt:min_memory_plain",
           "cnn:hybrid", "cnn:min_time", "cnn:min_memory_plain", "llama:megatron_plain"]
# one device: its plans are laid out too (FSDP2 on a one-rank mesh), recomputation included
CASES_1 = ["gpt:min_time", "gpt:dp_rc"]
MEMORY_CASES = ["mlp-big:dp", "mlp-big:tp_plain", "mlp-big:min_memory_plain"]

# Where measured bytes differ from the prediction, and why (see the final report in the commit
# message / tensoropt.apply.layout docstring).
KNOWN_COMM_MISMATCH = {
    ("mlp:min_memory_plain", 4): "one tensor dim sharded over both mesh axes: DTensor's fixed "
                                 "nesting order (axis 0 outer) costs more than the cost model's "
                                 "per-axis rule",
    ("gpt:tp_plain", 4): "as mlp:min_memory_plain (tp2*tp2 layouts)",
    ("gpt:min_memory_plain", 4): "as mlp:min_memory_plain (tp2*tp2 layouts)",
    ("cnn:min_memory_plain", 4): "as mlp:min_memory_plain (tp2*tp2 layouts)",
    ("mlp:min_memory", 2): "tp2 zero3: ZeRO shards only the biases added under a contracted split; "
                           "a bias is not saved for backward, so the apply layer does not gather it "
                           "again there (the cost model charges every ZeRO-3 parameter two gathers)",
}


@pytest.fixture
def no_torchrun_env(monkeypatch):
    for k in TORCHRUN_ENV:
        monkeypatch.delenv(k, raising=False)
    assert not dist.is_initialized()


@pytest.fixture(scope="module")
def mlp_frontier():
    return tensoropt.frontier("mlp-tiny", "cpu:2", progress=False)


# ----------------------------------------------------------------------------- validation


def test_plan_for_another_model_raises(mlp_frontier, no_torchrun_env):
    plan = mlp_frontier.reference["data parallel"]
    other = get_model("mlp-tiny", device="cpu", widths=(16, 48, 16))
    with pytest.raises(ValueError, match="another model"):
        parallelize(other, plan)


def test_no_process_group_raises(mlp_frontier, no_torchrun_env):
    model = get_model("mlp-tiny", device="cpu")
    with pytest.raises(RuntimeError, match="torchrun"):
        parallelize(model, mlp_frontier.reference["data parallel"])


def test_world_size_mismatch_raises_before_any_collective(mlp_frontier, no_torchrun_env, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    model = get_model("mlp-tiny", device="cpu")
    with pytest.raises(ValueError, match="world size 3 does not match"):
        parallelize(model, mlp_frontier.reference["data parallel"])
    assert not dist.is_initialized()


def test_corrupt_plan_file_raises(tmp_path, no_torchrun_env):
    bad = tmp_path / "plan.json"
    bad.write_text('{"format": "tensoropt.plan/1", "model": "x"')
    with pytest.raises(ValueError, match="not a valid tensoropt plan"):
        parallelize(get_model("mlp-tiny", device="cpu"), str(bad))
    with pytest.raises(ValueError, match="does not exist"):
        load_plan(tmp_path / "missing.json")


def test_param_signature_reads_names_shapes_and_dtypes_only():
    torch.manual_seed(0)
    meta = get_model("mlp-tiny", device="meta")
    cpu = get_model("mlp-tiny", device="cpu")
    assert param_signature(meta) == param_signature(cpu)
    assert len(param_signature(cpu)) == 64
    assert param_signature(get_model("mlp-tiny", widths=(16, 48, 16))) != param_signature(cpu)
    assert param_signature(cpu.to(torch.float64)) != param_signature(meta)


def test_plan_is_checked_against_the_model_before_any_collective(no_torchrun_env):
    f = tensoropt.frontier("mlp-tiny", "cpu:2", progress=False, zero=False, recompute=False)
    tp = next(p for p in f.plans if p.summary == "tp2")
    model = get_model("mlp-tiny", device="meta")
    wrong_axes = dataclasses.replace(tp, ops=(dataclasses.replace(tp.ops[0], config="b,-"), *tp.ops[1:]))
    with pytest.raises(ValueError, match="corrupt plan"):
        parallelize(model, wrong_axes)
    with pytest.raises(ValueError, match="recomputes module 'layers.9'"):
        parallelize(model, dataclasses.replace(tp, recompute=("layers.9",)))
    # an odd hidden width: the tensor-parallel split of it does not divide
    odd = get_model("mlp-tiny", device="meta", widths=(16, 31, 16))
    with pytest.raises(ValueError, match="cannot be split"):
        parallelize(odd, dataclasses.replace(tp, param_signature=""))
    assert not dist.is_initialized()


def test_plan_round_trips_through_a_file(mlp_frontier, tmp_path):
    p = mlp_frontier.min_memory()
    p.save(tmp_path / "p.json")
    assert load_plan(str(tmp_path / "p.json")) == p


def test_layout_of_reference_plans(mlp_frontier):
    model = get_model("mlp-tiny", device="meta")
    dp = plan_layout(mlp_frontier.reference["data parallel"], model)
    assert dp.mode == "replicate" and dp.data_axes == (0,)
    f = tensoropt.frontier("mlp-tiny", "cpu:2", progress=False, zero=False, recompute=False)
    tp = next(p for p in f.plans if p.summary == "tp2")
    lay = plan_layout(tp, model)
    assert lay.mode == "dtensor" and lay.data_axes == ()
    assert format_placements(lay.param_placements["layers.0.weight"]) in {"S(0)", "S(1)", "R"}


def test_zero_and_recompute_with_model_axes_are_laid_out():
    f = tensoropt.frontier("mlp-tiny", "cpu:2", progress=False)
    model = get_model("mlp-tiny", device="meta")
    zs = [p for p in f.plans if p.zero_stage and any(not s.startswith(("dp", "rep"))
                                                      for s in p.summary.split()[0].split("·"))]
    assert zs
    for p in zs:
        lay = plan_layout(p, model)
        assert lay.mode == "dtensor"


# ----------------------------------------------------------------------------- comms


def _graph(name, **ov):
    return capture(get_model(name, device="meta", **ov), tuple(example_inputs(name, device="meta", **ov)), name=name)


def test_predicted_collectives_data_parallel(mlp_frontier):
    g = _graph("mlp-tiny")
    plan = mlp_frontier.reference["data parallel"]
    pred = predicted_collectives(plan, g)
    assert {c.kind for c in pred} == {"all_reduce"}
    assert sum(c.bytes for c in pred) == 4 * g.param_count          # one fp32 gradient all-reduce
    assert all(c.where.startswith("grad ") for c in pred)


def test_predicted_collectives_column_row_mlp():
    f = tensoropt.frontier("mlp-tiny", "cpu:2", progress=False, zero=False, recompute=False)
    tp = next(p for p in f.plans if p.summary == "tp2")
    g = _graph("mlp-tiny")
    s = summarize(predicted_collectives(tp, g))
    assert s, "a tensor-parallel plan moves activations"
    assert all(k in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all") for k in s)


def test_predicted_collectives_zero_stage(mlp_frontier):
    g = _graph("mlp-tiny")
    dp = mlp_frontier.reference["data parallel"]
    z3 = dataclasses.replace(dp, zero_stage=3)
    s = summarize(predicted_collectives(z3, g))
    n = g.param_count
    assert s["reduce_scatter"]["bytes"] == 4 * n and s["all_gather"]["bytes"] == 2 * 4 * n
    assert "all_reduce" not in s


# ----------------------------------------------------------------------------- launches


@pytest.fixture(scope="module")
def results_1():
    return launch_cases(WORKER, 1, CASES_1, ["all"], timeout=300)


@pytest.fixture(scope="module")
def results_2():
    return launch_cases(WORKER, 2, CASES_2, ["all"], timeout=420)


@pytest.fixture(scope="module")
def results_4():
    return launch_cases(WORKER, 4, CASES_4, ["all"], timeout=420)


def _check_exact(res: dict) -> None:
    if not res["ok"]:
        raise AssertionError(f"{res['case']} failed: {res['error']}\n{res.get('trace', '')}")
    assert res["grad_missing"] == []
    assert res["loss_rel"] < 1e-5, res
    assert res["grad_max_rel"] < 1e-5, (res["grad_worst"], res["grad_max_rel"])
    assert res["loss3_rel"] < 1e-4, res


def _check_comms(res: dict, world: int) -> None:
    if not res["ok"]:
        pytest.skip("case did not run")
    if res["mode"] == "pipeline":
        pytest.skip("collectives of pipeline plans are not predicted per operator")
    known = KNOWN_COMM_MISMATCH.get((res["case"], world))
    pred, meas = res["predicted"], res["measured"]
    off = {k: (pred.get(k, {}).get("bytes", 0), meas.get(k, {}).get("bytes", 0))
           for k in set(pred) | set(meas)}
    bad = {k: v for k, v in off.items() if abs(v[1] - v[0]) > 0.05 * max(v[0], 1)}
    if known and bad:
        pytest.xfail(f"{known}: {off}")   # the frontier may pick another plan: then they must agree
    assert set(pred) == set(meas), off
    assert not bad, f"{res['case']} ({res['plan']}): predicted vs measured bytes {off}"


@pytest.mark.parametrize("case", CASES_1)
def test_one_device_plans_run_as_single_process_training(results_1, case):
    _check_exact(results_1[case])
    assert results_1[case]["mesh"] == [1]
    assert results_1[case]["probe_calls_per_step"] == (2 if case.endswith("_rc") else 1)


@pytest.mark.parametrize("case", CASES_2)
def test_two_ranks_match_single_process(results_2, case):
    _check_exact(results_2[case])


@pytest.mark.parametrize("case", CASES_4)
def test_four_ranks_match_single_process(results_4, case):
    _check_exact(results_4[case])


@pytest.mark.parametrize("case", CASES_2)
def test_two_ranks_collectives_match_prediction(results_2, case):
    _check_comms(results_2[case], 2)


@pytest.mark.parametrize("case", CASES_4)
def test_four_ranks_collectives_match_prediction(results_4, case):
    _check_comms(results_4[case], 4)


@pytest.mark.parametrize("case", MEMORY_CASES)
def test_peak_memory_matches_prediction(results_2, case):
    res = results_2[case]
    assert res["ok"], res.get("error")
    rel = res["peak_bytes"] / res["predicted_peak_bytes"] - 1
    assert abs(rel) < 0.10, (res["plan"], res["peak_bytes"], res["predicted_peak_bytes"], rel)


def test_recomputed_blocks_run_their_forward_again(results_2):
    assert results_2["gpt:dp"]["probe_calls_per_step"] == 1
    assert results_2["gpt:dp_rc"]["probe_calls_per_step"] == 2


def test_cases_cover_reference_and_frontier_points(results_2, results_4):
    plans = {(r["case"], r["world"]): r.get("plan") for r in [*results_2.values(), *results_4.values()]}
    assert plans[("gpt:hybrid", 4)] == "dp2·tp2"
    assert plans[("gpt:dp", 2)].startswith("dp2")
    print(json.dumps({f"{c}@{w}": p for (c, w), p in plans.items()}, indent=1))
