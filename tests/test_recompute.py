"""Recomputation policies (``tensoropt.recompute``): what the cost model takes a recomputed
block to keep is what the apply layer's checkpoint keeps, on a transformers Llama block."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

from tensoropt.capture import capture
from tensoropt.planner import recompute_units
from tensoropt.apply.checkpointing import checkpoint_context
from tensoropt.recompute import POLICIES, kept_outputs

transformers = pytest.importorskip("transformers")


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


class _CountMM(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.mm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.mm += 1
        return func(*args, **(kwargs or {}))


def test_an_op_policy_block_keeps_attention_and_every_other_linear():
    model = _llama()
    ids = torch.randint(0, 128, (2, 16))
    graph = capture(model, (), kwargs=dict(input_ids=ids, labels=ids))
    name, ops = recompute_units(graph)[0]
    kept = kept_outputs(graph, ops, "op")
    leaf = lambda i: graph.operators[i].name.rsplit(".", 1)[-1]  # noqa: E731
    assert {leaf(i) for i in kept} == {"q_proj", "v_proj", "gate_proj", "down_proj",
                                      "self_attn:scaled_dot_product_attention"}
    assert kept_outputs(graph, ops, "full") == frozenset()
    with pytest.raises(ValueError, match="unknown recomputation policy"):
        kept_outputs(graph, ops, "selective")


@pytest.mark.parametrize("policy", POLICIES)
def test_the_checkpoint_recomputes_the_linears_the_cost_model_does(policy):
    """Backward under the policy runs again the forward matrix multiplies of the linears whose
    output the cost model does not take as kept, and no others."""
    model = _llama()
    ids = torch.randint(0, 128, (2, 16))
    graph = capture(model, (), kwargs=dict(input_ids=ids, labels=ids))
    _, ops = recompute_units(graph)[0]
    linears = [i for i in ops if graph.operators[i].family == "linear"]
    kept = kept_outputs(graph, ops, policy)

    layer = model.model.layers[0]
    x = torch.randn(2, 16, 64, requires_grad=True)
    pos = model.model.rotary_emb(x, torch.arange(16)[None])
    extra = {"context_fn": checkpoint_context(policy)} if policy != "full" else {}

    def run(recompute: bool) -> int:
        fwd = lambda x: layer(x, position_embeddings=pos)  # noqa: E731
        out = checkpoint(fwd, x, use_reentrant=False, **extra) if recompute else fwd(x)
        out = out[0] if isinstance(out, tuple) else out
        counter = _CountMM()
        with counter:
            out.sum().backward()
        return counter.mm

    again = run(True) - run(False)
    # checkpoint's early stop: the block's last linear (down_proj) is not run again, as no
    # operator saves its output (the cost model still charges its second forward: noted)
    assert again == len([i for i in linears[:-1] if i not in kept])
    assert again == (len(linears) - 1 if policy == "full" else len(linears) // 2)


def test_a_plan_naming_an_unknown_policy_is_refused_before_it_is_laid_out():
    import dataclasses

    import tensoropt
    from tensoropt.apply.layout import plan_layout
    from tensoropt.models import get_model

    plan = tensoropt.plan_for("gpt-tiny", "cpu:2", dp=2, recompute="op")
    assert plan_layout(plan, get_model("gpt-tiny")).plan.recompute_policy == "op"
    with pytest.raises(ValueError, match="unknown recomputation policy 'selective'"):
        plan_layout(dataclasses.replace(plan, recompute_policy="selective"), get_model("gpt-tiny"))
