"""`agentq.utils.errors.first_line`: the line of an error's text a one-line message quotes."""
import pytest

from agentq.utils.errors import first_line


@pytest.mark.parametrize("given, limit, line", [
    (ValueError("bad value"), None, "bad value"),
    (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported\n"), None,
     "CUDA error: out of memory"),
    (RuntimeError(), None, ""),                                     # no text: "", not an IndexError
    (KeyError("k"), None, "'k'"),                                   # str() of the error, as a message has it
    ("\n\n  Traceback (most recent call last):\n  File ...", None, "Traceback (most recent call last):"),
    ("first  \r\nsecond", None, "first"),
    (" \n\t\n", None, ""),
    ("", None, ""),
    (None, None, ""),                                              # an episode that recorded no error
    ("x" * 500 + "\nrest", 300, "x" * 300),
    ("short\nrest", 300, "short"),
    ("  \n  No space left on device (os error 28)  \n", 200, "No space left on device (os error 28)"),
])
def test_first_line_by_hand(given, limit, line):
    assert first_line(given, limit) == line
