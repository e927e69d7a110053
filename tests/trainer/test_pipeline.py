"""A miniature of the embedded default run: tiny model → SFT → eval → 2 RL steps → eval, with
summary.json and the PNG learning curve (the README's first command, scaled down)."""
import json
import math

import pytest

from agentq.cli import main
from conftest import one_task_env, stop_rl_at_step
from agentq.eval.metrics import paired_comparison, two_proportion_z


def test_pipeline_miniature(tmp_path):
    args = ["pipeline", f"pipeline.out_dir={tmp_path}", "pipeline.eval_tasks=4", "sft.num_demos=12", "sft.epochs=2",
            "trainer.steps=2", "trainer.tasks_per_step=2", "trainer.group_size=2", "trainer.eval_every=1",
            "trainer.eval_num_tasks=2", "env.max_steps=4", "env_pool=inline"]
    assert main(args) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    for key in ("env", "split", "episodes", "sft_success_rate", "rl_success_rate", "sft_score", "rl_score",
                "wall_time_s"):
        assert key in s, key
    assert s["paired"]["pairs"] == 4
    # conf/pipeline.yaml: dev (unseen tasks) drives RL's curve; test (unseen objects) is reported beside it
    assert s["env"] == "textworld_express" and s["split"] == "dev" and s["episodes"] == 4
    assert list(s["other_splits"]) == ["test"] and s["other_splits"]["test"]["paired"]["pairs"] == 4
    for c in (s, s["other_splits"]["test"]):
        assert 0 <= c["sft_success_rate"] <= 1 and 0 <= c["rl_success_rate"] <= 1
        assert c["success_gain"] == c["rl_success_rate"] - c["sft_success_rate"]
    evals = {p.parent.name for p in tmp_path.glob("**/episodes.jsonl")}
    assert {"eval_sft_dev", "eval_sft_test", "eval_rl_test", "step_000002"} <= evals
    assert json.loads((tmp_path / "rl" / "eval" / "step_000002" / "eval.json").read_text())["split"] == "dev"
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000
    assert (tmp_path / "sft" / "demos.jsonl").exists() and (tmp_path / "sft" / "checkpoint" / "config.json").exists()
    assert (tmp_path / "sft" / "config.yaml").exists() and (tmp_path / "rl" / "config.yaml").exists()    # each stage's
    demo = json.loads((tmp_path / "sft" / "demos.jsonl").read_text().splitlines()[0])
    assert len(demo["input_ids"]) == len(demo["action_mask"]) == len(demo["seg_id"]) and "<action>" in demo["text"]
    assert (tmp_path / "rl" / "checkpoints" / "step_000002").exists()
    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/success_rate" in r] == [1, 2]


def test_pipeline_without_rl_evaluations_still_evaluates_the_final_checkpoint(tmp_path):
    # trainer.eval_every=-1: the RL trainer evaluates nothing, the pipeline's comparison needs the after-RL eval
    args = ["pipeline", f"pipeline.out_dir={tmp_path}", "trainer.eval_every=-1", "pipeline.eval_tasks=2",
            "pipeline.eval_splits=[dev]", "sft.num_demos=4", "sft.epochs=1", "trainer.steps=1",
            "trainer.tasks_per_step=1", "trainer.group_size=2", "env.max_steps=3", "env_pool=inline"]
    assert main(args) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    rl_eval = json.loads((tmp_path / "eval_rl_dev" / "eval.json").read_text())
    assert rl_eval["checkpoint"] == str(tmp_path / "rl" / "checkpoints" / "step_000001")
    assert (s["split"], s["episodes"], s["paired"]["pairs"]) == ("dev", 2, 2)
    assert s["rl_success_rate"] == rl_eval["success_rate"]
    assert s["rl_success_ci95"] == rl_eval["success_ci95"]      # the evaluation's interval (eval.repeats aware)
    assert (s["rollout_quant"], s["rollout_backend"]) == ("w8a8_kv8", "torch")
    assert not (tmp_path / "rl" / "eval").exists()


def test_pipeline_rejects_a_split_the_env_does_not_have():
    from agentq.config import load_config
    from agentq.trainer.pipeline import eval_splits

    cfg = load_config(["pipeline.eval_splits=[dev,valid]"], config_name="pipeline")
    with pytest.raises(ValueError, match=r"\['valid'\] not a split of textworld_express; valid: \['train', 'dev', 'test'\]"):
        eval_splits(cfg)
    assert eval_splits(load_config(["pipeline.eval_splits=null"], config_name="pipeline")) == ["test"]


