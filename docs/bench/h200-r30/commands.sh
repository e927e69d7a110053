# Round 30 on one H200 (torch 2.11, Triton 3.6), six calls, from the checkout with agentq installed
# (pip install --no-deps -e .) and gymnasium carried as a wheel; logs beside this file.
RL="python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 2 --group-prompt --algos interq,bf16"
# call 1 (commit fd8b383: prefill graphs): gputests-pg.log, then rl1b-pg-on-a.log / rl1b-pg-off.log
python3 -m pytest -q -o addopts= -p no:cacheprovider -s tests/rollout/test_engine_cuda.py
$RL
$RL --prefill-graph-tokens 0
# call 2: rl1b-pg-profile.log (kernel timeline of one rollout), rl1b-pg512.log (first-turn 512-token chunks graphed too)
$RL --profile --profile-rows 30
$RL --prefill-graph-tokens 512
# call 3 (commit 5ab9892: + weight-sync graph): gputests-sync.log (its two failures are interpreted CPU tests
# that Triton 3.6's interpreter cannot run, `range` over a tensor bound; CI's Triton 3.9 runs them), rl1b-graphs-{a,b}.log
python3 -m pytest -q -o addopts= -p no:cacheprovider -s tests/rollout/test_engine_cuda.py tests/rollout/test_decode.py -k "cuda or graph or prefill or sync"
$RL
$RL
# call 4: e1b.log, rl1b-new512.log
python3 -m agentq.eval.bench_engine --model 1b --batch 64 128 --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8
python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --prompt 1536 --obs 128 --new 512 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 2 --group-prompt --algos interq,bf16
# call 5: rl1b-new256.log, e8b.log
python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --prompt 1536 --obs 128 --new 256 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 2 --group-prompt --algos interq,bf16
python3 -m agentq.eval.bench_engine --model 8b --batch 64 128 --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8
# call 6: e8b-b64.log, rl1b-graphs-c.log, rl1b-new1024.log (one timed step)
python3 -m agentq.eval.bench_engine --model 8b --batch 64 --prompt 2048 --new 128 --turns 3 --no-hf --quants none w8a8_kv8
$RL
python3 -m agentq.eval.bench_rl_step --model 1b --episodes 64 --turns 4 --prompt 1536 --obs 128 --new 1024 --micro 16 --pack-tokens 20480 --logprob-pack-tokens 40960 --steps 1 --group-prompt --algos interq,bf16
# call 7 (commit 1189d23: logits outside the graphs' pool): gputests-final.log (21 passed), rl1b-graphs-d.log
python3 -m pytest -q -o addopts= -p no:cacheprovider -s tests/rollout/test_engine_cuda.py
$RL
# call 8 (prefill graph counts in each step's metrics): gputest-pg.log (3 passed), then 3 RL steps of
# the CLI on WebShop on the GPU (hydra, omegaconf, antlr4, flask, bm25s, PyStemmer, rapidfuzz, thefuzz
# carried as wheels): train-webshop-cuda.log, train-metrics.jsonl, train-prefill-graphs.txt
python3 -m pytest -q -o addopts= -p no:cacheprovider -s tests/rollout/test_engine_cuda.py -k "prefill_graph or weight_sync"
AGENTQ_CACHE=cache python3 -m agentq.cli train env=webshop device=cuda trainer.steps=3 trainer.pack_tokens=4096 trainer.out_dir=train
