"""What goes into a model's forward and what comes out of it.

Example inputs are positional (a tuple or list, or one tensor) or keyword (a dict, as a
Hugging Face model takes ``input_ids=..., labels=...``). A plan stores them as a JSON spec
(shapes and dtypes of tensors, other values as they are), so that the model can be captured
again on meta tensors wherever the plan is applied. The loss is the forward's result when it
is a scalar tensor, else its ``loss`` attribute or key (a ``ModelOutput``), else the first
element of a tuple.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn as nn

from ..opgraph import rebatch_spec

__all__ = ["split_inputs", "example_call", "input_spec", "inputs_from_spec", "rebatch", "loss_of", "batch_size_of",
           "bind_call", "forward_signature", "training_kwargs", "rebatch_spec", "replace_loss"]

Args = tuple
Kwargs = dict


def split_inputs(inputs: Any) -> tuple[Args, Kwargs]:
    """(args, kwargs) from a tuple/list (positional), a dict (keyword) or one tensor."""
    if inputs is None:
        return (), {}
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    raise TypeError(f"example inputs must be a tuple/list (positional), a dict (keyword) or a tensor, "
                    f"got {type(inputs).__name__}")


def _leaf_spec(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return {"tensor": [int(s) for s in x.shape], "dtype": str(x.dtype).removeprefix("torch."),
                "requires_grad": bool(x.requires_grad)}
    if x is None or isinstance(x, (bool, int, float, str)):
        return {"value": x}
    raise TypeError(f"an example input of type {type(x).__name__} cannot be stored in a plan: use "
                    "tensors, None, bool, int, float or str")


def input_spec(args: Args, kwargs: Kwargs) -> dict:
    """JSON-able description of example inputs (shapes and dtypes, literal values)."""
    return {"args": [_leaf_spec(a) for a in args], "kwargs": {k: _leaf_spec(v) for k, v in kwargs.items()}}


def _leaf(s: dict, batch: int | None, b: int | None, device) -> Any:
    if "tensor" not in s:
        return s.get("value")
    shape = list(s["tensor"])
    if b is not None and shape and shape[0] == batch:
        shape[0] = b
    t = torch.empty(shape, dtype=getattr(torch, s["dtype"]), device=device)
    if s.get("requires_grad"):
        t.requires_grad_(True)
    return t


def inputs_from_spec(spec: dict, batch: int | None = None, b: int | None = None,
                     device: str | torch.device = "meta") -> tuple[Args, Kwargs]:
    """Uninitialised tensors of the spec's shapes (meta by default); with ``b``, every tensor
    whose dim 0 is ``batch`` gets dim 0 ``b``."""
    args = tuple(_leaf(s, batch, b, device) for s in spec.get("args", ()))
    kwargs = {k: _leaf(s, batch, b, device) for k, s in spec.get("kwargs", {}).items()}
    return args, kwargs


def rebatch(args: Args, kwargs: Kwargs, batch: int, b: int) -> tuple[Args, Kwargs]:
    """Meta tensors like the inputs with every batch-sized dim 0 cut to ``b``."""
    def cut(x):
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch:
            return torch.empty((b, *x.shape[1:]), dtype=x.dtype, device="meta")
        return x
    return tuple(cut(a) for a in args), {k: cut(v) for k, v in kwargs.items()}


def example_call(inputs: Any = None, *, zoo: str | None = None, batch: int | None = None, at: int | None = None,
                 overrides: dict | None = None, meta: bool = False) -> tuple[Args, Kwargs]:
    """The (args, kwargs) to capture a model with at batch ``at``.

    Given example ``inputs`` (positional, keyword or one tensor) whose batch is ``batch``:
    those inputs (as meta tensors with ``meta``), every tensor whose dim 0 is ``batch`` cut to
    ``at`` (other dims, such as a sequence length, are kept). Without inputs: the example
    inputs of the zoo model ``zoo`` at ``at`` (its default batch when None) on meta, for its
    config with ``overrides`` where the zoo takes them."""
    if inputs is not None:
        args, kwargs = split_inputs(inputs)
        if meta:
            def to_meta(x):
                return torch.empty(x.shape, dtype=x.dtype, device="meta") if isinstance(x, torch.Tensor) else x
            args, kwargs = tuple(to_meta(a) for a in args), {k: to_meta(v) for k, v in kwargs.items()}
        if at is not None and batch and at != batch:
            args, kwargs = rebatch(args, kwargs, batch, at)
        return args, kwargs
    if zoo is None:
        raise ValueError("no example inputs: pass inputs= (meta tensors are fine) or use a zoo model name")
    from ..models import example_inputs

    if overrides:
        try:
            return tuple(example_inputs(zoo, at, device="meta", **overrides)), {}
        except (TypeError, ValueError):
            pass                        # config fields the zoo's inputs do not take
    return tuple(example_inputs(zoo, at, device="meta")), {}


def batch_size_of(args: Args, kwargs: Kwargs) -> int:
    """Dim 0 of the first tensor input (positional first, then keyword), or 1."""
    for x in list(args) + list(kwargs.values()):
        if isinstance(x, torch.Tensor):
            return int(x.shape[0]) if x.dim() > 0 else 1
    return 1


def loss_of(output: Any) -> Any:
    """The loss in a forward's result, or None."""
    if isinstance(output, (torch.Tensor, torch.fx.Node)):
        return output
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and isinstance(output, (tuple, list)) and output:
        loss = output[0] if isinstance(output[0], (torch.Tensor, torch.fx.Node)) else None
    return loss


