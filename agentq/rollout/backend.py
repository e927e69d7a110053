"""The rollout-backend protocol: what the agent loop needs from an inference engine.

Backends see token ids only. Multi-turn logic (chat rendering, observations, masks) lives above
them in `agentq.agent`; a backend turns a batch of `TurnRequest`s (one assistant turn of one
episode each, with the episode's full context so far) into `TurnResult`s carrying the sampled
ids and the behaviour policy's log-prob of every sampled token.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

import torch

from agentq.kernels.quant_spec import QuantSpec


@dataclass(frozen=True)
class SamplingParams:
    """Temperature-only sampling (top_p=1, top_k=-1) keeps log-probs exact for RL: the learner
    reproduces the same distribution. Top-p/top-k renormalise, and the reported log-probs are
    those of the truncated distribution actually sampled from. top_k -1 or 0 (vLLM's convention)
    keeps the whole vocabulary."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    # text that ends the turn once generated (e.g. "</action>"): the token completing it is the
    # turn's last, and the framework closes the turn (vLLM's `stop`); needs the engine's tokenizer
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        # vLLM takes `stop="</action>"`; iterated as a tuple, a plain string would stop on each character
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        # NaN passes every comparison below unnoticed (the samplers would read it as temperature 1),
        # and an infinite temperature samples uniformly: both refused
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be finite and ≥ 0 (0 = greedy), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be an int ≥ 1, or -1 / 0 for no truncation, got {self.top_k!r}")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int ≥ 1, got {self.max_new_tokens!r}")
        if any(not isinstance(x, str) or not x for x in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")


def _is_int(x: object) -> bool:
    """An integer (Python's or numpy's), not a bool or a float."""
    return _is_int_type(type(x))


def _is_int_type(t: type) -> bool:
    return issubclass(t, numbers.Integral) and not issubclass(t, bool)


@dataclass
class TurnRequest:
    episode_id: int
    context_ids: list[int]           # prompt + earlier turns + observations, exactly as tokens
    sampling: SamplingParams
    seed: int | None = None          # per-episode sampling seed (reproducible whatever the batch)

    def __post_init__(self):
        # a seed the samplers cannot take (a float, ≥ 2⁶³) would otherwise fail inside generate(),
        # after the episode took its KV slot
        if self.seed is not None:
            if not _is_int(self.seed) or not -2 ** 63 <= self.seed < 2 ** 63:
                raise ValueError(f"episode {self.episode_id}: seed must be a 64-bit signed int or None, "
                                 f"got {self.seed!r}")
            self.seed = int(self.seed)


@dataclass
class TurnResult:
    episode_id: int
    token_ids: list[int]
    logprobs: list[float]            # log μ(token) under the distribution sampled from, fp32
    finish_reason: str               # "stop": a stop token was sampled (and is included);
                                     # "stop_string": the last token completed a stop string; "length";
                                     # "error": the backend lost the episode (a dead rollout worker)
    policy_version: int = 0
    error: str | None = None         # why, for finish_reason "error" (the episode is reported as errored)


@dataclass
class SyncStats:
    """What a weight update did (logged every step)."""

    version: int
    int8_codes_changed: float | None = None   # fraction of int8 weight codes that changed
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)   # the backend's own numbers: logged as sync/<name> (text is not)


