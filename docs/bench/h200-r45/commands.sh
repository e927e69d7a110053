# Round 45 on one H200 (torch 2.11, Triton 3.6), from the checkout with agentq installed
# (pip install --no-deps -e .) and the wheels the machine lacks carried.
# call C (52010c9's tree, cuda_attention the sm_90 default; ~3.5 device minutes):
# test-cuda-attn.log, e1b-cuda.{log,json} (the default, with the decode-step A/B sweep), e1b-triton.{log,json}
python3 -m pytest -q -s -p no:cacheprovider -o addopts="" tests/kernels/test_cuda_attention.py \
  tests/rollout/test_engine_cuda.py -k "cuda_attention or graph_replay_gives_the_eager"
E="python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --batch 64 128"
$E --model 1b --decode-sweep attn_cuda=0,1 --json e1b-cuda.json
AGENTQ_DECODE_ATTN=triton $E --model 1b --json e1b-triton.json
