"""BERT encoder (post-LayerNorm, bidirectional) with a masked-LM head.

Module names (FQNs):

    tok_emb, pos_emb, type_emb  nn.Embedding (token types are all 0)
    emb_norm                    nn.LayerNorm(d)
    layers.{i}.attn.{q,k,v}_proj  nn.Linear(d, d)    # colwise
    layers.{i}.attn.o_proj        nn.Linear(d, d)    # rowwise
    layers.{i}.attn_norm          nn.LayerNorm(d)    # applied after the residual add
    layers.{i}.mlp.fc1            nn.Linear(d, d_ff) # colwise
    layers.{i}.mlp.fc2            nn.Linear(d_ff, d) # rowwise
    layers.{i}.mlp_norm           nn.LayerNorm(d)
    head_dense, head_norm       MLM transform (Linear(d, d) + GELU + LayerNorm)
    lm_head                     nn.Linear(d, vocab) with bias; weight tied to tok_emb.weight

``forward(idx, targets) -> loss``: cross-entropy over every position whose
target is not -100 (the example inputs predict every position, which costs the
same as BERT's 15 % masking would with a dense head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .gpt import FeedForward, SelfAttention, init_transformer


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    seq_len: int = 512
    n_layers: int = 24
    d_model: int = 1024
    n_heads: int = 16
    d_ff: int | None = None   # default 4 * d_model
    type_vocab_size: int = 2
    dropout: float = 0.0
    norm_eps: float = 1e-12
    init_std: float = 0.02
    tie_embeddings: bool = True

    @property
    def ffn_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model


class BertBlock(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attn = SelfAttention(cfg.d_model, cfg.n_heads, bias=True, causal=False,
                                  dropout=cfg.dropout)
        self.attn_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = FeedForward(cfg.d_model, cfg.ffn_dim, bias=True)
        self.mlp_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn_norm(x + self.drop(self.attn(x)))
        x = self.mlp_norm(x + self.drop(self.mlp(x)))
        return x


class Bert(nn.Module):
    def __init__(self, cfg: BertConfig = BertConfig()) -> None:
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.type_emb = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
        self.emb_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(BertBlock(cfg) for _ in range(cfg.n_layers))
        self.head_dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.head_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=True)
        self.init_weights()

    def tie_weights(self) -> None:
        if self.config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def init_weights(self) -> None:
        """(Re-)tie embeddings and initialise every parameter; a no-op on meta."""
        self.tie_weights()
        std = self.config.init_std
        init_transformer(self, std, std, ())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb.weight[:T] + self.type_emb.weight[0]
        x = self.drop(self.emb_norm(x))
        for layer in self.layers:
            x = layer(x)
        h = self.head_norm(F.gelu(self.head_dense(x)))
        logits = self.lm_head(h)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=-100)
