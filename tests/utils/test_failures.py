"""The give-up rule the env pools and the rollout workers share (`FailureCounts`): failures of one worker
in a row, each command counted on its own, end the run with one line naming the worker, the count and the
last cause; a completed call or start starts its count again."""
import pytest

from agentq.utils.errors import RunAborted
from agentq.utils.failures import FailureCounts


def counts() -> FailureCounts:
    return FailureCounts(limit=3, name=lambda w: f"env worker {w} (x)")


def test_calls_of_one_command_in_a_row_give_up_whatever_other_commands_complete():
    f = counts()
    for _ in range(2):
        f.call_failed(1, "step", "died (exit code 3)")
        f.call_completed(1, "reset")            # a restarted worker's resets: not a completed step
        f.raise_if_given_up()
    f.call_failed(0, "step", "hung")            # another worker's count is its own
    f.call_failed(1, "step", "died (exit code 9)")
    with pytest.raises(RunAborted) as e:
        f.raise_if_given_up()
    assert str(e.value) == ("env worker 1 (x) died or hung in 3 step calls in a row without completing one "
                            "(restarted after each); giving up: died (exit code 9)")


def test_a_completed_call_starts_its_count_again():
    f = counts()
    for ok in (False, False, True, False, False):
        f.call_completed(0, "step") if ok else f.call_failed(0, "step", "died")
    f.raise_if_given_up()
    assert f.failed_calls == {(0, "step"): (2, "died")}


def test_failed_starts_in_a_row_give_up_and_a_start_that_works_clears_them():
    f = counts()
    f.start_ended(2, "RuntimeError: no")
    f.start_ended(2, "RuntimeError: still no")
    assert f.down == {2: "RuntimeError: still no"}
    f.start_ended(2, None)                      # up again: neither down nor counted
    assert (f.down, f.failed_starts) == ({}, {})
    for n in range(3):
        f.start_ended(2, f"RuntimeError: try {n}")
    with pytest.raises(RunAborted, match=r"^env worker 2 \(x\) could not be started 3 times in a row; giving up: "
                                         r"RuntimeError: try 2$"):
        f.raise_if_given_up()
