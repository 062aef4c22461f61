"""Activation checkpointing that keeps what a plan's recomputation policy keeps."""

from __future__ import annotations

from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ..recompute import runtime_keeps, runtime_mm

__all__ = ["checkpoint_context"]


def checkpoint_context(policy: str):
    """``torch.utils.checkpoint.checkpoint``'s ``context_fn`` that keeps what ``policy`` keeps
    (``tensoropt.recompute.runtime_keeps``)."""
    def make():
        mms = {True: 0, False: 0}          # per forward and recomputed forward

        def keep(ctx, func, *args, **kwargs):
            op = func.__name__.split(".")[0]
            if runtime_mm(op):
                mms[ctx.is_recompute] += 1
            return (CheckpointPolicy.MUST_SAVE if runtime_keeps(policy, op, mms[ctx.is_recompute])
                    else CheckpointPolicy.PREFER_RECOMPUTE)

        return create_selective_checkpoint_contexts(keep)

    return make
