"""Multi-process checks of frontier plans with ZeRO, recomputation and pipeline stages; run under torchrun.

    torchrun --standalone --nproc-per-node N tests/dist_scripts/beyond_worker.py --case gpt:rc_mp,mlp:zero3_mp

Rank 0 computes the frontier for ``cpu:N`` (models and inputs of ``plan_worker``) and sends
it to the others (``plan_worker.on_rank0``); every rank picks the case's plan, computes the
single-process reference, lays a copy out and runs one step on the full batch (each rank
passes the whole batch), compares loss and every full gradient, then 3 Adam steps and the loss after them. Cases listed in ``--measure`` also
measure one step's peak memory (MemTracker) of the plan and of the same plan laid out
without its ZeRO stage / recomputation ("baseline"). Rank 0 prints one ``RESULT {json}`` per case.

Selectors (first frontier point, fastest first, that matches; the frontier is searched without
pipeline stages unless the selector asks for them, and without recomputation for a ZeRO
selector that does not ask for it):
  zero3_mp / zero2_mp   ZeRO stage 3 / 2 on a plan with a model-parallel axis
  zero3_dp              ZeRO stage 3 on an all-data-parallel plan (FSDP2)
  rc_mp / rc_dp         recomputation on a plan with / without a model-parallel axis
  zero3_rc_mp           ZeRO-3 and recomputation with a model-parallel axis
  pp / pp_rc / pp_mp    pipeline stages (any / with recomputation / with a model-parallel stage plan)
  min_memory            the frontier's minimum-memory point
  tied_copy             a plan whose tied lm_head works on a copy of the embedding weight in
                        another layout (``traffic.tied_copy``)
A ``@k`` suffix picks the k-th match (0-based); ``@last`` the last (lowest-memory) one.
  setup_<parts>         not a frontier plan: ``tensoropt.plan_for`` with the degrees named by the
                        parts, e.g. ``setup_tp2_sp_rc`` (tp=2, sequence parallel, full
                        recomputation; ``rcop`` per-operator selective), ``setup_pp2_tp2_mb4``,
                        ``setup_dp2_zero3``
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from plan_worker import (LR, MODELS, get_frontier, make_inputs, make_model, on_rank0, rel_err,  # noqa: E402
                         single_process_reference)

import tensoropt  # noqa: E402
from tensoropt.capture import capture  # noqa: E402

from tensoropt.apply import count_collectives, full_grads, parallelize, step_peak_memory, train_step  # noqa: E402
from tensoropt.comms import issued_collectives, summarize_for_backend  # noqa: E402
from tensoropt.execution import apply_mode  # noqa: E402
from tensoropt.launch import finish_worker, run_each  # noqa: E402
from tensoropt.strategy import OpConfig  # noqa: E402
from tensoropt.training import TrainingConfig  # noqa: E402
from tensoropt.traffic import tied_copy, tied_uses  # noqa: E402


def _mode(plan, key: str, graph) -> str:
    return apply_mode(graph, plan)


def _tied_copy_bytes(plan, graph) -> float:
    out = 0.0
    for i, k in tied_uses(graph):
        name = graph.operators[i].param_names[k]
        f = next(j for j, op in enumerate(graph.operators) if name in op.param_names)
        out += tied_copy(graph.operators[f], graph.operators[f].param_names.index(name),
                         OpConfig.parse(plan.ops[f].config), graph.operators[i], k,
                         OpConfig.parse(plan.ops[i].config), plan.mesh_shape,
                         TrainingConfig.of_plan(plan.training), plan.zero_stage)[0]
    return out


def _matches(plan, key: str, which: str, graph) -> bool:
    z, rc, st = plan.zero_stage, bool(plan.recompute), bool(plan.stages)
    if which == "min_memory":
        return True
    if which == "tied_copy":
        return not st and _tied_copy_bytes(plan, graph) > 0
    if which.startswith("pp"):
        if not st:
            return False
        if which == "pp_rc":
            return bool(plan.recompute)
        if which == "pp_mp":
            return any("tp" in s.summary or "mix" in s.summary for s in plan.stages)
        return True
    if st:
        return False
    want_z = {"zero3": 3, "zero2": 2}.get(which.split("_")[0], 0)
    if want_z and z != want_z:
        return False
    if not want_z and z:
        return False
    if ("_rc" in which or which.startswith("rc")) != rc:
        return False
    mode = _mode(plan, key, graph)
    return (mode == "dtensor") == which.endswith("_mp")


def setup_kwargs(which: str) -> dict:
    kw = {}
    for part in which.split("_")[1:]:
        if part == "sp":
            kw["sequence_parallel"] = True
        elif part == "rc":
            kw["recompute"] = "full"
        elif part == "rcop":
            kw["recompute"] = "op"
        elif part.startswith("zero"):
            kw["zero"] = int(part[4:])
        elif part.startswith("mb"):
            kw["microbatches"] = int(part[2:])
        else:
            kw[part[:2]] = int(part[2:])
    return kw


def pick(f, key: str, which: str, graph):
    which, _, k = which.partition("@")
    if which == "min_memory":
        return f.min_memory()
    found = [p for p in f.plans if _matches(p, key, which, graph)]
    if not found:
        raise LookupError(f"no frontier plan matches {which!r}: "
                          f"{[p.summary for p in f.plans]}")
    return found[-1] if k == "last" else found[int(k or 0)]


def baseline_of(plan, which: str):
    """The same per-operator plan without what the selector names (ZeRO and/or recomputation),
    for the direction check: only the layout changes, the plan's numbers are not used."""
    kw = {}
    if "rc" in which:
        kw["recompute"] = ()
    if "zero" in which:
        kw["zero_stage"] = 0
    if plan.stages:
        return dataclasses.replace(plan, **kw, stages=tuple(dataclasses.replace(s, **kw) for s in plan.stages))
    return dataclasses.replace(plan, **kw)


