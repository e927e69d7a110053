"""Rollout workers: N TorchEngines in Ray actors behind one RolloutBackend (`DistributedBackend`).

Episodes stick to one worker (their KV cache and sampling generator live there), the results equal
one in-process engine's turn for turn, weights broadcast through the object store are requantized
on every worker, and a killed worker is restarted with the latest weights while the episodes it
served come back as errors, which the agent loop reports as errored episodes."""
import os
import signal
import time

import pytest
import torch
from safetensors.torch import load_file

from agentq.agent import ActionParser, AgentLoop, BackendPolicy, ChatFormat, EpisodeSpec, PromptConfig, episode_seed
from agentq.kernels import QuantSpec
from agentq.pool import EnvSpec, InlinePool
from agentq.utils.errors import RunAborted
from agentq.rollout import SamplingParams, TurnRequest
from agentq.rollout.distributed import DistributedBackend, EngineWorker
from agentq.rollout.torch_engine.engine import TorchEngine
from proc_watch import gone, wait_until
from ray_faults import OOM, dead_actors_answer_oom, kill

SPEC = QuantSpec.preset("w8a8_kv8")
SP = SamplingParams(max_new_tokens=8)


def weights(path):
    return load_file(str(next(path.glob("*.safetensors"))))


def perturbed(w, scale=1e-2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) * v.abs().mean() if v.is_floating_point() else v
            for k, v in w.items()}


def distributed(path, tokenizer, workers=2, max_slots=8):
    from transformers import AutoConfig

    return DistributedBackend(AutoConfig.from_pretrained(path), SPEC, workers, max_slots, [{"num_cpus": 0.5}] * workers,
                              {"max_len": 1024, "dtype": torch.float32, "device": "cpu"}, tokenizer=tokenizer,
                              timeout_s=120, threads=1)


def turn(eids, contexts):
    return [TurnRequest(e, contexts[e], SP, seed=1000 + e) for e in eids]



def test_workers_match_one_engine_and_a_killed_worker_is_restarted(ray_cluster, tiny_model_dir, tokenizer):
    local = TorchEngine.from_pretrained(str(tiny_model_dir), SPEC, max_slots=8, max_len=1024, tokenizer=tokenizer)
    dist = distributed(tiny_model_dir, tokenizer)
    try:
        dist.update_weights(weights(tiny_model_dir).items(), version=0)    # both start from the checkpoint
        w1 = perturbed(weights(tiny_model_dir))
        stats = [b.update_weights(w1.items(), version=1) for b in (local, dist)]
        # fresh-scale requantization on the workers: the same fraction of int8 codes changes as locally
        assert stats[1].int8_codes_changed == pytest.approx(stats[0].int8_codes_changed, abs=0)
        assert stats[1].int8_codes_changed > 0 and dist.policy_version == 1
        ctx = {e: [5 + (e * 7 + j) % 80 for j in range(12 + e)] for e in range(4)}

        def both(eids):
            a, b = local.generate(turn(eids, ctx)), dist.generate(turn(eids, ctx))
            for x, y in zip(a, b):
                assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
                assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-5
                ctx[x.episode_id] = ctx[x.episode_id] + x.token_ids + [9, 10]   # the next turn's context
            return b

        both([0, 1, 2, 3])
        owners = [dist.worker_of(e) for e in range(4)]
        assert sorted(owners) == [0, 0, 1, 1]            # least-loaded assignment: 2 episodes each
        both([0, 1, 2, 3])                               # turn 2 goes to the same workers (sticky)
        assert [dist.worker_of(e) for e in range(4)] == owners

        kill(ray_cluster, dist.workers[1])
        res = dist.generate(turn([0, 1, 2, 3], ctx))
        lost = [e for e in range(4) if owners[e] == 1]
        assert [r.finish_reason == "error" for r in res] == [owners[e] == 1 for e in range(4)]
        assert all("rollout worker 1 died" in res[e].error for e in lost) and dist.restarts == 1
        assert dist._load == [2, 0]                      # the restarted worker holds nothing

        # the restarted worker came back with the latest weights: new episodes on it equal the local engine
        for e in lost:
            local.release(e)
        for e in (4, 5):
            ctx[e] = [11 + j for j in range(10)]
        both([4, 5])
        assert [dist.worker_of(e) for e in (4, 5)] == [1, 1]
        # two new episodes with one context (a GRPO group) go to one worker, which prefills it once;
        # least-loaded assignment alone would split them over the two workers (loads 2 and 2)
        ctx[6] = ctx[7] = [13 + (3 * j) % 70 for j in range(20)]
        both([6, 7])
        assert dist.worker_of(6) == dist.worker_of(7) == 0
        # episodes 4 / 5 (10 tokens) and 6 / 7 (20) shared their first context: the workers' counts add up
        assert dist.prefill_counts()["prefill_shared_tokens"] == local.prefill_counts()["prefill_shared_tokens"] == 30
    finally:
        dist.close()


