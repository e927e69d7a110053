"""`agentq eval`'s output folder: without a checkpoint a new runs/eval-<env>-<split>-<time> (never the
model's own folder, which may be a shared cache or the user's checkpoint), created before anything
is played, so a path that cannot be made fails at once with the setting named."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from agentq.cli import main

SMALL = ["eval.num_tasks=1", "env_pool=inline", "env.max_steps=2", "env.max_new_tokens=8"]
#: the default folder name of a SMALL evaluation: its step cap, turn budget and task sample named
SMALL_NAME = "eval-textworld_express-test-steps2-tok8-n1"


def test_eval_without_checkpoint_writes_a_new_runs_folder_not_the_models(tiny_model_dir, tmp_path, monkeypatch,
                                                                         capsys):
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    assert main(["eval", f"model.path={model}", *SMALL]) == 0
    (out,) = (tmp_path / "runs").glob(f"{SMALL_NAME}-*")
    said = " ".join(capsys.readouterr().err.split())
    assert f"eval.json and episodes.jsonl in {out.relative_to(tmp_path)}" in said     # said where
    # and, before playing, which model (nothing said an untrained model was evaluated)
    assert (f"no checkpoint= given: evaluating the model of model.path='{model}'; eval.json and episodes.jsonl go "
            f"to {out.relative_to(tmp_path)}") in said
    report = json.loads((out / "eval.json").read_text())
    assert (report["checkpoint"], report["split"], report["episodes"]) == (str(model), "test", 1)
    assert not list(model.glob("eval-*"))


def test_the_report_names_the_rollout_backend_beside_its_quantization(tiny_model_dir, tmp_path, capsys):
    """eval.json had rollout_quant alone: a torch and a vLLM evaluation could not be told apart."""
    from agentq.eval.evaluate import print_report

    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    assert main(["eval", f"checkpoint={ckpt}", "rollout=w8a8_kv8", *SMALL]) == 0
    said = " ".join(capsys.readouterr().err.split())
    report = json.loads((ckpt / SMALL_NAME / "eval.json").read_text())
    assert (report["rollout_quant"], report["rollout_backend"]) == ("w8a8_kv8", "torch")
    assert "textworld_express / test (1 episodes, rollout=w8a8_kv8 (torch))" in said
    # rollout=bf16 (rollout.quant none) read "rollout=none (torch)" above a -bf16 folder: named as its folder
    print_report({**report, "rollout_quant": "none"})
    assert "textworld_express / test (1 episodes, rollout=bf16 (torch))" in " ".join(capsys.readouterr().err.split())
    del report["rollout_backend"]           # an eval.json from before: the quantization alone
    print_report(report)
    assert "textworld_express / test (1 episodes, rollout=w8a8_kv8)" in " ".join(capsys.readouterr().err.split())
    # episodes the context budget ended: a row of their own (they read as neither won nor capped)
    print_report({**report, "end_context": 0.5, "limits": {"max_steps": 3, "max_context_tokens": 2048}})
    said = " ".join(capsys.readouterr().err.split())
    assert "ended at the context budget │ 50.0 % (env.max_context_tokens 2048)" in said
    print_report({**report, "end_context": 0.0})
    assert "context budget" not in capsys.readouterr().err


def test_an_output_folder_that_cannot_be_made_fails_before_playing(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from agentq.eval import evaluate

    played = []
    monkeypatch.setattr(evaluate, "evaluate_policy", lambda *a, **k: played.append(1))
    (tmp_path / "a-file").write_text("x")
    bad = tmp_path / "a-file" / "eval"
    assert main(["eval", f"checkpoint={tiny_model_dir}", f"eval.out_dir={bad}", *SMALL]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"eval.out_dir: cannot create the evaluation's output folder '{bad}' (NotADirectoryError: Not a directory)" in said
    assert played == []


def test_a_read_only_checkpoint_names_eval_out_dir(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The default output folder is inside the checkpoint; where that is read-only the fix is
    eval.out_dir (the message said "set checkpoint to a writable folder"). The refusal is a stand-in
    for a read-only mount (root, as CI runs, writes into a folder whatever its mode)."""
    from pathlib import Path

    from agentq.eval import evaluate

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir, ckpt)
    mkdir = Path.mkdir

    def read_only(self, *a, **k):
        if ckpt in self.parents:
            raise PermissionError(13, "Permission denied", str(self))
        return mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", read_only)
    monkeypatch.setattr(evaluate, "evaluate_policy", lambda *a, **k: pytest.fail("played"))
    assert main(["eval", f"checkpoint={ckpt}", *SMALL]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"eval.out_dir: cannot create the evaluation's output folder '{ckpt}/eval-" in said
    assert said.rstrip().endswith("set eval.out_dir to a writable folder")


def test_the_trainers_evaluations_play_each_task_eval_repeats_times(tmp_path):
    """The trainer's final evaluation is `agentq eval`'s (`evaluate_policy`), eval.repeats included:
    the pipeline compares it with `agentq eval`'s reports, so both must hold tasks × repeats episodes."""
    run = tmp_path / "run"
    assert main(["train", f"trainer.out_dir={run}", "trainer.steps=1", "trainer.tasks_per_step=2", "trainer.group_size=2",
                 "env.max_steps=2", "env_pool=inline", "trainer.eval_every=0", "trainer.eval_num_tasks=2",
                 "eval.repeats=2"]) == 0
    report = json.loads((run / "eval" / "step_000001" / "eval.json").read_text())
    assert report["episodes"] == 4


def test_a_checkpoint_that_is_not_one_is_a_one_line_error(tmp_path, capsys):
    assert main(["eval", f"checkpoint={tmp_path / 'nowhere'}", *SMALL]) == 2
    assert "is not an HF checkpoint folder (no config.json)" in capsys.readouterr().err


def test_a_run_folder_given_as_checkpoint_names_its_last_checkpoint(tiny_model_dir, tmp_path, capsys):
    for step in ("step_000002", "step_000010"):
        shutil.copytree(tiny_model_dir, tmp_path / "run" / "checkpoints" / step)
    assert main(["eval", f"checkpoint={tmp_path / 'run'}", *SMALL]) == 2
    said = capsys.readouterr().err
    assert f"a run folder? its last checkpoint is checkpoint={tmp_path / 'run' / 'checkpoints' / 'step_000010'}" in said


def test_an_unknown_split_is_a_one_line_error_and_leaves_no_folder(tiny_model_dir, tmp_path, capsys):
    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    assert main(["eval", f"checkpoint={ckpt}", "split=nope", *SMALL]) == 2
    # the setting named once (it read "split='nope': split='nope': unknown split ...")
    assert capsys.readouterr().err.strip() == ("agentq: split='nope': unknown split 'nope' for TextWorldExpressEnv; "
                                               "valid: ['train', 'dev', 'test']")
    assert not list(ckpt.glob("eval-*"))       # was an empty eval-textworld_express-nope/ in the checkpoint


def test_a_run_folder_without_a_checkpoint_yet_says_so(tmp_path, capsys):
    """checkpoint=<a run folder before its first checkpoint> said only "no config.json", where a run
    folder with checkpoints names its last one: now whether its run is still going or stopped, and
    when a run saves one."""
    from agentq.utils.folder_lock import lock_folder

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    start = f"agentq: checkpoint={str(run)!r} is not an HF checkpoint folder (no config.json); a run folder with no checkpoint yet: "
    saves = ("(an `agentq train` run saves checkpoints/step_N every trainer.save_every steps and at its end, an "
             "`agentq sft` run checkpoint/ at its end)")
    held = lock_folder(run, lambda pid: AssertionError(pid))        # its run's process
    try:
        assert main(["eval", f"checkpoint={run}", *SMALL]) == 2
        assert capsys.readouterr().err.strip() == (
            f"{start}agentq process pid {os.getpid()} holds it: a run in progress saves its first checkpoint later {saves}")
    finally:
        held.close()
    assert main(["eval", f"checkpoint={run}", *SMALL]) == 2
    assert capsys.readouterr().err.strip() == f"{start}its run stopped before saving one {saves}"
    assert sorted(p.name for p in run.iterdir()) == [".agentq.lock", "config.yaml", "metrics.jsonl"]


def test_eval_json_names_the_checkpoint_by_its_absolute_path(tiny_model_dir, tmp_path, monkeypatch):
    """eval.json's `checkpoint` was the path as typed (`ckpt`, relative to wherever eval ran), where
    train_summary.json's were the run's: now absolute, whatever the command line gave."""
    shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "checkpoint=ckpt", *SMALL]) == 0
    report = json.loads((tmp_path / "ckpt" / SMALL_NAME / "eval.json").read_text())
    assert report["checkpoint"] == str(tmp_path.resolve() / "ckpt")
    assert report["sampling"]["seed"] == 1            # seed + 1 (docs/evaluation.md says why)


