"""`trainer.resume=<run>` continues a run exactly where its latest checkpoint left it: optimizer
state, task-sampling and minibatch RNGs, episode ids (hence sampling seeds) and the KL reference
(the run's initial policy, not the checkpoint) all come back. A run stopped after 2 steps and
resumed to 3 logs the same step-3 numbers as an uninterrupted 3-step run. A resume continues with
the run's own config.yaml and the command line's overrides (the optimizer's settings too), never
rewrites a checkpoint under an older step's name, and leaves no point of a redone step behind."""
import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agentq.cli import main
from conftest import stop_rl_at_step

SMALL = ["trainer.tasks_per_step=2", "trainer.group_size=2", "env.max_steps=4", "env_pool=inline",
         "trainer.eval_every=0", "trainer.eval_num_tasks=2", "trainer.save_every=1", "trainer.ppo_epochs=2",
         "trainer.minibatch_size=2", "trainer.keep_checkpoints=5"]


def step_rows(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward_mean" in r]


def test_resume_continues_exactly(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(["train", f"trainer.out_dir={full}", "trainer.steps=3", *SMALL]) == 0
    assert main(["train", f"trainer.out_dir={cut}", "trainer.steps=2", *SMALL]) == 0
    # a crash after step 3 was logged but before it was checkpointed: its row must not survive the resume
    with (cut / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "reward_mean": -1.0}) + "\n")
    assert main(["train", f"trainer.resume={cut}", "trainer.steps=3", *SMALL]) == 0

    a, b = step_rows(full), step_rows(cut)
    assert [r["step"] for r in b] == [1, 2, 3]
    for key in ("reward_mean", "action_tokens", "loss", "pg_loss", "kl", "grad_norm", "int8_codes_changed"):
        assert abs(a[2][key] - b[2][key]) <= 1e-6 * max(1.0, abs(a[2][key])), (key, a[2][key], b[2][key])
    assert a[2]["kl"] > 0          # the reference is the initial policy, not the step-2 checkpoint
    assert (cut / "checkpoints" / "step_000003" / "model.safetensors").exists()


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, capsys):
    def said():
        return " ".join(capsys.readouterr().err.split())
    assert main(["train", f"trainer.resume={tmp_path}", "trainer.steps=1", *SMALL]) == 2
    assert f"trainer.resume='{tmp_path}': no checkpoints/step_* in that run folder" in said()
    # a typo: named, and no folder is made for it (nor a lock file left in it)
    assert main(["train", f"trainer.resume={tmp_path / 'nope'}", "trainer.steps=1", *SMALL]) == 2
    assert f"trainer.resume='{tmp_path / 'nope'}': no such run folder" in said()
    assert not (tmp_path / "nope").exists()


def test_resume_from_a_checkpoint_folder_names_its_run_folder(run_copy, capsys):
    ckpt = run_copy / "checkpoints" / "step_000002"
    before = sorted(p.name for p in ckpt.iterdir())
    assert main(["train", f"trainer.resume={ckpt}", "trainer.steps=3"]) == 2
    assert f"is a checkpoint; trainer.resume takes its run folder ('{run_copy}')" in \
        " ".join(capsys.readouterr().err.split())
    assert sorted(p.name for p in ckpt.iterdir()) == before          # no lock file or config.yaml dropped in it


def test_resuming_a_finished_run_keeps_its_one_final_evaluation(tmp_path):
    """A finished run resumed again (at trainer.steps) has nothing to train; its final evaluation is
    recorded already, so it is not played and logged a second time at the same step."""
    run = tmp_path / "run"
    args = [*BASE, "trainer.eval_every=0", "trainer.eval_num_tasks=2", "env.max_new_tokens=8", "trainer.save_segments=false"]
    assert main(["train", f"trainer.out_dir={run}", "trainer.steps=1", *args]) == 0
    first = json.loads((run / "train_summary.json").read_text())
    assert main(["train", f"trainer.resume={run}", "trainer.steps=1"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], "eval/success_rate" in r) for r in rows] == [(1, False), (1, True)]
    again = json.loads((run / "train_summary.json").read_text())
    assert again["final_eval"]["success_rate"] == first["final_eval"]["success_rate"]
    assert again["last_step"]["reward_mean"] == first["last_step"]["reward_mean"]