def test_agent_loop_reports_a_worker_killed_mid_step_as_errored_episodes(ray_cluster, tiny_model_dir, tokenizer):
    chat = ChatFormat.from_tokenizer(tokenizer)
    pool = InlinePool(EnvSpec("textworld_express", {"games": ["coin"], "split": "train", "max_steps": 4,
                                                    "game_params": {"coin": "numLocations=2"}}), 4)
    loop = AgentLoop(pool, chat, PromptConfig(system="SYS"), ActionParser(), SamplingParams(max_new_tokens=12),
                     max_turns=4, max_context_tokens=1024)
    dist = distributed(tiny_model_dir, tokenizer)
    dist.update_weights(weights(tiny_model_dir).items(), version=0)

    class KillAfterFirstTurn(BackendPolicy):
        """Kills worker 1 once the first turn has come back (a crash in the middle of the step)."""
        calls = 0

        def __call__(self, requests, infos):
            out = super().__call__(requests, infos)
            self.calls += 1
            if self.calls == 1:
                self.owners = {r.episode_id: dist.worker_of(r.episode_id) for r in requests}
                kill(ray_cluster, dist.workers[1])
            return out

    try:
        specs = [EpisodeSpec(e, f"coin/{e}", "train", seed=episode_seed(0, e)) for e in range(4)]
        policy = KillAfterFirstTurn(dist)
        trajs = loop.run(specs, policy)
        on_dead = {e for e, w in policy.owners.items() if w == 1}
        assert len(on_dead) == 2 and dist.restarts == 1
        for t in trajs:
            if t.episode_id in on_dead and t.turns == 1:     # still running when the worker died
                assert t.end_reason == "error" and "rollout worker 1 died" in t.error
            else:
                assert t.end_reason != "error"
        assert sum(t.end_reason == "error" for t in trajs) >= 1
        again = loop.run([EpisodeSpec(e, f"coin/{e}", "train", seed=e) for e in range(10, 14)], BackendPolicy(dist))
        assert all(t.end_reason != "error" for t in again)   # the restarted worker serves new episodes
    finally:
        dist.close()
        pool.close()


def test_an_error_raised_in_one_worker_still_restarts_a_dead_one(ray_cluster, tiny_model_dir, tokenizer):
    """Worker 0 refuses its request (a token id outside the vocabulary) while worker 1 is dead: the
    error reaches the caller, and worker 1 is restarted with its episodes forgotten all the same."""
    dist = distributed(tiny_model_dir, tokenizer)
    try:
        dist.update_weights(weights(tiny_model_dir).items(), version=0)
        ctx = {e: [5 + (e * 7 + j) % 80 for j in range(12)] for e in range(2)}
        dist.generate(turn([0, 1], ctx))
        assert [dist.worker_of(e) for e in range(2)] == [0, 1]
        kill(ray_cluster, dist.workers[1])
        ctx[0] = ctx[0] + [10 ** 6]
        with pytest.raises(ValueError, match="episode 0: context id at position 12 is 1000000"):
            dist.generate(turn([0, 1], ctx))
        assert dist.restarts == 1 and 1 not in dist._owner and dist._load == [1, 0]
        dist.release(1)                  # the caller ends the lost episode; its id may then start afresh
        ctx[1] = [11 + j for j in range(10)]
        assert dist.generate(turn([1], ctx))[0].finish_reason != "error"      # the restarted worker plays
    finally:
        dist.close()


