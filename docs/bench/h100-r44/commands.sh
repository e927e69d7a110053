# Round 44, call A on one H100 (the H200 was asked for; torch 2.11, Triton 3.6), at 290e3e2 (the hand-laid
# MMA decode attention, kernels/cuda_attention.py, since removed; check out 290e3e2 to rerun):
python3 -m pytest -q -o addopts= -p no:randomly -p no:cacheprovider -s tests/kernels/test_cuda_attention.py   # test-cuda-attn.log
python3 -m agentq.eval.bench_kernels --attn-cuda --out .                                                       # attn-cuda.log, bench.json
E="python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --model 1b --batch 64 128"
AGENTQ_DECODE_ATTN=cuda $E --json e1b-cuda.json     # e1b-cuda.log: the cuda kernel's cp.async path (its default then)
$E --json e1b-triton.json                           # e1b-triton.log: the Triton kernel
# call F (the bulk-copy kernel as the sm_90 default, which this round then left opt-in): suite/gputests.log
AGENTQ_DECODE_ATTN=cuda bash docs/bench/h200-suite.sh tests suite     # the call had the default in H200_ATTN instead
