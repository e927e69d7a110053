# Round 39 on one H100 80GB HBM3 (torch 2.11, Triton 3.6); the H200 was asked for first and not lent (call A
# printed the card's name and stopped). Every call: `source .devrun/setup.sh` (carried wheels, pip install -e .).
# Call B (the device copy's files were reset to 87f1276 by a `git checkout` in the script, so the
# ceiling of d3c030d did not run; the timings and profile tables are those of 87f1276's code):
RL="python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --group-prompt --steps 2 --profile --profile-rows 30"
$RL --algos interq,interq+int8dx,bf16 --pack-tokens 20480 --logprob-pack-tokens 40960       # rl1b-profile-dxab.{log,json}
$RL --algos interq,bf16 --prompt 1536 --obs 128 --new 512 --pack-tokens 10240 --logprob-pack-tokens 20480  # rl1b-new512-profile.{log,json}
# Call C (files of d3c030d unpacked from `git archive`): the ceiling line
$RL --algos interq,bf16 --pack-tokens 20480 --logprob-pack-tokens 40960                      # rl1b-ceiling.{log,json}
# Call E (87496b5): every CUDA test file, then three CLI RL steps on WebShop with an evaluation
bash docs/bench/h200-suite.sh tests "$out"                                                          # gputests.log
AGENTQ_CACHE=/tmp/cache python3 -m agentq.cli train env=webshop device=cuda trainer.steps=3 trainer.pack_tokens=4096 \
  trainer.eval_every=3 trainer.eval_num_tasks=8 trainer.out_dir=/tmp/train                          # train-webshop-cuda.log
python3 -c "from agentq.eval.episodes import read_eval; import glob; [print(p, read_eval(p)['success_rate'], read_eval(p)['episodes_sha256'][:12]) for p in sorted(glob.glob('/tmp/train/eval/step_*'))]"   # read-eval.txt
# Calls A, D and G (and F, refused: no machine could be started): a guard that runs only on an H200; each got an H100
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); case "$gpu" in *H200*) ;; *) exit 0 ;; esac
