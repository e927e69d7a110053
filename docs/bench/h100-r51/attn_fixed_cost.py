"""Round 51 exploration: where decode attention's fixed cost per launch goes (1.7B heads, 16:8, D 128).

1. Steady-state µs per call (a CUDA graph of REPS back-to-back calls, no L2 flush between them) of the
   int8 CUDA kernel, the int8 Triton planes kernel and the bf16 Triton kernel, against L: the slope is
   the streaming rate, the intercept the fixed cost of a launch.
2. The CUDA kernel with per-block timestamps (%globaltimer, %clock64, %smid): when blocks start, when
   their first tile lands, when they end, alone and as the middle of three back-to-back launches.
"""
import dataclasses
import statistics
import sys

import torch

from agentq.kernels import _cuda_rtc, quant
from agentq.kernels import cuda_attention as ca
from agentq.kernels import triton_attention as ta
from agentq.eval.bench_kernels import steady_us    # the same timing as call A's own copy of it
from agentq.kernels.quant_spec import QuantSpec

SPEC = QuantSpec()
dev = torch.device("cuda")
HQ, HKV, D = 16, 8, 128
REPS = 10     # steady_us's default


def case(B, L):
    g = torch.Generator(device=dev).manual_seed(0)
    k = torch.randn(B, HKV, L, D, device=dev, generator=g, dtype=torch.bfloat16)
    v = torch.randn(B, HKV, L, D, device=dev, generator=g, dtype=torch.bfloat16)
    i8 = (*quant.quantize_kv(k, SPEC), *quant.quantize_kv(v, SPEC))
    q = torch.randn(B, HQ, D, device=dev, dtype=torch.bfloat16)
    slots = torch.arange(B, device=dev, dtype=torch.int32)
    lens = torch.full((B,), L, device=dev, dtype=torch.int32)
    return q, i8, (k, None, v, None), slots, lens


def sweep():
    print("== steady µs per call (graph of %d calls), TB/s of the cache bytes" % REPS)
    fits = {}
    for B in (64, 128):
        for L in (128, 512, 1024, 2304, 4096):
            q, i8, bf, slots, lens = case(B, L)
            base = ta.pick_config(B, HKV, L, torch.int8, dev)
            rows = {"cuda": (i8, base), "triton_planes": (i8, dataclasses.replace(base, cuda=False)),
                    "bf16": (bf, ta.pick_config(B, HKV, L, torch.bfloat16, dev))}
            line = f"B {B:4d} L {L:5d}"
            for name, (args, cfg) in rows.items():
                nbytes = 2 * B * HKV * L * (D * (1 if name != "bf16" else 2) + (4 if name != "bf16" else 0))
                us = steady_us(lambda: ta.decode_attention(q, *args, slots, lens, D ** -0.5, config=cfg))
                fits.setdefault((name, B), []).append((nbytes, us))
                line += f" | {name} {cfg.short()} {us:7.1f} ({nbytes / us / 1e6:.2f} TB/s)"
            print(line, flush=True)
            del q, i8, bf
            torch.cuda.empty_cache()
    print("== linear fit us = F + bytes / W (least squares over L >= 512)")
    for (name, B), pts in fits.items():
        pts = [p for p in pts if p[0] >= 2 * B * HKV * 512 * D]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        print(f"{name:14s} B {B:4d}: F {my - slope * mx:6.1f} us, W {1 / slope / 1e6:.2f} TB/s")


def patch_stamps(src):
    """The kernel's source with per-block stamps written to a last argument, tsbuf [blocks, 6]:
    %globaltimer at entry, at the first tile's arrival and at the end; %smid; %clock64 deltas."""
    src = src.replace("i64 sob, i64 soh)\n{",
                      "i64 sob, i64 soh, unsigned long long *__restrict__ tsbuf)\n{\n"
                      "    unsigned long long g0, g1 = 0, g2; long long c0 = clock64(), c1 = 0;\n"
                      "    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(g0));\n", 1)
    src = src.replace("            mbar_wait(bars0 + 8 * s, (t / STAGES) & 1);\n",
                      "            mbar_wait(bars0 + 8 * s, (t / STAGES) & 1);\n"
                      "            if (t == 0) { asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(g1)); c1 = clock64(); }\n", 1)
    head, tail = src.rsplit("    }\n}\n", 1)
    src = (head + "    }\n    __syncthreads();\n    if (threadIdx.x == 0) {\n"
           "        asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(g2));\n"
           "        unsigned smid; asm(\"mov.u32 %0, %%smid;\" : \"=r\"(smid));\n"
           "        const long long bid = ((long long)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;\n"
           "        unsigned long long *p = tsbuf + bid * 6;\n"
           "        p[0] = g0; p[1] = g1; p[2] = g2; p[3] = smid; p[4] = c1 - c0; p[5] = clock64() - c0;\n"
           "    }\n}\n" + tail)
    assert "tsbuf[" not in src and src.count("tsbuf") == 2
    return src


