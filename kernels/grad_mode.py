"""When a fused op needs its autograd Function.

`torch.autograd.Function.apply` builds a graph node, a context and saved tensors on every call;
on the H200 machine's host that costs tens of µs per call, paid ~10 times per decoder layer. The
learner's π_old / π_ref forwards run under `torch.no_grad()`, where nothing of it is used, so the
fused ops compute their forward directly there (the same function, so the same bits)."""
from __future__ import annotations

import torch


def records_graph(*tensors: torch.Tensor | None) -> bool:
    """Whether an op on these inputs must be recorded for backward: grad mode is on and one of
    them requires grad."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


__all__ = ["records_graph"]
