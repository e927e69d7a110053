"""Data-parallel learner: 2 ranks (Ray actors, one gloo process group) compute the same gradient,
log-probs and optimizer step as one process on the same batch, with the aligned (W8A8-KV8 QAT)
forward, gradient accumulation over micro-batches, and InterQ-RL token weights computed once on
the whole batch before the row split.

Tolerance: the ranks sum partial gradients of different micro-batch compositions, so fp32 sums are
re-associated; every gradient entry must agree within 1e-5 · max|g| (measured ≈ 1e-7 relative)."""
import time

import pytest
import torch

from agentq.algos import make_objective
from agentq.algos.objective import GRPO
from agentq.learner.batch import PolicyBatch
from agentq.kernels import QuantSpec
from agentq.learner.distributed import DataParallelLearner, flat_grad, shard_rows
from agentq.learner.learner import Learner
from ray_faults import dead_actors_answer_oom

SPEC = QuantSpec.preset("w8a8_kv8")
KW = dict(lr=1e-3, micro_batch_size=2, use_reference=True, dtype=torch.float32, device="cpu")


def synthetic_batch(n=5, L=40, vocab=100, seed=0) -> PolicyBatch:
    """n trajectories of different lengths: prompt tokens, then alternating action / observation runs
    (turns 1, 2, 3), rollout log-probs near the model's, GRPO-like advantages."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, L), generator=g)
    attn = torch.zeros(n, L, dtype=torch.long)
    mask = torch.zeros(n, L)
    seg = torch.zeros(n, L, dtype=torch.long)
    for i in range(n):
        length = L - 5 * i
        attn[i, :length] = 1
        for s, start in enumerate(range(6, length - 4, 10), start=1):
            mask[i, start: start + 4] = 1
            seg[i, start: start + 4] = s
    ids = ids * attn
    rollout = -2.0 - torch.rand(n, L, generator=g)
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.4][:n])
    return PolicyBatch(ids, attn, mask, seg, rollout * mask, adv)


def test_shards_partition_the_rows():
    lengths = torch.tensor([5, 9, 1, 7, 3])
    parts = [shard_rows(lengths, r, 2) for r in range(2)]
    assert sorted(torch.cat(parts).tolist()) == [0, 1, 2, 3, 4]
    assert parts[0].tolist() == [1, 0, 2] and parts[1].tolist() == [3, 4]   # by length: 9, 7, 5, 3, 1


def test_two_gloo_ranks_give_the_one_process_gradient_and_step(ray_cluster, tiny_model_dir):
    single = Learner(str(tiny_model_dir), SPEC, **KW)
    dp = DataParallelLearner(str(tiny_model_dir), SPEC, 2, [{"num_cpus": 0.5}] * 2, timeout_s=300, threads=1, **KW)
    try:
        assert dp.backend == "gloo"
        objective = make_objective("interq", clip_eps=0.2, dual_clip=10.0, kl_coef=0.01)
        b1, b2 = synthetic_batch(), synthetic_batch()
        single.fill_old_and_ref(b1)
        dp.fill_old_and_ref(b2)
        real = b1.attention_mask.bool()          # padding positions hold whatever their micro-batch left there
        assert (b1.old_logp - b2.old_logp)[real].abs().max() < 1e-5
        assert (b1.ref_logp - b2.ref_logp)[real].abs().max() < 1e-5
        b2.old_logp, b2.ref_logp = b1.old_logp.clone(), b1.ref_logp.clone()   # the same batch from here on
        b1 = b1.weighted(objective.prepare(b1))
        b2 = b2.weighted(objective.prepare(b2))
        assert torch.equal(b1.token_weight, b2.token_weight)

        single.accumulate_grads(b1, objective, {})
        want = flat_grad(single.model)
        got = dp.reduced_gradients(b2, objective)
        assert torch.equal(got[0], got[1])                   # every rank holds the same summed gradient
        tol = 1e-5 * float(want.abs().max())
        print("gradient: max |Δ| / max |g| =", float((got[0] - want).abs().max()) / float(want.abs().max()))
        assert float((got[0] - want).abs().max()) <= tol, (float((got[0] - want).abs().max()), tol)
        assert float(want.abs().max()) > 0

        # one optimizer step each on the whole batch: the same statistics, and the same weights up to
        # Adam's normalisation of the re-associated gradient (|Δθ| ≤ lr · |Δg| / (|g| + eps) per entry)
        s1 = single.update(b1, objective, epochs=1, generator=torch.Generator().manual_seed(7))
        s2 = dp.update(b2, objective, epochs=1, generator=torch.Generator().manual_seed(7))
        assert s1["optimizer_steps"] == s2["optimizer_steps"] == 1
        for k in ("loss", "pg_loss", "kl", "clip_frac", "grad_norm"):
            assert s2[k] == pytest.approx(s1[k], rel=1e-4, abs=1e-7), k
        w1 = dict(single.named_weights())
        w2 = dict(dp.named_weights())
        diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
        assert diff < 5e-2 * KW["lr"]          # measured 8e-6 = 0.008 lr
        # checkpoints read the optimizer through the driver: AdamW state as one process has it
        st = dp.opt.state_dict()
        assert len(st["state"]) == len(single.opt.state_dict()["state"])
    finally:
        dp.close()


def test_prefix_sharing_shards_keep_a_group_on_one_rank():
    """With the rows' tokens, shards are runs of the token-sorted rows balanced by tokens: two
    groups of 3 rows (each sharing its first 5 tokens) and 2 loners over 2 ranks. The shards
    partition the rows, and a group is cut only where a shard boundary falls inside it."""
    ids = torch.zeros(8, 8, dtype=torch.long)
    for r in range(8):
        head = [1] * 5 if r in (0, 2, 4) else [2] * 5 if r in (1, 3, 5) else [r + 10] * 5
        ids[r] = torch.tensor(head + [r, r, r])
    lengths = torch.full((8,), 8)
    parts = [shard_rows(lengths, r, 2, ids).tolist() for r in range(2)]
    assert sorted(parts[0] + parts[1]) == list(range(8))
    assert parts == [[0, 2, 4, 1], [3, 5, 6, 7]]       # token order: group 1s, group 2s, then rows 6, 7
    # 32 tokens a rank: the boundary falls inside group 2 (row 1 on rank 0). With shorter loners
    # it falls between the groups (rows' token midpoints 4, 12, 20 | 28 of 56):
    lengths = torch.tensor([8, 8, 8, 8, 8, 8, 4, 4])
    parts = [shard_rows(lengths, r, 2, ids).tolist() for r in range(2)]
    assert parts == [[0, 2, 4], [1, 3, 5, 6, 7]]


def test_two_ranks_sharing_prefixes_give_the_one_process_gradient(ray_cluster, tiny_model_dir):
    """Packed learners computing shared prefixes once (`share_prefix`, the default): two groups of
    3 rows sharing a 40-token prompt. The ranks take a group each (`shard_rows` by tokens), save
    the same prefix tokens as one process, and sum to its gradient."""
    g = torch.Generator().manual_seed(3)
    n, L = 6, 64
    ids = torch.randint(3, 100, (n, L), generator=g)
    for r in range(n):
        ids[r, :40] = ids[0 if r < 3 else 3, :40]
    attn = torch.ones(n, L, dtype=torch.long)
    mask = ((torch.arange(L) >= 40) & (torch.arange(L) % 6 < 3)).float().expand(n, L).clone()
    seg = (mask.cumsum(1) > 0).long() * mask.long()
    kw = dict(KW, use_reference=False, pack_tokens=400)
    single = Learner(str(tiny_model_dir), SPEC, **kw)
    dp = DataParallelLearner(str(tiny_model_dir), SPEC, 2, [{"num_cpus": 0.5}] * 2, timeout_s=300, threads=1, **kw)
    try:
        objective = make_objective("grpo", kl_coef=0.0)
        batches = [PolicyBatch(ids, attn, mask, seg, -2.0 * mask, torch.tensor([1.0, -1.0, 0.5, -0.5, 0.2, -0.2]))
                   for _ in range(2)]
        single.fill_old_and_ref(batches[0])
        dp.fill_old_and_ref(batches[1])
        assert (batches[0].old_logp - batches[1].old_logp).abs().max() < 1e-5
        b1, b2 = (b.weighted(objective.prepare(b)) for b in (batches[0], batches[0]))
        single.accumulate_grads(b1, objective, {})
        want = flat_grad(single.model)
        got = dp.reduced_gradients(b2, objective)[0]
        assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
        s1 = single.update(b1, objective, generator=torch.Generator().manual_seed(7))
        s2 = dp.update(b2, objective, generator=torch.Generator().manual_seed(7))
        # (3 − 1) × 39 tokens per group, of 6 × 64
        assert s1["prefix_tokens_saved_frac"] == s2["prefix_tokens_saved_frac"] == pytest.approx(156 / 384)
    finally:
        dp.close()


def test_a_parameter_no_rank_has_a_gradient_for_is_skipped_as_in_one_process(tiny_model_dir, monkeypatch):
    """One process leaves an unused parameter's grad None, so AdamW skips it (no weight decay, no
    moment update); the all-reduce must too (a world of one gloo rank, in this process, is enough)."""
    import socket

    import torch.distributed as dist

    from agentq.learner import distributed
    from agentq.learner.distributed import RankLearner

    # a rank tunes glibc malloc for its process (a Ray worker's): not for this pytest process
    monkeypatch.setattr(distributed, "tune_malloc", lambda: "off: test")
    kw = {**KW, "use_reference": False, "weight_decay": 0.1}
    single = Learner(str(tiny_model_dir), SPEC, **kw)
    rank = RankLearner(0, 1, str(tiny_model_dir), SPEC, **kw)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rank.init_group("127.0.0.1", port, 60)
    try:
        for learner in (single, rank):
            learner.opt.zero_grad(set_to_none=True)
            for i, p in enumerate(learner.model.parameters()):
                if i != 3:                                  # parameter 3 is not used by this minibatch
                    p.grad = torch.full_like(p, 0.01)
            learner.reduce_grads()
            learner.opt.step()
        (n, p1), (_, p2) = list(single.model.named_parameters())[3], list(rank.model.named_parameters())[3]
        assert p1.grad is None and p2.grad is None
        assert torch.equal(p1, p2) and torch.equal(p2, dict(Learner(str(tiny_model_dir), SPEC, **kw).named_weights())[n])
        assert len(rank.opt.state.get(p2, {})) == len(single.opt.state.get(p1, {})) == 0
        w1, w2 = dict(single.named_weights()), dict(rank.named_weights())
        assert all(torch.equal(w1[k], w2[k]) for k in w1)    # the used parameters step identically
    finally:
        dist.destroy_process_group()


def test_an_error_on_one_rank_stops_every_rank_and_later_calls_fail_at_once(ray_cluster, tiny_model_dir):
    """Rank 0 (it holds the longest row) raises in the middle of the update, while rank 1 waits in the
    gradient all-reduce. The driver gets rank 0's error; the blocked rank must not make the next call
    wait the group's timeout (or pair its pending all-reduce with a new one): every rank is stopped
    and later calls fail at once, naming the first error."""
    class FailsOnTheLongestRow(GRPO):       # defined here: pickled by value to the ranks
        def loss(self, logp, mb):
            if int(mb.attention_mask.sum(1).max()) == 40:
                raise ValueError("injected failure on one rank")
            return GRPO.loss(self, logp, mb)

    kw = {**KW, "use_reference": False}
    dp = DataParallelLearner(str(tiny_model_dir), SPEC, 2, [{"num_cpus": 0.5}] * 2, timeout_s=60, threads=1, **kw)
    ranks = list(dp.ranks)
    try:
        objective = FailsOnTheLongestRow(kl_coef=0.0)
        batch = synthetic_batch()
        dp.fill_old_and_ref(batch)
        batch = batch.weighted(objective.prepare(batch))
        with pytest.raises(ValueError, match="injected failure on one rank"):
            dp.update(batch, objective, generator=torch.Generator().manual_seed(0))
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="stopped after an earlier failure: .*injected failure"):
            dp.fill_old_and_ref(synthetic_batch())
        assert time.monotonic() - t0 < 10          # not the 60 s the blocked rank would hold it
    finally:
        dp.close()
    for r in ranks:                                # no rank left running
        with pytest.raises(ray_cluster.exceptions.RayActorError):
            ray_cluster.get(r.close.remote(), timeout=30)


def _pid(ray, actor) -> int:
    return ray.get(actor.__ray_call__.remote(lambda self: __import__("os").getpid()), timeout=60)


@pytest.mark.parametrize("fault", ["died", "hung", "oom"])
def test_a_rank_that_dies_or_hangs_stops_the_run_with_one_line_naming_it(ray_cluster, tiny_model_dir, fault,
                                                                         monkeypatch):
    """A rank killed (kill -9) or stopped (kill -STOP) mid-run: the call raises RunAborted, whose one
    line (what the CLI prints) names the rank, the cause, placement.timeout_s for a hang and the
    resume; Ray's error is only chained, and every rank is stopped."""
    import os
    import signal

    from agentq.utils.errors import RunAborted

    kw = {**KW, "use_reference": False}
    dp = DataParallelLearner(str(tiny_model_dir), SPEC, 2, [{"num_cpus": 0.5}] * 2, timeout_s=120, threads=1, **kw)
    pid = _pid(ray_cluster, dp.ranks[1])
    try:
        dp.timeout_s = 5.0      # the start (model loads) had the long limit; this call gets a short one
        if fault == "oom":          # Ray's memory monitor's kill: its calls answer OutOfMemoryError
            dead_actors_answer_oom(ray_cluster, monkeypatch)
        os.kill(pid, signal.SIGSTOP if fault == "hung" else signal.SIGKILL)
        with pytest.raises(RunAborted) as err:
            dp.fill_old_and_ref(synthetic_batch())
        msg = str(err.value)
        assert "\n" not in msg and "Traceback" not in msg
        assert msg.startswith(f"learner rank 1 {'hung' if fault == 'hung' else 'died'}"), msg
        assert "logprobs_rows" in msg and "all 2 learner ranks were stopped" in msg
        assert msg.endswith("all 2 learner ranks were stopped")
        if fault == "hung":
            assert "placement.timeout_s=5 s" in msg
        elif fault == "oom":
            assert "(killed by Ray's memory monitor: OutOfMemoryError: 1 worker(s) were killed" in msg
        else:
            assert "ActorDiedError" in msg or "RayActorError" in msg
        assert isinstance(err.value.__cause__, ray_cluster.exceptions.RayError)
    finally:
        if fault == "hung":
            os.kill(pid, signal.SIGCONT)
        dp.close()
