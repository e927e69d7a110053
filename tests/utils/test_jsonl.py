"""A run folder's JSON-lines files read back: a damaged line before the last, or a row without its step,
is a `RunFileError` (one line from the CLI: `agentq: ...`, exit status 2) naming the file and the line;
it was a ValueError / KeyError traceback."""
import json

import pytest

from agentq.utils.errors import RunFileError
from agentq.utils.jsonl import drop_rows_after, read_jsonl, read_step_rows


def test_a_garbled_middle_line_is_a_run_file_error_naming_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{garbage\n{"step": 2}\n')
    with pytest.raises(RunFileError, match=f"^{path}: line 2 is not JSON "):
        read_jsonl(path)
    path.write_text('{"step": 1}\n[1, 2]\n')
    with pytest.raises(RunFileError, match=f"^{path}: line 2 is not a JSON object: '\\[1, 2\\]'$"):
        read_jsonl(path)


def test_a_row_without_its_step_is_named_by_line(tmp_path):
    """A metrics row without "step" ended a resume with `KeyError: 'step'` (`drop_rows_after`)."""
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "loss": 0.5}, {"reward_mean": 0.0}, {"step": 3}]
    path.write_text("\n" + "".join(json.dumps(r) + "\n" for r in rows))       # a blank first line: still counted
    for read in (lambda: drop_rows_after(path, 1), lambda: read_step_rows(path)):
        with pytest.raises(RunFileError, match=f'^{path}: line 3 has no "step" number .*mend or remove that line$'):
            read()
    path.write_text('{"step": 1}\n{"step": 2}\n')
    drop_rows_after(path, 1)
    assert read_step_rows(path) == [{"step": 1}]