def test_unreadable_weights_leave_no_folder_in_the_checkpoint(tiny_model_dir, tmp_path, capsys):
    """The output folder was made before the weights were checked: a truncated checkpoint kept an empty
    eval-<env>-<split>/."""
    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main(["eval", f"checkpoint={ckpt}", *SMALL]) == 2
    assert "is damaged or truncated" in capsys.readouterr().err
    assert not list(ckpt.glob("eval-*"))


def test_turns_of_won_episodes_with_none_won_reads_as_such():
    from agentq.eval.evaluate import turns_text

    assert turns_text(float("nan")) == turns_text(None) == "– (none won)" and turns_text(2.0) == "2.00"


def test_an_evaluation_inside_training_plays_the_episodes_agentq_eval_plays(tmp_path):
    """At temperature > 0 the episodes depend on their sampling seeds: the trainer's evaluation and
    `agentq eval` of the same checkpoint (same split, tasks, repeats, seed) must seed them alike, so
    their per-episode results are equal (the pipeline pairs them; a user re-checks one with the other)."""
    common = ["env_pool=inline", "env.max_steps=3", "env.max_new_tokens=12", "eval.temperature=1.0",
              "eval.repeats=2", "seed=3"]
    run = tmp_path / "run"
    assert main(["train", f"trainer.out_dir={run}", "trainer.steps=1", "trainer.tasks_per_step=2",
                 "trainer.group_size=2", "trainer.eval_every=0", "trainer.eval_num_tasks=3",
                 "trainer.save_segments=false", *common]) == 0
    ckpt = run / "checkpoints" / "step_000001"
    assert main(["eval", f"checkpoint={ckpt}", "eval.num_tasks=3", f"eval.out_dir={tmp_path / 'ev'}", *common]) == 0

    def episodes(folder):
        return [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines()]
    inside, alone = episodes(run / "eval" / "step_000001"), episodes(tmp_path / "ev")
    assert len(inside) == len(alone) == 6
    assert inside == alone
    # the two repeats of a task sampled differently: the seeds matter, and were the same in both
    assert any(a["transcript"] != b["transcript"] for a, b in zip(inside[::2], inside[1::2]))


