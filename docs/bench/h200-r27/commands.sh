o="$1"
t gputests 330 python3 -m pytest -q -p no:randomly -p no:cacheprovider -s tests/rollout/test_engine_cuda.py \
  tests/kernels/test_triton_cuda.py tests/kernels/test_triton_norm.py tests/kernels/test_triton_partials.py \
  tests/kernels/test_triton_prefill.py tests/kernels/test_triton_quant.py tests/kernels/test_triton_sample.py \
  tests/kernels/test_triton_logprob.py tests/kernels/test_learner_ops.py tests/learner/test_ste.py \
  tests/learner/test_fused_logprobs.py tests/learner/test_fused_modules.py tests/learner/test_packing.py \
  tests/kernels/test_launch.py tests/learner/test_graphs.py tests/learner/test_projection_groups.py \
  tests/learner/test_quantized_head.py tests/learner/test_old_logp_bypass.py \
  tests/learner/test_shared_prefix.py tests/kernels/test_triton_glu.py
for m in 8b 1b; do
  t "e$m" 150 python3 -m agentq.eval.bench_engine --model "$m" --batch 64 128 --prompt 2048 --new 128 --turns 3 \
    --no-hf --quants none w8a8_kv8 --json "$o/e$m.json"
done
o="$1"
t rl1b 300 python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 3 --group-prompt --algos interq,bf16 --out "$o"
t rl1b-long 250 python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --prompt 1536 --obs 128 --new 256 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 2 --group-prompt --algos interq,bf16 --out "$o"
