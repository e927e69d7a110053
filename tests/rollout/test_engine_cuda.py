"""The engine's CUDA path (Triton W8A8 linears, Triton int8-KV decode attention) against the CPU
reference engine and the aligned learner. Skipped without a GPU; run on the H200 with
`pytest tests/rollout/test_engine_cuda.py -s`."""
import pytest
import torch

from agentq.kernels import QuantSpec
from agentq.rollout import SamplingParams, TurnRequest
from agentq.rollout.torch_engine.engine import TorchEngine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SPEC = QuantSpec.preset("w8a8_kv8")


def _turns(eng, n=4, turns=3, seed=0):
    """n episodes × `turns` turns; returns (full ids, per-position rollout log-probs or None)."""
    sp = SamplingParams(max_new_tokens=16)
    ctxs = [[5 + (13 * j + 7 * i) % 300 for j in range(40 + 9 * i)] for i in range(n)]
    logps = [dict() for _ in range(n)]
    for t in range(turns):
        res = eng.generate([TurnRequest(i, c, sp, seed=seed + i) for i, c in enumerate(ctxs)])
        for i, r in enumerate(res):
            for k, lp in enumerate(r.logprobs):
                logps[i][len(ctxs[i]) + k] = lp
            ctxs[i] = ctxs[i] + r.token_ids + [11, 12, 13, 14]      # an "observation"
    return ctxs, logps


def _learner_gap(path, spec, dtype, ctxs, logps):
    from agentq.learner.learner import Learner, sequence_logprobs

    learner = Learner(str(path), spec, dtype=dtype, device="cuda", use_reference=False)
    d = []
    with torch.no_grad():
        for ids, lps in zip(ctxs, logps):
            x = torch.tensor([ids], device="cuda")
            lp = sequence_logprobs(learner.model, x, torch.ones_like(x))[0].float().cpu()
            d += [float(lp[p]) - v for p, v in lps.items()]
    d = torch.tensor(d, dtype=torch.float64)
    return d.abs().max().item(), (torch.expm1(d) - d).mean().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_engine_runs_triton_paths_and_matches_learner(tiny_model_dir, dtype):
    eng = TorchEngine.from_pretrained(str(tiny_model_dir), SPEC, max_slots=8, max_len=512, dtype=dtype, device="cuda")
    from agentq.kernels.attention import decode_attention_available
    assert decode_attention_available(torch.device("cuda"))     # bf16 decode runs the Triton kernel
    ctxs, logps = _turns(eng)
    gap_al, k3_al = _learner_gap(tiny_model_dir, SPEC, dtype, ctxs, logps)
    gap_un, k3_un = _learner_gap(tiny_model_dir, QuantSpec.preset("none"), dtype, ctxs, logps)
    print(f"\n[cuda {dtype}] aligned max|Δ|={gap_al:.3e} K3={k3_al:.3e} | unaligned max|Δ|={gap_un:.3e} K3={k3_un:.3e}")
    if dtype == torch.float32:      # fp64 attention in no-grad passes: the CPU-level agreement
        assert gap_al < 1e-4 and k3_un > 100 * k3_al
    else:                           # bf16 rounding moves int8 codes on both sides: alignment is loose
        assert gap_al < 0.1 and k3_al < k3_un


def test_cuda_engine_agrees_with_cpu_engine_fp32(tiny_model_dir):
    """Same tokens re-scored: CUDA (Triton) vs CPU (torch reference) numerics of the same spec."""
    cpu = TorchEngine.from_pretrained(str(tiny_model_dir), SPEC, max_slots=2, max_len=512)
    gpu = TorchEngine.from_pretrained(str(tiny_model_dir), SPEC, max_slots=2, max_len=512, device="cuda")
    ctx = [5 + (7 * j) % 300 for j in range(60)]
    r = gpu.generate([TurnRequest(0, ctx, SamplingParams(max_new_tokens=24), seed=3)])[0]
    a = torch.tensor(cpu.score(ctx, r.token_ids))
    b = torch.tensor(r.logprobs)
    print(f"\n[cuda vs cpu fp32] max|Δ|={(a - b).abs().max():.3e}")
    assert (a - b).abs().max() < 2e-3
