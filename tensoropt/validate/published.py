"""Published large-scale training runs as plans: the GPU side of the cost model held against
what real clusters measured (``data/published/``, copied from their sources with them).

Each row names a model, a device set and a parallel layout (Megatron-LM SC'21 tables and
README, Korthikanti et al. 2022, Megatron-LM on H100, torchtitan on H100). :func:`cases`
turns the rows whose kernels the cost model prices alike (eager bf16/fp16 with fused
attention; no Float8, no torch.compile, no context parallelism) into :class:`Case`\\ s: a
zoo model with the row's dimensions, the devices and a :class:`~tensoropt.setups.Setup`;
the rest come back with the reason they are left out. :func:`price` prices a case with
:func:`tensoropt.plan_for`, and :func:`time_features` splits its predicted iteration time into
the parts the GPU-side terms scale (:data:`TIME_TERMS`), so that a fit on some rows can be
checked on the others.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..compute import MATMUL_FAMILIES
from ..execution import syncs_gradients_once

__all__ = ["Case", "cases", "price", "frontier_of", "time_features", "grad_comm_exposed", "TIME_TERMS", "OVERLAP_GRID", "load_rows",
           "DATA_DIR"]

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "published"
FILES = ("megatron_sc21.jsonl", "korthikanti22.jsonl", "megatron_h100_2024.jsonl", "torchtitan_h100.jsonl")

#: the parts of an iteration's predicted time the GPU-side terms scale: matrix-unit compute
#: (per device generation), other compute, tensor-parallel re-layouts, gradient reductions
#: and ZeRO gathers, and pipeline sends
#: the overlaps (``CostTerms.grad_comm_overlap``) the fit tries: the share of an operator's own
#: compute behind which its parameter collectives hide
OVERLAP_GRID = tuple(k / 10 for k in range(11))
TIME_TERMS = ("matmul_a100", "matmul_h100", "other_compute", "relayout", "grad_comm", "p2p")


@dataclass(frozen=True)
class Case:
    case_id: str
    source: str                   # file it came from
    zoo: str                      # "gpt3-175b" (GPT layout) or "llama3-8b" (LLaMA layout)
    overrides: dict               # config fields of the zoo model
    global_batch: int
    devices: str
    setup: dict                   # tensoropt.plan_for keywords
    published_s: float | None     # iteration time as published (or derived from throughput)
    published_memory_bytes: float | None
    memory_kind: str = ""         # "reserved" (torch.cuda.max_memory_reserved) where given
    assumptions: tuple[str, ...] = field(default_factory=tuple)


def load_rows(data_dir: Path = DATA_DIR) -> list[tuple[str, dict]]:
    rows = []
    for name in FILES:
        with open(data_dir / name, encoding="utf-8") as f:
            rows += [(name, json.loads(line)) for line in f if line.strip()]
    return rows


def cases(data_dir: Path = DATA_DIR) -> tuple[list[Case], list[dict]]:
    """(cases, left out): every row either becomes a case or is listed with why not."""
    out, skipped = [], []
    for name, row in load_rows(data_dir):
        cid = row.get("case_id") or f"{name.split('.')[0]}_{row.get('techniques', '')}_{row.get('n_gpus')}"
        try:
            case = _case(name, row, cid)
        except _Skip as why:
            skipped.append({"case_id": cid, "source": name, "reason": str(why)})
            continue
        out.append(case)
    return out, skipped


class _Skip(Exception):
    pass


def _case(name: str, row: dict, cid: str) -> Case:
    m = row.get("model") or {}
    techniques = str(row.get("techniques", ""))
    for word, why in (("Float8", "Float8 linears (the cost model prices bf16 kernels)"),
                      ("compile", "torch.compile's fused kernels (the cost model prices eager kernels)"),
                      ("AsyncTP", "asynchronous tensor parallelism overlaps collectives with compute")):
        if word in techniques or word in cid:
            raise _Skip(why)
    if int(row.get("cp") or 1) > 1:
        raise _Skip("context parallelism is not in the plan space")
    seq = m.get("seq")
    if not seq:
        raise _Skip("no sequence length")
    published_s = row.get("measured_iteration_s") or row.get("derived_iteration_s")
    mem = row.get("measured_peak_memory_bytes")
    derived = []
    if published_s is None and row.get("achieved_tflops_per_gpu") and m.get("hidden") and row.get("global_batch"):
        published_s = _iteration_from_tflops(row, m)
        derived.append("iteration time derived from the published TFLOP/s per GPU with the model FLOPs "
                       "72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) (Narayanan et al. 2021, without recomputation)")
    if published_s is None and mem is None:
        raise _Skip("neither an iteration time nor a memory figure (per-layer rows give per-layer times)")
    gpu = str(row.get("gpu", "")) + " " + name
    device = "H100" if "H100" in gpu or "h100" in name else "A100-80GB"
    if "H200" in gpu or "h200" in cid:
        raise _Skip("H200 row: the catalogue's H200 is priced, but these rows' kernels are not stated")
    n = int(row["n_gpus"])
    assumptions: list[str] = derived
    if name.startswith("torchtitan"):
        zoo = "llama3-8b"
        overrides = dict(vocab_size=128256, seq_len=seq, n_layers=m["layers"], d_model=m["hidden"],
                         n_heads=m["heads"], n_kv_heads=m["kv_heads"], d_ff=m["ffn_derived"])
        dp = int(row.get("fsdp_shard") or 1)
        tp, pp = int(row.get("tp") or 1), int(row.get("pp") or 1)
        global_batch = int(row["global_batch"])
        local = int(row.get("micro_batch_local") or 1)
        ac = str(row.get("activation_checkpointing", "none"))
        # torchtitan's "selective" runs its per-operator policy unless a row says otherwise
        # (selective_ac_option = "op" in its Llama 3 configurations)
        recompute = "full" if ac.startswith("full") else ("op" if "selective" in ac else "none")
        if recompute == "op" and "op" not in ac:
            assumptions.append("torchtitan's selective recomputation taken as its per-op policy (the configs' default)")
        setup = dict(tp=tp, pp=pp, dp=dp, zero=3 if dp > 1 else 0, recompute=recompute,
                     sequence_parallel=tp > 1,
                     microbatches=max(global_batch // (dp * local), 1) if pp > 1 else 1)
        if pp > 1:
            assumptions.append("pipeline micro-batches = global batch / (dp x local batch)")
    else:
        zoo = "gpt3-175b"
        heads, hidden, layers = m.get("heads"), m.get("hidden"), m.get("layers")
        if not (heads and hidden and layers):
            params = m.get("params_billion")
            dims = {174.6: (96, 12288, 96), 529.6: (128, 20480, 105)}.get(params)
            if dims is None:
                raise _Skip("model dimensions not given")
            heads, hidden, layers = dims
            assumptions.append(f"{params}B dimensions from SC'21 Table 1's model of that size")
        vocab = m.get("vocab")
        if not isinstance(vocab, int):
            vocab = 51200
            assumptions.append("vocabulary 51,200 (GPT-2 BPE padded, as SC'21's FLOPs formula takes it)")
        overrides = dict(vocab_size=vocab, seq_len=seq, n_layers=layers, d_model=hidden,
                         n_heads=heads)
        tp = int(row.get("tp") or 0)
        pp = int(row.get("pp") or 0)
        mps = int(row.get("model_parallel_size") or 0)
        if not tp:
            tp = min(mps, 8) if mps else 1
            pp = mps // tp if mps else 1
            if mps > 1:
                assumptions.append(f"model-parallel size {mps} as tp {tp} x pp {pp}")
        pp = pp or 1
        dp = int(row.get("dp") or n // (tp * pp))
        global_batch = int(row["global_batch"])
        micro = row.get("micro_batch")
        if micro is None:
            micro = 1
            assumptions.append("micro-batch size 1 (not published)")
        microbatches = global_batch // (dp * int(micro))
        if "scheme" in row and "ZeRO-3" in row["scheme"]:
            setup = dict(tp=1, pp=1, dp=n, zero=3, recompute="full", microbatches=microbatches)
            assumptions.append("ZeRO-3 rows: full recomputation as the PTD-P rows beside them")
        elif name.startswith("korthikanti"):
            sp = bool(row.get("sequence_parallel"))
            setup = dict(tp=tp, pp=pp, dp=dp, recompute="full" if row.get("recompute") == "full" else "selective",
                         sequence_parallel=sp, microbatches=microbatches)
        elif name.startswith("megatron_h100"):
            setup = dict(tp=tp, pp=pp, dp=dp, zero=1, recompute="selective", sequence_parallel=tp > 1,
                         microbatches=microbatches)
            assumptions.append("Megatron-core defaults assumed: distributed optimizer (ZeRO-1), sequence "
                               "parallelism with tp > 1, selective recomputation")
        else:
            setup = dict(tp=tp, pp=pp, dp=dp, recompute="full", microbatches=microbatches)
        if row.get("num_layers_per_virtual_pipeline_stage") or row.get("interleaved_virtual_stages_m"):
            assumptions.append("interleaved schedule priced as plain 1F1B (bubble overstated)")
    if n != setup["tp"] * setup["pp"] * setup["dp"]:
        raise _Skip(f"tp x pp x dp != {n} GPUs")
    if overrides["n_layers"] % setup["pp"]:
        raise _Skip(f"{overrides['n_layers']} layers do not split into {setup['pp']} stages")
    per_node = 8
    devices = f"{n // per_node}x{per_node}x{device}" if n >= per_node else f"{n}x{device}"
    kind = "reserved" if mem is not None else ""
    return Case(cid, name, zoo, overrides, global_batch, devices, setup,
                float(published_s) if published_s is not None else None,
                float(mem) if mem is not None else None, kind, tuple(assumptions))


def _iteration_from_tflops(row: dict, m: dict) -> float:
    b, s, l, h, v = row["global_batch"], m["seq"], m["layers"], m["hidden"], m.get("vocab")
    v = v if isinstance(v, int) else 51200
    flops = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    return flops / (float(row["achieved_tflops_per_gpu"]) * 1e12 * int(row["n_gpus"]))


def _model_and_inputs(case: Case):
    """The case's zoo model with its dimensions, and meta token inputs at its global batch."""
    import torch

    from ..models import get_model

    shape = (case.global_batch, case.overrides["seq_len"])
    tokens = torch.empty(shape, dtype=torch.long, device="meta")
    return get_model(case.zoo, **case.overrides), (tokens, tokens.clone())


