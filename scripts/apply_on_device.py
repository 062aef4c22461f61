"""One-device plans of $PLAN_DIR/plans (default data/validation/h100) laid out by
tensoropt.parallelize on the device present (CUDA + NCCL on a GPU) and trained 3 AdamW steps,
against the same model trained plainly.

    torchrun --standalone --nproc-per-node 1 scripts/apply_on_device.py gpt2:none gpt2:op ...

Writes apply_cuda.json (per plan: both runs' losses and their largest relative difference) to
$OUT (default out).
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tensoropt  # noqa: E402
from tensoropt.capture.inputs import loss_of  # noqa: E402
from tensoropt.plan import Plan  # noqa: E402
from tensoropt.validate.device_cases import get_case  # noqa: E402


def _call(model, inputs):
    return model(*inputs) if isinstance(inputs, tuple) else model(**inputs)


def train(case, plan, steps: int = 3) -> list[float]:
    """``steps`` AdamW steps of the case's model (fp32, seeded), laid out by ``plan`` or, with
    ``plan=None``, trained plainly on the GPU."""
    torch.manual_seed(0)
    model = case.build("cpu", dtype=torch.float32)
    inputs = case.inputs("cuda")
    model = tensoropt.parallelize(model, plan) if plan is not None else model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for _ in range(steps):
        if plan is not None:
            loss = (tensoropt.train_step(model, *inputs) if isinstance(inputs, tuple)
                    else tensoropt.train_step(model, **inputs))
        else:
            loss = loss_of(_call(model, inputs))
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses


def main() -> None:
    results = []
    for spec in sys.argv[1:]:
        name, policy = spec.split(":")
        case = get_case(name)
        plan = Plan.load(os.path.join(ROOT, os.environ.get("PLAN_DIR", "data/validation/h100"), "plans",
                                      f"{name}_{policy}.json"))
        plain = train(case, None)
        torch.cuda.empty_cache()
        laid_out = train(case, plan)
        torch.cuda.empty_cache()
        r = {"plan": spec, "summary": plan.summary, "plain": plain, "tensoropt": laid_out,
             "max_rel_diff": max(abs(a - b) / abs(a) for a, b in zip(plain, laid_out))}
        results.append(r)
        if dist.get_rank() == 0:
            print(json.dumps(r), flush=True)
    if dist.get_rank() == 0:
        with open(os.path.join(os.environ.get("OUT", "out"), "apply_cuda.json"), "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
