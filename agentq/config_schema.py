"""Typed checks of the composed config, run once by `load_config` before anything is built, so a
bad value fails at once with its key named (not after the model and env workers are up, and not
by running with it: `trainer.steps=-1` would otherwise write `checkpoints/step_-00001`)."""
from __future__ import annotations

import re
from typing import Any, Callable

from omegaconf import DictConfig, ListConfig, OmegaConf

_MISSING = object()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def positive_int(v: Any) -> str | None:
    return None if _is_int(v) and v > 0 else "a positive integer"


def nonneg_int(v: Any) -> str | None:
    return None if _is_int(v) and v >= 0 else "an integer >= 0"


def any_int(v: Any) -> str | None:
    return None if _is_int(v) else "an integer"


def positive_num(v: Any) -> str | None:
    return None if _is_num(v) and v > 0 else "a number > 0"


def nonneg_num(v: Any) -> str | None:
    return None if _is_num(v) and v >= 0 else "a number >= 0"


def probability(v: Any) -> str | None:
    return None if _is_num(v) and 0 < v <= 1 else "a number in (0, 1]"


def unit_interval(v: Any) -> str | None:
    return None if _is_num(v) and 0 <= v <= 1 else "a number in [0, 1]"


def fraction_below_one(v: Any) -> str | None:
    return None if _is_num(v) and 0 <= v < 1 else "a number in [0, 1)"


def boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def boolean_or_positive_int(v: Any) -> str | None:
    return None if isinstance(v, bool) or (_is_int(v) and v > 0) else "true, false or a positive integer"


def text(v: Any) -> str | None:
    return None if isinstance(v, str) and v else "a non-empty string"


