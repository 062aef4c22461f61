"""Collective benchmarks on a real process group; run under torchrun by ``tensoropt.profile``.

    torchrun --nproc-per-node P _collective_worker.py --backend gloo --sizes 4096,65536 \
        --kinds all_reduce,all_gather --target-s 0.3 --min-repeats 5 --max-repeats 40

Every rank times each call between a barrier and the op's completion; per repeat the slowest
rank's time counts. Rank 0 prints one ``RESULT {json}`` line per (kind, size) with the raw
per-repeat seconds, or ``{"skip": ...}`` when a size could not be allocated on some rank.
``n`` follows collectives.py: all-gather output bytes, reduce-scatter input bytes, all-to-all
per-rank send buffer, send_recv one message (timed as half a ping-pong between ranks 0 and 1).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from tensoropt.launch import emit_result  # noqa: E402

_ITEMSIZE = 4   # float32 buffers
_WARMUP_CALLS = 2


def _ops(kind, nbytes, world, rank, device):
    """(fn, tensors) for one collective of n bytes; fn runs it once."""
    numel = max(world, (int(nbytes) // _ITEMSIZE) // world * world)
    f32 = dict(dtype=torch.float32, device=device)
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if kind == "all_reduce":
        x = torch.ones(numel, **f32)
        return lambda: dist.all_reduce(x), numel
    if kind == "all_gather":
        out = torch.empty(numel, **f32)
        x = torch.ones(numel // world, **f32)
        return lambda: ag(out, x), numel
    if kind == "reduce_scatter":
        x = torch.ones(numel, **f32)
        out = torch.empty(numel // world, **f32)
        return lambda: rs(out, x), numel
    if kind == "all_to_all":
        x = torch.ones(numel, **f32)
        out = torch.empty(numel, **f32)
        return lambda: dist.all_to_all_single(out, x), numel
    if kind == "broadcast":
        x = torch.ones(numel, **f32)
        return lambda: dist.broadcast(x, 0), numel
    if kind == "send_recv":
        x = torch.ones(numel, **f32)

        def ping_pong():
            if rank == 0:
                dist.send(x, 1)
                dist.recv(x, 1)
            elif rank == 1:
                dist.recv(x, 0)
                dist.send(x, 0)
        return ping_pong, numel
    raise ValueError(f"unknown collective {kind!r}")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--kinds", required=True)
    ap.add_argument("--target-s", type=float, default=0.3)
    ap.add_argument("--min-repeats", type=int, default=5)
    ap.add_argument("--max-repeats", type=int, default=40)
    return ap.parse_args(argv)


def setup(backend: str):
    """Join the process group: (this rank's device, a function that waits for its work).

    nccl: the GPU ``cuda:LOCAL_RANK``, made current and bound to the group (``device_id``), so
    every buffer, barrier and synchronisation is on this rank's own GPU; gloo: the CPU.
    """
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device, functools.partial(torch.cuda.synchronize, device)
    dist.init_process_group(backend)
    return torch.device("cpu"), lambda: None


def main(argv=None) -> int:
    a = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*deprecated.*")
    device, sync = setup(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [int(s) for s in a.sizes.split(",")]
    kinds = [k for k in a.kinds.split(",") if k]
    for kind in kinds:
        if kind == "send_recv" and world < 2:
            continue
        for nbytes in sizes:
            ok = torch.ones(1, device=device)
            try:
                fn, numel = _ops(kind, nbytes, world, rank, device)
            except (RuntimeError, MemoryError):
                ok.zero_()
                fn, numel = None, 0
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            if ok.item() < 1:
                if rank == 0:
                    emit_result({"kind": kind, "group_size": world, "nbytes": nbytes,
                                 "skip": f"could not allocate {nbytes} bytes on some rank"})
                continue
            t0 = time.perf_counter()
            for _ in range(_WARMUP_CALLS):
                dist.barrier()
                fn()
                sync()
            est = torch.tensor([(time.perf_counter() - t0) / _WARMUP_CALLS], dtype=torch.float64, device=device)
            dist.all_reduce(est, op=dist.ReduceOp.MAX)
            repeats = int(min(a.max_repeats, max(a.min_repeats, a.target_s // max(est.item(), 1e-9))))
            times = torch.zeros(repeats, dtype=torch.float64, device=device)
            for i in range(repeats):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                times[i] = time.perf_counter() - t0
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            samples = times.cpu().tolist()
            if kind == "send_recv":
                samples = [t / 2 for t in samples]      # one message of a ping-pong
            if rank == 0:
                emit_result({"kind": kind, "group_size": 2 if kind == "send_recv" else world,
                             "nbytes": numel * _ITEMSIZE, "samples_s": samples})
            del fn
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