@runtime_checkable
class RolloutBackend(Protocol):
    """An inference engine the agent loop can play episodes on (through `BackendPolicy`) and the
    trainer can sync weights into. The built-in backends subclass it explicitly (`TorchEngine`,
    `VLLMBackend`, `DistributedBackend`), so the type checker holds each to these signatures; a
    subclass that leaves out `generate`, `score`, `update_weights` or `release` raises when it is
    called (`kv_bytes_per_token`, `prefill_counts` and `vocab_size` have defaults: 0, {}, None).
    `agentq.rollout.contract.check_backend` runs the contract against a live backend.
    """

    quant: QuantSpec
    policy_version: int
    #: the model's vocabulary size: the agent loop refuses sampled ids outside it (None: unknown, ids
    #: are checked ≥ 0 only); the built-in backends set it
    vocab_size: int | None = None

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        """One assistant turn for each request.

        Args:
            requests: one per episode (episodes distinct), each with its whole context so far.
        Returns:
            One `TurnResult` per request, in order.
        """
        raise NotImplementedError(f"{type(self).__name__}.generate: a rollout backend must sample turns")

    def score(self, context_ids: list[int], target_ids: list[int]) -> list[float]:
        """Teacher-forced log-probs through the rollout numerics.

        Args:
            context_ids: the tokens before; target_ids: the tokens scored.
        Returns:
            log μ(target_ids[i] | context, target_ids[:i]) for each i.
        """
        raise NotImplementedError(f"{type(self).__name__}.score")

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> SyncStats:
        """Load new weights; quantized backends requantize with fresh scales.

        Args:
            named_tensors: (HF parameter name, full-precision tensor) pairs.
            version: the policy version the next turns report.
        Returns:
            What the sync did (`SyncStats`).
        """
        raise NotImplementedError(f"{type(self).__name__}.update_weights: a rollout backend must take the "
                                  "learner's weights")

    def release(self, episode_id: int) -> None:
        """Free the episode's KV slot / prefix (a no-op for an unknown episode)."""
        raise NotImplementedError(f"{type(self).__name__}.release: a rollout backend must free ended episodes")

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token of context costs (all layers, K and V, scales included); 0: not counted."""
        return 0

    def prefill_counts(self) -> dict[str, int]:
        """Context tokens of every `generate` so far: `prefill_computed_tokens` ran through a
        prefill forward, `prefill_cached_tokens` took their K/V from a cache instead (the episode's
        own from an earlier turn, or another episode's shared prefix), and where the backend tells
        them apart `prefill_shared_tokens`, those of the cached that came from another episode.
        The torch engine adds `prefill_graph_replays` / `prefill_graph_captures` /
        `prefill_graph_uncaptured`: prefill chunks replayed from CUDA graphs, graphs captured (a
        bucket seen for the first time), and chunks run eagerly because their bucket came after
        the cap on graphs (`prefill_graph_max`).
        Empty where the backend does not count them.

        Returns:
            The counts, monotone over the backend's life (a restarted worker's are carried over its
            restart: `distributed.PrefillTally`).
        """
        return {}


# ---------------------------------------------------------------------- shared by the backends
def load_safetensors_dir(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of the `*.safetensors` files in an HF checkpoint folder, by name.

    Raises:
        CheckpointError: the folder has none (e.g. pytorch_model.bin only: a rollout backend reads no
            pickles), naming the folder and how to save it.
    """
    from pathlib import Path

    from safetensors.torch import load_file

    from agentq.utils.checkpoint import CheckpointError

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors weights in {path}: the rollout backends load the model from its "
                              "safetensors weights; save it with save_pretrained(folder) (safetensors, "
                              "transformers' default)")
    tensors = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def first_bad_token(ids: Sequence[Any], vocab: int) -> tuple[int, object] | None:
    """(position, value) of the first of `ids` that is not a token id of a `vocab`-token
    vocabulary, or None when all are. A token id is an int (Python's or numpy's) in [0, vocab): a
    float (5.0 too, which the engines would silently cast), a bool or a tensor element is not."""
    # whole contexts come every turn: the common case (all ints in range) is checked in C
    if all(_is_int_type(t) for t in set(map(type, ids))):
        if len(ids) == 0 or (min(ids) >= 0 and max(ids) < vocab):
            return None
    return next((i, x) for i, x in enumerate(ids) if not _is_int(x) or not 0 <= x < vocab)


#: `TurnResult.finish_reason`'s values
FINISH_REASONS = ("stop", "stop_string", "length", "error")
#: how far above 0 a reported log-prob may be (rounding of x - logsumexp(x)) before it is refused
LOGPROB_SLACK = 1e-3


def check_results(requests: list[TurnRequest], results: list[TurnResult], who: str) -> None:
    """Refuse a `generate` answer that does not pair with its requests: a result missing (its episode
    would never end: the agent loop asked again forever) or one out of order (turns appended to other
    episodes). A broken backend, not a lost episode: the run stops.

    Raises:
        RunAborted: naming the backend (`who`) and what it returned.
    """
    from agentq.utils.errors import RunAborted

    if len(results) != len(requests):
        raise RunAborted(f"the rollout backend {who} returned {len(results)} results for {len(requests)} requests; "
                         "generate() must return one TurnResult per request, in order")
    for k, (q, r) in enumerate(zip(requests, results)):
        if r.episode_id != q.episode_id:
            raise RunAborted(f"the rollout backend {who} returned result {k} for episode {r.episode_id} where request "
                             f"{k} is episode {q.episode_id}'s; generate() must return one TurnResult per request, "
                             "in order")


