# Round 32 on one H200 (torch 2.11, Triton 3.6), one call (~5 device minutes), from the checkout with
# agentq installed (pip install --no-deps -e .) and the wheels the machine lacks carried; logs beside this file.
# call 1 (865995c, the codes path still off by default, switched on by the environment):
# micro-fast0.log, micro-fast1.log, micro-compare.log, e1b-fast1.log, gputests-fast1.log
# (241 passed; the 2 failures are interpreted CPU tests of test_prefill_graphs.py, as in round 31)
M=docs/bench/h200-r32/micro_fast_codes.py
AGENTQ_FAST_CODES=0 python3 $M micro-fast0.json
AGENTQ_FAST_CODES=1 python3 $M micro-fast1.json
python3 $M compare micro-fast0.json micro-fast1.json
AGENTQ_FAST_CODES=1 python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --model 1b --batch 64 128
TESTS="$(sed -n 's/^TESTS="\(.*\)"$/\1/p' docs/bench/h200-r31/commands.sh) tests/kernels/test_fast_codes.py"
AGENTQ_FAST_CODES=1 python3 -m pytest -q -o addopts= -p no:randomly -p no:cacheprovider -s $TESTS
# call 2, prepared and not run (no machine was lent again this session), for the next session, at the
# commit that made the path the default: the micro script's hashes against call 1's switch-off file, the
# engine at 1B with the switch off and on in one call, the 8B engine, the RL step on / off / on.
python3 $M micro-default.json && python3 $M compare docs/bench/h200-r32/micro-fast0.json micro-default.json
python3 -m pytest -q -o addopts= -p no:randomly -p no:cacheprovider -s tests/kernels/test_triton_quant.py tests/kernels/test_triton_norm.py tests/kernels/test_triton_glu.py tests/kernels/test_triton_cuda.py
E="python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8"
AGENTQ_FAST_CODES=0 $E --model 1b --batch 64 128
$E --model 1b --batch 64 128
$E --model 8b --batch 64 128
RL="python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 2 --group-prompt --algos interq,bf16"
$RL; AGENTQ_FAST_CODES=0 $RL; $RL
# call 3, prepared and not run: the 8B engine again, a profile of the 1B engine's steps and prefill with the
# codes path on, and the RL step at 512 tokens a turn (round 30's long-turn command)
$E --model 8b --batch 64 128
$E --model 1b --batch 64 --profile
python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --prompt 1536 --obs 128 --new 512 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 2 --group-prompt --algos interq,bf16
