"""What the docs say of a setting's default or of a recorded value is what the code does: a newcomer
reads `eval.json`'s `sampling.seed` and the resume rules there, not in the source."""
from __future__ import annotations

import re
from pathlib import Path

from agentq.config import load_config

REPO = Path(__file__).resolve().parents[2]


def section(doc: str, heading: str) -> str:
    """The text of `doc` (a file under REPO) from `heading` to the next heading of its level or above."""
    text = (REPO / doc).read_text()
    start = text.index(heading)
    level = heading.split(" ", 1)[0]
    end = re.search(rf"^#{{1,{len(level)}}} ", text[start + len(heading):], re.M)
    return " ".join(text[start:start + len(heading) + end.start() if end else None].split())


def test_the_evaluation_seed_in_eval_json_is_explained():
    """`sampling.seed` read 1 at seed=0 (the evaluation seed is `seed` + 1) and no doc said why."""
    from agentq.eval.evaluate import eval_seed

    said = section("docs/evaluation.md", "## Decoding")
    assert eval_seed(load_config([])) == 1 and eval_seed(load_config(["seed=4"])) == 5
    assert "The evaluation seed is `seed` + 1 (`sampling.seed` reads 1 at the default `seed=0`)" in said


def test_the_resume_rules_say_when_a_run_saves_a_checkpoint():
    """The README and docs/outputs.md promised a resume "from the latest checkpoint" without naming
    trainer.save_every, then 0: an interrupted default run had none."""
    t = load_config([]).trainer
    said = section("docs/outputs.md", "## Resuming (`trainer.resume`)")
    assert (f"A run saves a checkpoint every `trainer.save_every` steps ({t.save_every}; 0: only at the end) and at "
            "its end") in said
    assert f"`trainer.keep_checkpoints` ({t.keep_checkpoints}; 0: all)" in said
    readme = " ".join((REPO / "README.md").read_text().split())
    assert (f"one every `trainer.save_every` = {t.save_every} steps and at the end, the last `trainer.keep_checkpoints` "
            f"= {t.keep_checkpoints} kept") in readme
