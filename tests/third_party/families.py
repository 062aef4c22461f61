"""Tiny configurations of third-party model families, built as their users build them.

Each family: ``build(device)`` -> the model (seeded), ``inputs(batch, device)`` -> the keyword
(or positional) inputs of one training step, ``layers``: the repeated blocks capture must
find (for hierarchical vision models, the deepest stage's blocks: stages differ in width).
Dropout is 0 so that runs compare exactly with single-process training.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

VOCAB, SEQ, IMAGE, CLASSES = 96, 8, 16, 5
# What a plan is checked at (tests/test_conformance.py, scripts/run_families.py): the global
# batch, the relative tolerance on losses and gradients, and on peak memory.
BATCH, TOL, MEMORY_TOL = 4, 1e-4, 0.10


@dataclass(frozen=True)
class Family:
    name: str
    make: Callable[[], Any]                 # -> model on the current default device
    inputs: Callable[[int, str], Any]       # (batch, device) -> inputs
    layers: int
    kind: str                               # decoder | encoder | vision | encoder-decoder | torchtitan

    def build(self, device: str = "cpu", seed: int = 0):
        torch.manual_seed(seed)
        with torch.device(device):
            model = self.make()
        return model


def _hf():
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    warnings.filterwarnings("ignore", module="transformers")
    return transformers


def _tokens(batch: int, device: str, mask: bool = False) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (batch, SEQ), generator=g).to(device)
    out = {"input_ids": ids, "labels": ids.clone()}
    if mask:        # right padding: the last two tokens of every other sequence
        m = torch.ones(batch, SEQ, dtype=torch.long)
        m[1::2, -2:] = 0
        out["attention_mask"] = m.to(device)
    return out


def _images(batch: int, device: str) -> dict:
    g = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(batch, 3, IMAGE, IMAGE, generator=g).to(device),
            "labels": torch.randint(0, CLASSES, (batch,), generator=g).to(device)}


_DEC = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, attention_dropout=0.0)


def _decoder(cls_name: str, cfg_name: str, **over):
    def make():
        T = _hf()
        cfg = getattr(T, cfg_name)(**{**_DEC, **over})
        return getattr(T, cls_name)(cfg)
    return make


def _gpt2():
    T = _hf()
    return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def _opt():
    T = _hf()
    return T.OPTForCausalLM(T.OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                        num_attention_heads=4, word_embed_proj_dim=32, max_position_embeddings=64,
                                        dropout=0.0, attention_dropout=0.0, pad_token_id=1))


def _neox():
    T = _hf()
    return T.GPTNeoXForCausalLM(T.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=2, num_attention_heads=4,
                                                max_position_embeddings=64, hidden_dropout=0.0,
                                                attention_dropout=0.0))


def _falcon():
    T = _hf()
    return T.FalconForCausalLM(T.FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=4, hidden_dropout=0.0, attention_dropout=0.0))


def _phi():
    T = _hf()
    return T.PhiForCausalLM(T.PhiConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=64, resid_pdrop=0.0,
                                        embd_pdrop=0.0, attention_dropout=0.0))


def _bert():
    T = _hf()
    return T.BertForMaskedLM(T.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def _vit():
    T = _hf()
    return T.ViTForImageClassification(T.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                   intermediate_size=64, image_size=IMAGE, patch_size=4,
                                                   num_labels=CLASSES, hidden_dropout_prob=0.0,
                                                   attention_probs_dropout_prob=0.0))


def _convnext():
    T = _hf()
    return T.ConvNextForImageClassification(T.ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 2],
                                                             num_labels=CLASSES, image_size=IMAGE,
                                                             drop_path_rate=0.0))


def _swin():
    T = _hf()
    return T.SwinForImageClassification(T.SwinConfig(image_size=IMAGE, patch_size=2, embed_dim=16, depths=[1, 2],
                                                     num_heads=[2, 4], window_size=4, num_labels=CLASSES,
                                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                                     drop_path_rate=0.0))


def _t5():
    T = _hf()
    return T.T5ForConditionalGeneration(T.T5Config(vocab_size=VOCAB, d_model=32, d_ff=64, d_kv=8, num_layers=3,
                                                   num_heads=4, dropout_rate=0.0, decoder_start_token_id=0,
                                                   pad_token_id=0))


def _bart():
    T = _hf()
    return T.BartForConditionalGeneration(T.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2,
                                                       decoder_layers=2, encoder_attention_heads=4,
                                                       decoder_attention_heads=4, encoder_ffn_dim=64,
                                                       decoder_ffn_dim=64, max_position_embeddings=64,
                                                       dropout=0.0, attention_dropout=0.0,
                                                       activation_dropout=0.0))


def _modernbert(layers: int = 4):
    T = _hf()
    return T.ModernBertForMaskedLM(T.ModernBertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers,
                                                      num_attention_heads=4, intermediate_size=64,
                                                      max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                                                      eos_token_id=2, cls_token_id=1, sep_token_id=2))


def _titan():
    from .titan_llama3 import ModelArgs, Transformer, WithLoss

    return WithLoss(Transformer(ModelArgs(dim=32, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=VOCAB,
                                          multiple_of=16, max_seq_len=SEQ)))


def _titan_inputs(batch: int, device: str):
    t = _tokens(batch, device)
    return (t["input_ids"], t["labels"])


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("llama", _decoder("LlamaForCausalLM", "LlamaConfig"), lambda b, d: _tokens(b, d, mask=True), 2, "decoder"),
    Family("qwen2", _decoder("Qwen2ForCausalLM", "Qwen2Config"), _tokens, 2, "decoder"),
    Family("qwen3", _decoder("Qwen3ForCausalLM", "Qwen3Config", head_dim=8), _tokens, 2, "decoder"),
    Family("mistral", _decoder("MistralForCausalLM", "MistralConfig"), _tokens, 2, "decoder"),
    Family("gemma", _decoder("GemmaForCausalLM", "GemmaConfig", head_dim=8), _tokens, 2, "decoder"),
    Family("phi3", _decoder("Phi3ForCausalLM", "Phi3Config", pad_token_id=0), _tokens, 2, "decoder"),
    Family("phi", _phi, _tokens, 2, "decoder"),
    Family("gpt-neox", _neox, _tokens, 2, "decoder"),
    Family("opt", _opt, _tokens, 2, "decoder"),
    Family("falcon", _falcon, _tokens, 2, "decoder"),
    Family("gpt2", _gpt2, _tokens, 2, "decoder"),
    Family("bert", _bert, lambda b, d: _tokens(b, d, mask=True), 2, "encoder"),
    Family("vit", _vit, _images, 2, "vision"),
    Family("convnext", _convnext, _images, 2, "vision"),
    Family("bart", _bart, _tokens, 2, "encoder-decoder"),
    Family("torchtitan-llama3", _titan, _titan_inputs, 4, "torchtitan"),
    # the layers after the first, which has no attention norm: 3 blocks in 4 layers, which two
    # pipeline stages split 1 + 2 (pipeline.stage_blocks)
    Family("modernbert", _modernbert, _tokens, 3, "encoder"),
]}

def layouts(plan) -> set:
    """What running ``plan`` exercises: each operator's (family, split, placement), per stage
    for a pipeline, and the plan's ZeRO stage, recomputation, stage count, micro-batches and mesh."""
    out = {("mesh", plan.mesh_shape), ("stages", len(plan.stages)), ("microbatches", plan.microbatches)}
    for part in plan.stages or (plan,):
        out |= {("op", o.family, o.config, o.placements) for o in part.ops}
        out |= {("zero", part.zero_stage), ("recompute", bool(part.recompute))}
    return out


