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

A worker that dies (or does not answer within `timeout_s`) is restarted with the latest weights;
the episodes it was serving come back as `TurnResult(finish_reason="error")` (also those not in the
call that found it dead, at their next turn, until released), and the agent loop reports them as
errored episodes — as a dead env worker's are. A sync that raises on any worker leaves the workers
on different versions: `generate` and `score` refuse until an `update_weights` reaches them all.
"""
from __future__ import annotations

import math
import time
from typing import Any, Iterable

import torch

from agentq.kernels.quant_spec import QuantSpec

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
        timeout_s: bound on every call to a worker; a worker past it counts as dead.
    """

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
        self.workers = [self._start(w) for w in range(num_workers)]
        self._kv_bytes = self._ray.get(self.workers[0].kv_bytes_per_token.remote(), timeout=self.timeout_s)

    def _start(self, w: int) -> Any:
        return self._cls.options(**self._options[w]).remote(*self._init, weights=self._weights_ref,
                                                            version=self.policy_version, threads=self._threads)

    def _restart(self, w: int) -> None:
        """Replace worker w (killed first, in case it only hung); forget its episodes."""
        try:
            self._ray.kill(self.workers[w])
        except Exception:
            pass
        self.restarts += 1
        self.workers[w] = self._start(w)
        # its episodes' KV and sampling generators are gone: each one still running is reported at its
        # next turn (not replayed from scratch on another worker with a fresh generator) until released
        for eid in [e for e, o in self._owner.items() if o == w]:
            del self._owner[eid]
            self._lost[eid] = f"rollout worker {w} died; restarted (the episode's state was lost)"
        self._load[w] = 0

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

    def _gather(self, futures: dict[int, Any]) -> tuple[dict[int, Any], dict[int, str]]:
        """Results by worker, and an error message for each worker that died or timed out (restarted).
        An error raised inside a worker's call (bad input) is re-raised, after every answer has been
        collected and the dead workers restarted, so no worker is left dead with its episodes."""
        ok, failed, raised = {}, {}, []
        deadline = time.monotonic() + self.timeout_s
        for w, fut in futures.items():
            try:
                ok[w] = self._ray.get(fut, timeout=max(0.0, deadline - time.monotonic()))
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.GetTimeoutError) as e:
                failed[w] = f"rollout worker {w} died ({type(e).__name__}); restarted"
            except Exception as e:                      # RayTaskError: the call itself raised
                raised.append(e)
        for w in failed:
            self._restart(w)
        if raised:
            raise raised[0]
        return ok, failed

    # ------------------------------------------------------------------ RolloutBackend
    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        if len({r.episode_id for r in requests}) != len(requests):
            raise ValueError("generate() got two requests for the same episode")
        self._check_synced()
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
        ok, failed = self._gather({w: self.workers[w].generate.remote(rs) for w, rs in by_worker.items()})
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
        return [out[r.episode_id] for r in requests]

    def _check_synced(self) -> None:
        if self._sync_error is not None:
            raise RuntimeError(f"the last update_weights failed on a rollout worker ({self._sync_error}), so the "
                               "workers may hold different policy versions; call update_weights again before "
                               "generating")

    def score(self, context_ids: list[int], target_ids: list[int], params: SamplingParams | None = None) -> list[float]:
        self._check_synced()
        return self._ray.get(self.workers[0].score.remote(context_ids, target_ids, params), timeout=self.timeout_s)

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
        try:
            ok, failed = self._gather({w: a.update_weights.remote(self._weights_ref, version)
                                       for w, a in enumerate(self.workers)})
        except Exception as e:
            # a RayTaskError's text is the worker's whole traceback: its last line names the error
            self._sync_error = f"version {version}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1]}"
            raise
        self._sync_error = None
        # a restarted worker loaded these weights at start; the code-change fraction is a survivor's
        first = ok[min(ok)] if ok else None
        return SyncStats(version=version, int8_codes_changed=first.int8_codes_changed if first else None,
                         seconds=time.perf_counter() - t0,
                         extra={"rollout_workers": self.num_workers, "restarted": len(failed)})

    def release(self, episode_id: int) -> None:
        self._lost.pop(episode_id, None)
        w = self._owner.pop(episode_id, None)
        if w is not None:
            self._load[w] -= 1
            self.workers[w].release.remote(episode_id)   # in order before that worker's next call

    def kv_bytes_per_token(self) -> int:
        return self._kv_bytes

    def prefill_counts(self) -> dict[str, int]:
        """The workers' counts summed, asked of all at once under one timeout (a worker that does not
        answer adds nothing; the next `generate` that needs it restarts it)."""
        total: dict[str, int] = {}
        futures = [w.prefill_counts.remote() for w in self.workers]
        deadline = time.monotonic() + self.timeout_s
        for fut in futures:
            try:
                counts = self._ray.get(fut, timeout=max(0.0, deadline - time.monotonic()))
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.GetTimeoutError):
                continue
            for k, v in counts.items():
                total[k] = total.get(k, 0) + v
        return total

    def close(self) -> None:
        for a in self.workers:
            try:
                self._ray.kill(a)
            except Exception:
                pass
        self.workers = []
