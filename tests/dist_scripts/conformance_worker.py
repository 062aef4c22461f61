"""Third-party models under ``tensoropt.parallelize``: one saved frontier plan per case; run under torchrun.

    torchrun --standalone --nproc-per-node N tests/dist_scripts/conformance_worker.py \\
        --plans DIR --case llama:0,llama:3,...

Case ``family:k`` loads ``DIR/family-k.json`` (a plan saved by the test from the frontier it
searched on ``cpu:N``), builds the family's model with the same seed as the single-process
reference, lays it out with ``tensoropt.parallelize(model, path)`` -- nothing else: no graph,
no inputs, whatever the plan (pipelines included) -- and compares the first step's loss and
every gradient, the loss and the floating-point buffers (BatchNorm's running statistics)
after three Adam steps, and the second Adam step's peak memory
(``tensoropt.apply.peak_memory``: gradients and optimizer state resident, as
``step_peak_memory`` measures; the largest over the ranks) with the plan's ``peak_memory_bytes``. Rank 0 prints one ``RESULT {json}`` line per case.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import tensoropt  # noqa: E402
from tensoropt.apply import PipelineRunner, full_grads, peak_memory, train_step  # noqa: E402
from tensoropt.launch import finish_worker, run_each  # noqa: E402
from tests.third_party.families import EXTRA, FAMILIES  # noqa: E402

LR = 1e-2
FAMILIES = {**FAMILIES, **EXTRA}      # the suite's and those scripts/try_families.py tries


def call(model, inputs):
    """One forward + backward (``train_step``) with the family's inputs, positional or keyword."""
    if isinstance(inputs, dict):
        return train_step(model, **inputs)
    return train_step(model, *inputs)


def three_adam_steps(model, params, inputs, measure=None) -> float:
    """From the first step's gradients: three Adam steps, then the loss. ``measure(step)``
    runs the second step (gradients and optimizer state resident, the scope of
    ``Plan.peak_memory_bytes``) instead of calling it."""
    opt = torch.optim.Adam(params, lr=LR)

    def step():
        call(model, inputs)
        opt.step()
        opt.zero_grad(set_to_none=False)

    opt.step()
    opt.zero_grad(set_to_none=False)
    if measure is None:
        step()
    else:
        measure(step, opt)
    step()
    return float(call(model, inputs).detach())


_REFERENCE: dict = {}


def reference(family: str, batch: int):
    if (family, batch) not in _REFERENCE:
        fam = FAMILIES[family]
        inputs = fam.inputs(batch, "cpu")
        model = fam.build()
        loss = float(call(model, inputs).detach())
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        loss3 = three_adam_steps(model, list(model.parameters()), inputs)
        _REFERENCE[family, batch] = (loss, grads, loss3, float_buffers(model))
    return _REFERENCE[family, batch]


def float_buffers(model) -> dict:
    """Floating-point buffers (BatchNorm's running statistics), whole."""
    return {n: (b.full_tensor() if isinstance(b, DTensor) else b).detach().clone()
            for n, b in model.named_buffers() if b.is_floating_point()}


def run_case(case: str, world: int, plans: str) -> dict:
    t0 = time.perf_counter()
    family, k = case.split(":")
    path = os.path.join(plans, f"{family}-{k}.json")
    plan = tensoropt.Plan.load(path)
    fam = FAMILIES[family]
    batch = plan.training["batch_size"]
    inputs = fam.inputs(batch, "cpu")
    loss_ref, g_ref, loss3_ref, b_ref = reference(family, batch)

    t1 = time.perf_counter()
    model = tensoropt.parallelize(fam.build(), path)
    t2 = time.perf_counter()
    pipelined = isinstance(model, PipelineRunner)
    params = list(model.parameters())
    loss = float(call(model, inputs).detach())
    grads = model.full_grads() if pipelined else full_grads(model)
    floor = 1e-4 * max(float(g.abs().max()) for g in g_ref.values())
    errs = {n: float((grads[n] - g).abs().max()) / max(float(g.abs().max()), floor)
            for n, g in g_ref.items() if grads.get(n) is not None}
    mem = {}

    def measure(step, opt):
        t = time.perf_counter()
        mem.update(peak_memory(step, model.model if pipelined else model, opt, modules=not pipelined))
        mem["seconds"] = time.perf_counter() - t

    loss3 = three_adam_steps(model, params, inputs, measure)
    # the plan's peak is the largest over devices (a pipeline's over its stages): every rank's
    peak = torch.tensor([float(mem["peak_bytes"])], dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    bufs = float_buffers(model.model if pipelined else model)
    b_errs = {n: float((bufs[n] - b).abs().max()) / max(float(b.abs().max()), 1e-6)
              for n, b in b_ref.items() if n in bufs}
    return {"case": case, "world": world, "plan": plan.summary, "stages": len(plan.stages),
            "loss": loss, "loss_ref": loss_ref, "loss_rel": abs(loss - loss_ref) / abs(loss_ref),
            "grad_missing": sorted(set(g_ref) - set(errs)), "grad_max_rel": max(errs.values(), default=0.0),
            "grad_worst": max(errs, key=errs.get) if errs else None,
            "loss3": loss3, "loss3_ref": loss3_ref, "loss3_rel": abs(loss3 - loss3_ref) / abs(loss3_ref),
            "buffers_max_rel": max(b_errs.values(), default=0.0),
            "buffers_worst": max(b_errs, key=b_errs.get) if b_errs else None,
            "peak_bytes": int(peak.item()), "predicted_peak_bytes": plan.peak_memory_bytes,
            "peak_by_category": mem.get("by_category"),
            "seconds": {"reference": t1 - t0, "parallelize": t2 - t1, "steps": time.perf_counter() - t2,
                        "of which measured": mem["seconds"]}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, help="comma-separated family:k")
    ap.add_argument("--plans", required=True, help="directory of the saved plans")
    args = ap.parse_args()
    # a failing pipeline case leaves the other stages waiting: time their collectives out
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    world = dist.get_world_size()
    torch.set_num_threads(1)
    run_each(args.case.split(","), lambda case: run_case(case, world, args.plans),
             lambda case: {"case": case, "world": world})


if __name__ == "__main__":
    main()
    finish_worker()
