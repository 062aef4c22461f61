"""One device's training step in bf16 mixed precision, run as the cost model prices it, and
measured.

For ``precision="bf16-mixed"`` with Adam the cost model charges bf16 parameters and
gradients, an fp32 master copy and fp32 Adam moments (2 + 2 + 12 bytes a parameter,
``TrainingConfig.state_bytes_per_param``), matrix multiplies in bf16 and the loss in fp32.
:class:`MasterWeightAdam` holds exactly that state. A step runs the model's forward under
``torch.autocast`` to bf16 (its parameters are bf16 already, so no weight is cast; the loss
and the norms are on autocast's fp32 list), then backward, the optimizer step and
``zero_grad`` keeping the gradients allocated, as ``Plan.peak_memory_bytes`` assumes.
Recomputed modules run under the apply layer's checkpoint (``apply.layout.checkpoint_forward``)
with the plan's policy.

Used by ``scripts/validate_device.py`` to hold the GPU cost model against real steps.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.nn as nn

from ..capture.inputs import loss_of
from ..plan import Plan

__all__ = ["MasterWeightAdam", "recompute_as_planned", "measure_step", "kernel_time"]


class MasterWeightAdam:
    """Adam over fp32 master copies of bf16 parameters (decoupled weight decay).

    The update runs in chunks of consecutive parameters whose fp32 gradients together take
    no more than the largest parameter's, so the step holds at most one such chunk beyond the
    state (the fused kernel ``torch._fused_adamw_``, one launch a chunk)."""

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("MasterWeightAdam needs at least one parameter that requires a gradient")
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.master = [p.detach().to(torch.float32, copy=True) for p in self.params]
        self.exp_avg = [torch.zeros_like(m) for m in self.master]
        self.exp_avg_sq = [torch.zeros_like(m) for m in self.master]
        self.step_count = torch.zeros((), dtype=torch.float32, device=self.params[0].device)
        limit = max(p.numel() for p in self.params)
        self.chunks: list[list[int]] = [[]]
        held = 0
        for i, p in enumerate(self.params):
            if self.chunks[-1] and held + p.numel() > limit:
                self.chunks.append([])
                held = 0
            self.chunks[-1].append(i)
            held += p.numel()

    def state_tensors(self) -> list[torch.Tensor]:
        """The optimizer's own tensors (for memory trackers)."""
        return self.master + self.exp_avg + self.exp_avg_sq + [self.step_count]

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        for chunk in self.chunks:
            idx = [i for i in chunk if self.params[i].grad is not None]
            if not idx:
                continue
            grads = [self.params[i].grad.to(torch.float32) for i in idx]
            torch._fused_adamw_([self.master[i] for i in idx], grads, [self.exp_avg[i] for i in idx],
                                [self.exp_avg_sq[i] for i in idx], [], [self.step_count] * len(idx),
                                lr=self.lr, beta1=self.betas[0], beta2=self.betas[1],
                                weight_decay=self.weight_decay, eps=self.eps, amsgrad=False, maximize=False)
            del grads
            torch._foreach_copy_([self.params[i] for i in idx], [self.master[i] for i in idx])

    @torch.no_grad()
    def zero_grad(self) -> None:
        """Zero the gradients in place (they stay allocated between steps)."""
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()


def recompute_as_planned(model: nn.Module, plan: Plan) -> list[str]:
    """Wrap the modules ``plan`` recomputes in the apply layer's checkpoint, with its policy;
    returns their names."""
    from ..apply.layout import checkpoint_forward
    from ..recompute import check

    policy = check(getattr(plan, "recompute_policy", "full") or "full")
    names = list(getattr(plan, "recompute", ()) or ())
    for fqn in names:
        checkpoint_forward(model.get_submodule(fqn), policy)
    return names


def _call(model: nn.Module, inputs: Any):
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(*inputs)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_step(model: nn.Module, inputs: Any, *, steps: int = 10, warmup: int = 3, lr: float = 1e-4) -> dict:
    """Train ``model`` (bf16 parameters, on its device) on one fixed batch ``inputs`` (a dict of
    keyword or a tuple of positional inputs) and measure it.

    Returns the median wall time of a whole step, of forward + backward and of the optimizer
    step over ``steps`` timed steps (after ``warmup``), their quartiles, the peak memory of one
    whole step begun with the state resident (``tensoropt.apply.peak_memory``: the allocator's
    peak on CUDA, live tensors on CPU), the allocated bytes before it, the losses, and on CUDA
    the GPU's busy time in one step (:func:`kernel_time`) and the peak of its live tensors by
    category (MemTracker: parameters, gradients, activations, temporaries, the optimizer's
    tensors as "OTH"), which leaves out the libraries' workspaces the allocator's peak holds."""
    from ..apply.measure import peak_memory

    device = next(model.parameters()).device
    opt = MasterWeightAdam(model.parameters(), lr=lr)

    def forward_backward():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_of(_call(model, inputs))
        loss.backward()
        return loss.detach()

    def step():
        loss = forward_backward()
        opt.step()
        opt.zero_grad()
        return loss

    losses = [float(step()) for _ in range(max(1, warmup))]
    whole, fb, upd = [], [], []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        loss = forward_backward()
        _sync(device)
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        _sync(device)
        t2 = time.perf_counter()
        whole.append(t2 - t0)
        fb.append(t1 - t0)
        upd.append(t2 - t1)
        losses.append(float(loss))
    resident = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    mem = peak_memory(step, model, opt.state_tensors())
    kernels = kernel_time(step) if device.type == "cuda" else None
    by_category = (peak_memory(step, model, opt.state_tensors(), tensors=True) if device.type == "cuda"
                   else mem)
    out = {
        "step_s": statistics.median(whole), "forward_backward_s": statistics.median(fb),
        "optimizer_s": statistics.median(upd), "step_s_quartiles": _quartiles(whole),
        "peak_bytes": int(mem["peak_bytes"]), "peak_method": mem["method"],
        "params": sum(p.numel() for p in opt.params), "losses": losses,
    }
    if resident is not None:
        out["resident_bytes"] = int(resident)
        out["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved(device))
    if kernels is not None:
        out.update(kernels)
    out["tensor_peak_bytes"] = int(by_category["peak_bytes"])
    out["tensor_peak_by_category"] = by_category["by_category"]
    return out


def kernel_time(step_fn, top: int = 8) -> dict:
    """The GPU's busy time in one call of ``step_fn`` (the sum of its kernels' and copies'
    durations, from ``torch.profiler``; one stream, so they do not overlap), and the kernels
    that took most of it: what the step's wall time would be if the GPU never waited for the
    host."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step_fn()
        torch.cuda.synchronize()
    per_name: dict[str, float] = {}
    launches = 0
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            per_name[e.name] = per_name.get(e.name, 0.0) + e.time_range.elapsed_us() * 1e-6
            launches += 1
    ranked = sorted(per_name.items(), key=lambda kv: -kv[1])
    return {"kernel_s": sum(per_name.values()), "kernel_launches": launches,
            "top_kernels": [[name[:120], t] for name, t in ranked[:top]]}


def _quartiles(xs: list[float]) -> list[float]:
    if len(xs) < 2:
        return [xs[0], xs[0]] if xs else []
    q = statistics.quantiles(xs, n=4)
    return [q[0], q[2]]