def test_episodes_of_a_restarted_worker_left_out_of_the_call_come_back_as_errors(ray_cluster, tiny_model_dir,
                                                                                 tokenizer):
    """A call that finds a worker dead restarts it; its episodes that were not in that call lost their KV
    and sampling generator too. Their next turn is an error (until released), not a silent replay from
    scratch on another worker with a fresh generator (tokens one engine would not have sampled)."""
    dist = distributed(tiny_model_dir, tokenizer)
    try:
        dist.update_weights(weights(tiny_model_dir).items(), version=0)
        ctx = {e: [5 + (e * 7 + j) % 80 for j in range(12 + e)] for e in range(4)}
        dist.generate(turn(range(4), ctx))
        on1 = [e for e in range(4) if dist.worker_of(e) == 1]
        on0 = [e for e in range(4) if dist.worker_of(e) == 0]
        kill(ray_cluster, dist.workers[1])
        res = dist.generate(turn([on0[0], on1[0]], ctx))
        assert res[0].finish_reason != "error" and res[1].finish_reason == "error" and dist.restarts == 1
        later = dist.generate(turn([on0[1], on1[1]], ctx))      # on1[1] was not in the call that found it dead
        assert later[0].finish_reason != "error"
        assert later[1].finish_reason == "error" and "rollout worker 1 died" in later[1].error
        assert later[1].token_ids == [] and dist._load == [2, 0]
        dist.release(on1[1])                            # released: the id may start a new episode
        assert dist.generate(turn([on1[1]], ctx))[0].finish_reason != "error"
    finally:
        dist.close()


def test_a_sync_that_fails_on_one_worker_serves_nothing_until_a_full_sync(ray_cluster, tiny_model_dir, tokenizer):
    """Worker 1's update_weights raises (version 2): worker 0 serves version 2, worker 1 version 1. No
    turn may be served from that mix; the next complete sync serves again, one version everywhere."""
    class FailsVersion2(EngineWorker):      # defined here: pickled by value into the actor
        def update_weights(self, weights, version):
            if version == 2:
                raise RuntimeError("injected: this worker's weight sync failed")
            return EngineWorker.update_weights(self, weights, version)

    dist = distributed(tiny_model_dir, tokenizer)
    try:
        dist._cls = ray_cluster.remote(max_restarts=0)(FailsVersion2)
        ray_cluster.kill(dist.workers[1])
        dist.workers[1] = dist._start(1)
        w = weights(tiny_model_dir)
        dist.update_weights(w.items(), version=1)
        ctx = {e: [5 + (e * 7 + j) % 80 for j in range(12 + e)] for e in range(2)}
        assert [r.policy_version for r in dist.generate(turn([0, 1], ctx))] == [1, 1]
        assert sorted(dist.worker_of(e) for e in range(2)) == [0, 1]
        with pytest.raises(RuntimeError, match="injected"):
            dist.update_weights(perturbed(w).items(), version=2)
        with pytest.raises(RuntimeError, match="update_weights failed on a rollout worker"):
            dist.generate(turn([0, 1], ctx))
        with pytest.raises(RuntimeError, match="update_weights failed on a rollout worker"):
            dist.score(ctx[0], [5, 6])
        dist.update_weights(perturbed(w, seed=1).items(), version=3)
        assert [r.policy_version for r in dist.generate(turn([0, 1], ctx))] == [3, 3]
    finally:
        dist.close()


