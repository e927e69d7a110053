"""Data-parallel learner: M learner ranks (Ray actors) joined in one torch.distributed group.

Every rank holds a full replica (master weights, AdamW state, the aligned QAT forward, the KL
reference). The driver keeps the RL step's batch logic (advantages, `Objective.prepare` on the
whole batch: IS weights and InterQ-RL retention are per trajectory, computed before any split)
and ships each rank the whole batch plus the minibatch plan; the ranks split only the *rows*:

* old/ref log-probs: each rank computes its share of the rows, the driver reassembles them;
* update: for every minibatch each rank accumulates the gradient of its rows over micro-batches,
  each micro-batch weighted by its share of the *whole minibatch's* units (action tokens or
  trajectories), so the sum over ranks is the one-process gradient; one flat all-reduce (SUM) per
  optimizer step combines them (the collective DDP issues, without its per-backward hooks, which
  do not fit uneven row shares and gradient accumulation); clipping and AdamW then run
  identically on every rank, so the replicas stay equal.

The backend is gloo on CPU and NCCL on CUDA (same code; only the CPU path is tested, see
docs/distributed.md). FSDP2 (sharded masters and optimizer state) is the path for models whose
replica does not fit one GPU; it is not implemented.
"""
from __future__ import annotations

import datetime
import socket
from typing import Any, Iterator

import torch
import torch.distributed as dist

from agentq.algos.objective import Objective
from agentq.kernels.quant_spec import QuantSpec
from agentq.utils.errors import RunAborted
from agentq.utils.malloc_tuning import tune_malloc
from agentq.utils.ray_actors import actor_death

from .batch import PolicyBatch
from .learner import Learner, prefix_stats, update_summary
from .packing import token_order


