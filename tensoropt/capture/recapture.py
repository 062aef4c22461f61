"""A model given as a module or a zoo name, captured at its example batch and at any other.

``capture_model(model, inputs, batch_size)`` returns the graph, the module and a
:class:`Recapture`: ``recapture(b)`` is the model's graph at batch ``b`` (what a pipeline's
micro-batches need), captured again or, once two captures fix how the graph depends on the
batch, interpolated (``capture.rebatch``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..opgraph import OpGraph
from .inputs import example_call, split_inputs

__all__ = ["capture_model", "Recapture"]


class Recapture:
    """``self(b)``: the model's graph at batch ``b``; after one capture at another batch the
    rest come from ``capture.rebatch`` when the two captures allow it."""

    def __init__(self, graph: OpGraph, capture_at: Callable[[int], OpGraph]):
        self.graphs = {graph.batch_size: graph}
        self.capture_at = capture_at
        self.at = None
        self.tried = False

    def __call__(self, b: int) -> OpGraph:
        if b not in self.graphs:
            g = self.at(b) if self.at is not None else None
            if g is None:
                self.add(b, self.capture_at(b))
            else:
                self.graphs[b] = g
        return self.graphs[b]

    def add(self, b: int, g: OpGraph) -> None:
        """Take ``g``, the model captured at batch ``b`` (``capture_at(b)``, run elsewhere)."""
        self.graphs[b] = g
        # a batch of one is captured differently (views drop unit dims): the first capture
        # at another batch is the one that can fit the interpolation
        if not self.tried and b >= 2:
            from .rebatch import interpolator

            self.tried = True
            self.at = interpolator(next(iter(self.graphs.values())), g)

    @staticmethod
    def runs_forked() -> bool:
        """Whether ``capture_at`` may run in a forked process: not once this one has
        initialised CUDA, which a forked child cannot use (a model on a GPU)."""
        return not torch.cuda.is_initialized()

    def captures_for(self, batches) -> list[int]:
        """The batches of ``batches`` (asked for in that order) that ``self`` would capture
        rather than interpolate, as far as is known before any of them is captured: a batch
        of one, and the first other one, which fixes the interpolation."""
        todo = [b for b in dict.fromkeys(batches) if b not in self.graphs]
        first = None if self.tried else next((b for b in todo if b >= 2), None)
        return [b for b in todo if b < 2 or b == first]


def capture_model(model: Any, inputs: Any = None, batch_size: int | None = None
                  ) -> tuple[OpGraph, torch.nn.Module, Recapture]:
    """(graph, module, recapture) for an ``nn.Module`` with example ``inputs``, or a zoo model
    name (its own example inputs at ``batch_size``, or the given ones)."""
    from . import capture

    if isinstance(model, str):
        from ..models import get_model

        name = model
        module = get_model(name)
        args, kwargs = example_call(inputs, zoo=name, at=batch_size)
        graph = capture(module, args, kwargs=kwargs, name=name)

        def at(b: int) -> OpGraph:
            # other batch sizes keep given inputs' other dims (a sequence length)
            a, k = example_call(inputs, zoo=name, batch=graph.batch_size, at=b)
            return capture(module, a, kwargs=k, name=name)
        return graph, module, Recapture(graph, at)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be an nn.Module or a zoo model name, got {type(model).__name__}")
    if inputs is None:
        raise ValueError("pass example inputs: tensoropt.frontier(model, devices, inputs=(x, ...)) or, for "
                         "keyword inputs, inputs={'input_ids': ids, 'labels': ids}; meta tensors are fine "
                         "(torch.empty(shape, device='meta'))")
    if batch_size is not None:
        raise ValueError("batch_size applies to zoo model names; for a module, size the example inputs")
    args, kwargs = split_inputs(inputs)
    graph = capture(model, args, kwargs=kwargs)

    def at_module(b: int) -> OpGraph:
        a, k = example_call(inputs, batch=graph.batch_size, at=b)
        return capture(model, a, kwargs=k)
    return graph, model, Recapture(graph, at_module)
