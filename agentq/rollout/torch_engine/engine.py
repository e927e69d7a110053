"""`TorchEngine`: the built-in rollout backend (CPU and CUDA) for Llama/Qwen2/Qwen3 checkpoints.

* one KV slot per episode, kept between turns: a new turn prefills only the tokens added since
  the last one (observation + chat-template tokens); token ids are the source of truth;
* prefill work shared between new episodes (`share_prefill`): of identical contexts (a GRPO
  group's first turn) one is prefilled and the others copy its K/V slot and its logits; a prefix
  common to all the other new contexts (a system prompt) is prefilled once and copied;
* batched decode over all episodes in the request (ragged lengths, no padding in the cache);
* W8A8 linears and an int8 / fp8 KV cache as the `QuantSpec` says (`rollout.quant`);
* decode steps fused with sampling (`decode.DecodeRunner`): on CUDA they are replayed from CUDA
  graphs captured per batch bucket, and sampling is a counter-based draw on the GPU keyed by
  (episode seed, token position); on CPU the episode's `torch.Generator` draws by default;
* weights arrive from the learner by name and are requantized with fresh scales at every sync
  (replayed from a CUDA graph when the learner hands over the same tensors, `weight_sync`);
  cached KV computed with old weights is dropped (the next turn re-prefills);
* short prefill chunks (a turn's new tokens) replay CUDA graphs per (rows, tokens) bucket
  (`prefill_graphs`).
"""
from __future__ import annotations

import heapq
import numbers
import time
from typing import Any, Iterable, Literal, overload

import torch

from agentq.kernels.quant_spec import QuantSpec
from agentq.rollout.backend import (RolloutBackend, SamplingParams, SyncStats, TurnRequest, TurnResult, check_requests,
                                    load_safetensors_dir, score_ids)
from agentq.utils.checkpoint import CheckpointError
from agentq.utils.device import device_tensor, to_device

from .kv_cache import KVCache
from .decode import DecodeRunner, DecodeStep
from .model import EngineModel, WeightsRefused
from .prefill_graphs import DEFAULT_MAX_GRAPHS, DEFAULT_MAX_TOKENS, PrefillRunner, chunk_inputs
from .weight_sync import SyncGraph
from .sampler import processed_logprobs, sample

SAMPLERS = ("auto", "generator", "counter")
#: the shortest prefix common to the new contexts that is prefilled once and copied: below it the
#: extra forward (one more read of every weight) costs more than the prefill it saves
SHARE_MIN_TOKENS = 64


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n, lim = 0, min(len(a), len(b))
    while n < lim and a[n] == b[n]:
        n += 1
    return n


#: tokens a row per prefill forward unless `prefill_chunk` says otherwise (`rollout.prefill_chunk`)
DEFAULT_PREFILL_CHUNK = 512