@pytest.mark.timeout(180)
def test_a_worker_that_cannot_restart_is_reported_and_ends_the_run_after_three_tries(ray_cluster, tiny_model_dir,
                                                                                    tokenizer, tmp_path):
    """Worker 1 dies and cannot be built again (its engine's constructor raises): the restart is awaited,
    its episodes come back with the constructor's error, it is tried again at each call (new episodes sent
    to it are answered with errors), and the third failed start in a row ends the run with that error. It
    was restarted without a wait at every call, each of its episodes lost as "died (ActorDiedError)",
    never giving up. Once it can start again, it serves."""
    flag = str(tmp_path / "cannot-start")

    class FailsWhileFlagged(EngineWorker):      # defined here: pickled by value into the actor
        def __init__(self, *args, **kw):
            if os.path.exists(flag):
                raise RuntimeError("injected: cannot build the engine")
            super().__init__(*args, **kw)

    dist = distributed(tiny_model_dir, tokenizer)
    try:
        dist._cls = ray_cluster.remote(max_restarts=0)(FailsWhileFlagged)     # used by restarts
        dist.update_weights(weights(tiny_model_dir).items(), version=0)
        ctx = {e: [5 + (e * 7 + j) % 80 for j in range(12 + e)] for e in range(16)}
        dist.generate(turn(range(4), ctx))
        assert [dist.worker_of(e) for e in range(4)] == [0, 1, 0, 1]
        open(flag, "w").close()
        kill(ray_cluster, dist.workers[1])

        def play(eids):
            res = dist.generate(turn(eids, ctx))
            for e in eids:
                dist.release(e)
            return [r.error for r in res]

        errors = play([0, 1, 2, 3])                                        # failed start 1
        assert errors[0] is None and errors[2] is None and dist.restarts == 1
        assert errors[1] == errors[3] == ("rollout worker 1 died (ActorDiedError); could not be restarted "
                                          "(RuntimeError: injected: cannot build the engine); "
                                          "tried again at the next call")
        errors = play([4, 5, 6, 7])                                        # 2: new episodes sent to it are lost
        assert [e is None for e in errors] == [True, False, True, False] and dist.restarts == 2
        assert errors[1] == ("rollout worker 1 is down: it could not be started (RuntimeError: injected: cannot build "
                             "the engine)")
        with pytest.raises(RunAborted, match="^rollout worker 1 could not be started 3 times in a row; giving up: "
                                               "RuntimeError: injected: cannot build the engine$"):
            play([8, 9, 10, 11])                                           # 3
        assert dist.restarts == 3
        for e in (8, 9, 10, 11):
            dist.release(e)
        os.unlink(flag)
        assert play([12, 13, 14, 15]) == [None] * 4 and dist.restarts == 4  # tried again: up, and it serves
        assert [dist._load, dist._failures.down] == [[0, 0], {}]
    finally:
        dist.close()


@pytest.mark.timeout(120)
def test_a_worker_killed_by_rays_memory_monitor_is_restarted_not_raised(ray_cluster, tiny_model_dir, tokenizer,
                                                                        monkeypatch):
    """Ray answers every call to an actor that its memory monitor killed with OutOfMemoryError, not a
    RayActorError (test_ray_oom_kills.py sees it with the monitor itself, -m slow; here the worker is
    ray.kill-ed and its calls answered so, `dead_actors_answer_oom`). `generate` took it for an error of
    the call (bad input): it reached the trainer, and the worker was never restarted, so every later
    call raised it again; `prefill_counts`, at every RL step's start, raised it too. Found by
    `prefill_counts` (the step's first call), the worker is restarted there, its episodes reported at
    their next turn with that cause."""
    dist = distributed(tiny_model_dir, tokenizer)
    try:
        dist.update_weights(weights(tiny_model_dir).items(), version=0)
        ctx = {e: [5 + (e * 7 + j) % 80 for j in range(12 + e)] for e in range(8)}
        dist.generate(turn(range(4), ctx))
        assert [dist.worker_of(e) for e in range(4)] == [0, 1, 0, 1]
        kill(ray_cluster, dist.workers[1])
        dead_actors_answer_oom(ray_cluster, monkeypatch)
        res = dist.generate(turn(range(4), ctx))
        assert [r.finish_reason for r in res] == ["length", "error", "length", "error"] and dist.restarts == 1
        oom = f"rollout worker 1 died (killed by Ray's memory monitor: OutOfMemoryError: {OOM.splitlines()[0]})"
        assert res[1].error == res[3].error == f"{oom}; restarted"
        for e in range(4):
            dist.release(e)
        assert [r.finish_reason for r in dist.generate(turn(range(4, 8), ctx))] == ["length"] * 4
        assert [dist.worker_of(e) for e in range(4, 8)] == [0, 1, 0, 1] and dist.restarts == 1
        ray_cluster.kill(dist.workers[1])
        with pytest.raises(ray_cluster.exceptions.OutOfMemoryError):     # once dead: answered as `kill` waits
            while True:
                ray_cluster.get(dist.workers[1].__ray_ready__.remote(), timeout=30)
        alone = ray_cluster.get(dist.workers[0].prefill_counts.remote())
        assert dist.prefill_counts() == alone and dist.restarts == 2         # worker 0's counts; 1 restarted
        res = dist.generate(turn(range(4, 8), ctx))
        assert [r.finish_reason for r in res] == ["length", "error", "length", "error"]
        assert res[1].error == res[3].error == f"{oom}; the episode's state was lost with it (the worker is replaced)"
    finally:
        dist.close()


