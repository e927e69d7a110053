"""`cuda_attention`: the int8 decode attention as hand-laid warp MMAs fed by bulk copies (NVRTC).

On a CPU: the source's compile-time checks, where the kernel applies, which GPUs take it by default,
the launch wrapper's argument checks, the launch table by GPU and grid (warps, stages), and (where an NVRTC library is found) that the source compiles for
sm_90. On a CUDA GPU with sm_90: the kernel against the fp32 reference and the Triton kernel over GQA
groups 1–8, 1–8 warps a block, 1–8 stages (the same bits), ragged and empty rows, a last tile that runs past the cache (read from
global memory), scale rows that are not 16-byte aligned (the Triton kernel then), splits, fp16 and
strided queries, programmatic dependent launch and CUDA graph replay.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from agentq.kernels import cuda_attention as ca
from agentq.kernels import quant
from agentq.kernels.quant_spec import QuantSpec

SPEC = QuantSpec.preset("w8a8_kv8")
CUDA = torch.cuda.is_available()


# ---------------------------------------------------------------------- CPU
def test_source_for_refuses_unsupported_shapes():
    with pytest.raises(ValueError, match="group 9"):
        ca.source_for(9, True, 4, False)
    with pytest.raises(ValueError, match="warps 3"):
        ca.source_for(2, True, 3, False)
    text = ca.source_for(4, False, 2, True)
    assert "#define GROUP 4\n" in text and "#define Q_BF16 0\n" in text and "#define TILE_POS 32\n" in text
    # a stage: 32 positions of K and V codes (128 bytes each) and their fp32 scales
    assert ca.stage_bytes(2) == 32 * (2 * 128 + 2 * 4) and f"#define STAGE_BYTES {ca.stage_bytes(2)}\n" in text
    assert ca.dynamic_shared_bytes(4) == ca.STAGES * 64 * 264
    # stages: the count of stage buffers and mbarriers (a stage also has room for 4 warps' partial O's)
    staged = ca.source_for(4, False, 4, True, stages=2)
    assert "#define STAGES 2\n" in staged and ca.dynamic_shared_bytes(4, 2) == 2 * 64 * 264
    assert ca.dynamic_shared_bytes(4, 1) == 64 * 264 >= 4096 * 4
    for bad in (0, ca.MAX_STAGES + 1):
        with pytest.raises(ValueError, match=f"stages {bad} outside"):
            ca.source_for(2, True, 4, False, stages=bad)


def test_launch_follows_the_gpu_and_the_grid(monkeypatch):
    """`cuda_launch_for`: the H100's rows (round 51 sweep), every other GPU's (the H200's round-44
    rule, 3 stages), and the sweep switches over both."""
    from agentq.kernels import triton_attention as ta
    batches = (1, 16, 17, 32, 33, 64, 65, 127, 128, 256)
    names = {0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA H200", 2: "NVIDIA B200"}
    monkeypatch.setattr(ta, "_gpu_name_of", lambda index: names[index])
    h100 = [ta.cuda_launch_for(b, 8, torch.device("cuda", 0)) for b in batches]
    assert h100 == [(2, 2)] * 2 + [(4, 2)] * 2 + [(2, 2)] * 2 + [(4, 2)] * 4     # B · Hkv 8 .. 2,048
    rule = [(2, 3)] * 2 + [(4, 3)] * 6 + [(2, 3)] * 2                # 4 warps at 128 < B · Hkv < 1024
    for where in (torch.device("cuda", 1), torch.device("cuda", 2), torch.device("cpu"), None):
        assert [ta.cuda_launch_for(b, 8, where) for b in batches] == rule
    monkeypatch.setattr(ta, "CUDA_STAGES", 4)
    assert ta.cuda_launch_for(64, 8, torch.device("cuda", 0)) == (2, 4)
    monkeypatch.setattr(ta, "CUDA_WARPS", 8)
    assert ta.cuda_launch_for(64, 8, torch.device("cuda", 1)) == (8, 4)


def test_env_switch_parses_warps_and_stages(monkeypatch):
    from agentq.kernels import triton_attention as ta
    base = ta.AttnConfig()
    monkeypatch.setenv("AGENTQ_DECODE_ATTN", "cuda:2:4")
    assert ta.cuda_choice(base) == dataclasses.replace(base, cuda=True, cuda_warps=2, cuda_stages=4)
    monkeypatch.setenv("AGENTQ_DECODE_ATTN", "cuda:4")
    assert ta.cuda_choice(base) == dataclasses.replace(base, cuda=True, cuda_warps=4)
    for bad in ("cuda:4:0", "cuda:4:9", "cuda:4:x", "cuda:3", "cuda:4:2:1", "cudaa"):
        monkeypatch.setenv("AGENTQ_DECODE_ATTN", bad)
        with pytest.raises(ValueError, match="cuda:WARPS:STAGES"):
            ta.cuda_choice(base)
    # 8 warps' stages are 33 KB each: 7 no longer fit a block's 227 KB (it would fall back to Triton's kernel
    # under the cuda choice's name), 6 do
    monkeypatch.setenv("AGENTQ_DECODE_ATTN", "cuda:8:7")
    with pytest.raises(ValueError, match="234 KB of shared memory a block, more than the 227 KB"):
        ta.cuda_choice(base)
    monkeypatch.setenv("AGENTQ_DECODE_ATTN", "cuda:8:6")
    assert ta.cuda_choice(base).cuda_stages == 6


def test_launch_problem_is_the_block_shared_memory_by_hand():
    # a stage of w warps: 16·w positions × (2 × 128 code bytes + 2 × 4 scale bytes); 3 KB static beside them
    assert ca.stage_bytes(8) == 128 * 264 == 33_792
    assert ca.launch_problem(8, 6) is None                      # 6 × 33,792 + 3,072 = 205,824 ≤ 232,448
    assert "234 KB" in ca.launch_problem(8, 7)                  # 7 × 33,792 + 3,072 = 239,616 B: 234 KB
    assert all(ca.launch_problem(w, ca.MAX_STAGES) is None for w in (1, 2, 4))   # 4 × 8: 8 × 16,896 + 3,072
    assert ca.launch_problem(3, 2) == "warps 3 not one of 1, 2, 4, 8"
    assert ca.launch_problem(2, 0) == f"stages 0 outside 1..{ca.MAX_STAGES}"
    with pytest.raises(ValueError, match="more than the 227 KB"):
        ca.source_for(2, True, 8, False, stages=8)


@pytest.mark.parametrize("cap, cuda", [((9, 0), True), ((10, 0), False), ((8, 0), False)])
def test_default_takes_the_kernel_on_sm90_only(monkeypatch, cap, cuda):
    from agentq.kernels import triton_attention as ta
    monkeypatch.setattr(ca, "capability", lambda device: cap)
    monkeypatch.setattr(ta, "num_sms", lambda device: 132)                 # no GPU to ask here
    assert ta.H200_ATTN["int8"].cuda
    pick = lambda dev: ta.pick_config(64, 8, 2304, torch.int8, dev)     # noqa: E731
    assert pick(torch.device("cuda", 0)).cuda is cuda and pick("cuda").cuda is cuda
    assert not pick(torch.device("cpu")).cuda and not pick(None).cuda
    assert not ta.pick_config(64, 8, 2304, torch.bfloat16, torch.device("cuda", 0)).cuda     # bf16 caches
    monkeypatch.setattr(ta, "CUDA_KERNEL", False)                          # the module switch (sweeps)
    assert not pick(torch.device("cuda", 0)).cuda
    # the variable overrides any config; unset, an explicit config is taken as it is
    explicit = dataclasses.replace(ta.H200_ATTN["int8"], cuda=True)
    monkeypatch.setenv("AGENTQ_DECODE_ATTN", "")
    assert ta.cuda_choice(explicit).cuda and not ta.cuda_choice(pick("cuda")).cuda
    monkeypatch.setenv("AGENTQ_DECODE_ATTN", "triton")
    assert not ta.cuda_choice(explicit).cuda
    monkeypatch.setenv("AGENTQ_DECODE_ATTN", "cuda")
    assert ta.cuda_choice(pick("cuda")).cuda


def test_does_not_apply_on_cpu():
    q = torch.zeros(2, 8, 128, dtype=torch.bfloat16)
    kc = torch.zeros(4, 2, 64, 128, dtype=torch.int8)
    sc = torch.ones(4, 2, 64)
    assert not ca.applies(q, kc, kc, sc, sc)
    from agentq.kernels import triton_attention as ta
    asked = ta.AttnConfig(cuda=True)        # what decode_attention then runs (and benchmarks label): Triton's
    assert not ta.effective_config(asked, q, kc, sc, kc, sc).cuda


def test_launch_checks_its_arguments():
    from agentq.kernels._cuda_rtc import CudaKernel
    with pytest.raises(ValueError, match="unknown argument type"):
        CudaKernel(b"", "k", "pz")
    k = CudaKernel(b"", "k", "pf")
    with pytest.raises(ValueError, match="takes 2 arguments, got 1"):
        k.launch((1,), 32, (1,), stream=0, device_index=0)


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_source_compiles_with_nvrtc(arch):
    """Every variant the dispatch can ask for compiles (NVRTC needs no GPU)."""
    if not ca.nvrtc_found():
        pytest.skip("no NVRTC library here (CUDA builds of PyTorch bring one)")
    from agentq.kernels._cuda_rtc import compile_cubin
    for group in (1, 2, 4, 8):
        for warps in (1, 2, 4, 8):
            cubin = compile_cubin(ca.source_for(group, True, warps, True), arch)
            assert cubin[:4] == b"\x7fELF"
    for stages in (1, 2, 4, ca.MAX_STAGES):          # the stage counts the launch table can ask for
        assert compile_cubin(ca.source_for(2, True, 2, True, stages), arch)[:4] == b"\x7fELF"


# ---------------------------------------------------------------------- CUDA
needs_cuda = pytest.mark.skipif(not CUDA or torch.cuda.get_device_capability() < (9, 0),
                                reason="needs a CUDA GPU of capability 9.0+ (bulk copies)")


def _case(B, Hq, Hkv, Lmax, lens, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    S = B + 3
    k = torch.randn(S, Hkv, Lmax, 128, generator=g, device="cuda")
    v = torch.randn(S, Hkv, Lmax, 128, generator=g, device="cuda")
    q = torch.randn(B, Hq, 128, generator=g, device="cuda").to(dtype)
    slots = torch.randperm(S, generator=g, device="cuda")[:B].to(torch.int32)
    (kc, ks), (vc, vs) = quant.quantize_kv(k, SPEC), quant.quantize_kv(v, SPEC)
    return q, kc, ks, vc, vs, slots, torch.tensor(lens, dtype=torch.int32, device="cuda")


def _run(case, **cfg):
    from agentq.kernels import triton_attention as ta
    base = ta.AttnConfig(cuda=True, **cfg)
    return ta.decode_attention(*case, 128 ** -0.5, config=base)


def _check(out, ref, label):
    err = (out.float() - ref.float()).abs().max().item()
    rel = ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()
    print(f"{label}: max|err| {err:.2e} rel {rel:.2e}")
    # bf16 output: 1 ulp is 7.8e-3 at |x| in [1, 2); the same bound as the Triton kernel's test
    assert torch.isfinite(out).all() and err <= 2e-2 and rel <= 5e-3, label


@needs_cuda
@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("launch", [dict(cuda_warps=4), dict(cuda_warps=2), dict(cuda_warps=1), dict(cuda_warps=8),
                                    dict(cuda_warps=4, num_splits=3), dict(cuda_warps=2, num_splits=2)])
def test_matches_reference(group, launch):
    """Lmax 1000: the last tile of the rows that reach it runs past the cache (read from global memory)."""
    from agentq.kernels import triton_attention as ta
    hkv = 4
    lens = [1000, 1, 0, 77, 16, 17, 999, 512]
    case = _case(8, hkv * group, hkv, 1000, lens, seed=group)
    assert ca.applies(case[0], case[1], case[3], case[2], case[4])
    out = _run(case, **launch)
    ref = ta.decode_attention_ref(*case, 128 ** -0.5)
    _check(out, ref, f"g{group} {launch}")
    assert torch.equal(out[2], torch.zeros_like(out[2]))   # an empty row gives zeros, as the reference
    tri = ta.decode_attention(*case, 128 ** -0.5, config=ta.AttnConfig(num_splits=1))
    assert (out.float() - tri.float()).abs().max().item() <= 2e-2


@needs_cuda
@pytest.mark.parametrize("warps", [2, 4])
def test_stages_keep_the_bits(warps):
    """Stages move where tiles wait, not the arithmetic: 1-8 stages, the same output bits."""
    case = _case(8, 16, 8, 1000, [1000, 1, 0, 77, 16, 17, 999, 512], seed=31)
    outs = [_run(case, cuda_warps=warps, cuda_stages=st, num_splits=1) for st in (1, 2, 3, 4, ca.MAX_STAGES)]
    assert all(torch.equal(o, outs[0]) for o in outs[1:])


@needs_cuda
def test_applies_refuses_what_the_kernel_cannot_read():
    case = _case(4, 16, 8, 512, [512, 3, 100, 64], seed=2)
    q, kc, ks, vc, vs = case[:5]
    assert ca.applies(q, kc, vc, ks, vs, torch.empty_like(q))
    assert not ca.applies(q, kc.bfloat16(), vc.bfloat16(), None, None)           # a bf16 cache
    assert not ca.applies(q, kc, vc, ks, vs, torch.empty(q.shape, device="cuda"))  # an fp32 output
    assert not ca.applies(torch.zeros(4, 72, 128, device="cuda", dtype=q.dtype), kc, vc, ks, vs)   # group 9
    odd = torch.zeros(4 * 16 * 128 + 1, device="cuda", dtype=q.dtype)[1:].view(4, 16, 128)      # 2-byte aligned q
    assert not ca.applies(odd, kc, vc, ks, vs)
    assert not ca.applies(q, kc[:, :, :, :64], vc[:, :, :, :64], ks, vs)            # head_dim 64
    assert not ca.applies(q, kc[:, :, ::2], vc[:, :, ::2], ks, vs)                 # positions 256 bytes apart


@needs_cuda
def test_group_three_heads():
    """A 24/8-head model: GQA group 3, the query rows 3 of the 8 MMA columns."""
    from agentq.kernels import triton_attention as ta
    case = _case(4, 24, 8, 700, [700, 1, 333, 64], seed=13)
    _check(_run(case), ta.decode_attention_ref(*case, 128 ** -0.5), "group 3")


@needs_cuda
def test_first_call_inside_graph_capture():
    """The kernel's first use (NVRTC, module load, attributes) while a CUDA graph is being captured."""
    from agentq.kernels import triton_attention as ta
    case = _case(4, 40, 8, 300, [300, 7, 150, 64], seed=21)     # group 5: a variant no other test built
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = _run(case)
    g.replay()
    _check(static, ta.decode_attention_ref(*case, 128 ** -0.5), "first call in capture")


