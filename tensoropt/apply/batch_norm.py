"""BatchNorm over a batch split across ranks, with the statistics of the whole batch.

Each rank holds a slice of the batch; per channel the sums of ``x`` and ``x**2`` are
all-reduced forward (one all-reduce of ``2C`` values per mesh axis that splits the batch), the
sums of ``dy`` and ``dy * xhat`` backward (one more). Autograd saves what native BatchNorm
saves -- the local input and the per-channel mean and inverse deviation -- so the memory is
that of the local slice. Weight and bias gradients are returned as this rank's partial sums;
the apply layer reduces them like any parameter replicated over a split batch.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["sync_batch_norm"]

_F_SIG = inspect.signature(F.batch_norm)


def _all_reduce(t: torch.Tensor, groups) -> torch.Tensor:
    for g in groups:
        dist.all_reduce(t, group=g)
    return t


class _SyncBatchNorm(torch.autograd.Function):
    # Written so that besides the saved input, the output gradient and the input gradient at
    # most one more tensor of the input's size is alive at a time (the cost model's transient).
    @staticmethod
    def forward(ctx, x, weight, bias, eps, count, groups):
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        sums = _all_reduce(torch.cat([x.sum(dims), (x * x).sum(dims)]), groups)
        c = x.shape[1]
        mean = sums[:c] / count
        var = (sums[c:] / count - mean * mean).clamp_min(0.0)
        invstd = torch.rsqrt(var + eps)
        y = x - mean.view(shape)
        y.mul_((invstd if weight is None else invstd * weight).view(shape))
        if bias is not None:
            y.add_(bias.view(shape))
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.count, ctx.groups, ctx.has_bias = count, groups, bias is not None
        return y, mean, var

    @staticmethod
    def backward(ctx, dy, _dmean, _dvar):
        x, weight, mean, invstd = ctx.saved_tensors
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = invstd * ((dy * x).sum(dims) - mean * sum_dy)
        c = x.shape[1]
        d_weight = sum_dy_xhat.clone() if weight is not None else None
        d_bias = sum_dy.clone() if ctx.has_bias else None
        total = _all_reduce(torch.cat([sum_dy, sum_dy_xhat]), ctx.groups)
        scale = invstd if weight is None else invstd * weight
        dx = x - mean.view(shape)                                   # (x - mean): xhat / invstd
        dx.mul_((-invstd * total[c:] / ctx.count).view(shape))
        dx.add_(dy).sub_((total[:c] / ctx.count).view(shape))
        dx.mul_(scale.view(shape))
        return dx, d_weight, d_bias, None, None, None


def sync_batch_norm(func, args: tuple, kwargs: dict, groups: list, world: int):
    """Run ``func`` (``F.batch_norm`` or ``torch.batch_norm``) on this rank's slice of the batch
    with statistics over all ``world`` slices (the ranks of ``groups``, one process group per
    mesh axis that splits the batch). Outside training it is ``func`` itself."""
    if func is F.batch_norm:
        b = _F_SIG.bind(*args, **kwargs)
        b.apply_defaults()
        a = b.arguments
        x, rm, rv, w, bias = a["input"], a["running_mean"], a["running_var"], a["weight"], a["bias"]
        training, momentum, eps = a["training"], a["momentum"], a["eps"]
    elif len(args) >= 8 and not kwargs:              # torch.batch_norm, positional
        x, w, bias, rm, rv, training, momentum, eps = args[:8]
    else:
        raise TypeError(f"cannot read the arguments of {func} for a batch-split BatchNorm")
    if not training:
        return func(*args, **kwargs)
    count = x.numel() // x.shape[1] * world
    y, mean, var = _SyncBatchNorm.apply(x, w, bias, eps, count, tuple(groups))
    mean, var = mean.detach(), var.detach()
    if rm is not None and momentum is not None:
        with torch.no_grad():
            rm.mul_(1 - momentum).add_(mean, alpha=momentum)
            rv.mul_(1 - momentum).add_(var * (count / max(count - 1, 1)), alpha=momentum)
    return y
