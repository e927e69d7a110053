"""The multi-turn episode loop: many episodes at once, token in, token out.

Each round, every active episode needs one assistant turn: the loop asks the policy (the rollout
backend, or an expert for demonstrations) for all of them in one batch, parses the actions, steps
the environments in parallel through the pool, and appends the observations as tokens. Episodes
end when the environment terminates (won / failed), at the step cap, when the next turn would not
fit the context budget, or when their environment crashed (reported as "error").
"""
from __future__ import annotations

import functools
import hashlib
import logging
import re
import string
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

from agentq.pool.base import EnvPool
from agentq.rollout.backend import RolloutBackend, SamplingParams, TurnRequest, TurnResult, check_results, turn_error
from agentq.utils.errors import RunAborted

from .chat import ChatFormat
from .parser import ActionParser
from .trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptConfig:
    """The text around observations: system prompt, turn templates, format feedback (`agent.prompt`)."""

    system: str
    first_turn: str = "{task}\n{obs}\n{actions}"
    next_turn: str = "{obs}\n{actions}"
    actions: str = "Actions: {actions}"
    max_obs_chars: int = 2000
    invalid_format: str = "Invalid format: reply with exactly one action inside <action>...</action>."

    def render(self, name: str, task: str, obs: str, admissible: list[str] | None,
               info: dict | None = None, turn: int | None = None) -> str:
        """Fill the turn template `name` ("first_turn" or "next_turn"). Besides {task}, {obs} and
        {actions}, any scalar or list entry of the env's `info` can be named (lists are comma-joined),
        e.g. ScienceWorld's {objects}.

        Raises:
            ConfigError: the template names a key this `info` lacks (`check_fields` checks the reset's
                info; a step's info may lack a key the reset's had), naming the setting, the key, the
                turn after which it was missing (`turn`, None: at reset) and the keys available.
        """
        template = getattr(self, name)
        if len(obs) > self.max_obs_chars:
            obs = obs[: self.max_obs_chars] + " [...]"
        actions = self.actions.format(actions=", ".join(admissible)) if admissible and self.actions else ""
        fields = _info_fields(info)
        fields.update(task=task, obs=obs, actions=actions)
        try:
            return template.format_map(fields).strip()
        except KeyError as e:
            from agentq.config import ConfigError

            when = "at reset" if turn is None else f"after turn {turn} (its info at reset had it)"
            raise ConfigError(f"env.prompt.{name}={template!r} names {{{e.args[0]}}}, which the environment's info "
                              f"{when} does not have; available: {sorted(fields)}") from None

    def check_fields(self, info: dict | None) -> None:
        """Refuse, at an episode's reset, a turn template that names a key the env's `info` lacks: it
        was a KeyError traceback mid-run. next_turn is checked too: after an unparsable first reply it
        is rendered with the reset's info. The actions template is filled with {actions} alone.

        Checked once per distinct set of info keys (`_check_template_keys` is cached): every reset
        called it, building the fields `render` builds again right after.

        Raises:
            ConfigError: naming the template (env.prompt.<name>), the missing key and the keys available.
        """
        info = info or {}
        _check_template_keys(self, frozenset(k for k, v in info.items() if isinstance(v, _FIELD_TYPES)),
                             frozenset((k, type(v).__name__) for k, v in info.items() if not isinstance(v, _FIELD_TYPES)))


#: the types of the `info` entries a turn template may name
_FIELD_TYPES = (str, int, float, list, tuple)


@functools.lru_cache(maxsize=256)
def _check_template_keys(prompt: PromptConfig, info_keys: frozenset[str],
                         other_keys: frozenset[tuple[str, str]] = frozenset()) -> None:
    """`PromptConfig.check_fields` for the info keys a template may name (`other_keys`: the (key, type
    name) of the entries it may not, a dict's); an error is not cached, so every reset with those keys
    raises it."""
    from agentq.config import ConfigError

    available = sorted({*info_keys, "task", "obs", "actions"})
    unusable = dict(other_keys)
    for name, template in (("first_turn", prompt.first_turn), ("next_turn", prompt.next_turn)):
        missing = [k for k in template_keys(template) if k not in available]
        if missing and missing[0] in unusable:
            raise ConfigError(f"env.prompt.{name}={template!r} names {{{missing[0]}}}, whose value in the "
                              f"environment's info is a {unusable[missing[0]]}, not a str, number or list; "
                              f"available: {available}")
        if missing:
            raise ConfigError(f"env.prompt.{name}={template!r} names {{{missing[0]}}}, which the environment's "
                              f"info at reset does not have; available: {available}")
    missing = [k for k in template_keys(prompt.actions) if k != "actions"]
    if missing:
        raise ConfigError(f"env.prompt.actions={prompt.actions!r} names {{{missing[0]}}}; it is filled in with "
                          "{actions} alone (the admissible actions)")