# ---------------------------------------------------------------------- a finished run, resumed again
BASE = ["trainer.tasks_per_step=2", "trainer.group_size=2", "env.max_steps=4", "env_pool=inline",
        "trainer.eval_every=-1", "trainer.save_every=1", "trainer.keep_checkpoints=5", "trainer.lr=3e-6"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 2-step run (checkpoints after both steps, lr 3e-6, no evaluation); each test
    resumes its own copy (`run_copy`)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", f"trainer.out_dir={out}", "trainer.steps=2", *BASE]) == 0
    return out


@pytest.fixture
def run_copy(finished_run, tmp_path):
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


def test_resume_past_trainer_steps_is_refused_and_the_final_checkpoint_is_not_rewritten(run_copy):
    ckpts = run_copy / "checkpoints"
    config = (run_copy / "config.yaml").read_text()
    step1_weights = (ckpts / "step_000001" / "model.safetensors").read_bytes()
    # the checkpoint (step 2) is past trainer.steps=1: refused (exit 2) before anything is written
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=1"]) == 2
    assert (ckpts / "step_000001" / "model.safetensors").read_bytes() == step1_weights
    assert json.loads((ckpts / "step_000001" / "agentq.json").read_text())["step"] == 1
    assert (run_copy / "config.yaml").read_text() == config
    # at trainer.steps: nothing to train, the final checkpoint stays the folder it was
    inode = (ckpts / "step_000002").stat().st_ino
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=2"]) == 0
    assert (ckpts / "step_000002").stat().st_ino == inode
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001", "step_000002"]


def test_resume_continues_with_the_runs_config_and_the_command_lines_overrides(run_copy, capsys):
    # only the step count given: the run's own group size, tasks per step, lr, step cap and pool
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=3"]) == 0
    # the banner names the one change (trainer.resume itself is none)
    assert "trainer.resume: the run's config.yaml, changed by this command line: trainer.steps 2 → 3 " in \
        " ".join(capsys.readouterr().err.split()) + " "
    cfg = OmegaConf.load(run_copy / "config.yaml")
    assert (cfg.trainer.tasks_per_step, cfg.trainer.group_size, cfg.trainer.lr, cfg.trainer.steps) == (2, 2, 3e-6, 3)
    assert (cfg.env.max_steps, cfg.env_pool.type, cfg.trainer.resume) == (4, "inline", str(run_copy))
    assert [(r["step"], r["episodes"]) for r in step_rows(run_copy)] == [(1, 4), (2, 4), (3, 4)]
    # the change stays on record beside config.yaml, which holds the latest settings only
    (row,) = [json.loads(line) for line in (run_copy / "resumes.jsonl").read_text().splitlines()]
    assert (row["step"], row["changed"]) == (2, ["trainer.steps: 2 → 3"])


def test_a_relative_model_path_is_kept_absolute_as_the_kl_reference(tmp_path, tiny_model_dir, monkeypatch):
    """The reference a resume reads was model.path as written: resumed from another folder holding
    a folder of that name, the run took another model as its KL reference without a word."""
    from agentq.utils.checkpoint import load_trainer_state

    shutil.copytree(tiny_model_dir, tmp_path / "start")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "model=hf", "model.path=start", "trainer.out_dir=run", "trainer.steps=1", *BASE]) == 0
    meta = load_trainer_state(tmp_path / "run" / "checkpoints" / "step_000001", meta_keys=("init_path",)).meta
    assert meta["init_path"] == str(tmp_path / "start")


def test_a_resume_that_runs_no_step_leaves_the_runs_settings(run_copy):
    """A finished run resumed with other settings trains nothing, yet its config.yaml took them (seed,
    algo...): a later resume then continued under settings no step had run with."""
    config = (run_copy / "config.yaml").read_bytes()
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=2", "seed=1", "trainer.tasks_per_step=1"]) == 0
    assert (run_copy / "config.yaml").read_bytes() == config and not (run_copy / "resumes.jsonl").exists()


def test_episode_ids_stay_unique_over_a_resume_that_changes_the_batch(run_copy):
    """Episode ids (hence their env and sampling seeds) were counted again from tasks_per_step ×
    group_size: a resume at step 2 with 2 episodes a step gave step 3 the ids 4, 5 of step 2's
    episodes. The count is now saved with the checkpoint: ids 8, 9."""
    import pyarrow.parquet as pq

    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=3", "trainer.tasks_per_step=1"]) == 0
    ids = {step: sorted(set(pq.read_table(run_copy / "segments" / f"step_{step:06d}.parquet")
                            .column("episode_id").to_pylist())) for step in (1, 2, 3)}
    assert ids == {1: [0, 1, 2, 3], 2: [4, 5, 6, 7], 3: [8, 9]}


def test_a_group_choice_on_resume_takes_the_sections_it_sets(tmp_path):
    from agentq.config import load_config
    from agentq.trainer.rl import resumed_config

    run = load_config(["rollout=bf16", "env_pool=inline", "env_pool.call_timeout_s=30", "trainer.group_size=3"])
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(run, resolve=True))
    overrides = [f"trainer.resume={tmp_path}", "rollout=w8a8_kv8", "env_pool=process", "trainer.betas=[0.8,0.9]"]
    cfg = resumed_config(load_config(overrides), overrides)
    # the bf16 run's rollout section goes whole, env_pool's too (its call_timeout_s with it)
    assert (cfg.algo.name, cfg.rollout.quant, cfg.env_pool.type, cfg.env_pool.call_timeout_s) == \
        ("interq", "w8a8_kv8", "process", 120)
    assert (cfg.trainer.group_size, list(cfg.trainer.betas)) == (3, [0.8, 0.9])      # the run's, and the override


