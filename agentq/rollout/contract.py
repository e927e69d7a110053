"""`check_backend`: the `RolloutBackend` contract, run against a live backend.

A backend of one's own (`rollout.backend=module:Class`, docs/configuration.md) calls it in its own
tests; agentq's tests run it on the torch engine (and the vLLM backend where vLLM is installed).
What it checks is what the agent loop and the learner rely on:

* `generate` answers every request, in order, each turn valid (`backend.turn_error`: ids and
  log-probs of one length, ids in the vocabulary, log-probs ≤ 0, at most `max_new_tokens`, the
  finish reason agreeing with the last token);
* a seeded episode samples the same turn alone and beside other episodes (the learner's groups and
  a resumed run replay it);
* the behaviour log-probs are those of the distribution sampled from: `score` at temperature 1
  gives them again, to `logprob_atol`;
* `release` frees an episode (an unknown id is a no-op), and a released episode's id starts afresh;
* `update_weights` returns `SyncStats` of the version given, and the next turns report it.
"""
from __future__ import annotations

import math
from typing import Any

from .backend import RolloutBackend, SamplingParams, SyncStats, TurnRequest, TurnResult, check_results, turn_error


class ContractError(AssertionError):
    """A backend broke the contract: the message says which clause and what it returned."""


def check_backend(backend: RolloutBackend, contexts: list[list[int]], stop_token_ids: tuple[int, ...] = (),
                  weights: list[tuple[str, Any]] | None = None, logprob_atol: float = 1e-4) -> None:
    """Run the contract's clauses (module docstring) against `backend`.

    Args:
        backend: a fresh backend with free slots for `len(contexts) + 1` episodes.
        contexts: ≥ 2 prompts as token ids (episode ids 0.. are released, used, then released).
        stop_token_ids: the model's end-of-turn ids (the finish-reason clause needs them).
        weights: (name, tensor) pairs `update_weights` can take (its weights as they are); None skips
            the clause.
        logprob_atol: how far `score` may be from `generate`'s log-probs (the same numerics, another
            batch shape; reduced precision on a GPU needs more).
    Raises:
        ContractError: the first clause broken.
    """
    if len(contexts) < 2:
        raise ValueError("check_backend needs at least 2 contexts (one episode alone and beside another)")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=stop_token_ids)
    for i in range(len(contexts)):      # fresh episodes: a backend may seed each turn by its index in the episode
        backend.release(i)
    alone = _generate(backend, [TurnRequest(0, contexts[0], sampling, seed=11)])
    backend.release(0)
    together = _generate(backend, [TurnRequest(i, c, sampling, seed=11 + i) for i, c in enumerate(contexts)])
    if together[0].token_ids != alone[0].token_ids:
        raise ContractError(f"episode 0 (seed 11) sampled {alone[0].token_ids} alone and {together[0].token_ids} "
                            "beside other episodes: a seeded turn must not depend on the batch")
    for i, r in enumerate(together):
        scored = backend.score(contexts[i], r.token_ids)
        worst = max(abs(a - b) for a, b in zip(scored, r.logprobs))
        if len(scored) != len(r.token_ids) or not worst <= logprob_atol:
            raise ContractError(f"episode {i}: score() of its sampled tokens gave {scored}, generate() {r.logprobs} "
                                f"(max |Δ| {worst:.3g} > {logprob_atol:g}): the behaviour log-probs must be those "
                                "of the distribution sampled from")
    for i in range(len(contexts)):
        backend.release(i)
    backend.release(10 ** 9)            # an unknown id: a no-op
    if weights is not None:
        _check_update(backend, weights, contexts[0], sampling)


def _generate(backend: RolloutBackend, requests: list[TurnRequest]) -> list[TurnResult]:
    """`generate`, its answer checked as the agent loop checks it."""
    results = backend.generate(requests)
    try:
        check_results(requests, results, type(backend).__name__)
    except Exception as e:      # RunAborted in a run; here the contract's own error
        raise ContractError(str(e)) from None
    for q, r in zip(requests, results):
        why = turn_error(q, r, getattr(backend, "vocab_size", None))
        if why is not None or r.finish_reason == "error":
            raise ContractError(f"episode {q.episode_id}: generate() returned {why or 'finish_reason error: ' + str(r.error)}")
    return results


def _check_update(backend: RolloutBackend, weights: list[tuple[str, Any]], context: list[int],
                  sampling: SamplingParams) -> None:
    """`update_weights` says the version it was given, and the next turn reports it."""
    version = backend.policy_version + 1
    stats = backend.update_weights(iter(weights), version=version)
    if not isinstance(stats, SyncStats) or stats.version != version:
        raise ContractError(f"update_weights(version={version}) returned {stats!r}, not SyncStats(version={version})")
    (r,) = _generate(backend, [TurnRequest(0, context, sampling, seed=1)])
    backend.release(0)
    if r.policy_version != version or backend.policy_version != version:
        raise ContractError(f"after update_weights(version={version}) a turn reports policy_version "
                            f"{r.policy_version} and the backend {backend.policy_version}")
    if not all(math.isfinite(x) for x in r.logprobs):
        raise ContractError("after update_weights the backend samples non-finite log-probs")


__all__ = ["ContractError", "check_backend"]