def turn_error(request: TurnRequest, result: TurnResult, vocab: int | None) -> str | None:
    """What is wrong with a turn a backend sampled, as the agent loop would record it (None: nothing).
    Each of these would train on garbage or break the token layout without a word: ids and log-probs
    of different lengths, an id the model cannot embed, a log-prob that is no probability's, more
    tokens than `max_new_tokens` (the context budget), an unknown finish reason, or one that
    disagrees with the last token (a sampled stop token is "stop", and only then: the chat template's
    end of turn follows from it).

    Args:
        vocab: the model's vocabulary size (`RolloutBackend.vocab_size`); None checks ids ≥ 0 only.
    """
    ids, lps, p = result.token_ids, result.logprobs, request.sampling
    if result.finish_reason not in FINISH_REASONS:
        return f"finish_reason {result.finish_reason!r} (valid: {', '.join(FINISH_REASONS)})"
    if len(ids) != len(lps):
        return f"{len(ids)} token ids and {len(lps)} log-probs"
    if not 1 <= len(ids) <= p.max_new_tokens:
        return f"{len(ids)} tokens (1 to sampling.max_new_tokens {p.max_new_tokens})"
    bad = first_bad_token(ids, vocab if vocab is not None else 2 ** 63)
    if bad is not None:
        return f"token id {bad[1]!r} (not an int in [0, {vocab if vocab is not None else '∞'})) at token {bad[0]}"
    for k, lp in enumerate(lps):
        if not isinstance(lp, numbers.Real) or isinstance(lp, bool):      # numpy's floats are Real
            return f"a behaviour log-prob that is no number ({lp!r}, a {type(lp).__name__}) at token {k}"
        if not math.isfinite(lp):
            return f"a non-finite behaviour log-prob ({lp}) at token {k}"
        if lp > LOGPROB_SLACK:
            return f"a behaviour log-prob {lp} > 0 (no probability's) at token {k}"
    on_stop_token = ids[-1] in p.stop_token_ids
    if (result.finish_reason == "stop") != on_stop_token:
        return (f"finish_reason {result.finish_reason!r} with {'a' if on_stop_token else 'no'} stop token last "
                f"(id {ids[-1]}): a turn ends with 'stop' exactly when its last token is one of "
                f"sampling.stop_token_ids {list(p.stop_token_ids)}")
    return None


def score_ids(context_ids: Sequence[Any], target_ids: Sequence[Any], vocab: int) -> list:
    """The ids a backend's `score()` runs (context + target), after refusing an empty context or an
    id that is not a token id (`first_bad_token`), by its position in context + target."""
    if len(context_ids) == 0:
        raise ValueError("score() needs a non-empty context (the first target token's log-prob "
                         "comes from the token before it)")
    ids = list(context_ids) + list(target_ids)
    bad = first_bad_token(ids, vocab)
    if bad is not None:
        raise ValueError(f"score(): token id at position {bad[0]} of context + target is {bad[1]!r}; "
                         f"token ids must be ints in [0, {vocab})")
    return ids


def check_requests(requests: list[TurnRequest], max_len: int, vocab: int) -> None:
    """Refuse a batch a backend cannot run: two turns of one episode, a context that leaves no room
    for a token within `max_len`, or context ids that are not token ids (not ints, or outside the
    vocabulary)."""
    if len({r.episode_id for r in requests}) != len(requests):
        raise ValueError("generate() got two requests for the same episode")
    for r in requests:
        if len(r.context_ids) + 1 > max_len:
            raise ValueError(f"episode {r.episode_id}: context of {len(r.context_ids)} tokens does not fit "
                             f"max_len={max_len}; the agent loop must end it (context budget)")
        if len(r.context_ids) == 0:
            raise ValueError(f"episode {r.episode_id}: context ids must be non-empty and in [0, {vocab})")
        bad = first_bad_token(r.context_ids, vocab)
        if bad is not None:
            raise ValueError(f"episode {r.episode_id}: context id at position {bad[0]} is {bad[1]!r}; "
                             f"token ids must be ints in [0, {vocab})")
