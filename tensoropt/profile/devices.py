"""Which devices a profile measures: parse the device set and check it is present."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass

__all__ = ["DeviceSet", "DeviceNotPresentError", "parse_device_set", "current_device_name", "cpu_model_name",
           "catalogue_entry", "gpu_name_matches"]

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
        for i in range(ds.count):
            present = torch.cuda.get_device_name(i)
            if not gpu_name_matches(ds.name, present):
                entry = catalogue_entry(present)
                raise DeviceNotPresentError(
                    f"device set {ds.spec!r} asks for {ds.name}, but GPU {i} here is {present!r}"
                    + (f" (catalogue entry {entry})" if entry else "")
                    + "; name the GPU present or use 'cuda:N'")
    return ds


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def _tokens(s: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", s.lower()) if t]


def _spans(tokens: list[str]) -> set[str]:
    """Every run of consecutive tokens, joined: 'NVIDIA GeForce RTX 4090' has 'rtx4090', not 'tx40'."""
    return {"".join(tokens[i:j]) for i in range(len(tokens)) for j in range(i + 1, len(tokens) + 1)}


def catalogue_entry(gpu_name: str) -> str:
    """The hardware catalogue's device (``tensoropt.hardware``) that a CUDA device name is, or "".

    A catalogue name or alias must appear in ``gpu_name`` as whole words ("NVIDIA H100 80GB HBM3"
    is H100; "NVIDIA GH200 480GB" is not H200); a memory size in the name ("A100-SXM4-40GB") must
    be the entry's; the catalogue's NVLink (SXM) parts are not a "PCIe" board of the same chip.
    Several matches: the longest name or alias wins; a tie between entries is no match.
    """
    from ..hardware import load_catalogue
    tokens = _tokens(gpu_name)
    spans = _spans(tokens)
    sizes = {int(m[1]) for t in tokens if (m := re.fullmatch(r"(\d+)gb", t))}
    best: dict[str, int] = {}
    for dev in load_catalogue().devices.values():
        if dev.placeholder:
            continue
        if sizes and round(dev.memory_bytes / 1e9) not in sizes:
            continue
        if "pcie" in tokens and not dev.intra_link_name.startswith("pcie"):
            continue
        hit = max((len(k) for k in map(_norm, (dev.name, *dev.aliases)) if k in spans), default=0)
        if hit:
            best[dev.name] = hit
    if not best:
        return ""
    top = max(best.values())
    winners = [name for name, n in best.items() if n == top]
    return winners[0] if len(winners) == 1 else ""


def gpu_name_matches(requested: str, present: str) -> bool:
    """Whether the GPU named ``requested`` (as in '1xH100') is the CUDA device named ``present``.

    A catalogue name or alias must be the catalogue entry of the present GPU ('A100-80GB' is not an
    'NVIDIA A100-SXM4-40GB'); where either side has no entry, the name must appear in the present
    one as whole words ('RTX4090' in 'NVIDIA GeForce RTX 4090', 'H100' in 'NVIDIA H100 PCIe').
    """
    from ..hardware import load_catalogue
    want = load_catalogue().lookup.get(requested.strip().lower(), "")
    have = catalogue_entry(present)
    if want and have:
        return want == have
    return _norm(requested) in _spans(_tokens(present))


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