def test_a_resume_under_another_preset_or_learner_alignment_is_refused(tmp_path):
    """`agentq train trainer.resume=<an interq run> algo=qurl` ran its later steps as qurl with an
    unaligned learner, and the report titled the whole run "qurl" (a review's): refused, naming what
    changed; a preset's parameters may still change."""
    from agentq.config import ConfigError, load_config
    from agentq.trainer.rl import resumed_config

    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(load_config(["env_pool=inline"]), resolve=True))
    for change, said in ((["algo=qurl"], "algo.name interq → qurl; algo.learner_quant aligned → none"),
                         (["algo.learner_quant=none"], "algo.learner_quant aligned → none")):
        overrides = [f"trainer.resume={tmp_path}", *change]
        with pytest.raises(ConfigError) as e:
            resumed_config(load_config(overrides), overrides)
        assert str(e.value) == (f"trainer.resume='{tmp_path}': this command line's {said} would make the run's "
                                "later steps another algorithm's under its name (its report and summary name one). "
                                "Drop it, or start a new run of that preset from the run's checkpoint "
                                "(model.path=<its checkpoint folder> algo=...)")
    same = [f"trainer.resume={tmp_path}", "algo=interq", "algo.objective_params.budget_B=0.5"]
    assert resumed_config(load_config(same), same).algo.objective_params.budget_B == 0.5


def test_resume_applies_the_configs_optimizer_settings(run_copy, capsys):
    import torch

    def groups(step):
        state = torch.load(run_copy / "checkpoints" / f"step_{step:06d}" / "trainer_state.pt", weights_only=True)
        return [(g["lr"], g["weight_decay"], tuple(g["betas"])) for g in state["optimizer"]["param_groups"]]

    assert set(groups(2)) == {(3e-6, 0.01, (0.9, 0.999))}
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=3", "trainer.lr=1e-4",
                 "trainer.weight_decay=0.0", "trainer.betas=[0.8,0.95]"]) == 0
    assert set(groups(3)) == {(1e-4, 0.0, (0.8, 0.95))}
    said = " ".join(capsys.readouterr().err.split())
    assert "the optimizer takes this config's weight_decay 0.01 → 0.0, betas (0.9, 0.999) → (0.8, 0.95)" in said
    # the rate is the schedule's at each step: named with the settings that moved it (steps: not, when constant)
    assert "step 3 runs at lr 0.0001 where the run's own settings gave 3e-06 (trainer.lr 3e-06 → 0.0001);" in said


def test_resume_drops_the_redone_steps_from_tensorboard_errors_jsonl_and_eval(run_copy):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # a crash after step 2 was logged (metrics, TensorBoard, a lost episode) but before its checkpoint
    shutil.rmtree(run_copy / "checkpoints" / "step_000002")
    lost = [{"step": s, "episode_id": 4 * s - 1, "task_id": "coin/1", "split": "train", "error": "env worker 0 died"}
            for s in (1, 2)]
    (run_copy / "errors.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lost))
    # and step 2's held-out evaluation, of weights the resume does not have: it goes with the step (the
    # report listed it beside the redone steps); step 1's stays
    for step in (1, 2):
        (run_copy / "eval" / f"step_{step:06d}").mkdir(parents=True, exist_ok=True)
        (run_copy / "eval" / f"step_{step:06d}" / "abandoned.txt").write_text("the run before the crash")
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=2"]) == 0
    assert [json.loads(line) for line in (run_copy / "errors.jsonl").read_text().splitlines()] == lost[:1]
    assert (run_copy / "eval" / "step_000001" / "abandoned.txt").exists()
    assert not (run_copy / "eval" / "step_000002" / "abandoned.txt").exists()
    tb = EventAccumulator(str(run_copy / "tb"))
    tb.Reload()
    points = [(e.step, e.value) for e in tb.Scalars("step_time_s")]
    assert [s for s, _ in points] == [1, 2]           # step 2 once: the redone one
    assert points[1][1] == pytest.approx(step_rows(run_copy)[1]["step_time_s"], rel=1e-6)


def test_a_resume_refuses_a_changed_model_and_takes_the_same_one(tmp_path, tiny_model_dir):
    """model.path changed on a resume was printed as a change and written into config.yaml, yet the
    weights came from the checkpoint and the KL reference from the run's start: a setting used nowhere."""
    from agentq.config import ConfigError, load_config
    from agentq.trainer.rl import resumed_config

    run = load_config(["model=hf", f"model.path={tiny_model_dir}", "env_pool=inline"])
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(run, resolve=True))
    same = [f"trainer.resume={tmp_path}", "model=hf", f"model.path={tiny_model_dir}", "trainer.steps=3"]
    cfg = resumed_config(load_config(same), same)       # the run's own command line again: taken
    assert (cfg.model.path, cfg.trainer.steps) == (str(tiny_model_dir), 3)
    other = [f"trainer.resume={tmp_path}", f"model.path={tmp_path / 'other'}", "trainer.steps=3"]
    with pytest.raises(ConfigError) as e:
        resumed_config(load_config(other), other)
    assert str(e.value) == (
        f"trainer.resume='{tmp_path}' continues from the run's latest checkpoint, and its KL reference stays the "
        f"model it started from: this command line's model.path {tiny_model_dir} → {tmp_path / 'other'} would be "
        "used nowhere. Drop it, or start a new run from other weights (model.path=<checkpoint folder>)")


