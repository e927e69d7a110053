"""Where the rollout engines and the learner ranks run (`placement=single|colocated|split`).

* `single` (default): one `TorchEngine` and one `Learner` in the trainer process, no Ray.
* `split`: a Ray placement group with one bundle per engine, then one per learner rank (one GPU
  each when the cluster has GPUs); engines and ranks never share a device.
* `colocated`: bundle i holds engine i and learner rank i (half a GPU each when GPUs are used).

The engines form a `DistributedBackend` (agentq/rollout/distributed.py) and the ranks a
`DataParallelLearner` (agentq/learner/distributed.py); both have the interfaces the RL trainer
already uses, so the RL step is the same code in every mode. Commands and what each process does
on several nodes: docs/distributed.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig

from agentq import build
from agentq.config import ConfigError
from agentq.config_schema import positive_num
from agentq.utils.logging import console

from .run_dir import RunAborted

if TYPE_CHECKING:       # the learner and Ray-backed parts load when a placement needs them
    from transformers import PreTrainedTokenizerBase

    from agentq.kernels.quant_spec import QuantSpec
    from agentq.learner.distributed import DataParallelLearner
    from agentq.learner.learner import Learner
    from agentq.rollout.backend import RolloutBackend

MODES = ("single", "colocated", "split")
WEIGHT_SYNCS = ("object_store",)
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class Placement:
    """Reserves the cluster resources a mode needs and builds the learner and rollout backend on them.

    Args:
        cfg: the run's config (reads `placement`, `ray`, `rollout`, `env`, `dtype`, `torch_threads`).
    """

    def __init__(self, cfg: DictConfig):
        check_placement_config(cfg)
        p = cfg.placement
        self.mode = str(p.mode)
        self.rollout_workers, self.learner_ranks = int(p.rollout_workers), int(p.learner_ranks)
        self.timeout_s = float(p.timeout_s)
        self._ray: Any = None           # the ray module once started (ray is untyped here: pyproject.toml)
        self._started_ray = False
        self._pg: Any = None            # ray's PlacementGroup while reserved
        self._parts: list = []
        self._local = True              # a local cluster (ray.address null): no node will join it
        if self.mode == "single":
            return
        try:
            self._start_ray(cfg)
            self.use_gpus = self._resolve_gpus(p.use_gpus)
            self.cpus = float(p.cpus_per_actor)
            self.device = "cuda" if self.use_gpus else "cpu"
            self.dtype = actor_dtype(cfg.dtype, self.use_gpus)
            self.threads = max(1, int(self.cpus)) if not self.use_gpus else None
            self._reserve(str(p.strategy))
        except BaseException:
            self.close()        # no placement group left pending, no cluster left running
            raise

    # -------------------------------------------------------------- cluster
    def _start_ray(self, cfg: DictConfig) -> None:
        """Join `ray.address`, or start a local cluster on 127.0.0.1 only, as the Ray env pool does
        (this runs first, and the pool then finds Ray started and skips its own setup)."""
        from agentq.pool.ray_pool import import_ray, init_ray

        ray = import_ray(f"placement={cfg.placement.mode}")
        self._ray = ray
        self._local = cfg.ray.address is None
        if not ray.is_initialized():
            init_ray(cfg.ray.address, cfg.ray.num_cpus)          # a joined address is checked to answer first
            self._started_ray = True

    def _resolve_gpus(self, use_gpus: bool | str) -> bool:
        have = self._ray.cluster_resources().get("GPU", 0) > 0
        if use_gpus == "auto":
            return have
        if use_gpus and not have:
            raise ConfigError("placement.use_gpus=true but the Ray cluster has no GPU; use placement.use_gpus=auto or "
                              "false, or join a cluster with GPUs (ray.address)")
        return bool(use_gpus)              # a bool: check_placement_config refused anything else

    def bundles(self) -> list[dict[str, float]]:
        """The placement group's bundles: split → engines then ranks, one device each; colocated →
        max(engines, ranks) bundles, each holding engine i and rank i."""
        gpu = {"GPU": 1.0} if self.use_gpus else {}
        if self.mode == "split":
            return [{"CPU": self.cpus, **gpu} for _ in range(self.rollout_workers + self.learner_ranks)]
        return [{"CPU": 2 * self.cpus, **gpu} for _ in range(max(self.rollout_workers, self.learner_ranks))]

    def _reserve(self, strategy: str) -> None:
        """Reserve the placement group, waiting up to `timeout_s` for resources that others hold. Bundles
        the cluster's nodes can never hold fail at once on a local cluster (a 2-core machine asked for
        4 CPUs would otherwise wait the whole timeout); a joined cluster may still gain nodes, so it
        is warned and waited for."""
        from ray.util.placement_group import placement_group

        bundles = self.bundles()
        nodes = [n["Resources"] for n in self._ray.nodes() if n.get("Alive")]
        if not bundles_fit(nodes, bundles[0], len(bundles), strategy):
            shown = [{k: v for k, v in n.items() if k in ("CPU", "GPU")} for n in nodes]
            msg = (f"placement={self.mode}: the Ray cluster's nodes {shown} can never hold the {len(bundles)} bundles "
                   f"{bundles[0]} (placement.strategy={strategy}); lower placement.rollout_workers / learner_ranks "
                   "/ cpus_per_actor, or ")
            if self._local:         # the settings ask for what this machine does not have: a config error
                raise ConfigError(msg + "give the local cluster more CPUs (ray.num_cpus)")
            # ray.num_cpus sizes only a cluster agentq starts: a joined one has the CPUs it was started with
            console.print(f"warning: {msg}start the joined cluster with more CPUs (`ray start --num-cpus=N`) or add "
                          f"nodes; waiting up to placement.timeout_s={self.timeout_s:g} s for nodes to join",
                          style="yellow", markup=False, highlight=False, soft_wrap=True)
        self._pg = placement_group(bundles, strategy=strategy)
        try:
            self._ray.get(self._pg.ready(), timeout=self.timeout_s)
        except self._ray.exceptions.GetTimeoutError:      # RunAborted: one line on the command line
            raise RunAborted(unplaced_message(self.mode, bundles, self._ray.cluster_resources(),
                                              self._ray.available_resources(), self.timeout_s)) from None

    def actor_options(self, bundle: int) -> dict:
        """Ray options of an actor in `bundle`: its CPU share, its GPU (a whole one in split, half
        in colocated) and the bundle pin."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        gpu = (1.0 if self.mode == "split" else 0.5) if self.use_gpus else 0
        return {"num_cpus": self.cpus, "num_gpus": gpu,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=self._pg,
                                                                        placement_group_bundle_index=bundle)}

    def engine_bundle(self, i: int) -> int:
        return i

    def rank_bundle(self, r: int) -> int:
        return self.rollout_workers + r if self.mode == "split" else r

    # -------------------------------------------------------------- components
    def learner(self, model_path: str, spec: QuantSpec, **learner_kw: Any) -> Learner | DataParallelLearner:
        """A `Learner` in this process (single) or a `DataParallelLearner` over the ranks.

        Args:
            model_path: HF checkpoint folder (every node hosting a rank must read it).
            spec: the learner QuantSpec.
            learner_kw: `Learner` keyword arguments; device and dtype are the placement's for ranks.
        """
        if self.mode == "single":
            from agentq.learner.learner import Learner

            return Learner(model_path, spec, **learner_kw)
        from agentq.learner.distributed import DataParallelLearner

        kw = {**learner_kw, "device": self.device, "dtype": self.dtype}
        learner = DataParallelLearner(model_path, spec, self.learner_ranks,
                                      [self.actor_options(self.rank_bundle(r)) for r in range(self.learner_ranks)],
                                      timeout_s=self.timeout_s, threads=self.threads, **kw)
        self._parts.append(learner)
        return learner

    def rollout(self, cfg: DictConfig, model_path: str, device: torch.device, dtype: torch.dtype,
                tokenizer: PreTrainedTokenizerBase, max_slots: int) -> RolloutBackend:
        """The rollout backend: today's engine in this process (single), or the engines as Ray actors
        (their weights arrive with the trainer's first `update_weights`)."""
        if self.mode == "single":
            return build.make_backend(cfg, model_path, device, dtype, tokenizer, max_slots=max_slots)
        from transformers import AutoConfig

        from agentq.rollout.distributed import DistributedBackend

        spec, _ = build.quant_specs(cfg)
        engine_kw = build.torch_engine_kwargs(cfg, self.device, self.dtype)
        backend = DistributedBackend(AutoConfig.from_pretrained(model_path), spec, self.rollout_workers, max_slots,
                                     [self.actor_options(self.engine_bundle(i)) for i in range(self.rollout_workers)],
                                     engine_kw, tokenizer=tokenizer, timeout_s=self.timeout_s, threads=self.threads)
        self._parts.append(backend)
        return backend

    def close(self) -> None:
        """Stop the actors, free the placement group, and stop Ray if this placement started it (each
        step also when an earlier one raised)."""
        parts, self._parts = self._parts, []
        try:
            for part in parts:
                part.close()
        finally:
            try:
                if self._pg is not None:
                    from ray.util.placement_group import remove_placement_group

                    pg, self._pg = self._pg, None
                    remove_placement_group(pg)
            finally:
                if self._started_ray:
                    self._started_ray = False
                    self._ray.shutdown()