@pytest.mark.timeout(180)
def test_a_worker_that_dies_at_every_generate_ends_the_run_though_its_other_calls_complete(
        ray_cluster, tiny_model_dir, tokenizer, tmp_path, monkeypatch):
    """Worker 1 starts fine but dies in every `generate` while a flag file exists (the workers are built
    from a class that dies then on an odd episode id, and worker 1 gets those). Each RL step also calls
    `prefill_counts` (before and after collecting, trainer/rl.py) and `update_weights`, and the freshly
    restarted worker completes those: the count of calls it died in went 1, 0, 1, 0, ..., so it was
    restarted at every step for good (each of its episodes an error, the run never ending). Now each
    method is counted on its own: the third `generate` in a row it dies in ends the run with one line
    naming the worker, the method, the count and the last cause; a completed `generate` in between
    starts that count again, and each death's episodes come back as errors."""
    flag = str(tmp_path / "die")

    class DiesWhileFlagged(EngineWorker):      # defined here: pickled by value into the actor
        def generate(self, requests):
            if os.path.exists(flag) and any(r.episode_id % 2 for r in requests):
                os._exit(1)
            return EngineWorker.generate(self, requests)

    monkeypatch.setattr("agentq.rollout.distributed.EngineWorker", DiesWhileFlagged)
    dist = distributed(tiny_model_dir, tokenizer)
    w = weights(tiny_model_dir)
    try:
        dist.update_weights(w.items(), version=0)
        ctx = {e: [5 + (e * 7 + j) % 80 for j in range(12)] for e in range(12)}
        eids, versions = iter(range(0, 12, 2)), iter(range(1, 7))

        def rl_step(dies: bool) -> list:
            """One RL step's calls to the backend, as trainer/rl.py makes them; the turn's errors."""
            if dies:
                open(flag, "w").close()
            elif os.path.exists(flag):
                os.unlink(flag)
            e = next(eids)
            dist.prefill_counts()
            try:
                errors = [r.error for r in dist.generate(turn([e, e + 1], ctx))]
            finally:
                dist.release(e)
                dist.release(e + 1)
            dist.prefill_counts()
            dist.update_weights(w.items(), version=next(versions))
            return errors

        died = [None, "rollout worker 1 died (ActorDiedError); restarted"]
        assert rl_step(dies=True) == died
        assert rl_step(dies=False) == [None, None]                           # a completed generate: count again
        assert rl_step(dies=True) == rl_step(dies=True) == died
        with pytest.raises(RunAborted) as error:
            rl_step(dies=True)
        assert str(error.value) == ("rollout worker 1 died or hung in 3 generate calls in a row without completing "
                                    "one (restarted after each); giving up: died (ActorDiedError)")
        assert dist.restarts == 4 and dist.policy_version == 4               # raised in generate, before the sync
    finally:
        dist.close()


