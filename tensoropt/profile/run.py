"""``profile()``: benchmark operators and collectives on the devices present, fit, save."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable

from ..collectives import COLLECTIVE_KINDS
from ..launch import run_torchrun
from .data import (CollectiveMeasurement, ComputeMeasurement, FittedCollective, FittedCurve, MachineInfo, Profile)
from .devices import DeviceSet, catalogue_entry, cpu_count, cpu_model_name, current_device_name, parse_device_set
from .fit import CollectivePoint, ComputePoint, FitError, fit_collective, fit_efficiency_curve
from .measure import FULL_BUDGET, QUICK_BUDGET, TimingBudget, stats_from_samples, time_fn
from .ops import OpCase, alignment_cases, copy_cases, framework_cases, op_cases, optimizer_cases, peak_cases

__all__ = ["profile", "ProfileError"]

_WORKER = Path(__file__).with_name("_collective_worker.py")
_ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2, "tf32": 4}
#: copies at least this large (per tensor) stream from DRAM / HBM rather than the caches
_STREAM_BYTES = {"cpu": 128 * 2 ** 20, "cuda": 1024 * 2 ** 20}
_STREAM_BYTES_QUICK = {"cpu": 64 * 2 ** 20, "cuda": 256 * 2 ** 20}
#: collective message sizes (bytes): 4 KiB .. 16 MiB, by 4x; quick: 4 KiB .. 1 MiB by 16x
_MESSAGE_SIZES = tuple(4096 * 4 ** i for i in range(7))
_MESSAGE_SIZES_QUICK = (4096, 65536, 1048576)
#: a case may use at most this fraction of the memory available now
_ALLOC_FRACTION = 0.5
#: wall-clock limit of one torchrun collective run
_COLLECTIVE_TIMEOUT_S = {True: 120.0, False: 300.0}
#: gloo timings on a small box are bimodal (scheduling): more repeats for the median
_COLLECTIVE_BUDGET = TimingBudget(target_s=1.0, min_repeats=10, max_repeats=100)
#: matmul peaks measured per dtype; a quick CPU run measures only the benchmark dtype (a GPU's
#: peak probes take milliseconds, and tf32 is set apart from fp32 only on CUDA)
_PEAK_DTYPES = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "tf32", "bf16", "fp16")}
_BENCH_DTYPE = {"cpu": "fp32", "cuda": "bf16"}


class ProfileError(RuntimeError):
    """Profiling could not produce a usable profile (nothing was saved)."""


def profile(devices: str = "cpu:2", *, out: str | os.PathLike | None = None, quick: bool = False,
            progress: bool | Callable[[int, int, str], None] | None = None) -> Profile:
    """Measure the devices of ``devices`` ("cpu:N", "cuda", "cuda:N", "NxH100"), fit, and save to ``out``.

    ``quick`` runs a small sweep (seconds, for tests); the full one takes a few minutes.
    ``progress``: None = a tqdm bar when stderr is a terminal, True/False = always/never, or a
    callable ``(done, total, label)``. ``out`` is written only once everything succeeded.
    """
    ds = parse_device_set(devices)
    import torch
    notes: list[str] = []
    bench_dtype = _BENCH_DTYPE[ds.kind]
    device = _bench_device(ds)
    threads = torch.get_num_threads() if ds.kind == "cuda" else max(1, cpu_count() // ds.count)
    budget = QUICK_BUDGET if quick else FULL_BUDGET
    stream = (_STREAM_BYTES_QUICK if quick else _STREAM_BYTES)[ds.kind]
    itemsize = _ITEMSIZE[bench_dtype]
    copies = copy_cases(itemsize, quick, stream)
    ops = op_cases(itemsize, quick, ds.kind)
    # the matrix units' alignment penalty is measured where the cost model charges one (GPUs)
    aligns = alignment_cases(itemsize, quick) if ds.kind == "cuda" else []
    peak_dtypes = (bench_dtype,) if quick and ds.kind == "cpu" else _PEAK_DTYPES[ds.kind]
    peaks = [(dt, n) for dt in peak_dtypes for n in peak_cases(quick, ds.kind)]
    # a CPU runs the framework's work per operator in line with the kernels; a GPU's host
    # queues kernels ahead of them, so it is measured on CPUs only
    steps = (framework_cases(quick) if ds.kind == "cpu" else []) + optimizer_cases(itemsize, quick)
    group_sizes = _group_sizes(ds, quick)
    total = len(copies) + len(ops) + len(aligns) + len(peaks) + len(steps) + len(group_sizes) + 1
    tick = _progress(progress, total)

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            copy_ms = [m for c in copies if (m := _run_case(c, device, bench_dtype, budget, notes, tick))]
        if not copy_ms:
            raise ProfileError(f"no copy benchmark could run on {ds.spec}: {'; '.join(notes)}")
        compute_ms = [m for c in ops if (m := _run_case(c, device, bench_dtype, budget, notes, tick))]
        align_ms = [m for c in aligns if (m := _run_case(c, device, bench_dtype, budget, notes, tick))]
        peak_ms = []
        for dt, n in peaks:
            m = _run_case(_square(n, dt), device, dt, budget, notes, tick)
            if m:
                peak_ms.append(m)
        step_ms = [m for c in steps if (m := _run_case(c, device, bench_dtype, budget, notes, tick))]
    finally:
        torch.set_num_threads(old_threads)

    hbm = _bandwidth(copy_ms, stream, notes)
    peak = _peaks(compute_ms, peak_ms, bench_dtype)
    curves = _fit_curves(compute_ms, peak[bench_dtype], hbm, notes)
    misaligned = _misaligned_efficiency(align_ms, itemsize, notes)
    op_overhead = _slope([m for m in step_ms if m.family == "framework"], "calls", notes)
    update_rate = _slope([m for m in step_ms if m.family == "optimizer"], "numel", notes)
    tick("fit compute")

    coll_ms: list[CollectiveMeasurement] = []
    for p in group_sizes:
        coll_ms += _run_collectives(ds, p, quick, notes)
        tick(f"collectives p={p}")
    collectives = _fit_collectives(coll_ms, notes)
    if not group_sizes:
        notes.append(f"no collectives measured: {ds.spec} has a single rank")

    device_name = current_device_name(ds.kind)
    entry = catalogue_entry(device_name) if ds.kind == "cuda" else "cpu"
    machine = MachineInfo(
        platform=platform.platform(), processor=cpu_model_name(), cpu_count=cpu_count(), threads_per_rank=threads,
        torch_version=torch.__version__, python_version=sys.version.split()[0], device_kind=ds.kind,
        device_name=device_name, device_count=ds.count,
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), backend=ds.backend,
        catalogue_device=entry, link=_link_name(entry) if coll_ms else "")
    prof = Profile(devices=ds.spec, quick=quick, dtype=bench_dtype, machine=machine, peak_flops_per_s=peak,
                   hbm_bytes_per_s=hbm, memory_efficiency=1.0, curves=curves, collectives=collectives,
                   misaligned_efficiency=misaligned, op_overhead_s=op_overhead, update_s_per_param=update_rate,
                   compute_measurements=tuple(copy_ms + compute_ms + align_ms + peak_ms + step_ms),
                   collective_measurements=tuple(coll_ms), notes=tuple(notes))
    tick.close()
    if out is not None:
        prof.save(out)
    return prof


# ------------------------------------------------------------------------------ compute

def _bench_device(ds: DeviceSet):
    """The device the operator benchmarks run on: the first GPU of a CUDA set (the collectives
    use every GPU, one torchrun rank each), else the CPU."""
    import torch
    return torch.device("cuda", 0) if ds.kind == "cuda" else torch.device("cpu")


def _is_cuda(device) -> bool:
    """Whether benchmarks on ``device`` take the CUDA path: CUDA events and that device's
    synchronisation for timing, its free memory for the can-it-fit check, TF32 set per dtype."""
    return device.type == "cuda"


def _link_name(entry: str) -> str:
    """The link tier of a single-node device set: the catalogue entry's intra-node link (NVLink
    for the SXM parts), "" where the device has no catalogue entry."""
    if not entry:
        return ""
    from ..hardware import get_device
    return get_device(entry).intra_link_name


@contextmanager
def _cuda_matmul_tf32(enabled: bool):
    """CUDA fp32 matmuls with TF32 on (``enabled``) or off (IEEE fp32) inside, as before after.

    Set through ``allow_tf32``, which keeps torch's legacy and (torch >= 2.9) ``fp32_precision``
    states consistent. The state before is read without the legacy getter, which raises when
    the caller set only the new API ("mix of the legacy and new APIs"), and restored in full.
    """
    import torch
    mm = torch.backends.cuda.matmul
    try:
        old_precision = mm.fp32_precision
    except AttributeError:        # torch < 2.9: the legacy flag is the whole state
        old_tf32 = mm.allow_tf32
        mm.allow_tf32 = enabled
        try:
            yield
        finally:
            mm.allow_tf32 = old_tf32
        return
    try:
        old_legacy = torch.get_float32_matmul_precision()
    except RuntimeError:          # mixed APIs: the new-API state is what the caller set
        old_legacy = None
    mm.allow_tf32 = enabled
    try:
        yield
    finally:
        if old_legacy is not None:
            torch.set_float32_matmul_precision(old_legacy)
        mm.fp32_precision = old_precision


def _square(n: int, dtype: str) -> OpCase:
    from .ops import linear_builder
    s = _ITEMSIZE[dtype]
    nbytes = 3.0 * n * n * s
    return OpCase("peak", f"matmul_{dtype}", (n, n, n), 2.0 * n ** 3, nbytes, 1, nbytes, linear_builder(n, n, n, False))


def _torch_dtype(dtype: str):
    import torch
    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


def _available_bytes(device) -> float:
    if _is_cuda(device):
        import torch
        free, _ = torch.cuda.mem_get_info(device)
        return float(free)
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return float("inf")


def _run_case(case: OpCase, device, dtype: str, budget: TimingBudget, notes: list[str], tick) -> ComputeMeasurement | None:
    """Time one case; a case that cannot allocate is skipped with a note."""
    import torch
    tick(case.label)
    limit = _available_bytes(device) * _ALLOC_FRACTION
    if case.alloc_bytes > limit:
        notes.append(f"skipped {case.family} {case.label}: needs ~{case.alloc_bytes / 2**20:.0f} MiB, "
                     f"{limit / 2**20:.0f} MiB allowed")
        return None
    cuda = _is_cuda(device)
    fn = None
    try:
        # fp32 is IEEE fp32 (TF32 off whatever the caller set), tf32 is fp32 tensors with TF32 on
        with _cuda_matmul_tf32(dtype == "tf32") if cuda else nullcontext():
            fn = case.build(device, _torch_dtype(dtype))
            stats = time_fn(fn, cuda=cuda, budget=budget, device=device)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as err:
        if not _is_alloc_error(err):
            raise
        notes.append(f"skipped {case.family} {case.label}: could not allocate ({str(err).splitlines()[0][:120]})")
        return None
    finally:
        fn = None
        if cuda:
            torch.cuda.empty_cache()
    return ComputeMeasurement(case.family, case.op, case.shape, dtype, case.flops, case.nbytes, case.calls, stats)


def _is_alloc_error(err: BaseException) -> bool:
    import torch
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(err).lower()
    return "out of memory" in text or "allocate" in text


def _bandwidth(copy_ms, stream_bytes: float, notes: list[str]) -> float:
    """Best achieved copy bandwidth (bytes read + written per second) of copies beyond the caches."""
    streaming = [m for m in copy_ms if m.nbytes / 2 >= stream_bytes]
    if not streaming:
        notes.append("no copy beyond the caches could run: the bandwidth is that of smaller copies")
        streaming = copy_ms
    return max(m.nbytes / m.time_per_call_s for m in streaming)


def _peaks(compute_ms, peak_ms, bench_dtype) -> dict[str, float]:
    """Best achieved matmul FLOP/s per dtype (the benchmark dtype also from the linear/matmul sweep)."""
    out: dict[str, float] = {}
    for m in compute_ms + peak_ms:
        if m.family in ("linear", "matmul", "peak") and m.flops > 0:
            rate = m.flops / m.time_per_call_s
            if rate > out.get(m.dtype, 0.0):
                out[m.dtype] = rate
    if bench_dtype not in out:
        raise ProfileError(f"no {bench_dtype} matmul could be measured, so there is no peak FLOP/s to fit against")
    return dict(sorted(out.items()))


def _fit_curves(compute_ms, peak, hbm, notes) -> dict[str, FittedCurve]:
    families = sorted({m.family for m in compute_ms})
    curves = {}
    for fam in families:
        pts = [ComputePoint(m.flops, m.nbytes, m.time_per_call_s) for m in compute_ms if m.family == fam]
        try:
            curves[fam] = fit_efficiency_curve(pts, peak, hbm)
        except FitError as err:
            notes.append(f"no curve for {fam}: {err}")
    if not curves:
        raise ProfileError("no operator family could be measured and fitted: " + "; ".join(notes))
    return curves


def _slope(measured, per: str, notes: list[str]) -> float:
    """Least-squares slope of a run's time in its operator count (``per="calls"``: the
    framework chains) or its parameter elements (``"numel"``: the optimizer steps), at least 0;
    0 with a note where fewer than two sizes ran."""
    import numpy as np

    if len(measured) < 2:
        if measured:
            notes.append(f"{measured[0].family}: one size ran, its cost per {per} is not measured")
        return 0.0
    x = np.array([float(m.calls) if per == "calls" else float(m.shape[0]) for m in measured])
    t = np.array([m.time.median_s for m in measured])
    slope = float(np.polyfit(x, t, 1)[0])
    return max(slope, 0.0)


def _misaligned_efficiency(align_ms, itemsize: int, notes: list[str]) -> dict[str, float]:
    """Each misaligned probe's FLOP rate over the aligned one's, by the alignment (bytes) of
    its last dimension (``compute.alignment_bytes``), at most 1."""
    from ..compute import ALIGNED_BYTES, alignment_bytes

    rates = {alignment_bytes([m.shape[1], m.shape[2]], itemsize): m.flops / m.time_per_call_s for m in align_ms}
    if ALIGNED_BYTES not in rates:
        if align_ms:
            notes.append("no aligned matmul probe ran: the alignment penalty is not measured")
        return {}
    return {str(a): min(1.0, r / rates[ALIGNED_BYTES]) for a, r in sorted(rates.items()) if a < ALIGNED_BYTES}


# ------------------------------------------------------------------------------ collectives

def _group_sizes(ds: DeviceSet, quick: bool) -> list[int]:
    if ds.kind == "cuda":
        sizes = [p for p in (2, 4, 8) if p <= ds.count] + ([ds.count] if ds.count > 1 else [])
    else:
        sizes = [2, 4] + ([ds.count] if ds.count > 4 else [])
    sizes = sorted(set(sizes))
    return sizes[:1] if quick else sizes


def _run_collectives(ds: DeviceSet, p: int, quick: bool, notes: list[str]) -> list[CollectiveMeasurement]:
    budget = QUICK_BUDGET if quick else _COLLECTIVE_BUDGET
    kinds = [k for k in COLLECTIVE_KINDS if k != "send_recv" or p == 2]
    sizes = _MESSAGE_SIZES_QUICK if quick else _MESSAGE_SIZES
    args = ["--backend", ds.backend, "--sizes", ",".join(map(str, sizes)), "--kinds", ",".join(kinds),
            "--target-s", str(budget.target_s), "--min-repeats", str(budget.min_repeats),
            "--max-repeats", str(budget.max_repeats)]
    res = run_torchrun(_WORKER, args, nproc=p, timeout=_COLLECTIVE_TIMEOUT_S[quick])
    if not res.ok:
        raise ProfileError(f"collective benchmark with {p} ranks ({ds.backend}) failed; nothing was saved.\n"
                           + res.summary())
    out = []
    for r in res.results:
        if "skip" in r:
            notes.append(f"skipped {r['kind']} n={r['nbytes']} p={r['group_size']}: {r['skip']}")
            continue
        out.append(CollectiveMeasurement(r["kind"], int(r["group_size"]), float(r["nbytes"]),
                                         stats_from_samples(r["samples_s"])))
    if not out:
        raise ProfileError(f"the collective benchmark with {p} ranks reported nothing.\n" + res.summary())
    return out


def _fit_collectives(coll_ms, notes) -> dict[str, FittedCollective]:
    fits = {}
    for kind in sorted({m.kind for m in coll_ms}):
        pts = [CollectivePoint(m.group_size, m.nbytes, m.time.median_s) for m in coll_ms if m.kind == kind]
        try:
            fits[kind] = fit_collective(kind, pts)
        except FitError as err:
            notes.append(f"no fit for {kind}: {err}")
    return fits


# ------------------------------------------------------------------------------ progress

class _Progress:
    def __init__(self, bar=None, callback=None, total=0):
        self.bar, self.callback, self.total, self.done = bar, callback, total, 0

    def __call__(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)
        if self.callback is not None:
            self.callback(self.done + 1, self.total, label)
        self.done += 1

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _progress(progress, total: int) -> _Progress:
    if callable(progress) and not isinstance(progress, bool):
        return _Progress(callback=progress, total=total)
    show = sys.stderr.isatty() if progress is None else bool(progress)
    if not show:
        return _Progress(total=total)
    from tqdm.auto import tqdm
    return _Progress(bar=tqdm(total=total, desc="profiling", unit="bench"), total=total)