def check_placement_config(cfg: DictConfig) -> None:
    """The placement settings that need no cluster to judge, so that a bad one is refused before
    anything starts (also before `agentq pipeline`'s SFT stage).

    Raises:
        ConfigError: a bad mode, count, weight_sync, strategy, cpus_per_actor, timeout_s or use_gpus value,
            or an env pool's own cluster settings, which these placements do not read (`check_env_pool_cluster`).
    """
    p = cfg.placement
    if str(p.mode) not in MODES:
        raise ConfigError(f"placement.mode={p.mode!r}; valid: {list(MODES)}")
    if str(p.mode) == "single":
        return
    for key in ("rollout_workers", "learner_ranks"):
        if int(p[key]) < 1:
            raise ConfigError(f"placement.{key}={p[key]}: must be ≥ 1")
    if p.weight_sync not in WEIGHT_SYNCS:
        raise ConfigError(f"placement.weight_sync={p.weight_sync!r}; valid: {list(WEIGHT_SYNCS)} "
                          "(an NCCL broadcast is the planned GPU path: DistributedBackend.publish_weights)")
    if p.strategy not in STRATEGIES:
        raise ConfigError(f"placement.strategy={p.strategy!r}; valid: {list(STRATEGIES)}")
    for key in ("cpus_per_actor", "timeout_s"):        # timeout_s ≤ 0 failed only once Ray was up
        if positive_num(p[key]) is not None:
            raise ConfigError(f"placement.{key}={p[key]}: must be > 0")
    if p.use_gpus != "auto" and not isinstance(p.use_gpus, bool):
        raise ConfigError(f"placement.use_gpus={p.use_gpus!r}; valid: auto, true, false")
    if cfg.rollout.backend != "torch":
        which = "the vLLM backend" if cfg.rollout.backend == "vllm" else "a backend of one's own (module:Class)"
        raise ConfigError(f"rollout.backend={cfg.rollout.backend!r} with placement.mode={p.mode}: the Ray placements run "
                          f"the built-in engine (rollout.backend=torch) as actors; {which} runs with placement=single")
    check_env_pool_cluster(cfg)


