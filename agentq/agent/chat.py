"""Token-level chat rendering: prompts, observations and template tokens appended as ids.

`ChatFormat` derives the pieces a multi-turn episode needs from the tokenizer's own chat
template, by rendering one conversation with sentinel contents and cutting it at the sentinels:

    [prefix][system][sys→user][first user msg][gen prompt]   ← prompt
    A_1 (sampled by the engine, ending in the stop token)
    [after assistant][observation 1][gen prompt]             ← appended by the framework
    A_2 ...

Sampled tokens are never decoded and re-encoded: the context is the exact id sequence the engine
produced and consumed. Only text the framework inserts (observations, template pieces) is
encoded, piece by piece, identically for rollout, SFT and learner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_S, _U1, _A1, _U2 = "\x00SYS\x00", "\x00USER1\x00", "\x00ASSIST1\x00", "\x00USER2\x00"


@dataclass
class ChatFormat:
    """The chat template's pieces as token ids (module docstring), and the tokenizer that encodes
    the framework's own text."""

    tokenizer: Any
    prefix: list[int]
    sys_to_user: list[int]
    gen_prompt: list[int]           # end of a user message + start of the assistant's turn
    after_stop: list[int]           # after a sampled stop token, before the next user content
    after_length: list[int]         # same, when the turn hit max_new_tokens without a stop token
    stop_token_ids: tuple[int, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatFormat:
        """Cut the tokenizer's chat template into pieces.

        Args:
            tokenizer: an HF tokenizer with a `chat_template` and an `eos_token`.
        Returns:
            The `ChatFormat`; raises ValueError if the template is not append-only.
        """
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat_template; agentq needs one to render turns")
        msgs = [{"role": "system", "content": _S}, {"role": "user", "content": _U1},
                {"role": "assistant", "content": _A1}, {"role": "user", "content": _U2}]
        text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        i_s, i_u1, i_a1, i_u2 = (text.index(x) for x in (_S, _U1, _A1, _U2))
        prefix = text[:i_s]
        sys_to_user = text[i_s + len(_S): i_u1]
        gen_prompt = text[i_u1 + len(_U1): i_a1]
        after_assistant = text[i_a1 + len(_A1): i_u2]
        tail = text[i_u2 + len(_U2):]
        if tail != gen_prompt:
            raise ValueError("chat template is not append-only (the generation prompt after the second user "
                             f"message differs from the first: {tail!r} vs {gen_prompt!r}); agentq needs token-in/"
                             "token-out rendering")
        eos = tokenizer.eos_token
        if eos is None or not after_assistant.startswith(eos):
            raise ValueError(f"cannot find the end-of-turn token ({eos!r}) after the assistant content in the "
                             f"chat template: {after_assistant!r}")
        enc = lambda s: tokenizer.encode(s, add_special_tokens=False) if s else []  # noqa: E731
        return cls(tokenizer, enc(prefix), enc(sys_to_user), enc(gen_prompt), enc(after_assistant[len(eos):]),
                   enc(after_assistant), (tokenizer.eos_token_id,))

    def encode(self, text: str) -> list[int]:
        """Ids of framework text (no special tokens added; [] for "")."""
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def prompt(self, system: str, user: str) -> list[int]:
        """Ids of [system][first user message] ending with the assistant's generation prompt."""
        return self.prefix + self.encode(system) + self.sys_to_user + self.encode(user) + self.gen_prompt

    def next_user(self, text: str, stopped: bool) -> list[int]:
        """Ids appended after an assistant turn: close the turn, the user message, the generation prompt.

        stopped: the assistant's tokens ended with a sampled stop token (else the framework closes the turn)."""
        return (self.after_stop if stopped else self.after_length) + self.encode(text) + self.gen_prompt

    def decode(self, ids: list[int]) -> str:
        """Readable text of sampled ids (for parsing the action; never re-encoded)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)
