"""Round 32: every int8 code writer timed alone at decode and prefill shapes, under the process's
AGENTQ_FAST_CODES. Writes {case: [us, sha256 of the outputs]} to argv[1]; `compare` mode reads two such
files and prints the ratio and whether the bits match. Inputs are seeded, so the two processes see
the same data. Round 32's call ran it without the AGENTQ_PDL line below: its rows of 64 then timed
kernels launched with programmatic dependent launch, which start while do_bench's L2-flush memset
still runs, so those rows are void there (prefill rows are not affected)."""
import hashlib, json, os, sys

os.environ.setdefault("AGENTQ_PDL", "0")   # a kernel timed alone must not overlap do_bench's flush
import torch

DEV = os.environ.get("MICRO_DEVICE", "cuda")  # "cpu" with TRITON_INTERPRET=1: a smoke run


def digest(*ts):
    h = hashlib.sha256()
    for t in ts:
        h.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def cases():
    from agentq.kernels import triton_quant as tq, triton_norm as tn
    from agentq.kernels.quant_spec import QuantSpec
    spec = QuantSpec.preset("w8a8_kv8")
    fl, rnd = spec.act_scale_floor, spec.act_rounding
    g = torch.Generator(device=DEV).manual_seed(0)
    rn = lambda *s: torch.randn(*s, device=DEV, dtype=torch.bfloat16, generator=g) * 3
    for m in (64, 32768):
        for k in (2048, 4096):
            x = rn(m, k)
            yield f"quantize_rows {m}x{k}", lambda x=x: tq.quantize_rows(x, fl, rnd)
        for k, p in ((6144, 96), (12288, 192)):
            x = rn(m, k)
            amax = x.float().abs().reshape(m, p, k // p).amax(-1).contiguous()
            yield f"codes_from_amax {m}x{k}", lambda x=x, a=amax: tq.quantize_rows_from_amax(x, a, fl, rnd)
        for k in (2048, 4096):
            x, w = rn(m, k), rn(k)
            yield f"rms_norm_and_codes {m}x{k}", lambda x=x, w=w: tn.rms_norm_and_codes(x, w, 1e-6, fl, rnd)
        gt, up = rn(min(m, 8192), 6144), rn(min(m, 8192), 6144)
        yield f"silu_mul_and_codes {min(m, 8192)}x6144", lambda a=gt, b=up: tn.silu_mul_and_codes(a, b, fl, rnd)
        x, cs = rn(min(m, 8192), 12288), torch.rand(12288, device=DEV, generator=g) + 0.5
        yield f"dY*s_w codes {min(m, 8192)}x12288", lambda x=x, c=cs: tq.quantize_rows(x, fl, rnd, col_scale=c)
    for name, hq, hkv, b, t in (("1.7b decode", 16, 8, 64, 1), ("8b decode", 32, 8, 64, 1), ("1.7b prefill", 16, 8, 64, 512)):
        d = 128
        qkv = rn(b, t, (hq + 2 * hkv) * d)
        q = qkv[..., :hq * d].view(b, t, hq, d); k = qkv[..., hq * d:(hq + hkv) * d].view(b, t, hkv, d)
        v = qkv[..., (hq + hkv) * d:].view(b, t, hkv, d)
        qw, kw = rn(d), rn(d)
        pos = torch.arange(t, device=DEV).repeat(b, 1) + (2048 if t == 1 else 0)
        cos, sin = rn(b, t, d).clamp(-1, 1), rn(b, t, d).clamp(-1, 1)
        kc = torch.zeros(b + 1, hkv, 4096, d, device=DEV, dtype=torch.int8); vc = torch.zeros_like(kc)
        ks = torch.zeros(b + 1, hkv, 4096, device=DEV); vs = torch.zeros_like(ks)
        slots = torch.arange(b, device=DEV)
        def f(q=q, k=k, v=v, qw=qw, kw=kw, cos=cos, sin=sin, kc=kc, vc=vc, ks=ks, vs=vs, slots=slots, pos=pos):
            out = tn.qk_norm_rope_to_cache(q, k, v, qw, kw, cos, sin, 1e-6, kc, vc, ks, vs, slots, pos,
                                           (spec.kv_scale_floor, spec.kv_rounding))
            return out, kc, vc, ks, vs
        yield f"qk_norm_rope_to_cache {name}", f


def flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in flat(o)]


def run(path):
    from triton.testing import do_bench
    from agentq.kernels import triton_quant as tq
    res = {"fast": bool(tq.FAST_CODES)}
    for name, f in cases():
        dig = digest(*flat(f()))
        us = 1e3 * do_bench(f, warmup=25, rep=200) if DEV == "cuda" else 0.0
        res[name] = [us, dig]
        print(f"{name}: {us:.1f} us {dig}", flush=True)
    json.dump(res, open(path, "w"), indent=1)


def compare(a, b):
    ra, rb = json.load(open(a)), json.load(open(b))
    print(f"{'case':38s} {'fast=' + str(ra.pop('fast')):>10s} {'fast=' + str(rb.pop('fast')):>10s} ratio  bits")
    for k in ra:
        print(f"{k:38s} {ra[k][0]:10.1f} {rb[k][0]:10.1f} {ra[k][0] / rb[k][0]:5.2f}x {'same' if ra[k][1] == rb[k][1] else 'DIFFER'}")


if __name__ == "__main__":
    compare(sys.argv[2], sys.argv[3]) if sys.argv[1] == "compare" else run(sys.argv[1])
