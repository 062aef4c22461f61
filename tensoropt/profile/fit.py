"""Fitting measured times to the cost model's forms.

Compute, per family (``tensoropt.compute``), with the profile's peak P, bandwidth H and
memory efficiency m fixed:

    t = overhead_s + max((F + flops_half) / (P·eff_max), nbytes / (H·m))

(F/(P·eff(F)) with eff(F) = eff_max·F/(F + flops_half) is (F + flops_half)/(P·eff_max)).
Fitted by bounded non-linear least squares on log times (relative error), multi-start.
The form has two degenerate cases, resolved to a canonical point that predicts the same
times: no memory-bound point (overhead and flops_half trade off exactly) -> overhead_s = 0,
and generally overhead_s is kept only when leaving it out fits clearly worse;
no compute-bound point (eff_max and flops_half unconstrained) -> eff_max = 1, flops_half = 0.

Collectives, per kind (``tensoropt.collectives``): t = steps(p)·α + factor(p)·n/B, with steps
and factor taken from the formulas themselves; linear least squares with α, 1/B >= 0, rows
weighted by 1/t (relative error).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..collectives import FORMULAS
from .data import FittedCollective, FittedCurve, GroupFit

__all__ = ["ComputePoint", "CollectivePoint", "fit_efficiency_curve", "fit_collective", "curve_time_s",
           "FitError"]

#: lower bounds that stand for zero inside the log-parameterised fit
_TINY_FLOPS = 1.0
_TINY_S = 1e-12
#: largest efficiency: the peak is the best achieved rate
_EFF_MAX_BOUND = 1.0
_EFF_MIN_BOUND = 1e-6
#: relative cost increase accepted for the canonical point of a degenerate fit
_TIE_TOLERANCE = 1e-6
_HUGE_BANDWIDTH = 1e300
#: the overhead is fitted only if leaving it out raises the squared log error by more than this
_OVERHEAD_COST_TOLERANCE = 0.1
_COST_FLOOR = 1e-12


class FitError(ValueError):
    """Not enough (or unusable) measurements to fit."""


@dataclass(frozen=True)
class ComputePoint:
    flops: float
    nbytes: float
    time_s: float      # per kernel call


@dataclass(frozen=True)
class CollectivePoint:
    group_size: int
    nbytes: float
    time_s: float


# ------------------------------------------------------------------------------ compute

def curve_time_s(flops, nbytes, eff_max, flops_half, overhead_s, peak_flops_per_s, mem_bytes_per_s):
    """Vectorised model time (mem_bytes_per_s = H·m)."""
    flops = np.asarray(flops, dtype=float)
    nbytes = np.asarray(nbytes, dtype=float)
    t_flops = np.where(flops > 0, (flops + flops_half) / (peak_flops_per_s * eff_max), 0.0)
    return overhead_s + np.maximum(t_flops, nbytes / mem_bytes_per_s)


def fit_efficiency_curve(points: Sequence[ComputePoint], peak_flops_per_s: float, hbm_bytes_per_s: float,
                         memory_efficiency: float = 1.0) -> FittedCurve:
    if not points:
        raise FitError("no measurements to fit an efficiency curve to")
    F = np.array([p.flops for p in points], dtype=float)
    B = np.array([p.nbytes for p in points], dtype=float)
    T = np.array([p.time_s for p in points], dtype=float)
    if not (np.all(T > 0) and np.all(np.isfinite(T)) and np.all(F >= 0) and np.all(B >= 0)):
        raise FitError("measurements need positive finite times and non-negative FLOPs/bytes")
    mem = hbm_bytes_per_s * memory_efficiency
    if not np.any(F > 0):
        # no arithmetic (embedding): only the overhead and the memory term
        o = _fit_overhead_only(B / mem, T)
        return _finish(F, B, T, 1.0, 0.0, o, peak_flops_per_s, mem, overhead_resolved=o > 0)

    free = _least_squares(F, B, T, peak_flops_per_s, mem, fix_overhead=None)
    no_overhead = _least_squares(F, B, T, peak_flops_per_s, mem, fix_overhead=0.0)
    # The overhead is kept only when the data need it: without memory-bound points it trades
    # off exactly against flops_half, and under a large memory term it is lost in the noise.
    needs_overhead = no_overhead.cost > free.cost * (1 + _OVERHEAD_COST_TOLERANCE) + _COST_FLOOR
    e, fh, o = free.params if needs_overhead else no_overhead.params
    chosen = free if needs_overhead else no_overhead
    # When the compute term never binds (or only ties with the memory term), eff_max and
    # flops_half are unconstrained: take the smallest compute term, which fits as well.
    if _log_cost(F, B, T, _EFF_MAX_BOUND, 0.0, o, peak_flops_per_s, mem) <= chosen.cost * (1 + _TIE_TOLERANCE) \
            + _COST_FLOOR:
        e, fh = _EFF_MAX_BOUND, 0.0
    return _finish(F, B, T, e, fh, o, peak_flops_per_s, mem, overhead_resolved=needs_overhead)


def _log_cost(F, B, T, e, fh, o, peak, mem) -> float:
    r = np.log(curve_time_s(F, B, e, fh, o, peak, mem)) - np.log(T)
    return 0.5 * float(np.sum(r * r))


def _fit_overhead_only(t_mem, T) -> float:
    from scipy.optimize import minimize_scalar
    hi = float(T.max())
    res = minimize_scalar(lambda o: float(np.sum((np.log(o + t_mem) - np.log(T)) ** 2)),
                          bounds=(0.0, hi), method="bounded", options={"xatol": hi * 1e-9})
    return _snap(float(res.x), float(T.min()) * 1e-6)


@dataclass(frozen=True)
class _LsqResult:
    params: tuple[float, float, float]   # eff_max, flops_half, overhead_s
    cost: float                          # half the sum of squared log residuals


def _least_squares(F, B, T, peak, mem, fix_overhead):
    from scipy.optimize import least_squares
    logT = np.log(T)

    def unpack(x):
        e = math.exp(x[0])
        fh = math.exp(x[1])
        o = fix_overhead if fix_overhead is not None else math.exp(x[2])
        return e, fh, o

    def resid(x):
        e, fh, o = unpack(x)
        return np.log(curve_time_s(F, B, e, fh, o, peak, mem)) - logT

    f_pos = F[F > 0]
    f_scale = float(np.median(f_pos))
    lo = [math.log(_EFF_MIN_BOUND), math.log(_TINY_FLOPS)]
    hi = [math.log(_EFF_MAX_BOUND), math.log(max(f_pos.max(), _TINY_FLOPS) * 1e3)]
    if fix_overhead is None:
        lo.append(math.log(_TINY_S))
        hi.append(math.log(float(T.max())))
    best = None
    starts_o = (float(T.min()) / 2, float(T.min()) / 20, float(T.min()) / 1000)
    for e0, fh_mult, o0 in itertools.product((0.05, 0.3, 0.9), (0.01, 1.0, 30.0), starts_o):
        x0 = [math.log(e0), math.log(max(f_scale * fh_mult, _TINY_FLOPS * 2))]
        if fix_overhead is None:
            x0.append(math.log(o0))
        elif o0 != starts_o[0]:
            continue
        x0 = np.clip(x0, np.array(lo) + 1e-9, np.array(hi) - 1e-9)
        res = least_squares(resid, x0, bounds=(lo, hi), x_scale=1.0, xtol=1e-12, ftol=1e-12, gtol=1e-12,
                            max_nfev=2000)
        if best is None or res.cost < best.cost:
            best = res
    e, fh, o = unpack(best.x)
    return _LsqResult((min(e, _EFF_MAX_BOUND), _snap(fh, _TINY_FLOPS * 10), _snap(o, _TINY_S * 10)),
                      float(best.cost))


def _snap(value: float, zero_below: float) -> float:
    return 0.0 if value < zero_below else value


def _finish(F, B, T, e, fh, o, peak, mem, overhead_resolved) -> FittedCurve:
    rel = np.abs(curve_time_s(F, B, e, fh, o, peak, mem) / T - 1.0)
    return FittedCurve(eff_max=float(e), flops_half=float(fh), overhead_s=float(o), points=len(T),
                       rel_error_median=float(np.median(rel)), rel_error_max=float(rel.max()),
                       overhead_resolved=bool(overhead_resolved))


# ------------------------------------------------------------------------------ collectives

def collective_factors(kind: str, group_size: int) -> tuple[float, float]:
    """(steps, factor) with t = steps·α + factor·n/B, read off collectives.py's formula."""
    if kind not in FORMULAS:
        raise FitError(f"unknown collective kind {kind!r}; known: {', '.join(FORMULAS)}")
    f = FORMULAS[kind]
    steps = f(1.0, group_size, 1.0, _HUGE_BANDWIDTH)
    factor = f(1.0, group_size, 0.0, 1.0)
    return steps, factor


