"""Hardware catalogue: devices and link tiers, loaded from ``data/hardware/*.json``.

Names are matched case-insensitively; each device also has aliases (e.g. ``H100-80GB``).
Peak FLOP/s are dense (no sparsity). See the JSON files for every figure's source.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from .units import parse_bytes

__all__ = [
    "DATA_DIR", "DTYPES", "Device", "Link", "Catalogue",
    "load_catalogue", "get_device", "get_link", "intra_link", "inter_link",
]

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "hardware"

#: canonical dtype keys of ``Device.peak_flops_per_s``
DTYPES = ("fp32", "tf32", "bf16", "fp16")
_DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
}


@dataclass(frozen=True)
class Link:
    """One link tier: α (per step) and bandwidth per direction, per GPU."""
    name: str
    latency_s: float
    bandwidth_bytes_per_s: float
    source: str = field(default="", compare=False)


@dataclass(frozen=True)
class Device:
    """One accelerator (or the CPU placeholder)."""
    name: str
    memory_bytes: int
    peak_flops_per_s: Mapping[str, float] = field(hash=False)
    hbm_bytes_per_s: float
    source: str = field(default="", compare=False)
    per_node: int | None = 8            # usual devices per node; None = any count on one node
    intra_link_name: str = ""
    intra_link_bytes_per_s: float = 0.0
    nic_link_name: str = ""
    nic_bytes_per_s: float = 0.0
    aliases: tuple[str, ...] = ()
    placeholder: bool = False

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` ("bf16", "bfloat16", "torch.float32", ...)."""
        key = _DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
        if key not in self.peak_flops_per_s:
            raise ValueError(f"unknown dtype {dtype!r} for {self.name}; known: {sorted(self.peak_flops_per_s)}")
        return self.peak_flops_per_s[key]


@dataclass(frozen=True)
class Catalogue:
    devices: Mapping[str, Device]       # canonical name -> Device
    links: Mapping[str, Link]           # tier name -> Link
    lookup: Mapping[str, str]           # lower-case name or alias -> canonical device name


def _load_json(name: str) -> dict:
    with open(DATA_DIR / name, encoding="utf-8") as f:
        return json.load(f)


@lru_cache(maxsize=1)
def load_catalogue() -> Catalogue:
    """Read ``gpus.json`` and ``links.json`` once (cached)."""
    links = {name: Link(name, float(e["latency_s"]), float(e["bandwidth_bytes_per_s"]), e["source"])
             for name, e in _load_json("links.json")["links"].items()}
    devices: dict[str, Device] = {}
    lookup: dict[str, str] = {}
    for name, e in _load_json("gpus.json")["devices"].items():
        flops = {k: float(v) for k, v in e["peak_flops_per_s"].items()}
        dev = Device(
            name=name,
            memory_bytes=parse_bytes(e["memory"]),
            peak_flops_per_s=MappingProxyType(flops),
            hbm_bytes_per_s=float(e["hbm_bytes_per_s"]),
            source=e["source"],
            per_node=e["per_node"],
            intra_link_name=e["intra_link"]["name"],
            intra_link_bytes_per_s=float(e["intra_link"]["bandwidth_bytes_per_s"]),
            nic_link_name=e["nic"]["name"],
            nic_bytes_per_s=float(e["nic"]["bandwidth_bytes_per_s"]),
            aliases=tuple(e.get("aliases", ())),
            placeholder=bool(e.get("placeholder", False)),
        )
        for link_name in (dev.intra_link_name, dev.nic_link_name):
            if link_name not in links:
                raise ValueError(f"gpus.json: {name} names unknown link {link_name!r}; known: {sorted(links)}")
        devices[name] = dev
        for key in (name, *dev.aliases):
            if key.lower() in lookup:
                raise ValueError(f"gpus.json: name or alias {key!r} is used twice")
            lookup[key.lower()] = name
    return Catalogue(MappingProxyType(devices), MappingProxyType(links), MappingProxyType(lookup))


def get_device(name: str) -> Device:
    """Device by name or alias, case-insensitive; ValueError lists the known names."""
    cat = load_catalogue()
    key = str(name).strip().lower()
    if key not in cat.lookup:
        known = ", ".join(f"{d.name} (aliases: {', '.join(d.aliases)})" if d.aliases else d.name
                          for d in cat.devices.values())
        raise ValueError(f"unknown device {name!r}; known devices: {known}")
    return cat.devices[cat.lookup[key]]


def get_link(name: str) -> Link:
    """Link tier by name, case-insensitive (e.g. "nvlink4", "ib-ndr", "gloo-loopback")."""
    links = load_catalogue().links
    key = str(name).strip().lower()
    if key not in links:
        raise ValueError(f"unknown link {name!r}; known links: {', '.join(links)}")
    return links[key]


def intra_link(device: Device) -> Link:
    """The device's intra-node link: the tier's α with the device's per-GPU bandwidth."""
    return dataclasses.replace(get_link(device.intra_link_name),
                               bandwidth_bytes_per_s=device.intra_link_bytes_per_s)


def inter_link(device: Device) -> Link:
    """The device's inter-node link (its NIC): the tier's α with the per-GPU NIC bandwidth."""
    return dataclasses.replace(get_link(device.nic_link_name),
                               bandwidth_bytes_per_s=device.nic_bytes_per_s)
