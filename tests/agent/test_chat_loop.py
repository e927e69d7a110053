"""Token-level chat rendering, the action parser and the episode loop on a real environment."""
import re

import pytest

from agentq.agent import ActionParser, AgentLoop, ChatFormat, EpisodeSpec, ExpertPolicy, PromptConfig
from agentq.config import ConfigError
from agentq.pool import EnvSpec, InlinePool
from agentq.rollout import SamplingParams, TurnResult
from agentq.utils.errors import RunAborted


def test_chat_pieces_reproduce_the_chat_template(tokenizer):
    chat = ChatFormat.from_tokenizer(tokenizer)
    prompt = chat.prompt("SYS", "find the coin")
    action = tokenizer.encode("<action>take coin</action>", add_special_tokens=False) + [tokenizer.eos_token_id]
    ids = prompt + action + chat.next_user("You took the coin.", stopped=True)
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "SYS"}, {"role": "user", "content": "find the coin"},
         {"role": "assistant", "content": "<action>take coin</action>"}, {"role": "user", "content": "You took the coin."}],
        add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(ids) == text
    assert chat.stop_token_ids == (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    # a turn cut by max_new_tokens gets its end-of-turn token from the framework (not sampled)
    assert chat.next_user("x", stopped=False)[: len(chat.after_length)] == [tokenizer.eos_token_id] + chat.after_stop


def test_chat_format_requires_a_template(tokenizer):
    import copy

    t = copy.deepcopy(tokenizer)
    t.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        ChatFormat.from_tokenizer(t)


@pytest.mark.parametrize("text,action", [
    ("<action>take coin</action>", "take coin"),
    ("I think.\n<action>  move   east </action> trailing", "move east"),
    ("<action>a</action> then <action>b</action>", "b"),
    ("take coin", None), ("<action></action>", None), ("<action>unclosed", None)])
def test_action_parser(text, action):
    assert ActionParser().parse(text) == action


class ScriptedPolicy:
    """Replays fixed assistant texts (the test's stand-in for a model: it checks the loop's bookkeeping)."""

    def __init__(self, chat, texts, logps=None):
        self.chat, self.texts, self.i = chat, texts, {}
        self.logps = logps or {}                 # (episode, turn index) → the turn's log-probs

    def __call__(self, requests, infos):
        out = []
        for r in requests:
            k = self.i.get(r.episode_id, 0)
            self.i[r.episode_id] = k + 1
            ids = self.chat.encode(self.texts[k]) + [self.chat.stop_token_ids[0]]
            out.append(TurnResult(r.episode_id, ids, self.logps.get((r.episode_id, k), [-0.5] * len(ids)), "stop"))
        return out

    def release(self, episode_id):
        pass


def make_loop(tokenizer, max_turns=5, max_context=2048, **penalties):
    chat = ChatFormat.from_tokenizer(tokenizer)
    pool = InlinePool(EnvSpec("textworld_express", {"games": ["coin"], "split": "train", "max_steps": max_turns,
                                                    "expert": True, "game_params": {"coin": "numLocations=2"}}), 2)
    loop = AgentLoop(pool, chat, PromptConfig(system="SYS"), ActionParser(), SamplingParams(max_new_tokens=16, stop_token_ids=chat.stop_token_ids),
                     max_turns=max_turns, max_context_tokens=max_context, **penalties)
    return chat, loop


def test_loop_masks_segments_and_invalid_turns(tokenizer):
    chat, loop = make_loop(tokenizer, max_turns=3, invalid_action_penalty=0.1, inadmissible_action_penalty=0.03)
    texts = ["no tags here", "<action>fly to the moon</action>", "<action>Look  around</action>"]
    (traj,) = loop.run([EpisodeSpec(0, "coin/1", "train")], ScriptedPolicy(chat, texts))
    assert traj.turns == 3 and traj.invalid_actions == 1 and traj.end_reason == "step_cap" and not traj.won
    # parsed but not in the env's admissible list (case and spacing do not count)
    assert traj.inadmissible_actions == 1
    # no env reward; one unparsable turn (0.1) and one inadmissible one (0.03) are charged
    assert traj.reward == pytest.approx(-0.13, abs=1e-12)
    segs = [s for s, m in zip(traj.seg_id, traj.action_mask) if m]
    n = [len(chat.encode(t)) + 1 for t in texts]
    assert segs == [1] * n[0] + [2] * n[1] + [3] * n[2]
    assert all(lp == -0.5 for lp, m in zip(traj.rollout_logp, traj.action_mask) if m)
    assert all(lp == 0.0 and s == 0 for lp, s, m in zip(traj.rollout_logp, traj.seg_id, traj.action_mask) if not m)
    assert traj.transcript[1]["obs"].startswith("Invalid format")
    # the ids are the exact concatenation: decoding never re-encodes sampled text
    assert tokenizer.decode(traj.input_ids).count("<|im_start|>assistant") == 3


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_behaviour_logprob_loses_the_episode_openly(tokenizer, bad):
    """A NaN behaviour log-prob would make its importance weights NaN and the learner drop its
    minibatches silently: the episode ends as an error that says where, and the others play on."""
    chat, loop = make_loop(tokenizer, max_turns=3)
    texts = ["<action>look around</action>"] * 3
    n = len(chat.encode(texts[0])) + 1
    policy = ScriptedPolicy(chat, texts, logps={(0, 1): [-0.5, bad] + [-0.5] * (n - 2)})
    a, b = loop.run([EpisodeSpec(0, "coin/1", "train"), EpisodeSpec(1, "coin/1", "train")], policy)
    assert (a.end_reason, a.turns) == ("error", 1)      # turn 2's tokens were never appended
    assert a.error == f"the rollout backend returned a non-finite behaviour log-prob ({bad}) at token 1 of turn 2"
    assert all(lp == -0.5 for lp, m in zip(a.rollout_logp, a.action_mask) if m)
    assert b.end_reason == "step_cap" and b.turns == 3


def test_expert_policy_wins_and_ends_on_termination(tokenizer):
    chat, loop = make_loop(tokenizer, max_turns=10)
    trajs = loop.run([EpisodeSpec(i, f"coin/{i}", "train", seed=i) for i in range(4)], ExpertPolicy(chat, ActionParser()))
    assert [t.end_reason for t in trajs] == ["won"] * 4
    assert all(t.won and t.score == 1.0 and t.reward == 1.0 for t in trajs)


def test_expert_turns_end_at_the_action_stop_string_like_sampled_ones(tokenizer):
    """With stop=("</action>",) a turn's action tokens end with the closing tag and the framework
    writes the end-of-turn token (not an action token), as for a sampled turn cut by the stop string."""
    chat = ChatFormat.from_tokenizer(tokenizer)
    pool = InlinePool(EnvSpec("textworld_express", {"games": ["coin"], "split": "train", "max_steps": 10,
                                                    "expert": True, "game_params": {"coin": "numLocations=2"}}), 1)
    loop = AgentLoop(pool, chat, PromptConfig(system="SYS"), ActionParser(),
                     SamplingParams(max_new_tokens=16, stop=("</action>",), stop_token_ids=chat.stop_token_ids), max_turns=10, max_context_tokens=2048)
    (traj,) = loop.run([EpisodeSpec(0, "coin/2", "train")], ExpertPolicy(chat, ActionParser()))
    assert traj.won and traj.turns >= 2
    eos = chat.stop_token_ids[0]
    actions = [[t for t, s in zip(traj.input_ids, traj.seg_id) if s == k] for k in range(1, traj.turns + 1)]
    assert all(tokenizer.decode(a).endswith("</action>") and eos not in a for a in actions)
    # after each action the framework closes the turn exactly as the template does after a sampled stop
    ends = [max(i for i, s in enumerate(traj.seg_id) if s == k) + 1 for k in range(1, traj.turns)]
    closing = [eos] + chat.after_stop
    assert chat.after_length == closing
    assert all(traj.input_ids[e: e + len(closing)] == closing and not any(traj.action_mask[e: e + len(closing)])
               for e in ends)


@pytest.mark.parametrize("stop", [(), ("</action>",)])
def test_expert_turns_are_cut_at_max_new_tokens_like_sampled_ones(tokenizer, stop):
    """An expert turn longer than max_new_tokens ends as the engine ends a sampled one: cut there,
    finish "length" (no stop token), and the context budget holds for demonstrations too."""
    from agentq.rollout import TurnRequest

    chat = ChatFormat.from_tokenizer(tokenizer)
    expert = ExpertPolicy(chat, ActionParser())
    full = chat.encode("<action>take coin</action>") + ([] if stop else [chat.stop_token_ids[0]])
    for cap in (3, len(full) - 1, len(full), len(full) + 4):
        (r,) = expert([TurnRequest(0, [1, 2], SamplingParams(max_new_tokens=cap, stop=stop))],
                      [{"expert_action": "take coin"}])
        assert r.token_ids == full[:cap] and len(r.logprobs) == len(r.token_ids)
        assert r.finish_reason == ("length" if cap < len(full) else "stop_string" if stop else "stop")
    assert expert.cut_turns == 2                     # counted (and warned about once)

    pool = InlinePool(EnvSpec("textworld_express", {"games": ["coin"], "split": "train", "max_steps": 10,
                                                    "expert": True, "game_params": {"coin": "numLocations=2"}}), 1)
    loop = AgentLoop(pool, chat, PromptConfig(system="SYS"), ActionParser(),
                     SamplingParams(max_new_tokens=3, stop=stop, stop_token_ids=chat.stop_token_ids), max_turns=10, max_context_tokens=300)
    (traj,) = loop.run([EpisodeSpec(0, "coin/2", "train")], expert)
    lens = [sum(1 for s in traj.seg_id if s == k) for k in range(1, traj.turns + 1)]
    assert traj.turns >= 1 and all(n == 3 for n in lens) and traj.invalid_actions == traj.turns
    # every turn ends within the budget (the loop's check before a turn counts max_new_tokens)
    assert max(i for i, s in enumerate(traj.seg_id) if s) < 300 and traj.end_reason == "context" and not traj.won


def test_a_turn_without_an_expert_action_loses_that_episode_not_the_run(tokenizer):
    """An expert with no action for a state (`_expert_action` returning None, as its contract allows)
    raised out of the loop and stopped the whole SFT collection, saying "make the env with
    expert=True" even when it was. The episode now ends as errored, saying why, and the rest play on."""
    from agentq.rollout import TurnRequest

    chat = ChatFormat.from_tokenizer(tokenizer)
    expert = ExpertPolicy(chat, ActionParser())
    why = ("no expert action for task 'coin/1': the env's `_expert_action` returned None (or the env was not made "
           "with expert=True)")
    ok, lost = expert([TurnRequest(0, [1], SamplingParams(max_new_tokens=16, stop_token_ids=chat.stop_token_ids)),
                       TurnRequest(1, [1], SamplingParams(max_new_tokens=16, stop_token_ids=chat.stop_token_ids))],
                      [{"expert_action": "take coin"}, {"expert_action": None, "task_id": "coin/1"}])
    assert ok.finish_reason == "stop" and ok.token_ids
    assert (lost.episode_id, lost.token_ids, lost.finish_reason, lost.error) == (1, [], "error", why)
    pool = InlinePool(EnvSpec("textworld_express", {"games": ["coin"], "split": "train", "max_steps": 4,
                                                    "expert": False, "game_params": {"coin": "numLocations=2"}}), 2)
    loop = AgentLoop(pool, chat, PromptConfig(system="SYS"), ActionParser(), SamplingParams(max_new_tokens=16, stop_token_ids=chat.stop_token_ids),
                     max_turns=4, max_context_tokens=2048)
    trajs = loop.run([EpisodeSpec(0, "coin/1", "train"), EpisodeSpec(1, "coin/2", "train")], expert)
    assert [(t.end_reason, t.turns, t.error) for t in trajs] == [("error", 0, why), ("error", 0, why.replace("1", "2"))]


def test_context_budget_ends_episodes(tokenizer):
    chat, loop = make_loop(tokenizer, max_turns=50, max_context=400)
    (traj,) = loop.run([EpisodeSpec(0, "coin/3", "train")], ScriptedPolicy(chat, ["<action>look around</action>"] * 50))
    assert traj.end_reason == "context" and traj.num_tokens + 16 > 400 and traj.turns < 50


def test_prompt_templates_can_name_info_fields():
    p = PromptConfig(system="S", next_turn="{obs}\nObjects: {objects}\nStep {steps}")
    out = p.render("next_turn", "task", "You see a door.", None, {"objects": ["door", "cup"], "steps": 3})
    assert out == "You see a door.\nObjects: door, cup\nStep 3"
    # a step's info without a key the reset's had: one config line naming the setting and the turn
    with pytest.raises(ConfigError, match=re.escape("env.prompt.next_turn='{obs}\\nObjects: {objects}\\nStep {steps}' "
                                                    "names {objects}, which the environment's info after turn 2 (its "
                                                    "info at reset had it) does not have; available: ['actions', "
                                                    "'obs', 'task']")):
        p.render("next_turn", "t", "o", None, {}, turn=2)


SCORED_AT_RESET = """
from agentq.envs import TaskStep, TextEnv


class ScoredAtReset(TextEnv):
    def _tasks(self, split):
        return ["a"]

    def _reset_task(self, task_id, split):
        return "goal", TaskStep(obs="start", score=0.25)

    def _step_task(self, action):
        return TaskStep(obs="end", score=0.5)
"""


def test_an_episode_keeps_the_score_the_env_gave_at_reset(tokenizer, tmp_path, monkeypatch):
    """ScienceWorld scores some credit at reset; an episode whose every turn was unparsable never
    stepped the env and recorded score 0 instead of the env's 0.25. A stepped one takes the step's."""
    (tmp_path / "scored_env.py").write_text(SCORED_AT_RESET)
    monkeypatch.syspath_prepend(str(tmp_path))
    chat = ChatFormat.from_tokenizer(tokenizer)
    pool = InlinePool(EnvSpec("scored_env:ScoredAtReset", {"split": "train", "max_steps": 2}), 2)
    loop = AgentLoop(pool, chat, PromptConfig(system="SYS"), ActionParser(), SamplingParams(max_new_tokens=16, stop_token_ids=chat.stop_token_ids),
                     max_turns=2, max_context_tokens=2048)
    (idle,) = loop.run([EpisodeSpec(0, "a", "train")], ScriptedPolicy(chat, ["no tags", "none either"]))
    assert (idle.invalid_actions, idle.score) == (2, 0.25)
    (stepped,) = loop.run([EpisodeSpec(1, "a", "train")], ScriptedPolicy(chat, ["<action>go</action>", "no tags"]))
    assert stepped.score == 0.5
    pool.close()


def test_template_keys_are_the_names_format_looks_up():
    from agentq.agent.loop import template_keys

    assert template_keys("{task}\n{obs}\nVisible objects: {objects}\n{actions}") == ("task", "obs", "objects", "actions")
    assert template_keys("{a.b} {c[0]} {x:{w}} {{literal}} {}") == ("a", "c", "x", "w", "")


def test_a_template_naming_a_key_info_lacks_is_one_line_at_the_first_reset(tokenizer, tmp_path, monkeypatch):
    """A template naming a key the env's info lacks was a KeyError traceback mid-run (next_turn: at the
    first turn, or only after an unparsable reply); now a ConfigError at the first reset, before any turn."""
    from agentq.config import ConfigError

    (tmp_path / "scored_env.py").write_text(SCORED_AT_RESET)
    monkeypatch.syspath_prepend(str(tmp_path))
    chat = ChatFormat.from_tokenizer(tokenizer)
    pool = InlinePool(EnvSpec("scored_env:ScoredAtReset", {"split": "train", "max_steps": 2}), 1)
    available = "['actions', 'obs', 'score', 'split', 'steps', 'task', 'task_id', 'won']"
    for prompt, error in [
            (PromptConfig(system="S", next_turn="{obs}\nObjects: {objects}"),
             "env.prompt.next_turn='{obs}\\nObjects: {objects}' names {objects}, which the environment's info at "
             f"reset does not have; available: {available}"),
            (PromptConfig(system="S", first_turn="{goal} {obs}"),
             f"env.prompt.first_turn='{{goal}} {{obs}}' names {{goal}}, which the environment's info at reset does "
             f"not have; available: {available}"),
            (PromptConfig(system="S", actions="Try: {admissible}"),
             "env.prompt.actions='Try: {admissible}' names {admissible}; it is filled in with {actions} alone "
             "(the admissible actions)")]:
        policy = ScriptedPolicy(chat, [])                  # any turn asked for would be an IndexError
        loop = AgentLoop(pool, chat, prompt, ActionParser(), SamplingParams(max_new_tokens=16, stop_token_ids=chat.stop_token_ids), max_turns=2,
                         max_context_tokens=2048)
        with pytest.raises(ConfigError) as e:
            loop.run([EpisodeSpec(0, "a", "train")], policy)
        assert str(e.value) == error and policy.i == {}
    ok = PromptConfig(system="S", first_turn="{task} ({score}, {split})\n{obs}", next_turn="{obs} {steps}")
    (traj,) = AgentLoop(pool, chat, ok, ActionParser(), SamplingParams(max_new_tokens=16, stop_token_ids=chat.stop_token_ids), max_turns=2,
                        max_context_tokens=2048).run([EpisodeSpec(1, "a", "train")], ScriptedPolicy(chat, ["x", "y"]))
    assert traj.transcript[0]["user"] == "goal (0.25, train)\nstart" and traj.invalid_actions == 2
    pool.close()


@pytest.mark.parametrize("conf", ["textworld_express", "textworld_express_mapreader"])
def test_the_built_in_templates_name_only_keys_of_the_reset_info(conf):
    """conf/env's TextWorldExpress templates pass the check at a real reset (ScienceWorld's, ALFWorld's
    and WebShop's in tests/envs)."""
    from agentq import build
    from agentq.config import load_config

    cfg = load_config([f"env={conf}"])
    env = build.make_env(cfg, cfg.env.eval_split)
    obs, info = env.reset(seed=0)
    build.prompt_config(cfg).check_fields(info)
    assert {"task", "admissible_actions"} <= set(info)
    env.close()


OBJECTS_ON_TASK_A = """
from agentq.envs import TaskStep, TextEnv


class ObjectsOnA(TextEnv):
    def _tasks(self, split):
        return ["a", "b"]

    def _reset_task(self, task_id, split):
        return "goal", TaskStep(obs="start", extra={"objects": ["cup", "key"]} if task_id == "a" else {})

    def _step_task(self, action):
        return TaskStep(obs="end", done=True)
"""


def _objects_pool(tmp_path, monkeypatch, n: int):
    (tmp_path / "objects_env.py").write_text(OBJECTS_ON_TASK_A)
    monkeypatch.syspath_prepend(str(tmp_path))
    return InlinePool(EnvSpec("objects_env:ObjectsOnA", {"split": "train", "max_steps": 2}), n)


def test_a_reset_builds_the_template_fields_once(tokenizer, tmp_path, monkeypatch):
    """check_fields built every reset's info fields (lists joined) and render built them again right
    after; the check now runs once per distinct set of info keys, and only render builds them."""
    import agentq.agent.loop as loop_mod

    built, renders = [], []
    real_fields, real_render = loop_mod._info_fields, PromptConfig.render
    monkeypatch.setattr(loop_mod, "_info_fields", lambda info: built.append(1) or real_fields(info))
    monkeypatch.setattr(PromptConfig, "render", lambda self, *a, **k: renders.append(a[0]) or real_render(self, *a, **k))
    loop_mod._check_template_keys.cache_clear()
    chat = ChatFormat.from_tokenizer(tokenizer)
    pool = _objects_pool(tmp_path, monkeypatch, 2)
    prompt = PromptConfig(system="S", first_turn="{task}: {obs} ({objects})")
    loop = AgentLoop(pool, chat, prompt, ActionParser(), SamplingParams(max_new_tokens=16, stop_token_ids=chat.stop_token_ids), max_turns=1,
                     max_context_tokens=2048)
    trajs = loop.run([EpisodeSpec(i, "a", "train") for i in range(4)], ScriptedPolicy(chat, ["<action>go</action>"]))
    assert [t.transcript[0]["user"] for t in trajs] == ["goal: start (cup, key)"] * 4
    assert renders == ["first_turn"] * 4 and len(built) == 4                 # one build per render, none more
    info = loop_mod._check_template_keys.cache_info()
    assert (info.misses, info.hits) == (1, 3)                                # one key set: checked once
    pool.close()


def test_the_template_check_runs_again_for_other_info_keys(tokenizer, tmp_path, monkeypatch):
    """Cached per key set, not per prompt: a later reset whose info lacks a key the template names
    (task "b" has no objects) is still refused in one line at that reset, before its first turn."""
    from agentq.config import ConfigError

    chat = ChatFormat.from_tokenizer(tokenizer)
    pool = _objects_pool(tmp_path, monkeypatch, 1)
    prompt = PromptConfig(system="S", first_turn="{obs} ({objects})")
    loop = AgentLoop(pool, chat, prompt, ActionParser(), SamplingParams(max_new_tokens=16, stop_token_ids=chat.stop_token_ids), max_turns=1,
                     max_context_tokens=2048)
    policy = ScriptedPolicy(chat, ["<action>go</action>"])
    with pytest.raises(ConfigError) as e:
        loop.run([EpisodeSpec(0, "a", "train"), EpisodeSpec(1, "b", "train")], policy)
    assert str(e.value) == ("env.prompt.first_turn='{obs} ({objects})' names {objects}, which the environment's info "
                            "at reset does not have; available: ['actions', 'obs', 'score', 'split', 'steps', 'task', "
                            "'task_id', 'won']")
    assert policy.i == {0: 1}                                                # episode 1 never got a turn
    with pytest.raises(ConfigError, match="names {objects}"):               # the error is not cached away
        prompt.check_fields({"task": "goal"})
    pool.close()
    # a key the info has, with a value a template cannot hold: said so, not "does not have"
    with pytest.raises(ConfigError) as e:
        prompt.check_fields({"task": "goal", "objects": {"cup": 1}})
    assert str(e.value) == ("env.prompt.first_turn='{obs} ({objects})' names {objects}, whose value in the "
                            "environment's info is a dict, not a str, number or list; available: ['actions', "
                            "'obs', 'task']")


def test_an_episode_whose_reset_was_retried_on_a_restarted_worker_says_so(tokenizer, monkeypatch):
    """A reset the pool retried on a restarted worker (`EnvResult.recovered`) is played like any other,
    and its trajectory keeps what happened (`info["env_recovered"]`); the others have no such entry."""
    chat, loop = make_loop(tokenizer, max_turns=1)
    note = "env worker 0 died (exit code -9); restarted; the reset was retried on it (no episode had started)"
    reset = loop.pool.reset

    def recovered_on_slot_0(items):
        out = reset(items)
        for r in out:
            r.recovered = note if r.slot == 0 else None
        return out
    monkeypatch.setattr(loop.pool, "reset", recovered_on_slot_0)
    a, b = loop.run([EpisodeSpec(0, "coin/1", "train"), EpisodeSpec(1, "coin/2", "train")],
                    ScriptedPolicy(chat, ["<action>look around</action>"]))
    assert {a.end_reason, b.end_reason} == {"step_cap"} and a.turns == b.turns == 1
    assert [t.info.get("env_recovered") for t in (a, b)].count(note) == 1


class BrokenPolicy(ScriptedPolicy):
    """A backend that breaks the `generate` contract one way (a reviewer's plugin backend did each)."""

    vocab_size = 1000

    def __init__(self, chat, fault):
        super().__init__(chat, ["<action>look around</action>"] * 3)
        self.fault = fault

    def __call__(self, requests, infos):
        out = super().__call__(requests, infos)
        if out[0].episode_id != 0:      # episode 0's turns only: the others play on
            return out
        r, f = out[0], self.fault
        if f == "few_results":
            return out[1:]
        if f == "reorder":
            return out[::-1]
        if f == "short_logp":
            r.logprobs = r.logprobs[:-1]
        elif f == "pos_logp":
            r.logprobs[1] = 0.7
        elif f == "overlong":
            r.token_ids, r.logprobs = r.token_ids * 3, r.logprobs * 3
        elif f == "reason":
            r.finish_reason = "eos"
        elif f == "length_on_stop":
            r.finish_reason = "length"
        elif f == "stop_without_stop_token":
            r.token_ids[-1] = 7
        elif f == "oov":
            r.token_ids[0] = 1000
        elif f == "float_id":
            r.token_ids[0] = 5.0
        return out


@pytest.mark.parametrize("fault", ["few_results", "reorder"])
def test_a_backend_whose_results_do_not_pair_with_the_requests_stops_the_run(tokenizer, fault):
    """One result missing made the loop ask for that episode's turn forever; results out of order put
    turns into other episodes' trajectories. Both stop the run, naming the backend."""
    chat, loop = make_loop(tokenizer, max_turns=3)
    with pytest.raises(RunAborted, match=r"^the rollout backend BrokenPolicy returned .*generate\(\) must return one "
                                         r"TurnResult per request, in order$"):
        loop.run([EpisodeSpec(0, "coin/1", "train"), EpisodeSpec(1, "coin/1", "train")], BrokenPolicy(chat, fault))


@pytest.mark.parametrize("fault, said", [
    ("short_logp", "the rollout backend returned 9 token ids and 8 log-probs of turn 1"),
    ("pos_logp", "the rollout backend returned a behaviour log-prob 0.7 > 0 (no probability's) at token 1 of turn 1"),
    ("overlong", "the rollout backend returned 27 tokens (1 to sampling.max_new_tokens 16) of turn 1"),
    ("reason", "the rollout backend returned finish_reason 'eos' (valid: stop, stop_string, length, error) of turn 1"),
    ("length_on_stop", "the rollout backend returned finish_reason 'length' with a stop token last (id {eos}): a turn "
                       "ends with 'stop' exactly when its last token is one of sampling.stop_token_ids [{eos}] of turn 1"),
    ("stop_without_stop_token", "the rollout backend returned finish_reason 'stop' with no stop token last (id 7)"),
    ("oov", "the rollout backend returned token id 1000 (not an int in [0, 1000)) at token 0 of turn 1"),
    ("float_id", "the rollout backend returned token id 5.0 (not an int in [0, 1000)) at token 0 of turn 1"),
])
def test_a_turn_that_breaks_the_backend_contract_loses_its_episode_openly(tokenizer, fault, said):
    """Each of these trained on garbage, broke the token layout or crashed in the learner far from its
    cause; now the episode ends as an error that says what the backend returned, and the others play on."""
    chat, loop = make_loop(tokenizer, max_turns=3)
    assert len(chat.encode("<action>look around</action>")) + 1 == 9      # the lengths `said` counts
    a, b = loop.run([EpisodeSpec(0, "coin/1", "train"), EpisodeSpec(1, "coin/1", "train")], BrokenPolicy(chat, fault))
    assert (a.end_reason, a.turns) == ("error", 0)
    assert a.error.startswith(said.format(eos=chat.stop_token_ids[0]))
    assert b.end_reason == "step_cap" and b.turns == 3
