# Round 45 on one H100 (torch 2.11, Triton 3.6), from the checkout with agentq installed
# (pip install --no-deps -e .) and the wheels the machine lacks carried.
# call A (the work tree of the commit that made cuda_attention the sm_90 default; ~4.5 device minutes):
# gputests.log, e1b-cuda.{log,json} (the new default, with the decode-step A/B sweep), e1b-triton.{log,json}
python3 -m pytest -q -s -p no:cacheprovider -o addopts="" tests/kernels/test_cuda_attention.py \
  tests/kernels/test_triton_cuda.py tests/kernels/test_launch.py tests/rollout/test_decode.py \
  tests/rollout/test_engine_cuda.py tests/rollout/test_prefill_graphs.py tests/rollout/test_weight_sync.py \
  tests/learner/test_quantized_head.py tests/utils/test_device.py
E="python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --model 1b --batch 64 128"
$E --decode-sweep attn_cuda=0,1 --json e1b-cuda.json
AGENTQ_DECODE_ATTN=triton $E --json e1b-triton.json
