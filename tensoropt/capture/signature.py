"""A model's parameter signature: which model a plan was made for."""

from __future__ import annotations

import hashlib

import torch.nn as nn

__all__ = ["param_signature"]


def param_signature(model: nn.Module) -> str:
    """sha256 over sorted ``(name, shape, dtype)`` of ``model.named_parameters()``.

    Reads only metadata, so it works on meta-device models and never materialises storage.
    """
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        shape = tuple(p.shape)
        dtype = str(p.dtype).replace("torch.", "")
        h.update(f"{name}|{shape}|{dtype}\n".encode())
    return h.hexdigest()
