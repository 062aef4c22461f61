"""Validation models and plan selection.

Models are zoo entries at sizes where one training step takes roughly 10-200 ms per rank on
a small CPU (one thread per rank), so compute is not drowned in launch noise. Each entry is
``(zoo name, config overrides, global batch)``. Every rank passes the full global batch to
``model(...)`` (the convention of ``tensoropt.parallelize(model, plan)``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MODELS", "make_model", "make_inputs", "forward_backward", "capture_graph", "apply_mode", "plan_key", "select_plans", "CandidatePlan"]

MODELS: dict[str, tuple[str, dict[str, Any], int]] = {
    "mlp": ("mlp-tiny", {"widths": (512, 1024, 1024, 512)}, 256),
    "gpt": ("gpt-tiny", {"d_model": 128, "n_heads": 4, "vocab_size": 512}, 64),
    "llama": ("llama-tiny", {"d_model": 128, "n_heads": 4, "n_kv_heads": 2, "d_ff": 320,
                             "vocab_size": 512}, 64),
    "cnn": ("cnn-tiny", {"channels": (32, 64)}, 64),
    "gpt-wide": ("gpt-tiny", {"d_model": 256, "n_heads": 8, "vocab_size": 1024}, 32),
    # tiny, for the end-to-end test only
    "mlp-small": ("mlp-tiny", {"widths": (16, 64, 32, 64, 16)}, 8),
    # transformers definitions, built as their users build them (keyword inputs, loss in the output)
    "hf-gpt2": ("hf:GPT2LMHeadModel", {"vocab_size": 512, "n_positions": 64, "n_embd": 128, "n_layer": 2,
                                       "n_head": 4, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}, 32),
    "hf-llama": ("hf:LlamaForCausalLM", {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 320,
                                         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                         "max_position_embeddings": 64}, 32),
}
HF_SEQ = 64


def make_model(key: str, device: str = "cpu") -> torch.nn.Module:
    """The model, built after ``torch.manual_seed(0)`` (identical on every rank)."""
    from ..models import get_model

    name, ov, _ = MODELS[key]
    torch.manual_seed(0)
    if name.startswith("hf:"):
        import transformers

        cls = getattr(transformers, name[3:])
        config = cls.config_class(**ov)
        with torch.device(device):
            return cls(config).train()
    return get_model(name, device=device, **ov)


def make_inputs(key: str, device: str = "cpu") -> tuple:
    """One global batch, drawn after ``torch.manual_seed(1)`` (identical on every rank)."""
    from ..models import example_inputs

    name, ov, batch = MODELS[key]
    torch.manual_seed(1)
    if name.startswith("hf:"):
        ids = torch.randint(0, ov["vocab_size"], (batch, HF_SEQ)).to(device)
        return {"input_ids": ids, "labels": ids.clone()}
    return tuple(example_inputs(name, batch, device=device, **ov))


def forward_backward(model, inputs):
    """One forward and backward of ``inputs`` (keyword inputs for a dict, else positional), run
    as ``tensoropt.train_step`` runs it: what the forward returns beside the loss (a language
    model's logits) is held until the backward ends, as the cost model prices it. Keyword inputs
    get what capture adds to them (``use_cache=False``: no key/value cache is built). Returns
    the loss."""
    from ..apply import train_step
    from ..capture.inputs import training_kwargs

    if isinstance(inputs, dict):
        return train_step(model, **training_kwargs(model, inputs))
    return train_step(model, *inputs)


def apply_mode(key: str, plan, graph=None) -> str:
    """How ``tensoropt.apply`` will lay ``plan`` out ("replicate" or "dtensor"), decided
    without collectives on a meta model."""
    from ..execution import apply_mode as mode

    return mode(graph if graph is not None else capture_graph(key), plan)


def capture_graph(key: str):
    from ..capture import capture

    return capture(make_model(key, "meta"), make_inputs(key, "meta"), name=MODELS[key][0])


def plan_key(plan) -> str:
    """Identity of a plan's layout (mesh, per-operator configs, ZeRO stage, recomputation)."""
    return json.dumps([list(plan.mesh_shape), [o.config for o in plan.ops], plan.zero_stage,
                       sorted(plan.recompute)])


@dataclass
class CandidatePlan:
    model: str
    role: str            # "min_time", "min_memory", "mid", "reference:<label>", with "(plain)" search
    plan: Any
    applicable: bool = True
    reason: str = ""
    apply_mode: str | None = None   # tensoropt.apply.plan_layout(...).mode


def select_plans(key: str, world: int, profile: str | None, *, max_plans: int = 6,
                 progress: bool = False) -> list[CandidatePlan]:
    """Frontier points (min time, min memory, a middle point) of the full search and of the
    search without ZeRO/recomputation, plus the reference plans, deduplicated, each checked
    with ``tensoropt.apply.plan_layout`` (no collectives). Non-applicable plans are returned
    with ``applicable=False`` and the reason."""
    import tensoropt
    from ..apply import PlanNotApplicable, plan_layout

    meta = make_model(key, "meta")
    inputs = make_inputs(key, "meta")
    graph = capture_graph(key)
    cands: list[tuple[str, Any]] = []
    for extras, tag in ((True, ""), (False, " (plain)")):
        f = tensoropt.frontier(meta, f"cpu:{world}", inputs=inputs, profile=profile, progress=progress,
                               zero=extras, recompute=extras)
        cands += [("min_time" + tag, f.min_time()), ("min_memory" + tag, f.min_memory())]
        if len(f.plans) > 2:
            cands.append(("mid" + tag, f.plans[len(f.plans) // 2]))
        if extras:
            cands += [(f"reference:{label}", p) for label, p in f.reference.items()
                      if p.world_size == world]
    out: list[CandidatePlan] = []
    seen: set[str] = set()
    for role, plan in cands:
        k = plan_key(plan)
        if k in seen:
            continue
        seen.add(k)
        c = CandidatePlan(key, role, plan)
        if plan.stages:
            # the step calibration's features and the worker's timed loop are those of one
            # program on one mesh; pipelines are run and checked by tests/test_conformance.py
            c.applicable, c.reason = False, "a pipeline plan: not in the step calibration"
            out.append(c)
            continue
        try:
            plan_layout(plan, meta)
            c.apply_mode = apply_mode(key, plan, graph)
        except (PlanNotApplicable, ValueError) as err:
            c.applicable, c.reason = False, f"{type(err).__name__}: {err}"
        out.append(c)
    ok = [c for c in out if c.applicable][:max_plans]
    return ok + [c for c in out if not c.applicable]
