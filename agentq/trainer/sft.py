"""Warm start from environment experts: `agentq sft`.

1. collect expert episodes through the *same* agent loop, chat rendering and token layout as RL
   (environments made with `expert=True`; the expert's action written as `<action>...</action>`
   followed by the stop token) and save them as JSONL (token ids + masks, with text for reading);
2. train with cross-entropy on action tokens only — exactly the `action_mask` RL uses, so
   observation and template tokens carry no loss in either stage — through the learner's aligned
   forward (the model is fitted as the quantized engine will run it);
3. write a normal HF checkpoint that `agentq train model.path=<dir>` starts from.
"""
from __future__ import annotations

import json
import math
import random
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from agentq import build
from agentq.agent import ActionParser, ChatFormat, ExpertPolicy
from agentq.agent.trajectory import Trajectory
from agentq.config import ConfigError
from agentq.envs.base import sample_tasks
from agentq.eval.episodes import demo_record, read_trajectories, write_trajectories
from agentq.learner.batch import collate
from agentq.learner.learner import Learner, sequence_logprobs
from agentq.utils.checkpoint import save_hf_checkpoint
from agentq.utils.errors import first_line
from agentq.utils.files import write_text_replacing
from agentq.utils.folder_lock import removed_if_left_empty
from agentq.utils.jsonl import read_jsonl
from agentq.utils.logging import MetricsLogger, console, progress

from .run_dir import SFT_ARTIFACTS, RunAborted, claim_run_dir, new_run_dir, remove_run_artifacts, write_run_config


def collect_demos(cfg: DictConfig, chat: ChatFormat, n: int, split: str, seed: int) -> list[Trajectory]:
    """`n` expert episodes of tasks sampled from `split`, played through the RL agent loop."""
    import numpy as np

    tasks = sample_tasks(build.split_tasks(cfg, split), n, np.random.default_rng(seed))
    n_conc = max(1, min(n, int(cfg.trainer.max_concurrent)))
    pool = build.env_pool(cfg, split, n_conc, expert=True)
    try:
        loop = build.agent_loop(cfg, pool, chat, build.sampling_params(cfg, chat), n_conc, run_seed=seed)
        specs = build.episode_specs(tasks, split, seed)
        with progress(transient=True) as prog:
            bar = prog.add_task("expert demos", total=len(specs), info="")
            trajs = loop.run(specs, ExpertPolicy(chat, ActionParser(cfg.agent.action_tag)),
                             on_done=lambda t: prog.update(bar, advance=1))
    finally:
        pool.close()
    return trajs


def action_nll(model: torch.nn.Module, trajs: list[Trajectory], device: torch.device | str) -> tuple[torch.Tensor, int]:
    """Token-mean negative log-likelihood over action tokens, and the number of those tokens."""
    b = collate(trajs)
    scored = b.action_mask.bool()        # on the CPU: the head runs at the positions before actions only
    b = b.to(device)
    logp = sequence_logprobs(model, b.input_ids, b.attention_mask, scored=scored)
    n = int(b.action_mask.sum())
    return -(logp * b.action_mask).sum() / max(n, 1), n


@torch.no_grad()
def evaluate_nll(learner: Learner, trajs: list[Trajectory], batch_size: int) -> float:
    learner.model.eval()
    tot, n = 0.0, 0
    for s in range(0, len(trajs), batch_size):
        loss, k = action_nll(learner.model, trajs[s: s + batch_size], learner.device)
        tot, n = tot + float(loss) * k, n + k
    learner.model.train()
    return tot / max(n, 1)


