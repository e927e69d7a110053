# round 51, call G: the 8B heads (32:8) under the H100 rows: the warps x stages sweep, then the 8B engine
# A/B (round 44's rule against CUDA_LAUNCH, this GPU's default now)
o="$1"; set -o pipefail
timeout 150 python3 -m agentq.eval.bench_kernels --attn-cuda --attn-heads 32:8 --out $o 2>&1 | tee $o/attn-cuda-8b.log | grep -E "best" | cut -c1-140
A="--prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --batch 64 128 --model 8b"
LAUNCH_ROWS='[[128,2,3],[1023,4,3],[null,2,3]]' timeout 200 python3 docs/bench/h100-r51/launch_rows.py engine $A 2>&1 | tee $o/e8b-rule44.log | grep -E "B=|needs"
timeout 200 python3 -m agentq.eval.bench_engine $A 2>&1 | tee $o/e8b-table.log | grep -E "B=|needs"