def _fit_ab(kind, pts):
    from scipy.optimize import lsq_linear
    A = np.array([collective_factors(kind, p.group_size) for p in pts], dtype=float)
    A[:, 1] *= np.array([p.nbytes for p in pts], dtype=float)
    T = np.array([p.time_s for p in pts], dtype=float)
    if not np.all(T > 0):
        raise FitError(f"{kind}: times must be positive")
    W = A / T[:, None]
    if np.linalg.matrix_rank(W) < 2:
        raise FitError(f"{kind}: need at least two distinct message sizes to separate α and B")
    res = lsq_linear(W, np.ones_like(T), bounds=(0.0, np.inf), method="bvls", tol=1e-14)
    alpha, beta = (float(v) for v in res.x)
    beta = max(beta, 1.0 / _HUGE_BANDWIDTH)
    rel = np.abs((A @ np.array([alpha, beta])) / T - 1.0)
    return alpha, 1.0 / beta, float(np.median(rel)), float(rel.max())


def fit_collective(kind: str, points: Sequence[CollectivePoint]) -> FittedCollective:
    pts = [p for p in points if p.group_size > 1 and p.nbytes > 0]
    if len(pts) < 2:
        raise FitError(f"{kind}: need at least two measurements with p > 1 and n > 0, got {len(pts)}")
    alpha, bw, med, mx = _fit_ab(kind, pts)
    groups = sorted({p.group_size for p in pts})
    per_group = []
    for g in groups:
        sub = [p for p in pts if p.group_size == g]
        try:
            a, b, gm, gx = _fit_ab(kind, sub)
        except FitError:
            continue
        per_group.append(GroupFit(g, a, b, gm, gx))
    return FittedCollective(latency_s=alpha, bandwidth_bytes_per_s=bw, group_sizes=tuple(groups), points=len(pts),
                            rel_error_median=med, rel_error_max=mx, per_group=tuple(per_group))
