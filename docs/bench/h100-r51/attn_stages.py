"""Round 51 exploration, call D: the CUDA decode attention's bulk-copy stages and warps a block, swept
(STAGES is a module constant today: 3 for every warp count). Each variant's output is checked against
the default launch (bit-equal where the warps match: stages do not change the arithmetic)."""
import importlib.util
import sys

import torch

from agentq.kernels import _cuda_rtc
from agentq.kernels import cuda_attention as ca
from agentq.kernels import triton_attention as ta

spec = importlib.util.spec_from_file_location("afc", __file__.replace("attn_stages.py", "attn_fixed_cost.py"))
afc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(afc)
HQ, HKV, D, dev = afc.HQ, afc.HKV, afc.D, afc.dev
SMEM = 227 * 1024


def build(warps, stages):
    dyn = max(stages * ca.stage_bytes(warps), 4096 * warps)
    min_blocks = max(1, min(16 // warps, SMEM // (dyn + 3072)))
    src = ca.source_for(HQ // HKV, True, warps, True)
    src = src.replace(f"#define STAGES {ca.STAGES}\n", f"#define STAGES {stages}\n")
    src = src.replace(f"#define MIN_BLOCKS {max(1, min(16 // warps, SMEM // (ca.dynamic_shared_bytes(warps) + 3072)))}\n",
                      f"#define MIN_BLOCKS {min_blocks}\n")
    assert f"#define STAGES {stages}\n" in src and f"#define MIN_BLOCKS {min_blocks}\n" in src
    fn = _cuda_rtc.CudaKernel(_cuda_rtc.compile_cubin(src, "sm_90"), "agentq_decode_attn_i8", ca.SIGNATURE,
                              shared_carveout=100, dynamic_shared=dyn)
    return fn, min_blocks


def run(B, L, combos):
    q, i8, _, slots, lens = afc.case(B, L)
    kc, ks, vc, vs = i8
    refs = {}
    line = f"B {B:4d} L {L:5d}:"
    best = None
    for warps, stages in combos:
        fn, mb = build(warps, stages)
        out = torch.empty_like(q)
        args = (q, kc, vc, ks, vs, slots, lens, out, out, out, float(D ** -0.5) * 1.4426950408889634, 1,
                kc.shape[2], q.stride(0), q.stride(1), *kc.stride()[:2], *vc.stride()[:2],
                ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1), out.stride(0), out.stride(1))
        go = lambda: fn.launch((B, HKV, 1), warps * 32, args, torch.cuda.current_stream().cuda_stream, 0, pdl=True)
        go()
        torch.cuda.synchronize()
        if warps not in refs:
            refs[warps] = out.clone()
        assert torch.equal(out, refs[warps]), (warps, stages)
        us = afc.steady_us(go)
        line += f" w{warps}/st{stages}(x{mb}) {us:.1f}"
        best = min(best or (us, ""), (us, f"w{warps}/st{stages}"))
    nbytes = 2 * B * HKV * L * (D + 4)
    print(line + f"  | best {best[1]} {best[0]:.1f} ({nbytes / best[0] / 1e6:.2f} TB/s)", flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__)
    combos = [(w, s) for w in (1, 2, 4) for s in (2, 3, 4, 5, 6, 8) if not (w == 4 and s > 4)]
    for B, L in ((64, 2304), (128, 2304), (64, 4096), (64, 1024), (32, 2304)):
        run(B, L, combos)
