"""Measured cost-model parameters: operator and collective micro-benchmarks, fitted.

    prof = profile("cpu:2", out="data/profiles/cpu-2core.json")      # or Profile.load(path)
    compute = prof.compute_model()                  # per-family EfficiencyCurve
    device = prof.device(get_device("cpu"))         # measured peak FLOP/s and bandwidth
    comms = prof.collective_model(get_link("gloo-loopback"))

Command line: ``python -m tensoropt.profile --devices cpu:2 --out data/profiles/NAME.json [--quick]``.
"""

from .data import (CollectiveMeasurement, ComputeMeasurement, FittedCollective, FittedCurve, GroupFit,
                   MachineInfo, Profile, ProfileMismatchWarning, TimeStats)
from .devices import DeviceNotPresentError, DeviceSet, parse_device_set
from .fit import CollectivePoint, ComputePoint, FitError, fit_collective, fit_efficiency_curve
from .run import ProfileError, profile
from .cli import main

__all__ = [
    "profile", "main", "Profile", "ProfileError", "ProfileMismatchWarning", "DeviceNotPresentError",
    "DeviceSet", "parse_device_set", "MachineInfo", "TimeStats", "ComputeMeasurement", "CollectiveMeasurement",
    "FittedCurve", "FittedCollective", "GroupFit", "ComputePoint", "CollectivePoint", "FitError",
    "fit_efficiency_curve", "fit_collective",
]
