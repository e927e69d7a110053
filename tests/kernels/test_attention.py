"""`kernels/attention.py`'s torch paths: the causal self-attention against the masked one."""
import pytest
import torch

from agentq.kernels.attention import attention_accum_dtype, causal_attention, masked_attention


def _qkv(b, hq, hkv, t, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=g) * 2 for h in (hq, hkv, hkv)]


@pytest.mark.parametrize("b,hq,hkv,t,d", [(1, 4, 2, 1, 64), (2, 4, 2, 37, 64), (1, 4, 4, 300, 32),
                                          (2, 8, 2, 1100, 64), (1, 2, 1, 2100, 16)])
def test_causal_attention_gives_the_masked_paths_bits_forward_and_backward(b, hq, hkv, t, d):
    """The causal kernel skips the key blocks above the diagonal; what it computes must be the
    masked path's bits: fp64 in a no-grad pass (rounded to fp32), and in a gradient pass the fp32
    output and all three gradients. Lengths below, at and across the CPU kernel's block sizes."""
    q, k, v = _qkv(b, hq, hkv, t, d)
    tril = torch.ones(t, t, dtype=torch.bool).tril().expand(b, t, t)
    scale = d ** -0.5
    with torch.no_grad():
        assert attention_accum_dtype(q.dtype, q.device) == torch.float64
        causal, masked = causal_attention(q, k, v, scale), masked_attention(q, k, v, tril, scale)
    assert causal.dtype == torch.float32 and torch.equal(causal, masked)
    # an independent reference: the softmax written out in fp64
    rep = hq // hkv
    s = q.double() @ k.double().repeat_interleave(rep, 1).transpose(-1, -2) * scale
    ref = s.masked_fill(~tril[:, None], float("-inf")).softmax(-1) @ v.double().repeat_interleave(rep, 1)
    assert (causal.double() - ref).abs().max() < 1e-6

    grads = []
    for fn in (lambda q, k, v: causal_attention(q, k, v, scale), lambda q, k, v: masked_attention(q, k, v, tril, scale)):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = fn(*leaves)
        assert out.dtype == torch.float32
        out.backward(torch.cos(torch.arange(out.numel(), dtype=torch.float32)).view_as(out))
        grads.append([out.detach()] + [x.grad for x in leaves])
    for a, c in zip(*grads):
        assert torch.equal(a, c)


def test_causal_attention_refuses_queries_after_a_prefix():
    q, k, v = _qkv(1, 2, 2, 8, 16)
    with pytest.raises(ValueError, match="self-attention"):
        causal_attention(q[:, :, -3:], k, v, 0.25)
