o="$1"
t budget8b 300 python3 -m agentq.eval.bench_engine --model 8b --batch 64 --prompt 2048 --new 128 --turns 3 \
  --no-hf --kv-budget-gib 24 --at-budget --quants none w8a8_kv8 --json "$o/budget8b.json"
AGENTQ_CACHE="$o/cache" t train-webshop-cuda 200 python3 -m agentq.cli train env=webshop device=cuda trainer.steps=2 trainer.pack_tokens=4096 trainer.out_dir="$o/train"
find "$o/train" -name "metrics.jsonl" -exec cp {} "$o"/train-metrics.jsonl \;
rm -rf "$o/cache" "$o/train"
o="$1"
t hf1b 450 python3 -m agentq.eval.bench_engine --model 1b --batch 64 128 --prompt 2048 --new 128 --turns 3 \
  --quants none w8a8_kv8 --json "$o/hf1b.json"
o="$1"
t gputests-learner 400 python3 -m pytest -q -p no:randomly -p no:cacheprovider tests/learner/test_ste.py \
  tests/learner/test_fused_logprobs.py tests/learner/test_fused_modules.py tests/learner/test_packing.py \
  tests/learner/test_graphs.py tests/learner/test_projection_groups.py tests/learner/test_quantized_head.py \
  tests/learner/test_old_logp_bypass.py tests/learner/test_shared_prefix.py tests/rollout/test_engine_cuda.py tests/kernels/test_attention.py
