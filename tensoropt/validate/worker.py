"""Measurement worker: time and peak memory of real training steps of frontier plans.

Run under torchrun (gloo on CPU, NCCL on GPU)::

    torchrun --standalone --nproc-per-node 2 tensoropt/validate/worker.py \\
        --model gpt --plans a.json,b.json --steps 10 --warmup 3

For every plan file: build the validation model (``cases.MODELS``; ``torch.manual_seed(0)``
on every rank), ``tensoropt.parallelize(model, plan, graph=...)``, ``torch.optim.Adam``;
``--warmup`` untimed steps, then ``--steps`` timed steps. A step is ``tensoropt.train_step(model,
*batch)`` (the forward's outputs held through the backward), ``opt.step()``,
``opt.zero_grad(set_to_none=False)`` on the full global batch
(every rank passes it; the apply layer shards it). Before each timed step all ranks meet at a
barrier; a step's time is the slowest rank's wall time (``perf_counter``), and the result is
the median over steps with the quartiles and min/max as spread. The process CPU time of each
step (``time.process_time``, all threads of the rank, max over ranks) is reported too: on a
shared, oversubscribed machine it is far less sensitive to other processes than wall time
(it still excludes time spent waiting in collectives).

Peak memory is measured with ``tensoropt.apply.peak_memory`` (on CPU:
``torch.distributed._tools.MemTracker``, i.e. the peak of live tensor storage seen by a
dispatch mode, with the model and optimizer tracked as external state), for one whole step
(forward, backward, optimizer step) and for forward+backward only; gradients stay allocated
between steps (``set_to_none=False``), as the cost model assumes. Reported: the max over
ranks. It does not count allocator fragmentation or buffers gloo allocates in C++.

One collective count per plan (``tensoropt.apply.count_collectives`` over one step) is
reported too. Rank 0 prints one ``RESULT {json}`` line per plan (``tensoropt.launch``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

if __package__ in (None, ""):
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from tensoropt.launch import finish_worker, run_each  # noqa: E402
from tensoropt.validate.cases import capture_graph, make_inputs, make_model, forward_backward  # noqa: E402

LR = 1e-3


def _max_over_ranks(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def measure_plan(key: str, plan_path: str, steps: int, warmup: int, graph) -> dict:
    from tensoropt.apply import count_collectives, layout_of, parallelize, peak_memory, step_peak_memory
    from tensoropt.plan import Plan

    plan = Plan.load(plan_path)
    model = make_model(key)
    inputs = make_inputs(key)
    parallelize(model, plan)
    layout = layout_of(model)
    opt = torch.optim.Adam(model.parameters(), lr=LR)

    def fwd_bwd():
        return forward_backward(model, inputs)

    def step():
        loss = fwd_bwd()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss

    first = float(step().detach())
    for _ in range(max(warmup - 1, 0)):
        step()
    times, cpu = [], []
    last = first
    load_before = os.getloadavg()[0]
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        c0 = time.process_time()
        loss = step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        last = float(loss.detach())
    load_after = os.getloadavg()[0]
    times = _max_over_ranks(times)
    cpu = _max_over_ranks(cpu)
    colls = count_collectives(step)
    mem_step = step_peak_memory(fwd_bwd, opt, model)
    mem_fb = peak_memory(fwd_bwd, model, opt)
    opt.zero_grad(set_to_none=False)
    peaks = _max_over_ranks([float(mem_step["peak_bytes"]), float(mem_fb["peak_bytes"])])
    n_local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    return {
        "model": key, "plan_file": os.path.basename(plan_path), "plan": plan.summary, "label": plan.label,
        "mesh": list(plan.mesh_shape), "zero_stage": plan.zero_stage, "recompute": list(plan.recompute),
        "mode": getattr(layout, "mode", None), "world": dist.get_world_size(),
        "steps": steps, "warmup": warmup, "step_times_s": times,
        "time_median_s": statistics.median(times), "time_q25_s": _quantile(times, 0.25),
        "time_q75_s": _quantile(times, 0.75), "time_min_s": min(times), "time_max_s": max(times),
        "cpu_times_s": cpu, "cpu_time_median_s": statistics.median(cpu),
        "cpu_time_q25_s": _quantile(cpu, 0.25), "cpu_time_q75_s": _quantile(cpu, 0.75),
        "loadavg_1min": [load_before, load_after],
        "peak_bytes": int(peaks[0]), "peak_fwd_bwd_bytes": int(peaks[1]),
        "peak_by_category_rank0": mem_step.get("by_category", {}), "memory_method": mem_step["method"],
        "collectives": {k: {"count": v["count"], "bytes": v["bytes"]} for k, v in colls.items()},
        "collective_calls": int(sum(v["count"] for v in colls.values())),
        "local_params_rank0": int(n_local), "loss_first": first, "loss_last": last,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="key of tensoropt.validate.cases.MODELS")
    ap.add_argument("--plans", required=True, help="comma-separated plan JSON files")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = ap.parse_args(argv)
    if args.steps < 1:
        raise SystemExit("--steps must be >= 1")
    torch.set_num_threads(args.threads)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    graph = capture_graph(args.model)
    run_each(list(filter(None, args.plans.split(","))),
             lambda path: measure_plan(args.model, path, args.steps, args.warmup, graph),
             lambda path: {"model": args.model, "plan_file": os.path.basename(path)})


if __name__ == "__main__":
    main()
    finish_worker()