def _info_fields(info: dict | None) -> dict:
    """The entries of an env's `info` a turn template may name: scalars, and lists comma-joined."""
    return {k: ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else v
            for k, v in (info or {}).items() if isinstance(v, _FIELD_TYPES)}


@functools.lru_cache(maxsize=64)
def template_keys(template: str) -> tuple[str, ...]:
    """The keys a `str.format` template names, in order: "{objects}", "{a.b}" and "{a[0]}" name
    'objects' and 'a'; a positional "{}" names ''; a nested "{x:{w}}" names 'x' and 'w'."""
    keys: list[str] = []
    for _, field, spec, _ in string.Formatter().parse(template):
        if field is not None:
            keys += [re.split(r"[.\[]", field, maxsplit=1)[0], *template_keys(spec or "")]
    return tuple(keys)


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to play: which task of which split, its GRPO group and its env seed."""

    episode_id: int
    task_id: str
    split: str
    group_id: int = 0
    seed: int = 0


class Policy(Protocol):
    """What the agent loop asks for one assistant turn per active episode: the rollout backend
    (`BackendPolicy`), an expert (`ExpertPolicy`) or a test's scripted replies."""

    def __call__(self, requests: list[TurnRequest], infos: list[dict]) -> list[TurnResult]:
        """One turn for each request.

        Args:
            requests: one per active episode, with its full context so far (token ids).
            infos: the environment's latest `info` of each episode, in the same order.
        Returns:
            One `TurnResult` per request, in order (finish_reason "error" ends that episode).
        """
        ...

    def release(self, episode_id: int) -> None:
        """Forget an ended episode (a backend frees its KV slot).

        Args:
            episode_id: the episode that just ended, for whatever reason.
        """
        ...


class BackendPolicy:
    """The rollout backend as the policy (RL rollouts, evaluation)."""

    def __init__(self, backend: RolloutBackend, version: int | None = None):
        """Args:
            backend: the rollout backend.
            version: the policy version the trainer last synced into it, which every turn must report
                (None: not checked, e.g. an evaluation).
        """
        self.backend, self.version = backend, version
        self.vocab_size = getattr(backend, "vocab_size", None)      # the agent loop checks sampled ids against it

    def __call__(self, requests: list[TurnRequest], infos: list[dict]) -> list[TurnResult]:
        results = self.backend.generate(requests)       # paired with the requests: the loop checks it
        who = type(self.backend).__name__
        stale = next((r for r in results if r.finish_reason != "error" and self.version is not None
                      and r.policy_version != self.version), None)
        if stale is not None:       # off-policy without a word: the learner's weights never reached the rollouts
            raise RunAborted(f"the rollout backend {who} sampled episode {stale.episode_id}'s turn with policy_version "
                             f"{stale.policy_version}, but the learner's weights were synced into it as version "
                             f"{self.version}: its update_weights did not take them (or does not set the version)")
        return results

    def release(self, episode_id: int) -> None:
        self.backend.release(episode_id)


class ExpertPolicy:
    """Writes the environment expert's next action in the agent's action format (demonstrations).
    Tokens are encoded text, not samples: rollout log-probs are 0. The turn ends as a sampled one
    would: at a stop string of the request's sampling params (the framework then closes the turn),
    else with the stop token, so demonstrations and rollouts share one token layout. Like a sampled
    turn it is at most `sampling.max_new_tokens` tokens (env.max_new_tokens): a longer one is cut
    there with finish "length" (no stop token), as the engine cuts a sampled turn, and the loop
    treats it the same way (its action is parsed from what is left, usually none: format feedback).
    So demonstrations never hold a turn the engine could not sample, and the context budget the
    loop keeps (`max_context_tokens`, checked before each turn with `max_new_tokens`) holds for them too.
    A turn without an expert action (`info["expert_action"]` None) loses that episode (finish "error")."""

    def __init__(self, chat: ChatFormat, parser: ActionParser):
        self.chat, self.parser = chat, parser
        self.cut_turns = 0          # expert turns cut at max_new_tokens (warned once: such demos teach cut actions)

    def __call__(self, requests: list[TurnRequest], infos: list[dict]) -> list[TurnResult]:
        return [self._expert_turn(r, info) for r, info in zip(requests, infos)]

    def _expert_turn(self, request: TurnRequest, info: dict) -> TurnResult:
        action = info.get("expert_action")
        if action is None:      # the episode is lost (reported as errored), not the run
            return TurnResult(request.episode_id, [], [], "error",
                              error=f"no expert action for task {info.get('task_id')!r}: the env's `_expert_action` "
                                    "returned None (or the env was not made with expert=True)")
        text = self.parser.format(action)
        ids, finish = self.chat.encode(text), "stop_string"
        if not any(text.endswith(s) for s in request.sampling.stop):
            ids, finish = ids + [self.chat.stop_token_ids[0]], "stop"
        if len(ids) > request.sampling.max_new_tokens:
            if not self.cut_turns:
                log.warning("an expert action of %d tokens is cut at env.max_new_tokens=%d (%r): the demonstrations "
                            "hold turns the engine could not finish; raise env.max_new_tokens", len(ids),
                            request.sampling.max_new_tokens, action)
            self.cut_turns += 1
            ids, finish = ids[:request.sampling.max_new_tokens], "length"
        return TurnResult(request.episode_id, ids, [0.0] * len(ids), finish)

    def release(self, episode_id: int) -> None:
        pass


