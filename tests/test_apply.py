"""tensoropt.apply: validation (single process) and exactness against single-process training
(real torchrun launches on CPU/gloo, batched: one 2-rank and one 4-rank launch)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from tensoropt.apply import describe_layout, param_signature, parallelize, shard_batch, validate_spec
from tensoropt.launch import run_torchrun
from tensoropt.plan_types import ApplySpec, MeshSpec, ModuleSharding

SCRIPTS = Path(__file__).parent / "dist_scripts"
WORKER = SCRIPTS / "worker.py"
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class Tiny(nn.Module):
    def __init__(self, d=8, h=16):
        super().__init__()
        self.emb = nn.Embedding(32, d)
        self.layers = nn.ModuleList([nn.Linear(d, h), nn.Linear(h, d)])
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(self.layers[1](self.layers[0](self.emb(x)))).sum()


def _spec(model, modules=(), shape=(2,), names=("tp",), data_axes=(), sig=None, **kw):
    return ApplySpec("tiny", param_signature(model) if sig is None else sig, MeshSpec(shape, names),
                     data_axes, tuple(modules), **kw)


def _ms(fqn, typ, params, inputs=(("R",),), output=("R",)):
    return ModuleSharding(fqn, typ, params, inputs, output)


@pytest.fixture
def no_torchrun_env(monkeypatch):
    for k in TORCHRUN_ENV:
        monkeypatch.delenv(k, raising=False)
    assert not dist.is_initialized()


# ----------------------------------------------------------------------------- signature

def test_param_signature_meta_equals_cpu_and_detects_changes():
    torch.manual_seed(0)
    with torch.device("meta"):
        meta = Tiny()
    cpu = Tiny()
    assert param_signature(meta) == param_signature(cpu)
    assert len(param_signature(cpu)) == 64
    assert param_signature(Tiny(h=32)) != param_signature(cpu)
    assert param_signature(Tiny().to(torch.float64)) != param_signature(cpu)


# ----------------------------------------------------------------------------- bad input

def test_no_process_group_and_no_torchrun_env_raises(no_torchrun_env):
    m = Tiny()
    with pytest.raises(RuntimeError, match="torchrun"):
        parallelize(m, _spec(m))
    assert not dist.is_initialized()


def test_world_size_mismatch_raises_before_any_collective(no_torchrun_env, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    m = Tiny()
    with pytest.raises(ValueError, match=r"world size 3 .*\(2, 2\).*4 ranks"):
        parallelize(m, _spec(m, shape=(2, 2), names=("dp", "tp"), data_axes=(0,)))
    assert not dist.is_initialized()      # failed before init_process_group


def test_spec_for_another_model_raises(no_torchrun_env):
    m = Tiny()
    other = Tiny(h=32)
    with pytest.raises(ValueError, match="another model"):
        parallelize(m, _spec(other))
    assert not dist.is_initialized()


@pytest.mark.parametrize("ms, msg", [
    (_ms("layers.7", "Linear", {"weight": ("S(0)",)}), "does not exist"),
    (_ms("blocks.0", "Linear", {"weight": ("S(0)",)}), "does not exist"),
    (_ms("layers.0", "Conv2d", {"weight": ("S(0)",)}), "is a Conv2d"),
    (_ms("layers.0", "Linear", {"kernel": ("S(0)",)}), "parameter layers.0.kernel"),
    (_ms("emb", "Embedding", {"weight": ("S(0)",)}, output=("X",)), "unknown placement"),
    (_ms("layers.0", "Linear", {"weight": ("P",)}), "only allowed for module outputs"),
    (_ms("layers.0", "Linear", {"weight": ("S(0)", "R")}), "placements"),
])
def test_bad_module_sharding_raises(no_torchrun_env, ms, msg):
    m = Tiny()
    with pytest.raises(ValueError, match=msg):
        parallelize(m, _spec(m, [ms]))
    assert not dist.is_initialized()


def test_indivisible_shard_raises():
    m = Tiny(d=8, h=15)   # layers.0.weight (15, 8): S(0) over 2 ranks does not divide
    with pytest.raises(ValueError, match="not divisible"):
        validate_spec(m, _spec(m, [_ms("layers.0", "Linear", {"weight": ("S(0)",), "bias": ("S(0)",)})]))
    # on a data axis the parameter placement is left to fully_shard (which pads): no error
    validate_spec(m, _spec(m, [_ms("layers.0", "Linear", {"weight": ("S(0)",)})], names=("dp",),
                           data_axes=(0,)))


# ----------------------------------------------------------------------------- mapping

def test_layout_mapping():
    m = Tiny()
    mods = [
        _ms("emb", "Embedding", {"weight": ("S(0)",)}, output=("P",)),
        _ms("layers.0", "Linear", {"weight": ("S(0)",), "bias": ("S(0)",)}, output=("S(2)",)),
        _ms("layers.1", "Linear", {"weight": ("S(1)",), "bias": ("R",)}, (("S(2)",),), ("P",)),
        _ms("norm", "LayerNorm", {"weight": ("R",), "bias": ("R",)}, (("S(1)",),), ("S(1)",)),
    ]
    assert describe_layout(_spec(m, mods)) == {
        "emb": "rowwise", "layers.0": "colwise", "layers.1": "rowwise", "norm": "sequence_parallel"}
    emb_col = [_ms("emb", "Embedding", {"weight": ("S(1)",)}, output=("S(2)",))]
    assert describe_layout(_spec(m, emb_col)) == {"emb": "colwise"}
    # colwise weight with a replicated bias, a replicated module with sharded input: explicit DTensor
    odd = [_ms("layers.0", "Linear", {"weight": ("S(0)",), "bias": ("R",)}, output=("S(2)",)),
           _ms("layers.1", "Linear", {"weight": ("R",), "bias": ("R",)}, (("S(0)",),), ("R",))]
    assert describe_layout(_spec(m, odd)) == {"layers.0": "explicit", "layers.1": "explicit"}
    # two model axes: explicit; a data-only mesh: nothing on model axes
    two = [ModuleSharding("layers.0", "Linear", {"weight": ("S(0)", "S(1)")}, (("R", "R"),), ("R", "R"))]
    assert describe_layout(_spec(m, two, shape=(2, 2), names=("a", "b"))) == {"layers.0": "explicit"}
    dp = [ModuleSharding("layers.0", "Linear", {"weight": ("R",)}, (("S(0)",),), ("S(0)",))]
    assert describe_layout(_spec(m, dp, names=("dp",), data_axes=(0,))) == {"layers.0": "none"}


class _StubMesh:
    def __init__(self, coord):
        self.coord = coord

    def get_coordinate(self):
        return self.coord


def test_shard_batch_slices_data_axes_outer_first():
    m = Tiny()
    spec = _spec(m, shape=(2, 2), names=("dp", "tp"), data_axes=(0, 1),
                 input_placements=(("S(0)", "S(0)"), ("S(0)", "R")))
    x = torch.arange(8).view(8, 1)
    y = torch.arange(8)
    for (i, j), want in {(0, 0): [0, 1], (0, 1): [2, 3], (1, 0): [4, 5], (1, 1): [6, 7]}.items():
        xs, ys = shard_batch((x, y), spec, _StubMesh([i, j]))
        assert xs.flatten().tolist() == want
        assert ys.tolist() == list(range(4 * i, 4 * i + 4))
    with pytest.raises(ValueError, match="split evenly"):
        shard_batch((torch.zeros(6, 1), y), spec, _StubMesh([0, 0]))


def test_run_torchrun_kills_hanging_workers():
    r = run_torchrun(SCRIPTS / "hang.py", nproc=2, timeout=12)
    assert r.timed_out and not r.ok
    pids = [int(p) for p in re.findall(r"PID (\d+)", r.stdout)]     # two ranks' lines may interleave
    assert pids
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid), f"worker {pid} survived"


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# ----------------------------------------------------------------------------- multi-process

CASES_2 = ["mlp_dp_replicate", "mlp_dp_fsdp", "mlp_dp_zero2", "mlp_dp_recompute", "mlp_tp", "mlp_explicit",
           "gpt_tp", "gpt_tp_vocab", "gpt_tp_recompute", "cnn_dp_replicate", "cnn_dp_fsdp"]
MEASURE_2 = ["mlp_tp", "mlp_dp_fsdp", "mlp_dp_replicate"]
CASES_4 = ["gpt_hybrid_fsdp", "gpt_hybrid_replicate", "gpt_hybrid_fsdp_recompute", "mlp_2d_explicit",
           "gpt_tp", "mlp_tp", "cnn_dp_fsdp"]
MEASURE_4 = ["gpt_hybrid_fsdp"]


def _launch(nproc, cases, measure):
    r = run_torchrun(WORKER, ["--case", ",".join(cases), "--measure", ",".join(measure)],
                     nproc=nproc, timeout=240)
    by_case = {x["case"]: x for x in r.results}
    return r, by_case


@pytest.fixture(scope="module")
def results_2():
    return _launch(2, CASES_2, MEASURE_2)


@pytest.fixture(scope="module")
def results_4():
    return _launch(4, CASES_4, MEASURE_4)


def _check_exact(res):
    assert "error" not in res, res.get("traceback", res.get("error"))
    assert res["loss_rel_err"] <= 1e-5, (res["loss"], res["ref_loss"])
    assert res["missing_grads"] == []
    bad = {n: e for n, e in res["grad_rel_err"].items() if e is None or e > 1e-5}
    assert not bad, bad
    assert res["after_rel_err"] <= 1e-4, (res["loss_after_3_adam"], res["ref_loss_after_3_adam"])


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_2)
def test_two_ranks_match_single_process(results_2, case):
    r, by_case = results_2
    assert not r.timed_out, r.summary()
    assert case in by_case, r.summary()
    _check_exact(by_case[case])


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_4)
def test_four_ranks_match_single_process(results_4, case):
    r, by_case = results_4
    assert not r.timed_out, r.summary()
    assert case in by_case, r.summary()
    _check_exact(by_case[case])


@pytest.mark.slow
def test_launches_exit_cleanly(results_2, results_4):
    for r, _ in (results_2, results_4):
        assert r.ok, r.summary()


@pytest.mark.slow
def test_styles_applied(results_2, results_4):
    gpt = results_2[1]["gpt_tp"]["layout"]
    assert gpt["layers.0.attn.q_proj"] == gpt["layers.1.mlp.fc1"] == "colwise"
    assert gpt["layers.0.attn.o_proj"] == gpt["layers.1.mlp.fc2"] == "rowwise"
    vocab = results_2[1]["gpt_tp_vocab"]["layout"]
    assert vocab["tok_emb"] == "rowwise" and vocab["lm_head"] == "colwise"
    assert results_2[1]["mlp_explicit"]["layout"]["layers.0"] == "explicit"
    assert set(results_4[1]["mlp_2d_explicit"]["layout"].values()) == {"explicit"}
    assert "DTensor" in results_4[1]["gpt_hybrid_fsdp"]["param_types"]


@pytest.mark.slow
def test_recompute_reruns_forward(results_2, results_4):
    assert results_2[1]["gpt_tp"]["probe_calls_per_step"] == 1
    assert results_2[1]["gpt_tp_recompute"]["probe_calls_per_step"] == 2
    assert results_4[1]["gpt_hybrid_fsdp_recompute"]["probe_calls_per_step"] == 2


MLP_PARAM_BYTES = 4 * (16 * 64 + 64 + 64 * 32 + 32 + 32 * 64 + 64 + 64 * 16 + 16)


@pytest.mark.slow
def test_measured_collectives(results_2, results_4):
    by = results_2[1]
    # TP MLP (16-64-32-64-16, batch 8): all-reduce of each rowwise output in forward (8x32, 8x16
    # floats) and of layers.2's input gradient in backward (8x32); layers.0's input needs no grad.
    tp = by["mlp_tp"]["collectives"]
    assert set(tp) == {"all_reduce"}
    assert (tp["all_reduce"]["forward"], tp["all_reduce"]["backward"]) == (2, 1)
    assert tp["all_reduce"]["bytes"] == 4 * 8 * (32 + 16 + 32)
    # FSDP: one all-gather per layer group in forward, one reduce-scatter per group in backward
    fs = by["mlp_dp_fsdp"]["collectives"]
    assert fs["all_gather"]["forward"] == 4 and fs["reduce_scatter"]["backward"] == 4
    assert fs["reduce_scatter"]["bytes"] == MLP_PARAM_BYTES
    # replicate: gradients all-reduced once, in backward
    rp = by["mlp_dp_replicate"]["collectives"]
    assert set(rp) == {"all_reduce"} and rp["all_reduce"]["forward"] == 0
    assert rp["all_reduce"]["bytes"] == MLP_PARAM_BYTES
    hy = results_4[1]["gpt_hybrid_fsdp"]["collectives"]
    assert {"all_gather", "reduce_scatter", "all_reduce"} <= set(hy)


@pytest.mark.slow
def test_measured_peak_memory(results_2):
    by = results_2[1]
    for case in MEASURE_2:
        mem = by[case]["memory"]
        assert mem["peak_bytes"] > 0 and mem["method"]
    # sharded parameters: FSDP holds less parameter memory at peak than replicate
    assert by["mlp_dp_fsdp"]["memory"]["by_category"]["PARAM"] < by["mlp_dp_replicate"]["memory"]["by_category"]["PARAM"]
