"""The README's training loop, runnable on CPU ranks: plan a small Llama from transformers, then
lay it out with tensoropt.parallelize and train.

    torchrun --standalone --nproc-per-node 2 scripts/train_example.py [--steps 3] [--budget 2MB]

Every rank plans the same frontier for ``cpu:<world size>`` (the search is deterministic) and
picks the fastest plan under the budget, builds the model for real with the same seed and
trains on one fixed batch (every rank passes the whole batch). Rank 0 prints the plan and the
loss of every step.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import transformers

import tensoropt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budget", default=None, help='per-device memory budget, e.g. "2MB" (default: none)')
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    world, rank = dist.get_world_size(), dist.get_rank()

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    with torch.device("meta"):
        meta = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "labels": ids}
    f = tensoropt.frontier(meta, devices=f"cpu:{world}", inputs=batch, progress=False)
    plan = f.best(memory_budget=args.budget) if args.budget else f.min_time()
    if rank == 0:
        print(f"plan: {plan}", flush=True)

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model = tensoropt.parallelize(model, plan)          # any frontier plan, pipelines included
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(args.steps):
        loss = tensoropt.train_step(model, **batch)      # forward + backward (1F1B for a pipeline)
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print(f"step {step} loss {float(loss):.6f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    from tensoropt.launch import finish_worker

    finish_worker()             # no interpreter teardown after gloo: it can abort a finished run
