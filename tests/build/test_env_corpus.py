"""`build.env_corpus`, the tiny model's tokenizer text: played in an env pool, so a hanging or raising
env is one line within env_pool.call_timeout_s (in the main process a hang froze every command that
builds the tiny model, with no output)."""
from __future__ import annotations

import time

import pytest
from omegaconf import OmegaConf

from agentq import build
from agentq.config import load_config
from agentq.utils.errors import RunAborted
from conftest import one_task_env

SOURCE = "import time\nfrom agentq.envs import TaskStep, TextEnv\n" + one_task_env("Base", ("train", "test"), """
    def _expert_action(self):
        return "go"
""") + '''

class Hangs(Base):
    def _step_task(self, action):
        time.sleep(3600)


class Raises(Base):
    def _step_task(self, action):
        raise RuntimeError("no such door")
'''


def corpus_cfg(tmp_path, monkeypatch, cls: str):
    (tmp_path / "corpus_env.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(["env_pool=process", "env_pool.call_timeout_s=2", "env.max_steps=3"])
    OmegaConf.update(cfg, "env.name", f"corpus_env:{cls}")
    OmegaConf.update(cfg, "env.kwargs", {}, merge=False)
    return cfg


def test_the_corpus_is_the_expert_episodes_text(tmp_path, monkeypatch):
    """System prompt, format feedback, then per episode: first turn, the expert's action in the
    agent's format, the observation's turn (the one task is won at the first action)."""
    cfg = corpus_cfg(tmp_path, monkeypatch, "Base")
    texts = build.env_corpus(cfg, 2)
    prompt = build.prompt_config(cfg)
    first = prompt.render("first_turn", "goal", "start", None, {"task": "goal"})
    then = prompt.render("next_turn", "goal", "end", None, {"task": "goal"}, 1)
    assert texts == [prompt.system, prompt.invalid_format] + [first, "<action>go</action>", then] * 2


@pytest.mark.parametrize("cls, why", [("Hangs", "env worker 0 hung: no answer to step of 1 slot(s) within 2 s"),
                                      ("Raises", "RuntimeError: no such door")])
def test_an_env_that_hangs_or_raises_while_the_corpus_is_played_is_one_line(tmp_path, monkeypatch, cls, why):
    cfg = corpus_cfg(tmp_path, monkeypatch, cls)
    t0 = time.monotonic()
    with pytest.raises(RunAborted) as e:
        build.env_corpus(cfg, 2)
    assert str(e.value).startswith("building the tiny model's tokenizer corpus: expert episode 0 (a) was lost: " + why)
    assert "\n" not in str(e.value) and time.monotonic() - t0 < 30
