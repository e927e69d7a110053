# Round 31 on one H200 (torch 2.11, Triton 3.6), eight calls (~27 device minutes), from the checkout with
# agentq installed (pip install --no-deps -e .) and the wheels the machine lacks carried; logs beside this file.
# The three .py files here are the round's exploratory timings, run as `python3 docs/bench/h200-r31/NAME.py`.
TESTS="tests/rollout/test_engine_cuda.py tests/kernels/test_triton_cuda.py tests/kernels/test_triton_norm.py tests/kernels/test_triton_partials.py tests/kernels/test_triton_prefill.py tests/kernels/test_triton_quant.py tests/kernels/test_triton_sample.py tests/kernels/test_triton_logprob.py tests/kernels/test_learner_ops.py tests/learner/test_ste.py tests/learner/test_fused_logprobs.py tests/learner/test_fused_modules.py tests/learner/test_packing.py tests/kernels/test_launch.py tests/learner/test_graphs.py tests/learner/test_projection_groups.py tests/learner/test_quantized_head.py tests/learner/test_old_logp_bypass.py tests/learner/test_shared_prefix.py tests/kernels/test_triton_glu.py tests/rollout/test_prefill_graphs.py tests/rollout/test_weight_sync.py"
E="python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8"
RL="python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 2 --group-prompt --algos interq,bf16"
# call 1 (80aa5a7's kernel, uncommitted then): micro-quant-rope.log, gputests-a.log (238 passed; the 2 failures are
# interpreted CPU tests of test_prefill_graphs.py that Triton 3.6's interpreter cannot run, as test_decode.py's in round 30)
python3 docs/bench/h200-r31/micro_quant_rope.py
python3 -m pytest -q -o addopts= -p no:randomly -p no:cacheprovider -s $TESTS
# call 2 (bebdce3 + 9a961bd): gputests-b.log (81 passed), e1b.log, e1b-chunk2048.log, e8b.log
python3 -m pytest -q -o addopts= -p no:randomly -p no:cacheprovider -s tests/rollout/test_engine_cuda.py tests/kernels/test_triton_glu.py tests/kernels/test_triton_cuda.py
$E --model 1b --batch 64 128
$E --model 1b --batch 64 128 --prefill-chunk 2048
$E --model 8b --batch 64 128
# call 3: rl1b-a.log, rl1b-b.log, e1b-profile.log
$RL
$RL
$E --model 1b --batch 64 --profile
# call 4 (05e0f9e: the time split from a timed first-turn prefill): e1b-split.log, e1b-split-chunk2048.log, e8b-split.log
$E --model 1b --batch 64 128
$E --model 1b --batch 64 128 --prefill-chunk 2048
$E --model 8b --batch 64 128
# calls 5-6: tune-gemm-1b-prefill.log, tune-glu.log
python3 docs/bench/h200-r31/tune_gemm_prefill.py 32768
python3 docs/bench/h200-r31/tune_glu_prefill.py
# calls 7-8 (54e422f: the 1.7B GLU rows): gputests-glu.log (4 passed), e1b-final.log, rl1b-final.log, rl1b-final2.log
python3 -m pytest -q -o addopts= -p no:randomly -p no:cacheprovider -s tests/kernels/test_triton_cuda.py tests/kernels/test_triton_glu.py -k "glu or gemm"
$E --model 1b --batch 64 128
$RL
$RL
