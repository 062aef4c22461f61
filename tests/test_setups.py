"""``tensoropt.plan_for``: a plan someone runs, named by its degrees, priced by the frontier's
cost model (``tensoropt.setups``)."""

from __future__ import annotations

import matplotlib
import pytest

import tensoropt
from tensoropt import plan_for

matplotlib.use("Agg")

DEVICES = "8xA100-80GB"


@pytest.fixture(scope="module")
def gpt_frontier():
    return tensoropt.frontier("gpt-tiny", DEVICES, max_mesh_dims=2, progress=False)


def configs(plan) -> dict[str, str]:
    return {o.name: o.config for o in plan.ops}


def test_data_parallel_setup_is_the_frontier_reference_plan(gpt_frontier):
    ref = gpt_frontier.reference["data parallel"]
    mine = plan_for("gpt-tiny", DEVICES, dp=8)
    assert configs(mine) == configs(ref)
    assert mine.time_s == pytest.approx(ref.time_s, rel=1e-12)
    assert mine.peak_memory_bytes == pytest.approx(ref.peak_memory_bytes, rel=1e-12)
    assert mine.label == "yours"


def test_tensor_parallel_setup_lays_out_a_transformer_as_megatron_does():
    plan = plan_for("gpt-tiny", DEVICES, tp=2)          # dp = 4 on the outer axis
    c = configs(plan)
    assert plan.mesh_shape == (4, 2)
    for leaf in ("q_proj", "k_proj", "v_proj"):
        assert c[f"layers.0.attn.{leaf}"] == "b,n"
    assert c["layers.0.mlp.fc1"] == "b,n"
    assert c["layers.0.mlp:gelu"] == "b,h"              # follows fc1's split features
    assert c["layers.0.attn.o_proj"] == "b,k" and c["layers.0.mlp.fc2"] == "b,k"
    assert c["layers.0.attn:scaled_dot_product_attention"] == "b,n"
    assert c["tok_emb"] == "b,v"
    assert c["layers.0.mlp_norm"] == "b,-"               # replicated without sequence parallelism


def test_micro_batches_of_one_keep_megatrons_layout():
    # a micro-batch of one sequence, as Megatron-LM and Korthikanti et al. run: attention's heads
    # stay split (a capture at batch one labels its unit batch dim "n", where the heads stand at
    # other batches, and attention ran whole on every rank)
    from tensoropt.models import get_spec

    batch = get_spec("gpt-tiny").batch_size
    plan = plan_for("gpt-tiny", "4xA100-80GB", tp=2, pp=2, microbatches=batch)
    for stage in plan.stages:
        c = configs(stage)
        att = [name for name in c if name.endswith("scaled_dot_product_attention")]
        assert att and all(c[name].split(",")[-1] not in ("-", "n") for name in att)   # the heads
        assert all(c[name].split(",")[-1] == "k" for name in c if name.endswith(("o_proj", "fc2")))


def test_sequence_parallelism_splits_the_sequence_where_megatron_replicates():
    plain = plan_for("gpt-tiny", DEVICES, tp=2)
    sp = plan_for("gpt-tiny", DEVICES, tp=2, sequence_parallel=True)
    c = configs(sp)
    for name in ("layers.0.attn_norm", "layers.0.mlp_norm", "layers.0:add", "layers.0.drop:dropout", "norm"):
        assert c[name] == "b,s", name
    assert sp.op("layers.0.mlp_norm").activation_bytes == pytest.approx(
        plain.op("layers.0.mlp_norm").activation_bytes / 2)
    assert sp.memory_bytes < plain.memory_bytes
    assert "sp" in sp.summary


def test_pipeline_setup_has_its_stages_and_micro_batches():
    plan = plan_for("gpt-tiny", DEVICES, pp=2, tp=2, microbatches=4)
    assert plan.mesh_shape == (2, 2, 2) and len(plan.stages) == 2 and plan.microbatches == 4
    b = plan.breakdown
    assert plan.time_s == pytest.approx((4 + 2 - 1) * (b["stage_s"] + b["p2p_s"]))
    assert plan.training["batch_size"] == 8


def test_gradient_accumulation_computes_per_micro_batch_and_reduces_once():
    whole = plan_for("gpt-tiny", DEVICES, dp=4, tp=2)
    acc = plan_for("gpt-tiny", DEVICES, dp=4, tp=2, microbatches=2)
    assert acc.microbatches == 2 and acc.training["batch_size"] == whole.training["batch_size"]
    assert acc.breakdown["activation_bytes"] < whole.breakdown["activation_bytes"]
    # the same work in two halves, gradients reduced once: no faster, and not twice the reductions
    assert acc.time_s > whole.time_s
    assert acc.breakdown["comm_s"] < 2 * whole.breakdown["comm_s"]


@pytest.mark.parametrize("zero,reductions", [(0, 1), (2, 2), (3, 2)])
def test_accumulation_reduces_once_without_zero_and_every_micro_batch_under_it(zero, reductions):
    """The gradient and parameter bytes do not depend on the batch: two micro-batches pay the
    whole batch's operator collectives once without ZeRO (sync off for the first), twice
    under ZeRO (FSDP2 gathers and reduce-scatters each micro-batch); the optimizer steps once
    and its state is the same."""
    whole = plan_for("gpt-tiny", "4xA100-80GB", dp=4, zero=zero)
    acc = plan_for("gpt-tiny", "4xA100-80GB", dp=4, zero=zero, microbatches=2)
    assert whole.breakdown["comm_s"] > 0
    assert acc.breakdown["comm_s"] == pytest.approx(reductions * whole.breakdown["comm_s"], rel=1e-9)
    for k in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        assert acc.breakdown[k] == pytest.approx(whole.breakdown[k], rel=1e-9)


