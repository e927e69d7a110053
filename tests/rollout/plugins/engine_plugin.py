"""A rollout backend of one's own, as `rollout.backend=engine_plugin:EngineBehindPlugin` loads it (the
test puts this folder on sys.path): the torch engine behind a class the project does not know, so
the plugin route is tested with a real engine. `Faulty` breaks one clause of the contract."""
from __future__ import annotations

from typing import Any

from agentq.rollout.backend import RolloutBackend, SamplingParams, SyncStats, TurnRequest, TurnResult
from agentq.rollout.torch_engine.engine import TorchEngine


class EngineBehindPlugin(RolloutBackend):
    def __init__(self, engine: TorchEngine):
        self.engine = engine
        self.quant = engine.quant

    @classmethod
    def from_config(cls, cfg: Any, path: str, spec: Any, *, device: Any, dtype: Any, tokenizer: Any,
                    max_slots: int) -> "EngineBehindPlugin":
        return cls(TorchEngine.from_pretrained(path, spec, max_slots=max_slots, max_len=int(cfg.env.max_context_tokens),
                                               tokenizer=tokenizer))

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        return self.engine.generate(requests)

    def score(self, context_ids: list[int], target_ids: list[int]) -> list[float]:
        return self.engine.score(context_ids, target_ids)

    def update_weights(self, named_tensors: Any, version: int) -> SyncStats:
        stats = self.engine.update_weights(named_tensors, version)
        # a backend's own numbers about its sync: logged as sync/<name> (numbers only)
        stats.extra.update({"plugin_syncs": float(version), "plugin_mode": "in-place", "plugin_ok": True})
        return stats

    def release(self, episode_id: int) -> None:
        self.engine.release(episode_id)

    def kv_bytes_per_token(self) -> int:
        return self.engine.kv_bytes_per_token()


class OtherNumerics(EngineBehindPlugin):
    """Serves the model unquantized whatever the run's spec says."""

    @classmethod
    def from_config(cls, cfg: Any, path: str, spec: Any, **kw: Any) -> "OtherNumerics":
        from agentq.kernels.quant_spec import QuantSpec

        return cls(TorchEngine.from_pretrained(path, QuantSpec.preset("none"), max_slots=kw["max_slots"]))


class Faulty(EngineBehindPlugin):
    """One clause broken: `unseeded` (a turn depends on the batch), `hot` (log-probs of another
    temperature than the one sampled at), `version` (update_weights forgets the version)."""

    def __init__(self, engine: TorchEngine, fault: str):
        super().__init__(engine)
        self.fault = fault

    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        if self.fault == "unseeded":
            requests = [TurnRequest(r.episode_id, r.context_ids, r.sampling, seed=len(requests)) for r in requests]
        if self.fault == "hot":
            out = self.engine.generate(requests)
            for q, r in zip(requests, out):
                hot = SamplingParams(temperature=2.0)
                r.logprobs = self.engine.score(q.context_ids, r.token_ids, hot)
            return out
        return self.engine.generate(requests)

    def update_weights(self, named_tensors: Any, version: int) -> SyncStats:
        return self.engine.update_weights(named_tensors, 0 if self.fault == "version" else version)


class NoSync(EngineBehindPlugin):
    """Takes the learner's weights at its first sync only: later turns still say version 0."""

    def update_weights(self, named_tensors: Any, version: int) -> SyncStats:
        if self.engine.policy_version == 0 and version == 0:
            return self.engine.update_weights(named_tensors, version)
        return SyncStats(version=version)
