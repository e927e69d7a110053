# Round 42, call A (one H100; the H200 was asked for and not lent), at 445b8ef's tree (the device copy's git line reads 68ff5e7): every CUDA test file, then the engine (1B, 8B; B 64 / 128; bf16 vs W8A8-KV8).
out="$1"
git log --oneline -1 2>/dev/null
timeout 330 bash docs/bench/h200-suite.sh tests "$out" > /dev/null 2>&1; echo "tests rc $?"; tail -n 4 "$out/gputests.log"
E="python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --batch 64 128"
for m in 1b 8b; do
  left=$((590 - SECONDS)); [ "$left" -gt 60 ] || { echo "no time for $m"; break; }
  timeout "$left" $E --model $m --json "$out/e$m.json" > "$out/e$m.log" 2>&1; echo "e$m rc $?"; tail -n 12 "$out/e$m.log"
done
echo "total ${SECONDS}s"