def optional(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    def check_or_null(v: Any) -> str | None:
        return None if v is None else (lambda why: why and f"{why} or null")(check(v))
    return check_or_null


def one_of(*values: str) -> Callable[[Any], str | None]:
    return lambda v: None if isinstance(v, str) and v in values else f"one of {list(values)}"


def at_least(lo: int) -> Callable[[Any], str | None]:
    return lambda v: None if _is_int(v) and v >= lo else f"an integer >= {lo}"


def group_size(v: Any) -> str | None:
    """GRPO's advantage is the reward standardised within the group: a group of one has advantage 0 on
    every episode (docs/algorithms.md), so a run with trainer.group_size=1 trained on the KL term alone."""
    return None if _is_int(v) and v >= 2 else "an integer >= 2 (a GRPO group of one has advantage 0: nothing to learn)"


def listed(key: str, item: Callable[[Any], str | None], what: str, example: str) -> Callable[[Any], str | None]:
    """A list (in brackets on the command line) of `item`s: `sweep.arms=bf16` was the list of its
    letters; the message shows the list form, with the value given where it is one item."""
    def check(v: Any) -> str | None:
        if isinstance(v, (list, tuple, ListConfig)) and all(item(x) is None for x in v):
            return None
        one = v if isinstance(v, (str, int)) and not isinstance(v, bool) and item(v) is None else example
        return f"a list of {what} in brackets, e.g. '{key}=[{one}]'"
    return check


def device(v: Any) -> str | None:
    return None if isinstance(v, str) and re.fullmatch(r"cpu|cuda|auto|cuda:\d+", v) else "cpu, cuda, cuda:N or auto"


def betas(v: Any) -> str | None:
    """Adam's (beta1, beta2): two numbers in [0, 1) (torch.optim.AdamW refuses others, after the model is up)."""
    ok = isinstance(v, (list, tuple, ListConfig)) and len(v) == 2 and all(fraction_below_one(b) is None for b in v)
    return None if ok else "a list of two numbers in [0, 1)"


def lowercase(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    return lambda v: check(v.lower() if isinstance(v, str) else v)


def matches(pattern: str, what: str) -> Callable[[Any], str | None]:
    return lambda v: None if isinstance(v, str) and re.fullmatch(pattern, v) else what


# Valid values defined in modules this one may not import (a layer above it, or torch at import time:
# `agentq config` builds nothing); tests/hardening/test_config_checks.py keeps each equal to its source.
#: build.device_and_dtype's compute dtypes ("auto": float32 on CPU, bfloat16 on CUDA)
DTYPES = ("float32", "bfloat16", "float16")
#: build.make_backend's rollout backends
ROLLOUT_BACKENDS = ("torch", "vllm")
#: build.plugin_backend's form of rollout.backend for a backend of one's own
PLUGIN_BACKEND = r"[A-Za-z_][\w.]*:[A-Za-z_]\w*"
#: agentq.kernels.quant_spec.PRESETS (its keys, sorted)
QUANT_PRESETS = ("kv8", "none", "w8a8", "w8a8_fp8kv", "w8a8_kv8", "w8a8_kv8_head")
#: agentq.kernels.cpu_gemm.PATHS, with "auto" (compared case-insensitively, as cpu_gemm.configure does)
CPU_INT_GEMM = ("auto", "int_mm", "fp32", "fp64")
#: agentq.rollout.torch_engine.engine.SAMPLERS
SAMPLERS = ("auto", "generator", "counter")
#: agentq.learner.lr_schedule.SCHEDULES
LR_SCHEDULES = ("constant", "linear", "cosine")
#: agentq.algos.losses.LOSS_AGGS
LOSS_AGGS = ("token_mean", "seq_mean")
#: agentq.pool.POOL_TYPES
POOL_TYPES = ("inline", "process", "ray")
#: the tag names agentq.agent.parser.ActionParser accepts
ACTION_TAG = r"[A-Za-z_][\w-]*"

#: dotted key → check returning what the value should be (None: fine). Keys a config lacks are skipped.
RULES: dict[str, Callable[[Any], str | None]] = {
    "seed": any_int,
    "device": device,
    "dtype": one_of("auto", *DTYPES),
    "cpu_int_gemm": optional(lowercase(one_of(*CPU_INT_GEMM))),
    "torch_threads": optional(positive_int),
    "learner_threads": optional(positive_int),
    "trainer.steps": positive_int,
    "trainer.tasks_per_step": positive_int,
    "trainer.group_size": group_size,
    "trainer.lr": positive_num,
    "trainer.lr_warmup_steps": nonneg_int,
    "trainer.lr_schedule": one_of(*LR_SCHEDULES),
    "trainer.lr_min_ratio": unit_interval,
    "trainer.weight_decay": nonneg_num,
    # the learner always clips (clip_grad_norm_); a max norm of 0 would zero every gradient
    "trainer.grad_clip": positive_num,
    "trainer.ppo_epochs": positive_int,
    "trainer.minibatch_size": optional(positive_int),
    "trainer.micro_batch_size": positive_int,
    "trainer.pack_tokens": optional(positive_int),
    "trainer.logprob_micro_batch_size": optional(positive_int),
    "trainer.logprob_pack_tokens": optional(positive_int),
    "trainer.grad_input": one_of("bf16", "int8"),
    "trainer.cuda_graphs": boolean,
    "trainer.share_prefix": boolean,
    "trainer.old_logp": one_of("recompute", "bypass"),
    "trainer.max_concurrent": positive_int,
    "trainer.save_every": nonneg_int,
    "trainer.keep_checkpoints": nonneg_int,
    "trainer.save_segments": boolean_or_positive_int,
    "trainer.eval_every": at_least(-1),
    # 0 tasks would evaluate nothing (eval_every=-1 turns evaluation off)
    "trainer.eval_num_tasks": positive_int,
    "trainer.final_eval_tasks": optional(positive_int),
    "trainer.betas": betas,
    "trainer.overwrite": boolean,
    "trainer.max_skipped_steps": positive_int,
    "env.name": text,
    "env.max_steps": positive_int,
    "env.max_context_tokens": positive_int,
    "env.max_new_tokens": positive_int,
    "env.train_split": text,
    "env.eval_split": text,
    # observations are cut to this many characters; 0 or -1 would cut all or all but the last one
    "env.prompt.max_obs_chars": positive_int,
    "env_pool.type": one_of(*POOL_TYPES),
    "env_pool.num_workers": positive_int,
    "env_pool.call_timeout_s": positive_num,
    # the CPUs of a local Ray cluster (null: every core); 0 started a cluster no actor could be placed on
    "ray.num_cpus": optional(positive_int),
    "env_pool.num_cpus": optional(positive_int),
    # a built-in backend, or "module:Class" (a RolloutBackend subclass with `from_config`, docs/configuration.md)
    "rollout.backend": lambda v: (None if isinstance(v, str) and (v in ROLLOUT_BACKENDS or re.fullmatch(PLUGIN_BACKEND, v))
                                  else f"one of {list(ROLLOUT_BACKENDS)}, or 'module:Class' (a RolloutBackend subclass)"),
    "rollout.quant": one_of(*QUANT_PRESETS),
    "rollout.sampler": one_of(*SAMPLERS),
    # <= 0: no top-k truncation
    "rollout.top_k": any_int,
    "rollout.prefill_chunk": positive_int,
    "rollout.temperature": nonneg_num,
    "rollout.top_p": probability,
    "rollout.max_slots": positive_int,
    "rollout.run_ahead": boolean,
    "rollout.share_prefill": boolean,
    "rollout.prefill_graph_tokens": nonneg_int,
    "rollout.prefill_graph_max": nonneg_int,
    "algo.learner_quant": one_of("aligned", *QUANT_PRESETS),
    # what a sweep's `learner_quant: aligned` arms take as algo.learner_quant (checked only when the arms
    # are composed, after the shared SFT stage and its evaluation had run)
    "sweep.aligned_learner": one_of("aligned", *QUANT_PRESETS),
    # `agentq sweep`'s lists and counts: a plain `sweep.arms=bf16` ran arms b, f, 1, 6; `sweep.eval_tasks=0`
    # evaluated nothing, ran every arm, then failed on the table; `sweep.parallel=0` ran one at a time
    "sweep.arms": listed("sweep.arms", text, "algo presets", "bf16"),
    "sweep.seeds": listed("sweep.seeds", any_int, "integers", "0"),
    "sweep.references": listed("sweep.references", text, "arms", "bf16"),
    "sweep.eval_tasks": positive_int,
    "sweep.parallel": positive_int,
    "sweep.table_only": boolean,
    "sweep.out_dir": optional(text),
    "algo.loss_agg": one_of(*LOSS_AGGS),
    "algo.clip_eps": nonneg_num,
    "algo.kl_coef": nonneg_num,
    "agent.action_tag": matches(ACTION_TAG, "a tag name: a letter or _, then letters, digits, _ or -"),
    "agent.invalid_action_penalty": nonneg_num,
    "agent.inadmissible_action_penalty": nonneg_num,
    "eval.num_tasks": optional(positive_int),
    # agentq.eval.selection.METHODS (a layer above this one; tests/hardening/test_config_checks.py keeps them equal)
    "eval.selection": one_of("stratified", "first"),
    "eval.repeats": positive_int,
    "eval.temperature": nonneg_num,
    "eval.check_replays": boolean,
    "sft.num_demos": positive_int,
    "sft.epochs": positive_int,
    "sft.lr": positive_num,
    "sft.batch_size": positive_int,
    # 1.0 would leave no demonstration to train on
    "sft.val_fraction": fraction_below_one,
    "pipeline.eval_tasks": positive_int,
}


def config_problems(cfg: DictConfig) -> list[str]:
    """One line per key whose value breaks its rule, naming the key, the value and what it should be."""
    out = []
    for key, check in RULES.items():
        value = OmegaConf.select(cfg, key, default=_MISSING)
        if value is _MISSING or _copies_a_rule_key(cfg, key):
            continue
        want = check(value)
        if want:
            out.append(f"{key}={value!r} ({type(value).__name__}): must be {want}")
    return out


def _copies_a_rule_key(cfg: DictConfig, key: str) -> bool:
    """Whether `key`'s value is `${other}` of another key of `RULES` (env_pool.num_cpus: ${ray.num_cpus}):
    a bad value is then named once, at the key the user sets."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if not isinstance(node, DictConfig) or not OmegaConf.is_interpolation(node, leaf):
        return False
    raw = OmegaConf.to_container(node, resolve=False).get(leaf)          # type: ignore[union-attr]
    return isinstance(raw, str) and raw.startswith("${") and raw.endswith("}") and raw[2:-1] in RULES


#: the keys only some commands read → those commands (`agentq config` prints every key). The longest
#: entry that holds a key governs it: `eval.num_tasks` is `agentq eval`'s alone, while the rest of
#: `eval` (selection, temperature, repeats) also sets the held-out evaluations of the trainer, the
#: pipeline and the sweep. Every other key is read by every command that builds a model. A command
#: refuses a key of this table that it does not read, set away from its default
#: (`config.check_command_keys`): `agentq train checkpoint=<SFT checkpoint>` trained from the base
#: model while its config.yaml recorded the checkpoint
READ_BY: dict[str, tuple[str, ...]] = {
    "checkpoint": ("eval",),
    "split": ("eval",),
    "eval": ("eval", "train", "pipeline", "sweep"),
    # the others take theirs from trainer.eval_num_tasks, pipeline.eval_tasks, sweep.eval_tasks
    "eval.num_tasks": ("eval",),
    "eval.out_dir": ("eval",),
    "sft": ("sft", "pipeline", "sweep"),
    # the pipeline's and the sweep's SFT stage writes <their folder>/sft
    "sft.out_dir": ("sft",),
    "pipeline": ("pipeline",),
    # the sweep evaluates the first split
    "pipeline.eval_splits": ("pipeline", "sweep"),
    "sweep": ("sweep",),
    # the pipeline's RL stage runs in <pipeline.out_dir>/rl, a sweep's arms in <sweep.out_dir>/arms
    "trainer.out_dir": ("train",),
    "trainer.resume": ("train",),
    # the pipeline's from pipeline.eval_tasks, the sweep's from sweep.eval_tasks (via trainer.eval_num_tasks)
    "trainer.final_eval_tasks": ("train",),
    # `agentq eval` trains nothing and logs no metrics
    "logger": ("train", "sft", "pipeline", "sweep"),
    "wandb": ("train", "sft", "pipeline", "sweep"),
    "learner_threads": ("train", "sft", "pipeline", "sweep"),
}

#: what a user who set a `READ_BY` key their command does not read most likely meant, by (entry,
#: command), or (entry, None) for any command; {value} is the value they gave
INSTEAD: dict[tuple[str, str | None], str] = {
    ("checkpoint", "train"): "to train from a checkpoint's weights give model.path={value} (trainer.resume=<run "
                             "folder> continues an RL run from its latest checkpoint)",
    ("checkpoint", None): "to start from a checkpoint's weights give model.path={value}",
    ("split", "train"): "its held-out evaluations play env.eval_split (training plays env.train_split)",
    ("split", "sft"): "its demonstrations come from env.train_split",
    ("split", None): "pipeline.eval_splits=[{value}] names the held-out splits",
    ("eval.num_tasks", "train"): "trainer.eval_num_tasks={value} sets its held-out evaluations' tasks",
    ("eval.num_tasks", "pipeline"): "pipeline.eval_tasks={value} sets its evaluations' tasks",
    ("eval.num_tasks", "sweep"): "sweep.eval_tasks={value} sets its evaluations' tasks",
    ("eval.out_dir", "train"): "its evaluations go to <trainer.out_dir>/eval/step_*",
    ("eval.out_dir", "pipeline"): "its evaluations go to <pipeline.out_dir>/eval_*",
    ("eval.out_dir", "sweep"): "its evaluations go to <sweep.out_dir>/eval_sft and its arms' eval/",
    ("eval", "sft"): "evaluate its checkpoint with agentq eval checkpoint=<sft.out_dir>/checkpoint",
    ("sft", None): "SFT runs in agentq sft or agentq pipeline; to train from an SFT checkpoint give "
                   "model.path=<its folder>/checkpoint",
    ("sft.out_dir", "pipeline"): "its SFT stage writes <pipeline.out_dir>/sft",
    ("sft.out_dir", "sweep"): "its SFT stage writes <sweep.out_dir>/sft",
    ("pipeline.out_dir", "sweep"): "sweep.out_dir={value} names its folder",
    ("pipeline.eval_tasks", "sweep"): "sweep.eval_tasks={value} sets its evaluations' tasks",
    ("trainer.final_eval_tasks", "pipeline"): "pipeline.eval_tasks={value} sets its evaluations' tasks",
    ("trainer.final_eval_tasks", "sweep"): "sweep.eval_tasks={value} sets its evaluations' tasks",
    ("trainer.out_dir", "pipeline"): "its RL stage runs in <pipeline.out_dir>/rl",
    ("trainer.out_dir", "sweep"): "each arm runs in <sweep.out_dir>/arms/<arm>/seed_<seed>",
    ("trainer.out_dir", "eval"): "eval.out_dir={value} names its output folder",
    ("trainer.out_dir", "sft"): "sft.out_dir={value} names its folder",
    ("trainer.resume", "eval"): "to evaluate a run's checkpoint give checkpoint=<run folder>/checkpoints/step_<N>",
    ("trainer.resume", "pipeline"): "continue a pipeline's RL stage with agentq train "
                                    "trainer.resume=<pipeline.out_dir>/rl",
    ("trainer.resume", "sweep"): "a sweep resumes when given its folder again: sweep.out_dir=<sweep folder>",
    ("logger", None): "agentq eval logs no metrics (it writes eval.json and episodes.jsonl)",
    ("wandb", None): "agentq eval logs no metrics (it writes eval.json and episodes.jsonl)",
    ("learner_threads", None): "agentq eval runs no learner (torch_threads sets its threads)",
}
