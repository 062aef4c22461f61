"""Multi-process checks of tensoropt.apply.parallelize; run under torchrun.

    torchrun --standalone --nproc-per-node N tests/dist_scripts/worker.py --case a,b,c

For every case each rank builds the same model (same seed), computes the single-process
reference on the full batch, lays a copy out with ``parallelize``, runs one step on its shard
and compares loss and every full gradient, then 3 Adam steps and the loss after them.
Rank 0 prints one ``RESULT {json}`` line per case (see tensoropt.launch.emit_result).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from tensoropt.apply import (  # noqa: E402
    count_collectives,
    full_grads,
    global_loss,
    parallelize,
    param_signature,
    peak_memory,
    shard_batch,
)
from tensoropt.launch import emit_result, finish_worker  # noqa: E402
from tensoropt.plan_types import ApplySpec, MeshSpec, ModuleSharding  # noqa: E402

BATCH = 8


# ----------------------------------------------------------------------------- models

# mlp-tiny with four layers so tensor-parallel plans can pair colwise -> rowwise twice.
OVERRIDES = {"mlp-tiny": {"widths": (16, 64, 32, 64, 16)}}


def make_model(name: str) -> torch.nn.Module:
    from tensoropt.models import get_model
    torch.manual_seed(0)
    return get_model(name, device="cpu", **OVERRIDES.get(name, {}))


def make_inputs(name: str, batch: int = BATCH) -> tuple:
    from tensoropt.models import example_inputs
    torch.manual_seed(1)
    return tuple(example_inputs(name, batch, device="cpu", **OVERRIDES.get(name, {})))


# ----------------------------------------------------------------------------- specs

def _ms(model, fqn, params, inputs, output, ndim, axis):
    """One ModuleSharding with the given tp-axis placements; every other axis "R"."""
    def ext(p):
        t = ["R"] * ndim
        t[axis] = p
        return tuple(t)
    mod = model.get_submodule(fqn)
    return ModuleSharding(fqn, type(mod).__name__, {k: ext(v) for k, v in params.items()},
                          tuple(ext(i) for i in inputs), ext(output))


def mlp_tp_modules(model, ndim, axis):
    out = []
    n = len(model.layers)
    for i in range(0, n - n % 2, 2):
        out.append(_ms(model, f"layers.{i}", {"weight": "S(0)", "bias": "S(0)"}, ["R"], "S(1)", ndim, axis))
        out.append(_ms(model, f"layers.{i+1}", {"weight": "S(1)", "bias": "R"}, ["S(1)"], "P", ndim, axis))
    return out


def gpt_tp_modules(model, ndim, axis, vocab=False):
    out = []
    if vocab:
        out.append(_ms(model, "tok_emb", {"weight": "S(0)"}, ["R"], "P", ndim, axis))
    for i in range(len(model.layers)):
        p = f"layers.{i}"
        for q in ("q_proj", "k_proj", "v_proj"):
            out.append(_ms(model, f"{p}.attn.{q}", {"weight": "S(0)", "bias": "S(0)"}, ["R"], "S(2)", ndim, axis))
        out.append(_ms(model, f"{p}.attn.o_proj", {"weight": "S(1)", "bias": "R"}, ["S(2)"], "P", ndim, axis))
        out.append(_ms(model, f"{p}.mlp.fc1", {"weight": "S(0)", "bias": "S(0)"}, ["R"], "S(2)", ndim, axis))
        out.append(_ms(model, f"{p}.mlp.fc2", {"weight": "S(1)", "bias": "R"}, ["S(2)"], "P", ndim, axis))
    if vocab:
        out.append(_ms(model, "lm_head", {"weight": "S(0)"}, ["R"], "R", ndim, axis))
    return out


def build_spec(case: str, model, world: int) -> tuple[ApplySpec, str, str]:
    """Returns (spec, model name, reference kind: "global" or "per_shard")."""
    sig = param_signature(model)
    b2 = ("S(0)",)
    if case in ("mlp_dp_replicate", "mlp_dp_fsdp", "mlp_dp_zero2", "mlp_dp_recompute", "cnn_dp_replicate",
                "cnn_dp_fsdp"):
        name = "cnn-tiny" if case.startswith("cnn") else "mlp-tiny"
        return ApplySpec(name, sig, MeshSpec((world,), ("dp",)), (0,), (), (b2, b2),
                         zero_stage=0 if case.endswith("replicate") else 2 if case.endswith("zero2") else 3,
                         recompute=("layers.1",) if case.endswith("recompute") else ()), name, \
            ("per_shard" if name == "cnn-tiny" else "global")
    if case == "mlp_tp":
        return ApplySpec("mlp-tiny", sig, MeshSpec((world,), ("tp",)), (), tuple(mlp_tp_modules(model, 1, 0)),
                         (("R",), ("R",))), "mlp-tiny", "global"
    if case == "mlp_explicit":
        # layers.0 replicated but batch-sharded over tp (no style fits -> DTensor + hooks);
        # layers.1..3: rowwise from a replicated input, then colwise -> rowwise.
        mods = [_ms(model, "layers.0", {"weight": "R", "bias": "R"}, ["S(0)"], "R", 1, 0),
                _ms(model, "layers.1", {"weight": "S(1)", "bias": "R"}, ["R"], "P", 1, 0),
                *mlp_tp_modules(model, 1, 0)[2:]]
        return ApplySpec("mlp-tiny", sig, MeshSpec((world,), ("tp",)), (), tuple(mods),
                         (("S(0)",), ("R",))), "mlp-tiny", "global"
    if case == "mlp_2d_explicit":
        # two model axes: layers.0 weight sharded over both (explicit DTensor path), rest colwise/rowwise-like
        mods = [ModuleSharding("layers.0", "Linear", {"weight": ("S(0)", "S(1)"), "bias": ("S(0)", "R")},
                               (("R", "R"),), ("R", "R")),
                ModuleSharding("layers.2", "Linear", {"weight": ("S(0)", "S(0)"), "bias": ("S(0)", "S(0)")},
                               (("R", "R"),), ("S(1)", "S(1)")),
                ModuleSharding("layers.3", "Linear", {"weight": ("S(1)", "S(1)"), "bias": ("R", "R")},
                               (("S(1)", "S(1)"),), ("P", "P"))]
        return ApplySpec("mlp-tiny", sig, MeshSpec((2, world // 2), ("tp1", "tp2")), (), tuple(mods),
                         (("R", "R"), ("R", "R"))), "mlp-tiny", "global"
    if case in ("gpt_tp", "gpt_tp_recompute", "gpt_tp_vocab"):
        return ApplySpec("gpt-tiny", sig, MeshSpec((world,), ("tp",)), (),
                         tuple(gpt_tp_modules(model, 1, 0, vocab=case == "gpt_tp_vocab")),
                         (("R",), ("R",)),
                         recompute=("layers.0", "layers.1") if case.endswith("recompute") else ()), "gpt-tiny", "global"
    if case in ("gpt_hybrid_fsdp", "gpt_hybrid_replicate", "gpt_hybrid_fsdp_recompute"):
        dp = 2
        return ApplySpec("gpt-tiny", sig, MeshSpec((dp, world // dp), ("dp", "tp")), (0,),
                         tuple(gpt_tp_modules(model, 2, 1)), (("S(0)", "R"), ("S(0)", "R")),
                         zero_stage=0 if case.endswith("replicate") else 3,
                         recompute=("layers.1",) if case.endswith("recompute") else ()), "gpt-tiny", "global"
    raise KeyError(f"unknown case {case!r}")


CASE_MODEL = {"mlp": "mlp-tiny", "gpt": "gpt-tiny", "cnn": "cnn-tiny"}


# ----------------------------------------------------------------------------- checks

def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-12) -> float:
    """max|a-b| / max|b|. ``floor`` bounds the denominator from below so gradients that are
    mathematically zero (e.g. a key-projection bias: softmax ignores a per-query shift) and
    hold only rounding noise are judged against the model's gradient scale."""
    return float((a - b).abs().max() / max(float(b.abs().max()), floor))


