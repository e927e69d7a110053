"""agentq.eval (the top-level folder `eval/`, installed as `agentq.eval` by setup.py): two things.

The evaluation library, imported by the trainer and the CLI (below `agentq.trainer`, above
`agentq.build`): `evaluate` (held-out evaluation, `agentq eval`), `selection` (which tasks),
`episodes` (trajectory files), `metrics`, `plots`, `segments` (the per-turn history), `report`
(the HTML run report) and `bench_common` (what the benchmark scripts share).

Scripts, each run one way, `python -m agentq.eval.<name> [--help]`, importing the library and the
layers below it but never another script: `bench_*` (benchmarks), `alfworld_prepare` (ALFWorld
data ahead of a run) and `vllm_mismatch`. The layer contract (pyproject.toml, ARCHITECTURE.md)
names every module of this folder as library or script.
"""