def spread(plans: list, count: int = 6) -> list[int]:
    """``count`` frontier indices that exercise the most: the fastest and the least memory,
    then one at a time the plan adding most :func:`layouts` the picked ones lack (a tie goes
    to the plan farthest along the frontier from them), the last one a pipeline plan when the
    frontier has any and none is picked yet."""
    n = len(plans)
    each = [layouts(p) for p in plans]
    picks = sorted({0, n - 1}) if n else []
    seen = set().union(*(each[i] for i in picks))
    pipes = [i for i, p in enumerate(plans) if p.stages]
    while len(picks) < min(count, n):
        last = len(picks) == min(count, n) - 1
        pool = pipes if last and pipes and not any(plans[i].stages for i in picks) else range(n)
        best = max((i for i in pool if i not in picks),
                   key=lambda i: (len(each[i] - seen), min(abs(i - j) for j in picks)))
        picks.append(best)
        seen |= each[best]
    return sorted(picks)


# Families beyond the conformance suite, tried by scripts/try_families.py (results in
# data/families_beyond.json and the README). ``layers``: the blocks capture should find
# (T5: its first layer computes the position bias the later ones reuse, so the decoder's
# layers after the first; Swin: the deepest stage's; ResNet: the deepest stage's after its
# first, which downsamples).
_GPTJ = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, resid_pdrop=0.0,
             embd_pdrop=0.0, attn_pdrop=0.0)


