"""Round 31 exploration: W8A8 GEMM launches at the 1.7B prefill rows (M = 32,768), incl. BLOCK_K = 256."""
import sys, time, torch
from triton.testing import do_bench
from agentq.kernels import triton_gemm as tg, triton_quant as tq
from agentq.kernels.triton_gemm import GemmConfig
from agentq.kernels.quant_spec import QuantSpec
SPEC = QuantSpec.preset("w8a8_kv8")
dev = "cuda"
M = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
CANDS = [(128, 128, 256, 8, 3, 0), (128, 128, 256, 4, 3, 0), (256, 128, 256, 8, 2, 0), (128, 256, 256, 8, 2, 0),
         (128, 128, 256, 8, 3, 2), (256, 128, 128, 8, 4, 2), (128, 256, 128, 8, 4, 2), (128, 128, 128, 8, 5, 0),
         (256, 128, 128, 8, 3, 0), (128, 256, 128, 8, 3, 0), (256, 128, 256, 8, 2, 2)]
shapes = [("qkv", 4096, 2048, False), ("o", 2048, 2048, False), ("gate_up", 12288, 2048, True), ("down", 2048, 6144, False)]
t0 = time.time()
for name, n, k, glu in shapes:
    x = torch.randn(M, k, device=dev, dtype=torch.bfloat16)
    x_q, s_x = tq.quantize_per_token(x, SPEC)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    from agentq.kernels import quant
    w_q, s_w = quant.quantize_weight(w, SPEC)
    if glu:
        w_q, s_w = tg.glu_pair_rows(w_q), tg.glu_pair_rows(s_w)
        f = lambda cfg=None: tg.int8_gemm_glu(x_q, s_x, w_q, s_w, None, torch.bfloat16, cfg)[0]
        cur = tg.glu_config(M, n, k, x_q.device)
    else:
        f = lambda cfg=None: tg.int8_gemm(x_q, s_x, w_q, s_w, None, torch.bfloat16, cfg)
        cur = tg.pick_config(M, n, k, x_q.device)
    ref = f()
    flops = 2 * M * n * k
    us0 = 1e3 * do_bench(lambda: f(), warmup=20, rep=60)
    print(f"{name} N={n} K={k}: table {cur.short()} {us0:.1f} us ({flops / us0 / 1e6:.0f} TOP/s)", flush=True)
    for bm, bn, bk, w_, st, p in CANDS:
        for g in (8,):
            cfg = GemmConfig(bm, bn, bk, 1, g, w_, st, p)
            try:
                out = f(cfg)
                same = torch.equal(out, ref)
                us = 1e3 * do_bench(lambda: f(cfg), warmup=10, rep=40)
            except Exception as e:
                print(f"   {cfg.short():32s} skip {type(e).__name__}: {str(e)[:70]}", flush=True)
                continue
            print(f"   {cfg.short():32s} {us:8.1f} us {flops / us / 1e6:6.0f} TOP/s  {us0 / us:.2f}x  same={same}", flush=True)
    print(f"[{time.time() - t0:.0f} s]", flush=True)
