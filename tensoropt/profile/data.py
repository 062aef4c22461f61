"""The profile record: fitted parameters, raw measurements, machine description; JSON I/O.

``Profile.save`` writes a temporary file next to the target and renames it over the target,
so an interrupted or failed run never leaves a partial file or overwrites a good profile.
``Profile.load`` checks the file and warns when it was made with another torch version or on
another device than the one present.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..collectives import CollectiveModel, CollectiveParams
from ..compute import ComputeModel, EfficiencyCurve
from ..hardware import DTYPES, Device, Link

__all__ = [
    "SCHEMA_VERSION", "MachineInfo", "TimeStats", "ComputeMeasurement", "CollectiveMeasurement",
    "FittedCurve", "FittedCollective", "GroupFit", "Profile", "ProfileMismatchWarning",
]

#: bumped when the JSON layout changes incompatibly
SCHEMA_VERSION = 1
#: the curve used for families the profile did not measure
DEFAULT_CURVE_FAMILY = "elementwise"


class ProfileMismatchWarning(UserWarning):
    """A loaded profile was made with another torch version or on another device."""


@dataclass(frozen=True)
class MachineInfo:
    platform: str             # platform.platform()
    processor: str            # CPU model name
    cpu_count: int            # logical CPUs visible to this process
    threads_per_rank: int     # torch intra-op threads the compute benchmarks ran with
    torch_version: str
    python_version: str
    device_kind: str          # "cpu" | "cuda"
    device_name: str          # CPU model, or torch.cuda.get_device_name()
    device_count: int         # ranks the device set asked for
    date: str                 # ISO 8601, UTC
    backend: str              # process-group backend of the collective benchmarks
    catalogue_device: str = ""  # hardware-catalogue entry of the device (tensoropt.hardware), "" = none
    link: str = ""            # catalogue link tier the collectives ran over, "" = none measured or unknown


@dataclass(frozen=True)
class TimeStats:
    """Per-call seconds over ``repeats`` timed repeats (each repeat averages ``calls_per_repeat`` calls)."""
    median_s: float
    q25_s: float
    q75_s: float
    min_s: float
    max_s: float
    repeats: int
    calls_per_repeat: int = 1

    @property
    def iqr_s(self) -> float:
        return self.q75_s - self.q25_s


@dataclass(frozen=True)
class ComputeMeasurement:
    family: str            # operator family ("linear", ..., or "copy" for the bandwidth probe)
    op: str                # what ran, e.g. "linear_fwd_bwd", "gelu"
    shape: tuple[int, ...]  # sizes that define the problem (op-specific order, see ops.py)
    dtype: str
    flops: float           # per kernel call
    nbytes: float          # per kernel call: operands read + output written
    calls: int             # kernel calls of (flops, nbytes) in one timed run (fwd+bwd GEMM: 3)
    time: TimeStats        # of one timed run (all ``calls`` kernels)

    @property
    def time_per_call_s(self) -> float:
        return self.time.median_s / self.calls


@dataclass(frozen=True)
class CollectiveMeasurement:
    kind: str              # collectives.COLLECTIVE_KINDS
    group_size: int
    nbytes: float          # n as in collectives.py (all-gather: output; reduce-scatter: input; ...)
    time: TimeStats        # per call, slowest rank per repeat


@dataclass(frozen=True)
class FittedCurve:
    """Efficiency curve of one family, relative to the profile's peak FLOP/s and bandwidth."""
    eff_max: float
    flops_half: float
    overhead_s: float
    points: int                   # measurements fitted
    rel_error_median: float       # |model/measured - 1| over the points
    rel_error_max: float
    overhead_resolved: bool = True  # False: the data did not need an overhead (set to 0; see fit.py)

    def __post_init__(self):
        self.curve()      # validates eff_max, flops_half, overhead_s

    def curve(self) -> EfficiencyCurve:
        return EfficiencyCurve(self.eff_max, self.flops_half, self.overhead_s)


@dataclass(frozen=True)
class GroupFit:
    group_size: int
    latency_s: float
    bandwidth_bytes_per_s: float
    rel_error_median: float
    rel_error_max: float


