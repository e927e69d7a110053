# Round 46 on one H100 (torch 2.11, Triton 3.6; each call asked for an H200 and got an H100), from the
# checkout with agentq installed (pip install --no-deps -e .) and the wheels the machine lacks carried.
# Five earlier tries found no machine (~8 device minutes).
# call A (dd62dd3's tree + uncommitted CPU-side work; ~5.5 device minutes):
# test-unpack.log, e8b.{log,json} (with the decode attention A/B sweep), rl1b.log, rl1b-new512.log
# (out of memory at the H200's 20k-token packs, as in rounds 36-38), e1b.{log,json}
python3 -m pytest -q -s -p no:cacheprovider -o addopts="" tests/kernels/test_cuda_attention.py \
  tests/kernels/test_unpack_ptx.py tests/kernels/test_triton_cuda.py tests/rollout/test_engine_cuda.py \
  -k "cuda_attention or unpack or int8_word or decode or graph_replay_gives_the_eager"
E="python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --batch 64 128"
$E --model 8b --decode-sweep attn_cuda=0,1 --json e8b.json
RL="python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --group-prompt --algos interq,bf16 --steps 2"
$RL --pack-tokens 20480 --logprob-pack-tokens 40960
$RL --pack-tokens 20480 --logprob-pack-tokens 40960 --prompt 1536 --obs 128 --new 512
$E --model 1b --json e1b.json
# call B (the same machine, warm; ~6.5 device minutes): rl1b-new512-10k.log (stopped by its 150 s timeout in
# bf16's last step: the per-step lines are the result), gputests.log (every CUDA test file: 342 passed, 176 skipped)
timeout 150 $RL --pack-tokens 10240 --logprob-pack-tokens 20480 --prompt 1536 --obs 128 --new 512
timeout 320 bash docs/bench/h200-suite.sh tests .
# call C (asked for an H200, got another H100; ~2.5 device minutes): e8b-2.{log,json}
$E --model 8b --json e8b-2.json
