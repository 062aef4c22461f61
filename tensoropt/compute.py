"""Time of one operator's compute on one device: a roofline with size-dependent efficiency.

    time_s = overhead_s + max(flops / (peak_flops · eff(flops)), bytes / (hbm_bytes_per_s · memory_efficiency))
    eff(F) = eff_max · F / (F + flops_half)

``eff`` rises from 0 for tiny problems to ``eff_max`` for large ones: best-shape BF16
matmuls reach 87 % of peak on A100 SXM and 80 % on H100 SXM, while an H100 1024³ BF16
matmul reaches only ~18 % (stas00/ml-engineering "MAMF", via shared/reference/costs.md).
Each operator family has its own curve; the defaults below are fitted by hand to those
figures and stay until a measured profile (``tensoropt.profile``) replaces them.
``overhead_s`` is a per-call framework/launch cost, charged once per operator call.

A curve may also be keyed ``"family/kind"``, ``kind`` the operator's aten name
(:func:`operator_kind`): a measured profile fits one on that operator's forward and backward
where one family curve cannot hold its members (on a CPU a GELU takes several times an
addition's time per element). Operators without a curve of their own take their family's.

A matrix multiply whose contiguous dimensions are not multiples of 16 bytes cannot use the
matrix units' aligned kernels: its FLOP term runs at ``misaligned_efficiency[alignment]`` of
the aligned efficiency, the alignment being the largest power of two (bytes, at most 16)
dividing every operand's and the output's last dimension (:func:`alignment_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Mapping

from .hardware import Device
from .opgraph import operator_kind

__all__ = ["EfficiencyCurve", "ComputeModel", "default_compute_model", "MATMUL_FAMILIES", "ALIGNED_FAMILIES",
           "ALIGNED_BYTES", "alignment_bytes", "operator_kind", "curve_key"]

#: families whose FLOPs run on the matrix units; the rest are usually memory-bound
MATMUL_FAMILIES = ("linear", "matmul", "attention", "conv")
#: families priced by the alignment of their contiguous dimensions (cuBLAS matrix multiplies;
#: attention and convolution kernels pad or lay out their operands themselves)
ALIGNED_FAMILIES = ("linear", "matmul")
#: the alignment (bytes) the matrix units' fast kernels load with
ALIGNED_BYTES = 16
# Achieved fraction of an aligned matrix multiply's efficiency by the alignment (bytes) of its
# contiguous dimensions, on NVIDIA GPUs: measured on one H100 SXM (torch 2.11, CUDA 13, bf16,
# 2026-11-25, data/validation/h100/matmul_alignment.json): 8192x768 @ 768x50257 forward at 96
# TFLOP/s (gradients 143-150) against 636-766 for 50264 and 50304; 4-byte and 8-byte aligned
# dimensions at 250-284. NVIDIA's matrix multiplication guide asks for multiples of 8 FP16
# elements (16 bytes) for the same reason.
_GPU_MISALIGNED_EFFICIENCY = {2: 0.17, 4: 0.38, 8: 0.38}


def curve_key(family: str, kind: str | None) -> str:
    return family if kind is None else f"{family}/{kind}"


def alignment_bytes(last_dims, itemsize: int) -> int:
    """The alignment of a matrix multiply whose operands' and output's last dimensions hold
    ``last_dims`` elements of ``itemsize`` bytes: the largest power of two dividing every row
    length in bytes, at most :data:`ALIGNED_BYTES`."""
    align = ALIGNED_BYTES
    for n in last_dims:
        row = int(round(n)) * itemsize
        if row <= 0 or abs(n - round(n)) > 1e-9:
            return 1
        align = min(align, row & -row)
    return align


@dataclass(frozen=True)
class EfficiencyCurve:
    eff_max: float          # achieved fraction of peak FLOP/s for large problems
    flops_half: float       # per-call FLOPs at which eff reaches eff_max / 2
    overhead_s: float = 0.0  # fixed cost per call

    def __post_init__(self):
        if not (0 < self.eff_max <= 1 and self.flops_half >= 0 and self.overhead_s >= 0):
            raise ValueError(f"invalid efficiency curve {self}: need 0 < eff_max <= 1, flops_half >= 0, "
                             "overhead_s >= 0")

    def efficiency(self, flops: float) -> float:
        if flops <= 0:
            return self.eff_max
        # Written as a chain of correctly rounded monotone steps so the curve never dips by an ulp.
        return self.eff_max / (1.0 + self.flops_half / flops)


# MAMF figures (costs.md): A100 271/312 = 0.87, H100 794/989 = 0.80 at best shape; H100 1024³
# (2.15e9 FLOPs) at 0.18 of peak gives flops_half ≈ 7.4e9 for eff_max 0.8, i.e. a matmul reaches
# half its best efficiency when it would take 7.4e9 / (989e12 · 0.8) ≈ 9.4 µs at that efficiency.
# Other devices get the same half-efficiency time: flops_half = time · peak · eff_max.
_MATMUL_EFF_MAX = 0.8
_MATMUL_HALF_EFFICIENCY_TIME_S = 7.4e9 / (989.4e12 * _MATMUL_EFF_MAX)
# Memory-bound families: most of their time is bytes over HBM bandwidth. PyTorch inductor's
# roofline assumes a flat 75 % of peak for both terms (costs.md).
_OTHER_EFF_MAX = 0.75
_MEMORY_EFFICIENCY = 0.75


@dataclass(frozen=True)
class ComputeModel:
    """Per-family efficiency curves plus the achieved fraction of memory bandwidth."""
    curves: Mapping[str, EfficiencyCurve] = field(default_factory=dict)
    default_curve: EfficiencyCurve = EfficiencyCurve(_OTHER_EFF_MAX, 0.0)
    memory_efficiency: float = _MEMORY_EFFICIENCY
    # Dtype the matmul FLOPs are priced at ("bf16", "fp32", ...); None = the operator's own dtype.
    compute_dtype: str | None = None
    # alignment (bytes, below ALIGNED_BYTES) -> fraction of the aligned efficiency; empty = no penalty
    misaligned_efficiency: Mapping[int, float] = field(default_factory=dict)
    # Framework time per operator per training step besides its kernels: dispatch, autograd's
    # bookkeeping and its backward, half in the forward and half in the backward. A CPU runs it
    # in line with the kernels; a GPU's host queues kernels ahead, so GPU models leave it 0.
    op_overhead_s: float = 0.0
    # the optimizer's update, per parameter element a device updates (0: not priced)
    update_s_per_param: float = 0.0

    def __post_init__(self):
        if not 0 < self.memory_efficiency <= 1:
            raise ValueError(f"memory_efficiency must be in (0, 1], got {self.memory_efficiency}")
        if not (self.op_overhead_s >= 0 and self.update_s_per_param >= 0):
            raise ValueError(f"op_overhead_s and update_s_per_param must be >= 0, got {self.op_overhead_s}, "
                             f"{self.update_s_per_param}")
        if not all(0 < v <= 1 for v in self.misaligned_efficiency.values()):
            raise ValueError(f"misaligned efficiencies must be in (0, 1], got {dict(self.misaligned_efficiency)}")
        object.__setattr__(self, "curves", MappingProxyType(dict(self.curves)))
        object.__setattr__(self, "misaligned_efficiency",
                           MappingProxyType({int(k): float(v) for k, v in self.misaligned_efficiency.items()}))

    def alignment_factor(self, family: str, align: int) -> float:
        """The fraction of its aligned efficiency a ``family`` operator with contiguous
        dimensions aligned to ``align`` bytes reaches (the nearest smaller measured alignment)."""
        if family not in ALIGNED_FAMILIES or align >= ALIGNED_BYTES or not self.misaligned_efficiency:
            return 1.0
        below = [a for a in self.misaligned_efficiency if a <= align]
        return self.misaligned_efficiency[max(below) if below else min(self.misaligned_efficiency)]

    def curve(self, family: str, kind: str | None = None) -> EfficiencyCurve:
        """The curve of ``kind`` (:func:`operator_kind`) where there is one, else the family's."""
        if kind is not None:
            keyed = self.curves.get(curve_key(family, kind))
            if keyed is not None:
                return keyed
        return self.curves.get(family, self.default_curve)

    def time_s(self, family: str, flops: float, nbytes: float, device: Device, dtype: str = "fp32",
               align: int = ALIGNED_BYTES, kind: str | None = None) -> float:
        """One call of an operator of ``family`` (and ``kind``) doing ``flops`` and moving
        ``nbytes`` on ``device``, its contiguous dimensions aligned to ``align`` bytes."""
        curve = self.curve(family, kind)
        peak = device.peak_flops(self.compute_dtype or dtype)
        eff = curve.efficiency(flops) * self.alignment_factor(family, align)
        t_flops = flops / (peak * eff) if flops > 0 else 0.0
        t_bytes = nbytes / (device.hbm_bytes_per_s * self.memory_efficiency) if nbytes > 0 else 0.0
        return curve.overhead_s + max(t_flops, t_bytes)

    def with_curves(self, **curves: EfficiencyCurve) -> "ComputeModel":
        return replace(self, curves={**self.curves, **curves})

    def to_dict(self) -> dict:
        return {
            "curves": {k: _curve_dict(c) for k, c in sorted(self.curves.items())},
            "default_curve": _curve_dict(self.default_curve),
            "memory_efficiency": self.memory_efficiency,
            "compute_dtype": self.compute_dtype,
            "misaligned_efficiency": {str(k): v for k, v in sorted(self.misaligned_efficiency.items())},
            "op_overhead_s": self.op_overhead_s,
            "update_s_per_param": self.update_s_per_param,
        }

    @staticmethod
    def from_dict(d: Mapping) -> "ComputeModel":
        try:
            return ComputeModel(
                curves={k: EfficiencyCurve(**v) for k, v in d["curves"].items()},
                default_curve=EfficiencyCurve(**d["default_curve"]),
                memory_efficiency=float(d["memory_efficiency"]),
                compute_dtype=d.get("compute_dtype"),
                misaligned_efficiency={int(k): float(v) for k, v in d.get("misaligned_efficiency", {}).items()},
                op_overhead_s=float(d.get("op_overhead_s", 0.0)),
                update_s_per_param=float(d.get("update_s_per_param", 0.0)),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a compute model: {err}") from None


def _curve_dict(c: EfficiencyCurve) -> dict:
    return {f.name: getattr(c, f.name) for f in fields(c)}


def default_compute_model(device: Device, dtype: str = "bf16") -> ComputeModel:
    """Datasheet-based defaults for ``device`` (see the figures above); the alignment penalty
    is the GPUs' (the CPU placeholder has none)."""
    flops_half = _MATMUL_HALF_EFFICIENCY_TIME_S * device.peak_flops(dtype) * _MATMUL_EFF_MAX
    matmul = EfficiencyCurve(_MATMUL_EFF_MAX, flops_half)
    misaligned = {} if device.placeholder else _GPU_MISALIGNED_EFFICIENCY
    return ComputeModel(curves={f: matmul for f in MATMUL_FAMILIES}, misaligned_efficiency=misaligned)