@needs_cuda
def test_unaligned_scale_rows_run_the_triton_kernel():
    from agentq.kernels import triton_attention as ta
    case = _case(4, 16, 8, 1001, [1001, 5, 300, 64], seed=4)       # scale rows of 1,001 floats
    assert not ca.applies(case[0], case[1], case[3], case[2], case[4])
    assert torch.equal(_run(case), ta.decode_attention(*case, 128 ** -0.5, config=ta.AttnConfig()))


@needs_cuda
def test_fp16_queries_and_strided_q():
    from agentq.kernels import triton_attention as ta
    case = list(_case(4, 16, 8, 2304, [2304, 100, 2000, 33], dtype=torch.float16, seed=5))
    _check(_run(case), ta.decode_attention_ref(*case, 128 ** -0.5), "fp16 q")
    wide = torch.randn(4, 16, 3, 128, device="cuda", dtype=torch.bfloat16)   # q[:, :, 1]: a strided view
    case[0] = wide[:, :, 1]
    assert ca.applies(case[0], case[1], case[3], case[2], case[4])
    _check(_run(case), ta.decode_attention_ref(*case, 128 ** -0.5), "strided q")


@needs_cuda
def test_graph_replay_and_pdl_give_the_eager_bits(monkeypatch):
    from agentq.kernels import triton_attention as ta
    case = list(_case(16, 32, 8, 1024, [1024] * 16, seed=9))
    eager = _run(case)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = _run(case)
    g.replay()
    assert torch.equal(static, eager)
    case[6].copy_(torch.arange(16, device="cuda", dtype=torch.int32) * 60 + 7)     # new ragged lens
    g.replay()
    _check(static, ta.decode_attention_ref(*case, 128 ** -0.5), "replayed with new lens")
    monkeypatch.setenv("AGENTQ_PDL", "0")
    assert torch.equal(_run(case), static)