def sft(cfg: DictConfig, out_dir: str | Path | None = None, init_path: str | None = None,
        overwrite: bool | None = None, out_key: str = "sft.out_dir", overrides: list[str] | None = None,
        rl_hint: bool = True) -> dict:
    """`agentq sft` into `out_dir` (default sft.out_dir, else a new runs/sft-<env>-<time>), which this
    process locks as RL run folders are; a folder holding an earlier SFT run is refused unless
    `overwrite` (default trainer.overwrite) replaces it. `out_key`: the setting that named the folder.
    `overrides`: the command line, whose env settings the closing `agentq train` hint repeats.
    `rl_hint`: False for a caller that runs RL from the checkpoint itself (`agentq pipeline`, `agentq
    sweep`): the closing line names the checkpoint without a command to run by hand, which would
    have been the wrong one there (without the pipeline's settings, or none of its env's)."""
    check_expert(cfg)
    build.check_learner_dtype(cfg)
    build.check_ray_installed(cfg, placement=False)     # SFT never places actors
    build.check_logger_config(cfg)
    out = Path(out_dir or cfg.sft.out_dir or new_run_dir(f"sft-{cfg.env.name}"))
    if overwrite is None:
        overwrite = bool(cfg.trainer.get("overwrite", False))
    # an earlier run's files stay until the demonstrations and the model are in hand (`_sft`): a bad
    # setting or a missing path found before then costs nothing, and leaves no folder this start created
    with removed_if_left_empty(out):
        lock = claim_run_dir(out, resume=False, overwrite=overwrite, kind="sft", out_key=out_key,
                             remove=False)
        try:
            return _sft(cfg, out, init_path, (overrides or []) if rl_hint else None)
        finally:
            lock.close()            # releases the folder


def _sft(cfg: DictConfig, out: Path, init_path: str | None, overrides: list[str] | None) -> dict:
    """`sft`'s stages; `overrides`: those the closing `agentq train` hint repeats (None: no hint)."""
    s = cfg.sft
    device, dtype = build.device_and_dtype(cfg)
    torch.manual_seed(int(cfg.seed))
    path = init_path or build.model_path(cfg)
    tokenizer = build.load_tokenizer(path)
    chat = ChatFormat.from_tokenizer(tokenizer)

    # 1. demonstrations through the RL agent loop
    if s.demos:
        check_demo_tokens(s.demos, tokenizer)
        demos = read_trajectories(s.demos)
        console.print(f"loaded {len(demos)} demonstrations from {s.demos}")
    else:
        demos = collect_demos(cfg, chat, int(s.num_demos), cfg.env.train_split, int(cfg.seed))
        write_trajectories(out / "demos.jsonl", demos, demo_record(tokenizer))
    n_demos, n_won, n_lost = len(demos), sum(t.won for t in demos), sum(t.end_reason == "error" for t in demos)
    demos = usable_demos(cfg, demos)
    rng = random.Random(int(cfg.seed))
    rng.shuffle(demos)
    val, train = split_demos(demos, float(s.val_fraction))
    remove_run_artifacts(out, SFT_ARTIFACTS)      # overwrite (claim_run_dir refused it otherwise)
    write_run_config(out, cfg)                    # what the checkpoint was trained with, as an RL run's

    # 2. cross-entropy on action tokens, through the aligned forward (no env workers run now: every core)
    with build.learner_threads(cfg):
        learner, history = _fit(cfg, path, out, train, val, rng, device, dtype)

    # 3. an ordinary HF checkpoint
    ckpt = save_hf_checkpoint(learner.model, out / "checkpoint", tokenizer,
                              extra={"stage": "sft", "env": cfg.env.name, "demos": len(demos), "history": history})
    # demos_lost: lost to errors; demos_not_won: played out but not won (left out under sft.only_successful)
    summary = {"checkpoint": str(ckpt), "demos_collected": n_demos, "demos_won": n_won, "demos_lost": n_lost,
               "demos_not_won": n_demos - n_won - n_lost, "demos_used": len(demos), "train": len(train),
               "val": len(val), "history": history}
    write_text_replacing(out / "sft_summary.json", json.dumps(summary, indent=2))
    hint = f" (RL from it: {rl_command(ckpt, overrides)})" if overrides is not None else ""
    console.print(f"SFT: {len(train)} train / {len(val)} val demos; "
                  + ", ".join(f"epoch {h['epoch']}: train {h['train_loss']:.3f} val {h['val_loss']:.3f}" for h in history)
                  + f"; checkpoint {ckpt}{hint}",
                  markup=False, highlight=False, soft_wrap=True)
    return summary


#: the overrides (keys, and the prefixes of their sub-keys) that choose the env and the prompt an SFT
#: checkpoint was fitted to: the env group and every env.* setting (class, splits, kwargs, prompt,
#: limits), the agent's action format, and the config folders the env group may come from
ENV_KEYS = ("env", "agent", "hydra.searchpath")


