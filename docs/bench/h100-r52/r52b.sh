o="$1"; set -o pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
RL="python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --group-prompt --algos interq,bf16 --pack-tokens 20480 --logprob-pack-tokens 40960"
case "$gpu" in
  *H200*)
    bash docs/bench/h100-r51/h200-next.sh $o
    timeout 200 $RL --steps 4 --out $o 2>&1 | tee $o/rl1b-steps4.log | grep -E "step [0-9]|x \(|compiled|^interq |^bf16 " ;;
  *)
    echo "not an H200: $gpu; the RL step with 4 timed steps and compile counts"
    timeout 240 $RL --steps 4 --out $o 2>&1 | tee $o/rl1b-steps4.log | grep -E "step [0-9]|x \(|compiled|^interq |^bf16 " ;;
esac