class RankLearner(Learner):
    """One data-parallel rank: a `Learner` whose minibatch gradient covers its own rows and is
    summed across the group. Runs inside a Ray actor (see `DataParallelLearner`)."""

    def __init__(self, rank: int, world_size: int, model_path: str, spec: QuantSpec, threads: int | None = None,
                 **kw: Any):
        if threads:
            torch.set_num_threads(int(threads))
        if kw.get("device") == "auto":
            kw["device"] = "cuda" if torch.cuda.is_available() else "cpu"
        tune_malloc()           # a rank's process is a Ray worker's, which the CLI's call does not reach
        super().__init__(model_path, spec, **kw)
        self.rank, self.world_size = rank, world_size

    # -------------------------------------------------------------- process group
    @staticmethod
    def rendezvous_address() -> tuple[str, int]:
        """This node's IP and a free TCP port (called on rank 0; the group's store listens there)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def init_group(self, host: str, port: int, timeout_s: float) -> str:
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.world_size, timeout=datetime.timedelta(seconds=timeout_s))
        return backend

    # -------------------------------------------------------------- hooks of Learner
    def local_rows(self, minib: PolicyBatch) -> torch.Tensor:
        return shard_rows(minib.attention_mask.sum(1), self.rank, self.world_size,
                          minib.input_ids if self.train_batching.shares_prefixes else None)

    def logprob_shards_share_prefixes(self) -> bool:
        """Whether the no-grad passes' packs share prefixes, so their rows shard by tokens."""
        return self.logprob_batching.shares_prefixes

    def reduce_grads(self) -> None:
        """Sum every parameter's gradient over the ranks (one flat buffer, one all-reduce). A rank
        whose share was empty contributes zeros. A parameter no rank has a gradient for keeps none,
        as in one process, so AdamW skips it there too (no weight decay, no moment update): a flag
        per parameter travels in the same buffer (0 / 1 summed: exact in any float dtype)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        dtype = next((p.grad.dtype for p in params if p.grad is not None), params[0].dtype)
        has = torch.tensor([float(p.grad is not None) for p in params], dtype=dtype, device=params[0].device)
        flat = torch.cat([has] + [(p.grad if p.grad is not None else torch.zeros_like(p, dtype=dtype)).reshape(-1)
                                  for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = len(params)
        seen = (flat[:offset] > 0).tolist()         # one device → host read, not one per parameter
        for p, any_rank in zip(params, seen):
            n = p.numel()
            p.grad = flat[offset: offset + n].view_as(p).clone() if any_rank else None
            offset += n

    # -------------------------------------------------------------- called by the driver
    def logprobs_rows(self, batch: PolicyBatch, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(old, ref) log-probs of `rows` of the batch ([n, L] each; ref None without a reference)."""
        part = batch.index(rows)
        return self.logprobs(part), (self.logprobs(part, self.ref) if self.ref is not None else None)

    def update_minibatches(self, batch: PolicyBatch, objective: Objective, plan: list[torch.Tensor],
                           lr: float | None = None) -> tuple[dict[str, float], list[float], dict[str, int]]:
        """One optimizer step per minibatch of the plan (row indices into `batch`), at learning rate
        `lr` (None: unchanged). Returns this rank's share of the loss statistics (the driver sums
        them), the gradient norms, and its packed row tokens and those shared prefixes saved
        (`Learner.prefix_tokens`)."""
        self.set_lr(lr)
        sums: dict[str, float] = {}
        norms = []
        self.prefix_tokens = {"rows": 0, "saved": 0}
        for idx in plan:
            norm = self.minibatch_step(batch.index(idx), objective, sums)
            if norm is not None:
                norms.append(norm)
        self.version += 1
        return sums, norms, self.prefix_tokens

    def reduced_gradient(self, minib: PolicyBatch, objective: Objective) -> torch.Tensor:
        """The minibatch's summed gradient, flattened (no optimizer step): for tests and checks."""
        self.accumulate_grads(minib, objective, {})
        return flat_grad(self.model)

    def state_dict_cpu(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def optimizer_state(self) -> dict:
        return self.opt.state_dict()

    def load_optimizer_state(self, state: dict) -> None:
        self.opt.load_state_dict(state)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def shard_rows(lengths: torch.Tensor, rank: int, world_size: int,
               input_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Rank `rank`'s rows; the shards of all ranks partition the rows, each with about the same
    number of tokens. By default every world_size-th row in order of length. With `input_ids`
    (the learners share prefixes, `Learner(share_prefix=True)`), consecutive runs of the rows in
    token order (`packing.token_order`), split where the running token count crosses a multiple
    of total / world_size: rows sharing a prefix stay on one rank, but at a run's edge."""
    if input_ids is None:
        order = torch.argsort(lengths, descending=True, stable=True)
        return order[rank::world_size]
    sorted_rows = torch.tensor(token_order(input_ids, lengths.tolist()), dtype=torch.long)
    n = lengths[sorted_rows].double()
    middle = torch.cumsum(n, 0) - n / 2          # each row's token midpoint on the shared axis
    owner = (middle * world_size / max(float(n.sum()), 1.0)).long().clamp(max=world_size - 1)
    return sorted_rows[owner == rank]


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).cpu()
                      for p in model.parameters() if p.requires_grad])


class _RemoteOptimizer:
    """What the trainer reads of an optimizer (state_dict / load_state_dict), for checkpoints:
    rank 0's state is saved; a loaded state goes to every rank."""

    def __init__(self, owner: "DataParallelLearner"):
        self._owner = owner

    def state_dict(self) -> dict:
        return self._owner._get(self._owner.ranks[0].optimizer_state.remote(), "optimizer_state")

    def load_state_dict(self, state: dict) -> None:
        ref = self._owner._ray.put(state)
        self._owner._get([r.load_optimizer_state.remote(ref) for r in self._owner.ranks], "load_optimizer_state")


