"""GPT-2 / GPT-3 style decoder-only transformer (pre-LayerNorm, learned positions).

Module names (FQNs), chosen for DTensor ``parallelize_module`` plans:

    tok_emb                     nn.Embedding(vocab, d)
    pos_emb                     nn.Embedding(seq_len, d)
    layers.{i}.attn_norm        nn.LayerNorm(d)
    layers.{i}.attn.q_proj      nn.Linear(d, d)    # colwise
    layers.{i}.attn.k_proj      nn.Linear(d, d)    # colwise
    layers.{i}.attn.v_proj      nn.Linear(d, d)    # colwise
    layers.{i}.attn.o_proj      nn.Linear(d, d)    # rowwise
    layers.{i}.mlp_norm         nn.LayerNorm(d)
    layers.{i}.mlp.fc1          nn.Linear(d, d_ff) # colwise
    layers.{i}.mlp.fc2          nn.Linear(d_ff, d) # rowwise
    norm                        nn.LayerNorm(d)
    lm_head                     nn.Linear(d, vocab, bias=False), weight tied to tok_emb.weight

Every ``layers[i]`` maps ``x -> x`` with ``x`` of shape (B, T, d).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50257
    seq_len: int = 1024          # maximum sequence length (size of pos_emb)
    n_layers: int = 12
    d_model: int = 768
    n_heads: int = 12
    d_ff: int | None = None      # default 4 * d_model
    dropout: float = 0.0
    bias: bool = True
    tie_embeddings: bool = True
    norm_eps: float = 1e-5
    init_std: float = 0.02

    @property
    def ffn_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def head_dim(self) -> int:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} not divisible by n_heads={self.n_heads}")
        return self.d_model // self.n_heads


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate q/k/v/o projections.

    Heads are recovered with ``view(B, T, -1, head_dim)`` so a column-sharded
    q/k/v projection (local heads only) works unchanged.
    """

    def __init__(self, d_model: int, n_heads: int, *, bias: bool = True,
                 causal: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} not divisible by n_heads={n_heads}")
        self.head_dim = d_model // n_heads
        self.causal = causal
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(y)


class FeedForward(nn.Module):
    """fc1 -> GELU -> fc2."""

    def __init__(self, d_model: int, d_ff: int, *, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class GPTBlock(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)
        self.attn = SelfAttention(cfg.d_model, cfg.n_heads, bias=cfg.bias, causal=True,
                                  dropout=cfg.dropout)
        self.mlp_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)
        self.mlp = FeedForward(cfg.d_model, cfg.ffn_dim, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.attn_norm(x)))
        x = x + self.drop(self.mlp(self.mlp_norm(x)))
        return x


def init_transformer(model: nn.Module, std: float, residual_std: float,
                      residual_names: tuple[str, ...]) -> None:
    """Deterministic init: Linear/Embedding ~ N(0, std) (residual output
    projections N(0, residual_std)), biases 0, norm weights 1. Meta tensors are
    skipped; tied parameters are initialised once (first owner in module order)."""
    seen: set[int] = set()
    with torch.no_grad():
        for name, mod in model.named_modules():
            for pname, p in mod.named_parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                if p.is_meta:
                    continue
                if pname == "bias":
                    p.zero_()
                elif isinstance(mod, (nn.LayerNorm, nn.RMSNorm)):
                    p.fill_(1.0)
                elif isinstance(mod, (nn.Linear, nn.Embedding)):
                    s = residual_std if name.rsplit(".", 1)[-1] in residual_names else std
                    p.normal_(0.0, s)
                else:
                    raise TypeError(f"no init rule for {name}.{pname} ({type(mod).__name__})")


class GPT(nn.Module):
    """``forward(idx, targets) -> loss`` (mean next-token cross-entropy)."""

    def __init__(self, cfg: GPTConfig = GPTConfig()) -> None:
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(GPTBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.init_weights()

    def tie_weights(self) -> None:
        if self.config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def init_weights(self) -> None:
        """(Re-)tie embeddings and initialise every parameter; a no-op on meta.
        Call after ``to_empty()`` (which breaks weight tying)."""
        self.tie_weights()
        std = self.config.init_std
        init_transformer(self, std, std / math.sqrt(2 * self.config.n_layers), ("o_proj", "fc2"))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb.weight[:T]
        x = self.drop(x)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
