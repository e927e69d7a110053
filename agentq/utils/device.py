"""Host → device copies that do not wait for the device's queue.

`Tensor.to("cuda")` of a CPU tensor with the default non_blocking=False synchronizes the stream
after the copy. That costs nothing while the GPU is idle, but the learner's packed passes and the
engine's prefills build their index tensors (packed ids, positions, row bounds, scored columns)
between kernels: each such copy then waits for every queued kernel, and the GPU idles while the
host enqueues the next forward. With non_blocking=True, CUDA stages pageable memory into its own
buffer before the call returns (so the source may be reused at once) and pinned memory is
recorded against the stream; either way the host runs on. Device → host copies are untouched:
reading their result needs the wait. `AGENTQ_ASYNC_H2D=0` (read once) restores the blocking copies.
"""
from __future__ import annotations

import os
from typing import Any

import torch

#: host → device copies without a stream sync (AGENTQ_ASYNC_H2D=0: with one, as `Tensor.to` does)
ASYNC_H2D = os.environ.get("AGENTQ_ASYNC_H2D", "1") != "0"


def to_device(t: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`t.to(device, dtype)`; a CPU tensor bound for another device is copied without waiting for
    its queue. Any other copy (device → host above all, whose result the host may read at once)
    blocks as `Tensor.to` does."""
    target = torch.device(device)
    async_h2d = ASYNC_H2D and t.device.type == "cpu" and target.type != "cpu"
    return t.to(device=target, dtype=dtype, non_blocking=async_h2d)


def device_tensor(data: Any, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`torch.tensor(data, dtype=dtype, device=device)` built on the host, then `to_device`."""
    return to_device(torch.tensor(data, dtype=dtype), device)