def rl_command(ckpt: str | Path, overrides: list[str]) -> str:
    """`agentq train model.path=<ckpt>` with the SFT command line's env settings (`ENV_KEYS`, each
    quoted for a shell): without them it trained on the default env, with no word that the checkpoint
    was fitted to another."""
    def key(o: str) -> str:
        return o.split("=", 1)[0].lstrip("+~")

    env = [o for o in overrides if any(key(o) == k or key(o).startswith(k + ".") for k in ENV_KEYS)]
    return " ".join(["agentq train", f"model.path={shlex.quote(str(ckpt))}", *map(shlex.quote, env)])


def check_expert(cfg: DictConfig) -> None:
    """Refuse to collect demonstrations from an env class without an expert (its `_expert_action` is
    TextEnv's, which returns None): every demo was lost at its first turn.

    Raises:
        ConfigError: naming env.name and the way out (implement it, or sft.demos).
    """
    from agentq.envs import TextEnv, env_class

    cls = None if cfg.sft.demos else env_class(str(cfg.env.name))
    if cls is not None and cls._expert_action is TextEnv._expert_action:
        raise ConfigError(f"env.name={cfg.env.name!r}: {cls.__name__} has no expert (it does not implement "
                          "`_expert_action`), and SFT trains on expert demonstrations; implement it "
                          "(docs/adding-an-environment.md), or give sft.demos=<a demos.jsonl> (its format: "
                          "docs/adding-an-environment.md#demonstrations-without-an-expert-sftdemos)")


def usable_demos(cfg: DictConfig, demos: list[Trajectory]) -> list[Trajectory]:
    """The demonstrations SFT trains on: not lost to an error (warned about: env errors, an expert
    with no action), and won when sft.only_successful.

    Raises:
        RunAborted: none is left (`no_demos_reason`).
    """
    lost = [t for t in demos if t.end_reason == "error"]
    if lost:
        console.print(f"warning: {len(lost)} of {len(demos)} expert episodes were lost to errors and are left out "
                      f"(each error under \"error\" in demos.jsonl); the first, task {lost[0].task_id!r}: "
                      f"{first_line(lost[0].error) or '?'}", style="yellow", markup=False, highlight=False,
                      soft_wrap=True)
    keep = [t for t in demos if t.end_reason != "error" and (t.won or not cfg.sft.only_successful)]
    if not keep:
        raise RunAborted(no_demos_reason(cfg, sum(t.won for t in demos), len(demos), len(lost)))
    unwon = [t for t in demos if t.end_reason != "error" and not t.won]
    if unwon and cfg.sft.only_successful:       # 10 of 12 ScienceWorld demos at a step cap went without a word
        reasons = Counter(str(t.end_reason) for t in unwon)
        console.print(f"warning: {len(unwon)} of {len(demos)} expert episodes did not win (end reasons: "
                      f"{', '.join(f'{r} {n}' for r, n in reasons.most_common())}) and are left out "
                      f"(sft.only_successful); SFT trains on {len(keep)}"
                      + (f"; raise env.max_steps={int(cfg.env.max_steps)} if the expert needs more turns"
                         if "step_cap" in reasons else ""), style="yellow", markup=False, highlight=False,
                      soft_wrap=True)
    return keep


def no_demos_reason(cfg: DictConfig, n_won: int, n: int, n_lost: int = 0) -> str:
    """Why SFT has nothing to train on: no demonstration at all, every one lost to an error, or
    (sft.only_successful) none the expert won, which is most often a step cap below the expert's
    path (mapreader's needs 4-6 turns)."""
    if n_lost and n_lost == n:
        return f"no usable expert demonstrations: all {n} expert episodes were lost to errors (the warning above)"
    if n_won == 0 and n > 0:
        return (f"no usable expert demonstrations: none of {n} expert episodes won within env.max_steps="
                f"{int(cfg.env.max_steps)} turns (sft.only_successful keeps the won ones); raise env.max_steps, "
                "or check the env's expert")
    return "no expert demonstrations to train on (sft.num_demos, sft.demos)"