@dataclass(frozen=True)
class FittedCollective:
    """α (per step) and B (per rank) of one collective kind, with collectives.py's p-factors."""
    latency_s: float
    bandwidth_bytes_per_s: float
    group_sizes: tuple[int, ...]
    points: int
    rel_error_median: float
    rel_error_max: float
    per_group: tuple[GroupFit, ...] = ()   # the same fit on each group size alone

    def __post_init__(self):
        if not (self.latency_s >= 0 and self.bandwidth_bytes_per_s > 0):
            raise ValueError(f"invalid collective fit: latency_s {self.latency_s} must be >= 0 and "
                             f"bandwidth_bytes_per_s {self.bandwidth_bytes_per_s} > 0")

    def for_group(self, group_size: int | None) -> tuple[float, float]:
        if group_size is None:
            return self.latency_s, self.bandwidth_bytes_per_s
        for g in self.per_group:
            if g.group_size == group_size:
                return g.latency_s, g.bandwidth_bytes_per_s
        raise ValueError(f"no fit for group size {group_size}; the profile measured "
                         f"{', '.join(map(str, self.group_sizes))}")


@dataclass(frozen=True)
class Profile:
    devices: str                          # the device set profiled ("cpu:2", "1xH100", ...)
    quick: bool
    dtype: str                            # dtype of the operator benchmarks the curves are fitted on
    machine: MachineInfo
    peak_flops_per_s: dict[str, float]    # best achieved matmul FLOP/s per measured dtype
    hbm_bytes_per_s: float                # best achieved copy bandwidth (read + write bytes)
    memory_efficiency: float              # of hbm_bytes_per_s, shared by all families
    curves: dict[str, FittedCurve]
    collectives: dict[str, FittedCollective]
    # alignment (bytes, as a string) -> the matmul rate reached against an aligned one (GPUs)
    misaligned_efficiency: dict[str, float] = dataclasses.field(default_factory=dict)
    # a training step's framework time per operator besides its kernels (CPU; 0 = not measured)
    op_overhead_s: float = 0.0
    # the optimizer's update per parameter element (0 = not measured)
    update_s_per_param: float = 0.0
    compute_measurements: tuple[ComputeMeasurement, ...] = ()
    collective_measurements: tuple[CollectiveMeasurement, ...] = ()
    notes: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self):
        if self.dtype not in self.peak_flops_per_s:
            raise ValueError(f"profile has no peak FLOP/s for its benchmark dtype {self.dtype!r}")
        if not (all(v > 0 for v in self.peak_flops_per_s.values()) and self.hbm_bytes_per_s > 0
                and 0 < self.memory_efficiency <= 1):
            raise ValueError("profile peak FLOP/s and bandwidth must be > 0, memory_efficiency in (0, 1]")

    # ------------------------------------------------------------------ models
    def compute_model(self) -> ComputeModel:
        """Measured per-family curves (families not profiled fall back to the elementwise
        curve) and the measured alignment penalty of matrix multiplies."""
        curves = {fam: c.curve() for fam, c in self.curves.items()}
        default = curves.get(DEFAULT_CURVE_FAMILY) or ComputeModel().default_curve
        return ComputeModel(curves=curves, default_curve=default, memory_efficiency=self.memory_efficiency,
                            misaligned_efficiency={int(a): f for a, f in self.misaligned_efficiency.items()},
                            op_overhead_s=self.op_overhead_s, update_s_per_param=self.update_s_per_param)

    def device(self, base: Device) -> Device:
        """A copy of ``base`` with the measured peak FLOP/s and memory bandwidth.

        Dtypes the profile did not measure keep ``base``'s ratio to the benchmark dtype's peak.
        """
        ref = self.peak_flops_per_s[self.dtype]
        base_ref = base.peak_flops(self.dtype)
        peaks = {}
        for dt in sorted(set(DTYPES) | set(base.peak_flops_per_s)):
            if dt in self.peak_flops_per_s:
                peaks[dt] = self.peak_flops_per_s[dt]
            elif dt in base.peak_flops_per_s:
                peaks[dt] = ref * base.peak_flops_per_s[dt] / base_ref
        from types import MappingProxyType
        return dataclasses.replace(
            base, peak_flops_per_s=MappingProxyType(peaks), hbm_bytes_per_s=self.hbm_bytes_per_s,
            source=f"measured profile of {self.machine.device_name} ({self.machine.date}, "
                   f"torch {self.machine.torch_version}); base entry: {base.name}",
            placeholder=False)

    def collective_model(self, link: Link, group_size: int | None = None) -> CollectiveModel:
        """Per-kind calibration relative to ``link``: α' = measured α, B' = measured B.

        ``group_size`` picks the fit of one measured group size; None the joint fit.
        Kinds the profile did not measure keep the identity calibration.
        """
        params = {}
        for kind, fit in self.collectives.items():
            latency_s, bandwidth = fit.for_group(group_size)
            params[kind] = CollectiveParams(
                alpha_scale=latency_s / link.latency_s if link.latency_s > 0 else 0.0,
                bandwidth_efficiency=bandwidth / link.bandwidth_bytes_per_s)
        return CollectiveModel(**params)

    def link(self, name: str = "measured", group_size: int | None = None, kind: str = "all_reduce") -> Link:
        """A link whose α and B are the measured ``kind`` figures."""
        latency_s, bandwidth = self.collectives[kind].for_group(group_size)
        return Link(name, latency_s, bandwidth, source=f"measured {kind} ({self.devices}, {self.machine.date})")

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        return _to_jsonable(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False, allow_nan=False)

    @staticmethod
    def from_dict(d: dict) -> "Profile":
        if not isinstance(d, dict):
            raise ValueError("not a profile: expected a JSON object")
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"profile schema version {version!r} is not {SCHEMA_VERSION}")
        return _from_jsonable(Profile, d)

    @staticmethod
    def from_json(text: str) -> "Profile":
        return Profile.from_dict(json.loads(text))

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically: a temporary file in the same folder, then a rename over ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = self.to_json() + "\n"
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)       # mkstemp makes it private; a profile is not
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @staticmethod
    def load(path: str | os.PathLike, *, check_environment: bool = True) -> "Profile":
        """Read a profile; warn (ProfileMismatchWarning) if torch or the device differ from now."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no profile at {path}; create one with "
                                    f"`python -m tensoropt.profile --devices cpu:2 --out {path}`")
        try:
            prof = Profile.from_json(path.read_text(encoding="utf-8"))
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise ValueError(f"{path} is not a valid tensoropt profile ({err}); delete it and "
                             f"re-run `python -m tensoropt.profile --out {path}`") from None
        if check_environment:
            prof.check_environment(source=str(path))
        return prof

    def check_environment(self, source: str = "profile") -> None:
        from .devices import current_device_name
        import torch
        here_torch = torch.__version__
        if self.machine.torch_version != here_torch:
            warnings.warn(f"{source} was made with torch {self.machine.torch_version}, but torch "
                          f"{here_torch} is running; timings may differ, re-profile to be sure",
                          ProfileMismatchWarning, stacklevel=3)
        here_dev = current_device_name(self.machine.device_kind)
        if here_dev != self.machine.device_name:
            warnings.warn(f"{source} was made on device {self.machine.device_name!r}, but this machine "
                          f"has {here_dev!r}; re-profile on this machine for its own figures",
                          ProfileMismatchWarning, stacklevel=3)


# ---------------------------------------------------------------------- (de)serialisation

def _to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_jsonable(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_jsonable(v) for v in obj]
    return obj




def _from_jsonable(cls: type, d: dict) -> Any:
    if not isinstance(d, dict):
        raise ValueError(f"expected an object for {cls.__name__}, got {type(d).__name__}")
    hints = _field_types(cls)
    kwargs = {}
    for f in fields(cls):
        if f.name not in d:
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                continue
            raise ValueError(f"{cls.__name__} lacks field {f.name!r}")
        kwargs[f.name] = _convert(hints[f.name], d[f.name], f"{cls.__name__}.{f.name}")
    unknown = set(d) - {f.name for f in fields(cls)}
    if unknown:
        raise ValueError(f"{cls.__name__} has unknown fields {sorted(unknown)}")
    return cls(**kwargs)


def _field_types(cls: type) -> dict[str, Any]:
    import typing
    return typing.get_type_hints(cls)


def _convert(tp: Any, value: Any, where: str) -> Any:
    import typing
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _from_jsonable(tp, value)
    if origin is tuple:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list")
        item = args[0]
        return tuple(_convert(item, v, where) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object")
        return {str(k): _convert(args[1], v, where) for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    raise ValueError(f"{where}: unsupported type {tp}")
