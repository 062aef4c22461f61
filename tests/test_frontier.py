"""tensoropt.frontier: from a model and a device set to its Pareto frontier of plans."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn

import tensoropt
from tensoropt.capture import CaptureError
from tensoropt.cli import main as cli_main
from tensoropt.models import example_inputs, get_model
from tensoropt.plan import Plan
from tensoropt.allocator import reserved_ratio
from tensoropt.budget import InfeasibleBudget
from tensoropt.hardware import get_device


@pytest.fixture(scope="module")
def gpt_frontier():
    return tensoropt.frontier("gpt-tiny", "4xA100-80GB", pipeline=False, progress=False)


@pytest.fixture(scope="module")
def gpt_cpu_frontier():
    return tensoropt.frontier("gpt-tiny", "cpu:2", pipeline=False, progress=False)


def test_frontier_is_strictly_pareto(gpt_frontier):
    t, m = gpt_frontier.times_s, gpt_frontier.memories_bytes
    assert len(gpt_frontier) > 3
    assert np.all(np.diff(t) > 0)
    assert np.all(np.diff(m) < 0)
    df = gpt_frontier.to_pandas()
    assert list(df["time_s"]) == list(t) and {"mesh", "summary", "memory_bytes"} <= set(df.columns)
    # the frontier's memory is each plan's peak; the end of the forward pass is a breakdown column
    assert list(df["memory_bytes"]) == [p.peak_memory_bytes for p in gpt_frontier.plans] == list(m)
    assert list(df["forward_end_bytes"]) == [p.memory_bytes for p in gpt_frontier.plans]
    # what the caching allocator would reserve on the GPU: above the peak, by the allocator's rule
    ratio = reserved_ratio(get_device("A100-80GB"))
    assert ratio > 1 and list(df["reserved_bytes"]) == [p.peak_memory_bytes * ratio for p in gpt_frontier.plans]


def test_a_cpu_frontier_reserves_what_it_allocates(gpt_cpu_frontier):
    df = gpt_cpu_frontier.to_pandas()
    assert list(df["reserved_bytes"]) == list(df["memory_bytes"])


def test_no_plan_is_dominated_in_time_and_peak_memory():
    """Pipelines included: every plan returned is Pareto-optimal among them in (time, peak)
    (meshes up to 2-D: the merge across meshes is what is tested, and 3-D ones triple the time)."""
    f = tensoropt.frontier("gpt-tiny", "8xA100-80GB", max_mesh_dims=2, progress=False)
    assert any(p.stages for p in f.plans) and any(p.recompute for p in f.plans)
    pts = [(p.time_s, p.peak_memory_bytes) for p in f.plans]
    for i, (t, m) in enumerate(pts):
        assert not any(t2 <= t and m2 <= m and (t2, m2) != (t, m) for j, (t2, m2) in enumerate(pts) if j != i)


def test_every_plan_costs_what_it_says(gpt_frontier):
    for p in [p for p in gpt_frontier.plans if not p.stages][:: max(1, len(gpt_frontier) // 10)]:
        b = p.breakdown
        assert p.time_s == pytest.approx(b["compute_s"] + b["recompute_s"] + b["comm_s"] + b["relayout_s"],
                                         rel=1e-9)
        mem = b["param_bytes"] + b["grad_bytes"] + b["optimizer_bytes"] + b["activation_bytes"]
        assert p.memory_bytes == pytest.approx(mem, rel=1e-9)
        assert 0 < b["transient_bytes"] < mem
        assert sum(o.compute_s for o in p.ops) == pytest.approx(b["compute_s"] + b["recompute_s"], rel=1e-9)
        assert sum(o.activation_bytes for o in p.ops) <= b["activation_bytes"]


def test_best_is_fastest_under_budget(gpt_frontier):
    plans = gpt_frontier.plans
    for i in (0, len(plans) // 3, len(plans) // 2, len(plans) - 1):
        budget = plans[i].peak_memory_bytes
        best = gpt_frontier.best(memory_budget=budget)
        assert best.memory_bytes <= best.peak_memory_bytes <= budget
        assert best.time_s == min(p.time_s for p in plans if p.peak_memory_bytes <= budget) <= plans[i].time_s
    # strings are parsed (GB = 1e9 bytes)
    assert gpt_frontier.best("1GB") is plans[0]


def test_infeasible_budget_states_the_minimum(gpt_frontier):
    least = min(p.peak_memory_bytes for p in gpt_frontier.plans)
    with pytest.raises(InfeasibleBudget) as err:
        gpt_frontier.best(memory_budget=least * 0.5)
    msg = str(err.value)
    assert "minimum achievable" in msg and f"{least:.0f} bytes" in msg


def test_reference_plans_are_matched_or_dominated(gpt_frontier):
    assert {"data parallel", "megatron dp1·tp4", "megatron dp2·tp2"} <= set(gpt_frontier.reference)
    t, m = gpt_frontier.times_s, gpt_frontier.memories_bytes
    for name, ref in gpt_frontier.reference.items():
        assert np.any((t <= ref.time_s * (1 + 1e-12)) & (m <= ref.memory_bytes * (1 + 1e-12))), name


def test_data_parallel_memory_is_16_bytes_per_param_plus_activations(gpt_cpu_frontier):
    model = get_model("gpt-tiny")
    n_params = sum(p.numel() for p in model.parameters())   # tied weights count once
    dp = gpt_cpu_frontier.reference["data parallel"]
    b = dp.breakdown
    assert dp.training["precision"] == "fp32" and dp.training["optimizer"] == "adam"
    assert b["param_bytes"] + b["grad_bytes"] + b["optimizer_bytes"] == 16 * n_params
    # activations counted independently: storages autograd saves in a real forward of the
    # same model on one rank's half of the batch
    torch.manual_seed(0)
    real = get_model("gpt-tiny", device="cpu")
    x = example_inputs("gpt-tiny", 4, device="cpu")
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        real(*x)
    params = {p.untyped_storage().data_ptr() for p in real.parameters()}
    uniq = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved
            if t.untyped_storage().data_ptr() not in params}
    real_bytes = sum(uniq.values())
    # capture attributes one more (B, S, H) tensor per block than autograd keeps alive on
    # this model (a conservative ~5 % over-count, see the capture notes)
    assert real_bytes <= b["activation_bytes"] <= 1.06 * real_bytes
    assert dp.memory_bytes == 16 * n_params + b["activation_bytes"]


def test_mlp_min_time_on_tensor_parallel_axis_is_column_then_row():
    # an odd batch cannot be split over 4 devices, so they can only split the linears
    widths = (1024, 16384, 1024)
    model = get_model("mlp", widths=widths)
    inputs = example_inputs("mlp", 255, widths=widths)
    f = tensoropt.frontier(model, "4xA100-80GB", inputs, max_mesh_dims=1, progress=False)
    best = f.min_time()
    cfg = best.configs()
    assert (cfg["layers.0"], cfg["layers.1"]) == ("n", "k")
    assert best.op("gelu").config == "s"          # the hidden activation stays sharded
    assert best.op("gelu").relayout_s == 0 and best.op("layers.1").relayout_s == 0
    assert best.op("layers.1").placements == "P"


def test_plan_json_round_trip_is_exact(gpt_frontier, tmp_path):
    for p in (gpt_frontier.min_time(), gpt_frontier.min_memory(), gpt_frontier.reference["data parallel"]):
        again = Plan.from_json(p.to_json())
        assert again == p
        p.save(tmp_path / "plan.json")
        assert Plan.load(tmp_path / "plan.json") == p
    assert "operator" in p.describe() and p.ops[0].name in p.describe()


def test_corrupt_plan_json_is_a_clear_error():
    with pytest.raises(ValueError, match="corrupt plan JSON"):
        Plan.from_json("{not json")
    with pytest.raises(ValueError, match="not a tensoropt plan"):
        Plan.from_json(json.dumps({"format": "something else"}))


def test_same_frontier_on_repeated_runs(gpt_frontier):
    again = tensoropt.frontier("gpt-tiny", "4xA100-80GB", pipeline=False, progress=False)
    assert [(p.time_s, p.memory_bytes, p.configs()) for p in again] == \
           [(p.time_s, p.memory_bytes, p.configs()) for p in gpt_frontier]


def test_unknown_device_string_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown device"):
        tensoropt.frontier("gpt-tiny", "8xB300", progress=False)


def test_module_without_inputs_is_a_clear_error():
    with pytest.raises(ValueError, match="example inputs"):
        tensoropt.frontier(get_model("mlp-tiny"), "cpu:2")


class _DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:          # data-dependent control flow cannot be exported
            return y.sum()
        return -y.sum()


def test_model_that_cannot_be_captured_is_a_clear_error():
    with pytest.raises(CaptureError):
        tensoropt.frontier(_DataDependent(), "cpu:2", (torch.randn(2, 4),), progress=False)


def test_cli_prints_the_frontier_and_writes_plan_and_plot(tmp_path, capsys):
    out, png = tmp_path / "plan.json", tmp_path / "f.png"
    rc = cli_main(["frontier", "--model", "mlp-tiny", "--devices", "cpu:2", "--budget", "1MB",
                   "--out", str(out), "--plot", str(png), "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "reference plans" in text and "fastest plan within 1MB" in text
    assert Plan.load(out).memory_bytes <= 1e6
    assert png.stat().st_size > 1000
    rc = cli_main(["frontier", "--model", "mlp-tiny", "--devices", "cpu:2", "--format", "csv", "--no-progress"])
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("time_s,memory_bytes") and len(lines) >= 2


def test_cli_searches_per_operator_recomputation(capsys):
    rc = cli_main(["frontier", "--model", "gpt-tiny", "--devices", "cpu:2", "--recompute-policy", "op",
                   "--format", "csv", "--no-progress"])
    assert rc == 0
    rows = capsys.readouterr().out.strip().splitlines()[1:]
    recomputed = [r for r in rows if " rc" in r]
    assert recomputed and all(":op" in r for r in recomputed)


def test_cli_says_how_many_workers_solved(capsys):
    rc = cli_main(["frontier", "--model", "gpt-tiny", "--devices", "cpu:2", "--workers", "2", "--no-progress"])
    assert rc == 0
    assert "2 worker process(es)" in capsys.readouterr().out
    rc = cli_main(["frontier", "--model", "gpt-tiny", "--devices", "cpu:2", "--workers", "1", "--no-progress"])
    assert rc == 0
    assert "1 worker process(es)" in capsys.readouterr().out


def test_cli_bad_input_exits_2(capsys):
    assert cli_main(["frontier", "--model", "nope", "--no-progress"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert cli_main(["frontier", "--model", "mlp-tiny", "--devices", "3xZ9", "--no-progress"]) == 2
    assert cli_main(["frontier", "--model", "mlp-tiny", "--devices", "cpu:2", "--budget", "1KB",
                     "--no-progress"]) == 2
    assert "minimum achievable" in capsys.readouterr().err


def test_measured_profile_prices_the_plans(tmp_path):
    from tensoropt.profile import Profile

    path = "data/profiles/cpu-2core.json"
    measured = tensoropt.frontier("mlp-tiny", "cpu:2", profile=path, progress=False)
    default = tensoropt.frontier("mlp-tiny", "cpu:2", progress=False)
    prof = Profile.load(path, check_environment=False)
    op = measured.min_time().op("layers.0")
    assert op.compute_s != default.min_time().op("layers.0").compute_s
    # data parallel's gradient all-reduce is priced with the measured 2-rank all-reduce
    ar = prof.collectives["all_reduce"].for_group(2)
    assert measured.reference["data parallel"].breakdown["comm_s"] > 2 * ar[0]
    with pytest.raises(FileNotFoundError, match="tensoropt.profile"):
        tensoropt.frontier("mlp-tiny", "cpu:2", profile=str(tmp_path / "missing.json"), progress=False)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not a valid tensoropt profile"):
        tensoropt.frontier("mlp-tiny", "cpu:2", profile=str(tmp_path / "bad.json"), progress=False)


def test_cost_terms_price_the_search_itself(tmp_path):
    """Calibration enters the search: compute twice as slow and a fixed cost per step give
    every plan compute x 2 + the rest + the fixed cost, plan for plan (mlp-tiny's frontier
    does not reorder under a uniform compute scale), and a stale format is refused."""
    from tensoropt.cost_terms import CostTerms

    terms = CostTerms(matmul_scale=2.0, other_compute_scale=2.0, fixed_s=0.01)
    terms.save(tmp_path / "terms.json")
    base = tensoropt.frontier("mlp-tiny", "cpu:2", pipeline=False, progress=False)
    f = tensoropt.frontier("mlp-tiny", "cpu:2", pipeline=False, progress=False, calibration=str(tmp_path / "terms.json"))
    assert np.all(np.diff(f.times_s) > 0) and np.all(np.diff(f.memories_bytes) < 0)
    by_config = {tuple(o.config for o in p.ops) + (p.zero_stage, p.recompute): p for p in base.plans}
    matched = 0
    for p in f.plans:
        orig = by_config.get(tuple(o.config for o in p.ops) + (p.zero_stage, p.recompute))
        if orig is None:
            continue
        matched += 1
        b = orig.breakdown
        compute = b["compute_s"] + b["recompute_s"]
        assert p.time_s == pytest.approx(orig.time_s + compute + 0.01, rel=1e-9)
        assert p.peak_memory_bytes == orig.peak_memory_bytes
    assert matched >= len(f.plans) // 2
    with pytest.raises(FileNotFoundError, match="validate.py"):
        tensoropt.frontier("mlp-tiny", "cpu:2", pipeline=False, progress=False,
                           calibration=str(tmp_path / "none.json"))
    (tmp_path / "old.json").write_text('{"format": "tensoropt.step_calibration/1", "compute_scale": 2.0}')
    with pytest.raises(ValueError, match="not cost terms"):
        tensoropt.frontier("mlp-tiny", "cpu:2", pipeline=False, progress=False, calibration=str(tmp_path / "old.json"))


def test_time_limit_is_stated_for_the_whole_search():
    from tensoropt.engine import SolveTimeout

    with pytest.raises(SolveTimeout) as err:
        tensoropt.frontier("gpt-tiny", "4xA100-80GB", time_limit_s=0.001, progress=False)
    msg = str(err.value)
    assert "time_limit_s=0.001" in msg and "gpt-tiny on 4xA100-80GB" in msg and "while solving mesh" in msg


def test_gradient_accumulation_widens_the_frontier_and_prices_as_plan_for_does(gpt_cpu_frontier):
    """``accumulate=(2,)``: every mesh and ZeRO stage also at 2 micro-batches a step without
    pipeline stages. The space only grows, so every plan of the frontier without it is matched
    or beaten; a user's accumulating plan (``plan_for``) lies in the space, so a plan at least
    as fast fits its memory."""
    with pytest.raises(ValueError, match="micro-batch counts"):
        tensoropt.frontier("gpt-tiny", "cpu:2", accumulate=(2, 0))
    # a count that does not divide the batch (8) is left out, and stats say which were searched
    f = tensoropt.frontier("gpt-tiny", "cpu:2", pipeline=False, progress=False, accumulate=(2, 3))
    assert f.stats["accumulate"] == [2] and gpt_cpu_frontier.stats["accumulate"] == []
    accumulating = [p for p in f.plans if p.microbatches > 1]
    assert accumulating and all(p.microbatches == 2 and not p.stages and " mb2" in p.summary for p in accumulating)
    assert {p.training["batch_size"] for p in f.plans} == {gpt_cpu_frontier.plans[0].training["batch_size"]}
    for p in accumulating:
        b = p.breakdown
        assert p.time_s == pytest.approx(b["compute_s"] + b["recompute_s"] + b["comm_s"] + b["relayout_s"]
                                         + b["update_s"], rel=1e-9)
    for p in gpt_cpu_frontier.plans:
        assert any(q.time_s <= p.time_s * (1 + 1e-12) and q.peak_memory_bytes <= p.peak_memory_bytes * (1 + 1e-12)
                   for q in f.plans), p.summary
    assert len(f) > len(gpt_cpu_frontier)
    yours = tensoropt.plan_for("gpt-tiny", "cpu:2", dp=2, microbatches=2)
    assert f.best(yours.peak_memory_bytes).time_s <= yours.time_s * (1 + 1e-12)


class _Sorting(nn.Module):
    """A layer whose middle operator (a sort, as a mixture of experts' router runs) has no
    pricing rule."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(self.a(x).sort(dim=-1).values).pow(2).mean()


def test_operators_without_a_pricing_rule_are_announced():
    x = torch.empty(8, 16, device="meta")
    with torch.device("meta"):
        model = _Sorting()
    with pytest.warns(tensoropt.UnpricedOpsWarning, match=r"aten\.sort") as record:
        f = tensoropt.frontier(model, "cpu:2", inputs=(x,), pipeline=False, progress=False)
    assert len([w for w in record if issubclass(w.category, tensoropt.UnpricedOpsWarning)]) == 1
    assert [u["aten"] for u in f.stats["unpriced_ops"]] == [["aten.sort.default"]]
    with pytest.warns(tensoropt.UnpricedOpsWarning):
        tensoropt.plan_for(model, "cpu:2", inputs=(x,), dp=2)


def test_a_model_priced_throughout_raises_no_unpriced_warning(gpt_cpu_frontier, recwarn):
    tensoropt.frontier("gpt-tiny", "cpu:2", pipeline=False, progress=False, max_mesh_dims=1)
    assert gpt_cpu_frontier.stats["unpriced_ops"] == []
    assert not [w for w in recwarn if issubclass(w.category, tensoropt.UnpricedOpsWarning)]
