# Round 29 on one H200 (torch 2.11, Triton 3.6), each command in a call of its own, from the checkout
# with agentq installed (pip install --no-deps -e .) and gymnasium carried as a wheel; logs beside this file.
# rl1b-profile.log: the short-turn RL step with the kernel timeline of one rollout and the old_ref / update tables
python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 2 --group-prompt --algos interq,bf16 --profile --profile-rows 45
# e1b-nopdl-profile.log: the 1B decode step's kernels, each timed alone (no programmatic dependent launch)
AGENTQ_PDL=0 python3 -m agentq.eval.bench_engine --model 1b --batch 64 --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --profile
# rl1b-new{256,512,1024}.log: the RL step against the tokens sampled per turn (1024: one timed step)
for n in 256 512 1024; do
  s=2; [ $n = 1024 ] && s=1
  python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --prompt 1536 --obs 128 --new $n --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps $s --group-prompt --algos interq,bf16
done
# rl1b-host-profile.log, rl1b-graphs.log, hostcost.log
python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 2 --group-prompt --algos interq,bf16 --host-profile --profile-rows 40
python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 3 --group-prompt --algos interq,bf16 --cuda-graphs
python3 -m agentq.eval.bench_learner --host-cost
# attn-reads-{a,b,c,d}.log: four runs of the growing --attn-reads (a: interleaved rows; b: + splits and SDPA;
# c: + strided descriptors and the kernel over an interleaved cache read through them; d: the kernel with one
# K|V tile a step, commit eab007b, removed after it)
python3 -m agentq.eval.bench_kernels --attn-reads
# rl1b-h2d-{on-a,off,on-b}.log: host → device copies without a stream sync (agentq.utils.device), on / off / on,
# three processes in one call; then the CUDA tests of the paths it touches (gputests-h2d.log: 78 passed)
for a in 1 0 1; do
  AGENTQ_ASYNC_H2D=$a python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 2 --group-prompt --algos interq,bf16
done
python3 -m pytest -q -o addopts= tests/utils/test_device.py tests/learner/test_packing.py tests/learner/test_shared_prefix.py tests/rollout/test_engine_cuda.py tests/learner/test_old_logp_bypass.py