def test_a_changed_model_on_resume_is_one_line_and_leaves_the_run_as_it_was(run_copy, tiny_model_dir, capsys):
    config = (run_copy / "config.yaml").read_text()
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=3", f"model.path={tiny_model_dir}"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"agentq: trainer.resume='{run_copy}' continues from the run's latest checkpoint" in err
    assert f"model.path None → {tiny_model_dir} would be used nowhere" in err and "Traceback" not in err
    assert (run_copy / "config.yaml").read_text() == config
    assert sorted(p.name for p in (run_copy / "checkpoints").iterdir()) == ["step_000001", "step_000002"]


def test_a_resume_whose_starting_model_is_gone_says_so_in_one_line(tmp_path, tiny_model_dir, capsys):
    """The KL reference of a resumed run is read from the folder the run started from: deleted or moved
    since, the resume ended with transformers' traceback ("Repo id must be in the form ...")."""
    model, run = Path(shutil.copytree(tiny_model_dir, tmp_path / "my model")), tmp_path / "run"
    assert main(["train", "model=hf", f"model.path={model}", f"trainer.out_dir={run}", "trainer.steps=1",
                 "trainer.tasks_per_step=1", "trainer.group_size=2", "env.max_steps=2", "env.max_new_tokens=8",
                 "env_pool=inline", "trainer.eval_every=-1"]) == 0
    shutil.rmtree(model)
    config = (run / "config.yaml").read_text()
    capsys.readouterr()
    assert main(["train", f"trainer.resume={run}", "trainer.steps=2"]) == 2
    err = capsys.readouterr().err
    assert " ".join(err.split()).endswith(
        f"agentq: trainer.resume='{run}': the model the run started from, '{model}', is its KL reference "
        "(algo.kl_coef=0.001) but has no config.json any more: put that folder back there (a moved one: a "
        "symlink at that path)") and "Traceback" not in err
    assert (run / "config.yaml").read_text() == config
    assert [r["step"] for r in step_rows(run)] == [1]


def test_pruned_checkpoints_keep_the_evaluations_written_into_them(run_copy, capsys):
    """`agentq eval checkpoint=<run>/checkpoints/step_N` writes its report into that folder by default;
    trainer.keep_checkpoints then removed the whole folder, the user's evaluation with it."""
    ckpts = run_copy / "checkpoints"
    assert main(["eval", f"checkpoint={ckpts / 'step_000001'}", "eval.num_tasks=1", "env.max_steps=2",
                 "env_pool=inline"]) == 0
    report = (ckpts / "step_000001" / "eval-textworld_express-test-steps2-n1" / "eval.json").read_text()
    assert json.loads(report)["episodes"] == 1
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=3", "trainer.keep_checkpoints=1"]) == 0
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001", "step_000003"]
    assert [p.name for p in (ckpts / "step_000001").iterdir()] == ["eval-textworld_express-test-steps2-n1"]
    assert (ckpts / "step_000001" / "eval-textworld_express-test-steps2-n1" / "eval.json").read_text() == report
    said = " ".join(capsys.readouterr().err.split())
    assert (f"removed checkpoint {ckpts / 'step_000001'}'s weights and state (trainer.keep_checkpoints=1); the folder "
            "keeps what was written into it: eval-textworld_express-test-steps2-n1") in said
    # the evaluation's folder is no checkpoint: a resume takes the latest real one, and a later prune skips it
    from agentq.trainer.rl import latest_checkpoint

    assert latest_checkpoint(run_copy) == ckpts / "step_000003"
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=4", "trainer.keep_checkpoints=1"]) == 0
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001", "step_000004"]
    assert [r["step"] for r in step_rows(run_copy)] == [1, 2, 3, 4]


def test_a_resume_naming_the_same_model_folder_otherwise_is_no_change(tmp_path, monkeypatch):
    """model.path given relative at the start and absolute on the resume (or through a symlink) is
    the same folder: no refusal. Another folder still is one."""
    from omegaconf import OmegaConf

    from agentq.config import ConfigError
    from agentq.trainer.rl import refuse_model_change

    (tmp_path / "m").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    before = {"name": "hf", "path": "m"}
    for same in (str(tmp_path / "m"), str(tmp_path / "link"), "./m"):
        refuse_model_change("run", before, OmegaConf.create({"model": {"name": "hf", "path": same}}))
    with pytest.raises(ConfigError, match=f"model.path m → {tmp_path / 'other'} would be used nowhere"):
        refuse_model_change("run", before, OmegaConf.create({"model": {"name": "hf", "path": str(tmp_path / "other")}}))


