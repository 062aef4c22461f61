"""Frontier plans beyond per-operator sharding: ZeRO 2/3 and activation recomputation on plans
with model-parallel axes, and pipeline plans (``parallelize`` returns a ``PipelineRunner``,
1F1B), run with torchrun (CPU/gloo, one 2-rank and one 4-rank launch, cases batched; worker:
tests/dist_scripts/beyond_worker.py) against single-process training:

* first-step loss and every parameter's gradient within 1e-5 relative (gradients relative to
  their own max, floored at 1e-4 of the model's largest gradient), loss after 3 Adam steps
  within 1e-4;
* memory (MemTracker peak of one step, per rank) of the lowest-memory ZeRO-3 plans with a
  model-parallel operator of ``gpt-big`` (2 ranks) and ``gpt`` (4 ranks) holds less state
  than the same per-operator plans without ZeRO;
  recomputation on ``gpt-big`` (d_model 256, 4 heads, vocab 512, sequence 64, batch 16,
  2 layers) lowers measured memory versus the same plan without it, also inside the stages
  of the pipeline plan ``pp2·rep1 mb8 rc`` (rank 0, the first stage); and the measured peak
  is within 10 % of ``Plan.peak_memory_bytes`` for those ZeRO-3 plans, a user's ``dp2·tp2
  zero3`` of ``mlp-big`` (mlp widths 512-1024-1024-512, batch 256: parameters, gradients,
  Adam state and activations are nearly all of it), the
  ZeRO-2 + recomputation plan, the 2-stage pipeline plan with recomputation (first stage) and
  the fastest plan whose tied lm_head works on a copy of the embedding weight in another
  layout, and a user's Megatron layout priced by ``tensoropt.plan_for`` (tp2, sequence
  parallel, full recomputation; its 4-rank pipeline and dp·tp layouts run at parity).

Plans come from ``tensoropt.frontier(model, "cpu:N")`` (first or last frontier point matching
a selector, see the worker); nothing is hand-edited except dropping ZeRO / recomputation for
the comparison layouts, whose predicted numbers are not used.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import tensoropt
from dist_cases import launch_cases
from tensoropt.apply import PlanNotApplicable, plan_layout
from tensoropt.apply.pipeline_runner import pipeline
from tensoropt.models import get_model

WORKER = Path(__file__).parent / "dist_scripts" / "beyond_worker.py"

CASES_2 = ["mlp:zero3_mp", "mlp:zero2_mp", "gpt:rc_mp", "gpt:pp", "gpt:pp_rc@last",
           "gpt-big:zero2_rc_mp@last", "gpt-big:zero3_mp@last", "gpt-big:pp_rc@last", "gpt-big:tied_copy",
           "gpt-big:setup_tp2_sp_rc", "gpt-big:setup_dp2_zero2", "gpt-big:setup_dp2_zero3",
           "mlp-big:setup_dp2_zero2", "gpt-big:setup_tp2_rcop", "gpt-big:setup_dp2_zero3_rcop",
           "gpt-big:setup_pp2_rcop_mb4", "gpt-big:setup_tp2_mb2", "gpt-big:setup_dp2_mb2",
           "gpt-big:setup_dp2_zero2_mb2", "gpt-big:setup_dp2_zero1_mb2"]
MEASURE_2 = ["gpt-big:zero2_rc_mp@last", "gpt-big:zero3_mp@last", "gpt-big:pp_rc@last", "gpt-big:tied_copy",
             "gpt-big:setup_tp2_sp_rc", "gpt-big:setup_dp2_zero2", "gpt-big:setup_dp2_zero3",
             "mlp-big:setup_dp2_zero2", "gpt-big:setup_tp2_rcop", "gpt-big:setup_dp2_zero3_rcop",
             "gpt-big:setup_pp2_rcop_mb4", "gpt-big:setup_tp2_mb2", "gpt-big:setup_dp2_mb2",
             "gpt-big:setup_dp2_zero1_mb2"]
CASES_4 = ["gpt:zero3_mp@last", "mlp-big:setup_dp2_tp2_zero3", "gpt:zero3_rc_mp@last", "mlp:zero3_mp@last", "gpt:pp_mp@last", "gpt:pp",
           "gpt:setup_pp2_tp2_mb4", "gpt:setup_dp2_tp2_sp", "gpt:setup_dp2_tp2_mb2", "gpt:setup_dp2_tp2_zero1_mb2",
           "mlp-big:setup_dp2_tp2_zero1_mb2"]
MEASURE_4 = ["gpt:zero3_mp@last", "mlp-big:setup_dp2_tp2_zero3", "gpt:setup_dp2_tp2_zero1_mb2",
             "mlp-big:setup_dp2_tp2_zero1_mb2"]
# (case, world) whose measured peak must be within 10 % of Plan.peak_memory_bytes: resident
# state + saved activations + the backward pass's rise
# (gradients in flight, ZeRO-3 gathers with one prefetch, a recomputed layer rematerialised,
# a micro-batch's parameter gradients before they are accumulated).
MEMORY_ABS = [("gpt-big:zero3_mp@last", 2), ("mlp-big:setup_dp2_tp2_zero3", 4),
              # Known gap, kept visible: on 4 ranks this is "dp~4 zero3", whose MLPs and LM head
              # split the contracted dimension ('k'): 949,400 B measured against 804,364 priced
              # (+18 %), the state exact and the rest activations and temporaries (the partial
              # sums' full-size outputs). Its pick before the DTensor runner's ZeRO-2/3 collectives
              # were priced per parameter was another plan.
              pytest.param("gpt:zero3_mp@last", 4, marks=pytest.mark.xfail(
                  strict=True, reason="contracted-dim splits: partial outputs held beyond their price")),
              # Known gap, kept visible: the lowest-memory ZeRO-2 plan with recomputation and a
              # model-parallel operator. Since the DTensor runner's ZeRO-2/3 collectives are priced
              # one call per parameter, "dp~2 zero2 rc1/2" (measured -1 %) has left the frontier and
              # this is "tp2 zero2 rc1/2", whose recomputed layer has contracted-dim splits ('k'):
              # +12 % to +15 % measured, the gap test_conformance holds to DTENSOR_ZERO3_RECOMPUTE_TOL.
              pytest.param("gpt-big:zero2_rc_mp@last", 2, marks=pytest.mark.xfail(
                  strict=True, reason="a recomputed layer with contracted-dim splits holds a full-size "
                                      "partial output through its backward: not priced")),
              ("gpt-big:pp_rc@last", 2),
              # lm_head works on a copy of the tied embedding weight in its own layout
              ("gpt-big:tied_copy", 2),
              # a user's Megatron layout (tensoropt.plan_for): sequence parallel, full recomputation
              ("gpt-big:setup_tp2_sp_rc", 2),
              # FSDP2 fully_shard: ZeRO-2's shards beside the gathered parameters; ZeRO-3's root and
              # block groups gathered whole (were +11 % and +13 % before these were priced)
              ("gpt-big:setup_dp2_zero2", 2), ("gpt-big:setup_dp2_zero3", 2),
              # one group (no repeated blocks): its whole gradients wait for one reduce-scatter
              ("mlp-big:setup_dp2_zero2", 2),
              # per-operator selective recomputation (torchtitan's "op" policy), DTensor and FSDP2
              ("gpt-big:setup_tp2_rcop", 2), ("gpt-big:setup_dp2_zero3_rcop", 2),
              ("gpt-big:setup_pp2_rcop_mb4", 2),
              # gradient accumulation over 2 micro-batches without pipeline stages (train_step)
              ("gpt-big:setup_tp2_mb2", 2),
              # ZeRO-1 accumulating: parameters gathered once per step beside their shards, whole
              # gradients until the last micro-batch's reduce-scatter (DTensor and FSDP2)
              ("gpt:setup_dp2_tp2_zero1_mb2", 4), ("gpt-big:setup_dp2_zero1_mb2", 2),
              # ZeRO-1 on DTensor, one group (no repeated blocks): gathered together at the first
              # use, reduce-scattered together after the last micro-batch (apply.zero_groups)
              ("mlp-big:setup_dp2_tp2_zero1_mb2", 4),
              # Known gap, kept visible: under FSDP2 (replicate, and fully_shard with ZeRO-2:
              # +15 % measured) accumulation holds more than priced (measured 45.9 MB against
              # 40.3 MB predicted). strict: passing again must be noticed.
              pytest.param("gpt-big:setup_dp2_mb2", 2, marks=pytest.mark.xfail(
                  strict=True, reason="FSDP2's buffers while accumulating gradients over micro-batches are "
                                      "not priced"))]


@pytest.fixture(scope="module")
def results_2():
    return launch_cases(WORKER, 2, CASES_2, MEASURE_2, timeout=480)


@pytest.fixture(scope="module")
def results_4():
    return launch_cases(WORKER, 4, CASES_4, MEASURE_4, timeout=480)


def _check_exact(res: dict) -> None:
    if not res["ok"]:
        raise AssertionError(f"{res['case']} failed: {res['error']}\n{res.get('trace', '')}")
    assert res["grad_missing"] == []
    assert res["loss_rel"] < 1e-5, res
    assert res["grad_max_rel"] < 1e-5, (res["grad_worst"], res["grad_max_rel"])
    assert res["loss3_rel"] < 1e-4, res


@pytest.mark.parametrize("case", CASES_2)
def test_two_ranks_match_single_process(results_2, case):
    _check_exact(results_2[case])


@pytest.mark.parametrize("case", CASES_4)
def test_four_ranks_match_single_process(results_4, case):
    _check_exact(results_4[case])


def test_cases_cover_zero_recompute_pipelines(results_2, results_4):
    res = [*results_2.values(), *results_4.values()]
    assert all(r["ok"] for r in res)
    with_mp = [r for r in res if r["mode"] == "dtensor"]
    assert any(r["zero_stage"] == 3 for r in with_mp)
    assert any(r["zero_stage"] == 2 for r in with_mp)
    assert any(r["recompute"] for r in with_mp)
    pipes = [r for r in res if r["stages"]]
    assert any(r["world"] == 2 for r in pipes) and any(r["world"] == 4 for r in pipes)
    assert any(r["recompute"] and r["microbatches"] > 2 for r in pipes)
    assert any("tp" in r["plan"] for r in pipes)          # tensor parallel inside the stages
    # gradient accumulation without pipeline stages, in DTensor and FSDP2 layouts
    accumulated = [r for r in res if r["microbatches"] > 1 and not r["stages"]]
    assert {r["mode"] for r in accumulated} >= {"dtensor"} and len(accumulated) >= 2
    assert all(r["whole_batch_refused"] for r in accumulated)


ACCUMULATING = [("gpt-big:setup_tp2_mb2", 2), ("gpt-big:setup_dp2_mb2", 2), ("gpt-big:setup_dp2_zero2_mb2", 2),
                ("gpt:setup_dp2_tp2_mb2", 4), ("gpt-big:setup_dp2_zero1_mb2", 2), ("gpt:setup_dp2_tp2_zero1_mb2", 4),
                ("mlp-big:setup_dp2_tp2_zero1_mb2", 4)]


@pytest.mark.parametrize("case,world", ACCUMULATING)
def test_accumulating_plans_issue_what_is_priced(results_2, results_4, case, world):
    """A step of 2 micro-batches: gradients reduced once where the plan has no ZeRO (sync off
    for the first micro-batch: FSDP2 replicate, DTensor's deferred reduction) and under ZeRO-1
    (parameters gathered once too), every micro-batch under ZeRO-2; the rest each micro-batch. Bytes by kind as counted by
    CommDebugMode against ``comms.issued_collectives`` on the micro-batch's graph."""
    res = (results_2 if world == 2 else results_4)[case]
    assert res["ok"], res.get("error")
    pred, meas = res["predicted"], res["measured"]
    assert set(pred) == set(meas), (pred, meas)
    for kind in pred:
        assert meas[kind]["bytes"] == pytest.approx(pred[kind]["bytes"], rel=0.05), (kind, pred, meas)
    if res["mode"] == "replicate" or res["zero_stage"] <= 1:
        # and the calls: parameters' collectives go out one call per group (FSDP2's groups, the
        # DTensor runner's gradient buckets and ZeRO-1 units), as execution.latency_shares
        # prices them
        calls = {k: v["count"] for k, v in meas.items()}, {k: v["count"] for k, v in pred.items()}
        kinds, why = KNOWN_CALL_MISMATCH.get((case, world), ((), ""))
        for kind in set(calls[0]) - set(kinds):
            assert calls[0][kind] == calls[1][kind], (kind, calls)
        if kinds:
            assert any(calls[0][k] != calls[1][k] for k in kinds), "agrees now: drop it from KNOWN_CALL_MISMATCH"
            pytest.xfail(why)


# Where the calls differ from comms.issued_collectives, and why
KNOWN_CALL_MISMATCH = {
    ("gpt:setup_dp2_tp2_zero1_mb2", 4): (("all_gather", "reduce_scatter", "all_reduce"),
        "the position table reaches its operator through a slice: DTensor gathers the sliced "
        "ZeRO-1 parameter (and reduces its gradient) on its own, per micro-batch, not with its "
        "group (4 all-gathers, 2 reduce-scatters more); and the blocks' column-split biases, as "
        "below (2 all-reduces); bytes agree within 5 %"),
    ("mlp-big:setup_dp2_tp2_zero1_mb2", 4): (("all_reduce",),
        "a bias split along its only dimension by the later mesh axis cannot also take ZeRO's "
        "shard on the earlier one (placement.zero_storage: DTensor nests shards in axis order), "
        "so its gradient is all-reduced in a bucket where a reduce-scatter is priced (1 call, "
        "3 KB more)"),
}


def _memory(results_2, results_4, case, world):
    res = (results_2 if world == 2 else results_4)[case]
    assert res["ok"], res.get("error")
    return res


@pytest.mark.parametrize("case,world", [("gpt-big:zero3_mp@last", 2), ("gpt:zero3_mp@last", 4),
                                        ("gpt-big:zero2_rc_mp@last", 2), ("gpt-big:pp_rc@last", 2)])
def test_memory_moves_in_predicted_direction(results_2, results_4, case, world):
    res = _memory(results_2, results_4, case, world)
    # ZeRO and recomputation only lower the cost model's memory: measured must go down too.
    # ZeRO alone shrinks the resident state (parameters, gradients, optimizer state); its
    # transient gathers (TEMP, not modelled) can outweigh a small saving at the peak, as in
    # a plan where only the biases are sharded.
    if "zero" in case and "rc" not in case:
        state = lambda cats: sum(cats.get(k, 0) for k in ("PARAM", "GRAD", "OPT"))  # noqa: E731
        assert state(res["peak_by_category"]) < state(res["baseline_by_category"]), res
    else:
        assert res["peak_bytes"] < res["baseline_peak_bytes"], res


@pytest.mark.parametrize("case,world", MEMORY_ABS)
def test_memory_matches_prediction(results_2, results_4, case, world):
    res = _memory(results_2, results_4, case, world)
    rel = res["peak_bytes"] / res["predicted_peak_bytes"] - 1
    assert abs(rel) < 0.10, (res["plan"], res["peak_bytes"], res["predicted_peak_bytes"], rel)


# ----------------------------------------------------------------------------- single process


@pytest.fixture
def no_torchrun_env(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    assert not dist.is_initialized()


def test_pipeline_runner_refuses_a_model_call_with_pointer():
    from tensoropt.apply import PipelineRunner

    runner = PipelineRunner.__new__(PipelineRunner)
    with pytest.raises(TypeError, match="runner.step"):
        runner(torch.zeros(2))


def test_pipeline_needs_a_pipeline_plan(no_torchrun_env):
    # parallelize sends only pipeline plans here: the guard is for a caller inside the package
    f = tensoropt.frontier("gpt-tiny", "cpu:2", progress=False)
    plain = f.plans[0]
    with pytest.raises(ValueError, match="no pipeline stages"):
        pipeline(get_model("gpt-tiny", device="cpu"), plain)


def test_recompute_plans_with_model_axes_lay_out():
    f = tensoropt.frontier("gpt-tiny", "cpu:4", progress=False)
    model = get_model("gpt-tiny", device="meta")
    rc = [p for p in f.plans if p.recompute and not p.stages]
    assert rc
    for p in rc[-3:]:
        lay = plan_layout(p, model)
        assert lay.mode == "dtensor" or lay.mode == "replicate"
