"""`out_of_memory_hint`: the original error's text first, then the hint; the hint is computed only
when the block fails; other errors pass through untouched."""
import pytest
import torch

from agentq.utils.memory import out_of_memory_hint


def test_the_hint_follows_the_original_text_and_keeps_it_as_the_cause():
    with pytest.raises(torch.OutOfMemoryError) as err:
        with out_of_memory_hint(lambda: "lower x"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert str(err.value) == "CUDA out of memory. Tried to allocate 2.00 GiB.\n\nlower x"
    assert str(err.value.__cause__) == "CUDA out of memory. Tried to allocate 2.00 GiB."


def test_the_hint_is_computed_only_on_failure_and_other_errors_pass_through():
    calls = []
    with out_of_memory_hint(lambda: calls.append(1) or "hint"):
        pass
    with pytest.raises(ValueError, match="^bad$"):
        with out_of_memory_hint(lambda: calls.append(1) or "hint"):
            raise ValueError("bad")
    assert calls == []
