"""Hostile input at every registered env: actions that are not valid Unicode, hold control
characters or are huge become a handled invalid turn (never reaching a JVM), bad `reset` options
are a TypeError/ValueError naming them, `step()` after `close()` is `EnvClosedError`; a property
test throws random strings and option dicts at reset/step and gets a valid 5-tuple or one of the
contract's documented exceptions, never a dead JVM. WebShop's web view answers a bad replay step
with HTTP 400."""
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentq.envs
from agentq.envs import EnvClosedError, EpisodeOverError, UnknownTaskError

REPO = Path(__file__).resolve().parents[2]
#: what reset/step may raise on bad input (envs/base.py's contract); EnvCrashedError is not among
#: them here: every input below must leave the engine alive
DOCUMENTED = (TypeError, ValueError, UnknownTaskError, EpisodeOverError, EnvClosedError)


def make_env(name: str, tmp_path_factory):
    cfg = yaml.safe_load((REPO / "conf" / "env" / f"{name}.yaml").read_text())
    kwargs = dict(cfg["kwargs"])
    if name == "alfworld":
        kwargs["cache_dir"] = str(tmp_path_factory.mktemp("alfworld-cache"))
    return agentq.envs.make(name, split=cfg["train_split"], max_steps=6, **kwargs)


def jvm_pid(env) -> int | None:
    """The pid of the JVM behind `env` (None for engines without one)."""
    u = env.unwrapped
    if type(u).__name__ == "TextWorldExpressEnv":
        return u._env._gateway.java_process.pid
    if type(u).__name__ == "ScienceWorldEnv":
        return u._host.pid
    return None


@pytest.fixture(scope="module", params=sorted(agentq.envs.REGISTRY))
def env(request, tmp_path_factory):
    e = make_env(request.param, tmp_path_factory)
    e.reset(seed=0)
    yield e
    e.close()


HOSTILE = {
    "lone surrogate": "take \udcff",
    "invalid UTF-8 (surrogateescape)": b"go \xff\xfe".decode("utf-8", "surrogateescape"),
    "NUL": "look\x00around",
    "escape": "\x1b[2Jlook",
    "over-long": "look " * 20_001,
}


@pytest.mark.parametrize("what", sorted(HOSTILE))
def test_hostile_actions_are_handled_turns(env, what):
    env.reset(seed=1)
    pid, steps = jvm_pid(env), env.unwrapped.num_steps
    obs, reward, terminated, truncated, info = env.step(HOSTILE[what])
    assert obs.startswith("Invalid action: the action") and info["invalid_action"] in obs
    assert reward == 0.0 and not terminated and env.unwrapped.num_steps == steps + 1
    assert jvm_pid(env) == pid
    env.step("look around")                      # the engine still answers


def test_actions_at_the_length_limit_still_reach_the_engine(env):
    env.reset(seed=1)
    limit = env.unwrapped.action_space.max_length
    assert "invalid_action" not in env.step("l" * limit)[4]
    assert "invalid_action" in env.step("l" * (limit + 1))[4]


@pytest.mark.parametrize("options, error", [
    ("str", "must be a dict"), (["task_id"], "must be a dict"),
    ({"task_id": ["x"]}, "'task_id' must be a str, got list"), ({"split": 3}, "'split' must be a str, got int"),
    ({"task_id": "x", "seed": 1}, "unknown reset option"),
])
def test_bad_reset_options_are_named(env, options, error):
    with pytest.raises((TypeError, ValueError), match=error):
        env.reset(options=options)


def test_step_after_close_is_a_clear_error(tmp_path_factory):
    e = make_env("textworld_express", tmp_path_factory)
    e.reset(seed=0)
    e.close()
    with pytest.raises(EnvClosedError, match="step\\(\\) called after close\\(\\)"):
        e.step("look around")
    e.reset(seed=0)                                # a reset starts over
    assert isinstance(e.step("look around")[0], str)
    e.close()


# ------------------------------------------------------------------------------ property test
any_char = st.characters(exclude_categories=())                     # surrogates and controls included
ACTIONS = st.one_of(
    st.text(any_char, max_size=40),
    st.binary(max_size=30).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.sampled_from(["", " ", "look around", "take coin", "inventory", "go to cabinet 1", "click[buy now]",
                     "search[red shirt]", "move east"]),
    st.integers(9_995, 10_005).map(lambda n: "x" * n),              # around the length limit
    st.just("é" * 200_000),
)
VALUES = st.one_of(st.none(), st.text(any_char, max_size=12), st.integers(), st.lists(st.text(max_size=3), max_size=2),
                   st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
OPTIONS = st.one_of(
    st.none(), st.text(max_size=5), st.integers(), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["task_id", "split", "seed", "x"]), VALUES, max_size=3),
)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_input_gives_a_tuple_or_a_documented_error(env, data):
    pid = jvm_pid(env)
    u = env.unwrapped
    tasks = u.list_tasks(u.splits[0])[:5]
    options = data.draw(st.one_of(OPTIONS, st.sampled_from(tasks).map(lambda t: {"task_id": t})), label="options")
    try:
        obs, info = env.reset(options=options)
        assert isinstance(obs, str) and isinstance(info, dict)
    except DOCUMENTED:
        env.reset(options={"task_id": tasks[0]})
    for action in data.draw(st.lists(ACTIONS, min_size=1, max_size=3), label="actions"):
        try:
            out = env.step(action)
        except DOCUMENTED:
            continue
        obs, reward, terminated, truncated, info = out
        assert isinstance(obs, str) and isinstance(reward, float) and isinstance(info, dict)
        assert isinstance(terminated, bool) and isinstance(truncated, bool)
        if terminated or truncated:
            break
    assert jvm_pid(env) == pid                  # the JVM that served the episode is the one still running


# ------------------------------------------------------------------------------ WebShop web view
def test_webshop_replay_with_a_bad_step_is_a_400():
    from agentq.envs.webshop.web import create_app

    cfg = yaml.safe_load((REPO / "conf" / "env" / "webshop.yaml").read_text())
    app = create_app(**cfg["kwargs"], split="test")
    client = app.test_client()
    task = app.config["webshop_env"].list_tasks("test")[0]
    bad = client.get(f"/replay/test/{task}?actions=%5B%22search%5Bshirt%5D%22%5D&step=abc")
    assert bad.status_code == 400 and b"step must be an integer" in bad.data
    ok = client.get(f"/replay/test/{task}?actions=%5B%22search%5Bshirt%5D%22%5D&step=1")
    assert ok.status_code == 200
