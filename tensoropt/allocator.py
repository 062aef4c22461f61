"""What a GPU's caching allocator reserves above the peak it hands out.

``Plan.peak_memory_bytes`` prices the bytes tensors occupy at the step's peak: what
``torch.cuda.max_memory_allocated`` reads. PyTorch's caching allocator keeps freed blocks in
segments it does not return to the driver, rounds requests up and splits segments, so what it
reserves from the device (``torch.cuda.max_memory_reserved``, the "memory" most training logs
print, torchtitan's among them) runs above that. The gap depends on the order of allocations,
not only on their sizes; here it is one empirical ratio.

``RESERVED_OVER_ALLOCATED`` is fitted by ``scripts/validate_published.py`` on the published
memory rows of its fit split (reserved bytes over the predicted allocated peak) and judged on
the rows held out; ``data/validation/published.json`` records both (``memory_fit``). The CPU
placeholder has no caching allocator: its reserved bytes are its allocated bytes.
"""

from __future__ import annotations

from .hardware import Device

__all__ = ["RESERVED_OVER_ALLOCATED", "reserved_ratio", "reserved_bytes"]

#: torchtitan_t1_8b_8gpu_FSDP (Llama 3.1 8B, FSDP2 on 8 H100): 82.4 GiB reserved published,
#: 72.18 GiB allocated predicted
RESERVED_OVER_ALLOCATED = 1.1416


def reserved_ratio(device: Device) -> float:
    """Reserved over allocated peak bytes on ``device`` (1 where no caching allocator runs)."""
    return 1.0 if device.placeholder else RESERVED_OVER_ALLOCATED


def reserved_bytes(peak_allocated_bytes: float, device: Device) -> float:
    """The peak a caching allocator reserves when tensors peak at ``peak_allocated_bytes``."""
    return peak_allocated_bytes * reserved_ratio(device)