def eval_rows(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("eval/")} for r in rows
            if any(k.startswith("eval/") for k in r)}


def test_an_evaluation_lost_between_a_checkpoint_and_its_run_is_done_at_resume(tmp_path, monkeypatch):
    """The loop saves step 2, then evaluates it; a kill in between left the resumed run without step 2's
    evaluation for good (it starts at step 3). Now the resume plays it first: the same numbers as the
    uninterrupted run's, also where the kill left step 2's eval folder without its metrics row."""
    from agentq.trainer import rl

    args = [*SMALL, "trainer.eval_every=2", "trainer.steps=3"]
    full = tmp_path / "full"
    assert main(["train", f"trainer.out_dir={full}", *args]) == 0
    want = eval_rows(full)
    assert sorted(want) == [2, 3] and all("eval/success_rate" in want[s] and "eval/reward_mean" in want[s] for s in want)
    evaluate = rl.RLTrainer.evaluate
    for cut, orphan in ((tmp_path / "cut", False), (tmp_path / "orphan", True)):
        def killed(self, step, num_tasks):
            raise KeyboardInterrupt       # as a kill -9 after step 2's checkpoint, before its evaluation

        monkeypatch.setattr(rl.RLTrainer, "evaluate", killed)
        assert main(["train", f"trainer.out_dir={cut}", *args]) == 130
        monkeypatch.setattr(rl.RLTrainer, "evaluate", evaluate)
        assert (cut / "checkpoints" / "step_000002").is_dir() and not eval_rows(cut)
        if orphan:       # eval.json written, the metrics row not yet
            shutil.copytree(full / "eval" / "step_000002", cut / "eval" / "step_000002")
        assert main(["train", f"trainer.resume={cut}", *args]) == 0
        got = eval_rows(cut)
        assert sorted(got) == [2, 3], (orphan, sorted(got))
        for step in (2, 3):
            assert got[step] == want[step], (orphan, step)


# ---------------------------------------------------------------------- damaged or missing run files
def said_once(capsys) -> str:
    """stderr's last line, checked to be the only `agentq:` line and to come with no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("agentq: ") == 1, err
    return err.strip().splitlines()[-1]


def test_a_run_folder_without_config_yaml_is_not_resumed_under_guessed_settings(run_copy, capsys):
    """Without config.yaml a resume ran with the defaults and this command line (one yellow line), and
    pruned with the default trainer.keep_checkpoints=2: the run's step_000001 went. Now refused."""
    (run_copy / "config.yaml").unlink()
    before = files_of(run_copy)
    for cmd in ("train", "config"):
        assert main([cmd, f"trainer.resume={run_copy}", "trainer.steps=3"]) == 2
        line = said_once(capsys)
        assert line.startswith(f"agentq: trainer.resume='{run_copy}': the run folder has no config.yaml, so the run "
                               "cannot continue exactly")
        assert f"agentq config <the command line that started the run> > {run_copy / 'config.yaml'}" in line
    assert files_of(run_copy) == before


def files_of(folder: Path) -> dict:
    return {p.relative_to(folder): p.stat().st_mtime_ns for p in folder.rglob("*") if p.name != ".agentq.lock"}


@pytest.mark.parametrize("damage,why", [
    (lambda text: "".join(text.splitlines(True)[:40]), "it lacks "),         # a write cut short
    (lambda text: text.replace("trainer:\n", "trainer: [\n", 1), "not YAML: "),
    (lambda text: "", "empty"),
    (lambda text: "- " + text.replace("\n", "\n  "), "a list, not a mapping of settings"),
    (lambda text: text.replace("\ntrainer:\n", "\nold_trainer:\n", 1), "it lacks trainer"),
], ids=["truncated", "garbled", "empty", "list", "no-trainer"])
def test_a_damaged_config_yaml_is_one_line(run_copy, capsys, damage, why):
    """A damaged config.yaml was a traceback on resume: yaml's ScannerError, "Key 'device' is not in
    struct" from build.py, an assert in resumed_config."""
    config = run_copy / "config.yaml"
    config.write_text(damage(config.read_text()))
    before = files_of(run_copy)
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=3"]) == 2
    assert said_once(capsys).startswith(f"agentq: run folder '{run_copy}': config.yaml is damaged ({why}")
    assert files_of(run_copy) == before


