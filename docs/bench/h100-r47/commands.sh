# Round 47 on one H100 (torch 2.11, Triton 3.6), from the checkout at 1476f00 with agentq installed
# (pip install --no-deps -e .) and the wheels the machine lacks carried. The call asked for an H200 and
# got an H100; two later tries for an H200 found no machine (~10 device minutes).
# One call (~6 device minutes): e8b.{log,json} (with the decode-attention A/B sweep), e1b.{log,json},
# rl1b.log, rl1b-new512-10k.log (10k-token packs: the H200's 20k ones run out of the H100's memory)
E="python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --batch 64 128"
$E --model 8b --decode-sweep attn_cuda=0,1 --json e8b.json
$E --model 1b --json e1b.json
RL="python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --group-prompt --algos interq,bf16 --steps 2"
$RL --pack-tokens 20480 --logprob-pack-tokens 40960
timeout 200 $RL --pack-tokens 10240 --logprob-pack-tokens 20480 --prompt 1536 --obs 128 --new 512
