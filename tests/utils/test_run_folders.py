"""agentq/utils/run_folders.py: whose folder a folder is, from the files each command writes at its top."""
from pathlib import Path

import pytest

from agentq.utils.run_folders import folder_owners


def folder(tmp_path: Path, *names: str) -> Path:
    for name in names:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if name in ("checkpoints", "rl", "sft", "tb") else path.write_text("{}")
    return tmp_path


@pytest.mark.parametrize("names, owners", [
    ((), []),
    (("eval.json", "episodes.jsonl"), [(("eval",), ["eval.json", "episodes.jsonl"])]),
    (("episodes.partial.jsonl",), [(("eval",), ["episodes.partial.jsonl"])]),
    # a train run an older agentq let `agentq eval eval.out_dir=<it>` write into: one train marker
    # against three of an evaluation's, and still the train run's (a resume of it was refused)
    (("checkpoints", "eval.json", "episodes.jsonl", "episodes.partial.jsonl"), [(("train",), ["checkpoints"])]),
    # the same before its first checkpoint: a train or SFT run cut short
    (("config.yaml", "metrics.jsonl", "eval.json"), [(("train", "sft"), ["metrics.jsonl", "config.yaml"])]),
    (("summary.json", "rl", "checkpoints"), [(("pipeline",), ["summary.json", "rl"])]),
])
def test_whose_folder(tmp_path, names, owners):
    assert folder_owners(folder(tmp_path, *names)) == owners