def _kv_cache(cfg: Any, quant: QuantSpec, slots: int, max_len: int, dtype: torch.dtype, device: torch.device
              ) -> KVCache:
    """A KV cache of `slots` slots of `max_len` tokens for the layers and K/V heads of HF config `cfg`."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return KVCache(cfg.num_hidden_layers, slots, cfg.num_key_value_heads, max_len, head_dim, quant, dtype, device)


def _check_args(sampler: str, prefill_chunk: int, max_slots: int, max_len: int) -> None:
    # an engine without a slot or a position was built without a word and failed at its first turn
    for name, value in (("max_slots", max_slots), ("max_len", max_len)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"rollout engine {name} must be an int ≥ 1, got {value!r}")
    if sampler not in SAMPLERS:
        raise ValueError(f"rollout sampler must be one of {SAMPLERS}, got {sampler!r}")
    if prefill_chunk < 1:
        raise ValueError(f"rollout.prefill_chunk must be ≥ 1 token, got {prefill_chunk}")


class TorchEngine(RolloutBackend):
    """The built-in `RolloutBackend`: many episodes at once, each keeping its KV slot between turns."""

    def __init__(self, hf_config: Any, quant: QuantSpec, max_slots: int = 64, max_len: int = 2048,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 tokenizer: Any = None, sampler: str = "auto", cuda_graphs: bool = True, run_ahead: bool = True,
                 share_prefill: bool = True, prefill_graph_tokens: int = DEFAULT_MAX_TOKENS,
                 prefill_graph_max: int = DEFAULT_MAX_GRAPHS):
        """Args:
            hf_config: the HF config of a Llama / Qwen2 / Qwen3 checkpoint.
            quant: the rollout numerics.
            max_slots: episodes that can hold a KV slot at once; max_len: tokens per slot.
            sampler: "generator" (a CPU `torch.Generator` per episode), "counter" (hash of
                (seed, position), on the logits' device) or "auto" (counter on CUDA, else generator).
            cuda_graphs: replay decode steps (CUDA, Triton decode kernel, counter sampler) and
                weight syncs whose tensors repeat (`weight_sync`) from CUDA graphs.
            run_ahead: with the counter sampler, queue each decode step before the host has read
                the previous one's tokens (same tokens; the host's per-step work overlaps the GPU).
            share_prefill: new episodes with identical contexts prefill once (the others copy the
                K/V slot and the logits); a prefix common to the other new contexts, at least
                `SHARE_MIN_TOKENS` long, is prefilled once and copied. Each row still samples with
                its own seed. Off: every row prefills its own context.
            prefill_graph_tokens: with `cuda_graphs`, prefill chunks of at most this many tokens a
                row (a turn's new tokens) replay CUDA graphs per bucket (`prefill_graphs`); 0: eager.
            prefill_graph_max: the most prefill graphs captured; chunks of buckets met after that
                run eagerly, unpadded. 0: no prefill graphs.
        """
        _check_args(sampler, prefill_chunk, max_slots, max_len)
        self.quant, self.tokenizer = quant, tokenizer       # tokenizer: only to detect stop strings
        self.device = torch.device(device)
        self.model = EngineModel(hf_config, quant, dtype, self.device)
        # one slot more than episodes can hold: padding rows of a decode bucket write there
        self.cache = _kv_cache(hf_config, quant, max_slots + 1, max_len, dtype, self.device)
        self.model.set_max_len(max_len)
        self.sampler = ("counter" if self.device.type == "cuda" else "generator") if sampler == "auto" else sampler
        self.decoder = DecodeRunner(self.model, self.cache, pad_slot=max_slots, max_batch=max_slots,
                                    use_graphs=cuda_graphs and self.sampler == "counter")
        self.syncer = SyncGraph(self.model, use_graphs=cuda_graphs)
        self.prefiller = PrefillRunner(self.model, self.cache, pad_slot=max_slots, max_rows=max_slots,
                                       max_tokens=prefill_graph_tokens if cuda_graphs else 0, use_graphs=True,
                                       max_graphs=prefill_graph_max)
        self.max_slots, self.max_len, self.prefill_chunk = max_slots, max_len, prefill_chunk
        self.run_ahead, self.share_prefill, self.policy_version = run_ahead, share_prefill, 0
        self.vocab_size = int(hf_config.vocab_size)
        self._slot_of: dict[int, int] = {}          # episode id → slot
        self._cached: dict[int, list[int]] = {}     # slot → token ids whose K/V is in the cache
        self._free = list(range(max_slots))          # a min-heap: the lowest free slot first (`_slot`)
        self._generators: dict[int, torch.Generator] = {}
        self._seeds: dict[int, int] = {}            # episode id → counter-sampler seed
        # prefill_tokens: computed by a prefill forward; shared_tokens: copied from another slot
        # instead (share_prefill); reused_tokens: already in the episode's own slot from a turn before
        self.stats = {"prefill_tokens": 0, "decode_tokens": 0, "reused_tokens": 0, "shared_tokens": 0}
        self._weights_failed = False                # an update_weights() raised part-way (`_check_weights`)

    @classmethod
    def from_pretrained(cls, path: str, quant: QuantSpec, **kw: Any) -> "TorchEngine":
        from transformers import AutoConfig

        eng = cls(AutoConfig.from_pretrained(path), quant, **kw)
        try:
            eng.update_weights(load_safetensors_dir(path).items(), version=0)
        except (KeyError, WeightsRefused) as e:      # an edited config.json, weights of another model
            raise CheckpointError(f"{path}: its weights do not fit its config.json ({e.args[0]}); were they "
                                  "saved with this config.json?") from None
        return eng

    # ------------------------------------------------------------------ protocol
    def kv_bytes_per_token(self) -> int:
        return self.cache.bytes_per_token()

    def prefill_counts(self) -> dict[str, int]:
        s = self.stats
        g = self.prefiller.stats
        return {"prefill_computed_tokens": s["prefill_tokens"],
                "prefill_cached_tokens": s["reused_tokens"] + s["shared_tokens"],
                "prefill_shared_tokens": s["shared_tokens"],
                "prefill_graph_replays": g["graph_replays"], "prefill_graph_captures": g["graphs_captured"],
                "prefill_graph_uncaptured": g["uncaptured_chunks"]}

    def release(self, episode_id: int) -> None:
        slot = self._slot_of.pop(episode_id, None)
        if slot is not None:
            self._free_slot(slot)
        self._generators.pop(episode_id, None)
        self._seeds.pop(episode_id, None)

    def release_all(self) -> None:
        for e in list(self._slot_of):
            self.release(e)

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> SyncStats:
        t0 = time.perf_counter()
        # K/V cached under the old weights is stale: drop it, the next turn re-prefills. Dropped
        # before loading, and the engine refuses to generate until a load completes: a load that
        # fails part-way (a device error; names, shapes and dtypes are checked before any copy)
        # leaves weights of neither version.
        for slot in self._cached:
            self._cached[slot] = []
        self._weights_failed = True
        try:
            info = self.syncer.load(list(named_tensors))
        except (KeyError, WeightsRefused):
            self._weights_failed = False      # unknown / missing names, wrong shapes: refused before any copy
            raise
        self._weights_failed = False
        self.policy_version = version
        frac = info["codes_changed"] / info["codes_total"] if info["codes_total"] else None
        return SyncStats(version=version, int8_codes_changed=frac, seconds=time.perf_counter() - t0)

    @torch.no_grad()
    def generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        if not requests:
            return []
        # every refusal comes before any state changes (slots taken, K/V written, seeds drawn)
        self._check_weights()
        check_requests(requests, self.max_len, self.model.config.vocab_size)
        params = requests[0].sampling
        if any(r.sampling != params for r in requests):
            raise ValueError("all requests of one generate() call must share SamplingParams")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need the engine's tokenizer: TorchEngine(..., tokenizer=...)")
        new_episodes = sum(r.episode_id not in self._slot_of for r in requests)
        if new_episodes > len(self._free):
            raise RuntimeError(f"{new_episodes} new episodes need KV slots and {len(self._free)} of "
                               f"{self.max_slots} are free; release finished episodes or raise rollout.max_slots")
        slots = [self._slot(r.episode_id) for r in requests]
        # the CPU attention path's cache reads reuse buffers for the whole call, not new tensors of
        # the context's size at every step (`KVCache.reuse_reads`)
        with self.cache.reuse_reads():
            draw = self._drawer(requests, params)
            # 1) prefill each episode's new tokens; logits of its last context token start the turn
            logits = self._prefill(slots, [r.context_ids for r in requests])
            tok_l, lp_l = draw.first(logits, slots)
            # 2) batched decode: each step feeds the newest tokens and samples the next ones
            out_ids: list[list[int]] = [[] for _ in requests]
            out_lp: list[list[float]] = [[] for _ in requests]
            finish = ["length"] * len(requests)
            active = list(range(len(requests)))
            stop = set(params.stop_token_ids)
            while active:
                still = []
                for j, i in enumerate(active):
                    out_ids[i].append(tok_l[j])
                    out_lp[i].append(lp_l[j])
                    if tok_l[j] in stop:
                        finish[i] = "stop"
                    elif params.stop and self._ends_with_stop_string(out_ids[i], params.stop):
                        finish[i] = "stop_string"
                    elif self._may_grow(len(out_ids[i]), slots[i], params, steps=1):
                        still.append(i)
                active = still
                if active:
                    # a step after this one is worth queueing early if some row can still be live then
                    ahead = any(self._may_grow(len(out_ids[i]), slots[i], params, steps=2) for i in active)
                    tok_l, lp_l = draw.next(active, [slots[i] for i in active], [out_ids[i][-1] for i in active], ahead)
            draw.close()
        return [TurnResult(r.episode_id, out_ids[i], out_lp[i], finish[i], self.policy_version)
                for i, r in enumerate(requests)]

    @torch.no_grad()
    def score(self, context_ids: list[int], target_ids: list[int], params: SamplingParams | None = None) -> list[float]:
        """Teacher-forced log-probs of target_ids through the rollout numerics (a temporary slot)."""
        params = params or SamplingParams()
        self._check_weights()
        ids = score_ids(context_ids, target_ids, self.model.config.vocab_size)
        if len(ids) > self.max_len:
            raise ValueError(f"score(): context + target of {len(ids)} tokens does not fit max_len={self.max_len}")
        if not target_ids:
            return []
        # a free slot held by no episode id: any int is a valid episode id (negative ones too), so
        # a scratch id could name a live episode, whose slot, K/V and sampler this would take
        slot = self._take_slot()
        try:
            logits = self._prefill([slot], [ids], all_logits=True)[0]     # [len(ids), V]
            logp = processed_logprobs(logits[len(context_ids) - 1: len(ids) - 1], params)
            tgt = torch.tensor(target_ids, device=logp.device)
            return logp.gather(-1, tgt[:, None]).squeeze(-1).tolist()
        finally:
            self._free_slot(slot)

    # ------------------------------------------------------------------ internals
    def _check_weights(self) -> None:
        if self._weights_failed:
            raise RuntimeError("the last update_weights() failed part-way, so the engine holds weights of no "
                               "single version; load a complete set of weights before generating")

    def _may_grow(self, n_out: int, slot: int, params: SamplingParams, steps: int) -> bool:
        """Can a row with n_out tokens out still be sampling after `steps` more fed tokens (turn
        and slot limits; the slot's cached length counts the tokens fed so far)?"""
        return (n_out + steps - 1 < params.max_new_tokens
                and len(self._cached[slot]) + steps < self.max_len)

    def _ends_with_stop_string(self, ids: list[int], stops: tuple[str, ...]) -> bool:
        """Did the newest token complete a stop string? Only the tail is decoded: every token is at
        least one byte, so as many tokens as the stop string has UTF-8 bytes (+ 1) cover any
        occurrence that ends in the newest one (an earlier occurrence would already have ended the
        turn). Bytes, not characters: a byte-level BPE spells "→" with three tokens."""
        n = max(len(s.encode("utf-8")) for s in stops) + 1
        text = self.tokenizer.decode(ids[-n:])
        return any(s in text for s in stops)

    def _slot(self, episode_id: int) -> int:
        if episode_id not in self._slot_of:
            self._slot_of[episode_id] = self._take_slot()
        return self._slot_of[episode_id]

    def _take_slot(self) -> int:
        """Pop the lowest free slot, empty: a batch of episodes started together reads consecutive
        slots, which the CPU cache reads as views (`KVCache.read`)."""
        if not self._free:
            raise RuntimeError(f"all {self.max_slots} KV slots are in use; release finished episodes "
                               "or raise rollout.max_slots")
        slot = heapq.heappop(self._free)
        self._cached[slot] = []
        return slot

    def _free_slot(self, slot: int) -> None:
        """Give a slot back (`_take_slot`); its K/V is forgotten."""
        self._cached.pop(slot, None)
        heapq.heappush(self._free, slot)

    def _drawer(self, requests: list[TurnRequest], params: SamplingParams) -> "_Drawer":
        if self.sampler == "counter":
            return _CounterDrawer(self, [self._seed(r) for r in requests], params)
        return _GeneratorDrawer(self, [self._generator(r) for r in requests], params)

    def _seed(self, r: TurnRequest) -> int:
        if r.episode_id not in self._seeds:
            self._seeds[r.episode_id] = (r.seed if r.seed is not None
                                         else int(torch.randint(0, 2**62, (1,)).item()))
        return self._seeds[r.episode_id]

    def _generator(self, r: TurnRequest) -> torch.Generator:
        g = self._generators.get(r.episode_id)
        if g is None:
            g = torch.Generator()
            g.manual_seed(r.seed if r.seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
            self._generators[r.episode_id] = g
        return g

    @overload
    def _prefill(self, slots: list[int], contexts: list[list[int]], all_logits: Literal[False] = False
                 ) -> torch.Tensor: ...

    @overload
    def _prefill(self, slots: list[int], contexts: list[list[int]], all_logits: Literal[True]
                 ) -> list[torch.Tensor]: ...

    def _prefill(self, slots: list[int], contexts: list[list[int]], all_logits: bool = False
                 ) -> torch.Tensor | list[torch.Tensor]:
        """Bring each slot's cache up to its context; return logits of each context's last token
        ([B, V]), or with all_logits the logits of every newly prefilled position (list of [n_i, V])."""
        copies: dict[int, int] = {}
        placed: dict[int, int] = {}
        if self.share_prefill and not all_logits:
            copies, placed = self._share_prefill(slots, contexts)
        deltas: list[list[int]] = []
        for i, (slot, ctx) in enumerate(zip(slots, contexts)):
            if i in copies:                   # takes another row's K/V and logits after the forwards
                deltas.append([])
                continue
            cached = self._cached[slot]
            n = min(common_prefix(cached, ctx), len(ctx) - 1)   # always re-feed ≥ 1 token: its logits start the turn
            if all_logits:
                n = 0
            self.stats["reused_tokens"] += n - min(n, placed.get(slot, 0))     # not from a turn before
            del cached[n:]
            deltas.append(ctx[n:])
        last: list[torch.Tensor | None] = [None] * len(slots)
        every: list[list[torch.Tensor]] = [[] for _ in slots]
        chunk = self.prefill_chunk
        n_chunks = max((len(d) + chunk - 1) // chunk for d in deltas)
        for c in range(n_chunks):
            rows = [i for i, d in enumerate(deltas) if len(d) > c * chunk]
            pieces = [deltas[i][c * chunk:(c + 1) * chunk] for i in rows]
            logits, t_idx = self._forward([slots[i] for i in rows], pieces, all_logits)
            for k, i in enumerate(rows):
                self._cached[slots[i]].extend(pieces[k])
                if all_logits:
                    every[i].append(logits[k, : len(pieces[k])])
                elif c * chunk + len(pieces[k]) == len(deltas[i]):
                    last[i] = logits[k]
            self.stats["prefill_tokens"] += sum(len(p) for p in pieces)
        if all_logits:
            return [torch.cat(e) for e in every]
        if copies:
            self.cache.copy_slots([slots[i] for i in copies.values()], [slots[j] for j in copies],
                                  max(len(contexts[j]) for j in copies))
            for j, i in copies.items():
                self._cached[slots[j]] = list(contexts[j])
                last[j] = last[i]
                self.stats["shared_tokens"] += len(contexts[j])
        rows_last = [t for t in last if t is not None]
        assert len(rows_last) == len(last), "every row's last chunk sets its logits"
        return torch.stack(rows_last)

    def _share_prefill(self, slots: list[int], contexts: list[list[int]]) -> tuple[dict[int, int], dict[int, int]]:
        """Plan (and start) the prefill work new rows share: rows whose slot holds none of their
        context (a new episode, or one whose K/V a weight sync dropped).

        Of identical contexts the first is prefilled; the others are returned as copies (row → the
        row whose K/V slot and last-token logits they take once it is prefilled). If the remaining
        new rows' contexts share a prefix of at least `SHARE_MIN_TOKENS` tokens (each keeping ≥ 1
        token of its own), it is prefilled here into the first one's slot and copied into the
        others' now, so their prefill starts after it.

        Returns: (copies, placed): copies as above; placed: slot → tokens of the common prefix
        put into it here (prefilled or copied), which its own prefill then reuses."""
        # nothing reusable ⇔ the slot is empty or differs at token 0 (contexts are never empty): no
        # walk over the cached tokens, which `_prefill` does once per row after this
        fresh = [i for i, (s, ctx) in enumerate(zip(slots, contexts))
                 if not self._cached[s] or self._cached[s][0] != ctx[0]]
        first_of: dict[tuple[int, ...], int] = {}
        copies: dict[int, int] = {}
        for i in fresh:
            copies_from = first_of.setdefault(tuple(contexts[i]), i)
            if copies_from != i:
                copies[i] = copies_from
        heads = list(first_of.values())
        if len(heads) < 2:
            return copies, {}
        lead = contexts[heads[0]]
        n = min(len(contexts[i]) for i in heads) - 1
        for i in heads[1:]:
            n = min(n, common_prefix(lead, contexts[i]))
        if n < SHARE_MIN_TOKENS:
            return copies, {}
        src = slots[heads[0]]
        self._cached[src].clear()
        self._prefill([src], [lead[:n]])      # one row: nothing to share inside
        dst = [slots[i] for i in heads[1:]]
        self.cache.copy_slots([src] * len(dst), dst, n)
        for s in dst:
            self._cached[s] = list(lead[:n])
        self.stats["shared_tokens"] += n * len(dst)
        return copies, {s: n for s in [src] + dst}

    def _advance(self, slots: list[int], tokens: list[int]) -> list[int]:
        """Append one token to each slot's bookkeeping; returns the slots' new lengths."""
        new_lens = [len(self._cached[s]) + 1 for s in slots]
        if max(new_lens) > self.max_len:     # a write past the slot would corrupt other memory on GPU
            raise ValueError(f"a slot would grow to {max(new_lens)} tokens > max_len={self.max_len}")
        for s, t in zip(slots, tokens):
            self._cached[s].append(t)
        self.stats["decode_tokens"] += len(tokens)
        return new_lens

    def _decode(self, slots: list[int], tokens: list[int]) -> torch.Tensor:
        """Feed one token per slot (eagerly); returns the next-token logits [B, V]."""
        new_lens = self._advance(slots, tokens)
        dev = self.device
        return self.model.decode_step(device_tensor(tokens, dev), device_tensor(slots, dev),
                                      device_tensor(new_lens, dev), self.cache)

    def _forward(self, slots: list[int], pieces: list[list[int]], all_logits: bool
                 ) -> tuple[torch.Tensor, None]:
        """One padded forward of `pieces` appended to `slots`. Returns logits of each piece's last
        token [B, V] (or every token [B, T, V]). Short chunks go through the CUDA-graph buckets
        (`PrefillRunner`) where they take them."""
        lens_l = [len(self._cached[s]) for s in slots]
        new_max = max(n + len(p) for n, p in zip(lens_l, pieces))
        if new_max > self.max_len:     # a write past the slot would corrupt other memory on GPU
            raise ValueError(f"a slot would grow to {new_max} tokens > max_len={self.max_len}")
        b, t = len(pieces), max(len(p) for p in pieces)
        key = None if all_logits else self.prefiller.bucket(b, t, new_max)
        if key is not None:
            return self.prefiller.run(key, slots, pieces, lens_l), None
        dev = self.device
        *inputs, last = (to_device(x, dev) for x in chunk_inputs(slots, pieces, lens_l, rows=b, tokens=t,
                                                                  pad_slot=self.max_slots))
        if all_logits:
            logits = self.model(*inputs, self.cache, key_len=new_max)
        else:
            rows = (to_device(torch.arange(b), dev), last)
            logits = self.model(*inputs, self.cache, logit_rows=rows, key_len=new_max)
        return logits, None


class _Drawer:
    """How one `generate` call turns logits into tokens: the first token of each row from its
    prefill logits, then fused decode-and-sample steps over the live rows."""

    def first(self, logits: torch.Tensor, slots: list[int]) -> tuple[list[int], list[float]]:
        """Args: logits [B, V] of each row's last context token; slots: the rows' KV slots.
        Returns: (tokens, log-probs), one per row."""
        raise NotImplementedError

    def next(self, rows: list[int], slots: list[int], tokens: list[int], ahead: bool
             ) -> tuple[list[int], list[float]]:
        """Args: rows: the live rows (indices into the call's requests); slots: theirs; tokens: the
        token each feeds (the last one it sampled); ahead: whether a step after this one may be
        needed (a hint: drawers that run ahead skip the extra step when it is False).
        Returns: (tokens, log-probs) sampled for `rows`."""
        raise NotImplementedError

    def close(self) -> None:
        """The call is over: forget any step queued ahead."""


class _GeneratorDrawer(_Drawer):
    """CPU `torch.Generator` per episode (Gumbel-max over a CPU draw); decode runs eagerly."""

    def __init__(self, engine: TorchEngine, generators: list[torch.Generator | None], params: SamplingParams):
        self.engine, self.gens, self.params = engine, generators, params

    def first(self, logits, slots):
        tok, lp = sample(logits, self.params, self.gens)
        return tok.tolist(), lp.tolist()

    def next(self, rows, slots, tokens, ahead):
        logits = self.engine._decode(slots, tokens)
        tok, lp = sample(logits, self.params, [self.gens[i] for i in rows])
        return tok.tolist(), lp.tolist()


class _CounterDrawer(_Drawer):
    """Counter-based draws keyed by (episode seed, position of the sampled token); decode steps
    go through the engine's `DecodeRunner` (CUDA-graph replay where possible). With
    `engine.run_ahead` the step after the current one is queued before the current one's tokens
    are read (`DecodeRunner.launch_next`), so the GPU never waits for the host between steps."""

    def __init__(self, engine: TorchEngine, seeds: list[int], params: SamplingParams):
        self.engine, self.seeds, self.params = engine, seeds, params
        self.queued: DecodeStep | None = None     # the step queued ahead: it feeds what the last one sampled

    def first(self, logits, slots):
        positions = [len(self.engine._cached[s]) for s in slots]
        tok, lp = self.engine.decoder.sample(logits, self.params, self.seeds, positions)
        return tok.tolist(), lp.tolist()

    def next(self, rows, slots, tokens, ahead):
        eng, dec = self.engine, self.engine.decoder
        new_lens = eng._advance(slots, tokens)
        cur = self.queued
        if cur is None:
            cur = dec.launch(tokens, slots, new_lens, [self.seeds[i] for i in rows], self.params, rows)
        self.queued = dec.launch_next(cur, rows, self.params) if eng.run_ahead and ahead else None
        # rows that finished after the step was queued computed one more token: result() drops it
        return cur.result(rows)

    def close(self):
        self.queued = None