def price(case: Case, calibration: str | None = None):
    """The case's plan, priced by :func:`tensoropt.plan_for` (bf16 mixed precision, Adam;
    ``calibration``: cost terms to price it with)."""
    from ..search import plan_for

    model, inputs = _model_and_inputs(case)
    return plan_for(model, case.devices, inputs=inputs, precision="bf16-mixed", label=case.case_id,
                    calibration=calibration, **case.setup)


def frontier_of(case: Case, calibration: str | None = None, **options):
    """The frontier over the case's devices for its model and batch (``calibration``: cost
    terms to search with; ``options``: ``tensoropt.frontier`` keywords)."""
    from ..search import frontier

    model, inputs = _model_and_inputs(case)
    return frontier(model, case.devices, inputs=inputs, precision="bf16-mixed", calibration=calibration, **options)


def time_features(plan, device: str) -> dict[str, float]:
    """The plan's predicted iteration time split by :data:`TIME_TERMS` (their sum is
    ``plan.time_s``): an operator's figures are per micro-batch, repeated by the pipeline's
    ``microbatches + stages - 1`` slots (its slowest stage) or the accumulation steps;
    an operator's own collectives are once per step in a pipeline stage, and in accumulation
    where ``execution.syncs_gradients_once`` (else every micro-batch)."""
    if plan.stages:
        stages = plan.mesh_shape[0]
        slots = plan.microbatches + stages - 1
        stage = max(plan.stages, key=lambda s: s.time_s)
        ops = stage.ops
        p2p = slots * float(plan.breakdown.get("p2p_s", 0.0))
    else:
        slots = plan.microbatches
        ops = plan.ops
        p2p = 0.0
    comm_times = 1 if plan.stages or syncs_gradients_once(plan.zero_stage or 0) else plan.microbatches
    mm = sum(o.compute_s for o in ops if o.family in MATMUL_FAMILIES)
    f = dict.fromkeys(TIME_TERMS, 0.0)
    f["matmul_h100" if device.startswith("H100") else "matmul_a100"] = slots * mm
    f["other_compute"] = slots * sum(o.compute_s for o in ops if o.family not in MATMUL_FAMILIES)
    f["relayout"] = slots * sum(o.relayout_s for o in ops)
    f["grad_comm"] = comm_times * sum(o.comm_s for o in ops)
    f["p2p"] = p2p
    return f


def grad_comm_exposed(plan) -> list[float]:
    """Per overlap of :data:`OVERLAP_GRID`, the plan's gradient traffic (``time_features``'
    ``grad_comm``, its first entry) left once each operator's collectives hide behind that
    share of its own compute, as ``CostTerms.grad_comm_overlap`` prices it."""
    ops = max(plan.stages, key=lambda s: s.time_s).ops if plan.stages else plan.ops
    comm_times = 1 if plan.stages or syncs_gradients_once(plan.zero_stage or 0) else plan.microbatches
    return [comm_times * sum(max(0.0, o.comm_s - w * o.compute_s) for o in ops) for w in OVERLAP_GRID]