def rebatched(inputs, m: int):
    """The inputs cut to one of ``m`` micro-batches along dimension 0."""
    return tuple(t[: t.shape[0] // m] if isinstance(t, torch.Tensor) and t.dim() else t for t in inputs)


def build(key: str, plan, graph):
    """(step() -> loss, params, grads() -> full grads) for a laid-out copy of the model."""
    model = make_model(key)
    inputs = make_inputs(key)
    if plan.stages:
        runner = parallelize(model, plan)
        return (lambda: runner.step(*inputs)), list(runner.parameters()), runner.full_grads, model, model
    parallelize(model, plan)

    def step():
        return train_step(model, *inputs)
    return step, list(model.parameters()), (lambda: full_grads(model)), model, model


def run_case(case: str, world: int, measure: bool) -> dict:
    key, which = case.split(":")
    # a selector of one operator-level plan picks among the frontier without pipelines (on
    # the peak frontier pipeline plans dominate most ZeRO and recomputation plans)
    if which.startswith("setup"):
        def price():
            meta = make_model(key, "meta")
            graph = capture(meta, make_inputs(key, "meta"), name=MODELS[key][0])
            return tensoropt.plan_for(meta, f"cpu:{world}", inputs=make_inputs(key, "meta"),
                                      **setup_kwargs(which)), graph
        plan, graph = on_rank0(price)
    else:
        # a ZeRO selector without recomputation searches without it: on these small models the
        # DTensor runner's per-parameter ZeRO-2/3 collectives leave no such plan among the
        # fastest of a frontier with recomputation
        plain_zero = which.split("@")[0] in ("zero3_mp", "zero2_mp", "zero3_dp")
        f, graph = get_frontier(key, world, extras=True, pipeline=which.startswith(("pp", "min_memory")),
                                recompute=False if plain_zero else None)
        plan = pick(f, key, which, graph)
    inputs = make_inputs(key)
    res = {"case": case, "world": world, "plan": plan.summary, "mesh": list(plan.mesh_shape),
           "zero_stage": plan.zero_stage, "recompute": list(plan.recompute), "stages": len(plan.stages),
           "microbatches": plan.microbatches, "predicted_memory_bytes": plan.memory_bytes,
           "predicted_peak_bytes": plan.peak_memory_bytes}

    loss_ref, g_ref, loss3_ref = single_process_reference(key, inputs)

    step, params, grads_fn, tracked, _ = build(key, plan, graph)
    res["mode"] = _mode(plan, key, graph)
    if plan.microbatches > 1 and not plan.stages:
        try:                                      # the whole batch through model(...) is refused
            tracked(*inputs)
            res["whole_batch_refused"] = False
        except ValueError as e:
            res["whole_batch_refused"] = "train_step" in str(e)
    if plan.microbatches > 1 and not plan.stages:
        # one step's collectives against what the apply layer issues for m micro-batches
        # (gradients reduced once per step without ZeRO): counted on the micro-batch's graph
        out = {}
        measured = count_collectives(lambda: out.setdefault("loss", step()))
        loss = out["loss"]
        micro = on_rank0(lambda: capture(make_model(key, "meta"), rebatched(make_inputs(key, "meta"),
                                                                             plan.microbatches), name=MODELS[key][0]))
        res["predicted"] = summarize_for_backend(issued_collectives(plan, micro, res["mode"]),
                                                 tuple(plan.mesh_shape), "gloo")
        res["measured"] = {k: {"count": v["count"], "bytes": v["bytes"]} for k, v in measured.items()}
    else:
        loss = step()
    res["loss"] = float(loss.detach())
    res["loss_ref"] = float(loss_ref.detach())
    res["loss_rel"] = abs(res["loss"] - res["loss_ref"]) / abs(res["loss_ref"])
    grads = grads_fn()
    floor = 1e-4 * max(float(g.abs().max()) for g in g_ref.values())
    errs = {n: (rel_err(grads[n], g, floor) if grads.get(n) is not None else None) for n, g in g_ref.items()}
    res["grad_missing"] = [n for n, e in errs.items() if e is None]
    res["grad_max_rel"] = max((e for e in errs.values() if e is not None), default=0.0)
    res["grad_worst"] = max(errs, key=lambda n: errs[n] or 0.0)
    opt = torch.optim.Adam(params, lr=LR)
    opt.step()
    opt.zero_grad()
    for _ in range(2):
        step()
        opt.step()
        opt.zero_grad()
    loss3 = step()
    opt.zero_grad()
    res["loss3"] = float(loss3.detach())
    res["loss3_ref"] = loss3_ref
    res["loss3_rel"] = abs(res["loss3"] - loss3_ref) / abs(loss3_ref)
    if measure:
        mem = step_peak_memory(step, opt, tracked, modules=not (plan.stages or plan.microbatches > 1))
        res["peak_bytes"] = mem["peak_bytes"]
        res["peak_by_category"] = mem["by_category"]
        if "rc" not in which and "zero" not in which or which.startswith("setup"):
            return res
        base = baseline_of(plan, which)
        bstep, bparams, _, btracked, _ = build(key, base, graph)
        bopt = torch.optim.Adam(bparams, lr=LR)
        bmem = step_peak_memory(bstep, bopt, btracked, modules=not (plan.stages or plan.microbatches > 1))
        res["baseline_peak_bytes"] = bmem["peak_bytes"]
        res["baseline_by_category"] = bmem["by_category"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, help="comma-separated model:selector")
    ap.add_argument("--measure", default="", help="comma-separated cases to measure memory for")
    args = ap.parse_args()
    if os.environ.get("TENSOROPT_DUMP_AFTER_S"):
        import faulthandler
        faulthandler.dump_traceback_later(int(os.environ["TENSOROPT_DUMP_AFTER_S"]), exit=True)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    measure = set(filter(None, args.measure.split(",")))
    torch.set_num_threads(1)
    run_each(args.case.split(","), lambda case: run_case(case, world, case in measure),
             lambda case: {"case": case, "world": world})


if __name__ == "__main__":
    main()
    finish_worker()