def test_full_recomputation_and_zero():
    rc = plan_for("gpt-tiny", DEVICES, tp=2, recompute="full")
    assert len(rc.recompute) == 2 and rc.breakdown["recompute_s"] > 0
    z = plan_for("gpt-tiny", DEVICES, dp=8, zero=3)
    assert z.zero_stage == 3
    assert z.peak_memory_bytes < plan_for("gpt-tiny", DEVICES, dp=8).peak_memory_bytes
    sel = plan_for("gpt-tiny", DEVICES, tp=2, recompute="selective")
    assert not sel.recompute


def test_per_operator_recomputation_sits_between_none_and_full():
    """torchtitan's "op" policy keeps attention outputs and every other linear's: less memory
    than keeping everything, more than full recomputation; a second forward of what it does
    not keep, less than full recomputation's."""
    none, full, op = (plan_for("gpt-tiny", DEVICES, recompute=r, dp=2, tp=4, zero=3) for r in ("none", "full", "op"))
    assert op.recompute == full.recompute and op.recompute_policy == "op" and full.recompute_policy == "full"
    assert full.peak_memory_bytes < op.peak_memory_bytes < none.peak_memory_bytes
    assert 0 < op.breakdown["recompute_s"] < full.breakdown["recompute_s"]
    assert none.time_s < op.time_s < full.time_s
    assert "rc:op" in op.summary
    again = tensoropt.Plan.from_json(op.to_json())
    assert again.recompute_policy == "op"


@pytest.mark.parametrize("kw", [dict(dp=8), dict(tp=2), dict(tp=4, sequence_parallel=True), dict(dp=8, zero=2),
                                dict(tp=8, recompute="full"), dict(tp=2, dp=4, zero=3)])
def test_no_setup_beats_the_exact_frontier_at_its_memory(gpt_frontier, kw):
    """The frontier is exact for the cost model that prices both, so a plan in its space is
    matched or beaten by a frontier plan that holds no more."""
    mine = plan_for("gpt-tiny", DEVICES, **kw)
    best = gpt_frontier.fastest_within(mine.peak_memory_bytes * (1 + 1e-12))
    assert best is not None
    assert best.time_s <= mine.time_s * (1 + 1e-9)


def test_plot_marks_the_users_plan_against_the_frontier(gpt_frontier):
    mine = plan_for("gpt-tiny", DEVICES, tp=2, label="ours today")
    ax = gpt_frontier.plot(yours=mine)
    marked = [c for c in ax.collections if c.get_gid() == "yours"]
    assert len(marked) == 1
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("ours today") and "x the frontier's time at its memory" in t for t in labels)


@pytest.mark.parametrize("kw, message", [
    (dict(tp=2, pp=2, dp=4), "16 devices"),
    (dict(dp=8, microbatches=2), "does not split over dp=8"),
    (dict(tp=8, zero=2), "dp = 1"),
    (dict(dp=8, recompute="all"), "recompute must be one of"),
    (dict(dp=8, sequence_parallel=True), "tp = 1"),
])
def test_setups_that_cannot_run_say_why(kw, message):
    with pytest.raises(ValueError, match=message):
        plan_for("gpt-tiny", DEVICES, **kw)


def test_tensor_parallel_axis_across_nodes_is_priced_on_the_network():
    inside = plan_for("gpt-tiny", "2x4xA100-80GB", tp=4)
    across = plan_for("gpt-tiny", "2x4xA100-80GB", tp=8)
    assert inside.mesh_links == ("ib-hdr", "nvlink3") and across.mesh_links == ("ib-hdr",)
    with pytest.raises(ValueError, match="keep tp within a node"):
        plan_for("gpt-tiny", "2x6xA100-80GB", tp=4, batch_size=12)     # groups of 4 straddle nodes of 6


def test_full_recomputation_needs_repeated_blocks():
    with pytest.raises(ValueError, match="has none found"):
        plan_for("mlp-tiny", "cpu:2", dp=2, recompute="full")


@pytest.mark.parametrize("degrees", [dict(dp=4), dict(dp=2, tp=2)])
def test_zero1_reduces_once_per_step(degrees):
    """ZeRO-1 reduce-scatters gradients and gathers parameters once per step: with one
    micro-batch that is ZeRO-2, which it runs and is priced as; accumulating micro-batches,
    its parameter traffic is paid once, not per micro-batch as under ZeRO-2 (and with tensor
    parallelism, once per group), and it holds the step's whole gradients."""
    devices = "4xA100-80GB"
    one = plan_for("gpt-tiny", devices, zero=1, **degrees)
    two = plan_for("gpt-tiny", devices, zero=2, **degrees)
    assert one.zero_stage == 2 and "zero1" in one.summary
    assert one.time_s == two.time_s and one.peak_memory_bytes == two.peak_memory_bytes
    one = plan_for("gpt-tiny", devices, zero=1, microbatches=2, **degrees)
    two = plan_for("gpt-tiny", devices, zero=2, microbatches=2, **degrees)
    assert one.zero_stage == 1 and two.zero_stage == 2
    if "tp" not in degrees:
        assert one.breakdown["comm_s"] == pytest.approx(two.breakdown["comm_s"] / 2)
    else:
        # and on model-parallel operators ZeRO-1's collectives go out per group (the DTensor
        # runner's apply.zero_groups), ZeRO-2's one call per parameter
        assert one.breakdown["comm_s"] < 0.99 * two.breakdown["comm_s"] / 2
    assert one.peak_memory_bytes > two.peak_memory_bytes
