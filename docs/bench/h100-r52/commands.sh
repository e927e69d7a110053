# Round 52: one H100 call (asked for the H200, which did not come in five tries; the other four calls found no machine).
# On an H200, r52b.sh runs round 51's h200-next.sh (attention launch sweep, 1B engine A/B); elsewhere only the RL step.
bash docs/bench/h100-r52/r52b.sh OUT
#   -> rl1b-steps4.log, bench_rl_step_1b_groupprompt.json: the 1B RL step at 64 tokens a turn, 4 timed steps (medians),
#      with Triton's compiles counted per step (kernels/jit_watch.py)
