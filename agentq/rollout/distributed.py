"""Rollout workers: N engines, each in a Ray actor, behind one `RolloutBackend`.

`DistributedBackend` is itself a `RolloutBackend`, so the agent loop does not change: it fans each
`generate` batch out by episode id. An episode sticks to the worker that served its first turn
(its KV cache and the delta prefill live there, and so does its sampling generator); new
episodes go to the least-loaded worker, which also bounds each worker's KV slots by
ceil(concurrent episodes / N).

Weight sync is a broadcast: the learner's tensors are put once into Ray's object store and every
worker loads them, requantizing with fresh scales (`TorchEngine.update_weights`). An NCCL
broadcast from the learner's rank 0 to the engines is the GPU path for large models (the hook is
`DistributedBackend.publish_weights`); it is not implemented (docs/distributed.md).

A worker that dies (or does not answer within `timeout_s`) is restarted with the latest weights
by whichever call finds it so, `prefill_counts` too (a hung worker costs one `timeout_s`, not one
for each call that waits on it), and the restart is awaited (one `timeout_s`); the episodes it was
serving come back as `TurnResult(finish_reason="error")` (also those not in the call that found it
dead, at their next turn, until released), and the agent loop reports them as errored episodes — as a dead env
worker's are. A worker that cannot be started again is down: the new episodes sent to it come back
as errors naming its start error, it is tried again at the next `generate` or `update_weights`.
No endless restart loop: after `max_failures_in_a_row` failed starts of one worker in a row, or as
many calls of one method (`generate`, `update_weights`, `prefill_counts`, `score`, and the start-up's
`kv_bytes_per_token`) in a row that it died or hung in without completing one (it starts, then dies at
every `generate`), the call raises once its results are in. Each method is counted on its own: a
completed `generate` starts the count of `generate`s again, while the `prefill_counts` and
`update_weights` a restarted worker completes between its deaths in `generate` (an RL step's calls)
do not (`FailureCounts`, the rule the env pools share).
A sync that raises on any worker leaves the workers on different versions: `generate` and `score`
refuse until an `update_weights` reaches them all.
"""
from __future__ import annotations

import math
import time
from typing import Any, Iterable

import torch

from agentq.kernels.quant_spec import QuantSpec
from agentq.utils.failures import FailureCounts
from agentq.utils.ray_actors import actor_death, actor_start_problem, kill_actor, last_line

from .backend import RolloutBackend, SamplingParams, SyncStats, TurnRequest, TurnResult


class EngineWorker:
    """A `TorchEngine` inside a Ray actor. Built from the HF config (weights arrive by
    `update_weights`), so no node needs the checkpoint on disk."""

    def __init__(self, hf_config: Any, quant: QuantSpec, engine_kw: dict[str, Any], tokenizer: Any = None,
                 weights: dict[str, torch.Tensor] | None = None, version: int = 0, threads: int | None = None):
        from .torch_engine.engine import TorchEngine

        if threads:
            torch.set_num_threads(int(threads))
        kw = dict(engine_kw)
        if kw.get("device") == "auto":
            kw["device"] = "cuda" if torch.cuda.is_available() else "cpu"
        self.engine = TorchEngine(hf_config, quant, tokenizer=tokenizer, **kw)
        if weights is not None:
            self.engine.update_weights(weights.items(), version)

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        return self.engine.generate(requests)

    def score(self, context_ids: list[int], target_ids: list[int], params: SamplingParams | None = None
              ) -> list[float]:
        return self.engine.score(context_ids, target_ids, params)

    def update_weights(self, weights: dict[str, torch.Tensor], version: int) -> SyncStats:
        return self.engine.update_weights(weights.items(), version)

    def release(self, episode_id: int) -> None:
        self.engine.release(episode_id)

    def kv_bytes_per_token(self) -> int:
        return self.engine.kv_bytes_per_token()

    def prefill_counts(self) -> dict[str, int]:
        return self.engine.prefill_counts()


