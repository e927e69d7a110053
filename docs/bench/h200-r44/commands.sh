# Round 44 on one H200 (torch 2.11, Triton 3.6), from the checkout with agentq installed
# (pip install --no-deps -e .) and the wheels the machine lacks carried (.devrun/setup.sh).
# Calls B and E timed kernels/cuda_attention.py: call B its register and cp.async load paths (since
# removed; check out ef965b8 to rerun it), call E (bulk/) the bulk-copy path that stays (opt-in).
#
# call B (ef965b8; ~1 device minute): test-cuda-attn.log, attn-cuda.{log,json}
python3 -m pytest -q -o addopts= -p no:randomly -p no:cacheprovider -s tests/kernels/test_cuda_attention.py
python3 -m agentq.eval.bench_kernels --attn-cuda --out .      # bench.json, saved as attn-cuda.json
# call C (ef965b8's tree; the engine's default path is e2ec6a7's: cuda_attention was opt-in; ~3 device minutes):
# e1b.{log,json}, e8b.{log,json}, rl1b.log
E="python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --batch 64 128"
$E --model 1b --json e1b.json
$E --model 8b --json e8b.json
RL="python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --group-prompt --algos interq,bf16 --steps 2"
$RL --pack-tokens 20480 --logprob-pack-tokens 40960
# call D (same tree; ~3 device minutes): e1b-head.{log,json}, rl1b-new512.log
python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 w8a8_kv8_head \
  --model 1b --batch 64 128 --json e1b-head.json
$RL --pack-tokens 20480 --logprob-pack-tokens 40960 --prompt 1536 --obs 128 --new 512
# call E (the bulk-copy path, before the other load paths were removed; ~3 device minutes): bulk/
python3 -m pytest -q -o addopts= -p no:randomly -p no:cacheprovider -x -s tests/kernels/test_cuda_attention.py   # bulk/test-cuda-attn.log
python3 -m agentq.eval.bench_kernels --attn-cuda --out bulk                                                          # bulk/attn-cuda.log, bench.json
E="python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --model 1b --batch 64 128"
AGENTQ_DECODE_ATTN=cuda:4 $E --json bulk/e1b-cuda.json    # the call named the path cuda:4:bulk
$E --json bulk/e1b-triton.json