def timed_kernel(warps, pdl):
    src = patch_stamps(ca.source_for(HQ // HKV, True, warps, pdl))
    cubin = _cuda_rtc.compile_cubin(src, "sm_90")
    return _cuda_rtc.CudaKernel(cubin, "agentq_decode_attn_i8", ca.SIGNATURE + "p", shared_carveout=100,
                                dynamic_shared=ca.dynamic_shared_bytes(warps))


def stamps(B=64, L=2304, warps=None, pdl=True, launches=3):
    warps = warps or ta.cuda_warps_for(B, HKV)
    fn = timed_kernel(warps, pdl)
    q, i8, _, slots, lens = case(B, L)
    kc, ks, vc, vs = i8
    out = torch.empty_like(q)
    nb = B * HKV
    ts = torch.zeros(launches, nb, 6, dtype=torch.int64, device=dev)
    stream = torch.cuda.current_stream().cuda_stream

    def go(i):
        fn.launch((B, HKV, 1), warps * 32,
                  (q, kc, vc, ks, vs, slots, lens, out, out, out, float(D ** -0.5) * 1.4426950408889634, 1,
                   kc.shape[2], q.stride(0), q.stride(1), *kc.stride()[:2], *vc.stride()[:2],
                   ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1), out.stride(0), out.stride(1), ts[i]),
                  stream, 0, pdl=pdl)
    ref = ta.decode_attention(q, kc, ks, vc, vs, slots, lens, D ** -0.5)
    for rep in range(3):
        torch.cuda._sleep(10_000_000)          # the launches queue up behind a busy GPU
        for i in range(launches):
            go(i)
        torch.cuda.synchronize()
    assert (out.float() - ref.float()).abs().max().item() < 1e-2
    t = ts.cpu()
    t0 = t[:, :, 0].min().item()
    print(f"== per-block stamps, B {B} L {L} warps {warps} pdl {pdl}, {launches} back-to-back launches (µs from the first start)")
    for i in range(launches):
        g0 = (t[i, :, 0] - t0).double() / 1e3
        g1 = (t[i, :, 1] - t0).double() / 1e3
        g2 = (t[i, :, 2] - t0).double() / 1e3
        first = (t[i, :, 1] - t[i, :, 0]).double() / 1e3
        dur = (t[i, :, 2] - t[i, :, 0]).double() / 1e3
        sm = t[i, :, 3]
        per_sm = torch.bincount(sm, minlength=132)
        q = lambda x: " ".join(f"{x.quantile(p).item():7.1f}" for p in (0.0, 0.1, 0.5, 0.9, 1.0))
        print(f" launch {i}: start  q0/10/50/90/100 {q(g0)}")
        print(f"           1st tile         {q(g1)}  (latency {q(first)})")
        print(f"           end              {q(g2)}")
        print(f"           block duration   {q(dur)};  clock first/total median "
              f"{t[i, :, 4].double().median().item():.0f}/{t[i, :, 5].double().median().item():.0f} cycles")
        print(f"           blocks per SM: {sorted(collections_count(per_sm.tolist()).items())}")


def collections_count(xs):
    import collections
    return collections.Counter(xs)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__)
    what = sys.argv[1:] or ["sweep", "stamps"]
    if "stamps" in what:
        stamps(64, 2304, pdl=True)
        stamps(64, 2304, pdl=False, launches=1)
        stamps(128, 2304, pdl=True)
    if "sweep" in what:
        sweep()
