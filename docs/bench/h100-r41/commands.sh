# Round 41, call A: q/k-norm + RoPE with several tokens per program (AGENTQ_ROPE_TOKENS): micro sweep,
# the GPU tests of the kernels it touches, then the 1B engine A/B (default 1 token vs the best of the sweep).
out="$1"
git log --oneline -1 2>/dev/null
python3 -m agentq.eval.bench_kernels --rope --out "$out" > "$out/rope.log" 2>&1; echo "rope rc $?"; grep -v "^$" "$out/rope.log" | tail -n 60
cp "$out/bench.json" "$out/rope.json" 2>/dev/null; rm -f "$out/bench.json"
best=$(python3 - "$out/rope.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rope"] if r["model"] == "qwen3-1.7b" and r["t"] > 1
        and r["op"] == "qk_norm_rope_to_cache" and r["heads"] == 8 and r["same_bits"]]
print(min(rows, key=lambda r: r["us"])["tokens"] if rows else 1)
PY
)
echo "best tokens at 8 heads (1.7B, int8 cache): $best"
python3 -m pytest -q -o addopts= -p no:randomly -p no:cacheprovider -s tests/kernels/test_triton_norm.py \
  tests/rollout/test_decode.py tests/rollout/test_engine_cuda.py tests/rollout/test_prefill_graphs.py > "$out/gputests-a.log" 2>&1
echo "tests rc $?"; tail -n 5 "$out/gputests-a.log"
E="python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --model 1b --batch 64 128"
$E --json "$out/e1b-t1.json" > "$out/e1b-t1.log" 2>&1; tail -n 9 "$out/e1b-t1.log"
if [ "$best" != "1" ]; then
  AGENTQ_ROPE_TOKENS=$best $E --json "$out/e1b-t$best.json" > "$out/e1b-tbest.log" 2>&1; tail -n 9 "$out/e1b-tbest.log"
fi
# the 8B decode at B 64 (issue 14's first target) with the chosen tokens, if the call has time left
if [ "$SECONDS" -lt 300 ]; then
  AGENTQ_ROPE_TOKENS=$best python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf \
    --quants none w8a8_kv8 --model 8b --batch 64 --json "$out/e8b.json" > "$out/e8b.log" 2>&1; tail -n 7 "$out/e8b.log"
else
  echo "no time left for the 8B run ($SECONDS s)"
fi
