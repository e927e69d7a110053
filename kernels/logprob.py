"""Token log-probs under softmax(logits / T), the learner's scoring op: log p(target) per position.

`token_logprobs(logits [..., V], targets [...], T)` is, on CPU (and wherever Triton does not run),
exactly the torch ops the learner always ran — `logits.float()`, `/ T` when T ≠ 1, gather −
logsumexp — so CPU log-probs and their gradients keep their bits. On CUDA it is one fused Triton
op (`triton_logprob`): the logits are read in their own dtype with an online fp32 logsumexp, and the
backward writes the gradient straight in the logits' dtype, so no [N, V] fp32 copy (5.6 GB per
9k-token micro-batch at the Qwen3 vocabulary) nor fp32 gradient is ever built. The fused log-probs
differ from torch's by the order of the sum of exponentials (~1e-6 relative in fp32).
`AGENTQ_FUSED_LOGPROB=0` keeps the torch ops on CUDA too.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from .grad_mode import records_graph
from .ste import triton_path


def token_logprobs_ref(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The torch ops: fp32 log p(targets) [...] of `logits` [..., V] at temperature T."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    return x.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)


def fused_logprobs(logits: torch.Tensor, backend: str | None = None) -> bool:
    """Whether `token_logprobs` runs the Triton op for these logits: backend "triton" forces it (e.g.
    under TRITON_INTERPRET=1), "torch" forbids it, None = on CUDA unless AGENTQ_FUSED_LOGPROB=0."""
    if backend is None and os.environ.get("AGENTQ_FUSED_LOGPROB", "1") == "0":
        return False
    return triton_path(logits, backend)


class _FusedTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
        from . import triton_logprob
        lp, lse = triton_logprob.logprob_forward(logits, targets, temperature)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        return lp

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        from . import triton_logprob
        logits, targets, lse = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return triton_logprob.logprob_backward(logits, targets, lse, grad, ctx.temperature), None, None


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                   backend: str | None = None) -> torch.Tensor:
    """fp32 log p(targets) under softmax(logits / temperature), differentiable in `logits`.

    Args:
        logits: [B, L, V] or [N, V], bf16 / fp16 / fp32 (the fused path reads a slice such as
            `logits[:, :-1]` in place; its last dim must be contiguous).
        targets: integer token ids, `logits.shape[:-1]`.
        temperature: T > 0 (1 = the model's own distribution).
        backend: None (fused on CUDA), "triton" or "torch" (see `fused_logprobs`).
    Returns:
        fp32 log-probs, `logits.shape[:-1]`.
    """
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r}; token log-probs need temperature > 0")
    if not fused_logprobs(logits, backend):
        return token_logprobs_ref(logits, targets, temperature)
    if logits.dim() not in (2, 3) or targets.shape != logits.shape[:-1]:
        raise ValueError(f"logits must be [B, L, V] or [N, V] and targets their leading shape; got logits "
                         f"{tuple(logits.shape)}, targets {tuple(targets.shape)}")
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    x3, t3 = (x.unsqueeze(0), targets.unsqueeze(0)) if x.dim() == 2 else (x, targets)
    if records_graph(x):
        lp = _FusedTokenLogprobs.apply(x3, t3, float(temperature))
    else:                                     # no_grad: the Function's forward, without its graph node
        from . import triton_logprob
        lp = triton_logprob.logprob_forward(x3, t3, float(temperature))[0]
    return lp[0] if x.dim() == 2 else lp


__all__ = ["fused_logprobs", "token_logprobs", "token_logprobs_ref"]