@pytest.mark.timeout(360)       # past the code's own bounds: a start of 120 s, two restarts of 60 s, two hangs
def test_a_hung_worker_costs_one_timeout_at_a_steps_start(ray_cluster, tiny_model_dir, tokenizer, monkeypatch):
    """An RL step starts with `prefill_counts` and then `generate` (trainer/rl.py). With worker 1 stopped
    (SIGSTOP), `prefill_counts` waited out `timeout_s` and left it as it was, and `generate` waited out
    `timeout_s` again before restarting it: two timeouts. Now the first wait that finds it hung restarts
    it: one timeout in all, its episodes come back as errors naming the hang, the others play on. A
    `score` that finds its worker hung restarts it too (and raises: no episode carries the error).

    `timeout_s` also bounds a restart, and a new worker takes ~7.5 s to build its engine on an idle
    2-core machine: with the hang's 8 s as that bound too, a starved CPU failed the restart and its retry
    at `generate` (3 timeouts, a flake). A start here gets 60 s; the hang is still waited out in 8 s,
    whatever the load."""
    from agentq.rollout import distributed as distributed_module

    dist = distributed(tiny_model_dir, tokenizer)
    expired = []
    get, start_problem = ray_cluster.get, distributed_module.actor_start_problem

    def counted_get(*args, **kw):
        try:
            return get(*args, **kw)
        except ray_cluster.exceptions.GetTimeoutError:
            expired.append(kw.get("timeout"))
            raise
    try:
        dist.update_weights(weights(tiny_model_dir).items(), version=0)
        ctx = {e: [5 + (e * 7 + j) % 80 for j in range(12)] for e in range(4)}
        dist.generate(turn(range(4), ctx))
        assert [dist.worker_of(e) for e in range(4)] == [0, 1, 0, 1]
        pid = ray_cluster.get(dist.workers[1].__ray_call__.remote(lambda self: os.getpid()))
        os.kill(pid, signal.SIGSTOP)
        dist.timeout_s = 8.0
        monkeypatch.setattr(distributed_module, "actor_start_problem",
                            lambda ray, actor, timeout, limit: start_problem(ray, actor, 60.0, limit))
        monkeypatch.setattr(ray_cluster, "get", counted_get)
        t0 = time.monotonic()
        dist.prefill_counts()
        # the step's first call waited out the hang, once, and restarted worker 1 (its episodes: errors)
        assert len(expired) == 1 and dist.restarts == 1 and time.monotonic() - t0 >= dist.timeout_s
        t1 = time.monotonic()
        res = dist.generate(turn(range(4), ctx))
        # ... so `generate` waited on no hung worker: no second timeout
        assert len(expired) == 1 and dist.restarts == 1 and time.monotonic() - t1 < dist.timeout_s
        assert [r.finish_reason for r in res] == ["length", "error", "length", "error"]
        assert res[1].error == res[3].error == ("rollout worker 1 hung: no answer within 8 s (placement.timeout_s); "
                                                "killed; the episode's state was lost with it (the worker is replaced)")
        assert wait_until(lambda: gone(pid))
        # `score` (worker 0's) waited out its timeout and left the worker hung for the next call: now it
        # restarts it and raises, and the next score is answered
        monkeypatch.setattr(ray_cluster, "get", get)
        want = dist.score(ctx[0], [7, 8])
        pid0 = ray_cluster.get(dist.workers[0].__ray_call__.remote(lambda self: os.getpid()))
        os.kill(pid0, signal.SIGSTOP)
        with pytest.raises(RuntimeError) as e:
            dist.score(ctx[0], [7, 8])
        assert str(e.value) == ("score: rollout worker 0 hung: no answer within 8 s (placement.timeout_s); killed; "
                                "restarted") and dist.restarts == 2
        assert wait_until(lambda: gone(pid0)) and dist.score(ctx[0], [7, 8]) == want
    finally:
        dist.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", ["dies", "hangs"])
