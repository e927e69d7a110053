# Round 51: six device calls, every one on an H100 80GB HBM3 (asked as nvidia-h200; none came), torch 2.11,
# Triton 3.6. Each call: `source .devrun/setup.sh` (the wheels, agentq installed in place), then:
# A (attn-fixed.log, e1b-nopdl-profile.log): decode attention against L (steady, graph of 10 back-to-back
#   calls), per-block %globaltimer stamps; the 1B B 64 decode step's kernels with PDL off
python3 docs/bench/h100-r51/attn_fixed_cost.py
AGENTQ_PDL=0 python3 -m agentq.eval.bench_engine --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8 \
  --batch 64 --model 1b --profile
# B (attn-burst.log): does a block's first-tile delay carry to its end; a smaller first burst
python3 docs/bench/h100-r51/attn_burst.py stamps
# C (attn-splits.log): splits with the combine launch, the combine alone; the first burst, steady-timed
python3 docs/bench/h100-r51/attn_burst.py splits steady
# D (attn-stages.log): warps x stages, patched sources
python3 docs/bench/h100-r51/attn_stages.py
# E (attn-cuda.log / .json, e1b-rule44-0.log): the library's sweep (cuda_stages now a launch parameter),
#   the engine under the round-44 rule
python3 -m agentq.eval.bench_kernels --attn-cuda --attn-heads 16:8 --out OUT
LAUNCH_ROWS='[[128,2,3],[1023,4,3],[null,2,3]]' python3 docs/bench/h100-r51/launch_rows.py engine --prompt 2048 \
  --new 128 --turns 3 --no-hf --quants none w8a8_kv8 --batch 64 128 --model 1b
# F (e1b-rule44-{1,2}, e1b-table-{1,2}): tests/kernels/test_cuda_attention.py (43 passed), then the engine
#   A/B interleaved: the round-44 rule against the H100 rows of CUDA_LAUNCH (the default now)
bash .devrun/r51e.sh OUT
# G (attn-cuda-8b.log / .json, e8b-rule44.log, e8b-table.log): the 8B heads under the H100 rows
bash .devrun/r51g.sh OUT      # copied here as r51g.sh
# H (rl1b.log): the RL step at 64 tokens a turn with the H100 rows (round 47's command)
python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --group-prompt --algos interq,bf16 \
  --steps 2 --pack-tokens 20480 --logprob-pack-tokens 40960
