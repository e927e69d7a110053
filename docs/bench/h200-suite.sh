# The GPU checks and benchmarks behind docs/kernels.md, in parts that each fit a 10-minute call (times: an H200, round 16).
# Usage: bash docs/bench/h200-suite.sh PART OUT_DIR   (from the checkout)
# Needs agentq importable (`pip install --no-deps --no-build-isolation -e .`) and gymnasium (the learner
# tests import the agent loop); a machine without a registry takes them as carried wheels.
#   tests   every test file with CUDA cases (kernels, engine, learner, device copies)     ~5 min
#   heads   GEMM sweep for the LM heads of preset w8a8_kv8_head (rows printed, to merge) ~0.5 min
#   engine  bench_engine 8B and 1B, B 64 / 128: bf16 vs w8a8_kv8 vs w8a8_kv8_head     ~2.5 min
#   sweep   bench_engine 8B and 1B, B 16 / 256, bf16 vs w8a8_kv8; 8B at a 24 GiB KV budget ~4.5 min
#   rl      bench_rl_step 1B: interq vs bf16, then interq with the int8 head              ~5 min
#   graphs  the learner's CUDA graphs: bench_learner 1B --cuda-graphs, then bench_rl_step 1B packed,
#           with and without graphs                                                      ~4 min
#   train   agentq train env=webshop device=cuda, 2 RL steps through the CLI (needs Hydra and
#           WebShop's deps: hydra-core, omegaconf, antlr4, bm25s, PyStemmer, thefuzz, rapidfuzz) ~1 min
set -eu
part="${1:?tests | heads | engine | sweep | rl | graphs | train}"
out="${2:?an output folder}"
mkdir -p "$out"
export TRITON_DEFAULT_FP_FUSION=1
run() { local name="$1"; shift; echo "+ $*" | tee "$out/$name.log"; "$@" 2>&1 | tee -a "$out/$name.log"; }
case "$part" in
  tests)
    # every test file with CUDA cases (found by their `torch.cuda.is_available()` skips, so a new one
    # is not missed), plus the interpreted engine / GLU tests and the int8-head and memory-hint tests,
    # whose models are built locally (the device has no Java: no environment-backed tests here);
    # addopts cleared, since pyproject's rerun options belong to a plugin the GPU machine lacks
    files=$( { grep -rl --include='test_*.py' 'torch.cuda.is_available' tests
               printf '%s\n' tests/kernels/test_triton_glu.py tests/rollout/test_prefill_graphs.py \
                 tests/rollout/test_weight_sync.py tests/rollout/test_decode.py \
                 tests/learner/test_quantized_head.py tests/learner/test_memory_advice.py; } | sort -u)
    # shellcheck disable=SC2086  # one word a file
    run gputests python -m pytest -q -s -p no:cacheprovider -o addopts="" $files ;;
  heads)
    run tune-heads python -m agentq.eval.bench_kernels --tune gemm --models qwen3-lm-heads --tune-ms 64,128 \
      --no-bench --out "$out" ;;
  engine)
    for m in 8b 1b; do
      run "e$m" python -m agentq.eval.bench_engine --model "$m" --batch 64 128 --prompt 2048 --new 128 --turns 3 \
        --no-hf --quants none w8a8_kv8 w8a8_kv8_head --json "$out/e$m.json"
    done ;;
  sweep)
    # the benchmark spec's other batch sizes, and the most episodes a fixed KV budget holds
    for m in 8b 1b; do
      run "s$m" python -m agentq.eval.bench_engine --model "$m" --batch 16 256 --prompt 2048 --new 128 --turns 3 \
        --no-hf --quants none w8a8_kv8 --json "$out/s$m.json"
    done
    run budget8b python -m agentq.eval.bench_engine --model 8b --batch 64 --prompt 2048 --new 128 --turns 3 \
      --no-hf --kv-budget-gib 24 --at-budget --quants none w8a8_kv8 --json "$out/budget8b.json" ;;
  rl)
    run rl1b python -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --logprob-micro 64
    run rl1b-head python -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 \
      --logprob-micro 64 --algos interq --quantized-rollout w8a8_kv8_head ;;
  graphs)
    run l1b-graphs python -m agentq.eval.bench_learner --model 1b --batch 4 --seq 2048 --micro 4 --cuda-graphs \
      --warmup 2 --iters 6
    for g in "" --cuda-graphs; do
      run "rl1b-packed${g:+-graphs}" python -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 \
        --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 3 $g --out "$out"
    done ;;
  train)
    # the CLI on the GPU: the Triton engine for rollouts, the aligned learner, WebShop in-process
    AGENTQ_CACHE="$out/cache" run train-webshop-cuda python -m agentq.cli train env=webshop device=cuda \
      trainer.steps=2 trainer.out_dir="$out/train" ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
