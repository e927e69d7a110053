"""Rollout–learner mismatch of vLLM rollouts, per turn: the aligned learner's log-probs of the
tokens vLLM sampled against vLLM's behaviour log-probs, for each QuantSpec preset.

Real TextWorldExpress "coin" episodes are played by `VLLMBackend` through the agent loop; the
learner (HF model with the preset's fake quant, `learner_quant=aligned`) teacher-forces them. Per
turn s: K3 = mean (e^δ − 1 − δ) and max |δ| over the turn's action tokens, δ = learner − vLLM.

    python -m agentq.eval.vllm_mismatch --model <HF dir> --presets none w8a8 w8a8_fp8kv
    python -m agentq.eval.vllm_mismatch                # none, w8a8; the tiny model the default config builds

One JSON row per preset on stdout (vLLM's log goes to stderr). Every preset is checked against this
platform (w8a8_fp8kv needs AVX-512 or AMX on CPU), and the model against every preset (a weight the
learner or the export cannot place, e.g. GPT-2's), before the first engine starts: a preset vLLM
cannot run here, or such a model, is one line on stderr, exit status 2.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from agentq.agent import ActionParser, AgentLoop, BackendPolicy, ChatFormat, EpisodeSpec, PromptConfig
from agentq.algos import k3, token_delta
from agentq.kernels import QuantSpec
from agentq.learner.batch import collate
from agentq.learner.learner import Learner
from agentq.pool import EnvSpec, InlinePool
from agentq.rollout import SamplingParams

ENV = EnvSpec("textworld_express", {"games": ["coin"], "split": "train", "max_steps": 4,
                                    "game_params": {"coin": "numLocations=2"}})


def play(backend, tokenizer, n_episodes: int, turns: int, max_new_tokens: int = 12, max_len: int = 1536):
    """`n_episodes` TextWorldExpress episodes of `turns` turns (2 per task), played by `backend`."""
    chat = ChatFormat.from_tokenizer(tokenizer)
    pool = InlinePool(EnvSpec(ENV.name, {**ENV.kwargs, "max_steps": turns}), n_episodes)
    try:
        loop = AgentLoop(pool, chat, PromptConfig(system="Reply with <action>...</action>.", actions=""),
                         ActionParser(), SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=chat.stop_token_ids),
                         max_turns=turns, max_context_tokens=max_len)
        return loop.run([EpisodeSpec(i, f"coin/{i // 2}", "train", group_id=i // 2, seed=i) for i in range(n_episodes)],
                        BackendPolicy(backend))
    finally:
        pool.close()


def per_turn_mismatch(trajs, learner: Learner) -> dict:
    """{"k3", "dlogp_abs_max", "k3_by_turn", "dlogp_abs_max_by_turn", "tokens"} of learner vs rollout."""
    batch = collate(trajs)
    batch.old_logp = learner.logprobs(batch)
    mask = batch.action_mask.bool()
    delta = token_delta(batch)
    k3_t, seg = k3(delta), batch.seg_id.long()
    turns = sorted({int(s) for s in seg[mask].tolist()})
    by_turn = [(k3_t[mask & (seg == s)].mean().item(), delta.abs()[mask & (seg == s)].max().item()) for s in turns]
    return {"k3": k3_t[mask].mean().item(), "dlogp_abs_max": delta.abs()[mask].max().item(),
            "k3_by_turn": [a for a, _ in by_turn], "dlogp_abs_max_by_turn": [b for _, b in by_turn],
            "tokens": int(mask.sum())}


def measure(model_dir: str, preset: str, n_episodes: int = 6, turns: int = 4, dtype=torch.float32, backend=None) -> dict:
    """Play episodes with vLLM under `preset` (or the given backend) and compare the aligned learner."""
    from transformers import AutoTokenizer

    from agentq.rollout.vllm_backend import VLLMBackend

    spec = QuantSpec.preset(preset)
    if backend is not None and backend.quant != spec:
        raise ValueError(f"measure({preset!r}): the backend runs QuantSpec {backend.quant.name!r}, not {preset!r}; "
                         "the learner would be aligned to another spec than the rollouts'")
    own = backend is None
    backend = backend or VLLMBackend.from_pretrained(model_dir, spec, max_slots=n_episodes, max_len=1536, dtype=dtype)
    try:
        trajs = play(backend, AutoTokenizer.from_pretrained(model_dir), n_episodes, turns)
    finally:
        if own:      # one engine per process at a time: the next preset starts its own
            backend.close_engine()
    learner = Learner(model_dir, spec, dtype=dtype, use_reference=False)
    return {"preset": preset, "episodes": len(trajs), **per_turn_mismatch(trajs, learner)}


def check_presets(presets: list[str]) -> None:
    """Refuse (ConfigError) before any engine starts a preset that vLLM cannot run on this platform
    (`engine_settings`): the presets before it would otherwise run for minutes first."""
    from agentq.rollout.vllm_backend import engine_settings, import_vllm

    import_vllm()
    from vllm.platforms import current_platform

    for preset in presets:
        engine_settings(QuantSpec.preset(preset), cpu=current_platform.is_cpu())


def main(argv: list[str] | None = None) -> None:
    from agentq import build
    from agentq.config import ConfigError
    from agentq.kernels.quant_spec import PRESETS
    from agentq.utils.checkpoint import CheckpointError

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="HF checkpoint folder (default: the default config's tiny model)")
    ap.add_argument("--presets", nargs="+", default=["none", "w8a8"], choices=sorted(PRESETS))
    ap.add_argument("--episodes", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    args = ap.parse_args(argv)
    try:
        check_presets(args.presets)     # imports vLLM, its log going to stderr (`import_vllm`): stdout is the rows
        model = args.model
        if model is None:
            from agentq.config import load_config

            model = build.model_path(load_config([]))
        for preset in args.presets:     # a model the learner or the export cannot place: before any engine
            build.check_vllm_architecture(model, QuantSpec.preset(preset), QuantSpec.preset(preset), key="--model")
        for preset in args.presets:
            r = measure(model, preset, args.episodes, args.turns)
            print(json.dumps(r), flush=True)
    except (ConfigError, CheckpointError) as e:     # bad input: one line, as `agentq` prints it
        print(f"vllm_mismatch: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
