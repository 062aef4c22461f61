"""The ``torchrun`` process group a plan is laid out in: its world size, checked before any
collective, and its initialisation from the launch's environment."""

from __future__ import annotations

import os

import torch

__all__ = ["current_world_size", "ensure_process_group"]


def current_world_size() -> int:
    """World size of the initialised process group, else ``$WORLD_SIZE``; RuntimeError if neither."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    raise RuntimeError(
        "tensoropt.parallelize needs torch.distributed: no process group is initialised and "
        "RANK/WORLD_SIZE are not set. Launch the script with torchrun, e.g. "
        "`torchrun --standalone --nproc-per-node N your_script.py`, or call "
        "torch.distributed.init_process_group first.")


def ensure_process_group() -> str:
    """Initialise the default process group from the torchrun environment if needed.

    Returns the device type for the mesh ("cuda" when CUDA is available, else "cpu").
    """
    import torch.distributed as dist
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if not dist.is_initialized():
        current_world_size()          # raises the "launch with torchrun" error if no env
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    else:
        backend = dist.get_backend()
        if device_type == "cuda" and "nccl" not in str(backend):
            device_type = "cpu"
    return device_type
