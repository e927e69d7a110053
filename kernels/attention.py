"""Attention over a cached (possibly quantized) context: the torch reference used on CPU and for
prefill, and the dispatch to the Triton int8-KV decode kernel on CUDA."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, Hkv, L, D] → [B, Hkv·n_rep, L, D] (GQA), as HF models do."""
    if n_rep == 1:
        return x
    b, h, l, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, l, d).reshape(b, h * n_rep, l, d)


def attention_accum_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """fp32 models on CPU compute attention in fp64.

    Why: attention is the one reduction whose order depends on batch shape (how many keys are
    padded, how many queries share a call). In fp32 that changes the last bits of its output,
    which flips an occasional int8 activation code downstream, so a turn decoded token by token
    and the same turn re-scored in one pass (the learner) would differ by ~1e-3 nats. In fp64 the
    order-dependent error is far below fp32 resolution, and engine and learner agree bit for bit
    in practice. bf16/fp16 models (GPU) keep their dtype: there, exactness is not the goal.
    """
    return torch.float64 if dtype == torch.float32 and device.type == "cpu" else dtype


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                     scale: float, chunk: int = 512) -> torch.Tensor:
    """q [B, Hq, T, D], k/v [B, Hkv, L, D], allowed [B, T, L] bool → [B, Hq, T, D].

    GQA without materialising repeated K/V: query heads are grouped under their KV head
    (head h = kv·rep + r, the order of HF's repeat_kv). In fp64 (fp32 on CPU, see
    `attention_accum_dtype`) the softmax attention is computed explicitly in query chunks of
    `chunk` rows, bounding the [chunk, L] score memory; otherwise SDPA does it in the model dtype.
    Every query row must allow at least one key (padding rows allow key 0)."""
    b, hq, t, d = q.shape
    hkv, length = k.shape[1], k.shape[2]
    rep = hq // hkv
    acc = attention_accum_dtype(q.dtype, q.device)
    if acc == q.dtype:
        return F.scaled_dot_product_attention(q, repeat_kv(k, rep), repeat_kv(v, rep),
                                              attn_mask=allowed[:, None], scale=scale)
    qg = q.reshape(b, hkv, rep, t, d).to(acc)
    kt = k.to(acc).transpose(-1, -2)                      # [B, Hkv, D, L]
    vv = v.to(acc)
    outs = []
    for t0 in range(0, t, chunk):
        t1 = min(t, t0 + chunk)
        qc = qg[:, :, :, t0:t1].reshape(b, hkv, rep * (t1 - t0), d)
        s = torch.matmul(qc, kt) * scale                  # [B, Hkv, rep·tc, L]
        m = allowed[:, None, None, t0:t1].expand(b, 1, rep, t1 - t0, length).reshape(b, 1, rep * (t1 - t0), length)
        p = torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1)
        outs.append(torch.matmul(p, vv).reshape(b, hkv, rep, t1 - t0, d))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=3)
    return out.reshape(b, hq, t, d).to(q.dtype)


def _triton_decode():
    try:
        from .triton_attention import decode_attention as fn
    except Exception:
        return None
    return fn


def decode_attention_available(device: torch.device) -> bool:
    return device.type == "cuda" and _triton_decode() is not None


def decode_attention(q, k_cache, k_scale, v_cache, v_scale, slot_ids, lens, sm_scale):
    """One query token per sequence over the engine's cache layout (CUDA Triton kernel)."""
    return _triton_decode()(q, k_cache, k_scale, v_cache, v_scale, slot_ids, lens, sm_scale)
