"""Model zoo: shapes/parameter counts on meta, tiny models train on CPU, export works."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tensoropt.models import MODEL_NAMES, example_inputs, get_model, get_spec, model_config

TINY = ("mlp-tiny", "cnn-tiny", "gpt-tiny", "bert-tiny", "llama-tiny")

# Reference parameter counts (torchvision / HF / papers), tied weights counted once.
REFERENCE_PARAMS = {
    "gpt2": 124.44e6,
    "gpt3-175b": 175e9,
    "llama3-8b": 8.03e9,
    "resnet50": 25.557e6,
    "wide_resnet50_2": 68.883e6,
    "vgg16": 138.358e6,
    "bert-large": 335.17e6,
    "gpt2-medium": 354.8e6,
    "gpt2-xl": 1.558e9,
}


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_builds_on_meta_with_registered_param_count(name):
    m = get_model(name)
    assert all(p.is_meta for p in m.parameters())
    assert n_params(m) == get_spec(name).num_params
    assert isinstance(m.layers, nn.ModuleList) and len(m.layers) >= 2
    inputs = example_inputs(name)
    assert all(t.is_meta for t in inputs)
    assert inputs[0].shape[0] == get_spec(name).batch_size


@pytest.mark.parametrize("name,ref", sorted(REFERENCE_PARAMS.items()))
def test_param_counts_match_reference(name, ref):
    assert abs(n_params(get_model(name)) - ref) / ref < 0.01


def test_big_shapes():
    cfg = model_config("gpt3-175b")
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.seq_len, cfg.vocab_size) == (
        96, 12288, 96, 2048, 50257)
    cfg = model_config("llama3-8b")
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab_size,
            cfg.seq_len) == (32, 4096, 32, 8, 14336, 128256, 8192)
    m = get_model("llama3-8b")
    assert m.layers[0].attn.k_proj.weight.shape == (1024, 4096)
    assert m.lm_head.weight is not m.tok_emb.weight
    idx, tgt = example_inputs("gpt3-175b")
    assert idx.shape == tgt.shape == (1536, 2048) and idx.dtype == torch.int64


def test_linear_fqns():
    names = {n for n, mod in get_model("gpt-tiny").named_modules() if isinstance(mod, nn.Linear)}
    for s in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.fc1", "mlp.fc2"):
        assert f"layers.1.{s}" in names
    assert "lm_head" in names
    names = {n for n, mod in get_model("llama-tiny").named_modules() if isinstance(mod, nn.Linear)}
    for s in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        assert f"layers.0.{s}" in names


@pytest.mark.parametrize("name", TINY)
def test_tiny_trains_on_cpu_deterministically(name):
    torch.manual_seed(0)
    m = get_model(name, device="cpu")
    torch.manual_seed(0)
    m2 = get_model(name, device="cpu")
    for (n1, p1), (n2, p2) in zip(m.named_parameters(), m2.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2) and torch.isfinite(p1).all(), n1
    inputs = example_inputs(name, device="cpu")
    loss = m(*inputs)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    for n, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    # same inputs, same weights -> same loss
    assert torch.equal(m2(*inputs), loss.detach())


def test_tied_weights_survive_to_empty():
    m = get_model("gpt-tiny", device="cpu")
    assert m.lm_head.weight is m.tok_emb.weight
    m = get_model("gpt-tiny")
    m.to_empty(device="cpu")
    m.init_weights()
    assert m.lm_head.weight is m.tok_emb.weight
    assert n_params(m) == get_spec("gpt-tiny").num_params


@pytest.mark.parametrize("name,overrides,size", [
    ("resnet50", dict(blocks=(1, 1, 1, 1), num_classes=10), 32),
    ("vgg16", dict(hidden=32, num_classes=10), 32),
])
def test_cnn_architectures_run_on_cpu(name, overrides, size):
    m = get_model(name, device="cpu", **overrides)
    images, labels = example_inputs(name, 2, device="cpu", **overrides)
    loss = m(images[:, :, :size, :size], labels)
    assert torch.isfinite(loss)
    loss.backward()


@pytest.mark.parametrize("name", ("gpt-tiny", "llama-tiny", "cnn-tiny", "mlp-tiny"))
def test_export_on_meta(name):
    ep = torch.export.export(get_model(name), example_inputs(name))
    assert ep.graph_module is not None


def _shard_attention(attn: nn.Module, rank: int, world: int) -> nn.Module:
    """Column-shard q/k/v and row-shard o (without its bias), like Colwise/RowwiseParallel."""
    a = copy.deepcopy(attn)
    with torch.no_grad():
        for proj in (a.q_proj, a.k_proj, a.v_proj):
            w = proj.weight.chunk(world, 0)[rank]
            new = nn.Linear(w.shape[1], w.shape[0], bias=proj.bias is not None)
            new.weight.copy_(w)
            if proj.bias is not None:
                new.bias.copy_(proj.bias.chunk(world, 0)[rank])
            setattr(a, [k for k, v in a.named_children() if v is proj][0], new)
        w = a.o_proj.weight.chunk(world, 1)[rank]
        o = nn.Linear(w.shape[1], w.shape[0], bias=False)
        o.weight.copy_(w)
        a.o_proj = o
    return a


@pytest.mark.parametrize("name", ("gpt-tiny", "llama-tiny"))
def test_attention_works_with_local_heads(name):
    torch.manual_seed(0)
    attn = get_model(name, device="cpu").layers[0].attn
    x = torch.randn(2, 16, 64)
    full = attn(x)
    bias = attn.o_proj.bias if attn.o_proj.bias is not None else 0
    parts = sum(_shard_attention(attn, r, 2)(x) for r in range(2)) + bias
    torch.testing.assert_close(parts, full, rtol=1e-5, atol=1e-5)


def test_seq_len_and_batch_overrides():
    idx, tgt = example_inputs("gpt2", 3, seq_len=128)
    assert idx.shape == (3, 128)
    with pytest.raises(ValueError):
        example_inputs("gpt-tiny", seq_len=17)
    with pytest.raises(ValueError):
        example_inputs("resnet50", seq_len=4)
    m = get_model("gpt2", n_layers=2)
    assert len(m.layers) == 2
    with pytest.raises(ValueError, match="unknown config field"):
        get_model("gpt2", bogus=1)


def test_dtype():
    m = get_model("llama3-8b", dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())


def test_unknown_name():
    with pytest.raises(ValueError, match="gpt2"):
        get_model("no-such-model")
    with pytest.raises(ValueError, match="known"):
        example_inputs("no-such-model")
