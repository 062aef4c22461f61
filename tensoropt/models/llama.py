"""LLaMA-style decoder: RMSNorm, rotary embeddings, grouped-query attention,
SwiGLU MLP, untied output head, no biases.

Module names (FQNs):

    tok_emb                       nn.Embedding(vocab, d)
    layers.{i}.attn_norm          nn.RMSNorm(d)
    layers.{i}.attn.q_proj        nn.Linear(d, n_heads * head_dim)     # colwise
    layers.{i}.attn.k_proj        nn.Linear(d, n_kv_heads * head_dim)  # colwise
    layers.{i}.attn.v_proj        nn.Linear(d, n_kv_heads * head_dim)  # colwise
    layers.{i}.attn.o_proj        nn.Linear(n_heads * head_dim, d)     # rowwise
    layers.{i}.mlp_norm           nn.RMSNorm(d)
    layers.{i}.mlp.gate_proj      nn.Linear(d, d_ff)                   # colwise
    layers.{i}.mlp.up_proj        nn.Linear(d, d_ff)                   # colwise
    layers.{i}.mlp.down_proj      nn.Linear(d_ff, d)                   # rowwise
    norm                          nn.RMSNorm(d)
    lm_head                       nn.Linear(d, vocab)  (untied)

GQA: each group of ``n_heads // n_kv_heads`` query heads shares one k/v head;
k/v are expanded with ``repeat_interleave`` by that (shard-invariant) ratio, so
tensor parallelism must shard q and k/v by the same degree (tp | n_kv_heads).
Rotary cos/sin are computed inside each attention from the sequence length (no
buffers), so every ``layers[i]`` maps ``x -> x`` and meta models need nothing
beyond ``to_empty()`` + ``init_weights()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .gpt import init_transformer


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 128256
    seq_len: int = 8192
    n_layers: int = 32
    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int = 8
    d_ff: int = 14336
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    init_std: float = 0.02
    tie_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} not divisible by n_heads={self.n_heads}")
        return self.d_model // self.n_heads


def rotary_cos_sin(seq_len: int, head_dim: int, theta: float,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (seq_len, head_dim // 2), float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device,
                                             dtype=torch.float32) / head_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    return freqs.cos(), freqs.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary embedding; x: (B, H, T, head_dim), cos/sin: (T, head_dim//2)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.to(x.dtype)


class GQAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        if cfg.n_heads % cfg.n_kv_heads:
            raise ValueError(f"n_heads={cfg.n_heads} not divisible by n_kv_heads={cfg.n_kv_heads}")
        self.head_dim = cfg.head_dim
        self.n_rep = cfg.n_heads // cfg.n_kv_heads
        self.rope_theta = cfg.rope_theta
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * self.head_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        cos, sin = rotary_cos_sin(T, self.head_dim, self.rope_theta, x.device)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        if self.n_rep > 1:  # static (config) branch, not data-dependent
            k = k.repeat_interleave(self.n_rep, dim=1)
            v = v.repeat_interleave(self.n_rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(y)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = GQAttention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        x = x + self.mlp(self.mlp_norm(x))
        return x


class Llama(nn.Module):
    """``forward(idx, targets) -> loss`` (mean next-token cross-entropy)."""

    def __init__(self, cfg: LlamaConfig = LlamaConfig()) -> None:
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.init_weights()

    def tie_weights(self) -> None:
        if self.config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def init_weights(self) -> None:
        """(Re-)tie (if configured) and initialise every parameter; a no-op on meta."""
        self.tie_weights()
        std = self.config.init_std
        init_transformer(self, std, std / math.sqrt(2 * self.config.n_layers),
                          ("o_proj", "down_proj"))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
