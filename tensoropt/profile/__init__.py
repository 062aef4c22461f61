"""Measured cost-model parameters: operator and collective micro-benchmarks, fitted.

    prof = profile("cpu:2", out="data/profiles/cpu-2core.json")      # or Profile.load(path)
    compute = prof.compute_model()                  # per-family EfficiencyCurve
    device = prof.device(get_device("cpu"))         # measured peak FLOP/s and bandwidth
    comms = prof.collective_model(get_link("gloo-loopback"))

Command line: ``python -m tensoropt.profile --devices cpu:2 --out data/profiles/NAME.json [--quick]``.

A :class:`Profile` (``data``) is plain data the cost model reads; measuring one
(``run.profile``, which launches collective benchmarks under ``torchrun``) and the command
line (``cli``) load only when asked for, so reading a profile imports neither.
"""

import importlib

from .data import (CollectiveMeasurement, ComputeMeasurement, FittedCollective, FittedCurve, GroupFit,
                   MachineInfo, Profile, ProfileMismatchWarning, TimeStats)
from .devices import DeviceNotPresentError, DeviceSet, parse_device_set
from .fit import CollectivePoint, ComputePoint, FitError, fit_collective, fit_efficiency_curve

__all__ = [
    "profile", "main", "Profile", "ProfileError", "ProfileMismatchWarning", "DeviceNotPresentError",
    "DeviceSet", "parse_device_set", "MachineInfo", "TimeStats", "ComputeMeasurement", "CollectiveMeasurement",
    "FittedCurve", "FittedCollective", "GroupFit", "ComputePoint", "CollectivePoint", "FitError",
    "fit_efficiency_curve", "fit_collective",
]

_RUNNERS = {"profile": "tensoropt.profile.run", "ProfileError": "tensoropt.profile.run",
            "main": "tensoropt.profile.cli"}


def __getattr__(name: str):
    if name in _RUNNERS:
        return getattr(importlib.import_module(_RUNNERS[name]), name)
    raise AttributeError(f"module 'tensoropt.profile' has no attribute {name!r}")
