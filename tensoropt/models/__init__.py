"""Model zoo: plain-torch models whose ``forward(*example_inputs)`` returns the
scalar training loss, so one training step is ``model(*inputs).backward()``.

API
---
``MODEL_NAMES``                      tuple of registered names
``get_model(name, *, device="meta", dtype=torch.float32, **overrides)``
    Builds under ``torch.device("meta")`` (instant, no allocation, even for
    gpt3-175b); for any other device the model is ``to_empty()``-ed there and
    ``init_weights()`` runs, so after ``torch.manual_seed(s)`` two processes
    building on CPU get identical weights. ``overrides`` replace fields of the
    model's config dataclass (e.g. ``n_layers=4``).
``example_inputs(name, batch_size=None, *, device="meta", seq_len=None, dtype=torch.float32, **overrides)``
    ``(idx, targets)`` int64 (B, T) for language models, ``(images, labels)``
    (B, 3, S, S) / (B,) for CNNs, ``(x, y)`` (B, d_in) / (B, d_out) for the MLP.
    Random on real devices (global RNG), uninitialised on meta. ``dtype`` is for
    float inputs; pass the same ``overrides`` as to ``get_model`` if they change
    vocab/width/image size.
``get_spec(name)`` / ``model_config(name, **overrides)``: registry entry / config.

Default (global) batch sizes and sequence lengths
-------------------------------------------------

================  =======  ======  ===========  ==============================
name              batch    seq     params       notes
================  =======  ======  ===========  ==============================
mlp               1024     -       134.2M       widths 8192-8192-8192 (2 layers)
mlp-tiny          8        -       1.1K         widths 16-32-16
cnn-tiny          8        32x32   5.5K         2 conv blocks + fc, 10 classes
resnet50          256      224     25.56M       torchvision layout
wide_resnet50_2   256      224     68.88M
vgg16             256      224     138.36M      dropout 0 (torchvision: 0.5)
gpt-tiny          8        16      0.11M        2 layers, d 64, 4 heads, vocab 128
gpt2              8        1024    124.4M       tied lm_head
gpt2-medium       8        1024    354.8M
gpt2-xl           8        1024    1.558B
gpt3-175b         1536     2048    174.6B       GPT-3 paper batch (3.1M tokens)
bert-tiny         8        16      0.11M
bert-large        8        512     335.1M       MLM head, tied decoder
llama-tiny        8        16      0.10M        2 layers, 4 heads, 2 KV heads
llama3-8b         8        8192    8.03B        GQA 32/8 heads, untied head
================  =======  ======  ===========  ==============================

Conventions: repeated blocks live in ``model.layers`` (an ``nn.ModuleList``; each
``layers[i]`` maps one activation tensor to one of the same shape, except CNN
stage transitions). Transformer blocks: ``layers.{i}.attn.{q,k,v,o}_proj``,
``layers.{i}.mlp.{fc1,fc2}`` (GPT/BERT) or ``layers.{i}.mlp.{gate,up,down}_proj``
(LLaMA), norms ``layers.{i}.attn_norm`` / ``layers.{i}.mlp_norm``; top level
``tok_emb``, ``pos_emb`` (GPT/BERT), ``norm``, ``lm_head``. Weight tying (GPT,
BERT) is lost by ``to_empty()``; ``init_weights()`` re-ties.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .bert import Bert, BertConfig
from .cnn import ResNet, ResNetConfig, TinyCNN, TinyCNNConfig, VGG, VGGConfig
from .gpt import GPT, GPTConfig
from .llama import Llama, LlamaConfig
from .mlp import MLP, MLPConfig

__all__ = [
    "MODEL_NAMES", "ModelSpec", "get_model", "example_inputs", "get_spec", "model_config",
    "GPT", "GPTConfig", "Bert", "BertConfig", "Llama", "LlamaConfig", "MLP", "MLPConfig",
    "ResNet", "ResNetConfig", "VGG", "VGGConfig", "TinyCNN", "TinyCNNConfig",
]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    cls: type[nn.Module]
    config: Any            # the default config dataclass instance
    kind: str              # "lm" (idx, targets) | "image" (images, labels) | "mlp" (x, y)
    batch_size: int        # default global batch size
    num_params: int        # expected parameter count (tied weights counted once)


_SPECS: dict[str, ModelSpec] = {}


def _register(name: str, cls: type[nn.Module], config: Any, kind: str, batch_size: int,
              num_params: int) -> None:
    _SPECS[name] = ModelSpec(name, cls, config, kind, batch_size, num_params)


_register("mlp", MLP, MLPConfig(widths=(8192, 8192, 8192)), "mlp", 1024, 134_234_112)
_register("mlp-tiny", MLP, MLPConfig(widths=(16, 32, 16)), "mlp", 8, 1_072)
_register("cnn-tiny", TinyCNN, TinyCNNConfig(), "image", 8, 5_466)
_register("resnet50", ResNet, ResNetConfig(blocks=(3, 4, 6, 3)), "image", 256, 25_557_032)
_register("wide_resnet50_2", ResNet, ResNetConfig(blocks=(3, 4, 6, 3), width_per_group=128),
          "image", 256, 68_883_240)
_register("vgg16", VGG, VGGConfig(), "image", 256, 138_357_544)
_register("gpt-tiny", GPT, GPTConfig(vocab_size=128, seq_len=16, n_layers=2, d_model=64,
                                     n_heads=4), "lm", 8, 109_312)
_register("gpt2", GPT, GPTConfig(), "lm", 8, 124_439_808)
_register("gpt2-medium", GPT, GPTConfig(n_layers=24, d_model=1024, n_heads=16), "lm", 8,
          354_823_168)
_register("gpt2-xl", GPT, GPTConfig(n_layers=48, d_model=1600, n_heads=25), "lm", 8,
          1_557_611_200)
_register("gpt3-175b", GPT, GPTConfig(seq_len=2048, n_layers=96, d_model=12288, n_heads=96),
          "lm", 1536, 174_604_259_328)
_register("bert-tiny", Bert, BertConfig(vocab_size=128, seq_len=16, n_layers=2, d_model=64,
                                        n_heads=4), "lm", 8, 113_856)
_register("bert-large", Bert, BertConfig(), "lm", 8, 335_174_458)
_register("llama-tiny", Llama, LlamaConfig(vocab_size=128, seq_len=16, n_layers=2, d_model=64,
                                           n_heads=4, n_kv_heads=2, d_ff=160), "lm", 8, 102_720)
_register("llama3-8b", Llama, LlamaConfig(), "lm", 8, 8_030_261_248)

MODEL_NAMES: tuple[str, ...] = tuple(_SPECS)


def get_spec(name: str) -> ModelSpec:
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}") from None


def model_config(name: str, **overrides: Any) -> Any:
    spec = get_spec(name)
    if not overrides:
        return spec.config
    fields = {f.name for f in dataclasses.fields(spec.config)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise ValueError(f"unknown config field(s) {bad} for {name!r}; fields: {sorted(fields)}")
    return dataclasses.replace(spec.config, **overrides)


def get_model(name: str, *, device: str | torch.device = "meta",
              dtype: torch.dtype = torch.float32, **overrides: Any) -> nn.Module:
    """Build model ``name`` (see module docstring) in training mode."""
    spec = get_spec(name)
    cfg = model_config(name, **overrides)
    with torch.device("meta"):
        model = spec.cls(cfg)
    if dtype != torch.float32:
        model.to(dtype=dtype)
    dev = torch.device(device)
    if dev.type != "meta":
        model.to_empty(device=dev)
        model.init_weights()  # re-ties shared weights, resets BN stats
    return model


def example_inputs(name: str, batch_size: int | None = None, *,
                   device: str | torch.device = "meta", seq_len: int | None = None,
                   dtype: torch.dtype = torch.float32,
                   **overrides: Any) -> tuple[torch.Tensor, ...]:
    """Inputs of one global training step for model ``name``."""
    spec = get_spec(name)
    cfg = model_config(name, **overrides)
    B = spec.batch_size if batch_size is None else int(batch_size)
    if B < 1:
        raise ValueError(f"batch_size must be >= 1, got {B}")
    dev = torch.device(device)
    if spec.kind != "lm" and seq_len is not None:
        raise ValueError(f"{name!r} takes no seq_len")
    if spec.kind == "lm":
        T = cfg.seq_len if seq_len is None else int(seq_len)
        if not 1 <= T <= cfg.seq_len:
            raise ValueError(f"seq_len must be in [1, {cfg.seq_len}] for {name!r}, got {T}")
        idx = torch.randint(0, cfg.vocab_size, (B, T), device=dev)
        targets = torch.randint(0, cfg.vocab_size, (B, T), device=dev)
        return idx, targets
    if spec.kind == "image":
        S = cfg.image_size
        images = torch.randn(B, 3, S, S, device=dev, dtype=dtype)
        labels = torch.randint(0, cfg.num_classes, (B,), device=dev)
        return images, labels
    w = cfg.widths
    return (torch.randn(B, w[0], device=dev, dtype=dtype),
            torch.randn(B, w[-1], device=dev, dtype=dtype))
