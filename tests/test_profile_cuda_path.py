"""The CUDA + NCCL branch of ``tensoropt profile``, run on CPU.

``torch.cuda`` is replaced by a recording fake (a named GPU, events that time the CPU work,
synchronisation and memory queries that log the device they were asked about), the operator
benchmarks' device by the CPU, and torchrun by a recorder that returns collective timings
of known α and B. What runs is the production code of the CUDA branch: device checks, the
dtypes and TF32 switching, event timing, the torchrun launch for NCCL, the fits, the saved
JSON and the cost model reading it. The worker's NCCL set-up is called with a recording
``torch.cuda.set_device`` and ``init_process_group``. On a GPU machine,
tests/test_profile.py::test_quick_profile_cuda runs the real thing.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings

import pytest
import torch

from tensoropt.collectives import COLLECTIVE_KINDS, CollectiveModel
from tensoropt.hardware import get_device
from tensoropt.launch import TorchrunResult
from tensoropt.profile import DeviceNotPresentError, Profile, parse_device_set
from tensoropt.profile import _collective_worker as worker
from tensoropt.profile import measure
from tensoropt.profile import run as run_mod
from tensoropt.profile.cli import main as cli_main
from tensoropt.profile.devices import DeviceSet, catalogue_entry, gpu_name_matches

H100_NAME = "NVIDIA H100 80GB HBM3"          # torch.cuda.get_device_name() on an H100 SXM
ALPHA_S, BANDWIDTH = 8e-6, 1.2e11            # what the fake NCCL collectives take
STAND_IN = torch.device("cpu")               # where the "GPU" benchmarks' tensors live here


def _has_new_tf32_api() -> bool:
    try:
        torch.backends.cuda.matmul.fp32_precision
    except AttributeError:
        return False
    return True


needs_new_tf32_api = pytest.mark.skipif(not _has_new_tf32_api(), reason="torch < 2.9 has no fp32_precision")


# ------------------------------------------------------------------------------ fakes

class FakeCuda:
    """Stands in for ``torch.cuda``: records every synchronisation, event and memory query."""

    def __init__(self, names: list[str]):
        self.names = names
        self.log: list[tuple] = []          # ("sync", device) / ("record", stream device) / ("call",)
        self.elapsed_reads = 0
        self.empty_cache_calls = 0
        self.mem_queries: list = []
        self.fixed_ms: float | None = None  # elapsed_time's answer; None = the real CPU time
        fake = self

        class Stream:
            def __init__(self, device):
                self.device = device

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing, "an event without timing cannot be read"
                self.t = None

            def record(self, stream=None):
                assert stream is not None, "events must be recorded on the benchmark device's stream"
                fake.log.append(("record", stream.device))
                self.t = time.perf_counter()

            def elapsed_time(self, end):
                assert self.t is not None and end.t is not None
                # the work between the events is only done once the device was synchronised
                assert fake.log[-1][0] == "sync", f"event read before a synchronize: {fake.log[-3:]}"
                fake.elapsed_reads += 1
                return fake.fixed_ms if fake.fixed_ms is not None else (end.t - self.t) * 1e3

        self.Stream, self.Event = Stream, Event

    def install(self, monkeypatch):
        c = torch.cuda
        monkeypatch.setattr(c, "is_available", lambda: True)
        monkeypatch.setattr(c, "device_count", lambda: len(self.names))
        monkeypatch.setattr(c, "get_device_name", lambda device=None: self.names[0 if device is None else int(device)])
        monkeypatch.setattr(c, "synchronize", lambda device=None: self.log.append(("sync", device)))
        monkeypatch.setattr(c, "current_stream", lambda device=None: self.Stream(device))
        monkeypatch.setattr(c, "Event", self.Event)
        monkeypatch.setattr(c, "mem_get_info", self._mem_get_info)
        monkeypatch.setattr(c, "empty_cache", self._empty_cache)
        return self

    def _mem_get_info(self, device=None):
        self.mem_queries.append(device)
        return 40 * 2 ** 30, 80 * 2 ** 30

    def _empty_cache(self):
        self.empty_cache_calls += 1


class FakeTorchrun:
    """Records each launch; answers as rank 0 of the worker would, with α-β times."""

    def __init__(self):
        self.launches: list[dict] = []

    def __call__(self, script, args, *, nproc, timeout, **kw):
        a = worker.parse_args(list(map(str, args)))      # the worker must accept what it is given
        self.launches.append({"script": script, "args": a, "nproc": nproc})
        model = CollectiveModel()
        results = []
        for kind in a.kinds.split(","):
            p = 2 if kind == "send_recv" else nproc
            for n in map(int, a.sizes.split(",")):
                t = model.raw_time_s(kind, n, p, ALPHA_S, BANDWIDTH)
                results.append({"kind": kind, "group_size": p, "nbytes": n,
                                "samples_s": [t * f for f in (0.99, 1.0, 1.0, 1.01, 1.02)]})
        return TorchrunResult(0, "", "", False, results)


@pytest.fixture
def tf32_state():
    """Leaves torch's TF32 state as it was (legacy and fp32_precision) after the test."""
    mm = torch.backends.cuda.matmul
    new = mm.fp32_precision if _has_new_tf32_api() else None
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:
        legacy = None
    yield mm
    mm.allow_tf32 = False
    if legacy is not None:
        torch.set_float32_matmul_precision(legacy)
    if new is not None:
        mm.fp32_precision = new