@pytest.mark.parametrize("override,named", [
    ("algo.objective_params.budget_B=-1", "budget_B=-1; valid: ≥ 0"),
    ("placement=split", "placement.mode=split"),                 # with the vLLM backend below
    ("placement=colocated placement.use_gpus=maybe", "placement.use_gpus='maybe'"),
    ("trainer.old_logp=bypass", "trainer.old_logp=bypass"),       # an fp32 learner on the CPU
])
def test_pipeline_refuses_a_bad_rl_setting_before_its_sft_stage(tmp_path, capsys, override, named):
    """A setting only the RL stage reads used to be refused after SFT and its evaluations had run;
    now it is one line before anything runs, and no run folder is left."""
    out = tmp_path / "p"
    extra = ["rollout.backend=vllm"] if override.startswith("placement=") else []
    assert main(["pipeline", f"pipeline.out_dir={out}", *override.split(), *extra]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err, err
    assert not out.exists()


def test_two_proportion_z_by_hand():
    # 40/100 vs 60/100: pooled p = 0.5, se = sqrt(0.25 · 0.02) = 0.070711, z = 0.2 / 0.070711
    assert abs(two_proportion_z(40, 100, 60, 100) - 2.828427) < 1e-5


def test_mcnemar_paired_comparison_by_hand():
    before = {"a": True, "b": False, "c": False, "d": True, "e": False}
    after = {"a": True, "b": True, "c": True, "d": False, "e": False, "x": True}   # x: unpaired, ignored
    r = paired_comparison(before, after)
    # discordant: b, c won only after (2); d only before (1). z = 1/√3; exact p = 2·P(Bin(3,½) ≤ 1) = 1
    assert (r["pairs"], r["won_only_after"], r["won_only_before"]) == (5, 2, 1)
    assert abs(r["mcnemar_z"] - 0.577350) < 1e-6 and r["mcnemar_p"] == 1.0
    # 8 vs 1 discordant: z = 7/3, p = 2·(1 + 9)/512 = 0.0390625
    before = {str(i): i >= 8 for i in range(12)}
    after = {str(i): i < 8 or i >= 9 for i in range(12)}
    r = paired_comparison(before, after)
    assert (r["won_only_after"], r["won_only_before"]) == (8, 1)
    assert abs(r["mcnemar_z"] - 7 / 3) < 1e-9 and abs(r["mcnemar_p"] - 0.0390625) < 1e-12


def test_the_comparison_pairs_every_repeat_of_a_task(tmp_path):
    """With eval.repeats = 2 the paired test read one episode per task (the last) from the in-memory
    `won_by_task`; it reads every episode of both evaluations' episodes.jsonl."""
    from agentq.agent.trajectory import Trajectory
    from agentq.eval.evaluate import write_eval
    from agentq.eval.metrics import summarize
    from agentq.trainer.pipeline import _comparison

    def evaluation(name, outcomes):
        trajs = [Trajectory(i, task, "dev", turns=1, won=won, end_reason="won" if won else "step_cap")
                 for i, (task, won) in enumerate((t, w) for t, ws in outcomes.items() for w in ws)]
        report = summarize(trajs)
        write_eval(tmp_path / name, report, trajs)
        return report

    # tests/eval/test_metrics.py's case by hand: d = +1, +½, −½, 0; p = 6/8, z = 1/√1.5
    before = evaluation("sft", {"a": [False, False], "b": [False, True], "c": [True, False], "d": [True, True]})
    after = evaluation("rl", {"a": [True, True], "b": [True, True], "c": [False, False], "d": [True, True]})
    pr = _comparison(before, after)["paired"]
    assert (pr["pairs"], pr["episodes_before"], pr["episodes_after"]) == (4, 8, 8)
    assert (pr["won_only_after"], pr["won_only_before"]) == (2, 1)
    assert pr["mcnemar_p"] == 0.75 and abs(pr["mcnemar_z"] - 0.816497) < 1e-6
    assert pr["test"] == "exact sign-flip over tasks"


def test_summarize_turn_rates_by_hand():
    from agentq.agent.trajectory import Trajectory
    from agentq.eval.metrics import summarize

    a = Trajectory(0, "coin/1", "test", turns=4, invalid_actions=1, inadmissible_actions=2, won=True,
                   end_reason="won", score=1.0, reward=1.0, admissible_turns=4)
    b = Trajectory(1, "coin/2", "test", turns=6, invalid_actions=0, inadmissible_actions=3, end_reason="step_cap",
                   admissible_turns=6)
    s = summarize([a, b])
    # per turn over all episodes: 1/10 invalid format, 5/10 inadmissible; one of two capped; won in 4 turns
    assert s["invalid_action_rate"] == 0.1 and s["inadmissible_action_rate"] == 0.5
    assert s["cap_rate"] == 0.5 and s["turns_success_mean"] == 4 and s["success_rate"] == 0.5
    # an env that lists no admissible actions (ScienceWorld's default): not measured, not 0 %
    a.admissible_turns = b.admissible_turns = a.inadmissible_actions = b.inadmissible_actions = 0
    assert math.isnan(summarize([a, b])["inadmissible_action_rate"])


GUESS_LIKE = "from agentq.envs import TaskStep, TextEnv\n" + one_task_env("Coin", ("train", "heldout"))


def test_pipeline_splits_of_an_env_from_outside_agentq(tmp_path, monkeypatch):
    """An env that is not one of REGISTRY's names (a plugin, `module:Class`) was a KeyError traceback
    in `agentq pipeline` before anything ran; its splits are checked like a built-in's."""
    from agentq.config import ConfigError, load_config
    from agentq.trainer.pipeline import eval_splits

    from omegaconf import OmegaConf

    (tmp_path / "pipeline_probe_env.py").write_text(GUESS_LIKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "conf" / "env").mkdir(parents=True)        # its own config (docs/adding-an-environment.md)
    base = OmegaConf.to_container(load_config(["env=textworld_express"]).env)
    (tmp_path / "conf" / "env" / "probe.yaml").write_text(OmegaConf.to_yaml(
        {**base, "name": "pipeline_probe_env:Coin", "kwargs": {}, "train_split": "train", "eval_split": "heldout"}))
    probe = ["env=probe", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"]
    cfg = load_config([*probe, "pipeline.eval_splits=[heldout]"], config_name="pipeline")
    assert eval_splits(cfg) == ["heldout"]
    cfg = load_config([*probe, "pipeline.eval_splits=[dev]"], config_name="pipeline")
    with pytest.raises(ConfigError, match=r"\['dev'\] not a split of pipeline_probe_env:Coin; valid: \['train', 'heldout'\]"):
        eval_splits(cfg)


def test_a_split_the_env_lacks_is_one_line_and_leaves_no_run_folder(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["pipeline", "pipeline.eval_splits=[valid]", f"pipeline.out_dir={out}"]) == 2
    assert "agentq: pipeline.eval_splits=['valid']: ['valid'] not a split" in capsys.readouterr().err
    assert not out.exists()


def test_turns_of_won_episodes_with_none_won_is_not_nan(capsys):
    from agentq.trainer.pipeline import _print_comparison

    c = {"sft_success_rate": 0.0, "rl_success_rate": 0.5, "sft_success_ci95": [0.0, 0.1], "rl_success_ci95": [0.4, 0.6],
         "sft_score": 0.0, "rl_score": 0.5, "sft_turns_success": float("nan"), "rl_turns_success": 2.0,
         "sft_cap_rate": 1.0, "rl_cap_rate": 0.5, "sft_inadmissible_rate": 0.0, "rl_inadmissible_rate": 0.0,
         "success_gain": 0.5, "gain_z": 1.0,
         "paired": {"pairs": 2, "won_only_after": 1, "won_only_before": 0, "mcnemar_z": 1.0, "mcnemar_p": 1.0,
                    "test": "exact McNemar"}}
    _print_comparison("t", c)
    said = capsys.readouterr().err
    assert "– (none won)" in said and "2.00" in said and "nan" not in said
    assert ("paired over 2 tasks, exact McNemar: better after RL on 1, after SFT on 0, z = 1.00, p = 1)"
            in " ".join(said.split()))
    # evaluations with no task in common (a resumed run's episodes.jsonl gone): no test, not "exact McNemar, p = 1"
    c["paired"] = paired_comparison({}, {"a": True})
    _print_comparison("t", c)
    said = " ".join(capsys.readouterr().err.split())
    assert "(unpaired z = 1.00; no paired test: the two evaluations share no task)" in said
    assert "McNemar" not in said and "p = " not in said


def test_the_pipeline_puts_back_its_evaluations_a_kill_cut_short_when_it_starts(tiny_model_dir, tmp_path,
                                                                                monkeypatch):
    """eval_sft_<split> and eval_rl_<split> are the pipeline's own: one whose rewrite a kill cut short
    (no eval.json, the old pair set aside) is put back when the pipeline claims its folder, before its
    first stage, not only at the evaluation's next write (readers found no eval.json until then)."""
    import os

    from agentq.agent.trajectory import Trajectory
    from agentq.config import ConfigError
    from agentq.eval.episodes import read_eval
    from agentq.eval.evaluate import write_eval
    from agentq.eval.metrics import summarize
    from agentq.trainer import sft

    out, names = tmp_path / "p", ("eval_sft_dev", "eval_rl_test")
    trajs = [Trajectory(episode_id=i, task_id=f"t{i}", split="dev", turns=1) for i in range(3)]
    for name in names:
        write_eval(out / name, {"env": "e", **summarize(trajs)}, trajs)
        for f in ("eval.json", "episodes.jsonl"):      # a rewrite killed after its two asides
            (out / name / f).rename(out / name / f".{f}.old")
        (out / name / ".eval.json.tmp").write_text("{}")
    seen = {}

    def first_stage(cfg, out_dir, **kw):
        seen.update({name: sorted(os.listdir(out / name)) for name in names})
        raise ConfigError("stopped before SFT")

    monkeypatch.setattr(sft, "sft", first_stage)
    # an earlier pipeline's folder: claimed only with trainer.overwrite=true (test_a_pipeline_into_...)
    assert main(["pipeline", f"pipeline.out_dir={out}", "model=hf", f"model.path={tiny_model_dir}",
                 "env_pool=inline", "trainer.overwrite=true"]) == 2
    assert seen == {name: ["episodes.jsonl", "eval.json"] for name in names}
    assert all(read_eval(out / name)["episodes"] == 3 for name in names)


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".agentq.lock"}


def _earlier_run(folder, kind):
    """A folder as `agentq train`, `agentq sft` or `agentq pipeline` leaves it (their files, by hand)."""
    names = {"train": ["metrics.jsonl", "checkpoints/step_000002/config.json", "learning_curve.png",
                       "train_summary.json"],
             "sft": ["metrics.jsonl", "demos.jsonl", "checkpoint/config.json", "sft_summary.json"],
             "pipeline": ["sft/checkpoint/config.json", "rl/metrics.jsonl", "eval_sft_test/eval.json", "summary.json",
                          "learning_curve.png"]}[kind]
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"{kind}'s {name}")
    return _files(folder)


