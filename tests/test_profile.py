"""tensoropt.profile: fits recover known parameters, Profile JSON I/O, failure handling, a real quick run."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from types import MappingProxyType

import numpy as np
import pytest
import torch

from tensoropt.collectives import COLLECTIVE_KINDS, CollectiveModel
from tensoropt.compute import ComputeModel, EfficiencyCurve
from tensoropt.hardware import get_device, get_link
from tensoropt.profile import (CollectivePoint, ComputePoint, DeviceNotPresentError, FitError, MachineInfo, Profile,
                               ProfileError, ProfileMismatchWarning, fit_collective, fit_efficiency_curve,
                               parse_device_set, profile)
from tensoropt.profile import run as run_mod
from tensoropt.profile.data import CollectiveMeasurement, ComputeMeasurement, TimeStats
from tensoropt.profile.devices import current_device_name
from tensoropt.profile.fit import collective_factors, curve_time_s
from tensoropt.profile.measure import stats_from_samples

REL_TOL = 0.02
NOISE_SIGMA = 0.005          # mild multiplicative (log-normal) noise on synthetic times
PEAK_FLOPS = 6e10
HBM_BYTES_PER_S = 2.5e10


def _device(peak=PEAK_FLOPS, hbm=HBM_BYTES_PER_S):
    return dataclasses.replace(get_device("cpu"), peak_flops_per_s=MappingProxyType({"fp32": peak}),
                               hbm_bytes_per_s=hbm)


def _gemm_points(curve: EfficiencyCurve, seed: int, sigma: float = NOISE_SIGMA) -> list[ComputePoint]:
    """GEMMs and GEMVs from tiny to large, timed by the real ComputeModel with known parameters.

    The sweep covers the ramp (F near flops_half) and memory-bound GEMVs whose time the overhead
    visibly shifts: without both, the form's parameters are not identifiable (see fit.py).
    """
    rng = np.random.default_rng(seed)
    model = ComputeModel(curves={"linear": curve}, memory_efficiency=1.0)
    dev = _device()
    pts = []
    for n in np.geomspace(8, 4096, 40).astype(int):
        for m in (1, 2, int(n)):
            flops, nbytes = 2.0 * m * n * n, 4.0 * (m * n + n * n + m * n)
            t = model.time_s("linear", flops, nbytes, dev) * math.exp(rng.normal(0.0, sigma))
            pts.append(ComputePoint(flops, nbytes, t))
    return pts


# ------------------------------------------------------------------------------ compute fit

@pytest.mark.parametrize("curve", [EfficiencyCurve(0.7, 5e5, 2e-5), EfficiencyCurve(0.9, 2e6, 5e-5),
                                   EfficiencyCurve(0.4, 2e5, 1e-5)])
@pytest.mark.parametrize("seed", [0, 1])
def test_efficiency_curve_recovered_within_2_percent(curve, seed):
    fit = fit_efficiency_curve(_gemm_points(curve, seed), PEAK_FLOPS, HBM_BYTES_PER_S)
    assert fit.eff_max == pytest.approx(curve.eff_max, rel=REL_TOL)
    assert fit.flops_half == pytest.approx(curve.flops_half, rel=REL_TOL)
    assert fit.overhead_s == pytest.approx(curve.overhead_s, rel=REL_TOL)
    assert fit.overhead_resolved
    assert fit.rel_error_median < 3 * NOISE_SIGMA


def test_efficiency_curve_exact_without_noise():
    curve = EfficiencyCurve(0.55, 8e5, 3e-5)
    fit = fit_efficiency_curve(_gemm_points(curve, 0, sigma=0.0), PEAK_FLOPS, HBM_BYTES_PER_S)
    assert (fit.eff_max, fit.flops_half, fit.overhead_s) == pytest.approx(
        (curve.eff_max, curve.flops_half, curve.overhead_s), rel=1e-6)


def test_degenerate_forms_resolve_canonically():
    # never memory-bound: overhead and flops_half trade off exactly -> overhead 0, same times
    curve = EfficiencyCurve(0.8, 1e6, 1e-5)
    model = ComputeModel(curves={"conv": curve}, memory_efficiency=1.0)
    pts = [ComputePoint(f, 1.0, model.time_s("conv", f, 1.0, _device())) for f in np.geomspace(1e4, 1e11, 30)]
    fit = fit_efficiency_curve(pts, PEAK_FLOPS, HBM_BYTES_PER_S)
    assert fit.overhead_s == 0.0 and not fit.overhead_resolved
    assert fit.eff_max == pytest.approx(0.8, rel=1e-4)
    assert fit.rel_error_max < 1e-4
    # never compute-bound (copy-like ops of several FLOP/byte ratios; with a single ratio the
    # compute term could mimic the memory term): eff_max 1, flops_half 0, overhead from the memory term
    pts = [ComputePoint(b * ratio, b, 7e-6 + b / HBM_BYTES_PER_S)
           for b in np.geomspace(1e3, 1e9, 25) for ratio in (1 / 2, 1 / 8, 1 / 32)]
    fit = fit_efficiency_curve(pts, PEAK_FLOPS, HBM_BYTES_PER_S)
    assert (fit.eff_max, fit.flops_half) == (1.0, 0.0)
    assert fit.overhead_s == pytest.approx(7e-6, rel=1e-4)
    # no arithmetic at all (embedding)
    pts = [ComputePoint(0.0, b, 4e-6 + b / HBM_BYTES_PER_S) for b in np.geomspace(1e3, 1e8, 10)]
    fit = fit_efficiency_curve(pts, PEAK_FLOPS, HBM_BYTES_PER_S)
    assert fit.overhead_s == pytest.approx(4e-6, rel=1e-4)


def test_fit_rejects_bad_input():
    with pytest.raises(FitError):
        fit_efficiency_curve([], PEAK_FLOPS, HBM_BYTES_PER_S)
    with pytest.raises(FitError):
        fit_efficiency_curve([ComputePoint(1e6, 1e3, 0.0)], PEAK_FLOPS, HBM_BYTES_PER_S)


def test_fitted_curves_monotone_and_positive():
    for curve in (EfficiencyCurve(0.7, 5e5, 2e-5), EfficiencyCurve(0.3, 3e7, 0.0)):
        fit = fit_efficiency_curve(_gemm_points(curve, 3), PEAK_FLOPS, HBM_BYTES_PER_S)
        _assert_monotone(fit, PEAK_FLOPS, HBM_BYTES_PER_S)


def _assert_monotone(fit, peak, hbm):
    flops = np.geomspace(1.0, 1e13, 200)
    eff = np.array([fit.curve().efficiency(f) for f in flops])
    assert np.all(eff > 0) and np.all(np.diff(eff) >= 0) and np.all(eff <= 1.0)
    for bytes_per_flop in (0.0, 0.01, 1.0, 100.0):
        t = curve_time_s(flops, flops * bytes_per_flop, fit.eff_max, fit.flops_half, fit.overhead_s, peak, hbm)
        assert np.all(t > 0) and np.all(np.diff(t) >= 0)


# ------------------------------------------------------------------------------ collective fit

@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_collective_alpha_beta_recovered_within_2_percent(kind):
    latency_s, bandwidth = 7e-4, 1.1e9
    rng = np.random.default_rng(hash(kind) % 2 ** 32)
    link = get_link("gloo-loopback")
    model = CollectiveModel()
    groups = (2,) if kind == "send_recv" else (2, 4)
    pts = []
    for p in groups:
        for n in (4096 * 4 ** i for i in range(7)):
            t = model.raw_time_s(kind, n, p, latency_s, bandwidth) * math.exp(rng.normal(0.0, NOISE_SIGMA))
            pts.append(CollectivePoint(p, n, t))
    fit = fit_collective(kind, pts)
    assert fit.latency_s == pytest.approx(latency_s, rel=REL_TOL)
    assert fit.bandwidth_bytes_per_s == pytest.approx(bandwidth, rel=REL_TOL)
    assert [g.group_size for g in fit.per_group] == list(groups)
    for g in fit.per_group:
        assert g.latency_s == pytest.approx(latency_s, rel=0.05)
        assert g.bandwidth_bytes_per_s == pytest.approx(bandwidth, rel=0.05)
    # relative to a link: the calibrated model reproduces the measured α and B
    prof = _synthetic_profile(collectives={kind: fit})
    cal = prof.collective_model(link)
    for p in groups:
        assert cal.raw_time_s(kind, 2 ** 20, p, link.latency_s, link.bandwidth_bytes_per_s) == pytest.approx(
            model.raw_time_s(kind, 2 ** 20, p, fit.latency_s, fit.bandwidth_bytes_per_s), rel=1e-12)


def test_collective_factors_follow_collectives_module():
    assert collective_factors("all_reduce", 4) == pytest.approx((6.0, 1.5))
    assert collective_factors("all_gather", 2) == pytest.approx((1.0, 0.5))
    assert collective_factors("send_recv", 8) == pytest.approx((1.0, 1.0))
    with pytest.raises(FitError):
        fit_collective("all_reduce", [CollectivePoint(2, 4096, 1e-3)])
    with pytest.raises(FitError, match="two distinct"):
        fit_collective("all_reduce", [CollectivePoint(2, 4096, 1e-3), CollectivePoint(2, 4096, 1.1e-3)])


# ------------------------------------------------------------------------------ Profile I/O

def _machine(**over) -> MachineInfo:
    base = dict(platform="Linux-test", processor="test cpu", cpu_count=2, threads_per_rank=1,
                torch_version=torch.__version__, python_version="3.x", device_kind="cpu",
                device_name=current_device_name("cpu"), device_count=2, date="2025-01-01T00:00:00+00:00",
                backend="gloo")
    base.update(over)
    return MachineInfo(**base)


def _synthetic_profile(collectives=None, machine=None) -> Profile:
    curve = fit_efficiency_curve(_gemm_points(EfficiencyCurve(0.7, 5e5, 2e-5), 0), PEAK_FLOPS, HBM_BYTES_PER_S)
    stats = stats_from_samples([1.1e-3, 1.0e-3, 1.3e-3, 0.1 + 1 / 3], calls_per_repeat=7)
    if collectives is None:
        pts = [CollectivePoint(2, n, 7e-4 * 2 + n / 1e9) for n in (4096, 65536, 2 ** 20)]
        collectives = {"all_reduce": fit_collective("all_reduce", pts)}
    return Profile(
        devices="cpu:2", quick=True, dtype="fp32", machine=machine or _machine(),
        peak_flops_per_s={"fp32": PEAK_FLOPS, "bf16": 1.2345678901234567e11}, hbm_bytes_per_s=HBM_BYTES_PER_S,
        memory_efficiency=1.0, curves={"linear": curve, "elementwise": dataclasses.replace(curve, eff_max=0.1)},
        collectives=collectives,
        compute_measurements=(ComputeMeasurement("linear", "linear_fwd", (3, 4, 5), "fp32", 120.0, 188.0, 1, stats),),
        collective_measurements=(CollectiveMeasurement("all_reduce", 2, 4096.0, stats),),
        notes=("a note",))


def test_json_round_trip_exact(tmp_path):
    prof = _synthetic_profile()
    again = Profile.from_json(prof.to_json())
    assert again == prof
    assert again.to_json() == prof.to_json()
    path = prof.save(tmp_path / "sub" / "p.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = Profile.load(path)
    assert loaded == prof
    assert loaded.compute_measurements[0].time.q75_s == prof.compute_measurements[0].time.q75_s
    assert [p.name for p in tmp_path.joinpath("sub").iterdir()] == ["p.json"]   # no temp file left


def test_models_from_profile():
    prof = _synthetic_profile()
    cm = prof.compute_model()
    assert cm.curve("linear") == prof.curves["linear"].curve()
    assert cm.curve("pool") == prof.curves["elementwise"].curve()      # unmeasured family: elementwise curve
    dev = prof.device(get_device("cpu"))
    assert dev.peak_flops("fp32") == PEAK_FLOPS and dev.peak_flops("bf16") == prof.peak_flops_per_s["bf16"]
    assert dev.hbm_bytes_per_s == HBM_BYTES_PER_S and not dev.placeholder
    c = prof.curves["linear"]
    for f, b in ((1e5, 1e6), (1e9, 1e6)):
        assert cm.time_s("linear", f, b, dev) == pytest.approx(
            float(curve_time_s(f, b, c.eff_max, c.flops_half, c.overhead_s, PEAK_FLOPS, HBM_BYTES_PER_S)))
    h100 = prof.device(get_device("H100"))   # unmeasured dtypes keep the base ratio to fp32
    assert h100.peak_flops("tf32") == pytest.approx(PEAK_FLOPS * 4.947e14 / 6.69e13)
    link = prof.link()
    assert link.latency_s == prof.collectives["all_reduce"].latency_s


def test_mismatch_warns_naming_both(tmp_path):
    prof = _synthetic_profile(machine=_machine(torch_version="1.0.0-old", device_name="Imaginary GPU 9000"))
    path = prof.save(tmp_path / "p.json")
    with pytest.warns(ProfileMismatchWarning) as rec:
        Profile.load(path)
    text = " | ".join(str(w.message) for w in rec)
    assert "1.0.0-old" in text and torch.__version__ in text
    assert "Imaginary GPU 9000" in text and current_device_name("cpu") in text


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json.*python -m tensoropt.profile"):
        Profile.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(ValueError, match="bad.json.*not a valid"):
        Profile.load(bad)
    good = json.loads(_synthetic_profile().to_json())
    for mutate in (lambda d: d.pop("curves"), lambda d: d.update(schema_version=99),
                   lambda d: d["curves"]["linear"].update(eff_max="high"),
                   lambda d: d["curves"]["linear"].update(eff_max=3.0)):
        d = json.loads(json.dumps(good))
        mutate(d)
        bad.write_text(json.dumps(d))
        with pytest.raises(ValueError, match="bad.json"):
            Profile.load(bad)


def test_failed_save_keeps_existing_file(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    path.write_text("GOOD")
    prof = _synthetic_profile()
    monkeypatch.setattr(Profile, "to_json", lambda self: (_ for _ in ()).throw(RuntimeError("disk full")))
    with pytest.raises(RuntimeError):
        prof.save(path)
    assert path.read_text() == "GOOD"
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


def test_failed_run_does_not_overwrite(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    path.write_text("GOOD")

    def boom(*a, **k):
        raise ProfileError("collective benchmark failed (simulated)")
    monkeypatch.setattr(run_mod, "_run_collectives", boom)
    few = [c for c in run_mod.op_cases(4, True) if c.family == "reduction"]    # keep it short
    monkeypatch.setattr(run_mod, "op_cases", lambda itemsize, quick, kind="cpu": few)
    with pytest.raises(ProfileError, match="simulated"):
        profile("cpu:2", out=path, quick=True, progress=False)
    assert path.read_text() == "GOOD"


def test_unallocatable_sizes_skipped_then_clear_error(tmp_path, monkeypatch):
    from tensoropt.profile.ops import OpCase
    notes = []

    def oom_build(device, dtype):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 TiB")
    case = OpCase("norm", "layer_norm", (1, 1), 1.0, 1.0, 1, 1.0, oom_build)
    assert run_mod._run_case(case, torch.device("cpu"), "fp32", run_mod.QUICK_BUDGET, notes, lambda s: None) is None
    huge = dataclasses.replace(case, alloc_bytes=1e30)
    assert run_mod._run_case(huge, torch.device("cpu"), "fp32", run_mod.QUICK_BUDGET, notes, lambda s: None) is None
    assert len(notes) == 2 and all("skipped norm" in n for n in notes)
    # nothing can allocate: a clear error, and no file
    monkeypatch.setattr(run_mod, "_available_bytes", lambda device: 0.0)
    with pytest.raises(ProfileError, match="no copy benchmark"):
        profile("cpu:2", out=tmp_path / "p.json", quick=True, progress=False)
    assert not (tmp_path / "p.json").exists()


def test_device_sets():
    ds = parse_device_set("cpu:2")
    assert (ds.kind, ds.count, ds.backend) == ("cpu", 2, "gloo")
    with pytest.raises(ValueError, match="cannot parse"):
        parse_device_set("two potatoes")
    if not torch.cuda.is_available():
        for spec in ("1xH100", "cuda:2", "cuda"):
            with pytest.raises(DeviceNotPresentError, match="CUDA"):
                parse_device_set(spec)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error path")
def test_cli_reports_missing_device(tmp_path, capsys):
    from tensoropt.profile import main
    assert main(["--devices", "1xH100", "--out", str(tmp_path / "x.json")]) == 2
    assert "CUDA" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_time_stats():
    s = stats_from_samples([4.0, 1.0, 3.0, 2.0], calls_per_repeat=2)
    assert (s.min_s, s.max_s, s.median_s, s.repeats) == (1.0, 4.0, 2.5, 4)
    assert s.iqr_s == pytest.approx(1.5)
    assert isinstance(s, TimeStats)


# ------------------------------------------------------------------------------ real runs

def _check_real_profile(prof, tmp_path, kind):
    assert prof.machine.device_kind == kind and prof.machine.torch_version == torch.__version__
    assert prof.peak_flops_per_s[prof.dtype] > 0 and prof.hbm_bytes_per_s > 0
    for fam in ("linear", "matmul", "attention", "conv", "norm", "softmax", "elementwise", "embedding"):
        c = prof.curves[fam]
        assert 0 < c.eff_max <= 1 and c.flops_half >= 0 and c.overhead_s >= 0
        _assert_monotone(c, prof.peak_flops_per_s[prof.dtype], prof.hbm_bytes_per_s)
    for m in prof.compute_measurements:
        assert m.time.min_s <= m.time.q25_s <= m.time.median_s <= m.time.q75_s <= m.time.max_s
    cm = prof.compute_model()
    dev = prof.device(get_device("cpu"))
    assert cm.time_s("linear", 2e9, 1e7, dev) > 0
    path = tmp_path / "p.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Profile.load(prof.save(path)) == prof


@pytest.mark.slow
def test_quick_profile_cpu_end_to_end(tmp_path):
    calls = []
    prof = profile("cpu:2", out=tmp_path / "q.json", quick=True, progress=lambda d, t, label: calls.append((d, t)))
    assert calls and calls[-1][0] == calls[-1][1]        # the progress reached its total
    _check_real_profile(prof, tmp_path, "cpu")
    assert prof.machine.backend == "gloo" and prof.dtype == "fp32"
    # no alignment probe on a CPU, and no alignment penalty in its model
    assert prof.misaligned_efficiency == {} and not prof.compute_model().misaligned_efficiency
    assert not any(m.family == "alignment" for m in prof.compute_measurements)
    # what a step pays besides the kernels, and the curves keyed by operator
    assert prof.op_overhead_s > 0 and prof.update_s_per_param > 0
    assert {"elementwise/gelu", "norm/layer_norm", "attention/scaled_dot_product_attention"} <= set(prof.curves)
    assert not {"framework", "optimizer"} & set(prof.curves)
    assert prof.compute_model().curve("elementwise", "gelu") == prof.curves["elementwise/gelu"].curve()
    assert set(prof.collectives) == set(COLLECTIVE_KINDS)
    assert {m.group_size for m in prof.collective_measurements} == {2}
    link = get_link("gloo-loopback")
    cal = prof.collective_model(link)
    for kind in COLLECTIVE_KINDS:
        fit = prof.collectives[kind]
        assert fit.latency_s >= 0 and fit.bandwidth_bytes_per_s > 0
        assert cal.raw_time_s(kind, 2 ** 20, 2, link.latency_s, link.bandwidth_bytes_per_s) > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_quick_profile_cuda(tmp_path):
    n = torch.cuda.device_count()
    prof = profile(f"cuda:{min(n, 2)}", out=tmp_path / "g.json", quick=True, progress=False)
    _check_real_profile(prof, tmp_path, "cuda")
    # a GPU's matrix units lose speed on a last dimension off 16-byte alignment
    assert set(prof.misaligned_efficiency) == {"2", "4", "8"}
    assert prof.misaligned_efficiency["2"] < 0.9
    assert prof.dtype == "bf16" and prof.machine.device_name == torch.cuda.get_device_name(0)
    assert prof.machine.backend == "nccl"
    if n >= 2:
        assert prof.collectives["all_reduce"].bandwidth_bytes_per_s > 0
    else:
        assert not prof.collectives
    name = torch.cuda.get_device_name(0).split()[-1]
    with pytest.raises(DeviceNotPresentError):
        parse_device_set(f"{n + 1}x{name}")