def test_a_worker_lost_while_reading_the_kv_size_at_start_up_is_restarted_then_given_up_on(
        fault, ray_cluster, tiny_model_dir, tokenizer, tmp_path, monkeypatch):
    """The start-up asked worker 0 for the engines' KV-cache bytes per token of Ray directly: a worker that
    died there failed the start-up with Ray's ActorDiedError (a hung one, with GetTimeoutError), neither
    restarted nor counted. Now it is asked as every call is: one that dies or hangs in it once is restarted
    and asked again (the backend starts); one that dies at every start-up ends it with the give-up line
    after three, and no worker is left running."""
    once, always, started = tmp_path / "once", tmp_path / "always", tmp_path / "started"
    started.mkdir()

    class LostReadingKV(EngineWorker):      # defined here: pickled by value into the actor
        def __init__(self, *args, **kw):
            (started / str(os.getpid())).touch()
            super().__init__(*args, **kw)

        def kv_bytes_per_token(self):
            if always.exists() or not once.exists():
                once.touch()
                if fault == "dies":
                    os._exit(1)
                os.kill(os.getpid(), signal.SIGSTOP)
            return EngineWorker.kv_bytes_per_token(self)

    monkeypatch.setattr("agentq.rollout.distributed.EngineWorker", LostReadingKV)
    from transformers import AutoConfig

    def start():
        # a hang costs one timeout_s: short, yet long enough for a worker to build its engine
        return DistributedBackend(AutoConfig.from_pretrained(tiny_model_dir), SPEC, 1, 2, [{"num_cpus": 0.5}],
                                  {"max_len": 1024, "dtype": torch.float32, "device": "cpu"}, tokenizer=tokenizer,
                                  timeout_s=120 if fault == "dies" else 30, threads=1)

    local = TorchEngine.from_pretrained(str(tiny_model_dir), SPEC, max_slots=2, max_len=1024, tokenizer=tokenizer)
    dist = start()
    try:
        assert dist.restarts == 1 and dist.kv_bytes_per_token() == local.kv_bytes_per_token() > 0
        dist.update_weights(weights(tiny_model_dir).items(), version=0)
        assert dist.generate(turn([0], {0: list(range(5, 17))}))[0].finish_reason != "error"
    finally:
        dist.close()
    if fault == "dies":         # the give-up takes this path after a hang too, three timeouts later
        always.touch()
        with pytest.raises(RunAborted) as error:
            start()
        assert str(error.value) == ("rollout worker 0 died or hung in 3 kv_bytes_per_token calls in a row without "
                                    "completing one (restarted after each); giving up: died (ActorDiedError)")
    pids = [int(p.name) for p in started.iterdir()]
    # two workers above; then the first and its three restarts (as a call that gives up: restarted, then raised)
    assert len(pids) == (2 + 4 if fault == "dies" else 2) and wait_until(lambda: all(gone(pid) for pid in pids))


def test_prefill_counts_carry_a_restarted_workers_count_over_its_restart():
    """A step's prefill_* metrics are the difference of two `prefill_counts`. The workers' current counts
    were summed: a restarted worker's count fell back to 0, the total fell below the step's start, and
    the trainer's clamp at 0 wiped the surviving worker's count too. Now each worker adds its own
    delta, a restarted one's from its restart (its new engine counts from 0)."""
    from agentq.rollout.distributed import PrefillTally

    tally = PrefillTally(2)
    tally.report(0, {"prefill_computed_tokens": 10, "prefill_cached_tokens": 3})
    tally.report(1, {"prefill_computed_tokens": 50, "prefill_cached_tokens": 7})
    before = tally.total()
    assert before == {"prefill_computed_tokens": 60, "prefill_cached_tokens": 10}
    tally.restarted(1)                    # worker 1 died in the step; its new engine counted 4 since
    tally.report(0, {"prefill_computed_tokens": 30, "prefill_cached_tokens": 8})
    tally.report(1, {"prefill_computed_tokens": 4, "prefill_cached_tokens": 0})
    step = {k: v - before[k] for k, v in tally.total().items()}
    assert step == {"prefill_computed_tokens": (30 - 10) + 4, "prefill_cached_tokens": (8 - 3) + 0}
    tally.restarted(1)                    # restarted again before it reported: nothing counted twice
    tally.restarted(1)
    assert tally.total() == {"prefill_computed_tokens": 34 + 50, "prefill_cached_tokens": 8 + 7}