def replace_loss(output: Any, loss: Any) -> Any:
    """``output`` with its loss (as :func:`loss_of` finds it) replaced by ``loss``."""
    if isinstance(output, torch.Tensor):
        return loss
    if getattr(output, "loss", None) is not None:
        try:
            output.loss = loss
            if isinstance(output, dict):
                output["loss"] = loss
            return output
        except (AttributeError, TypeError):
            pass
    if isinstance(output, dict) and "loss" in output:
        return {**output, "loss": loss}
    if isinstance(output, tuple):
        return (loss, *output[1:])
    if isinstance(output, list):
        return [loss, *output[1:]]
    return output


def training_kwargs(model: nn.Module, kwargs: Kwargs) -> Kwargs:
    """Keyword inputs for a training step: a forward that takes ``use_cache`` (a Hugging Face
    model) gets ``use_cache=False`` unless it was given (a cache is for generation; the cache
    objects in the output cannot be captured)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return kwargs
    if "use_cache" in params and "use_cache" not in kwargs:
        return {**kwargs, "use_cache": False}
    return kwargs


def forward_signature(model: nn.Module) -> inspect.Signature | None:
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None


def bind_call(signature: inspect.Signature | None, captured: tuple[Args, Kwargs],
              call: tuple[Args, Kwargs]) -> tuple[Args, Kwargs]:
    """A call's arguments in the captured call's structure: matched by parameter name through
    the forward's signature; a non-tensor argument the call leaves out keeps its captured
    value (``use_cache=False``). Raises ValueError naming what does not match."""
    cap_args, cap_kwargs = captured
    args, kwargs = call
    if len(args) == len(cap_args) and set(kwargs) == set(cap_kwargs):
        return tuple(args), dict(kwargs)
    if signature is None:
        raise ValueError(f"the call's arguments ({len(args)} positional, keywords {sorted(kwargs)}) do not match "
                         f"the captured call's ({len(cap_args)} positional, keywords {sorted(cap_kwargs)})")
    sig = signature
    try:
        cap = sig.bind_partial(*cap_args, **cap_kwargs).arguments
        got = sig.bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError) as err:
        raise ValueError(f"the call's arguments do not match the forward the plan was made for: {err}") from None
    names = list(sig.parameters)
    out = {}
    for name, value in cap.items():
        if name in got:
            out[name] = got[name]
        elif isinstance(value, torch.Tensor):
            raise ValueError(f"the plan was made with input {name!r}; pass it to the model")
        else:
            out[name] = value
    extra = [n for n in got if n not in cap]
    if extra:
        raise ValueError(f"input(s) {extra} were not among the example inputs the plan was made with "
                         f"({list(cap)}); re-plan with them")
    new_args = tuple(out[n] for n in names[:len(cap_args)])
    new_kwargs = {n: out[n] for n in cap_kwargs}
    return new_args, new_kwargs
