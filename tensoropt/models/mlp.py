"""Plain multi-layer perceptron with an MSE loss.

``widths = (d_0, d_1, ..., d_n)`` gives ``n`` Linear layers ``layers.{i}``
(``nn.Linear(d_i, d_{i+1})``) with GELU between them (none after the last).
For tensor parallelism pair them up: ``layers.0`` colwise, ``layers.1`` rowwise, ...
``forward(x, y) -> mse_loss(mlp(x), y)`` with x: (B, d_0), y: (B, d_n).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class MLPConfig:
    widths: tuple[int, ...] = (8192, 8192, 8192)
    bias: bool = True

    def __post_init__(self) -> None:
        if len(self.widths) < 2:
            raise ValueError(f"MLP needs at least two widths (one layer), got {self.widths}")


class MLP(nn.Module):
    def __init__(self, cfg: MLPConfig = MLPConfig()) -> None:
        super().__init__()
        self.config = cfg
        w = tuple(cfg.widths)
        self.layers = nn.ModuleList(nn.Linear(a, b, bias=cfg.bias) for a, b in zip(w[:-1], w[1:]))
        self.init_weights()

    def init_weights(self) -> None:
        """Kaiming-uniform-like deterministic init (uniform(-1/sqrt(fan_in), ..)); no-op on meta."""
        with torch.no_grad():
            for lin in self.layers:
                if lin.weight.is_meta:
                    continue
                bound = 1.0 / lin.in_features ** 0.5
                lin.weight.uniform_(-bound, bound)
                if lin.bias is not None:
                    lin.bias.zero_()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        n = len(self.layers)
        for i, lin in enumerate(self.layers):
            x = lin(x)
            if i < n - 1:
                x = F.gelu(x)
        return F.mse_loss(x, y)