def test_a_run_of_an_env_module_this_process_cannot_import_is_one_line(run_copy, capsys):
    """A run of a user's own env (env.name module:Class), resumed from a shell without its folder on
    PYTHONPATH: the command line's env (the default one) was checked, the run's was not, and the import
    failed deep in the trainer, a 57-line traceback (review)."""
    config = run_copy / "config.yaml"
    text = config.read_text()
    config.write_text(text.replace("  name: textworld_express\n", "  name: gone_plugin_env:GoneEnv\n", 1))
    assert config.read_text() != text
    before = files_of(run_copy)
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=3"]) == 2
    assert said_once(capsys) == (f"agentq: trainer.resume='{run_copy}': the run's env.name='gone_plugin_env:GoneEnv': "
                                 "No module named 'gone_plugin_env'; put its folder on PYTHONPATH or pip install its "
                                 "package (docs/adding-an-environment.md)")
    assert files_of(run_copy) == before


def test_the_lr_note_of_a_damaged_config_is_the_same_error(run_copy):
    from agentq.config import ConfigError, load_config
    from agentq.trainer.rl import lr_change_note

    (run_copy / "config.yaml").write_text("a: b: c\n")
    with pytest.raises(ConfigError, match="config.yaml is damaged \\(not YAML: mapping values are not allowed here"):
        lr_change_note(run_copy / "config.yaml", load_config([]).trainer, 3)


def test_a_trainer_state_without_its_step_is_a_damaged_checkpoint(run_copy, capsys):
    """trainer_state.json that is JSON but not the trainer's (`{}`) was `KeyError: 'step'`."""
    ckpt = run_copy / "checkpoints" / "step_000002"
    (ckpt / "trainer_state.json").write_text("{}")
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=3"]) == 2
    assert said_once(capsys) == (f"agentq: checkpoint {ckpt} is damaged (trainer_state.json lacks 'step', 'np_rng'); "
                                 "move step_000002 out of its checkpoints folder to resume from the one before it, "
                                 "step_000001")


def test_a_checkpoint_another_run_wrote_is_refused_and_the_runs_own_resumes(run_copy, tmp_path, capsys):
    """A checkpoints/ folder copied from another run (here one of another model) was resumed without a
    word: the weights and the KL reference became the other run's under this run's config.yaml and
    metrics. Each run's checkpoints now carry the id in its folder's run_id file."""
    from agentq.utils.checkpoint import load_trainer_state

    own = (run_copy / "run_id").read_text().strip()
    assert len(own) == 32 and load_trainer_state(run_copy / "checkpoints" / "step_000002").meta["run_id"] == own
    other = tmp_path / "other"
    assert main(["train", f"trainer.out_dir={other}", "trainer.steps=1", "model.tiny.num_hidden_layers=1", *BASE]) == 0
    theirs = (other / "run_id").read_text().strip()
    assert theirs != own
    shutil.move(run_copy / "checkpoints", tmp_path / "own_checkpoints")
    shutil.copytree(other / "checkpoints", run_copy / "checkpoints")
    before = files_of(run_copy)
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=3"]) == 2
    ckpt = run_copy / "checkpoints" / "step_000001"
    assert said_once(capsys) == (f"agentq: trainer.resume='{run_copy}': its latest checkpoint (step_000001) was "
                                 f"written by another run (run id {theirs}; this run's, in its run_id file, is "
                                 f"{own}): a checkpoints/ folder copied from another run? Resume that run's own "
                                 f"folder, or start a new run from those weights (model.path='{ckpt}')")
    assert files_of(run_copy) == before
    # its own checkpoints back, and a folder from before run ids (no run_id file): resumed, the id taken
    # from its checkpoint and written for the next resume
    shutil.rmtree(run_copy / "checkpoints")
    shutil.move(tmp_path / "own_checkpoints", run_copy / "checkpoints")
    (run_copy / "run_id").unlink()
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=3"]) == 0
    assert (run_copy / "run_id").read_text().strip() == own
    assert load_trainer_state(run_copy / "checkpoints" / "step_000003").meta["run_id"] == own


def test_a_copy_kept_beside_the_checkpoints_is_neither_resumed_from_nor_pruned(run_copy):
    """A user's copy in checkpoints/ (step_000002.bak) sorted after step_000002 and was taken as the
    latest checkpoint (refused as damaged once its step was checked against its name), and pruning
    would have removed it. Only step_N folders are the run's checkpoints."""
    ckpts = run_copy / "checkpoints"
    shutil.copytree(ckpts / "step_000002", ckpts / "step_000002.bak")
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=8", "trainer.keep_checkpoints=2"]) == 0
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000002.bak", "step_000007", "step_000008"]
    assert [r["step"] for r in step_rows(run_copy)] == list(range(1, 9))

def test_a_resume_that_runs_steps_removes_the_earlier_ends_summary_and_plots(run_copy, monkeypatch):
    """A finished run extended and stopped before its new end kept train_summary.json (steps: 2) and the
    PNGs of its earlier end beside metrics rows past it: a reader took it for finished at step 2. They
    are written when the run completes, so a resume that runs steps removes them until it does."""
    ends = ("train_summary.json", "learning_curve.png", "mismatch.png")
    assert all((run_copy / name).is_file() for name in ends)
    stop_rl_at_step(monkeypatch, 4)
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=4"]) != 0
    assert [r["step"] for r in step_rows(run_copy)] == [1, 2, 3]
    assert not any((run_copy / name).exists() for name in ends)
    monkeypatch.undo()
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=4"]) == 0
    assert json.loads((run_copy / "train_summary.json").read_text())["steps"] == 4


