# Round 47 on one H200 (torch 2.11, Triton 3.6), the fifth call of the round (the first got an H100, logs in
# h100-r47/; three found no machine). From the working tree at 80b236d (its GPU code is 1476f00's: this
# round changed no kernel or engine path), agentq installed (pip install --no-deps -e .), the wheels the
# machine lacks carried. One call (~6 device minutes): .devrun/r47a.sh, i.e.
E="python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --batch 64 128"
$E --model 8b --decode-sweep attn_cuda=0,1 --json e8b.json
$E --model 1b --json e1b.json
RL="python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --group-prompt --algos interq,bf16 --steps 2"
$RL --pack-tokens 20480 --logprob-pack-tokens 40960
$RL --pack-tokens 20480 --logprob-pack-tokens 40960 --prompt 1536 --obs 128 --new 512
