# Round 34 on one H200 (torch 2.11, Triton 3.6), from the checkout with agentq installed
# (pip install --no-deps -e .) and the wheels the machine lacks carried (.devrun/setup.sh).
# call 1 (11f78ff; .devrun/r34a.sh, ~7 device minutes): micro-default.{log,json}, micro-compare-default.log,
# e1b-default.{log,json}, e8b-default.{log,json}, rl1b-default-a.log (its last lines only), gputests.log
D=docs/bench/h200-r32
python3 $D/micro_fast_codes.py micro-default.json
python3 $D/micro_fast_codes.py compare $D/micro-fast0.json micro-default.json
E="python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8"
$E --model 1b --batch 64 128 --json e1b-default.json
$E --model 8b --batch 64 128 --json e8b-default.json
RL="python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --group-prompt --algos interq,bf16"
$RL --steps 2
TESTS="$(sed -n 's/^TESTS="\(.*\)"$/\1/p' docs/bench/h200-r31/commands.sh) tests/kernels/test_fast_codes.py"
python3 -m pytest -q -o addopts= -p no:randomly -p no:cacheprovider -s -k "not interpret" $TESTS
# call 2 (794c437; .devrun/r34b.sh, ~3 device minutes): rl1b-new512.log (the machine's `git log` line reads
# 11f78ff, its copy's git metadata; the files were the working tree at 794c437)
$RL --prompt 1536 --obs 128 --new 512 --steps 2