def test_a_resume_that_ends_an_unfinished_run_at_its_checkpoint_records_it(run_copy, capsys):
    """An unfinished run (logged to step 2 under trainer.steps=2, its latest checkpoint step 1) resumed
    with trainer.steps=1 runs no step, but its step-2 rows are cut and it ends at step 1: config.yaml
    kept trainer.steps=2 and resumes.jsonl said nothing. Both now record the change."""
    shutil.rmtree(run_copy / "checkpoints" / "step_000002")
    assert [r["step"] for r in step_rows(run_copy)] == [1, 2]
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=1"]) == 0
    assert [r["step"] for r in step_rows(run_copy)] == [1]
    assert OmegaConf.load(run_copy / "config.yaml").trainer.steps == 1
    (row,) = [json.loads(line) for line in (run_copy / "resumes.jsonl").read_text().splitlines()]
    assert (row["step"], row["changed"]) == (1, ["trainer.steps: 2 → 1"])
    assert json.loads((run_copy / "train_summary.json").read_text())["steps"] == 1


@pytest.mark.parametrize("damage, refusal", [
    ("no_state", "{ckpt} has no trainer_state.pt (optimizer, RNG): cannot resume"),
    ("no_weights", "{ckpt} has a config.json but no weights (no *.safetensors, which the rollout backends read, "
                   "nor pytorch_model*.bin): an interrupted copy or save?"),
    ("truncated", "weight file {ckpt}/model.safetensors is damaged or truncated (100 bytes): "),
    # transformers reads config.json for the tokenizer's class: this read "its tokenizer does not load"
    ("garbled_config", "config file {ckpt}/config.json is damaged or truncated (40 bytes; not JSON: "),
    # a well-formed trainer state with a wrong value (a hand edit, a flipped bit) was numpy's or int()'s traceback
    ("step_six", "checkpoint {ckpt} is damaged (its trainer_state.json says step 'six')"),
    ("step_1", "checkpoint {ckpt} is damaged (its trainer_state.json says step 1)"),       # not its folder's
    ("np_rng", "checkpoint {ckpt} is damaged (its np_rng does not load: "),
    ("torch_gen", "checkpoint {ckpt} is damaged (its torch_gen does not load: "),
], ids=["no-trainer-state", "no-weights", "truncated-weights", "garbled-config", "step-not-a-number",
        "step-not-the-folders", "rng-not-a-pcg64-state", "torch-generator-state-not-bytes"])
def test_a_damaged_latest_checkpoint_names_the_one_to_resume_from(run_copy, capsys, damage, refusal):
    """A resume refused at a damaged latest checkpoint said only what was wrong ("cannot resume"), not
    that the checkpoint before it resumes once the damaged one is moved aside; it does now, for every
    such refusal, and falls back on nothing by itself. Moved aside, the run resumes from step 1."""
    ckpt = run_copy / "checkpoints" / "step_000002"
    weights = ckpt / "model.safetensors"
    if damage == "no_state":
        (ckpt / "trainer_state.pt").unlink()
    elif damage == "no_weights":
        weights.unlink()
    elif damage == "garbled_config":        # truncated
        (ckpt / "config.json").write_bytes((ckpt / "config.json").read_bytes()[:40])
    elif damage in ("step_six", "step_1", "np_rng"):
        meta = json.loads((ckpt / "trainer_state.json").read_text())
        meta.update({"step_six": {"step": "six"}, "step_1": {"step": 1}, "np_rng": {"np_rng": {"x": 1}}}[damage])
        (ckpt / "trainer_state.json").write_text(json.dumps(meta))
    elif damage == "torch_gen":
        import torch
        torch.save({**torch.load(ckpt / "trainer_state.pt", weights_only=True), "torch_gen": torch.zeros(3)},
                   ckpt / "trainer_state.pt")
    else:
        weights.write_bytes(weights.read_bytes()[:100])
    before = files_of(run_copy)
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=2"]) == 2
    line = said_once(capsys)
    assert line.startswith(f"agentq: {refusal.format(ckpt=ckpt)}"), line
    assert line.endswith("; move step_000002 out of its checkpoints folder to resume from the one before it, "
                         "step_000001"), line
    assert files_of(run_copy) == before             # nothing moved or written by the refusal
    if damage == "no_state":        # the advice taken: step 2 redone from step 1's checkpoint
        ckpt.rename(run_copy / "step_000002.damaged")
        assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=2"]) == 0
        assert f"resumed from {run_copy / 'checkpoints' / 'step_000001'} at step 1" in " ".join(
            capsys.readouterr().err.split())
        assert (ckpt / "trainer_state.pt").is_file()


