"""α–β costs of collectives over one mesh axis (ring / pipelined-chain algorithms).

``p`` ranks, ``latency_s`` = α per step, ``bandwidth_bytes_per_s`` = B, the per-rank
bandwidth per direction, and ``nbytes`` = n, the full buffer:

=================  ==========================================  ==========================
all_reduce         2(p−1)α + 2(p−1)/p · n/B                     n = the buffer
reduce_scatter     (p−1)α + (p−1)/p · n/B                       n = input (unsharded)
all_gather         (p−1)α + (p−1)/p · n/B                       n = output (unsharded)
all_to_all         (p−1)α + (p−1)/p · n/B                       n = per-rank send buffer
broadcast          (p−1)α + n/B                                 pipelined chain
send_recv          α + n/B                                      one point-to-point message
=================  ==========================================  ==========================

One rank (p = 1) or an empty buffer (n = 0) costs 0: no collective is issued.
``CollectiveModel`` scales α and B per collective kind, so a calibrated profile can
replace the defaults (identity scaling, no fixed overhead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .mesh import Mesh

__all__ = [
    "COLLECTIVE_KINDS", "FORMULAS", "CollectiveParams", "CollectiveModel",
    "all_reduce_s", "all_gather_s", "reduce_scatter_s", "all_to_all_s", "send_recv_s", "broadcast_s",
]


def _check(nbytes: float, p: int, latency_s: float, bandwidth_bytes_per_s: float) -> bool:
    """Validate the arguments; True when the collective costs nothing (p = 1 or n = 0)."""
    if isinstance(p, bool) or int(p) != p or p < 1:
        raise ValueError(f"rank count p must be a positive integer, got {p!r}")
    if not nbytes >= 0 or not math.isfinite(nbytes):
        raise ValueError(f"nbytes must be finite and >= 0, got {nbytes!r}")
    if not latency_s >= 0:
        raise ValueError(f"latency_s must be >= 0, got {latency_s!r}")
    if not bandwidth_bytes_per_s > 0:
        raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {bandwidth_bytes_per_s!r}")
    return p == 1 or nbytes == 0


def all_reduce_s(nbytes: float, p: int, latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """Ring all-reduce of an n-byte buffer: 2(p−1)α + 2(p−1)/p · n/B."""
    if _check(nbytes, p, latency_s, bandwidth_bytes_per_s):
        return 0.0
    return 2 * (p - 1) * latency_s + 2 * (p - 1) / p * nbytes / bandwidth_bytes_per_s


def reduce_scatter_s(nbytes: float, p: int, latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """Ring reduce-scatter, n = input bytes: (p−1)α + (p−1)/p · n/B."""
    if _check(nbytes, p, latency_s, bandwidth_bytes_per_s):
        return 0.0
    return (p - 1) * latency_s + (p - 1) / p * nbytes / bandwidth_bytes_per_s


def all_gather_s(nbytes: float, p: int, latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """Ring all-gather, n = output bytes: (p−1)α + (p−1)/p · n/B."""
    if _check(nbytes, p, latency_s, bandwidth_bytes_per_s):
        return 0.0
    return (p - 1) * latency_s + (p - 1) / p * nbytes / bandwidth_bytes_per_s


def all_to_all_s(nbytes: float, p: int, latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """All-to-all, n = per-rank send buffer: (p−1)α + (p−1)/p · n/B."""
    if _check(nbytes, p, latency_s, bandwidth_bytes_per_s):
        return 0.0
    return (p - 1) * latency_s + (p - 1) / p * nbytes / bandwidth_bytes_per_s


def broadcast_s(nbytes: float, p: int, latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """Pipelined-chain broadcast: (p−1)α + n/B."""
    if _check(nbytes, p, latency_s, bandwidth_bytes_per_s):
        return 0.0
    return (p - 1) * latency_s + nbytes / bandwidth_bytes_per_s


def send_recv_s(nbytes: float, p: int, latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """One point-to-point message between neighbours on an axis of p ranks: α + n/B."""
    if _check(nbytes, p, latency_s, bandwidth_bytes_per_s):
        return 0.0
    return latency_s + nbytes / bandwidth_bytes_per_s


FORMULAS: dict[str, Callable[[float, int, float, float], float]] = {
    "all_reduce": all_reduce_s,
    "all_gather": all_gather_s,
    "reduce_scatter": reduce_scatter_s,
    "all_to_all": all_to_all_s,
    "send_recv": send_recv_s,
    "broadcast": broadcast_s,
}
COLLECTIVE_KINDS: tuple[str, ...] = tuple(FORMULAS)

_IDENTITY_SCALE = 1.0
_NO_OVERHEAD_S = 0.0


@dataclass(frozen=True)
class CollectiveParams:
    """Calibration of one collective kind: α' = alpha_scale·α, B' = bandwidth_efficiency·B."""
    alpha_scale: float = _IDENTITY_SCALE
    bandwidth_efficiency: float = _IDENTITY_SCALE
    base_s: float = _NO_OVERHEAD_S          # fixed per-call overhead (launch), added when p > 1

    def __post_init__(self):
        if not (self.alpha_scale >= 0 and self.bandwidth_efficiency > 0 and self.base_s >= 0):
            raise ValueError(f"invalid collective calibration {self}: need alpha_scale >= 0, "
                             f"bandwidth_efficiency > 0, base_s >= 0")


@dataclass(frozen=True)
class CollectiveModel:
    """Per-kind calibration; ``time_s(kind, nbytes, mesh, axis)`` prices one collective."""
    all_reduce: CollectiveParams = field(default_factory=CollectiveParams)
    all_gather: CollectiveParams = field(default_factory=CollectiveParams)
    reduce_scatter: CollectiveParams = field(default_factory=CollectiveParams)
    all_to_all: CollectiveParams = field(default_factory=CollectiveParams)
    send_recv: CollectiveParams = field(default_factory=CollectiveParams)
    broadcast: CollectiveParams = field(default_factory=CollectiveParams)

    def params(self, kind: str) -> CollectiveParams:
        if kind not in FORMULAS:
            raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVE_KINDS)}")
        return getattr(self, kind)

    def raw_time_s(self, kind: str, nbytes: float, p: int, latency_s: float,
                   bandwidth_bytes_per_s: float, latency_share: float = 1.0) -> float:
        """Calibrated cost from raw numbers (p ranks, link α and B); ``latency_share`` of the
        fixed costs (α and the per-call overhead), for a buffer issued with others in one call."""
        cal = self.params(kind)
        t = FORMULAS[kind](nbytes, p, latency_share * cal.alpha_scale * latency_s,
                            cal.bandwidth_efficiency * bandwidth_bytes_per_s)
        return t + latency_share * cal.base_s if t > 0 else 0.0

    def time_s(self, kind: str, nbytes: float, mesh: Mesh, axis: int | str, latency_share: float = 1.0) -> float:
        """Calibrated cost of one collective over ``mesh``'s ``axis`` (index or name)."""
        return self.raw_time_s(kind, nbytes, mesh.axis_size(axis), mesh.latency_s(axis),
                               mesh.bandwidth_bytes_per_s(axis), latency_share)