def _fake_gpu_profile_env(monkeypatch, names, *, families=("linear", "matmul", "norm", "elementwise")):
    """Fake CUDA + torchrun, the benchmarks on CPU tensors, a small sweep; returns the recorders."""
    fake = FakeCuda(names).install(monkeypatch)
    launcher = FakeTorchrun()
    monkeypatch.setattr(run_mod, "run_torchrun", launcher)
    seen = {"bench_device": [], "is_cuda": [], "op_itemsize": [], "op_kinds": [], "peak_kinds": [], "peak_runs": []}

    real_bench_device = run_mod._bench_device

    def bench_device(ds):
        seen["bench_device"].append(real_bench_device(ds))   # what production would use
        return STAND_IN

    def is_cuda(device):
        seen["is_cuda"].append(device)
        return device == STAND_IN

    real_ops, real_square, real_aligns = run_mod.op_cases, run_mod._square, run_mod.alignment_cases

    def op_cases(itemsize, quick, kind="cpu"):
        seen["op_itemsize"].append(itemsize)
        seen["op_kinds"].append(kind)
        return [c for c in real_ops(itemsize, quick, kind) if c.family in families and c.alloc_bytes < 2 ** 22]

    def alignment_cases(itemsize, quick):
        # the same probes at a size the CPU stand-in times in milliseconds
        from tensoropt.profile.ops import linear_builder

        out = []
        for c in real_aligns(itemsize, quick):
            n = c.shape[2] - c.shape[1] + 32
            out.append(dataclasses.replace(c, shape=(64, 32, n), flops=2.0 * 64 * 32 * n,
                                           build=linear_builder(64, 32, n, True)))
        return out

    def peak_cases(quick, kind="cpu"):
        seen["peak_kinds"].append(kind)
        return [48]

    def square(n, dtype):
        case = real_square(n, dtype)

        def build(device, torch_dtype):
            fn = case.build(device, torch_dtype)

            def timed():
                seen["peak_runs"].append((dtype, torch_dtype, torch.backends.cuda.matmul.allow_tf32))
                return fn()
            return timed
        return dataclasses.replace(case, build=build)

    monkeypatch.setattr(run_mod, "_bench_device", bench_device)
    monkeypatch.setattr(run_mod, "_is_cuda", is_cuda)
    monkeypatch.setattr(run_mod, "op_cases", op_cases)
    monkeypatch.setattr(run_mod, "peak_cases", peak_cases)
    monkeypatch.setattr(run_mod, "_square", square)
    monkeypatch.setattr(run_mod, "alignment_cases", alignment_cases)
    monkeypatch.setitem(run_mod._STREAM_BYTES_QUICK, "cuda", 2 ** 20)
    return fake, launcher, seen


# ------------------------------------------------------------------------------ the whole CUDA branch