class PrefillTally:
    """Each rollout worker's prefill counts, kept over its restarts: a replaced worker's new engine
    counts from 0, so what the old one last reported is carried. `total()` then never decreases, and
    the difference of two totals is the sum of the workers' deltas, a worker restarted in between
    counting from its restart (what the old engine prefilled after its last report is lost with it)."""

    def __init__(self, num_workers: int):
        self._carried: list[dict[str, int]] = [{} for _ in range(num_workers)]
        self._last: list[dict[str, int]] = [{} for _ in range(num_workers)]

    def report(self, w: int, counts: dict[str, int]) -> None:
        """Worker `w`'s engine's counts now (since its start)."""
        self._last[w] = dict(counts)

    def restarted(self, w: int) -> None:
        for k, v in self._last[w].items():
            self._carried[w][k] = self._carried[w].get(k, 0) + v
        self._last[w] = {}

    def total(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for counts in (*self._carried, *self._last):
            for k, v in counts.items():
                out[k] = out.get(k, 0) + v
        return out


class DistributedBackend(RolloutBackend):
    """N `EngineWorker` actors as one rollout backend.

    Args:
        hf_config: the policy's HF config (`AutoConfig.from_pretrained(path)`).
        quant: the rollout QuantSpec.
        num_workers: engines (Ray actors).
        max_slots: episodes in flight at once over all workers; each worker gets ceil(max_slots / N).
        actor_options: per-worker Ray actor options (resources, placement-group bundle), a list of N.
        engine_kw: `TorchEngine` arguments besides the slots (`build.torch_engine_kwargs`: max_len,
            dtype, device, prefill_chunk, sampler, cuda_graphs, run_ahead, share_prefill,
            prefill_graph_tokens, prefill_graph_max).
        tokenizer: for stop strings (picklable HF tokenizer).
        timeout_s: bound on every call to a worker (a worker past it counts as dead) and on its start.
    Raises:
        RuntimeError: a worker failed to start (none is left running).
        RunAborted: the give-up rule ended the start-up call that reads the engines' KV-cache size (a
            worker died or hung in it, or failed to restart, `max_failures_in_a_row` times in a row;
            none is left running).
    """

    max_failures_in_a_row = 3   # of one worker in a row: failed starts, or calls of one method it died / hung in

    def __init__(self, hf_config: Any, quant: QuantSpec, num_workers: int, max_slots: int, actor_options: list[dict],
                 engine_kw: dict[str, Any], tokenizer: Any = None, timeout_s: float = 600.0, threads: int | None = None):
        import ray

        if num_workers < 1:
            raise ValueError(f"placement.rollout_workers={num_workers}: must be ≥ 1")
        if len(actor_options) != num_workers:
            raise ValueError(f"{len(actor_options)} actor option sets for {num_workers} rollout workers")
        self._ray = ray
        self.quant, self.num_workers, self.timeout_s = quant, num_workers, float(timeout_s)
        self.policy_version = 0
        self.vocab_size = int(hf_config.vocab_size)     # the config.json the workers build their engines from
        self._cls = ray.remote(max_restarts=0)(EngineWorker)
        self._options = actor_options
        self.slots_per_worker = math.ceil(max_slots / num_workers)
        self._init = (hf_config, quant, {**engine_kw, "max_slots": self.slots_per_worker}, tokenizer)
        self._threads = threads
        self._weights_ref = None            # the latest broadcast, for restarted workers
        self._owner: dict[int, int] = {}    # episode id → worker
        self._load = [0] * num_workers      # episodes each worker holds
        self._lost: dict[int, str] = {}     # episode id → why: its worker was restarted (until released)
        self._sync_error: str | None = None  # the last update_weights failed on some worker: no serving
        self.restarts = 0
        self._prefill = PrefillTally(num_workers)
        self._failures = FailureCounts(self.max_failures_in_a_row, lambda w: f"rollout worker {w}")
        self.workers = [self._start(w) for w in range(num_workers)]
        try:
            problems = self._await_started(range(num_workers))
            if problems:
                w = min(problems)
                raise RuntimeError(f"rollout worker {w} failed to start: {problems[w]}")
            self._kv_bytes = self._start_up_kv_bytes()
        except BaseException:
            self.close()
            raise

    def _start(self, w: int) -> Any:
        return self._cls.options(**self._options[w]).remote(*self._init, weights=self._weights_ref,
                                                            version=self.policy_version, threads=self._threads)

    def _kill(self, w: int) -> None:
        kill_actor(self._ray, self.workers[w])

    def _await_started(self, workers: Iterable[int]) -> dict[int, str]:
        """Wait (one `timeout_s` for all) until each worker has built its engine. Returns worker → why
        it did not (`actor_start_problem`: its constructor's error, or the timeout); such a worker is killed."""
        deadline = time.monotonic() + self.timeout_s
        problems = {w: actor_start_problem(self._ray, self.workers[w], max(0.0, deadline - time.monotonic()),
                                           f"{self.timeout_s:g} s (placement.timeout_s)") for w in workers}
        return {w: p for w, p in problems.items() if p is not None}

    def _restart(self, why: dict[int, str]) -> dict[int, str]:
        """Replace each worker of `why` (worker → why it is replaced; killed first, in case it only
        hung; all started before any is awaited) and forget its episodes. Returns worker → why it could
        not be started: it is down, tried again at the next call (`_retry_down`)."""
        for w, cause in why.items():
            self._kill(w)
            self.restarts += 1
            self._prefill.restarted(w)          # its new engine counts from 0
            self.workers[w] = self._start(w)
            # its episodes' KV and sampling generators are gone: each one still running is reported at its
            # next turn (not replayed from scratch on another worker with a fresh generator) until released
            for eid in [e for e, o in self._owner.items() if o == w]:
                del self._owner[eid]
                self._lost[eid] = f"{cause}; the episode's state was lost with it (the worker is replaced)"
            self._load[w] = 0
        problems = self._await_started(why)
        for w in why:
            self._failures.start_ended(w, problems.get(w))
        return problems

    def _retry_down(self) -> set[int]:
        """Start again each worker left down by a failed start; returns those that are up now."""
        down = {w: f"rollout worker {w} was down" for w in sorted(self._failures.down)}
        return set(down) - set(self._restart(down)) if down else set()

    def _up_worker(self) -> int:
        """The first worker that is not down (worker 0 when all are: the call finds it so and counts it)."""
        return min(set(range(self.num_workers)) - set(self._failures.down), default=0)

    def _start_up_kv_bytes(self) -> int:
        """The engines' KV-cache bytes per token (one worker's: all are built alike), asked as every later
        call is: a worker that dies or hangs in it is restarted and asked again, until the give-up rule
        ends the run (it was asked of Ray directly: such a worker failed the start-up with a Ray error,
        neither restarted nor counted)."""
        while True:
            w = self._up_worker()
            ok, _ = self._gather("kv_bytes_per_token", {w: self.workers[w].kv_bytes_per_token.remote()})
            self._failures.raise_if_given_up()
            if w in ok:
                return int(ok[w])

    def worker_of(self, episode_id: int, prefer: int | None = None) -> int:
        """The worker serving the episode. A new episode goes to `prefer` while that worker has a
        free slot, else to the least-loaded worker."""
        w = self._owner.get(episode_id)
        if w is None:
            if prefer is not None and self._load[prefer] < self.slots_per_worker:
                w = prefer
            else:
                w = min(range(self.num_workers), key=lambda i: (self._load[i], i))
            self._owner[episode_id] = w
            self._load[w] += 1
        return w

    def _collect(self, method: str, futures: dict[int, Any]) -> tuple[dict[int, Any], dict[int, str],
                                                                      list[BaseException]]:
        """Every answer to a call of `method`, under one `timeout_s` for all: results by worker, worker →
        why it failed (died, hung) for those to restart, and the errors raised inside calls (the worker
        answered). Counts, per worker and method, the calls in a row it failed (`FailureCounts`)."""
        ok, failed, raised = {}, {}, []
        deadline = time.monotonic() + self.timeout_s
        for w, fut in futures.items():
            try:
                ok[w] = self._ray.get(fut, timeout=max(0.0, deadline - time.monotonic()))
                self._failures.call_completed(w, method)
                continue
            except self._ray.exceptions.RayTaskError as e:      # the call itself raised (bad input)
                raised.append(e)
                self._failures.call_completed(w, method)
                continue
            except self._ray.exceptions.GetTimeoutError:
                why = f"hung: no answer within {self.timeout_s:g} s (placement.timeout_s); killed"
            except self._ray.exceptions.RayError as e:
                # its process is gone: killed (ActorDiedError), by Ray's memory monitor (OutOfMemoryError, raised
                # for every later call too), its node lost, ...
                why = f"died ({actor_death(self._ray, e)})"
            failed[w] = why
            self._failures.call_failed(w, method, why)
        return ok, failed, raised

    def _replace(self, failed: dict[int, str]) -> dict[int, str]:
        """Restart each worker of `failed` (worker → why, from `_collect`); returns worker → the error its
        episodes in the call get."""
        errors = {w: f"rollout worker {w} {why}" for w, why in failed.items()}
        problems = self._restart(errors)
        return {w: err + (f"; could not be restarted ({problems[w]}); tried again at the next call" if w in problems
                          else "; restarted") for w, err in errors.items()}

    def _gather(self, method: str, futures: dict[int, Any]) -> tuple[dict[int, Any], dict[int, str]]:
        """Results by worker, and an error message for each worker that died or timed out (restarted).
        An error raised inside a worker's call (bad input) is re-raised, after every answer has been
        collected and the dead workers restarted, so no worker is left dead with its episodes."""
        ok, failed, raised = self._collect(method, futures)
        errors = self._replace(failed)
        if raised:
            raise raised[0]
        return ok, errors

    # ------------------------------------------------------------------ RolloutBackend
    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        if len({r.episode_id for r in requests}) != len(requests):
            raise ValueError("generate() got two requests for the same episode")
        self._check_synced()
        self._retry_down()
        by_worker: dict[int, list[TurnRequest]] = {}
        home: dict[tuple[int, ...], int] = {}     # a context → the worker its first new episode went to
        for r in requests:
            if r.episode_id in self._lost:
                continue
            if r.episode_id in self._owner:
                w = self.worker_of(r.episode_id)
            else:
                # new episodes with one context (a GRPO group's first turn) go to one worker while it
                # has room, so its engine prefills that context once (`TorchEngine(share_prefill=True)`)
                key = tuple(r.context_ids)
                w = self.worker_of(r.episode_id, prefer=home.get(key))
                home.setdefault(key, w)
            by_worker.setdefault(w, []).append(r)
        # a worker still down (its start failed again just now) holds no episode: its new ones are answered
        down = self._failures.down
        failed = {w: f"rollout worker {w} is down: it could not be started ({down[w]})" for w in by_worker if w in down}
        ok, died = self._gather("generate", {w: self.workers[w].generate.remote(rs) for w, rs in by_worker.items()
                                             if w not in failed})
        failed.update(died)
        out: dict[int, TurnResult] = {}
        for w, results in ok.items():
            out.update((res.episode_id, res) for res in results)
        for w, err in failed.items():
            for r in by_worker[w]:
                out[r.episode_id] = TurnResult(r.episode_id, [], [], "error", self.policy_version, error=err)
        for r in requests:
            if r.episode_id not in out:                   # lost with a worker restarted earlier
                out[r.episode_id] = TurnResult(r.episode_id, [], [], "error", self.policy_version,
                                               error=self._lost[r.episode_id])
        self._failures.raise_if_given_up()
        return [out[r.episode_id] for r in requests]

    def _check_synced(self) -> None:
        if self._sync_error is not None:
            raise RuntimeError(f"the last update_weights failed on a rollout worker ({self._sync_error}), so the "
                               "workers may hold different policy versions; call update_weights again before "
                               "generating")

    def score(self, context_ids: list[int], target_ids: list[int], params: SamplingParams | None = None) -> list[float]:
        """One worker's `score`. A worker that dies or hangs in it is restarted, as in `generate` (a
        hung one left as it was cost the next call another `timeout_s`), and the call raises: a
        score has no episode to carry the error."""
        self._check_synced()
        w = self._up_worker()
        ok, errors = self._gather("score", {w: self.workers[w].score.remote(context_ids, target_ids, params)})
        self._failures.raise_if_given_up()
        if w in errors:
            raise RuntimeError(f"score: {errors[w]}")
        return ok[w]

    def publish_weights(self, tensors: dict[str, torch.Tensor]) -> Any:
        """What the workers receive: here an object-store reference (one copy per node). An NCCL
        broadcast would return a handle the workers' `update_weights` receives into."""
        return self._ray.put(tensors)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> SyncStats:
        t0 = time.perf_counter()
        self._weights_ref = self.publish_weights({k: v.detach().cpu() for k, v in named_tensors})
        self.policy_version = version
        # set until every worker answers: a worker whose call raises keeps its old version (or none,
        # `TorchEngine.update_weights`) while the others serve the new one (a dead one restarts with it)
        self._sync_error = f"version {version}"
        # a worker left down starts with these weights; one still down gets them when it starts
        revived = self._retry_down()
        skip = revived | set(self._failures.down)
        try:
            ok, failed = self._gather("update_weights", {w: a.update_weights.remote(self._weights_ref, version)
                                                         for w, a in enumerate(self.workers) if w not in skip})
        except Exception as e:
            self._sync_error = f"version {version}: {type(e).__name__}: {last_line(e)}"
            raise
        self._sync_error = None
        self._failures.raise_if_given_up()
        # a restarted worker loaded these weights at start; the code-change fraction is a survivor's
        first = ok[min(ok)] if ok else None
        return SyncStats(version=version, int8_codes_changed=first.int8_codes_changed if first else None,
                         seconds=time.perf_counter() - t0,
                         extra={"rollout_workers": self.num_workers, "restarted": len(failed) + len(revived)})

    def release(self, episode_id: int) -> None:
        self._lost.pop(episode_id, None)
        w = self._owner.pop(episode_id, None)
        if w is not None:
            self._load[w] -= 1
            self.workers[w].release.remote(episode_id)   # in order before that worker's next call

    def kv_bytes_per_token(self) -> int:
        return self._kv_bytes

    def prefill_counts(self) -> dict[str, int]:
        """The workers' counts summed over their restarts (`PrefillTally`), so that the difference of two
        calls is the sum of each worker's count between them, from its restart for one restarted in
        between. Asked of all at once under one timeout. A worker that does not answer adds what it
        said last and is restarted here (its episodes reported at their next turn): an RL step starts
        with this call, and a hung worker left as it was cost the step's `generate` a second
        `timeout_s`. One whose call raised adds what it said last too."""
        down = self._failures.down
        ok, failed, _ = self._collect("prefill_counts", {w: a.prefill_counts.remote()
                                                         for w, a in enumerate(self.workers) if w not in down})
        for w, counts in ok.items():
            self._prefill.report(w, counts)
        self._replace(failed)
        self._failures.raise_if_given_up()
        return self._prefill.total()

    def close(self) -> None:
        for a in self.workers:
            try:
                self._ray.kill(a)
            except Exception:
                pass
        self.workers = []
