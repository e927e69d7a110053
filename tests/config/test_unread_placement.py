"""`agentq eval` and `agentq sft` read no placement.*: a train command line's placement= must not stop
them (commit 8b32a65), but it is said in one line instead of running one engine without a word."""
import pytest

from agentq.config import load_config


@pytest.mark.parametrize("command,runs", [("eval", "agentq eval runs one engine"),
                                          ("sft", "agentq sft trains in this process")])
def test_a_placement_eval_and_sft_do_not_read_is_warned_of(command, runs, capsys):
    cfg = load_config(["placement=split"], command=command)
    assert cfg.placement.mode == "split"                     # loaded, not refused
    said = capsys.readouterr().err.strip()
    assert said == f"warning: placement=split is read by agentq train / pipeline only; {runs}"
    load_config(["placement.mode=colocated"], command=command)
    assert "placement=colocated is read by agentq train / pipeline only" in capsys.readouterr().err


def test_no_warning_where_placement_is_read_or_left_alone(capsys):
    load_config(["placement=split"], command="train")
    load_config([], command="eval")
    load_config(["placement=single"], command="eval")
    assert capsys.readouterr().err == ""