def reference(model, inputs, kind: str, n_shards: int, steps: int = 3):
    """Single-process loss + grads on the full batch (kind "global") or the mean over equal
    data shards (kind "per_shard", for BatchNorm models whose statistics are per shard)."""
    ref = copy.deepcopy(model)
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)

    def loss_fn():
        if kind == "global":
            return ref(*inputs)
        parts = [ref(*[x.chunk(n_shards)[i] for x in inputs]) for i in range(n_shards)]
        return sum(parts) / n_shards

    loss0 = loss_fn()
    loss0.backward()
    grads = {n: p.grad.detach().clone() for n, p in ref.named_parameters()}
    for _ in range(steps):
        opt.step()
        opt.zero_grad()
        loss_fn().backward()
    with torch.no_grad():
        loss_after = loss_fn()
    return float(loss0.detach()), grads, float(loss_after)


def run_case(case: str, measure: bool) -> dict:
    world = dist.get_world_size()
    name = CASE_MODEL[case.split("_")[0]]
    model = make_model(name)
    inputs = make_inputs(name)
    spec, _, kind = build_spec(case, model, world)
    n_data = 1
    for a in spec.data_axes:
        n_data *= spec.mesh.shape[a]
    ref_loss, ref_grads, ref_after = reference(model, inputs, kind, n_data)

    pmodel = parallelize(copy.deepcopy(model), spec)
    mesh = pmodel._tensoropt_mesh
    local = shard_batch(inputs, spec, mesh)
    res: dict = {"case": case, "world": world, "layout": dict(pmodel._tensoropt_layout)}

    def step():
        loss = pmodel(*local)
        loss.backward()
        return loss

    # Recompute check: a child of a checkpointed block starts twice per step (forward + recompute;
    # a pre-hook, since recomputation stops early once the last saved tensor is rebuilt).
    probe = "layers.1.mlp" if name == "gpt-tiny" else None
    calls = [0]
    if probe is not None:
        pmodel.get_submodule(probe).register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    step()
    res["probe_calls_per_step"] = calls[0] if probe is not None else None
    pmodel.zero_grad(set_to_none=True)

    if measure:
        res["collectives"] = count_collectives(step)
        pmodel.zero_grad(set_to_none=True)
        res["memory"] = peak_memory(step, pmodel)
        pmodel.zero_grad(set_to_none=True)
    loss = step()
    res["loss"] = float(global_loss(loss, spec, mesh))
    res["ref_loss"] = ref_loss
    res["loss_rel_err"] = abs(res["loss"] - ref_loss) / max(abs(ref_loss), 1e-12)
    grads = full_grads(pmodel)
    errs = {}
    scale = max(float(g.abs().max()) for g in ref_grads.values())
    for n, g in ref_grads.items():
        if n not in grads or grads[n] is None:
            errs[n] = None
        else:
            errs[n] = rel_err(grads[n], g, 1e-3 * scale)
    res["grad_rel_err"] = errs
    res["missing_grads"] = sorted(set(ref_grads) ^ set(grads))
    res["param_types"] = sorted({type(p).__name__ for p in pmodel.parameters()})

    opt = torch.optim.Adam(pmodel.parameters(), lr=1e-2)
    for _ in range(3):          # mirrors reference(): step, zero, forward+backward
        opt.step()
        opt.zero_grad()
        step()
    with torch.no_grad():
        after = pmodel(*local)
    res["loss_after_3_adam"] = float(global_loss(after, spec, mesh))
    res["ref_loss_after_3_adam"] = ref_after
    res["after_rel_err"] = abs(res["loss_after_3_adam"] - ref_after) / max(abs(ref_after), 1e-12)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, help="comma-separated case names")
    ap.add_argument("--measure", default="", help="comma-separated cases to also measure")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(False)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    measure = set(filter(None, args.measure.split(",")))
    failed = False
    for case in filter(None, args.case.split(",")):
        try:
            res = run_case(case, case in measure)
        except Exception as e:  # report and continue with the next case
            failed = True
            res = {"case": case, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        # all ranks must agree on the loss; rank 0 reports
        if rank == 0:
            emit_result(res)
        dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    finish_worker(main())
