"""tensoropt: the time/memory Pareto frontier of parallel training plans for PyTorch models.

    import tensoropt
    f = tensoropt.frontier(model, devices="8xA100-80GB", inputs={"input_ids": ids, "labels": ids})
    f.to_pandas(); f.plot()
    plan = f.best(memory_budget="40GB")
    model = tensoropt.parallelize(model, plan)      # under torchrun, any plan
    loss = tensoropt.train_step(model, input_ids=ids, labels=ids)

Names are loaded on first use, so ``import tensoropt.engine`` stays free of torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "frontier": ("tensoropt.search", "frontier"),
    "plan_for": ("tensoropt.search", "plan_for"),
    "Setup": ("tensoropt.setups", "Setup"),
    "Frontier": ("tensoropt.frontiers", "Frontier"),
    "InfeasibleBudget": ("tensoropt.budget", "InfeasibleBudget"),
    "Plan": ("tensoropt.plan", "Plan"),
    "parallelize": ("tensoropt.apply", "parallelize"),
    "train_step": ("tensoropt.apply", "train_step"),
    "Cluster": ("tensoropt.mesh", "Cluster"),
    "parse_devices": ("tensoropt.mesh", "parse_devices"),
    "TrainingConfig": ("tensoropt.training", "TrainingConfig"),
    "CaptureError": ("tensoropt.capture", "CaptureError"),
    "UnpricedOpsWarning": ("tensoropt.search", "UnpricedOpsWarning"),
    "profile": ("tensoropt.profile.run", "profile"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tensoropt' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
