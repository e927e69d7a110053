"""The dX GEMM alone at 1B learner shapes (M tokens): bf16 dY @ W_fq vs the int8 path (fused dY*s_w
row quantization + int8_gemm over W_q^T), and the quantization launch alone."""
import torch
from triton.testing import do_bench

from agentq.kernels import quant, ste, triton_gemm, triton_quant
from agentq.kernels.quant_spec import QuantSpec

spec = QuantSpec.preset("w8a8_kv8")
g = torch.Generator(device="cuda").manual_seed(0)
print(f"{'shape':<10} {'M':>5} {'N_out':>6} {'K_in':>5} {'bf16 us':>9} {'int8 us':>9} {'quant us':>9} {'gemm us':>9} {'ratio':>6} cfg")
for M in (2048, 8192):
    for name, n, k in (("qkv", 4096, 2048), ("o", 2048, 2048), ("gate_up", 12288, 2048), ("down", 2048, 6144),
                       ("qkv8b", 6144, 4096), ("gu8b", 24576, 4096), ("down8b", 4096, 12288)):
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
        gy = (torch.randn(M, n, device="cuda", generator=g) * 1e-6).bfloat16()
        cache = ste.WeightCache()
        w_q, s_w = cache.get(w, spec)
        w_fq = cache.dequantized(torch.bfloat16)
        w_t, unit = cache.transposed()
        bf = do_bench(lambda: gy @ w_fq)
        i8 = do_bench(lambda: ste._int8_grad_input(gy, w_q, s_w, cache, spec, torch.bfloat16, None))
        gq, sg = triton_quant.quantize_rows(gy, quant.GRAD_SCALE_FLOOR, "half_even", col_scale=s_w)
        qt = do_bench(lambda: triton_quant.quantize_rows(gy, quant.GRAD_SCALE_FLOOR, "half_even", col_scale=s_w))
        gm = do_bench(lambda: triton_gemm.int8_gemm(gq, sg, w_t, unit, None, torch.bfloat16))
        cfg = triton_gemm.pick_config(M, k, n)
        exact = gy.float() @ quant.dequantize_rows(w_q, s_w)
        rel_i8 = float((ste._int8_grad_input(gy, w_q, s_w, cache, spec, torch.bfloat16, None).float() - exact).norm() / exact.norm())
        rel_bf = float(((gy @ w_fq).float() - exact).norm() / exact.norm())
        print(f"{name:<10} {M:>5} {n:>6} {k:>5} {bf*1e3:>9.1f} {i8*1e3:>9.1f} {qt*1e3:>9.1f} {gm*1e3:>9.1f} {bf/i8:>6.2f} "
              f"{cfg.short()} relerr int8 {rel_i8:.2e} bf16 {rel_bf:.2e}", flush=True)
        del w, gy, cache, w_fq, w_t, gq, exact
