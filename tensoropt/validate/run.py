"""Run plans for real: ``measure_plans(key, plans, world=2)`` launches the measurement worker
under torchrun (gloo on CPU) and returns measured step time and peak memory per plan."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["measure_plans"]

_WORKER = Path(__file__).with_name("worker.py")


def measure_plans(key: str, plans, world: int = 2, steps: int = 5, warmup: int = 2,
                  timeout_s: float = 600.0) -> list[dict]:
    """Train each plan ``steps`` Adam steps on ``world`` local ranks and measure it.

    ``key``: a model of :data:`tensoropt.validate.cases.MODELS` (the plans must be made for it).
    Returns, per plan, ``{"plan", "predicted_time_s", "measured_time_s", "predicted_memory_bytes",
    "measured_memory_bytes", "loss_first", "loss_last"}``; raises RuntimeError naming the plan
    when a run fails.
    """
    from ..launch import run_torchrun

    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, plan in enumerate(plans):
            path = os.path.join(tmp, f"plan{i}.json")
            plan.save(path)
            files.append(path)
        res = run_torchrun(str(_WORKER), ["--model", key, "--plans", ",".join(files), "--steps", str(steps),
                                          "--warmup", str(warmup)], nproc=world, timeout=timeout_s)
    got = {r.get("plan_file"): r for r in res.results}
    out = []
    for i, plan in enumerate(plans):
        r = got.get(f"plan{i}.json")
        if r is None or not r.get("ok"):
            why = (r or {}).get("error") or res.summary(1500)
            raise RuntimeError(f"measuring plan {plan.summary} on {world} ranks failed: {why}")
        out.append({"plan": plan.summary, "predicted_time_s": plan.time_s, "measured_time_s": r["time_median_s"],
                    "predicted_memory_bytes": plan.peak_memory_bytes, "measured_memory_bytes": r["peak_bytes"],
                    "loss_first": r["loss_first"], "loss_last": r["loss_last"]})
    return out