def _stages_seen(monkeypatch, stop_at_sft=True):
    """Replace the SFT stage: record that it ran (and which of the folder's files it found); stop there
    with a one-line error, or go on with a checkpoint to the evaluations, which stop the pipeline."""
    from agentq.config import ConfigError
    from agentq.trainer import pipeline, sft

    seen = []

    def stage(cfg, out_dir, **kw):
        seen.append(sorted(p.name for p in out_dir.parent.iterdir()))
        if stop_at_sft:
            raise ConfigError("reached the SFT stage")
        return {"checkpoint": str(out_dir / "checkpoint"), "demos_used": 1}

    def evaluation(*a, **kw):
        raise ConfigError("reached the evaluations")

    monkeypatch.setattr(sft, "sft", stage)
    monkeypatch.setattr(pipeline, "evaluate_checkpoint", evaluation)
    return seen


@pytest.mark.parametrize("overwrite", [[], ["trainer.overwrite=true"]], ids=["plain", "overwrite"])
@pytest.mark.parametrize("kind,found", [
    ("train", "train_summary.json, checkpoints"),
    ("sft", "sft_summary.json, checkpoint, demos.jsonl")])
def test_a_pipeline_into_a_train_or_sft_run_folder_is_refused_naming_it(tiny_model_dir, tmp_path, capsys, monkeypatch,
                                                                         kind, found, overwrite):
    """`agentq pipeline pipeline.out_dir=<an agentq train run>` ran, added sft/, rl/, eval_sft_*/ and
    summary.json and replaced the run's learning_curve.png; `agentq report` of the folder still showed
    the old run. Refused in one line before any stage, trainer.overwrite or not, the run untouched."""
    out = tmp_path / "run"
    before, seen = _earlier_run(out, kind), _stages_seen(monkeypatch)
    assert main(["pipeline", f"pipeline.out_dir={out}", "model=hf", f"model.path={tiny_model_dir}", "env_pool=inline",
                 *overwrite]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"agentq: run folder '{out}' (pipeline.out_dir) holds an `agentq {kind}` run ({found}), not an `agentq pipeline` one: pick "
        "another pipeline.out_dir (trainer.overwrite=true replaces only a run of the same command)")
    assert seen == [] and _files(out) == before


