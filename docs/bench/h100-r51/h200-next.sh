# For the next H200 (not run in round 51: no H200 came): the warps x stages sweep, then the 1B engine A/B of
# round 44's launch rule (the H200's default) against the sweep's best rows. On another GPU: nothing run.
o="$1"; set -o pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in *H200*) ;; *) echo "not an H200: $gpu; nothing run"; exit 0 ;; esac
timeout 150 python3 -m agentq.eval.bench_kernels --attn-cuda --attn-heads 16:8 --out $o 2>&1 | tee $o/attn-cuda.log | grep -E "best" | cut -c1-140
rows=$(python3 docs/bench/h100-r51/launch_rows.py pick $o/bench.json 16:8 2> $o/rows.txt); cat $o/rows.txt; echo "rows: $rows"
A="--prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --batch 64 128 --model 1b"
for rep in 1; do
  LAUNCH_ROWS='[[128,2,3],[1023,4,3],[null,2,3]]' timeout 100 python3 docs/bench/h100-r51/launch_rows.py engine $A 2>&1 | tee $o/e1b-rule44-$rep.log | grep -E "B=|needs"
  LAUNCH_ROWS="$rows" timeout 100 python3 docs/bench/h100-r51/launch_rows.py engine $A 2>&1 | tee $o/e1b-swept-$rep.log | grep -E "B=|needs"
done
