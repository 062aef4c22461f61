"""Matrix multiplies off 16-byte alignment are priced slower on GPUs, by the alignment of the
dimensions each device holds, and not on the CPU placeholder."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import tensoropt
from tensoropt.compute import ALIGNED_BYTES, ComputeModel, alignment_bytes, default_compute_model
from tensoropt.hardware import get_device


def test_alignment_bytes():
    assert alignment_bytes([4096, 768], 2) == ALIGNED_BYTES
    assert alignment_bytes([4096, 50257], 2) == 2          # one odd bf16 dimension sets it
    assert alignment_bytes([4096, 50258], 2) == 4
    assert alignment_bytes([4096, 50260], 2) == 8
    assert alignment_bytes([50257], 4) == 4               # an odd fp32 dimension is 4-byte aligned
    assert alignment_bytes([768 / 5], 2) == 1              # a split that leaves a fraction


def test_the_penalty_is_the_gpus_and_takes_the_nearest_smaller_alignment():
    gpu, cpu = default_compute_model(get_device("H100")), default_compute_model(get_device("cpu"))
    assert not cpu.misaligned_efficiency
    assert cpu.alignment_factor("linear", 2) == 1.0
    f = gpu.misaligned_efficiency
    assert gpu.alignment_factor("linear", ALIGNED_BYTES) == 1.0
    assert gpu.alignment_factor("linear", 2) == f[2] < gpu.alignment_factor("linear", 4) == f[4] < 1.0
    assert gpu.alignment_factor("linear", 1) == f[min(f)]
    assert gpu.alignment_factor("attention", 2) == 1.0     # attention kernels pad head dims themselves
    dev = get_device("H100")
    big = 2.0 * 8192 * 4096 * 4096
    assert gpu.time_s("linear", big, 1e6, dev, "bf16", align=2) == pytest.approx(
        gpu.time_s("linear", big, 1e6, dev, "bf16") / f[2], rel=1e-9)
    again = ComputeModel.from_dict(gpu.to_dict())
    assert dict(again.misaligned_efficiency) == dict(f)


class _Head(nn.Module):
    def __init__(self, width: int, vocab: int):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.head(torch.relu(self.proj(x))), y)


def _head_op(vocab: int, devices: str, precision: str):
    with torch.device("meta"):
        model = _Head(1024, vocab)
    x = torch.empty(4096, 1024, device="meta")
    y = torch.zeros(4096, dtype=torch.long, device="meta")
    plan = tensoropt.plan_for(model, devices, inputs=(x, y), precision=precision)
    return next(o for o in plan.ops if o.module == "head")


def test_an_odd_vocabulary_is_priced_slower_on_a_gpu_only():
    odd, even = _head_op(32001, "1xH100", "bf16-mixed"), _head_op(32000, "1xH100", "bf16-mixed")
    f = default_compute_model(get_device("H100")).misaligned_efficiency[2]
    # the same work within 1/32000; the odd head at the measured fraction of the aligned rate
    assert odd.compute_s == pytest.approx(even.compute_s / f, rel=0.01)
    odd_cpu, even_cpu = _head_op(32001, "cpu:1", "fp32"), _head_op(32000, "cpu:1", "fp32")
    assert odd_cpu.compute_s == pytest.approx(even_cpu.compute_s, rel=1e-3)


def test_a_split_that_breaks_alignment_is_priced_by_what_each_device_holds():
    from tensoropt.capture import capture
    from tensoropt.costmodel import _local_alignment
    from tensoropt.strategy import OpConfig

    with torch.device("meta"):
        model = _Head(1024, 1028)        # 1028 bf16 = 2056 bytes: 8-byte aligned; halves 4-byte
    graph = capture(model, (torch.empty(64, 1024, device="meta"), torch.zeros(64, dtype=torch.long, device="meta")))
    head = next(op for op in graph.operators if op.module == "head")
    _, out = head.terms
    assert _local_alignment(head, OpConfig((None,)), (2,), 2) == 8
    assert _local_alignment(head, OpConfig((out[-1],)), (2,), 2) == 4
    assert _local_alignment(head, OpConfig((out[0],)), (2,), 2) == 8      # a batch split keeps it
