"""Turning the policy's text into an environment action."""
from __future__ import annotations

import re


class ActionParser:
    """Extracts the action from `<action>...</action>` (tag configurable).

    Returns None when the text has no complete tag: the agent loop then answers with format
    feedback, as a turn, without stepping the environment. Surrounding text (reasoning) is
    allowed; the last tagged action counts."""

    def __init__(self, tag: str = "action", max_chars: int = 300):
        if not re.fullmatch(r"[A-Za-z_][\w-]*", tag):
            raise ValueError(f"invalid action tag {tag!r}")
        self.tag = tag
        self.close = f"</{tag}>"
        self.max_chars = max_chars
        self._re = re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL)

    def parse(self, text: str) -> str | None:
        """The action of an assistant turn.

        Args:
            text: the decoded turn.
        Returns:
            The last tagged action, whitespace-collapsed; None if there is none, it is empty or too long.
        """
        found = self._re.findall(text)
        if not found:
            return None
        action = " ".join(found[-1].split())
        if not action or len(action) > self.max_chars:
            return None
        return action

    def format(self, action: str) -> str:
        """`action` wrapped in the tag, as the policy should write it (expert demonstrations)."""
        return f"<{self.tag}>{action}{self.close}"
