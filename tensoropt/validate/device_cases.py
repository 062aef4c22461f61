"""Models at the sizes one 80 GB GPU trains, for holding the GPU cost model against real steps.

Each case builds its model and one batch on any device (``"meta"`` to plan, ``"cuda"`` to
run), in bf16 there, from the zoo or from ``transformers`` as its users build them (SDPA
attention, dropout 0). ``policies``: the recomputation settings each is run with
(``plan_for(recompute=...)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["DeviceCase", "CASES", "get_case"]

LM_POLICIES = ("none", "op", "full")


@dataclass(frozen=True)
class DeviceCase:
    name: str
    source: str                                   # "zoo" | "transformers"
    make: Callable[[], Any]                       # -> the model on the current default device
    inputs: Callable[[str], Any]                  # device -> a dict of keyword or a tuple of inputs
    policies: tuple[str, ...] = LM_POLICIES

    def build(self, device: str = "meta", seed: int = 0, dtype: torch.dtype = torch.bfloat16):
        torch.manual_seed(seed)
        if self.source == "zoo":
            model = self.make(device)
        else:
            with torch.device(device):
                model = self.make()
        if device != "meta":
            model = model.to(dtype)
        return model


def _zoo(name: str, **overrides):
    from ..models import get_model

    return lambda device: get_model(name, device=device, **overrides)


def _zoo_inputs(name: str, batch: int, **overrides):
    def inputs(device: str):
        from ..models import example_inputs

        torch.manual_seed(1)
        return tuple(example_inputs(name, batch, device=device, **overrides))
    return inputs


def _hf(cls_name: str, cfg_name: str, **cfg):
    def make():
        import transformers
        from transformers.utils import logging

        logging.set_verbosity_error()
        config = getattr(transformers, cfg_name)(**cfg)
        config._attn_implementation = "sdpa"
        return getattr(transformers, cls_name)(config)
    return make


def _tokens(batch: int, seq: int, vocab: int, labels: bool = True):
    def inputs(device: str):
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
        return {"input_ids": ids, "labels": ids.clone()} if labels else {"input_ids": ids}
    return inputs


def _images(batch: int, size: int, classes: int):
    def inputs(device: str):
        g = torch.Generator().manual_seed(1)
        return {"pixel_values": torch.randn(batch, 3, size, size, generator=g).to(device),
                "labels": torch.randint(0, classes, (batch,), generator=g).to(device)}
    return inputs


# Llama 3.2 1B's shape (tied embeddings), at sequence 2048
_LLAMA_1B = dict(vocab_size=128256, seq_len=2048, n_layers=16, d_model=2048, n_heads=32, n_kv_heads=8, d_ff=8192,
                 tie_embeddings=True)
_HF_LLAMA = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                 num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048)
# Qwen2.5 1.5B's widths, 8 of its 28 layers
_HF_QWEN2 = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=8,
                 num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True)

CASES: dict[str, DeviceCase] = {c.name: c for c in [
    DeviceCase("gpt2", "zoo", _zoo("gpt2"), _zoo_inputs("gpt2", 8)),
    DeviceCase("gpt2-medium", "zoo", _zoo("gpt2-medium"), _zoo_inputs("gpt2-medium", 8)),
    DeviceCase("llama-1b", "zoo", _zoo("llama3-8b", **_LLAMA_1B), _zoo_inputs("llama3-8b", 4, **_LLAMA_1B)),
    DeviceCase("resnet50", "zoo", _zoo("resnet50"), _zoo_inputs("resnet50", 128), ("none", "full")),
    DeviceCase("hf-gpt2", "transformers",
               _hf("GPT2LMHeadModel", "GPT2Config", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
               _tokens(8, 1024, 50257)),
    DeviceCase("hf-llama", "transformers", _hf("LlamaForCausalLM", "LlamaConfig", **_HF_LLAMA),
               _tokens(8, 2048, 32000)),
    DeviceCase("hf-qwen2", "transformers", _hf("Qwen2ForCausalLM", "Qwen2Config", **_HF_QWEN2),
               _tokens(4, 2048, 151936)),
    DeviceCase("hf-bert", "transformers",
               _hf("BertForMaskedLM", "BertConfig", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
               _tokens(32, 512, 30522)),
    DeviceCase("hf-vit", "transformers",
               _hf("ViTForImageClassification", "ViTConfig", hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0, num_labels=1000),
               _images(64, 224, 1000)),
]}


def get_case(name: str) -> DeviceCase:
    try:
        return CASES[name]
    except KeyError:
        raise ValueError(f"unknown device case {name!r}; known: {', '.join(CASES)}") from None