def episode_seed(run_seed: int, episode_id: int) -> int:
    """A per-episode seed (env reset, sampling) that depends only on the run seed and the episode id.

    Args:
        run_seed: the run's seed; episode_id: the episode.
    Returns:
        A 62-bit non-negative int (blake2b of both), so batching and restarts cannot change it.
    """
    h = hashlib.blake2b(f"{run_seed}:{episode_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 2


@dataclass
class EpisodeState:
    """One running episode on an env slot."""

    traj: Trajectory
    task: str = ""                      # the task text the env gave at reset (every turn repeats it)
    info: dict = field(default_factory=dict)   # the env's latest info (admissible actions, expert action)
    turn: dict = field(default_factory=dict)   # the transcript entry being built: assistant, action, obs
    stopped: bool = False               # the last assistant turn ended with a sampled stop token


@dataclass
class _Run:
    """The bookkeeping of one `AgentLoop.run` call."""

    queue: deque[EpisodeSpec]
    free_slots: list[int]
    policy: Policy
    on_done: Callable[[Trajectory], None] | None
    active: dict[int, EpisodeState] = field(default_factory=dict)   # env slot → running episode
    done: list[Trajectory] = field(default_factory=list)

    def finish(self, slot: int, reason: str, error: str | None = None) -> None:
        """End the episode on `slot`: record why, free its slot and the policy's state, report it."""
        traj = self.active.pop(slot).traj
        traj.end_reason, traj.error = reason, error
        self.policy.release(traj.episode_id)
        self.free_slots.append(slot)
        self.done.append(traj)
        if self.on_done:
            self.on_done(traj)


class AgentLoop:
    """Plays many episodes at once on a pool's env slots (see the module docstring)."""

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

    def run(self, episodes: list[EpisodeSpec], policy: Policy,
            on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        """Play every episode to its end, at most `max_concurrent` at a time.

        Args:
            episodes: what to play (task, split, group, seed), started in this order as slots free up.
            policy: writes each assistant turn (`Policy`).
            on_done: called with each trajectory as its episode ends (e.g. to write it out).
        Returns:
            The trajectories, sorted by episode id.
        """
        run = _Run(deque(episodes), list(range(self.max_concurrent - 1, -1, -1)), policy, on_done)
        while run.queue or run.active:
            self._start_episodes(run)
            self._end_over_budget(run)
            if not run.active:
                continue
            to_step, invalid = self._take_turns(run)
            self._step_envs(run, to_step)
            self._answer_invalid(run, invalid)
        return sorted(run.done, key=lambda t: t.episode_id)

    def _start_episodes(self, run: _Run) -> None:
        """Reset envs for queued episodes on free slots; each gets its first prompt."""
        starting = []
        while run.queue and run.free_slots:
            spec, slot = run.queue.popleft(), run.free_slots.pop()
            run.active[slot] = EpisodeState(Trajectory(spec.episode_id, spec.task_id, spec.split, spec.group_id))
            starting.append((slot, {"seed": spec.seed, "options": {"task_id": spec.task_id, "split": spec.split}}))
        for res in (self.pool.reset(starting) if starting else []):
            if not res.ok:
                run.finish(res.slot, "error", res.error)
                continue
            st = run.active[res.slot]
            if res.recovered:       # its worker died before the episode began; played on the restarted one
                st.traj.info["env_recovered"] = res.recovered
            st.info, st.task = res.info, res.info.get("task", "")
            # the env's score from the start (ScienceWorld's partial credit): an episode of invalid
            # turns steps the env never, and recorded 0
            st.traj.score = float(res.info.get("score", 0.0))
            st.traj.info["task_type"] = res.info.get("task_type")
            self.prompt.check_fields(res.info)
            user = self.prompt.render("first_turn", st.task, res.obs, res.info.get("admissible_actions"), res.info)
            st.traj.append(self.chat.prompt(self.prompt.system, user), sampled=False)
            st.traj.transcript.append({"user": user})

    def _end_over_budget(self, run: _Run) -> None:
        """End the episodes whose next turn would not fit the context budget."""
        for slot in [s for s, st in run.active.items()
                     if st.traj.num_tokens + self.sampling.max_new_tokens > self.max_context_tokens]:
            run.finish(slot, "context")

    def _take_turns(self, run: _Run) -> tuple[list[tuple[int, str]], list[int]]:
        """One policy turn for every active episode, appended to its trajectory and parsed.

        Returns:
            (slot, action) pairs to step, and the slots whose turn had no parsable action.
        """
        slots = sorted(run.active)
        reqs = [TurnRequest(run.active[s].traj.episode_id, run.active[s].traj.input_ids, self.sampling,
                            seed=episode_seed(self.run_seed, run.active[s].traj.episode_id)) for s in slots]
        results = run.policy(reqs, [run.active[s].info for s in slots])
        # any policy (a missing result never ends), named by its backend where it has one
        check_results(reqs, results, type(getattr(run.policy, "backend", run.policy)).__name__)
        vocab = getattr(run.policy, "vocab_size", None)
        to_step, invalid = [], []
        for s, q, r in zip(slots, reqs, results):
            if r.finish_reason == "error":      # the backend lost the episode (a dead rollout worker)
                run.finish(s, "error", r.error)
                continue
            # e.g. a NaN log-prob would make the episode's importance weights NaN (or, for AIS, the whole
            # batch's) and the learner skip its minibatches without a word: reported as lost instead
            why = turn_error(q, r, vocab)
            if why is not None:
                run.finish(s, "error", f"the rollout backend returned {why} of turn {run.active[s].traj.turns + 1}")
                continue
            action = self._record_turn(run.active[s], r)
            if action is None:
                invalid.append(s)
            else:
                to_step.append((s, action))
        return to_step, invalid

    def _record_turn(self, st: EpisodeState, r: TurnResult) -> str | None:
        """Append the sampled turn to the trajectory; parse its action (None: no valid format) and
        charge the inadmissible-action penalty."""
        traj = st.traj
        traj.turns += 1
        # as Python numbers: a backend's numpy values pass `turn_error`, and the files written hold JSON
        traj.append([int(t) for t in r.token_ids], sampled=True, seg=traj.turns, logps=[float(x) for x in r.logprobs])
        traj.policy_version = r.policy_version
        st.stopped = r.finish_reason == "stop"
        text = self.chat.decode(r.token_ids)
        action = self.parser.parse(text)
        st.turn = {"assistant": text, "action": action}
        admissible = st.info.get("admissible_actions")
        traj.admissible_turns += bool(admissible)
        if action is not None and admissible and action.lower() not in {a.lower() for a in admissible}:
            traj.inadmissible_actions += 1
            traj.reward -= self.inadmissible_action_penalty
        return action

    def _step_envs(self, run: _Run, to_step: list[tuple[int, str]]) -> None:
        """Step the envs with the parsed actions; record reward and outcome, end or continue each episode."""
        for res in (self.pool.step(to_step) if to_step else []):
            st = run.active[res.slot]
            traj = st.traj
            if not res.ok:
                traj.transcript.append(st.turn)
                run.finish(res.slot, "error", res.error)
                continue
            traj.reward += res.reward
            traj.won, traj.score = bool(res.info.get("won", False)), float(res.info.get("score", 0.0))
            st.info = res.info
            st.turn["obs"] = res.obs
            traj.transcript.append(st.turn)
            if res.terminated:
                run.finish(res.slot, "won" if traj.won else "failed")
            else:
                self._next_turn_or_cap(run, res.slot, res.obs, res.truncated)

    def _answer_invalid(self, run: _Run, invalid: list[int]) -> None:
        """Answer the turns without a parsable action with format feedback (the env is not stepped)."""
        for s in invalid:
            st = run.active[s]
            st.traj.invalid_actions += 1
            st.traj.reward -= self.invalid_action_penalty
            st.turn["obs"] = self.prompt.invalid_format
            st.traj.transcript.append(st.turn)
            self._next_turn_or_cap(run, s, self.prompt.invalid_format)

    def _next_turn_or_cap(self, run: _Run, slot: int, obs: str, truncated: bool = False) -> None:
        """End the episode at the step cap, else append the next user message with `obs`."""
        st = run.active[slot]
        if truncated or st.traj.turns >= self.max_turns:
            run.finish(slot, "step_cap")
            return
        user = self.prompt.render("next_turn", st.task, obs, st.info.get("admissible_actions"), st.info,
                                  turn=st.traj.turns)
        st.traj.append(self.chat.next_user(user, st.stopped), sampled=False)
