"""The multi-turn episode loop: many episodes at once, token in, token out.

Each round, every active episode needs one assistant turn: the loop asks the policy (the rollout
backend, or an expert for demonstrations) for all of them in one batch, parses the actions, steps
the environments in parallel through the pool, and appends the observations as tokens. Episodes
end when the environment terminates (won / failed), at the step cap, when the next turn would not
fit the context budget, or when their environment crashed (reported as "error").
"""
from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

from agentq.pool.base import EnvPool
from agentq.rollout.backend import SamplingParams, TurnRequest, TurnResult

from .chat import ChatFormat
from .parser import ActionParser
from .trajectory import Trajectory


@dataclass(frozen=True)
class PromptConfig:
    system: str
    first_turn: str = "{task}\n{obs}\n{actions}"
    next_turn: str = "{obs}\n{actions}"
    actions: str = "Actions: {actions}"
    max_obs_chars: int = 2000
    invalid_format: str = "Invalid format: reply with exactly one action inside <action>...</action>."

    def render(self, template: str, task: str, obs: str, admissible: list[str] | None,
               info: dict | None = None) -> str:
        """Fill a turn template. Besides {task}, {obs} and {actions}, any scalar or list entry of
        the env's `info` can be named (lists are comma-joined), e.g. ScienceWorld's {objects}."""
        if len(obs) > self.max_obs_chars:
            obs = obs[: self.max_obs_chars] + " [...]"
        actions = self.actions.format(actions=", ".join(admissible)) if admissible and self.actions else ""
        fields = {k: ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else v
                  for k, v in (info or {}).items() if isinstance(v, (str, int, float, list, tuple))}
        fields.update(task=task, obs=obs, actions=actions)
        try:
            return template.format_map(fields).strip()
        except KeyError as e:
            raise KeyError(f"prompt template names {{{e.args[0]}}}, which the environment's info does not "
                           f"have; available: {sorted(fields)}") from None


@dataclass(frozen=True)
class EpisodeSpec:
    episode_id: int
    task_id: str
    split: str
    group_id: int = 0
    seed: int = 0


class Policy(Protocol):
    def __call__(self, requests: list[TurnRequest], infos: list[dict]) -> list[TurnResult]: ...


class BackendPolicy:
    """The rollout backend as the policy (RL rollouts, evaluation)."""

    def __init__(self, backend):
        self.backend = backend

    def __call__(self, requests, infos):
        return self.backend.generate(requests)

    def release(self, episode_id: int):
        self.backend.release(episode_id)


class ExpertPolicy:
    """Writes the environment expert's next action in the agent's action format (demonstrations).
    Tokens are encoded text, not samples: rollout log-probs are 0. The turn ends as a sampled one
    would: at a stop string of the request's sampling params (the framework then closes the turn),
    else with the stop token, so demonstrations and rollouts share one token layout."""

    def __init__(self, chat: ChatFormat, parser: ActionParser):
        self.chat, self.parser = chat, parser

    def __call__(self, requests, infos):
        out = []
        for r, info in zip(requests, infos):
            action = info.get("expert_action")
            if action is None:
                raise RuntimeError(f"no expert action for task {info.get('task_id')!r}: make the env with expert=True")
            text = self.parser.format(action)
            ids, finish = self.chat.encode(text), "stop_string"
            if not any(text.endswith(s) for s in r.sampling.stop):
                ids, finish = ids + [self.chat.stop_token_ids[0]], "stop"
            out.append(TurnResult(r.episode_id, ids, [0.0] * len(ids), finish))
        return out

    def release(self, episode_id: int):
        pass