def test_a_damaged_only_checkpoint_says_the_run_starts_again(run_copy, capsys):
    """With no checkpoint before the damaged one, moving it aside resumes nothing: the run starts again."""
    shutil.rmtree(run_copy / "checkpoints" / "step_000001")
    ckpt = run_copy / "checkpoints" / "step_000002"
    (ckpt / "trainer_state.pt").unlink()
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=2"]) == 2
    assert said_once(capsys) == (f"agentq: {ckpt} has no trainer_state.pt (optimizer, RNG): cannot resume; it is the "
                                 "run's only checkpoint, so none before it to resume from: start the run again (its "
                                 "command line with trainer.overwrite=true)")


def test_a_garbled_metrics_line_on_resume_is_one_line(run_copy, capsys):
    """A garbled middle line of metrics.jsonl: `ValueError: ...: line 2 is not JSON` as a traceback."""
    metrics = run_copy / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], "{garbage", *lines[1:]]) + "\n")
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=3"]) == 2
    assert said_once(capsys).startswith(f"agentq: {metrics}: line 2 is not JSON (")


def test_a_full_disk_while_checkpointing_is_one_line_naming_the_last_checkpoint(run_copy, capsys, monkeypatch):
    """torch.save on a full disk: `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected
    pos ...` as a traceback; now the checkpoint, the reason and the one to resume from."""
    import errno

    from agentq.utils import checkpoint

    def full(obj, f, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(checkpoint.torch, "save", full)
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=3"]) == 2
    ckpts = run_copy / "checkpoints"
    assert said_once(capsys) == (f"agentq: could not write checkpoint step_000003 in {ckpts} (No space left on "
                                 "device); the last complete checkpoint is step_000002")
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001", "step_000002"]


def test_train_summary_json_is_replaced_whole(run_copy, capsys, disk_full_at):
    """train_summary.json was written in place: a full disk left half of it. Now the old one stays,
    and the OSError is one line."""
    summary = (run_copy / "train_summary.json").read_text()
    cut = disk_full_at("train_summary.json")
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=2"]) == 2
    assert cut and said_once(capsys) == "agentq: No space left on device"
    assert (run_copy / "train_summary.json").read_text() == summary
    assert not list(run_copy.glob(".train_summary.json*"))


def test_a_read_only_run_folder_is_one_line(run_copy, capsys, monkeypatch):
    """`OSError: [Errno 30] Read-only file system: '.../.agentq.lock'` from the folder lock."""
    import errno

    from agentq.utils import folder_lock

    def read_only(path, mode="r", *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))
    monkeypatch.setattr(folder_lock, "open", read_only, raising=False)
    assert main(["train", f"trainer.resume={run_copy}", "trainer.steps=3"]) == 2
    assert said_once(capsys) == f"agentq: cannot lock run folder '{run_copy}': Read-only file system"


def test_a_truncated_final_eval_json_on_resume_is_one_line(tmp_path, capsys):
    """A finished run resumed again reads its recorded final evaluation: a truncated eval.json was a
    JSONDecodeError traceback."""
    run = tmp_path / "run"
    args = [*BASE, "trainer.eval_every=0", "trainer.eval_num_tasks=1", "env.max_new_tokens=8", "trainer.save_segments=false"]
    assert main(["train", f"trainer.out_dir={run}", "trainer.steps=1", *args]) == 0
    eval_json = run / "eval" / "step_000001" / "eval.json"
    eval_json.write_text(eval_json.read_text()[:50])
    capsys.readouterr()
    assert main(["train", f"trainer.resume={run}", "trainer.steps=1"]) == 2
    assert said_once(capsys).startswith(f"agentq: {eval_json.parent}: eval.json is damaged (not JSON: ")


def test_an_interrupted_default_run_resumes_from_its_last_periodic_checkpoint(tmp_path, monkeypatch, capsys):
    """conf/trainer/default.yaml had trainer.save_every: 0, the final checkpoint only: Ctrl-C in the
    last step of a run left "no checkpoint yet; start it again", every finished step lost. With the
    default now (5), Ctrl-C in step 7 resumes from step 5's checkpoint."""
    run = tmp_path / "run"
    quick = ["env_pool=inline", "env.max_steps=2", "env.max_new_tokens=8", "trainer.tasks_per_step=1",
             "trainer.group_size=2", "trainer.eval_every=-1", "trainer.save_segments=false", "trainer.steps=7"]
    stop_rl_at_step(monkeypatch, 7)
    assert main(["train", *quick, f"trainer.out_dir={run}"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"agentq: interrupted: run folder {run}, last checkpoint step_000005; continue it with agentq train "
        f"trainer.resume={run}")
    monkeypatch.undo()
    assert main(["train", f"trainer.resume={run}"]) == 0
    assert [r["step"] for r in step_rows(run)] == [1, 2, 3, 4, 5, 6, 7]
    # trainer.keep_checkpoints=2: the periodic one before the final one stays
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000005", "step_000007"]