def check_env_pool_cluster(cfg: DictConfig) -> None:
    """With placement=split|colocated the placement starts Ray (`ray.address`, `ray.num_cpus`) before
    the env pool, which then finds it up and skips its own start: an `env_pool.address` or
    `env_pool.num_cpus` of its own (not the `${ray.*}` they default to) would be dropped without a word.

    Raises:
        ConfigError: one line naming the env_pool key and the ray key that applies instead.
    """
    if cfg.env_pool.get("type") != "ray":
        return
    for key in ("address", "num_cpus"):
        own, ray_value = cfg.env_pool.get(key), cfg.ray.get(key)
        if own != ray_value:
            raise ConfigError(f"env_pool.{key}={own!r} with placement={cfg.placement.mode}: the placement starts Ray "
                              f"first, with ray.{key}={ray_value!r}, and the env pool joins that cluster, so "
                              f"env_pool.{key} is not read; set ray.{key}={own if own is not None else 'null'} instead")


def unplaced_message(mode: str, bundles: list[dict[str, float]], total: dict[str, float],
                     available: dict[str, float], timeout_s: float) -> str:
    """The one line for a placement group not ready within `timeout_s`: the bundles asked for and the
    cluster's total and free amounts of the resources they name (CPU, GPU), not the rest of Ray's
    resource table (its per-placement-group `CPU_group_*` entries ran to ~1,500 characters)."""
    names = sorted({k for b in bundles for k in b})
    have = ", ".join(f"{k} {total.get(k, 0.0):g} ({available.get(k, 0.0):g} free)" for k in names)
    return (f"placement={mode}: the Ray cluster ({have}) cannot hold the {len(bundles)} bundles {bundles[0]} within "
            f"{timeout_s:g} s (placement.timeout_s); raise placement.timeout_s to wait longer for what others hold, "
            "lower placement.rollout_workers / learner_ranks / cpus_per_actor, or add nodes")


def bundles_fit(nodes: list[dict[str, float]], bundle: dict[str, float], count: int, strategy: str) -> bool:
    """Whether `count` copies of `bundle` could ever be placed on nodes with these total resources.

    Args:
        nodes: each alive node's total resources (`ray.nodes()[i]["Resources"]`).
        bundle: one bundle's resources (every bundle of a placement is the same).
        count: bundles; strategy: STRICT_PACK (all on one node), STRICT_SPREAD (each on its own
            node), PACK or SPREAD (wherever they fit).
    """
    def per_node(total: dict[str, float]) -> int:      # copies of the bundle one node holds
        need = [(k, v) for k, v in bundle.items() if v > 0]
        return min((int(total.get(k, 0.0) / v + 1e-9) for k, v in need), default=count)

    fits = [per_node(n) for n in nodes]
    if strategy == "STRICT_PACK":
        return max(fits, default=0) >= count
    if strategy == "STRICT_SPREAD":
        return sum(1 for f in fits if f >= 1) >= count
    return sum(fits) >= count


def actor_dtype(dtype: str, use_gpus: bool) -> torch.dtype:
    """The actors' compute dtype: `dtype`, with auto → bfloat16 on GPUs, float32 on CPU."""
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        return torch.bfloat16 if use_gpus else torch.float32
    if dtype not in names:
        raise ConfigError(f"dtype={dtype!r}; valid: {sorted(names)} or auto")
    return names[dtype]