class DataParallelLearner:
    """The driver's handle on M `RankLearner` actors, with the `Learner` interface the RL trainer
    uses (`fill_old_and_ref`, `update`, `named_weights`, `model` and `opt` for checkpoints).

    Args:
        model_path: HF checkpoint folder (readable on every node that hosts a rank).
        spec: the learner's QuantSpec (aligned: the rollout's).
        world_size: learner ranks.
        actor_options: per-rank Ray actor options (resources, scheduling strategy), a list of M.
        timeout_s: bound on any call to the ranks (and the process group's collectives).
        learner_kw: the `Learner` arguments (lr, dtype, device, micro_batch_size, ...).
    """

    #: π_old from its own no-grad pass only: bypass (`Learner.update`) would need each rank's
    #: micro-batch log-probs gathered back to the driver, which nothing here does yet
    old_logp_modes = ("recompute",)

    def __init__(self, model_path: str, spec: QuantSpec, world_size: int, actor_options: list[dict],
                 timeout_s: float = 600.0,
                 threads: int | None = None, **learner_kw: Any):
        import ray
        from transformers import AutoModelForCausalLM

        if world_size < 1:
            raise ValueError(f"placement.learner_ranks={world_size}: must be ≥ 1")
        self._ray, self.timeout_s = ray, float(timeout_s)
        self._failed: str | None = None     # why the ranks were stopped (`_get`)
        cls = ray.remote(max_restarts=0)(RankLearner)
        self.ranks = [cls.options(**actor_options[r]).remote(r, world_size, model_path, spec, threads=threads,
                                                             **learner_kw)
                      for r in range(world_size)]
        host, port = self._get(self.ranks[0].rendezvous_address.remote(), "its start")
        self.backend = self._get([r.init_group.remote(host, port, self.timeout_s) for r in self.ranks], "init_group")[0]
        # the driver's copy of the weights: for checkpoints and the weight sync to the engines
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=learner_kw.get("dtype", torch.float32))
        self.opt = _RemoteOptimizer(self)
        self.world_size = world_size
        self.version = 0
        # the ranks' no-grad packs share prefixes: rows sharing one then go to the same rank
        self.share = bool(self._get(self.ranks[0].logprob_shards_share_prefixes.remote(), "its start"))
        self.prefix_tokens: dict[str, int] = {}

    def _get(self, refs: Any, what: str = "a call") -> Any:
        """Every rank call's answer, within `timeout_s`. A rank that raised or did not answer leaves its
        peers blocked in a collective until the group's timeout, and a later call could pair their
        pending all-reduce with a new one: every rank is stopped at once (the learner is not
        recovered, docs/distributed.md), and later calls fail at once with the first error.

        Args:
            refs: one rank call's ObjectRef (rank 0's) or a list of them, one per rank in rank order.
            what: the rank method called, as the failure's message names it.
        Raises:
            RunAborted: a rank died or did not answer within `timeout_s` (one line naming the rank and
                the resume; Ray's error is chained). A rank's own exception is re-raised as it came.
        """
        if self._failed is not None:
            raise RuntimeError(f"the data-parallel learner's ranks were stopped after an earlier failure: "
                               f"{self._failed}")
        try:
            return self._ray.get(refs, timeout=self.timeout_s)
        except Exception as e:
            # a RayTaskError's text is the rank's whole traceback: its last line names the error
            self._failed = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1][:500]}"
            lost = self._lost_ranks(refs if isinstance(refs, list) else [refs], e, what)
            self._kill_ranks()
            if lost is not None:       # died or hung: one line on the command line, not Ray's traceback
                self._failed = lost
                # `agentq train` (`rl.train`) adds the run folder and the command that continues it
                raise RunAborted(f"{lost}; all {len(self.ranks)} learner ranks were stopped") from e
            e.add_note(f"agentq: a learner rank failed; all {len(self.ranks)} ranks were stopped")
            raise

    def _lost_ranks(self, refs: list, e: BaseException, what: str) -> str | None:
        """Which ranks died or hung in a call that raised `e`, as one clause ("learner rank 1 died in
        update_minibatches (ActorDiedError)"); None when `e` is a rank's own exception."""
        ray = self._ray
        if isinstance(e, ray.exceptions.GetTimeoutError):
            _, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
            ranks = [str(i) for i, r in enumerate(refs) if r in pending] or ["?"]
            return (f"learner rank {', '.join(ranks)} hung: no answer to {what} within "
                    f"placement.timeout_s={self.timeout_s:g} s")
        if not isinstance(e, (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError)):
            return None
        dead = [str(i) for i, r in enumerate(refs) if _died(ray, r)] or ["?"]
        return f"learner rank {', '.join(dead)} died in {what} ({actor_death(ray, e)})"

    def fill_old_and_ref(self, batch: PolicyBatch) -> None:
        ref = self._ray.put(batch)
        shards = [shard_rows(batch.attention_mask.sum(1), r, self.world_size, batch.input_ids if self.share else None)
                  for r in range(self.world_size)]
        outs = self._get([rank.logprobs_rows.remote(ref, rows) for rank, rows in zip(self.ranks, shards)],
                         "logprobs_rows")
        old_logp = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        ref_logp = torch.zeros_like(old_logp) if outs[0][1] is not None else None
        for rows, (old, refp) in zip(shards, outs):
            old_logp[rows] = old
            if ref_logp is not None:
                ref_logp[rows] = refp
        batch.old_logp, batch.ref_logp = old_logp, ref_logp

    def fill_ref(self, batch: PolicyBatch) -> None:
        """Bypass mode's no-grad pass (π_ref only), which this learner does not run (`old_logp_modes`)."""
        self.refuse_bypass("fill_ref (the π_ref-only pass of bypass mode)")

    def refuse_bypass(self, what: str) -> None:
        raise ValueError(f"{what}: the data-parallel learner supports only old_logp_mode in "
                         f"{list(self.old_logp_modes)} (π_old from its own no-grad pass)")

    def update(self, batch: PolicyBatch, objective: Objective, epochs: int = 1, minibatch_size: int | None = None,
               generator: torch.Generator | None = None, old_logp_mode: str = "recompute",
               lr: float | None = None) -> dict[str, float]:
        """As `Learner.update`: the same minibatch plan (drawn from `generator` exactly as there),
        each minibatch's rows split over the ranks, every rank at `lr`; π_old only from `fill_old_and_ref`."""
        if old_logp_mode not in self.old_logp_modes:
            self.refuse_bypass(f"old_logp_mode={old_logp_mode!r}")
        n = batch.num_seqs
        mb = minibatch_size or n
        plan = []
        for _ in range(epochs):
            perm = torch.randperm(n, generator=generator)
            plan += [perm[s: s + mb] for s in range(0, n, mb)]
        ref = self._ray.put(batch)
        outs = self._get([r.update_minibatches.remote(ref, objective, plan, lr) for r in self.ranks],
                         "update_minibatches")
        sums: dict[str, float] = {}
        for part, _, _ in outs:
            for k, v in part.items():
                sums[k] = sums.get(k, 0.0) + v
        self.version += 1
        self.prefix_tokens = {k: sum(tokens.get(k, 0) for _, _, tokens in outs) for k in ("rows", "saved")}
        return {**update_summary(sums, outs[0][1]), **prefix_stats(self.prefix_tokens)}

    def reduced_gradients(self, minib: PolicyBatch, objective: Objective) -> list[torch.Tensor]:
        """Every rank's summed minibatch gradient (flat; equal across ranks), no optimizer step."""
        ref = self._ray.put(minib)
        return self._get([r.reduced_gradient.remote(ref, objective) for r in self.ranks], "reduced_gradient")

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Rank 0's master weights by HF name (all ranks hold the same); the driver's copy follows."""
        self.model.load_state_dict(self._get(self.ranks[0].state_dict_cpu.remote(), "state_dict_cpu"))
        return iter(self.model.state_dict().items())

    def _kill_ranks(self) -> None:
        for r in self.ranks:
            try:
                self._ray.kill(r)
            except Exception:
                pass

    def close(self) -> None:
        """Leave the process group on every rank (stopped ranks skip it), then stop them: killed even
        when the graceful close fails or times out (a rank stuck in a collective)."""
        try:
            if self._failed is None:
                refs = [r.close.remote() for r in self.ranks]
                if refs:
                    self._ray.wait(refs, num_returns=len(refs), timeout=30)
        finally:
            self._kill_ranks()
            self.ranks = []


def _died(ray: Any, ref: Any) -> bool:
    """Whether the call of `ref` has ended because its actor died (an answer, a rank's own error or
    a call still running are not)."""
    try:
        ray.get(ref, timeout=0)
    except (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError):
        return True
    except Exception:
        pass
    return False
