"""Published GPU runs as plans (``tensoropt.validate.published``): which rows become cases,
and that a case's time splits into the parts the GPU-side terms scale, as the search prices
them with fitted terms."""

from __future__ import annotations

import json

import numpy as np

import pytest

from tensoropt.cost_terms import CostTerms
from tensoropt.validate.published import OVERLAP_GRID, TIME_TERMS, Case, cases, grad_comm_exposed, price, time_features


def test_every_published_row_is_a_case_or_left_out_with_a_reason():
    found, left = cases()
    from tensoropt.validate.published import load_rows

    assert len(found) + len(left) == len(load_rows())
    assert all(r["reason"] for r in left)
    ids = {c.case_id for c in found}
    assert "megatron_readme_175b_1024gpu" in ids and "torchtitan_t1_8b_8gpu_FSDP" in ids
    readme = next(c for c in found if c.case_id == "megatron_readme_175b_1024gpu")
    assert readme.setup == dict(tp=8, pp=16, dp=8, recompute="full", microbatches=192)
    assert readme.devices == "128x8xA100-80GB" and readme.published_s == 32
    # kernels the cost model does not price are left out, not silently compared
    reasons = {r["case_id"]: r["reason"] for r in left}
    assert "Float8" in reasons["torchtitan_t1_8b_8gpu_FSDP_torchcompile_Float8"]
    assert "compile" in reasons["torchtitan_t1_8b_8gpu_FSDP_torchcompile"]
    for c in found:
        s = c.setup
        assert s["tp"] * s["pp"] * s["dp"] == int(c.devices.split("x")[0]) * int(c.devices.split("x")[1])


SMALL = dict(vocab_size=256, seq_len=32, n_layers=4, d_model=64, n_heads=4)


@pytest.mark.parametrize("setup", [dict(tp=2, pp=2, dp=2, microbatches=4, recompute="full"),
                                   dict(tp=2, dp=4, microbatches=2, sequence_parallel=True, zero=1),
                                   dict(tp=4, dp=2)])
def test_time_features_add_up_and_fitted_terms_price_the_plan(tmp_path, setup):
    case = Case("small", "test", "gpt3-175b", SMALL, 16, "2x4xA100-80GB", setup, 1.0, None)
    plan = price(case)
    feats = time_features(plan, "A100-80GB")
    assert set(feats) == set(TIME_TERMS)
    assert sum(feats.values()) == pytest.approx(plan.time_s, rel=1e-9)
    terms = CostTerms(matmul_scale=1.7, other_compute_scale=3.0, relayout_scale=0.5, grad_comm_scale=0.25,
                      p2p_scale=2.0)
    path = tmp_path / "terms.json"
    terms.save(path)
    calibrated = price(case, calibration=str(path))
    scale = {"matmul_a100": 1.7, "matmul_h100": 1.7, "other_compute": 3.0, "relayout": 0.5, "grad_comm": 0.25,
             "p2p": 2.0}
    assert calibrated.time_s == pytest.approx(sum(scale[k] * v for k, v in feats.items()), rel=1e-9)
    assert calibrated.peak_memory_bytes == plan.peak_memory_bytes


@pytest.mark.parametrize("setup", [dict(tp=2, dp=4, zero=3), dict(tp=1, dp=8, microbatches=2, zero=1),
                                   dict(tp=2, pp=2, dp=2, microbatches=4)])
def test_an_overlap_prices_plans_as_the_fit_counts_them(tmp_path, setup):
    """With ``grad_comm_overlap`` the cost model prices only the parameter traffic past that
    share of each operator's compute: the plan's time is the fit's features with its gradient
    traffic replaced by ``grad_comm_exposed`` at that overlap, and the overlap hides some."""
    case = Case("small", "test", "gpt3-175b", SMALL, 16, "2x4xA100-80GB", setup, 1.0, None)
    plan = price(case)
    feats = time_features(plan, "A100-80GB")
    exposed = grad_comm_exposed(plan)
    assert exposed[0] == pytest.approx(feats["grad_comm"], rel=1e-9)
    k = OVERLAP_GRID.index(0.5)
    assert 0 <= exposed[-1] <= exposed[k] < exposed[0]
    path = tmp_path / "terms.json"
    CostTerms(grad_comm_scale=2.0, grad_comm_overlap=0.5).save(path)
    calibrated = price(case, calibration=str(path))
    assert calibrated.time_s == pytest.approx(sum(feats.values()) - feats["grad_comm"] + 2.0 * exposed[k], rel=1e-9)
    assert calibrated.peak_memory_bytes == plan.peak_memory_bytes
    with pytest.raises(ValueError, match="grad_comm_overlap"):
        CostTerms(grad_comm_overlap=-0.1)


def test_published_report_holds_its_targets_as_stated():
    """data/validation/published.json as scripts/validate_published.py wrote it: held-out
    cases were not fitted on, and the held-out median error is the one the README states."""
    import numpy as np
    from pathlib import Path

    doc = json.loads((Path(__file__).parents[1] / "data" / "validation" / "published.json").read_text())
    fit_terms = json.loads((Path(__file__).parents[1] / "data" / "validation" / "gpu_terms_a100.json").read_text())
    held = [r for r in doc["cases"] if r.get("role") == "held out"]
    assert held and not set(r["case_id"] for r in held) & set(fit_terms["meta"]["fitted_on"])
    errs = [abs(r["calibrated_s"] / r["published_s"] - 1) for r in held]
    assert np.median(errs) == pytest.approx(doc["fitted"]["held_out"]["median_abs_error"])


def test_published_memory_rows_compare_like_with_like():
    """Every published peak is held against a prediction of the same kind (a reserved figure
    against the allocator's reserved bytes of the predicted peak), each within 10 %; the
    reserved ratio the library prices with is the one fitted on the fit split's rows alone."""
    from pathlib import Path

    from tensoropt.allocator import RESERVED_OVER_ALLOCATED, reserved_bytes
    from tensoropt.hardware import get_device

    doc = json.loads((Path(__file__).parents[1] / "data" / "validation" / "published.json").read_text())
    rows = {r["case_id"]: r for r in doc["cases"]}
    memory, fit = doc["memory"], doc["memory_fit"]
    assert memory and {m["published_kind"] for m in memory} <= {"reserved", "allocated"}
    for m in memory:
        case = rows[m["case_id"]]
        assert case["published_memory_bytes"] == m["published_bytes"]
        assert m["predicted_peak_bytes"] == case["predicted_peak_bytes"]
        if m["published_kind"] == "reserved":
            device = get_device(case["devices"].split("x")[-1])
            assert m["predicted_bytes"] == pytest.approx(reserved_bytes(m["predicted_peak_bytes"], device))
        assert abs(m["predicted_bytes"] / m["published_bytes"] - 1) <= 0.10, m["case_id"]
    fit_on = [m for m in memory if m["case_id"] in fit["fitted_on"]]
    assert fit_on and all(rows[m["case_id"]]["role"] == "fit" for m in fit_on)
    assert fit["held_out"] and not set(fit["held_out"]) & set(fit["fitted_on"])
    ratios = sorted(m["published_bytes"] / m["predicted_peak_bytes"] for m in fit_on)
    assert round(float(np.median(ratios)), 4) == RESERVED_OVER_ALLOCATED == fit["priced_with"]
