# round 51, call E: the CUDA attention tests (stages keep the bits), then the 1B engine A/B: the
# round-44 launch rule (3 stages) against this GPU's CUDA_LAUNCH rows, interleaved twice
o="$1"; set -o pipefail
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/kernels/test_cuda_attention.py 2>&1 | tee $o/test-cuda-attn.log | tail -3
A="--prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --batch 64 128 --model 1b"
for rep in 1 2; do
  LAUNCH_ROWS='[[128,2,3],[1023,4,3],[null,2,3]]' timeout 100 python3 docs/bench/h100-r51/launch_rows.py engine $A --json $o/e1b-rule44-$rep.json 2>&1 | tee $o/e1b-rule44-$rep.log | grep -E "B=|needs"
  timeout 100 python3 -m agentq.eval.bench_engine $A --json $o/e1b-table-$rep.json 2>&1 | tee $o/e1b-table-$rep.log | grep -E "B=|needs"
done
