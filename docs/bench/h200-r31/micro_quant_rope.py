"""Round 31 exploration: bandwidth of the W8A8 prefill's memory-bound launches at 1.7B / 8B shapes."""
import os, sys, torch, triton
from triton.testing import do_bench
from agentq.kernels import triton_quant as tq, triton_norm as tn
from agentq.kernels.quant_spec import QuantSpec
SPEC = QuantSpec.preset("w8a8_kv8")
fl, rnd = SPEC.act_scale_floor, SPEC.act_rounding
dev = "cuda"

def tbs(nbytes, us): return nbytes / us / 1e6

print("== quantize_rows_from_amax (GLU codes): us, TB/s (read bf16 + write int8)")
for m, k, p in ((64, 6144, 48), (128, 6144, 96), (20480, 6144, 96), (32768, 6144, 96), (64, 12288, 96), (32768, 12288, 192)):
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    amax = x.float().abs().reshape(m, p, k // p).amax(-1).contiguous()
    ref = tq.quantize_rows_from_amax(x, amax, fl, rnd, launch=(1, 2048, 8))
    res = []
    for launch in (None, (1, 2048, 8), (2, 2048, 8), (4, 2048, 8), (8, 2048, 8), (4, 1024, 4), (8, 1024, 8), (16, 512, 8), (2, 4096, 8), (4, 4096, 16)):
        if launch and launch[1] > k: continue
        out = tq.quantize_rows_from_amax(x, amax, fl, rnd, launch=launch)
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1]), launch
        us = 1e3 * do_bench(lambda: tq.quantize_rows_from_amax(x, amax, fl, rnd, launch=launch), warmup=20, rep=100)
        res.append(f"{launch or 'default'}: {us:.1f} ({tbs(3 * m * k, us):.2f})")
    print(f"M={m} K={k}:", " | ".join(res))

print("== quantize_rows (o-proj input codes): us, TB/s")
for m, k in ((32768, 2048), (32768, 4096), (20480, 2048)):
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    us = 1e3 * do_bench(lambda: tq.quantize_rows(x, fl, rnd), warmup=20, rep=100)
    print(f"M={m} K={k}: {us:.1f} us ({tbs(3 * m * k, us):.2f} TB/s)")

print("== qk_norm_rope_to_cache (prefill chunk 64 x 512): us, TB/s; AGENTQ_ROPE_HEADS sweep")
for name, hq, hkv in (("1.7b", 16, 8), ("8b", 32, 8)):
    b, t, d = 64, 512, 128
    qkv = torch.randn(b, t, (hq + 2 * hkv) * d, device=dev, dtype=torch.bfloat16)
    q = qkv[..., :hq * d].view(b, t, hq, d); k = qkv[..., hq * d:(hq + hkv) * d].view(b, t, hkv, d)
    v = qkv[..., (hq + hkv) * d:].view(b, t, hkv, d)
    qw = torch.rand(d, device=dev, dtype=torch.bfloat16); kw = torch.rand(d, device=dev, dtype=torch.bfloat16)
    pos = torch.arange(t, device=dev).repeat(b, 1)
    cos = torch.rand(b, t, d, device=dev, dtype=torch.bfloat16); sin = torch.rand(b, t, d, device=dev, dtype=torch.bfloat16)
    slots = torch.arange(b, device=dev)
    for kvq in ("int8", "bf16"):
        dt = torch.int8 if kvq == "int8" else torch.bfloat16
        kc = torch.zeros(b + 1, hkv, 1024, d, device=dev, dtype=dt); vc = torch.zeros_like(kc)
        ks = torch.zeros(b + 1, hkv, 1024, device=dev) if kvq == "int8" else None; vs = torch.zeros_like(ks) if ks is not None else None
        quantq = (SPEC.kv_scale_floor, SPEC.kv_rounding) if kvq == "int8" else None
        nbytes = qkv.numel() * 2 + b * t * hq * d * 2 + 2 * b * t * hkv * d * dt.itemsize
        res = []
        for heads in ("", "4", "8", "16", "32"):
            os.environ["AGENTQ_ROPE_HEADS"] = heads
            f = lambda: tn.qk_norm_rope_to_cache(q, k, v, qw, kw, cos, sin, 1e-6, kc, vc, ks, vs, slots, pos, quantq)
            us = 1e3 * do_bench(f, warmup=20, rep=100)
            res.append(f"h{heads or 'def'}: {us:.1f} ({tbs(nbytes, us):.2f})")
        os.environ["AGENTQ_ROPE_HEADS"] = ""
        print(f"{name} {kvq}:", " | ".join(res))