def episode_seed(run_seed: int, episode_id: int) -> int:
    h = hashlib.blake2b(f"{run_seed}:{episode_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 2


class AgentLoop:
    def __init__(self, pool: EnvPool, chat: ChatFormat, prompt: PromptConfig, parser: ActionParser,
                 sampling: SamplingParams, max_turns: int, max_context_tokens: int,
                 max_concurrent: int | None = None, invalid_action_penalty: float = 0.0,
                 inadmissible_action_penalty: float = 0.0, run_seed: int = 0):
        self.pool, self.chat, self.prompt, self.parser = pool, chat, prompt, parser
        self.sampling = sampling
        self.max_turns, self.max_context_tokens = max_turns, max_context_tokens
        self.max_concurrent = min(max_concurrent or pool.num_envs, pool.num_envs)
        self.invalid_action_penalty = invalid_action_penalty
        self.inadmissible_action_penalty = inadmissible_action_penalty
        self.run_seed = run_seed

    def run(self, episodes: list[EpisodeSpec], policy, on_done: Callable[[Trajectory], None] | None = None
            ) -> list[Trajectory]:
        queue = deque(episodes)
        free_slots = list(range(self.max_concurrent - 1, -1, -1))
        active: dict[int, dict] = {}       # env slot → episode state
        done: list[Trajectory] = []

        def finish(slot: int, reason: str, error: str | None = None):
            st = active.pop(slot)
            traj: Trajectory = st["traj"]
            traj.end_reason, traj.error = reason, error
            policy.release(traj.episode_id)
            free_slots.append(slot)
            done.append(traj)
            if on_done:
                on_done(traj)

        while queue or active:
            # start new episodes on free env slots
            starting = []
            while queue and free_slots:
                spec = queue.popleft()
                slot = free_slots.pop()
                traj = Trajectory(spec.episode_id, spec.task_id, spec.split, spec.group_id)
                active[slot] = {"traj": traj, "spec": spec, "ctx": []}
                starting.append((slot, {"seed": spec.seed, "options": {"task_id": spec.task_id, "split": spec.split}}))
            for res in (self.pool.reset(starting) if starting else []):
                st = active[res.slot]
                if not res.ok:
                    finish(res.slot, "error", res.error)
                    continue
                st["info"] = res.info
                st["task"] = res.info.get("task", "")
                st["traj"].info["task_type"] = res.info.get("task_type")
                user = self.prompt.render(self.prompt.first_turn, st["task"], res.obs, res.info.get("admissible_actions"),
                                          res.info)
                ids = self.chat.prompt(self.prompt.system, user)
                st["traj"].append(ids, sampled=False)
                st["traj"].transcript.append({"user": user})
            if not active:
                continue
            # one assistant turn for every active episode that still fits the context budget
            for slot in [s for s, st in active.items()
                         if st["traj"].num_tokens + self.sampling.max_new_tokens > self.max_context_tokens]:
                finish(slot, "context")
            slots = sorted(active)
            if not slots:
                continue
            reqs = [TurnRequest(active[s]["traj"].episode_id, active[s]["traj"].input_ids, self.sampling,
                                seed=episode_seed(self.run_seed, active[s]["traj"].episode_id)) for s in slots]
            results = policy(reqs, [active[s]["info"] for s in slots])
            to_step, invalid = [], []
            for s, r in zip(slots, results):
                if r.finish_reason == "error":      # the backend lost the episode (a dead rollout worker)
                    finish(s, "error", r.error)
                    continue
                traj: Trajectory = active[s]["traj"]
                traj.turns += 1
                traj.append(r.token_ids, sampled=True, seg=traj.turns, logps=r.logprobs)
                traj.policy_version = r.policy_version
                active[s]["stopped"] = r.finish_reason == "stop"
                text = self.chat.decode(r.token_ids)
                action = self.parser.parse(text)
                active[s]["turn"] = {"assistant": text, "action": action}
                if action is None:
                    invalid.append(s)
                else:
                    admissible = active[s]["info"].get("admissible_actions")
                    if admissible and action.lower() not in {a.lower() for a in admissible}:
                        traj.inadmissible_actions += 1
                        traj.reward -= self.inadmissible_action_penalty
                    to_step.append((s, action))
            step_results = self.pool.step(to_step) if to_step else []
            for res in step_results:
                st = active[res.slot]
                traj = st["traj"]
                if not res.ok:
                    traj.transcript.append(st["turn"])
                    finish(res.slot, "error", res.error)
                    continue
                traj.reward += res.reward
                traj.won, traj.score = bool(res.info.get("won", False)), float(res.info.get("score", 0.0))
                st["info"] = res.info
                st["turn"]["obs"] = res.obs
                traj.transcript.append(st["turn"])
                if res.terminated:
                    finish(res.slot, "won" if traj.won else "failed")
                elif res.truncated or traj.turns >= self.max_turns:
                    finish(res.slot, "step_cap")
                else:
                    user = self.prompt.render(self.prompt.next_turn, st["task"], res.obs,
                                              res.info.get("admissible_actions"), res.info)
                    traj.append(self.chat.next_user(user, st["stopped"]), sampled=False)
            for s in invalid:
                st = active[s]
                traj = st["traj"]
                traj.invalid_actions += 1
                traj.reward -= self.invalid_action_penalty
                st["turn"]["obs"] = self.prompt.invalid_format
                traj.transcript.append(st["turn"])
                if traj.turns >= self.max_turns:
                    finish(s, "step_cap")
                else:
                    user = self.prompt.render(self.prompt.next_turn, st["task"], self.prompt.invalid_format,
                                              st["info"].get("admissible_actions"), st["info"])
                    traj.append(self.chat.next_user(user, st["stopped"]), sampled=False)
        done.sort(key=lambda t: t.episode_id)
        return done