@needs_new_tf32_api
def test_cuda_profile_flow_on_cpu(tmp_path, monkeypatch, tf32_state):
    fake, launcher, seen = _fake_gpu_profile_env(monkeypatch, [H100_NAME, H100_NAME])
    # the caller enabled TF32 through the torch >= 2.9 API only: reading the legacy flag raises
    tf32_state.fp32_precision = "tf32"
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        tf32_state.allow_tf32

    path = tmp_path / "h100.json"
    prof = run_mod.profile("cuda:2", out=path, quick=True, progress=False)

    # production would put the benchmarks on the first GPU; they ran on the stand-in alone
    assert seen["bench_device"] == [torch.device("cuda", 0)]
    assert set(seen["is_cuda"]) == {STAND_IN}
    assert seen["op_itemsize"] == [2] and set(seen["peak_kinds"]) == {"cuda"}   # bf16 sweep, GPU peak sizes
    assert seen["op_kinds"] == ["cuda"]

    # the alignment probes: one aligned and three misaligned last dimensions, their rates
    # against the aligned one by alignment in bytes (2, 4, 8 for 1, 2, 4 bf16 elements)
    probes = [m for m in prof.compute_measurements if m.family == "alignment"]
    assert sorted(m.shape[2] % 8 for m in probes) == [0, 1, 2, 4]
    assert set(prof.misaligned_efficiency) == {"2", "4", "8"}
    assert all(0 < f <= 1 for f in prof.misaligned_efficiency.values())

    # timing: CUDA events on the benchmark device's stream, that device synchronised
    assert fake.log and {d for op, d in fake.log if op in ("sync", "record")} == {STAND_IN}
    assert fake.elapsed_reads == sum(m.time.repeats for m in prof.compute_measurements)
    assert fake.mem_queries and set(fake.mem_queries) == {STAND_IN}
    assert fake.empty_cache_calls == len(prof.compute_measurements)

    # dtypes: the sweep in bf16, the peak probe in every CUDA dtype; TF32 only for tf32
    assert prof.dtype == "bf16"
    assert {m.dtype for m in prof.compute_measurements if m.family != "peak"} == {"bf16"}
    assert {m.dtype for m in prof.compute_measurements if m.family == "peak"} == {"fp32", "tf32", "bf16", "fp16"}
    assert set(prof.peak_flops_per_s) == {"fp32", "tf32", "bf16", "fp16"}
    runs = {(dt, tdt, tf32) for dt, tdt, tf32 in seen["peak_runs"]}
    assert runs == {("fp32", torch.float32, False), ("tf32", torch.float32, True),
                    ("bf16", torch.bfloat16, False), ("fp16", torch.float16, False)}
    # ... and the caller's TF32 setting is back
    assert tf32_state.fp32_precision == "tf32"

    # collectives: one torchrun launch of the worker on 2 GPUs with the NCCL backend, every kind
    assert len(launcher.launches) == 1
    launch = launcher.launches[0]
    assert launch["script"] == run_mod._WORKER and launch["nproc"] == 2
    assert launch["args"].backend == "nccl"
    assert launch["args"].kinds.split(",") == list(COLLECTIVE_KINDS)
    assert [int(s) for s in launch["args"].sizes.split(",")] == list(run_mod._MESSAGE_SIZES_QUICK)
    for kind in COLLECTIVE_KINDS:
        fit = prof.collectives[kind]
        assert fit.latency_s == pytest.approx(ALPHA_S, rel=0.05), kind
        assert fit.bandwidth_bytes_per_s == pytest.approx(BANDWIDTH, rel=0.05), kind

    # the saved JSON
    d = json.loads(path.read_text())
    m = d["machine"]
    assert (m["device_kind"], m["device_name"], m["device_count"], m["backend"]) == ("cuda", H100_NAME, 2, "nccl")
    assert m["catalogue_device"] == "H100"
    assert m["link"] == get_device("H100").intra_link_name and m["link"].startswith("nvlink")
    assert d["devices"] == "cuda:2" and d["dtype"] == "bf16"
    assert set(d["peak_flops_per_s"]) == {"fp32", "tf32", "bf16", "fp16"}

    # the cost model reads it: no mismatch warning here (same fake GPU), measured figures used
    from tensoropt.mesh import Mesh, parse_devices
    from tensoropt.pricing import cost_models
    from tensoropt.training import TrainingConfig
    cluster = parse_devices("2xH100")
    mesh = Mesh((2,), ("dp",), (cluster.intra_link,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cm = cost_models(cluster, TrainingConfig("bf16-mixed", "adam"), str(path))(mesh)
    assert cm.device.peak_flops("bf16") == prof.peak_flops_per_s["bf16"]
    assert cm.device.peak_flops("tf32") == prof.peak_flops_per_s["tf32"]
    assert cm.device.hbm_bytes_per_s == prof.hbm_bytes_per_s
    assert dict(cm.compute.misaligned_efficiency) == {int(a): f for a, f in prof.misaligned_efficiency.items()}
    link = cluster.intra_link
    n = 2 ** 20
    assert cm.collectives.raw_time_s("all_reduce", n, 2, link.latency_s, link.bandwidth_bytes_per_s) == \
        pytest.approx(CollectiveModel().raw_time_s("all_reduce", n, 2, ALPHA_S, BANDWIDTH), rel=0.05)


def test_cli_single_named_gpu(tmp_path, monkeypatch, capsys, tf32_state):
    _, launcher, _ = _fake_gpu_profile_env(monkeypatch, [H100_NAME], families=("norm", "elementwise"))
    path = tmp_path / "one.json"
    assert cli_main(["--devices", "1xH100", "--out", str(path), "--quick", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "catalogue H100" in out and H100_NAME in out
    assert launcher.launches == []                   # one GPU: no collectives to launch
    prof = Profile.load(path)
    assert prof.machine.catalogue_device == "H100" and prof.machine.device_count == 1
    assert prof.machine.link == "" and not prof.collectives
    assert any("single rank" in n for n in prof.notes)


def test_group_sizes_per_gpu_count():
    ds = lambda n: DeviceSet("cuda", n, "", f"cuda:{n}")   # noqa: E731
    assert run_mod._group_sizes(ds(1), False) == []
    assert run_mod._group_sizes(ds(2), False) == [2]
    assert run_mod._group_sizes(ds(6), False) == [2, 4, 6]
    assert run_mod._group_sizes(ds(8), False) == [2, 4, 8]
    assert run_mod._group_sizes(ds(8), True) == [2]


def test_benchmark_device_and_backend():
    cuda = DeviceSet("cuda", 4, "", "cuda:4")
    assert run_mod._bench_device(cuda) == torch.device("cuda", 0) and cuda.backend == "nccl"
    cpu = parse_device_set("cpu:2")
    assert run_mod._bench_device(cpu) == torch.device("cpu") and cpu.backend == "gloo"
    assert run_mod._is_cuda(torch.device("cuda", 1)) and not run_mod._is_cuda(torch.device("cpu"))


# ------------------------------------------------------------------------------ timing

def test_cuda_timer_uses_events_and_the_given_device(monkeypatch):
    fake = FakeCuda([H100_NAME]).install(monkeypatch)
    fake.fixed_ms = 6.0                     # every repeat's events say 6 ms
    dev = torch.device("cuda", 1)           # not the current device: must be named everywhere
    calls = []
    stats = measure.time_fn(lambda: calls.append(1), cuda=True, budget=measure.QUICK_BUDGET, device=dev)
    per_call = 6.0e-3 / stats.calls_per_repeat
    assert stats.median_s == pytest.approx(per_call) and stats.min_s == stats.max_s == pytest.approx(per_call)
    assert fake.elapsed_reads == stats.repeats
    assert {d for _, *rest in fake.log for d in rest} == {dev}
    # per repeat: synchronize, record start, ..., record end, synchronize, then read
    recs = [i for i, e in enumerate(fake.log) if e[0] == "record"]
    assert len(recs) == 2 * stats.repeats
    for start, end in zip(recs[::2], recs[1::2]):
        assert fake.log[start - 1][0] == "sync" and fake.log[end + 1][0] == "sync"


@needs_new_tf32_api
@pytest.mark.parametrize("caller", ["default", "legacy-on", "new-api-on"])
@pytest.mark.parametrize("enabled", [False, True])
def test_tf32_switch_restores_the_callers_state(tf32_state, caller, enabled):
    mm = tf32_state
    if caller == "legacy-on":
        mm.allow_tf32 = True
    elif caller == "new-api-on":
        mm.fp32_precision = "tf32"
    before = mm.fp32_precision
    with run_mod._cuda_matmul_tf32(enabled):
        assert mm.allow_tf32 is enabled
        assert mm.fp32_precision == ("tf32" if enabled else "ieee")
    assert mm.fp32_precision == before
    if caller == "legacy-on":
        assert mm.allow_tf32 is True and torch.get_float32_matmul_precision() == "high"


# ------------------------------------------------------------------------------ the NCCL worker

def test_worker_nccl_setup_binds_the_local_rank_gpu(monkeypatch):
    calls = []
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("sync", device)))
    monkeypatch.setattr(worker.dist, "init_process_group", lambda backend, **kw: calls.append(("init", backend, kw)))
    gpu3 = torch.device("cuda", 3)
    device, sync = worker.setup("nccl")
    assert device == gpu3
    assert calls == [("set_device", gpu3), ("init", "nccl", {"device_id": gpu3})]
    sync()
    assert calls[-1] == ("sync", gpu3)
    calls.clear()
    device, sync = worker.setup("gloo")
    assert device == torch.device("cpu") and calls == [("init", "gloo", {})]


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_worker_buffers_on_the_rank_device(kind):
    dev = torch.device("meta")             # allocates nothing; stands for cuda:LOCAL_RANK
    fn, numel = worker._ops(kind, 65536, 4, 0, dev)
    tensors = [c.cell_contents for c in fn.__closure__ or () if isinstance(c.cell_contents, torch.Tensor)]
    assert tensors and all(t.device == dev for t in tensors)
    assert numel * worker._ITEMSIZE == 65536


def test_worker_accepts_only_known_backends():
    assert worker.parse_args(["--backend", "nccl", "--sizes", "4096", "--kinds", "all_reduce"]).backend == "nccl"
    with pytest.raises(SystemExit):
        worker.parse_args(["--backend", "ncl", "--sizes", "4096", "--kinds", "all_reduce"])


# ------------------------------------------------------------------------------ device sets and names

@pytest.mark.parametrize("name, entry", [
    (H100_NAME, "H100"), ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("Tesla V100-SXM2-16GB", "V100-16GB"),
    ("NVIDIA GH200 480GB", ""),            # "h200" is inside a word, not a word
    ("NVIDIA H100 PCIe", ""),              # the catalogue's H100 is the NVLink (SXM) part
    ("NVIDIA A100-PCIE-40GB", ""), ("Tesla T4", ""),
])
def test_catalogue_entry_of_cuda_names(name, entry):
    assert catalogue_entry(name) == entry


def test_named_gpu_sets(monkeypatch):
    fake = FakeCuda([H100_NAME, H100_NAME]).install(monkeypatch)
    for spec in ("1xH100", "2xH100", "H100-SXM", "2xh100-80gb", "cuda", "cuda:2"):
        ds = parse_device_set(spec)
        assert ds.kind == "cuda" and ds.backend == "nccl"
    assert parse_device_set("2xH100").count == 2
    with pytest.raises(DeviceNotPresentError, match=r"asks for H200, but GPU 0 here is 'NVIDIA H100 80GB HBM3' "
                                                    r"\(catalogue entry H100\)"):
        parse_device_set("1xH200")
    with pytest.raises(DeviceNotPresentError, match="needs 4 GPUs, this machine has 2"):
        parse_device_set("4xH100")
    with pytest.raises(DeviceNotPresentError, match="needs 3 GPUs"):
        parse_device_set("cuda:3")
    fake.names = [H100_NAME, "NVIDIA A100-SXM4-80GB"]       # a mixed machine: every named GPU is checked
    parse_device_set("1xH100")
    with pytest.raises(DeviceNotPresentError, match="GPU 1 here is 'NVIDIA A100-SXM4-80GB'"):
        parse_device_set("2xH100")
    fake.names = ["NVIDIA A100-SXM4-40GB"]
    parse_device_set("1xA100-40GB")
    with pytest.raises(DeviceNotPresentError, match="A100-80GB.*catalogue entry A100-40GB"):
        parse_device_set("1xA100-80GB")


def test_gpu_name_matching_outside_the_catalogue():
    assert gpu_name_matches("T4", "Tesla T4")
    assert gpu_name_matches("RTX4090", "NVIDIA GeForce RTX 4090")
    assert gpu_name_matches("H100", "NVIDIA H100 PCIe")          # no entry for the board: by name
    assert not gpu_name_matches("H200", "NVIDIA GH200 480GB")
    assert not gpu_name_matches("H100", "NVIDIA H800")


def test_cli_errors_are_actionable(tmp_path, monkeypatch, capsys):
    out = tmp_path / "x.json"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli_main(["--devices", "cuda", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs CUDA" in err and "sees no CUDA device" in err and "'cpu:N'" in err
    FakeCuda(["NVIDIA H200"]).install(monkeypatch)
    assert cli_main(["--devices", "1xH100", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "asks for H100" in err and "'NVIDIA H200'" in err and "catalogue entry H200" in err
    assert "use 'cuda:N'" in err
    assert not out.exists()


def test_a_profile_of_another_gpu_warns_where_it_prices(tmp_path):
    import dataclasses

    from tensoropt.mesh import parse_devices
    from tensoropt.pricing import cost_models
    from tensoropt.profile.data import Profile
    from tensoropt.training import TrainingConfig

    prof = Profile.load("data/profiles/cpu-2core.json")
    gpu = dataclasses.replace(prof, machine=dataclasses.replace(prof.machine, device_kind="cuda",
                                                                catalogue_device="H100"))
    path = tmp_path / "h100.json"
    gpu.save(path)
    with pytest.warns(UserWarning, match="measured on H100, and the devices are A100-80GB"):
        cost_models(parse_devices("1xA100-80GB"), TrainingConfig(), str(path))