def _hf_model(cls_name: str, cfg_name: str, **cfg):
    def make():
        T = _hf()
        return getattr(T, cls_name)(getattr(T, cfg_name)(**cfg))
    return make


EXTRA: dict[str, Family] = {f.name: f for f in [
    Family("t5", _t5, _tokens, 2, "encoder-decoder"),
    Family("swin", _swin, _images, 2, "vision"),
    Family("mixtral", _decoder("MixtralForCausalLM", "MixtralConfig", num_local_experts=4, num_experts_per_tok=2),
           _tokens, 2, "decoder"),
    Family("starcoder2", _decoder("Starcoder2ForCausalLM", "Starcoder2Config", residual_dropout=0.0,
                                  embedding_dropout=0.0), _tokens, 2, "decoder"),
    Family("olmo", _decoder("OlmoForCausalLM", "OlmoConfig"), _tokens, 2, "decoder"),
    Family("gemma2", _decoder("Gemma2ForCausalLM", "Gemma2Config", head_dim=8), _tokens, 2, "decoder"),
    Family("gemma3", _decoder("Gemma3ForCausalLM", "Gemma3TextConfig", head_dim=8, sliding_window=4),
           _tokens, 2, "decoder"),
    Family("gptj", _hf_model("GPTJForCausalLM", "GPTJConfig", **_GPTJ), _tokens, 2, "decoder"),
    Family("bloom", _hf_model("BloomForCausalLM", "BloomConfig", vocab_size=VOCAB, hidden_size=32, n_layer=2,
                              n_head=4, hidden_dropout=0.0, attention_dropout=0.0), _tokens, 2, "decoder"),
    Family("distilbert", _hf_model("DistilBertForMaskedLM", "DistilBertConfig", vocab_size=VOCAB, dim=32,
                                   n_layers=2, n_heads=4, hidden_dim=64, dropout=0.0, attention_dropout=0.0),
           _tokens, 2, "encoder"),
    Family("roberta", _hf_model("RobertaForMaskedLM", "RobertaConfig", vocab_size=VOCAB, hidden_size=32,
                                num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                max_position_embeddings=64), lambda b, d: _tokens(b, d, mask=True), 2, "encoder"),
    Family("deit", _hf_model("DeiTForImageClassification", "DeiTConfig", hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=64, image_size=IMAGE, patch_size=4,
                             num_labels=CLASSES, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
           _images, 2, "vision"),
    Family("resnet", _hf_model("ResNetForImageClassification", "ResNetConfig", hidden_sizes=[16, 32],
                               depths=[1, 3], embedding_size=16, num_labels=CLASSES), _images, 2, "vision"),
    # 8 layers, 7 blocks: four pipeline stages hold 1 + 2 + 2 + 2 (the first beside layer 0)
    Family("modernbert8", lambda: _modernbert(8), _tokens, 7, "encoder"),
]}
