"""Round 31: the GLU GEMM's launch at prefill rows (1.7B at M 8,192 / 32,768, 8B at 32,768)."""
import sys, time, torch
from triton.testing import do_bench
from agentq.kernels import triton_gemm as tg, triton_quant as tq, quant
from agentq.kernels.triton_gemm import GemmConfig
from agentq.kernels.quant_spec import QuantSpec
SPEC = QuantSpec.preset("w8a8_kv8")
CANDS = [(128, 256, 128, 8, 4, 2), (128, 256, 128, 8, 3, 2), (256, 128, 128, 8, 4, 2), (128, 256, 64, 8, 6, 2),
         (128, 128, 128, 8, 4, 2), (128, 256, 128, 8, 4, 1), (128, 256, 128, 8, 4, 0)]
t0 = time.time()
for name, n2, k, m in (("1.7b", 12288, 2048, 8192), ("1.7b", 12288, 2048, 32768), ("8b", 24576, 4096, 32768)):
    x_q, s_x = tq.quantize_per_token(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), SPEC)
    w_q, s_w = quant.quantize_weight(torch.randn(n2, k, device="cuda", dtype=torch.bfloat16) * 0.02, SPEC)
    w_q, s_w = tg.glu_pair_rows(w_q), tg.glu_pair_rows(s_w)
    f = lambda cfg=None: tg.int8_gemm_glu(x_q, s_x, w_q, s_w, None, torch.bfloat16, cfg)[0]
    ref, flops = f(), 2 * m * n2 * k
    us0 = 1e3 * do_bench(lambda: f(), warmup=20, rep=60)
    print(f"{name} glu N2={n2} K={k} M={m}: table {tg.glu_config(m, n2, k, x_q.device).short()} {us0:.1f} us "
          f"({flops / us0 / 1e6:.0f} TOP/s)", flush=True)
    for c in CANDS:
        cfg = GemmConfig(c[0], c[1], c[2], 1, 8, c[3], c[4], c[5])
        try:
            same = torch.equal(f(cfg), ref)
            us = 1e3 * do_bench(lambda: f(cfg), warmup=10, rep=40)
        except Exception as e:
            print(f"   {cfg.short():32s} skip {type(e).__name__}: {str(e)[:70]}", flush=True)
            continue
        print(f"   {cfg.short():32s} {us:8.1f} us {flops / us / 1e6:6.0f} TOP/s  {us0 / us:.2f}x  same={same}", flush=True)
    print(f"[{time.time() - t0:.0f} s]", flush=True)