@pytest.mark.parametrize("layout", ["checkpoints/step_000002", "checkpoint"])     # an RL run's, an SFT run's
def test_a_checkpoint_evaluated_under_other_task_settings_than_its_run_says_so(tiny_model_dir, tmp_path, capsys,
                                                                               layout):
    """`agentq eval` composes conf/ and the command line, not the checkpoint's run: a checkpoint of the
    sweep's mapreader runs evaluated without env= played the default coin game, silently."""
    from omegaconf import OmegaConf

    from agentq.config import load_config

    run = tmp_path / "run"
    ckpt = shutil.copytree(tiny_model_dir, run / layout)
    (run / "config.yaml").write_text(OmegaConf.to_yaml(load_config(["env=textworld_express_mapreader"]), resolve=True))
    assert main(["eval", f"checkpoint={ckpt}", *SMALL, f"eval.out_dir={tmp_path / 'e1'}"]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert (f"warning: this checkpoint's run ({run / 'config.yaml'}) trained with other settings than this "
            "evaluation's: env.kwargs.game_params.coin: trained unset, now 'numLocations=3,includeDoors=0,"
            "numDistractorItems=0'; env.kwargs.game_params.mapreader: trained 'numLocations=4,maxDistanceApart=2,"
            "includeDoors=0,maxDistractorItemsPerLocation=0', now unset; env.kwargs.games: trained ['mapreader'], "
            "now ['coin']. The env's kwargs differ, and with them may which tasks each split holds: this held-out "
            "split may hold tasks the run trained on. agentq eval reads conf/ and the command line, not the run's "
            "config") in said
    # the run's own env (and a step cap or turn length of one's choosing): nothing to say
    assert main(["eval", f"checkpoint={ckpt}", "env=textworld_express_mapreader", *SMALL,
                 f"eval.out_dir={tmp_path / 'e2'}"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_errored_episodes_are_named_and_an_all_errored_evaluation_is_refused(tmp_path, capsys):
    """An env that raised in step scored as plain losses: 5 of 6 errored episodes read as a 16.7 %
    policy, and 6 of 6 as a 0 % one with exit status 0. They still count as lost; the evaluation says
    how many errored and where the tracebacks are, and refuses one where every episode errored."""
    from omegaconf import OmegaConf

    from agentq.agent.trajectory import Trajectory
    from agentq.config import ConfigError
    from agentq.eval.evaluate import check_errors, print_report, write_eval
    from agentq.eval.metrics import summarize

    cfg = OmegaConf.create({"env": {"name": "my_env:MyEnv"}})

    def play(n_err):
        trajs = [Trajectory(episode_id=i, task_id=f"t{i}", split="test", turns=1) for i in range(6)]
        trajs[0].won, trajs[0].end_reason = True, "won"
        for t in trajs[6 - n_err:]:
            t.end_reason, t.error = "error", "ValueError: boom on step 2\nTraceback (most recent call last): ..."
        report = {"env": "my_env:MyEnv", "split": "test", "rollout_quant": "w8a8_kv8", **summarize(trajs)}
        out = tmp_path / f"ev{n_err}"
        write_eval(out, report, trajs)
        return report, out

    report, out = play(5)
    assert report["errors"] == 5 and report["success_rate"] == pytest.approx(1 / 6)
    check_errors(cfg, report)
    print_report(report)
    said = " ".join(capsys.readouterr().err.split())
    assert ("warning: 5 of 6 episodes errored (the environment failed; they count as lost in the success rate); "
            f"first: ValueError: boom on step 2; every error's traceback is under \"error\" in {out / 'episodes.jsonl'}"
            ) in said
    assert "environment errors │ 5 of 6 errored (counted as lost)" in said

    report, out = play(6)
    with pytest.raises(ConfigError) as e:
        check_errors(cfg, report)
    assert str(e.value) == ("env.name='my_env:MyEnv': all 6 episodes errored, so the evaluation says nothing about "
                            "the policy; first: ValueError: boom on step 2; every error's traceback is under "
                            f"\"error\" in {out / 'episodes.jsonl'}")
    assert (out / "eval.json").is_file() and len((out / "episodes.jsonl").read_text().splitlines()) == 6   # kept

    report, _ = play(0)
    check_errors(cfg, report)
    assert "warning" not in capsys.readouterr().err


def test_an_env_name_with_slash_or_colon_makes_one_output_folder(tiny_model_dir, tmp_path):
    """`eval-<env.name>-<split>` with a Gymnasium id nested a folder per "/" (eval-agentq/TextWorldExpress-v0-test)."""
    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    assert main(["eval", f"checkpoint={ckpt}", "env.name=agentq/TextWorldExpress-v0", *SMALL]) == 0
    assert [p.name for p in ckpt.glob("eval-*")] == ["eval-agentq_TextWorldExpress-v0-test-steps2-tok8-n1"]
    assert (ckpt / "eval-agentq_TextWorldExpress-v0-test-steps2-tok8-n1" / "eval.json").is_file()
    from agentq.eval.evaluate import folder_name

    assert folder_name("guess_env:GuessEnv") == "guess_env_GuessEnv" and folder_name("alfworld") == "alfworld"


def test_wrong_folders_given_as_checkpoint_name_the_checkpoint_meant(tiny_model_dir, tmp_path, capsys):
    """A run's checkpoints/ folder, an evaluation's output folder and a checkpoint's file got no hint; nor
    did a checkpoint trainer.keep_checkpoints removed (gone, or left holding the evaluations written into it)."""
    run = tmp_path / "run"
    ckpt = shutil.copytree(tiny_model_dir, run / "checkpoints" / "step_000004")
    (run / "checkpoints" / "step_000003" / "eval-textworld_express-test").mkdir(parents=True)
    for ev in (run / "eval" / "step_000002", run / "eval" / "step_000004", ckpt / "eval-guess-test"):
        ev.mkdir(parents=True)
        (ev / "eval.json").write_text("{}")
    cases = {
        run / "checkpoints": f"its last checkpoint is checkpoint={ckpt}",
        run / "eval" / "step_000004": f"an evaluation's output folder (eval.json): that step's checkpoint is checkpoint={ckpt}",
        run / "eval" / "step_000002": ("an evaluation's output folder (eval.json), not a checkpoint; the run's last "
                                       f"checkpoint is checkpoint={ckpt}"),
        ckpt / "eval-guess-test": f"an evaluation's output folder (eval.json): the checkpoint it evaluated is checkpoint={ckpt}",
        ckpt / "model.safetensors": f"a file, not a folder: checkpoint={ckpt}?",
        run / "checkpoints" / "step_000002": ("no such checkpoint (trainer.keep_checkpoints removes all but a run's "
                                              f"latest checkpoints): the run's latest is checkpoint={ckpt}"),
        run / "checkpoints" / "step_000003": ("its weights are gone (trainer.keep_checkpoints removes all but a run's "
                                              f"latest checkpoints): the run's latest is checkpoint={ckpt}"),
    }
    for given, hint in cases.items():
        assert main(["eval", f"checkpoint={given}", *SMALL]) == 2
        said = " ".join(capsys.readouterr().err.split())
        assert f"checkpoint='{given}' is not an HF checkpoint folder (no config.json); {hint}" in said, said


def test_episodes_that_never_played_a_turn_are_named(tiny_model_dir, tmp_path, capsys):
    """A context budget the first prompt does not fit ended every episode before its first turn, and
    `agentq eval` printed a plain 0 % with exit status 0; now that is refused (after writing the
    files), and a partial case is a warning naming the setting."""
    from omegaconf import OmegaConf

    from agentq.config import ConfigError
    from agentq.eval.evaluate import check_unplayed

    out = tmp_path / "ev"
    assert main(["eval", f"checkpoint={tiny_model_dir}", "env.max_context_tokens=20", *SMALL,
                 f"eval.out_dir={out}"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    n = json.loads((out / "eval.json").read_text())["episodes"]
    assert (f"agentq: none of the {n} episodes played a turn ({n} ended before it: their first prompt does not fit "
            "env.max_context_tokens=20") in err
    assert json.loads((out / "eval.json").read_text())["unplayed"] == n > 0          # the files are kept
    with pytest.raises(ConfigError, match=r"none of the 4 episodes played a turn \(3 ended before it"):
        check_unplayed(OmegaConf.create({"env": {"max_context_tokens": 99}}), {"unplayed": 3, "errors": 1,
                                                                                "episodes": 4})
    check_unplayed(OmegaConf.create({"env": {"max_context_tokens": 99}}), {"unplayed": 1, "episodes": 4})
    assert ("warning: 1 of 4 episodes ended before their first turn (counted as lost): their first prompt does not "
            "fit env.max_context_tokens=99") in " ".join(capsys.readouterr().err.split())


def test_the_lost_episode_checks_each_count_their_own_episodes(tmp_path, capsys):
    """`check_errors` and `check_unplayed` share their logic: each says nothing without episodes of its
    own (all errored is not check_unplayed's to refuse), refuses when its episodes (with the errored,
    for check_unplayed) are all of them, and names an error without a message as '?'."""
    from omegaconf import OmegaConf

    from agentq.config import ConfigError
    from agentq.eval.evaluate import check_errors, check_unplayed

    cfg = OmegaConf.create({"env": {"name": "guess", "max_context_tokens": 99}})
    check_unplayed(cfg, {"unplayed": 0, "errors": 4, "episodes": 4})
    check_errors(cfg, {"errors": 0, "unplayed": 4, "episodes": 4})
    assert capsys.readouterr().err == ""
    with pytest.raises(ConfigError) as e:
        check_unplayed(cfg, {"unplayed": 4, "episodes": 4})
    assert str(e.value) == ("none of the 4 episodes played a turn (4 ended before it: their first prompt does not fit "
                            "env.max_context_tokens=99 (raise it, or shorten env.prompt / env.prompt.max_obs_chars))")
    check_errors(cfg, {"errors": 2, "unplayed": 2, "episodes": 4, "first_error": None, "out_dir": str(tmp_path)})
    assert " ".join(capsys.readouterr().err.split()) == (
        "warning: 2 of 4 episodes errored (the environment failed; they count as lost in the success rate); first: ?; "
        f"every error's traceback is under \"error\" in {tmp_path / 'episodes.jsonl'}")


def test_eval_json_records_how_the_actions_were_decoded(tiny_model_dir, tmp_path):
    """eval.json held `temperature` alone: an evaluation with the rollout's top_p / top_k truncation (which
    `agentq eval` allows) read as plain sampling, and the seed and repeats behind its episodes were
    nowhere in it."""
    out = tmp_path / "ev"
    assert main(["eval", f"checkpoint={tiny_model_dir}", *SMALL, "eval.temperature=0.7", "rollout.top_p=0.9",
                 "rollout.top_k=5", "eval.repeats=2", "seed=4", f"eval.out_dir={out}"]) == 0
    report = json.loads((out / "eval.json").read_text())
    assert report["sampling"] == {"temperature": 0.7, "greedy": False, "top_p": 0.9, "top_k": 5, "max_new_tokens": 8,
                                  "seed": 5, "repeats": 2}
    assert report["temperature"] == 0.7 and report["episodes"] == 2
    assert main(["eval", f"checkpoint={tiny_model_dir}", *SMALL, f"eval.out_dir={out}"]) == 0
    assert json.loads((out / "eval.json").read_text())["sampling"] == {
        "temperature": 0.0, "greedy": True, "top_p": 1.0, "top_k": -1, "max_new_tokens": 8, "seed": 1, "repeats": 1}


def test_an_episode_that_errored_at_reset_counts_in_its_task_types_row(tiny_model_dir, tmp_path, monkeypatch):
    """An env that raised in reset() left the episode without `info["task_type"]`: the overall success rate
    counted it as lost while the per-task-type rows left it out (coin: 2 episodes, not 3), so the rows
    claimed a higher success than the total."""
    from agentq.config import load_config
    from agentq.envs.textworld_express.env import TextWorldExpressEnv
    from agentq.eval.evaluate import choose_eval_tasks

    args = ["env_pool=inline", "env.max_steps=2", "env.max_new_tokens=8", "eval.num_tasks=3", "split=dev"]
    broken = choose_eval_tasks(load_config(args), "dev", 3).tasks[1]
    reset = TextWorldExpressEnv._reset_task

    def failing(self, task_id, split):
        if task_id == broken:
            raise RuntimeError("boom at reset")
        return reset(self, task_id, split)
    monkeypatch.setattr(TextWorldExpressEnv, "_reset_task", failing)
    out = tmp_path / "ev"
    assert main(["eval", f"checkpoint={tiny_model_dir}", *args, f"eval.out_dir={out}"]) == 0
    report = json.loads((out / "eval.json").read_text())
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert (report["episodes"], report["errors"]) == (3, 1)
    assert [e["end_reason"] == "error" for e in episodes] == [False, True, False]
    won = sum(e["won"] for e in episodes)
    assert report["per_task_type"] == {"coin": {"episodes": 3, "success_rate": won / 3,
                                                "score_mean": sum(e["score"] for e in episodes) / 3}}
    assert episodes[1]["task_type"] == "coin"


def test_a_checkpoint_and_a_model_path_together_are_refused(tiny_model_dir, tmp_path, capsys):
    """model.path beside checkpoint= was ignored without a word (model.path=/nonexistent evaluated the
    checkpoint): one of the two is a mistake. model=hf's unset model.path is no model.path given."""
    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    assert main(["eval", f"checkpoint={ckpt}", "model.path=/nonexistent", *SMALL]) == 2
    assert " ".join(capsys.readouterr().err.split()) == (
        f"agentq: checkpoint='{ckpt}' and model.path='/nonexistent' both given: agentq eval evaluates the checkpoint "
        "and would ignore model.path; give one of them")
    assert not list(ckpt.glob("eval-*"))
    from agentq.config import load_config
    from agentq.eval.evaluate import evaluated_model

    given = [f"checkpoint={ckpt}", "model=hf"]
    assert evaluated_model(load_config(given), tmp_path / "out", given) == str(ckpt)
    assert capsys.readouterr().err == ""


def test_the_pipeline_evaluates_its_checkpoint_of_a_model_path_run(tiny_model_dir, tmp_path):
    """`agentq pipeline model=hf model.path=<base>` stopped after SFT: its evaluation of the SFT checkpoint
    carried the run's model.path beside checkpoint=, which only `agentq eval`'s command line may refuse."""
    from agentq.config import load_config
    from agentq.trainer.pipeline import evaluate_checkpoint

    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    cfg = load_config(["model=hf", f"model.path={tiny_model_dir}", *SMALL[1:]], config_name="pipeline",
                      command="pipeline")
    report = evaluate_checkpoint(cfg, str(ckpt), tmp_path / "eval_sft_test", 2, "test")
    assert report["checkpoint"] == str(ckpt) and report["episodes"] == 2
    assert (tmp_path / "eval_sft_test" / "eval.json").is_file()


def test_a_chosen_output_folder_held_by_another_process_names_no_evaluation(tiny_model_dir, tmp_path, capsys):
    """eval.out_dir may name a folder anything holds (a training run's, say): the refusal says another
    agentq process holds it, not that an evaluation with the same settings writes there."""
    from agentq.utils.folder_lock import lock_folder

    run = tmp_path / "run"
    run.mkdir()
    held = lock_folder(run, lambda pid: AssertionError(pid))       # as a training run holds its folder
    try:
        assert main(["eval", f"model.path={tiny_model_dir}", f"eval.out_dir={run}", *SMALL]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"agentq: {run} is in use by another agentq process (pid {os.getpid()}): it holds the folder; wait "
            "for it, or give eval.out_dir=<another folder>")
    finally:
        held.close()


def test_a_pipelines_evaluation_refused_a_held_folder_only_says_to_wait(tmp_path):
    """A pipeline's or sweep's evaluation (no command line of its own) refuses eval.out_dir: its
    refusal does not advise it."""
    from agentq.config import ConfigError
    from agentq.eval.evaluate import OutputLock
    from agentq.utils.folder_lock import lock_folder

    held = lock_folder(tmp_path, lambda pid: AssertionError(pid))
    try:
        with pytest.raises(ConfigError) as e:
            OutputLock(tmp_path, chosen=True, own_command=False).take()
        assert str(e.value) == (f"{tmp_path} is in use by another agentq process (pid {os.getpid()}): it holds the "
                                "folder; wait for it")
    finally:
        held.close()


def test_an_evaluation_writing_into_the_same_folder_holds_it(tiny_model_dir, tmp_path, capsys):
    """Two `agentq eval` with the same settings wrote the same temporary files, and the second's start-up
    recovery could undo the first's renames: the folder is held (the one writing it named), and
    released once the evaluation ends."""
    from agentq.utils.folder_lock import lock_folder

    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    out = ckpt / SMALL_NAME
    assert main(["eval", f"checkpoint={ckpt}", *SMALL]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (out / ".eval.json.tmp").write_text("the other evaluation's write, under way")
    other = lock_folder(out, lambda pid: AssertionError(pid))          # that evaluation's process
    try:
        assert main(["eval", f"checkpoint={ckpt}", *SMALL]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"agentq: {out} is in use by another agentq process (pid {os.getpid()}): an evaluation with the same "
            "settings is writing there; wait for it, or give eval.out_dir=<another folder>")
        assert (out / ".eval.json.tmp").is_file()       # its write untouched
    finally:
        other.close()
    (out / ".eval.json.tmp").unlink()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main(["eval", f"checkpoint={ckpt}", *SMALL]) == 0       # released by the first: the rerun replaces


def test_an_evaluation_whose_output_is_not_a_terminal_prints_plain_progress_lines(monkeypatch):
    """Written to a log file (nohup, `> log`, CI) rich draws its bar only when it stops: `agentq eval` was
    minutes of silence. A plain line comes every 10 % of the episodes, or after 30 s without one at the
    next episode's end, and at the last, with the wins so far and the time elapsed."""
    import io
    import types

    from rich.console import Console

    import agentq.utils.logging as logging_mod
    from agentq.agent.trajectory import Trajectory
    from agentq.eval.evaluate import run_episodes

    out = io.StringIO()
    monkeypatch.setattr(logging_mod, "console", Console(file=out, width=160))      # a file: not a terminal
    clock = [0.0]
    monkeypatch.setattr(logging_mod, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    class Loop:         # an agent loop whose episodes end 1 s apart, the 5th 41 s after the 4th
        def run(self, specs, policy, on_done):
            trajs = []
            for s in specs:
                clock[0] += 41.0 if s.episode_id == 4 else 1.0
                trajs.append(Trajectory(episode_id=s.episode_id, task_id=s.task_id, split=s.split, turns=1))
                trajs[-1].won = s.episode_id % 2 == 1
                on_done(trajs[-1])
            return trajs
    trajs = run_episodes(Loop(), None, [f"t{i}" for i in range(20)], "dev", seed=0, description="eval color/dev")
    assert len(trajs) == 20
    assert out.getvalue().splitlines() == [
        "eval color/dev: 2/20, won 1 (50 %), 0:00:02 elapsed",
        "eval color/dev: 4/20, won 2 (50 %), 0:00:04 elapsed",
        "eval color/dev: 5/20, won 2 (40 %), 0:00:45 elapsed",        # 41 s after the last line
        "eval color/dev: 7/20, won 3 (43 %), 0:00:47 elapsed",
        "eval color/dev: 9/20, won 4 (44 %), 0:00:49 elapsed",
        "eval color/dev: 11/20, won 5 (45 %), 0:00:51 elapsed",
        "eval color/dev: 13/20, won 6 (46 %), 0:00:53 elapsed",
        "eval color/dev: 15/20, won 7 (47 %), 0:00:55 elapsed",
        "eval color/dev: 17/20, won 8 (47 %), 0:00:57 elapsed",
        "eval color/dev: 19/20, won 9 (47 %), 0:00:59 elapsed",
        "eval color/dev: 20/20, won 10 (50 %), 0:01:00 elapsed",    # the last
        "",                                                         # rich's transient bar, stopped
    ]



def test_an_evaluation_that_played_no_turn_says_so_in_its_turn_rates(capsys):
    """Every episode errored at reset: the table read "inadmissible-action turns │ n/a (the env lists no
    admissible actions)" of an env that lists them, and "invalid-format turns │ 0.0 %" of no turn."""
    from agentq.agent.trajectory import Trajectory
    from agentq.eval.evaluate import print_report
    from agentq.eval.metrics import summarize

    def table(trajs):
        print_report({"env": "my_env:MyEnv", "split": "test", "rollout_quant": "w8a8_kv8", **summarize(trajs)})
        return " ".join(capsys.readouterr().err.split())

    errored = [Trajectory(episode_id=i, task_id=f"t{i}", split="test", end_reason="error", error="ValueError: boom")
               for i in range(3)]
    said = table(errored)
    assert ("│ invalid-format turns │ n/a (no turn was played) │ │ inadmissible-action turns │ n/a (no turn was "
            "played) │") in said, said
    # turns played where the env lists no admissible actions: that is still the reason
    played = [Trajectory(episode_id=i, task_id=f"t{i}", split="test", turns=2, invalid_actions=1) for i in range(2)]
    said = table(played)
    assert ("│ invalid-format turns │ 50.0 % │ │ inadmissible-action turns │ n/a (the env lists no admissible "
            "actions) │") in said, said
