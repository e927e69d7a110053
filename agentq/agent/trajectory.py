"""The trajectory record: one episode as one token stream, with per-token and per-episode data."""
from __future__ import annotations

from dataclasses import dataclass, field

END_REASONS = ("won", "failed", "step_cap", "context", "error")


@dataclass
class Trajectory:
    """One episode: its token stream with per-token masks, and its outcome."""

    episode_id: int
    task_id: str
    split: str
    group_id: int = 0
    # per token (same length): exact ids the engine produced/consumed
    input_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)   # 1 iff sampled by the rollout engine
    seg_id: list[int] = field(default_factory=list)        # turn index s ≥ 1 on action tokens, else 0
    rollout_logp: list[float] = field(default_factory=list)  # log μ(token) on action tokens, else 0
    # per episode
    reward: float = 0.0              # sum of environment rewards (+ format penalties)
    won: bool = False
    score: float = 0.0
    turns: int = 0                   # assistant turns (= action segments)
    invalid_actions: int = 0         # turns whose text had no parsable action
    inadmissible_actions: int = 0    # parsed actions not in the env's admissible list (when it gives one)
    admissible_turns: int = 0        # turns whose env gave an admissible list (where the above is measured)
    end_reason: str = ""             # one of END_REASONS
    error: str | None = None
    policy_version: int = 0
    info: dict = field(default_factory=dict)     # e.g. task_type
    transcript: list[dict] = field(default_factory=list)  # readable log: [{"action": .., "obs": ..}]

    def append(self, ids: list[int], sampled: bool, seg: int = 0, logps: list[float] | None = None) -> None:
        """Add tokens to the stream.

        Args:
            ids: the tokens.
            sampled: True for the policy's turn (action tokens), False for framework text.
            seg: the turn index s ≥ 1 of sampled tokens.
            logps: the rollout log-prob of each sampled token (required when sampled).
        """
        n = len(ids)
        if sampled and logps is None:
            raise ValueError("sampled tokens need their rollout log-probs (logps)")
        self.input_ids += ids
        self.action_mask += [1 if sampled else 0] * n
        self.seg_id += [seg if sampled else 0] * n
        self.rollout_logp += list(logps) if sampled and logps is not None else [0.0] * n

    @property
    def num_tokens(self) -> int:
        """Length of the token stream."""
        return len(self.input_ids)

    @property
    def num_action_tokens(self) -> int:
        """Tokens the policy sampled."""
        return sum(self.action_mask)
