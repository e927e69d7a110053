"""Round 51 exploration, call B: does a block's first-tile delay persist to its end (the initial burst of
STAGES bulk copies from every block at once sets an order the steady state keeps), and does a smaller
first burst (INIT tiles, the rest issued when the first lands) shorten the launch?"""
import importlib.util
import statistics
import sys

import torch

from agentq.kernels import _cuda_rtc
from agentq.kernels import cuda_attention as ca
from agentq.kernels import triton_attention as ta

spec = importlib.util.spec_from_file_location("afc", __file__.replace("attn_burst.py", "attn_fixed_cost.py"))
afc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(afc)
HQ, HKV, D, dev = afc.HQ, afc.HKV, afc.D, afc.dev
ISSUE = "            mbar_wait(bars0 + 8 * s, (t / STAGES) & 1);\n"


def variant_source(warps, pdl, init, stamps):
    src = ca.source_for(HQ // HKV, True, warps, pdl)
    if init < ca.STAGES:
        old = "        for (int t = 0; t < STAGES && t < ntiles; ++t) {"
        assert src.count(old) == 1
        src = src.replace(old, f"        for (int t = 0; t < {init} && t < ntiles; ++t) {{")
        src = src.replace(ISSUE, ISSUE +
            f"            if (t == 0 && threadIdx.x == 0)\n"
            f"                for (int tt = {init}; tt < STAGES && tt < ntiles; ++tt) {{\n"
            f"                    const int nn = start + tt * TILE_POS;\n"
            f"                    if (nn + TILE_POS <= lmax)\n"
            f"                        bulk_tile(stages0 + tt * STAGE_BYTES, bars0 + 8 * tt, k0 + (i64)nn * 128,"
            f" v0p + (i64)nn * 128, ks0 + nn, vs0 + nn);\n"
            f"                }}\n", 1)
    if stamps:
        src = afc.patch_stamps(src)
    return src


def build(warps, pdl, init, stamps):
    src = variant_source(warps, pdl, init, stamps)
    return _cuda_rtc.CudaKernel(_cuda_rtc.compile_cubin(src, "sm_90"), "agentq_decode_attn_i8",
                                ca.SIGNATURE + ("p" if stamps else ""), shared_carveout=100,
                                dynamic_shared=ca.dynamic_shared_bytes(warps))


def launcher(fn, B, q, i8, slots, lens, out, warps, pdl, ts=None):
    kc, ks, vc, vs = i8
    args = (q, kc, vc, ks, vs, slots, lens, out, out, out, float(D ** -0.5) * 1.4426950408889634, 1,
            kc.shape[2], q.stride(0), q.stride(1), *kc.stride()[:2], *vc.stride()[:2],
            ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1), out.stride(0), out.stride(1))
    return lambda: fn.launch((B, HKV, 1), warps * 32, args + ((ts,) if ts is not None else ()),
                             torch.cuda.current_stream().cuda_stream, 0, pdl=pdl)


def corr(a, b):
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    num = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    return num / (sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b)) ** 0.5


