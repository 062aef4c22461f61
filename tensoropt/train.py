"""Search, pick the plan under a memory budget, lay it out and train (run under torchrun).

    torchrun --standalone --nproc-per-node 4 -m tensoropt.train --model gpt-tiny --devices cpu:4 \\
        --budget 2MB --steps 5

Every rank searches the same frontier (deterministic), picks ``Frontier.best(budget)``,
parallelizes a model built with the same seed (any plan, pipelines included) and trains
``--steps`` Adam steps on one fixed batch (every rank passes the full batch). Each rank prints
loss, step time and peak memory.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensoropt.train", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="zoo model name, e.g. gpt-tiny")
    ap.add_argument("--devices", required=True, help='e.g. "cpu:4" (must match the world size)')
    ap.add_argument("--budget", default=None, help='per-device memory budget, e.g. "2MB" (default: the device)')
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--plan-out", default=None, help="rank 0 saves the chosen plan here (JSON)")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    import tensoropt
    from tensoropt.apply import PipelineRunner, parallelize, train_step
    from tensoropt.models import example_inputs, get_model
    from tensoropt.budget import InfeasibleBudget
    from tensoropt.units import format_bytes

    if "RANK" not in os.environ:
        print("tensoropt.train must run under torchrun: torchrun --standalone --nproc-per-node N "
              "-m tensoropt.train ...", file=sys.stderr)
        return 2
    dist.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))

    meta = get_model(args.model, device="meta")
    meta_inputs = tuple(example_inputs(args.model, args.batch_size, device="meta"))
    f = tensoropt.frontier(meta, args.devices, inputs=meta_inputs, progress=False)
    try:
        plan = f.best(args.budget)
    except InfeasibleBudget as err:
        if rank == 0:
            print(str(err), file=sys.stderr)
        dist.destroy_process_group()
        return 1
    if plan.world_size != world:
        raise SystemExit(f"--devices {args.devices} gives {plan.world_size} devices but torchrun started {world}")
    if rank == 0:
        print(f"plan: {plan}", flush=True)
        if args.plan_out:
            plan.save(args.plan_out)

    torch.manual_seed(0)
    model = get_model(args.model, device="cpu")
    torch.manual_seed(1)
    inputs = tuple(example_inputs(args.model, args.batch_size, device="cpu"))
    model = parallelize(model, plan)
    params = list(model.parameters())

    def forward_backward():
        return train_step(model, *inputs)
    opt = torch.optim.Adam(params, lr=args.lr)
    from tensoropt.apply import peak_memory

    for step in range(args.steps):
        t0 = time.perf_counter()
        holder = {}

        def one_step():
            loss = forward_backward()
            opt.step()
            opt.zero_grad(set_to_none=False)      # the scope Plan.peak_memory_bytes prices
            holder["loss"] = float(loss.detach())

        if step == args.steps - 1:
            pipelined = isinstance(model, PipelineRunner)
            mem = peak_memory(one_step, model.model if pipelined else model, opt, modules=not pipelined)["peak_bytes"]
        else:
            one_step()
            mem = None
        dt = time.perf_counter() - t0
        extra = f" peak {format_bytes(mem)} (predicted {format_bytes(plan.peak_memory_bytes)})" if mem is not None else ""
        print(f"[rank {rank}] step {step} loss {holder['loss']:.6f} time {dt * 1e3:.1f} ms{extra}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from tensoropt.launch import finish_worker

    finish_worker(main())       # no interpreter teardown after gloo: it can abort a finished run