def test_a_pipeline_into_an_earlier_pipeline_is_refused_before_its_first_stage(tiny_model_dir, tmp_path, capsys,
                                                                              monkeypatch):
    """A rerun into a pipeline's folder was refused only at sft/, once the model was built; now up front."""
    out = tmp_path / "p"
    before, seen = _earlier_run(out, "pipeline"), _stages_seen(monkeypatch)
    assert main(["pipeline", f"pipeline.out_dir={out}", "model=hf", f"model.path={tiny_model_dir}",
                 "env_pool=inline"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert (f"agentq: run folder '{out}' (pipeline.out_dir) already holds a run (sft, rl, eval_sft_test, summary.json, "
            "learning_curve.png); " in said and "pick another pipeline.out_dir, or replace it with trainer.overwrite=true"
            in said)
    assert seen == [] and _files(out) == before


def test_a_pipeline_holds_its_folder_against_a_second_process(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import fcntl

    from agentq.trainer.run_dir import LOCK_FILE

    out = tmp_path / "p"
    out.mkdir()
    seen = _stages_seen(monkeypatch)
    with open(out / LOCK_FILE, "a+") as held:       # another pipeline's lock (flock: per open file)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["pipeline", f"pipeline.out_dir={out}", "model=hf", f"model.path={tiny_model_dir}",
                     "env_pool=inline"]) == 2
    assert f"run folder '{out}' is in use by another agentq process" in capsys.readouterr().err
    assert seen == []


def test_overwrite_replaces_an_earlier_pipelines_files_once_sft_is_done(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """trainer.overwrite=true: the stages replace sft/ and rl/ as they start (late: a bad setting costs
    nothing); the earlier evaluations, summary and curve go once SFT is done: an eval_sft_<split> of a
    split this run does not evaluate stayed beside the new run's."""
    out = tmp_path / "p"
    _earlier_run(out, "pipeline")
    seen = _stages_seen(monkeypatch, stop_at_sft=False)
    assert main(["pipeline", f"pipeline.out_dir={out}", "model=hf", f"model.path={tiny_model_dir}", "env_pool=inline",
                 "trainer.overwrite=true", "pipeline.eval_splits=[dev]"]) == 2
    assert "agentq: reached the evaluations" in capsys.readouterr().err
    assert seen == [[".agentq.lock", "eval_sft_test", "learning_curve.png", "rl", "sft", "summary.json"]]
    assert sorted(p.name for p in out.iterdir()) == [".agentq.lock", "rl", "sft"]


def test_a_busy_rl_folder_names_the_key_the_pipeline_reads(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """The RL stage in a <pipeline.out_dir>/rl that another process holds (`agentq train
    trainer.resume=<it>`, while the pipeline is rerun with trainer.overwrite=true) said "pick another
    trainer.out_dir", which `agentq pipeline` refuses (config_schema.READ_BY). The SFT stage and the
    evaluations are stubs (the tiny model stands for the SFT checkpoint): only the RL stage's claim of
    its folder is under test, and it runs for real."""
    import fcntl

    from agentq.trainer import pipeline, sft
    from agentq.trainer.run_dir import LOCK_FILE

    out = tmp_path / "p"
    monkeypatch.setattr(sft, "sft", lambda cfg, out_dir, **kw: {"checkpoint": str(tiny_model_dir), "demos_used": 1})
    monkeypatch.setattr(pipeline, "evaluate_checkpoint", lambda *a, **kw: {})
    (out / "rl").mkdir(parents=True)
    with open(out / "rl" / LOCK_FILE, "a+") as held:      # another process's RL run (flock: per open file)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["pipeline", f"pipeline.out_dir={out}", "model=hf", f"model.path={tiny_model_dir}",
                     "env_pool=inline", "pipeline.eval_splits=[dev]", "trainer.overwrite=true"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert (f"agentq: run folder '{out / 'rl'}' is in use by another agentq process (pid ?); wait for it to finish "
            "or pick another pipeline.out_dir") in said
    assert "trainer.out_dir" not in said


def test_its_rl_stage_resumed_by_agentq_train_ends_on_the_pipelines_final_evaluation(tiny_model_dir, tmp_path,
                                                                                     capsys, monkeypatch):
    """`agentq train trainer.resume=<pipeline>/rl`, the command a pipeline stopped in its RL stage gives,
    ended on trainer.eval_num_tasks tasks (1 here) where the pipeline ends on pipeline.eval_tasks (3): the
    pipeline passed that count to the trainer, and rl/config.yaml did not hold it. It does now
    (trainer.final_eval_tasks), and the resumed stage ends as the uninterrupted pipeline did, on the
    same tasks with the same outcomes. SFT and the pipeline's own evaluations are stubs (the tiny model
    stands for the SFT checkpoint), and the pipeline stops once its RL stage is done: that stage runs for real."""
    from omegaconf import OmegaConf

    from agentq.config import ConfigError
    from agentq.eval.episodes import read_trajectories
    from agentq.trainer import pipeline, sft

    def rl_done(before, after):
        raise ConfigError("the RL stage is done")

    def final_eval(out):
        """(the RL stage's evaluations' episode counts by step, its final one's (task, won) pairs)"""
        evals = sorted((out / "rl" / "eval").glob("step_*"))
        return ({e.name: json.loads((e / "eval.json").read_text())["episodes"] for e in evals},
                [(t.task_id, t.won) for t in read_trajectories(evals[-1] / "episodes.jsonl")])

    monkeypatch.setattr(sft, "sft", lambda cfg, out_dir, **kw: {"checkpoint": str(tiny_model_dir), "demos_used": 1})
    monkeypatch.setattr(pipeline, "evaluate_checkpoint", lambda *a, **kw: {})
    monkeypatch.setattr(pipeline, "_comparison", rl_done)
    args = ["model=hf", f"model.path={tiny_model_dir}", "env_pool=inline", "pipeline.eval_splits=[dev]",
            "pipeline.eval_tasks=3", "trainer.steps=2", "trainer.tasks_per_step=1", "trainer.group_size=2",
            "trainer.save_every=1", "trainer.eval_every=1", "trainer.eval_num_tasks=1", "env.max_steps=2",
            "env.max_new_tokens=8", "trainer.save_segments=false"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["pipeline", f"pipeline.out_dir={whole}", *args]) == 2
    assert (whole / "rl" / "train_summary.json").is_file()
    stop_rl_at_step(monkeypatch, 2)
    assert main(["pipeline", f"pipeline.out_dir={cut}", *args]) == 130
    assert (f"continue that stage alone with agentq train trainer.resume={cut / 'rl'} " in
            " ".join(capsys.readouterr().err.split()))
    assert OmegaConf.load(cut / "rl" / "config.yaml").trainer.final_eval_tasks == 3
    monkeypatch.undo()
    assert main(["train", f"trainer.resume={cut / 'rl'}"]) == 0
    counts, outcomes = final_eval(cut)
    assert counts == {"step_000001": 1, "step_000002": 3}
    assert (counts, outcomes) == final_eval(whole) and len(outcomes) == 3
    assert json.loads((cut / "rl" / "train_summary.json").read_text())["final_eval"]["episodes"] == 3


def test_an_error_after_the_pipeline_folder_is_locked_releases_it(tmp_path, monkeypatch):
    """An OSError (or Ctrl-C) while putting back the evaluations left the folder locked until garbage
    collection: the next claim in the same process was refused as "in use by another agentq process"."""
    from agentq.trainer import pipeline

    out = tmp_path / "p"

    def broken(folders):
        raise OSError("disk gone")

    monkeypatch.setattr(pipeline, "recover_eval_pairs", broken)
    with pytest.raises(OSError, match="disk gone") as raised:     # `raised` keeps the frames (and a leaked lock) alive
        pipeline.claim_pipeline_dir(out, overwrite=False)
    monkeypatch.undo()
    pipeline.claim_pipeline_dir(out, overwrite=False).close()
    assert raised.value.args == ("disk gone",)


def test_the_pipelines_summary_json_is_replaced_whole(tmp_path, capsys, disk_full_at):
    """summary.json was written in place: a full disk left half of it. Now no half file is left, and
    the OSError is one line."""
    cut = disk_full_at("summary.json")
    args = ["pipeline", f"pipeline.out_dir={tmp_path / 'p'}", "pipeline.eval_tasks=1", "sft.num_demos=2", "sft.epochs=1",
            "trainer.steps=1", "trainer.tasks_per_step=1", "trainer.group_size=2", "trainer.eval_every=0",
            "trainer.eval_num_tasks=1", "env.max_steps=2", "env.max_new_tokens=8", "env_pool=inline"]
    assert main(args) == 2
    assert cut and capsys.readouterr().err.strip().splitlines()[-1] == "agentq: No space left on device"
    assert not list((tmp_path / "p").glob("*summary.json*"))