@needs_cuda
def test_env_switch_selects_the_kernel(monkeypatch):
    from agentq.kernels import triton_attention as ta
    case = _case(4, 16, 8, 512, [512, 300, 1, 64], seed=3)
    cfg = ta.AttnConfig(num_splits=1)
    monkeypatch.setenv("AGENTQ_DECODE_ATTN", "cuda")
    via_env = ta.decode_attention(*case, 128 ** -0.5, config=cfg)
    assert torch.equal(via_env, _run(case, num_splits=1))
    monkeypatch.setenv("AGENTQ_DECODE_ATTN", "cuda:8")
    assert torch.equal(ta.decode_attention(*case, 128 ** -0.5, config=cfg), _run(case, num_splits=1, cuda_warps=8))
    monkeypatch.setenv("AGENTQ_DECODE_ATTN", "cuda:2:4")
    assert torch.equal(ta.decode_attention(*case, 128 ** -0.5, config=cfg),
                       _run(case, num_splits=1, cuda_warps=2, cuda_stages=4))
    monkeypatch.setenv("AGENTQ_DECODE_ATTN", "cuda:x")
    with pytest.raises(ValueError, match="cuda:WARPS"):
        ta.decode_attention(*case, 128 ** -0.5, config=cfg)
    monkeypatch.setenv("AGENTQ_DECODE_ATTN", "triton")
    assert torch.equal(ta.decode_attention(*case, 128 ** -0.5, config=dataclasses.replace(cfg, cuda=True)),
                       ta.decode_attention(*case, 128 ** -0.5, config=cfg))