def stamp_analysis(B, L, init, pdl=True, launches=3):
    warps = ta.cuda_warps_for(B, HKV)
    fn = build(warps, pdl, init, stamps=True)
    q, i8, _, slots, lens = afc.case(B, L)
    out = torch.empty_like(q)
    ts = torch.zeros(launches, B * HKV, 6, dtype=torch.int64, device=dev)
    gos = [launcher(fn, B, q, i8, slots, lens, out, warps, pdl, ts[i]) for i in range(launches)]
    ref = ta.decode_attention(q, *i8, slots, lens, D ** -0.5)
    for _ in range(3):
        torch.cuda._sleep(10_000_000)
        for g in gos:
            g()
        torch.cuda.synchronize()
    assert (out.float() - ref.float()).abs().max().item() < 1e-2
    t = ts.cpu().double()
    print(f"-- B {B} L {L} init {init} warps {warps}: per launch (µs)")
    prev_end = None
    for i in range(launches):
        t0 = t[i, :, 0].min().item() if prev_end is None else prev_end
        first, end, sm = (t[i, :, 1] - t0) / 1e3, (t[i, :, 2] - t0) / 1e3, t[i, :, 3].long()
        span = end.max().item()
        per_sm_spread = []
        for s in sm.unique().tolist():
            e = end[sm == s]
            per_sm_spread.append((e.max() - e.min()).item())
        nb = torch.bincount(sm, minlength=132)
        heavy = nb[sm] == nb.max()
        print(f"  launch {i}: from {'its first start' if prev_end is None else 'the previous end'}: "
              f"1st tile p0/50/100 {first.min().item():.1f}/{first.median().item():.1f}/{first.max().item():.1f}, "
              f"end p0/10/50/90/100 " + "/".join(f"{end.quantile(p).item():.1f}" for p in (0, .1, .5, .9, 1)) +
              f"; corr(1st tile, end) {corr(first.tolist(), end.tolist()):.2f} (on full SMs "
              f"{corr(first[heavy].tolist(), end[heavy].tolist()):.2f}); end spread within an SM median "
              f"{statistics.median(per_sm_spread):.1f}, max {max(per_sm_spread):.1f}")
        prev_end = t[i, :, 2].max().item()


def steady(B, L, inits):
    warps = ta.cuda_warps_for(B, HKV)
    q, i8, _, slots, lens = afc.case(B, L)
    out = torch.empty_like(q)
    ref = ta.decode_attention(q, *i8, slots, lens, D ** -0.5)
    res = {}
    for rep in range(2):
        for init in inits:
            go = launcher(build(warps, True, init, stamps=False), B, q, i8, slots, lens, out, warps, True)
            out.zero_()
            go()
            torch.cuda.synchronize()
            assert torch.equal(out, ref), f"init {init}: not the default kernel's bits"
            res.setdefault(init, []).append(afc.steady_us(go))
    nbytes = 2 * B * HKV * L * (D + 4)
    print(f"B {B:4d} L {L:5d} steady µs per call (2 passes): " + " | ".join(
        f"init {k}: {v[0]:.1f} / {v[1]:.1f} ({nbytes / min(v) / 1e6:.2f} TB/s)" for k, v in res.items()), flush=True)


def splits(B, L):
    """The library's launch (CUDA kernel + the Triton combine launch) at 1-8 splits, 2 and 4 warps, and
    the combine launch alone: what splits would cost with the merge inside the kernel."""
    import dataclasses
    q, i8, _, slots, lens = afc.case(B, L)
    base = ta.pick_config(B, HKV, L, torch.int8, dev)
    line = f"B {B:4d} L {L:5d} splits:"
    for w in (4, 2):
        for sp in (1, 2, 4, 8):
            cfg = dataclasses.replace(base, cuda=True, cuda_warps=w, num_splits=sp)
            us = afc.steady_us(lambda: ta.decode_attention(q, *i8, slots, lens, D ** -0.5, config=cfg))
            line += f" w{w}/sp{sp} {us:.1f}"
    for sp in (2, 4, 8):
        po = torch.randn(B, HQ, sp, D, device=dev)
        plse = torch.randn(B, HQ, sp, device=dev)
        out = torch.empty_like(q)
        us = afc.steady_us(lambda: ta._combine_splits(po, plse, out, out, False, True))
        line += f" | combine sp{sp} {us:.1f}"
    print(line, flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__)
    what = sys.argv[1:] or ["stamps", "splits", "steady"]
    if "stamps" in what:                      # call B (attn-burst.log)
        for init in (3, 1):
            stamp_analysis(64, 2304, init)
        stamp_analysis(128, 2304, 3)
        stamp_analysis(128, 2304, 1)
    if "splits" in what:                      # call C (attn-splits.log)
        for B, L in ((64, 2304), (128, 2304), (64, 1024)):
            splits(B, L)
    if "steady" in what:                      # call C (attn-splits.log; call B's try captured nothing)
        for B, L in ((64, 2304), (64, 4096), (128, 2304), (66, 2304), (60, 2304)):
            steady(B, L, (3, 2, 1))
