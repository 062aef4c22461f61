"""Which devices a profile measures: parse the device set and check it is present."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass

__all__ = ["DeviceSet", "DeviceNotPresentError", "parse_device_set", "current_device_name", "cpu_model_name"]

_CPU_RE = re.compile(r"^cpu(?::(?P<n>\d+))?$", re.IGNORECASE)
_CUDA_RE = re.compile(r"^cuda(?::(?P<n>\d+))?$", re.IGNORECASE)
_NAMED_RE = re.compile(r"^(?:(?P<n>\d+)[xX])?(?P<name>[A-Za-z][\w.-]*)$")
_HELP = "expected 'cpu:N' (N local CPU ranks on gloo), 'cuda' / 'cuda:N' (N local GPUs), or 'NxGPU' (e.g. '1xH100')"


class DeviceNotPresentError(RuntimeError):
    """The device set names devices this machine does not have."""


@dataclass(frozen=True)
class DeviceSet:
    kind: str          # "cpu" | "cuda"
    count: int         # ranks (CPU processes or GPUs)
    name: str          # requested GPU name ("" = any)
    spec: str          # as given

    @property
    def backend(self) -> str:
        return "nccl" if self.kind == "cuda" else "gloo"


def parse_device_set(spec: str) -> DeviceSet:
    """Parse and check presence; raises ValueError (bad syntax) or DeviceNotPresentError."""
    text = str(spec).strip()
    if m := _CPU_RE.match(text):
        n = int(m["n"] or 1)
        if n < 1:
            raise ValueError(f"device set {spec!r}: need at least one CPU rank")
        return DeviceSet("cpu", n, "", text)
    if m := _CUDA_RE.match(text):
        return _check_cuda(DeviceSet("cuda", int(m["n"] or 1), "", text))
    if m := _NAMED_RE.match(text):
        n = int(m["n"] or 1)
        return _check_cuda(DeviceSet("cuda", n, m["name"], text))
    raise ValueError(f"cannot parse device set {spec!r}: {_HELP}")


def _check_cuda(ds: DeviceSet) -> DeviceSet:
    import torch
    if ds.count < 1:
        raise ValueError(f"device set {ds.spec!r}: need at least one GPU")
    if not torch.cuda.is_available():
        raise DeviceNotPresentError(f"device set {ds.spec!r} needs CUDA, but torch {torch.__version__} sees no "
                                    "CUDA device here; profile on the GPU machine, or use 'cpu:N'")
    have = torch.cuda.device_count()
    if have < ds.count:
        raise DeviceNotPresentError(f"device set {ds.spec!r} needs {ds.count} GPUs, this machine has {have}")
    if ds.name:
        present = torch.cuda.get_device_name(0)
        if _norm(ds.name) not in _norm(present):
            raise DeviceNotPresentError(f"device set {ds.spec!r} asks for {ds.name}, but the GPU here is "
                                        f"{present!r}; name the GPU present or use 'cuda:N'")
    return ds


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def current_device_name(kind: str) -> str:
    """The name a profile of ``kind`` made here would record."""
    if kind == "cuda":
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    return f"{cpu_model_name()} ({cpu_count()} CPUs)"
