"""`agentq train`'s last words: an unnamed run's folder is runs/<env>-<algo>-<time>, so the command
says where it went, its final checkpoint (what `agentq eval` takes) and the held-out result; and the
settings it refuses say so in one line, before anything is written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentq.cli import main


def test_train_says_where_the_run_went_and_how_it_ended(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "trainer.steps=1", "trainer.tasks_per_step=1", "trainer.group_size=2", "env.max_steps=2",
                 "env.max_new_tokens=8", "env_pool=inline", "trainer.eval_num_tasks=2"]) == 0
    (run,) = (tmp_path / "runs").glob("textworld_express-interq-*")
    said = capsys.readouterr().err
    rel = run.relative_to(tmp_path)
    assert f"run folder {rel}; final checkpoint {rel / 'checkpoints' / 'step_000001'}; held-out test: success " in said
    assert f"of 2 episodes ({rel / 'eval' / 'step_000001'}); HTML report: agentq report {rel}" in said
    # what runs quantized, said at start-up: the tiny model's 2 layers × 7 projections, its LM head not
    assert ("numerics: rollout w8a8_kv8: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj W8A8 "
            "(int8 weights per channel, int8 activations per token); int8 KV per token and head; embed_tokens, "
            "lm_head in the compute dtype · learner aligned to it; 14 linears fake-quantized, 1 in full precision"
            ) in said.replace("\n", " ")


def test_an_ais_run_whose_gate_never_opened_says_so_at_its_end(tmp_path, capsys):
    """The tiny model's aligned learner sits far below AIS's k_on: its run was GRPO's, said in a warning
    and in train_summary.json's notes (a plain interq run has none)."""
    run = tmp_path / "run"
    assert main(["train", "algo=ais", "trainer.steps=1", "trainer.tasks_per_step=1", "trainer.group_size=2",
                 "env.max_steps=2", "env.max_new_tokens=8", "env_pool=inline", "trainer.eval_every=-1",
                 f"trainer.out_dir={run}"]) == 0
    (note,) = json.loads((run / "train_summary.json").read_text())["notes"]
    assert note.startswith("objective 'ais': ais_gate was 0 at all 1 step(s) (K3 at most ") and note.endswith(
        "its parameters: is_cap 5, k_ref 0.05, k_on 0.0001): its correction never engaged, and these steps were "
        "plain GRPO's")
    assert f"warning: {note}" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("overrides, said", [
    (["rollout.temperature=0"], "agentq: rollout.temperature=0: RL needs a sampling temperature > 0"),
    (["rollout.top_k=5"], "agentq: rollout.top_k=5, rollout.top_p=1.0: RL training supports temperature-only"),
    (["trainer.old_logp=bypass"], "agentq: trainer.old_logp=bypass is exact only when"),     # fp32 on the CPU
    (["algo=flashrl_tis", "algo.objective_params.is_cap=-1"], "agentq: algo=flashrl_tis: objective 'tis': is_cap=-1"),
    (["algo.dual_clip=0.5"], "agentq: algo=interq: objective 'interq': dual_clip=0.5; valid: > 1"),
    (["algo.objective=foo"], "agentq: algo=interq: unknown objective 'foo'"),
    (["algo=ais", "algo.objective_params.k_on=abc"],         # was a traceback after the first rollout
     "agentq: algo=ais: objective 'ais': k_on='abc' is not a number; valid: ≥ 0, finite"),
    (["algo.objective_params.prefix_inclusive=flase"],
     "agentq: algo=interq: objective 'interq': prefix_inclusive='flase'; valid: true or false"),
])
def test_refused_algo_and_sampling_settings_are_one_line_before_the_run_folder(overrides, said, tmp_path, capsys):
    """These refusals were ValueErrors: a traceback and exit 1 (the objective's after the run folder was
    made); a config error is one line naming the key, exit 2, and nothing written."""
    run = tmp_path / "run"
    assert main(["train", *overrides, "trainer.steps=1", "env_pool=inline", f"trainer.out_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert not run.exists()


@pytest.mark.parametrize("override, said", [("placement.learner_ranks=0", "placement.learner_ranks=0: must be ≥ 1"),
                                            ("placement.timeout_s=-1", "placement.timeout_s=-1: must be > 0")])
def test_a_bad_placement_value_is_one_line(override, said, tmp_path, capsys):
    assert main(["train", "placement=split", override, "trainer.steps=1", "env_pool=inline",
                 f"trainer.out_dir={tmp_path / 'run'}"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"agentq: {said}"


def test_a_steps_means_leave_out_its_errored_episodes():
    """The step's success_rate, reward_mean and turns_mean counted an errored episode (a dead or hung
    worker's) as a zero-turn failure; the learner trains on the others alone, and so are the means."""
    from agentq.agent.trajectory import Trajectory
    from agentq.trainer.rl import ROLLOUT_KEYS, rollout_stats

    def ep(i, end, won, reward, turns):
        return Trajectory(i, f"t{i}", "train", end_reason=end, won=won, reward=reward, turns=turns)

    trajs = [ep(0, "won", True, 1.0, 2), ep(1, "failed", False, 0.0, 4), ep(2, "error", False, 0.0, 0),
             ep(3, "error", False, 0.0, 1)]
    row = rollout_stats(trajs)
    assert set(row) == {*ROLLOUT_KEYS, "episodes", "errored_episodes"}
    assert (row["episodes"], row["errored_episodes"]) == (4, 2)
    assert (row["success_rate"], row["reward_mean"], row["turns_mean"]) == (0.5, 0.5, 3.0)
    every = rollout_stats([ep(0, "error", False, 0.0, 0)])       # none completed: no means, not 0
    assert every["errored_episodes"] == 1 and all(every[k] != every[k] for k in ROLLOUT_KEYS)   # rates too


def test_each_step_row_logs_the_worker_restarts_since_the_previous_one():
    """The env pool and the rollout backend counted their restarts, and no row said so."""
    from types import SimpleNamespace

    from agentq.eval.metrics import worker_counts
    from agentq.trainer.rl import RLTrainer

    def counts(env: int, rollout: int, recovered: int = 0) -> dict:
        return {"env_worker_restarts": env, "rollout_worker_restarts": rollout, "env_recovered_episodes": recovered}
    pool, engine = SimpleNamespace(restarts=0, recovered_episodes=0), SimpleNamespace(restarts=0)
    trainer = SimpleNamespace(pool=pool, engine=engine, _restarts_logged=worker_counts(pool, engine))
    pool.restarts, engine.restarts, pool.recovered_episodes = 2, 1, 4
    assert RLTrainer._new_restarts(trainer) == counts(2, 1, 4)  # type: ignore[arg-type]
    assert RLTrainer._new_restarts(trainer) == counts(0, 0)  # type: ignore[arg-type]
    pool.restarts = 3
    assert RLTrainer._new_restarts(trainer) == counts(1, 0)  # type: ignore[arg-type]
    # an inline pool and a single engine restart nothing
    assert worker_counts(object(), object()) == counts(0, 0)


def test_the_run_totals_sum_the_steps_and_the_evaluations():
    """train_summary.json had no totals: a run's lost episodes and restarts were only in the rows.
    Rows from before a key existed (no restarts logged) count 0."""
    from agentq.eval.metrics import run_totals

    rows = [{"step": 1, "reward_mean": 0.0, "errored_episodes": 2, "env_worker_restarts": 1,
             "rollout_worker_restarts": 0, "env_recovered_episodes": 2},
            {"step": 1, "eval/errors": 3, "eval/env_worker_restarts": 1, "eval/rollout_worker_restarts": 1,
             "eval/env_recovered_episodes": 0},
            {"step": 2, "reward_mean": 0.0, "errored_episodes": 1},
            {"step": 2, "eval/errors": 0}]
    assert run_totals(rows) == {"errored_episodes": 3, "eval_errored_episodes": 3, "env_worker_restarts": 2,
                                "rollout_worker_restarts": 1, "env_recovered_episodes": 2}
    assert run_totals([]) == dict.fromkeys(run_totals(rows), 0)


@pytest.mark.parametrize("errors, tail", [(0, ""), (1, ", 1 of 4 errored (counted as lost)")])
def test_the_last_line_says_how_many_held_out_episodes_errored(errors, tail, capsys):
    """An env that raises in step lost its episodes: "success 0.0 % of 4 episodes" said nothing of it."""
    from agentq.trainer.rl import print_run_end

    final = {"split": "test", "success_rate": 0.0, "episodes": 4, "errors": errors, "out_dir": "r/eval/step_000002"}
    print_run_end({"run_dir": "r", "checkpoint": "r/checkpoints/step_000002", "final_eval": final})
    assert " ".join(capsys.readouterr().err.split()) == (
        "run folder r; final checkpoint r/checkpoints/step_000002; held-out test: success 0.0 % of 4 episodes "
        f"(r/eval/step_000002){tail}; HTML report: agentq report r")


def test_the_last_line_does_not_call_an_evaluation_on_the_training_split_held_out(capsys):
    """With env.eval_split = env.train_split the start-up warning says the evaluation measures training
    tasks, but the last line still said "held-out test"."""
    from agentq.trainer.rl import print_run_end

    final = {"split": "test", "success_rate": 0.5, "episodes": 4, "errors": 0, "out_dir": "r/eval/step_000002"}
    print_run_end({"run_dir": "r", "checkpoint": "r/checkpoints/step_000002", "final_eval": final}, "test")
    assert " ".join(capsys.readouterr().err.split()) == (
        "run folder r; final checkpoint r/checkpoints/step_000002; test (the training split, not held out): success "
        "50.0 % of 4 episodes (r/eval/step_000002); HTML report: agentq report r")

def test_held_out_episodes_that_errored_are_said_at_their_first_evaluation(monkeypatch, capsys):
    """docs/evaluation.md promised the trainer warns when an evaluation's episodes errored; only
    episodes that were not played were said (the errored ones reached only the last line). Said once,
    at the first evaluation that has them; an evaluation where every episode errored is a warning
    (the run goes on), in `agentq eval`'s words. Here `evaluate_policy` is replaced by its reports."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from agentq.trainer import rl

    reports = iter([{"episodes": 4, "errors": 0, "out_dir": "r/eval/step_000001"},
                    {"episodes": 4, "errors": 1, "first_error": "RuntimeError: no such door\nTraceback ...",
                     "out_dir": "r/eval/step_000002"},
                    {"episodes": 4, "errors": 4, "first_error": "RuntimeError: x", "out_dir": "r/eval/step_000003"}])
    monkeypatch.setattr(rl, "evaluate_policy", lambda *a, **k: next(reports))
    trainer = SimpleNamespace(cfg=OmegaConf.create({"env": {"name": "guess"}, "eval": {"repeats": 1}, "seed": 0}),
                              _eval_selection={2: ["a", "b"]}, engine=None, pool=None, chat=None, eval_split="test",
                              run_dir=Path("r"), n_conc=4, eval_history=[], logger=SimpleNamespace(log=lambda *a, **k: None))
    said = []
    for step in (1, 2, 3):
        rl.RLTrainer.evaluate(trainer, step, 2)             # type: ignore[arg-type]
        said.append(" ".join(capsys.readouterr().err.split()))
    where = "every error's traceback is under \"error\" in " + str(Path("r/eval/step_000002") / "episodes.jsonl")
    assert said == ["", "warning: 1 of 4 episodes errored (the environment failed; they count as lost in the success "
                        f"rate); first: RuntimeError: no such door; {where}", ""]     # the third: said already
    trainer.eval_history = []                               # a first evaluation where every episode errored
    reports = iter([{"episodes": 2, "errors": 2, "first_error": "RuntimeError: x", "out_dir": "r/eval/step_000001"}])
    rl.RLTrainer.evaluate(trainer, 1, 2)                    # type: ignore[arg-type]
    assert " ".join(capsys.readouterr().err.split()) == (
        "warning: the held-out evaluation at step 1: env.name='guess': all 2 episodes errored, so the evaluation says "
        "nothing about the policy; first: RuntimeError: x; every error's traceback is under \"error\" in "
        f"{Path('r/eval/step_000001') / 'episodes.jsonl'}")


def test_the_report_command_it_prints_pastes_as_one_argument(capsys):
    """A run folder with a space was printed bare ("agentq report runs/my run"): pasted, the command
    got two arguments."""
    import shlex

    from agentq.trainer.rl import print_run_end

    print_run_end({"run_dir": "/tmp/my runs/r", "checkpoint": "/tmp/my runs/r/checkpoints/step_000001",
                   "final_eval": None})
    said = capsys.readouterr().err.strip()
    assert said.endswith("HTML report: agentq report '/tmp/my runs/r'")
    assert shlex.split(said.split("HTML report: ", 1)[1]) == ["agentq", "report", "/tmp/my runs/r"]


@pytest.mark.parametrize("reasons, hint", [
    (["error", "error"], ""),
    (["error", "context"], ". 'context' means the first prompt does not fit env.max_context_tokens=8"),
])
def test_a_stopped_run_explains_context_only_when_an_episode_ended_so(reasons, hint):
    """The hint on "context" was added whatever the end reasons were (e.g. every episode errored)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from agentq.agent.trajectory import Trajectory
    from agentq.trainer.rl import RLTrainer
    from agentq.trainer.run_dir import RunAborted

    trainer = SimpleNamespace(skipped_in_a_row=1, run_dir=Path("r"), cfg=OmegaConf.create(
        {"trainer": {"max_skipped_steps": 2}, "env": {"max_context_tokens": 8}}))
    trainer._one_more_skipped = lambda: RLTrainer._one_more_skipped(trainer)     # type: ignore[arg-type]
    trajs = [Trajectory(i, f"t{i}", "train", end_reason=r) for i, r in enumerate(reasons)]
    with pytest.raises(RunAborted) as e:
        RLTrainer._skip_step(trainer, 3, trajs, {}, 0.1)      # type: ignore[arg-type]
    counts = "{'error': 2}" if hint == "" else "{'context': 1, 'error': 1}"
    assert str(e.value) == (f"2 steps in a row had no usable episode (last: end reasons {counts}; lost episodes' "
                            f"errors in {Path('r') / 'errors.jsonl'}); stopping (trainer.max_skipped_steps=2){hint}")


def test_a_skipped_step_of_errored_episodes_says_the_first_error_and_where_the_rest_are(capsys):
    """A step whose every episode errored (an env whose reset raises) said only "end reasons
    {'error': 4}", and a run that ended before trainer.max_skipped_steps exited 0 without the error
    text or errors.jsonl ever shown."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from agentq.agent.trajectory import Trajectory
    from agentq.trainer.rl import ROLLOUT_KEYS, RLTrainer

    trainer = SimpleNamespace(skipped_in_a_row=0, run_dir=Path("r"), cfg=OmegaConf.create(
        {"trainer": {"max_skipped_steps": 3}, "env": {"max_context_tokens": 8}}))
    trainer._one_more_skipped = lambda: RLTrainer._one_more_skipped(trainer)     # type: ignore[arg-type]
    err = "RuntimeError: reset [boom]\nTraceback (most recent call last):\n  ..."
    trajs = [Trajectory(i, f"t{i}", "train", end_reason="error", error=err) for i in range(2)]
    row = RLTrainer._skip_step(trainer, 1, trajs, {k: 0 for k in ROLLOUT_KEYS} | {"errors": 2}, 0.1)  # type: ignore[arg-type]
    assert row["skipped_step"] == 1
    said = " ".join(capsys.readouterr().err.split())
    assert said == ("step 1: no usable episode (2 episodes, end reasons {'error': 2}); skipped without an update "
                    "(1 in a row, limit 3); the first error, task 't0': RuntimeError: reset [boom] (each lost "
                    f"episode's error in {Path('r') / 'errors.jsonl'})")


@pytest.mark.parametrize("unplayed, limits, tail", [
    (2, {"max_context_tokens": 10}, ", 2 of 4 not played (their first prompt does not fit env.max_context_tokens=10; "
                                    "counted as lost)"),
    (1, None, ", 1 of 4 not played (their first prompt does not fit env.max_context_tokens; counted as lost)"),
])
def test_the_last_line_says_how_many_held_out_episodes_were_not_played(unplayed, limits, tail, capsys):
    """A held-out split whose first prompts do not fit the context budget said "success 0.0 % of 4
    episodes" while eval.json had unplayed: 4 (`agentq eval` refuses that evaluation)."""
    from agentq.trainer.rl import print_run_end

    final = {"split": "test", "success_rate": 0.0, "episodes": 4, "errors": 1, "unplayed": unplayed,
             "out_dir": "r/eval/step_000002", **({"limits": limits} if limits else {})}
    print_run_end({"run_dir": "r", "checkpoint": "r/checkpoints/step_000002", "final_eval": final})
    assert " ".join(capsys.readouterr().err.split()) == (
        "run folder r; final checkpoint r/checkpoints/step_000002; held-out test: success 0.0 % of 4 episodes "
        f"(r/eval/step_000002), 1 of 4 errored (counted as lost){tail}; HTML report: agentq report r")


def test_a_run_warns_when_its_eval_split_is_unplayed_or_the_training_split(tmp_path, capsys):
    """Trained with env.eval_split=train (its "held-out train" result is on training tasks) and a context
    budget no first prompt fits: both said at once, as `agentq eval` says them, and on the last line."""
    run = tmp_path / "run"
    assert main(["train", "trainer.steps=1", "trainer.tasks_per_step=1", "trainer.group_size=2", "env.max_steps=2",
                 "env.max_new_tokens=8", "env_pool=inline", "trainer.eval_num_tasks=2", "env.eval_split=train",
                 "env.max_context_tokens=16", f"trainer.out_dir={run}"]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert ("warning: env.eval_split='train' is env.train_split, the split training draws its tasks from: this "
            "evaluation measures training tasks, not held-out ones") in said
    assert "split='train' is" not in said.replace("env.eval_split='train' is", "")     # no key `train` refuses
    assert ("warning: the held-out evaluation at step 1: none of the 2 episodes played a turn (2 ended before it: "
            "their first prompt does not fit env.max_context_tokens=16 (raise it, or shorten env.prompt / "
            "env.prompt.max_obs_chars))") in said
    assert (f"; train (the training split, not held out): success 0.0 % of 2 episodes ({run / 'eval' / 'step_000001'}), "
            "2 of 2 not played (their "
            "first prompt does not fit env.max_context_tokens=16; counted as lost)") in said


def test_a_step_where_no_reply_parses_says_the_update_learns_nothing(tmp_path, capsys):
    """The untrained tiny model never writes <action>...</action>: every reward and advantage alike,
    "reward 0.000 ... loss 0.0000" on the console and the cause only in metrics.jsonl. Said once."""
    from agentq.config import load_config
    from agentq.trainer.rl import warn_no_parsed_actions

    warn_no_parsed_actions(load_config([]), 3, {"invalid_action_rate": 0.5})
    # NaN: every episode of the step errored (the env's fault, its own line): no advice about the model
    warn_no_parsed_actions(load_config([]), 3, {"invalid_action_rate": float("nan")})
    assert capsys.readouterr().err == ""
    run = tmp_path / "run"
    assert main(["train", "trainer.steps=2", "trainer.tasks_per_step=1", "trainer.group_size=2", "env.max_steps=2",
                 "env.max_new_tokens=8", "env_pool=inline", "trainer.eval_every=-1", f"trainer.out_dir={run}"]) == 0
    rates = [json.loads(line)["invalid_action_rate"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if "invalid_action_rate" in line]
    said = " ".join(capsys.readouterr().err.split())
    warning = ("warning: step 1: no reply had a parseable <action>...</action> (invalid_action_rate 1.0), so every "
               "episode scores alike and the update learns nothing. An untrained model never writes one: start from "
               "an SFT checkpoint (agentq sft, then model.path=<its checkpoint>; or agentq pipeline), or "
               "model.path=<a model that follows the prompt>")
    assert rates == [1.0, 1.0] and said.count("no reply had a parseable") == 1 and warning in said


def test_a_second_ctrl_c_while_the_run_closes_still_says_where_it_stands(tmp_path, monkeypatch, capsys):
    """Ctrl-C, then Ctrl-C again while the env workers close: the second interrupt replaced the first,
    and with it the line naming the run folder and how to go on. The closing still finishes (the lock
    released: the folder's run can be started again at once)."""
    from agentq.trainer import rl

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    close = rl.RLTrainer.close
    closes = []

    def interrupted_close(self):
        closes.append(1)
        if len(closes) == 1:
            raise KeyboardInterrupt        # the second Ctrl-C, at the start of the first close
        close(self)

    def stop_at_once(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(rl.RLTrainer, "_train", stop_at_once)
    monkeypatch.setattr(rl.RLTrainer, "close", interrupted_close)
    quick = ["env_pool=inline", "env.max_steps=2", "env.max_new_tokens=8", "trainer.steps=1",
             "trainer.tasks_per_step=1", "trainer.group_size=2", "trainer.eval_num_tasks=1"]
    assert main(["train", *quick, f"trainer.out_dir={run}"]) == 130
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        f"agentq: interrupted: run folder {run} has no checkpoint yet; start it again with agentq train ")
    assert len(closes) == 2
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert main(["train", *quick, f"trainer.out_dir={run}", "trainer.overwrite=true"]) == 0


def test_missing_held_out_data_is_refused_before_the_model_build(tmp_path, monkeypatch, capsys):
    """`agentq train env=alfworld` without the real games built the model (~35 s) and only then found
    env.eval_split's games missing; the message now names the setting that plays generated ones."""
    pytest.importorskip("alfworld")
    from agentq.trainer.rl import RLTrainer

    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    monkeypatch.setattr(RLTrainer, "_build", lambda self, init_path: pytest.fail("the model was built"))
    run = tmp_path / "run"
    assert main(["train", "env=alfworld", "trainer.steps=1", "env.max_steps=8", "env_pool=inline",
                 f"env.kwargs.cache_dir={tmp_path / 'cache'}", f"trainer.out_dir={run}"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    # the key that gave the split leads; the env's hint names the generated split to give it
    assert "agentq: env.eval_split='valid_unseen': ALFWorld split 'valid_unseen' not found" in err
    assert "which needs no download: gen_unseen in place of valid_unseen." in err
    assert not run.exists()


def test_steps_whose_every_gradient_is_nan_are_said_and_stop_the_run(tmp_path, monkeypatch, capsys):
    """An objective whose loss was NaN skipped every optimizer step without a word: the run ended with
    status 0 and "final checkpoint", the untrained weights, and grad_norm 0.0 in metrics.jsonl. Each such
    step is now said, and trainer.max_skipped_steps of them in a row stop the run."""
    import json

    from agentq.algos import GRPO

    real = GRPO.loss
    monkeypatch.setattr(GRPO, "loss", lambda self, logp, mb: (lambda out: (out[0] * float("nan"), out[1]))(
        real(self, logp, mb)))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "trainer.steps=3", "trainer.max_skipped_steps=2", "trainer.tasks_per_step=1",
                 "trainer.group_size=2", "env.max_steps=2", "env.max_new_tokens=8", "env_pool=inline",
                 "trainer.eval_every=-1"]) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert ("step 1: every minibatch's gradient was NaN or inf, so no optimizer step ran and the weights did not change "
            "(1 such or skipped steps in a row, limit 2;") in said
    assert "agentq: run stopped: 2 steps in a row changed no weight (every gradient NaN or inf); stopping " \
           "(trainer.max_skipped_steps=2)" in said
    (run,) = (tmp_path / "runs").glob("textworld_express-interq-*")
    # every stop of agentq train ends with where the run stands, as a Ctrl-C does (`interrupted_text`)
    assert f"(trainer.max_skipped_steps=2); run folder {run.relative_to(tmp_path)} has no checkpoint yet; start it " \
           "again with agentq train trainer.steps=3" in said
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["optimizer_steps"], r["grad_norm"]) for r in rows] == [(1, 0, None)]


def test_objective_stats_named_like_agentqs_metrics_are_refused():
    """A `prepare` stat named kl, grad_norm or k3 replaced agentq's own number in the row without a word."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from agentq.learner.learner import update_summary
    from agentq.trainer.rl import RLTrainer
    from agentq.trainer.run_dir import RunAborted

    trainer = SimpleNamespace(skipped_in_a_row=2, cfg=OmegaConf.create({"algo": {"objective": "gspo"},
                                                                        "trainer": {"max_skipped_steps": 3}}))
    with pytest.raises(RunAborted, match=r"^the objective 'gspo' logs \['grad_norm', 'kl'\] from its prepare, names "
                                         r"of agentq's own metrics, which they would replace: rename them$"):
        RLTrainer._check_update(trainer, 1, {"optimizer_steps": 1}, {"kl", "grad_norm"})     # type: ignore[arg-type]
    RLTrainer._check_update(trainer, 1, {"optimizer_steps": 1}, set())     # type: ignore[arg-type]
    assert trainer.skipped_in_a_row == 0            # a step that changed the weights ends a run of skipped ones
    with pytest.raises(ValueError, match=r"loss stats \['grad_norm'\] are names of the update's own metrics"):
        update_summary({"grad_norm": 1.0, "pg_loss": 0.5}, [1.0])


def test_the_replay_warning_is_said_once_a_run_and_recorded_at_every_evaluation(tmp_path, capsys):
    """TextWorldExpress's test split replays train games; the trainer said so at every evaluation.
    Now once (the selection's tasks do not change); each eval.json still records them."""
    run = tmp_path / "run"
    assert main(["train", "trainer.steps=2", "trainer.eval_every=1", "trainer.tasks_per_step=1", "trainer.group_size=2",
                 "env.max_steps=1", "env.max_new_tokens=4", "env_pool=inline", "trainer.eval_num_tasks=6",
                 f"trainer.out_dir={run}"]) == 0
    said = capsys.readouterr().err
    records = [json.loads((run / "eval" / f"step_{s:06d}" / "eval.json").read_text())["replays_train"]
               for s in (1, 2)]
    assert records[0]["tasks"] == records[1]["tasks"] > 0
    assert said.count("begin exactly as a train task does") == 1


def test_a_logger_whose_package_is_missing_is_one_line_before_the_run_folder(tmp_path, monkeypatch, capsys):
    """logger=[tensorboard,wandb] without wandb: a traceback once the sinks were built, after config.yaml,
    tb/ and the lock were in the run folder, so the same command later found it holding a run. Now one
    line before the folder is made."""
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)      # `import wandb` fails
    run = tmp_path / "run"
    args = ["train", "trainer.steps=1", f"trainer.out_dir={run}", "logger=[tensorboard,wandb]"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == ("agentq: logger includes 'wandb' but wandb is not installed: pip install wandb, "
                                    "or leave wandb out of logger")
    assert not run.exists()
    assert main(args) == 2 and "already holds a run" not in capsys.readouterr().err


def test_each_periodic_evaluation_prints_its_result_in_one_line(tmp_path, capsys):
    """In a log file a `trainer.eval_every` evaluation printed a blank line only: its success rate was in
    metrics.jsonl, TensorBoard and W&B alone. Now one plain line with its eval row's numbers."""
    from agentq.trainer.rl import eval_line

    run = tmp_path / "run"
    assert main(["train", "trainer.steps=2", "trainer.eval_every=1", "trainer.tasks_per_step=1", "trainer.group_size=2",
                 "env.max_steps=1", "env.max_new_tokens=4", "env_pool=inline", "trainer.eval_num_tasks=2",
                 f"trainer.out_dir={run}"]) == 0
    said = capsys.readouterr().err.splitlines()
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
              if '"eval/step": 1' in line]
    split = json.loads((run / "eval" / "step_000001" / "eval.json").read_text())["split"]
    want = (f"eval step 1: success {100 * row['eval/success_rate']:.1f} % of {row['eval/episodes']} episodes "
            f"(split {split}), score {row['eval/score_mean']:.3f}")
    # the final: last line; the evaluation's progress lines (a log file's, `progress`) come before it
    assert said.count(want) == 1 and [s for s in said if s.startswith("eval step 1: success")] == [want]
    n = row["eval/episodes"]
    progress = [i for i, s in enumerate(said) if s.startswith(f"eval step 1: {n}/{n}, won ")]
    assert len(progress) == 1 and progress[0] < said.index(want)
    first, second = ([i for i, s in enumerate(said) if s.startswith(f"step {n}/2 ")] for n in (1, 2))
    assert first[0] < said.index(want) < second[0]              # between the step lines
    # a mean over no episode is n/a; errored and unplayed episodes are said as on the last line
    r = {"success_rate": 0.375, "episodes": 8, "split": "dev", "score_mean": None, "errors": 1, "unplayed": 0}
    assert eval_line(4, r) == "eval step 4: success 37.5 % of 8 episodes (split dev), score n/a, 1 of 8 errored (counted as lost)"


def test_a_resume_that_redoes_steps_says_wandb_keeps_their_first_values(tmp_path, capsys):
    """W&B ignores a step logged again ("less than the current step"): after a resume its run keeps the
    stopped attempt's values of the redone steps, which metrics.jsonl and TensorBoard replace. Said once."""
    from omegaconf import OmegaConf

    from agentq.trainer.rl import wandb_redo_notice

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": 0.0}) + "\n"
                                                    for s in range(1, 8)))
    wandb_redo_notice(tmp_path, OmegaConf.create({"logger": ["tensorboard", "wandb"]}), 5)
    assert " ".join(capsys.readouterr().err.split()) == (
        "trainer.resume: steps 6-7 are redone; W&B keeps the values the stopped run logged for them (it ignores a "
        "step logged again): metrics.jsonl and TensorBoard have the redone ones")
    wandb_redo_notice(tmp_path, OmegaConf.create({"logger": "wandb"}), 6)
    said = " ".join(capsys.readouterr().err.split())
    assert "step 7 is redone; W&B keeps" in said and said.endswith("metrics.jsonl has the redone ones")
    wandb_redo_notice(tmp_path, OmegaConf.create({"logger": ["tensorboard"]}), 5)      # no W&B: nothing to say
    wandb_redo_notice(tmp_path, OmegaConf.create({"logger": ["wandb"]}), 7)            # nothing redone
    assert capsys.readouterr().err == ""