def check_demo_tokens(path: str | Path, tokenizer: Any) -> None:
    """Refuse a demos file (`sft.demos`) whose token ids this model's tokenizer does not read back as
    the text stored beside them: ids written under another tokenizer mean other text (or no token at
    all), and SFT would fit the model to them. The ids are what trains, so a record must have them.

    Raises:
        ConfigError: naming sft.demos: the file is missing, or the first record that does not match.
    """
    if not Path(path).is_file():
        raise ConfigError(f"sft.demos={str(path)!r}: no such file (a demos.jsonl an earlier agentq sft wrote)")
    for i, d in enumerate(read_jsonl(path), 1):
        where = f"sft.demos={str(path)!r}: record {i}"
        if not d.get("input_ids"):
            raise ConfigError(f"{where} has no input_ids (token ids are what SFT trains on)")
        if "text" not in d:
            raise ConfigError(f"{where} has no text to check its input_ids against this model's tokenizer")
        if tokenizer.decode(d["input_ids"]) != d["text"]:
            raise ConfigError(f"{where}: its input_ids decode to other text under this model's tokenizer "
                              f"({getattr(tokenizer, 'name_or_path', '?')}): the demos were collected with "
                              "another tokenizer; collect them again (leave sft.demos unset)")


def split_demos(demos: list[Trajectory], val_fraction: float) -> tuple[list[Trajectory], list[Trajectory]]:
    """(validation, training) demos: the first round(n × val_fraction), at least one of two or more.

    Raises:
        ConfigError: no demonstration is left to train on.
    """
    n_val = max(1, int(round(len(demos) * val_fraction))) if len(demos) > 1 else 0
    val, train = demos[:n_val], demos[n_val:]
    if not train:
        raise ConfigError(f"sft.val_fraction={val_fraction:g} leaves no demonstration to train on ({len(demos)} "
                          f"usable, {n_val} held out for validation); lower sft.val_fraction or collect more "
                          "(sft.num_demos)")
    return val, train


def _fit(cfg: DictConfig, path: str, out: Path, train: list[Trajectory], val: list[Trajectory],
         rng: random.Random, device: torch.device, dtype: torch.dtype) -> tuple[Learner, list[dict[str, Any]]]:
    """Cross-entropy epochs with linear warm-up; returns the learner and per-epoch losses."""
    s = cfg.sft
    _, learner_spec = build.quant_specs(cfg)
    learner = Learner(path, learner_spec, dtype=dtype, device=str(device), lr=float(s.lr), weight_decay=0.01,
                      use_reference=False, micro_batch_size=int(s.batch_size))
    logger = MetricsLogger.from_config(out, cfg)      # the sinks `logger` names, as the RL trainer's
    bs = int(s.batch_size)
    steps_per_epoch = math.ceil(len(train) / bs)
    total = steps_per_epoch * int(s.epochs)
    sched = torch.optim.lr_scheduler.LambdaLR(learner.opt, lambda i: min(1.0, (i + 1) / max(1, total // 10)))
    history, step = [], 0
    val_loss = evaluate_nll(learner, val, bs) if val else float("nan")
    logger.log(0, {"sft/val_loss": val_loss})
    with progress() as prog:
        bar = prog.add_task(f"SFT {cfg.env.name}", total=total, info=f"val {val_loss:.3f}")
        for epoch in range(int(s.epochs)):
            rng.shuffle(train)
            losses = []
            for i in range(0, len(train), bs):
                loss, _ = action_nll(learner.model, train[i: i + bs], learner.device)
                learner.opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(learner.model.parameters(), float(cfg.trainer.grad_clip))
                learner.optimizer_step()
                sched.step()
                step += 1
                losses.append(float(loss.detach()))
                logger.log(step, {"sft/train_loss": losses[-1]})
                if i + bs >= len(train):    # the epoch's last batch: its line (a log's at 100 %) shows this epoch's val
                    val_loss = evaluate_nll(learner, val, bs) if val else float("nan")
                prog.update(bar, advance=1, info=f"loss {losses[-1]:.3f} val {val_loss:.3f}")
            history.append({"epoch": epoch + 1, "train_loss": sum(losses) / len(losses), "val_loss": val_loss})
            logger.log(step, {"sft/epoch": epoch + 1, "sft/epoch_train_loss": history[-1]["train_loss"],
                              "sft/val_loss": val_loss})
    logger.close()
    return learner, history
