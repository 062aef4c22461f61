"""Multi-process checks of ``tensoropt.parallelize(model, plan)`` for frontier plans; run under torchrun.

    torchrun --standalone --nproc-per-node N tests/dist_scripts/plan_worker.py --case gpt-tiny:dp,mlp:min_time

Rank 0 computes the frontier for ``cpu:N`` and sends it to the others (``on_rank0``); every
rank picks the case's plan, computes the single-process reference on the full batch, lays a
copy out with ``parallelize(model, plan)``, runs one step on the full batch (each rank) and compares loss
and every full gradient, then 3 Adam steps and the loss after them. One step's collectives
(forward + backward) are counted and compared with ``tensoropt.comms.issued_collectives``. Rank 0
prints one ``RESULT {json}`` line per case.

Plans per model: dp (reference "data parallel"), dp_zero2 / dp_zero3 / dp_rc (that plan with
ZeRO stage 2 or 3, or with every repeated block recomputed: FSDP2 on the model's own code),
tp (the first frontier plan whose every mesh axis is tensor-parallel, else the Megatron
reference), hybrid ("megatron dp2·tp2", 4 ranks), megatron ("megatron dp1·tp<N>"), min_time,
min_memory; a ``_plain`` suffix
picks from the frontier searched without ZeRO and recomputation
(``frontier(..., zero=False, recompute=False)``). Plans run on the model's own code report
how often a forward pre-hook on the last block's first child fires per step (twice when the
block is recomputed).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import tensoropt  # noqa: E402
from tensoropt.apply import (PipelineRunner, count_collectives, full_grads, layout_of, parallelize,  # noqa: E402
                             step_peak_memory, train_step)
from tensoropt.capture import capture  # noqa: E402
from tensoropt.comms import issued_collectives, summarize, summarize_for_backend  # noqa: E402
from tensoropt.launch import finish_worker, run_each  # noqa: E402

# Zoo name, config overrides, batch. "mlp" is mlp-tiny widened so tensor-parallel plans pair layers.
MODELS = {
    "mlp": ("mlp-tiny", {"widths": (16, 64, 32, 64, 16)}, 8),
    "gpt": ("gpt-tiny", {}, 8),
    "cnn": ("cnn-tiny", {}, 8),
    # GQA: 2 key/value heads, fewer than the 4 ranks of a tensor-parallel plan
    "llama": ("llama-tiny", {}, 8),
    # Memory cases: parameters and activations dominate (see tests/test_apply_plans.py).
    "mlp-big": ("mlp-tiny", {"widths": (512, 1024, 1024, 512)}, 256),
    "gpt-big": ("gpt-tiny", {"d_model": 256, "n_heads": 4, "vocab_size": 512, "seq_len": 64}, 16),
}
LR = 1e-2


def make_model(key: str, device: str = "cpu") -> torch.nn.Module:
    from tensoropt.models import get_model
    name, ov, _ = MODELS[key]
    torch.manual_seed(0)
    return get_model(name, device=device, **ov)


def single_process_reference(key: str, inputs: tuple):
    """Single-process training of the same model and data: (first loss, first gradients,
    loss after 3 Adam steps)."""
    ref = make_model(key)
    loss_ref = ref(*inputs)
    loss_ref.backward()
    g_ref = {n: p.grad.detach().clone() for n, p in ref.named_parameters()}
    _, loss3 = three_adam_steps(ref, inputs)
    return loss_ref, g_ref, loss3


def three_adam_steps(model, inputs) -> tuple:
    """From the first step's gradients (already computed): three Adam steps, then the loss
    (``(optimizer, loss)``)."""
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    opt.step()
    opt.zero_grad()
    for _ in range(2):
        train_step(model, *inputs)
        opt.step()
        opt.zero_grad()
    loss = float(train_step(model, *inputs).detach())
    opt.zero_grad()
    return opt, loss


def make_inputs(key: str, device: str = "cpu") -> tuple:
    from tensoropt.models import example_inputs
    name, ov, batch = MODELS[key]
    torch.manual_seed(1)
    if "seq_len" in ov:       # a config override (example_inputs' own seq_len is the input length)
        ov = dict(ov)
        T = ov.pop("seq_len")
        vocab = ov.get("vocab_size")
        idx = torch.randint(0, vocab, (batch, T), device=device)
        targets = torch.randint(0, vocab, (batch, T), device=device)
        return idx, targets
    return tuple(example_inputs(name, batch, device=device, **ov))


_FRONTIERS: dict = {}


def on_rank0(compute):
    """``compute()`` run on rank 0 alone and sent to every rank: a search or a capture is the
    same on each, and the ranks beside it would only take its cores. A failure on rank 0
    fails the case on every rank."""
    box = [None]
    if dist.get_rank() == 0:
        try:
            box = [("ok", compute())]
        except Exception as e:  # noqa: BLE001 - raised again below, after the others hear of it
            box = [("error", f"{type(e).__name__} on rank 0: {e}")]
            dist.broadcast_object_list(box, src=0)
            raise
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise RuntimeError(value)
    return value


def get_frontier(key: str, world: int, extras: bool = True, pipeline: bool = True, recompute: bool | None = None):
    """The frontier over cpu:world; ``extras=False``: without ZeRO and recomputation;
    ``pipeline=False``: without pipeline stages; ``recompute`` (default ``extras``): with
    recomputation."""
    recompute = extras if recompute is None else recompute
    if (key, world, extras, pipeline, recompute) not in _FRONTIERS:
        def search():
            meta = make_model(key, "meta")
            graph = capture(meta, make_inputs(key, "meta"), name=MODELS[key][0])
            return tensoropt.frontier(meta, f"cpu:{world}", inputs=make_inputs(key, "meta"), progress=False,
                                      zero=extras, recompute=recompute, pipeline=pipeline), graph
        _FRONTIERS[(key, world, extras, pipeline, recompute)] = on_rank0(search)
    return _FRONTIERS[(key, world, extras, pipeline, recompute)]


def pick_plan(f, which: str, world: int, graph):
    if which == "dp":
        return f.reference["data parallel"]
    if which.startswith("dp_zero"):
        return dataclasses.replace(f.reference["data parallel"], zero_stage=int(which[-1]))
    if which == "dp_rc":
        return dataclasses.replace(f.reference["data parallel"], recompute=tuple(graph.block_modules))
    if which == "hybrid":
        return f.reference["megatron dp2·tp2"]
    if which == "megatron":
        return f.reference[f"megatron dp1·tp{world}"]
    if which == "tp":
        for p in f.plans:
            if all(part.startswith("tp") for part in p.summary.split("·")):
                return p
        return f.reference[f"megatron dp1·tp{world}"]
    if which == "min_time":
        return f.min_time()
    if which == "min_memory":
        return f.min_memory()
    raise ValueError(f"unknown plan {which!r}")


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float) -> float:
    """max |a - b| relative to max |b|, floored at ``floor`` (gradients that are zero in exact
    arithmetic, such as a key projection's bias, are otherwise compared noise to noise)."""
    return float((a - b).abs().max() / max(float(b.abs().max()), floor))


def run_case(case: str, world: int, measure: bool) -> dict:
    key, which = case.split(":")
    plain = which.endswith("_plain")
    which = which.removesuffix("_plain")
    f, graph = get_frontier(key, world, extras=not plain)
    plan = pick_plan(f, which, world, graph)
    inputs = make_inputs(key)

    loss_ref, g_ref, loss3_ref = single_process_reference(key, inputs)

    model = parallelize(make_model(key), plan)
    pipelined = isinstance(model, PipelineRunner)
    mode = "pipeline" if pipelined else layout_of(model).mode
    res = {"case": case, "world": world, "plan": plan.summary, "label": plan.label, "mesh": list(plan.mesh_shape),
           "mode": mode, "predicted_memory_bytes": plan.memory_bytes,
           "predicted_peak_bytes": plan.peak_memory_bytes}

    def step():
        return train_step(model, *inputs)

    calls = [0]
    if mode == "replicate" and graph.block_modules:
        probe = next(model.get_submodule(graph.block_modules[-1]).children())
        hook = probe.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    if measure and not pipelined:
        out = {}
        measured = count_collectives(lambda: out.setdefault("loss", step()))
        loss = out["loss"]
    else:
        loss = step()
        measured = None
    if mode == "replicate" and graph.block_modules:
        hook.remove()
        res["probe_calls_per_step"] = calls[0]
    res["loss"] = float(loss.detach())
    res["loss_ref"] = float(loss_ref.detach())
    res["loss_rel"] = abs(res["loss"] - res["loss_ref"]) / abs(res["loss_ref"])
    grads = model.full_grads() if pipelined else full_grads(model)
    floor = 1e-4 * max(float(g.abs().max()) for g in g_ref.values())
    errs = {n: (rel_err(grads[n], g, floor) if grads.get(n) is not None else None) for n, g in g_ref.items()}
    res["grad_missing"] = [n for n, e in errs.items() if e is None]
    res["grad_max_rel"] = max((e for e in errs.values() if e is not None), default=0.0)
    res["grad_worst"] = max(errs, key=lambda n: errs[n] or 0.0)
    if measured is not None:
        pred = issued_collectives(plan, graph, mode)
        res["predicted"] = summarize_for_backend(pred, tuple(plan.mesh_shape), "gloo")
        res["predicted_raw"] = summarize(pred)
        res["measured"] = {k: {"count": v["count"], "bytes": v["bytes"]} for k, v in measured.items()}
    opt, res["loss3"] = three_adam_steps(model, inputs)
    res["loss3_ref"] = loss3_ref
    res["loss3_rel"] = abs(res["loss3"] - loss3_ref) / abs(loss3_ref)
    if measure:
        mem = step_peak_memory(step, opt, model.model if pipelined else model, modules=not pipelined)
        res["peak_bytes"] = mem["peak_bytes"]
        res["peak_by_category"] = mem["by_category"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, help="comma-separated model:plan")
    ap.add_argument("--measure", default="", help="comma-separated cases to measure")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    measure = set(filter(None, args.measure.split(",")))
    torch.set_num_threads(1)
    run_each(args.case.split(","), lambda case: run_case(case, world, case in measure or "all" in measure),
             lambda case: {"case": case, "world": world})


if __name__ == "__main__":
    main()
    finish_worker()
