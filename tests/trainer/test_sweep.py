"""`agentq sweep` in miniature: 2 arms × 1 seed from one shared SFT checkpoint, in 2 parallel
processes, on real TextWorldExpress episodes; then a resume that reruns nothing."""
import json

import pytest

from agentq.cli import main
from agentq.eval.metrics import aulc, paired_comparison

ARGS = ["sweep", "env=textworld_express", "sweep.arms=[bf16,interq]", "sweep.seeds=[0]", "sweep.parallel=2",
        "sweep.eval_tasks=4", "sft.num_demos=8", "sft.epochs=1", "trainer.steps=2", "trainer.tasks_per_step=2",
        "trainer.group_size=2", "trainer.eval_every=1", "env.max_steps=4", "env_pool=inline"]


def test_sweep_miniature_and_resume(tmp_path):
    assert main([*ARGS, f"sweep.out_dir={tmp_path}"]) == 0
    t = json.loads((tmp_path / "table.json").read_text())
    assert list(t["arms"]) == ["bf16", "interq"] and t["references"] == ["bf16", "interq"]
    bf16, iq = t["arms"]["bf16"], t["arms"]["interq"]
    assert (bf16["rollout_quant"], bf16["learner_quant"]) == ("none", "none")
    # conf/sweep.yaml: the aligned arms' learner emulates the int8 linears only (the KV8 residual)
    assert (iq["rollout_quant"], iq["learner_quant"]) == ("w8a8_kv8", "w8a8")
    assert bf16["k3_max"] < 1e-9 < iq["k3_mean"]            # fp32 twins vs the KV8 residual
    assert bf16["alpha_min"] is None and 0 < iq["alpha_min"] <= iq["alpha_max"] <= 1
    for r in (bf16, iq):
        assert r["episodes"] == 4 and r["seeds"] == [0]
        c = r["curves"]["0"]
        assert c["steps"] == [0, 1, 2] and c["success"][0] == r["sft_eval"]["success_rate"]
        assert r["aulc"] == aulc(c["steps"], c["success"])
        assert r["success_rate"] == c["success"][-1]
        assert r["rollout_time_s"] > 0 and r["learner_time_s"] > 0
    # the paired test, recomputed from the two final evaluations' episodes
    won = {arm: {e["task_id"]: e["won"] for e in map(json.loads, (tmp_path / "arms" / arm / "seed_0" / "eval" /
                                                              "step_000002" / "episodes.jsonl").open())}
           for arm in ("bf16", "interq")}
    p = paired_comparison(won["bf16"], won["interq"])
    assert iq["paired"]["bf16"]["pairs"] == 4
    assert (iq["paired"]["bf16"]["won_only_after"], iq["paired"]["bf16"]["won_only_before"]) == \
        (p["won_only_after"], p["won_only_before"])
    assert "interq" in bf16["paired"] and "bf16" not in bf16["paired"]
    # step 0 under each arm's own rollout numerics: bf16's SFT evaluation is its own (quant none)
    assert (iq["sft_eval"]["folder"], iq["sft_eval"]["success_rate"]) == ("eval_sft", t["sft_success_rate"])
    assert (bf16["sft_eval"]["folder"], bf16["sft_eval"]["rollout_quant"]) == ("eval_sft_bf16", "none")
    assert json.loads((tmp_path / "eval_sft_bf16" / "eval.json").read_text())["rollout_quant"] == "none"
    assert (bf16["rollout_backend"], iq["rollout_backend"]) == ("torch", "torch")     # from result.json
    md = (tmp_path / "table.md").read_text()
    assert "| interq | w8a8_kv8 / w8a8 |" in md and "vs bf16: b / c, p" in md     # one backend: not shown
    assert "| bf16 | bf16 / none |" in md       # rollout=bf16 (quant "none") as its folders name it; the learner's spec
    assert "p = two-sided, paired by task: exact McNemar." in md                   # one seed, one episode each
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    assert (tmp_path / "arms" / "interq" / "seed_0" / "log.txt").exists()     # parallel: logs per run

    # resume: finished runs and the shared SFT are not redone; the table is rewritten
    stamp = {p: p.stat().st_mtime_ns for p in tmp_path.glob("arms/*/seed_0/result.json")}
    sft_stamp = (tmp_path / "sft" / "sft_summary.json").stat().st_mtime_ns
    (tmp_path / "table.json").unlink()
    assert main([*ARGS, f"sweep.out_dir={tmp_path}", "sweep.parallel=1"]) == 0
    assert {p: p.stat().st_mtime_ns for p in stamp} == stamp
    assert (tmp_path / "sft" / "sft_summary.json").stat().st_mtime_ns == sft_stamp
    assert json.loads((tmp_path / "table.json").read_text())["arms"]["interq"]["paired"] == iq["paired"]


def test_a_stopped_sweep_says_what_finished_and_its_resume_command_works(tmp_path, monkeypatch, capsys):
    """A worker given up on in an arm ended the sweep with the bare cause; the sweep resumes when given
    its folder again, but nothing said so. Now the last line counts the finished runs and gives the
    command, and that command finishes the rest without rerunning the finished arm."""
    import shlex

    from agentq.trainer import sweep
    from agentq.trainer.run_dir import RunAborted

    out = tmp_path / "s"
    args = [*ARGS, "sweep.parallel=1", "trainer.steps=1"]
    real = sweep.run_arm

    def interq_gives_up(job):
        if job["arm"] == "interq":
            raise RunAborted("env worker 0 gave up")
        return real(job)

    monkeypatch.setattr(sweep, "run_arm", interq_gives_up)
    assert main([*args, f"sweep.out_dir={out}"]) == 1
    said = capsys.readouterr().err.splitlines()[-1]
    again = shlex.join(["agentq", *args, f"sweep.out_dir={out}"])
    assert said == (f"agentq: run stopped: sweep arm interq seed 0 failed: RunAborted: env worker 0 gave up; sweep "
                    f"folder {out}: 1 of 2 arm × seed runs finished; resume it with {again} (finished runs are kept, "
                    "an unfinished one starts over)")
    monkeypatch.undo()
    stamp = (out / "arms" / "bf16" / "seed_0" / "result.json").stat().st_mtime_ns
    assert main(shlex.split(said.split("resume it with ")[1].split(" (finished")[0])[1:]) == 0
    assert (out / "arms" / "bf16" / "seed_0" / "result.json").stat().st_mtime_ns == stamp
    assert list(json.loads((out / "table.json").read_text())["arms"]) == ["bf16", "interq"]


def test_train_stats_and_pooling_by_hand():
    """K3 per turn is averaged over the steps that reached the turn (nan/None skipped); α and K3
    ranges are extremes; times are per-run totals, pooled as the mean over seeds."""
    from agentq.trainer.sweep import _pool, train_stats

    a = train_stats([
        {"step": 1, "reward_mean": 0.0, "k3": 2e-6, "k3_by_turn": [1e-6, 3e-6], "alpha_min": 0.99, "alpha_max": 1.0,
         "rollout_time_s": 3.0, "train_time_s": 1.0},
        {"step": 2, "reward_mean": 0.0, "k3": 4e-6, "k3_by_turn": [3e-6, None, 5e-6], "alpha_min": 0.98,
         "alpha_max": 0.999, "rollout_time_s": 5.0, "train_time_s": 2.0},
        {"step": 2, "eval/success_rate": 0.5},                       # an eval row is not a training step
    ])
    assert a["k3_mean"] == 3e-6 and (a["k3_min"], a["k3_max"]) == (2e-6, 4e-6)
    assert a["k3_by_turn"] == [2e-6, 3e-6, 5e-6]
    assert (a["alpha_min"], a["alpha_max"]) == (0.98, 1.0)
    assert (a["rollout_time_s"], a["learner_time_s"]) == (8.0, 3.0)
    b = train_stats([{"step": 1, "reward_mean": 0.0, "k3": 6e-6, "k3_by_turn": [4e-6], "rollout_time_s": 2.0,
                      "train_time_s": 1.0}])
    assert b["alpha_min"] is None
    p = _pool([a, b])
    assert p["k3_mean"] == (3e-6 + 6e-6) / 2 and (p["k3_min"], p["k3_max"]) == (2e-6, 6e-6)
    assert p["k3_by_turn"] == [3e-6, 3e-6, 5e-6]
    assert (p["alpha_min"], p["alpha_max"]) == (0.98, 1.0)
    assert (p["rollout_time_s"], p["learner_time_s"]) == (5.0, 2.0)


def _listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("stage,left,said", [
    ("sft running", ["sft/config.yaml"], "has nothing finished yet: its shared SFT stage has not finished (no "
                                         "sft/sft_summary.json)"),
    ("sft evaluating", ["sft/sft_summary.json"], "has nothing finished yet: its SFT checkpoint is not evaluated yet "
                                                 "(no eval_sft/eval.json)"),
    ("no arm finished", ["sft/sft_summary.json", "eval_sft/eval.json", "arms/qat/seed_0/metrics.jsonl"],
     "has no finished run of sweep.arms=['bf16', 'qat'] × sweep.seeds=[0] yet "
     "(no arms/<arm>/seed_<seed>/result.json)"),
])
def test_table_only_on_a_sweep_with_nothing_finished_runs_nothing(tmp_path, capsys, stage, left, said):
    """`sweep.table_only=true` (documented: runs nothing, takes no lock) on a sweep still in its SFT
    stage ran that stage and the SFT evaluation itself, without the sweep's lock, beside the sweep that
    holds it. Now one line, and the folder is left as it was."""
    from agentq.trainer.run_dir import claim_run_dir

    out = tmp_path / "s"
    for name in left:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("{}")
    running = claim_run_dir(out, resume=True, overwrite=False, kind="sweep")    # the sweep, still running
    before = _listing(out)
    try:
        assert main([*ARGS[:2], "sweep.arms=[bf16,qat]", "sweep.seeds=[0]", "sweep.eval_tasks=4", "env_pool=inline",
                     "sweep.table_only=true", f"sweep.out_dir={out}"]) == 2
    finally:
        running.close()
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"agentq: sweep.table_only=true: sweep.out_dir='{out}' {said}"
    assert _listing(out) == before


def test_table_only_on_a_missing_folder_makes_none(tmp_path, capsys):
    """A misspelt sweep.out_dir with table_only made the folder and ran a whole SFT stage and evaluation
    there; no sweep.out_dir at all did the same in a new runs/sweep-<env>-<time>."""
    out = tmp_path / "sweep-mian"
    assert main([*ARGS[:2], "sweep.arms=[bf16]", "sweep.seeds=[0]", "sweep.table_only=true",
                 f"sweep.out_dir={out}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"agentq: sweep.table_only=true: sweep.out_dir='{out}' is no folder; it writes the table of a sweep's finished "
        "runs and runs nothing")
    assert list(tmp_path.iterdir()) == []
    assert main([*ARGS[:2], "sweep.arms=[bf16]", "sweep.seeds=[0]", "sweep.table_only=true"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "agentq: sweep.table_only=true writes the table of a sweep's finished runs and runs nothing: name the "
        "sweep's folder with sweep.out_dir=<folder>")


def test_table_only_tabulates_the_arms_finished_so_far_of_a_running_sweep(tmp_path):
    """A sweep with bf16 finished and qat still running (its folder locked by the sweep): the table has
    bf16 alone, from its files; nothing is run, evaluated or locked, and qat's folder is untouched."""
    from agentq.trainer.run_dir import claim_run_dir

    out = tmp_path / "s"
    first = ["env=textworld_express", "trainer.steps=2", "sweep.eval_tasks=4"]
    finished_arm(out, "bf16", 0, first, won=[True, False, True, True])
    (out / "sft").mkdir()
    (out / "sft" / "sft_summary.json").write_text("{}")
    (out / "eval_sft").mkdir()
    (out / "eval_sft" / "eval.json").write_text(json.dumps({"success_rate": 0.25, "episodes": 4}))
    (out / "arms" / "qat" / "seed_0").mkdir(parents=True)
    (out / "arms" / "qat" / "seed_0" / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.0}) + "\n")
    running = claim_run_dir(out, resume=True, overwrite=False, kind="sweep")
    before = _listing(out)
    try:
        assert main(["sweep", *first, "sweep.arms=[bf16,qat]", "sweep.seeds=[0]", "sweep.table_only=true",
                     f"sweep.out_dir={out}"]) == 0
    finally:
        running.close()
    t = json.loads((out / "table.json").read_text())
    assert list(t["arms"]) == ["bf16"] and (t["sft_success_rate"], t["sft_episodes"]) == (0.25, 4)
    bf16 = t["arms"]["bf16"]
    assert (bf16["success_rate"], bf16["episodes"], bf16["seeds"]) == (0.75, 4, [0])
    assert bf16["curves"]["0"] == {"steps": [0, 2], "success": [0.25, 0.75]}
    assert _listing(out) == sorted([*before, "table.json", "table.md", "curves.png"])


def test_table_only_reads_the_arms_and_seeds_from_the_folder_and_keeps_a_fuller_table(tmp_path, capsys):
    """`sweep.table_only=true sweep.out_dir=<folder>` without the sweep's arms and seeds took
    conf/sweep.yaml's: "2 of 27" runs of a 2 × 1 sweep, and that table written over the sweep's own.
    Now the folder's runs say them; a command line naming fewer is refused, the table left as it is."""
    out = tmp_path / "s"
    first = ["env=textworld_express", "trainer.steps=2", "sweep.eval_tasks=4", "sweep.arms=[bf16,qat]",
             "sweep.seeds=[0]"]
    finished_arm(out, "bf16", 0, first, won=[True, False, True, True])
    finished_arm(out, "qat", 0, first, won=[True, False, False, False])
    (out / "sft").mkdir()
    (out / "sft" / "sft_summary.json").write_text("{}")
    (out / "eval_sft").mkdir()
    (out / "eval_sft" / "eval.json").write_text(json.dumps({"success_rate": 0.25, "episodes": 4}))
    assert main(["sweep", "sweep.table_only=true", f"sweep.out_dir={out}"]) == 0
    said = capsys.readouterr()
    assert "sweep: 2 of 2 arm × seed runs finished" in said.out + said.err
    t = json.loads((out / "table.json").read_text())
    assert (list(t["arms"]), t["seeds"], t["references"]) == (["bf16", "qat"], [0], ["bf16"])
    table = (out / "table.md").read_text()
    assert "| vs bf16: b / c, p |" in table and "vs interq" not in table
    assert main(["sweep", "sweep.arms=[bf16]", "sweep.table_only=true", f"sweep.out_dir={out}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"agentq: sweep.table_only=true: {out}/table.md holds runs this table would leave out (qat seed 0); it is "
        "left as it is: name them in sweep.arms and sweep.seeds, or drop those overrides to tabulate every "
        "finished run of the folder")
    assert (out / "table.md").read_text() == table


def test_a_busy_sft_folder_names_the_key_the_sweep_reads(tiny_model_dir, tmp_path, capsys):
    """The sweep's SFT stage in a <sweep.out_dir>/sft that another process holds said "pick another
    sft.out_dir", which `agentq sweep` refuses (config_schema.READ_BY)."""
    import fcntl

    from agentq.trainer.run_dir import LOCK_FILE

    out = tmp_path / "s"
    (out / "sft").mkdir(parents=True)
    with open(out / "sft" / LOCK_FILE, "a+") as held:      # another process's SFT (flock: per open file)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main([*ARGS[:2], "sweep.arms=[bf16]", "sweep.seeds=[0]", "model=hf", f"model.path={tiny_model_dir}",
                     "env_pool=inline", f"sweep.out_dir={out}"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert (f"agentq: run folder '{out / 'sft'}' is in use by another agentq process (pid ?); wait for it to finish "
            "or pick another sweep.out_dir") in said
    assert "sft.out_dir" not in said


def test_an_arms_rl_run_names_sweep_out_dir_in_its_messages(tmp_path, monkeypatch):
    """Each arm's RLTrainer is told that sweep.out_dir named its folder. A stub RLTrainer records it:
    `run_arm` removes and remakes the arm's folder just before, so no real refusal of it is reachable
    (the pipeline's RL stage checks the real message: test_pipeline)."""
    from agentq.trainer import rl
    from agentq.trainer.sweep import arm_overrides, run_arm

    seen = {}

    class Recorder:
        def __init__(self, cfg, init_path=None, out_key="trainer.out_dir"):
            seen.update(init_path=init_path, out_key=out_key, out_dir=cfg.trainer.out_dir)

        def train(self):
            return {}

    monkeypatch.setattr(rl, "RLTrainer", Recorder)
    run_dir = tmp_path / "arms" / "bf16" / "seed_0"
    run_arm({"arm": "bf16", "seed": 0, "run_dir": str(run_dir), "sft_checkpoint": "ckpt", "redirect": False,
             "overrides": arm_overrides(["env=textworld_express"], "bf16", 0, run_dir, None)})
    assert seen == {"init_path": "ckpt", "out_key": "sweep.out_dir", "out_dir": str(run_dir)}


def test_an_arm_refused_at_its_start_leaves_no_arm_folder(tmp_path, monkeypatch):
    """An arm whose run was refused at its start (in the sweep's process, sweep.parallel=1) left
    arms/<arm>/seed_<s>/ holding only the run's lock file."""
    from agentq.config import ConfigError
    from agentq.trainer import rl
    from agentq.trainer.run_dir import claim_run_dir
    from agentq.trainer.sweep import arm_overrides, run_arm

    class Refused:
        def __init__(self, cfg, init_path=None, out_key="trainer.out_dir"):
            claim_run_dir(cfg.trainer.out_dir, resume=False, overwrite=False, kind="train", out_key=out_key).close()
            raise ConfigError("refused")

    monkeypatch.setattr(rl, "RLTrainer", Refused)
    (tmp_path / "arms").mkdir()
    run_dir = tmp_path / "arms" / "bf16" / "seed_0"
    with pytest.raises(ConfigError, match="^refused$"):
        run_arm({"arm": "bf16", "seed": 0, "run_dir": str(run_dir), "sft_checkpoint": "ckpt", "redirect": False,
                 "overrides": arm_overrides(["env=textworld_express"], "bf16", 0, run_dir, None)})
    assert _listing(tmp_path) == ["arms"]


def test_the_title_tells_the_two_textworld_express_configs_apart():
    """conf/sweep.yaml's mapreader sweep was titled "textworld_express/dev", as a coin sweep is (both
    configs are `name: textworld_express`); and a one-step budget read "1 RL steps"."""
    from agentq.config import load_config
    from agentq.trainer.sweep import sweep_title

    assert sweep_title(load_config(["trainer.steps=1"], config_name="sweep"), "dev", [0]) == \
        "textworld_express[mapreader]/dev, seeds [0], 1 RL step × 16 episodes, learner of aligned arms: w8a8"
    assert sweep_title(load_config(["env=textworld_express"], config_name="sweep"), "dev", [0, 1]) == \
        "textworld_express[coin]/dev, seeds [0, 1], 12 RL steps × 16 episodes, learner of aligned arms: w8a8"


def test_the_table_on_the_console_keeps_its_brackets(tmp_path, capsys):
    """rich read "[min, max]" in the K3 header as a markup tag and dropped it (table.md kept it)."""
    from agentq.trainer.sweep import write_table

    write_table(tmp_path, {"sft_success_rate": 0.25, "sft_episodes": 4, "arms": {}, "references": [], "seeds": [0]},
                title="t")
    assert "K3 mean [min, max]" in capsys.readouterr().err
    assert "K3 mean [min, max]" in (tmp_path / "table.md").read_text()


def test_a_misspelt_arm_is_refused_before_the_shared_sft(tmp_path, capsys):
    """`sweep.arms=[bf16,tis]` (the preset is flashrl_tis) failed only after the SFT stage, its
    evaluation and every arm before it had run."""
    assert main([*ARGS[:2], "sweep.arms=[bf16,tis]", f"sweep.out_dir={tmp_path / 's'}"]) == 2
    assert "Could not find 'algo/tis'" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_an_arms_refused_rl_setting_is_refused_before_the_shared_sft(tmp_path, capsys):
    """`rollout.top_k=5` (RL samples temperature-only) ran the SFT stage and its evaluation before the first
    arm's run refused it: only the presets' names were checked at the start. (An `algo.` key such as
    `algo.dual_clip=0.5` is refused earlier: the presets set it.)"""
    assert main([*ARGS[:2], "sweep.arms=[bf16,interq]", "rollout.top_k=5", f"sweep.out_dir={tmp_path / 's'}"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("agentq: sweep arm bf16: rollout.top_k=5") and "temperature-only" in err
    assert not (tmp_path / "s").exists()


def test_an_arm_whose_rollout_backend_does_not_import_is_refused_before_the_shared_sft(tmp_path, capsys):
    """An arm's preset naming a rollout.backend module that does not exist passed the pre-SFT check (it
    judged the objective only) and failed after the SFT stage, its evaluation and every earlier arm."""
    conf = tmp_path / "conf" / "algo"
    conf.mkdir(parents=True)
    (conf / "broken.yaml").write_text("# @package _global_\ndefaults:\n  - override /rollout: w8a8_kv8\n"
                                      "algo: {name: broken, learner_quant: aligned, objective: grpo, "
                                      "objective_params: {}, clip_eps: 0.2, dual_clip: 10.0, kl_coef: 0.001, "
                                      "loss_agg: token_mean}\nrollout:\n  backend: agentq_nonexistent_mod:Backend\n")
    assert main([*ARGS[:2], "sweep.arms=[bf16,broken]", f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
                 f"sweep.out_dir={tmp_path / 's'}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "agentq: sweep arm broken: rollout.backend='agentq_nonexistent_mod:Backend' does not import: "
        "ModuleNotFoundError: No module named 'agentq_nonexistent_mod'")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("arms, said", [
    ("[bf16,qat]", "warning: sweep.references ['interq'] are not among sweep.arms, so the table compares with "
                   "['bf16'] only"),
    ("[grpo,qat]", "warning: none of sweep.references=['bf16', 'interq'] is among sweep.arms=['grpo', 'qat']: the "
                   "table has no paired comparison columns"),
])
def test_references_that_are_not_arms_are_said(tmp_path, capsys, arms, said):
    """The table's paired columns compare with sweep.references among the arms; the others were dropped
    without a word (the table of arms [gspo, grpo] had no paired columns, its caption still explaining them)."""
    assert main([*ARGS[:2], f"sweep.arms={arms}", "sweep.table_only=true", f"sweep.out_dir={tmp_path / 's'}"]) == 2
    out = capsys.readouterr()
    assert said in " ".join((out.out + out.err).split())


def test_a_sweep_without_final_evaluations_is_refused_before_any_work(tmp_path, capsys):
    """trainer.eval_every=-1 ran the SFT stage, its evaluation and every arm, then failed on the table
    with a FileNotFoundError for the first arm's final eval.json, which no arm wrote."""
    out = tmp_path / "s"
    assert main([*ARGS[:2], "sweep.arms=[bf16,interq]", "sweep.seeds=[0]", "trainer.steps=2", "sweep.eval_tasks=10",
                 "trainer.eval_every=-1", f"sweep.out_dir={out}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "agentq: trainer.eval_every=-1: a sweep's table needs each arm's final held-out evaluation; set "
        "trainer.eval_every=0 (only the final one) or N > 0 (also every N steps)")
    assert not out.exists()


def test_table_only_names_a_finished_arm_without_its_final_evaluation(tmp_path, capsys):
    """A sweep folder whose finished arm has no final eval.json (run with trainer.eval_every=-1): the
    table was a FileNotFoundError traceback; now one line naming the arm and the missing file."""
    out = tmp_path / "s"
    first = ["env=textworld_express", "trainer.steps=2", "sweep.eval_tasks=4"]
    finished_arm(out, "bf16", 0, first, won=[True, False])
    finished_arm(out, "qat", 0, first, won=[True, True])
    (out / "arms" / "qat" / "seed_0" / "eval" / "step_000002" / "eval.json").unlink()
    for name in ("sft/sft_summary.json", "eval_sft/eval.json"):
        (out / name).parent.mkdir()
        (out / name).write_text(json.dumps({"success_rate": 0.5, "episodes": 2}))
    before = _listing(out)
    assert main(["sweep", *first, "sweep.arms=[bf16,qat]", "sweep.seeds=[0]", "sweep.table_only=true",
                 f"sweep.out_dir={out}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"agentq: sweep.out_dir='{out}': arm qat seed 0 finished without its final held-out evaluation (no "
        "arms/qat/seed_0/eval/step_000002/eval.json), which the table needs; delete arms/qat/seed_0/result.json "
        "and resume the sweep to run it again")
    assert _listing(out) == before


def finished_run(out, arm, seed, overrides):
    """A finished arm × seed as `run_arm` leaves it (config.yaml, result.json), without running it."""
    from omegaconf import OmegaConf

    from agentq.trainer.sweep import RESULT, arm_config, arm_overrides

    run_dir = out / "arms" / arm / f"seed_{seed}"
    run_dir.mkdir(parents=True)
    cfg = arm_config(arm_overrides([*overrides, f"sweep.out_dir={out}", "env.eval_split=dev"], arm, seed, run_dir, None))
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (run_dir / RESULT).write_text(json.dumps({"arm": arm, "seed": seed, "steps": int(cfg.trainer.steps)}))


def finished_arm(out, arm, seed, overrides, won):
    """`finished_run` with what the table reads: result.json's fields, the final evaluation (one
    episode per task, `won` its outcomes) and metrics.jsonl, as `run_arm` leaves them."""
    finished_run(out, arm, seed, overrides)
    run_dir = out / "arms" / arm / f"seed_{seed}"
    (run_dir / "result.json").write_text(json.dumps({
        "arm": arm, "seed": seed, "algo": arm, "objective": "grpo", "rollout_quant": "none", "rollout_backend": "torch",
        "learner_quant": "none", "steps": 2}))
    final = run_dir / "eval" / "step_000002"
    final.mkdir(parents=True)
    (final / "eval.json").write_text(json.dumps({"success_rate": sum(won) / len(won), "episodes": len(won)}))
    (final / "episodes.jsonl").write_text("".join(json.dumps({"task_id": f"t{i}", "won": w}) + "\n"
                                                  for i, w in enumerate(won)))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "reward_mean": 0.5, "k3": 0.0, "rollout_time_s": 1.0, "train_time_s": 2.0},
        {"step": 2, "reward_mean": 0.5, "k3": 0.0, "rollout_time_s": 1.0, "train_time_s": 2.0},
        {"step": 2, "eval/success_rate": sum(won) / len(won)}]))


def test_a_resume_that_changes_the_runs_settings_is_refused(tmp_path, capsys):
    """Finished runs are never rerun, so a resumed sweep with another budget put runs of 2 and 3 steps
    in one table titled "3 RL steps", silently. What does not change what a run computes (arms and
    seeds listed, parallel, where workers run) may differ."""
    from agentq.trainer.sweep import check_resumed_runs

    out = tmp_path / "s"
    first = ["env=textworld_express", "trainer.steps=2", "sweep.eval_tasks=4"]
    finished_run(out, "bf16", 0, first)
    assert main(["sweep", *first, "trainer.steps=3", "sweep.arms=[bf16,qat]", "sweep.seeds=[0]",
                 f"sweep.out_dir={out}"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert (f"sweep.out_dir='{out}' holds finished runs whose settings differ from this command line's "
            "(bf16/seed_0: trainer.steps: ran with 2, now 3); their table would mix the two") in said
    assert not (out / "sft").exists()                # refused before anything ran
    same = [*first, f"sweep.out_dir={out}", "env.eval_split=dev", "sweep.arms=[bf16,qat]", "sweep.parallel=2",
            "env_pool=ray", "seed=5"]
    check_resumed_runs(out, ["bf16", "qat"], [0], same, threads=1)


def test_algo_and_seed_on_the_command_line_are_refused_with_the_sweep_lists(tmp_path, capsys):
    """Every arm × seed run sets its own algo= and seed=: the command line's were dropped silently.
    (The sweep folder cannot be made: had they been taken, the sweep stops there, not after 9 runs.)"""
    (tmp_path / "a-file").write_text("x")
    out = tmp_path / "a-file" / "s"
    assert main(["sweep", "algo=flashrl_tis", "seed=3", "sweep.seeds=[0]", f"sweep.out_dir={out}"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert ("agentq: algo=flashrl_tis: a sweep runs each preset of sweep.arms (now ['bf16', 'flashrl_tis', 'qat', "
            "'qat_tis', 'qat_ais', 'ais', 'qurl', 'tbpo', 'interq']); write 'sweep.arms=[flashrl_tis]'; seed=3: a "
            "sweep runs each seed of sweep.seeds (now [0]); write 'sweep.seeds=[3]'") in said


def test_a_bad_aligned_learner_is_refused_before_the_shared_sft(tmp_path, capsys):
    """`sweep.aligned_learner=bogus` ran the SFT stage and its evaluation, then failed naming
    algo.learner_quant when the first aligned arm was composed."""
    out = tmp_path / "s"
    assert main(["sweep", "sweep.aligned_learner=bogus", "sweep.arms=[qat]", "sweep.seeds=[0]", f"sweep.out_dir={out}",
                 "device=cpu"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "  sweep.aligned_learner='bogus' (str): must be one of ['aligned', 'kv8', 'none', 'w8a8', 'w8a8_fp8kv', "
        "'w8a8_kv8', 'w8a8_kv8_head']")
    assert not out.exists()


@pytest.mark.parametrize("override", ["rollout.quant=w8a8", "rollout=w8a8_kv8"])
def test_rollout_quant_on_the_command_line_is_refused_naming_the_presets(tmp_path, capsys, override):
    """`rollout.quant=w8a8` (or the group, `rollout=w8a8_kv8`) set every arm's rollout: the bf16 baseline
    sampled from a quantized engine and the aligned arms' learner (sweep.aligned_learner) stayed
    w8a8_kv8's partial one."""
    out = tmp_path / "s"
    assert main(["sweep", override, "sweep.arms=[bf16,qat]", "sweep.seeds=[0]", f"sweep.out_dir={out}"]) == 2
    assert " ".join(capsys.readouterr().err.split()) == (
        f"agentq: {override}: each arm's preset sets its own rollout numerics (bf16: none, the others "
        "w8a8_kv8) and its learner's; drop it, or compare other numerics with a preset of your own in conf/algo/ "
        "named in sweep.arms")
    assert not out.exists()


def test_an_arms_error_cancels_the_jobs_not_yet_started(tmp_path):
    """With sweep.parallel=2, one failing arm used to let every queued arm run before the error
    reached the user (leaving the executor waits for its whole queue)."""
    from agentq.trainer.sweep import _run_jobs
    from agentq.utils.errors import RunAborted
    from sweep_jobs import run_marked

    jobs = [{"arm": arm, "seed": 0, "run_dir": str(tmp_path / f"j{i}")}
            for i, arm in enumerate(["fail", "slow", *"abcdefgh"])]
    with pytest.raises(RunAborted, match="sweep arm fail seed 0 failed: RuntimeError: arm fail broke"):
        _run_jobs(jobs, parallel=2, run=run_marked)
    started = sorted(p.name for p in tmp_path.glob("*.started"))
    # j1 was running and finished; nothing started after j0's error (the executor used to pre-load
    # queued jobs into its workers, where cancelling could not reach them: 3 more started)
    assert started == ["j0.started", "j1.started"], started


def test_parallel_jobs_all_run_when_none_fails(tmp_path):
    from agentq.trainer.sweep import _run_jobs
    from sweep_jobs import run_marked

    jobs = [{"arm": arm, "seed": 0, "run_dir": str(tmp_path / f"j{i}")} for i, arm in enumerate("abc")]
    _run_jobs(jobs, parallel=2, run=run_marked)
    assert sorted(p.name for p in tmp_path.glob("*.started")) == ["j0.started", "j1.started", "j2.started"]


def test_the_pooled_interval_counts_tasks_that_every_seed_plays_once(tmp_path):
    """Two seeds evaluated on the same three tasks, with the same outcome per task (a, b won, c
    lost): pooled, that is 4 of 6 episodes but only 3 tasks' worth of evidence (intra-task
    correlation 1, n_eff = 6 / (1 + (2 − 1)·1) = 3): the interval is Wilson's for 2 of 3, not 4 of 6."""
    from agentq.eval.metrics import wilson_interval
    from agentq.trainer.sweep import RESULT, sweep_table

    (tmp_path / "eval_sft").mkdir()
    (tmp_path / "eval_sft" / "eval.json").write_text(json.dumps({"success_rate": 0.5, "episodes": 6}))
    for seed in (0, 1):
        run = tmp_path / "arms" / "grpo" / f"seed_{seed}"
        (run / "eval" / "step_000001").mkdir(parents=True)
        (run / RESULT).write_text(json.dumps({"steps": 1, "rollout_quant": "none", "learner_quant": "none",
                                              "objective": "grpo"}))
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5, "eval/success_rate": 2 / 3}) + "\n")
        (run / "eval" / "step_000001" / "eval.json").write_text(json.dumps({"success_rate": 2 / 3, "episodes": 3}))
        (run / "eval" / "step_000001" / "episodes.jsonl").write_text("".join(
            json.dumps({"task_id": task, "won": won}) + "\n" for task, won in (("a", True), ("b", True), ("c", False))))
    row = sweep_table(tmp_path, ["grpo"], [0, 1], [])["arms"]["grpo"]
    assert (row["episodes"], row["success_rate"]) == (6, 4 / 6)
    assert row["success_ci95"] == pytest.approx(list(wilson_interval(2, 3)), abs=1e-12)
    assert row["success_ci95"][0] < wilson_interval(4, 6)[0]            # wider than the independent one


def _fake_sweep(out, outcomes, backends):
    """A sweep folder as `sweep_table` reads it, without training: per arm × seed a result.json (with
    `backends[arm]` as rollout_backend, or none and a config.yaml naming it, as an older run), a
    metrics.jsonl, and the final evaluation (step 2) with one episode per (task, won) in `outcomes`."""
    (out / "eval_sft").mkdir(parents=True)
    (out / "eval_sft" / "eval.json").write_text(json.dumps({"success_rate": 0.5, "episodes": 3}))
    for arm, by_seed in outcomes.items():
        for seed, played in by_seed.items():
            d = out / "arms" / arm / f"seed_{seed}"
            (d / "eval" / "step_000002").mkdir(parents=True)
            result = {"arm": arm, "seed": seed, "objective": "grpo", "rollout_quant": "w8a8_kv8", "learner_quant": "w8a8",
                      "steps": 2}
            backend, recorded = backends[arm]
            if recorded:
                result["rollout_backend"] = backend
            else:
                (d / "config.yaml").write_text(f"rollout:\n  backend: {backend}\n")
            (d / "result.json").write_text(json.dumps(result))
            success = sum(w for _, w in played) / len(played)
            (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.0, "rollout_time_s": 1.0,
                                                         "train_time_s": 2.0}) + "\n" +
                                             json.dumps({"step": 2, "eval/success_rate": success}) + "\n")
            ev = d / "eval" / "step_000002"
            (ev / "eval.json").write_text(json.dumps({"success_rate": success, "episodes": len(played)}))
            (ev / "episodes.jsonl").write_text("".join(json.dumps({"task_id": t, "won": w}) + "\n" for t, w in played))


def test_the_table_pairs_by_task_over_seeds_and_names_differing_backends(tmp_path):
    """The paired test took each (seed, task) as an independent pair; a task's episodes over the seeds
    are one unit now. The rollout backend of each arm is in table.json, and in table.md where arms differ."""
    from agentq.trainer.sweep import sweep_table, table_markdown

    outcomes = {"bf16": {0: [("a", False), ("b", False), ("c", True)], 1: [("a", False), ("b", True), ("c", True)]},
                "interq": {0: [("a", True), ("b", True), ("c", False)], 1: [("a", True), ("b", True), ("c", True)]}}
    _fake_sweep(tmp_path, outcomes, {"bf16": ("torch", True), "interq": ("vllm", False)})
    t = sweep_table(tmp_path, ["bf16", "interq"], [0, 1], ["bf16"])
    # success per task over the 2 seeds: bf16 a 0, b ½, c 1; interq a 1, b 1, c ½: d = +1, +½, −½, and
    # ±1 ±½ ±½ reaches |1| in 6 of 8 patterns (tests/eval/test_metrics.py). By (seed, task) it was
    # 3 / 1 of 6 pairs, McNemar p = 2·5/16 = 0.625.
    pr = t["arms"]["interq"]["paired"]["bf16"]
    assert (pr["pairs"], pr["episodes_before"], pr["episodes_after"]) == (3, 6, 6)
    assert (pr["won_only_after"], pr["won_only_before"], pr["mcnemar_p"]) == (2, 1, 0.75)
    assert pr["test"] == "exact sign-flip over tasks" and t["arms"]["bf16"]["paired"] == {}
    # the backend: result.json's, or an older run's config.yaml's
    assert (t["arms"]["bf16"]["rollout_backend"], t["arms"]["interq"]["rollout_backend"]) == ("torch", "vllm")
    md = table_markdown(t, "t")
    assert "| rollout (backend) / learner |" in md
    assert "| bf16 | w8a8_kv8 (torch) / w8a8 |" in md and "| interq | w8a8_kv8 (vllm) / w8a8 |" in md
    assert "p = two-sided, paired by task: exact sign-flip over tasks." in md
    assert "| interq | w8a8_kv8 (vllm) / w8a8 | 83.3 % (" in md and "| 2 / 1, 0.75 |" in md      # 5 of 6 won

    # an arm whose final evaluation shares no task with the reference's: no test, not "0 / 0, 1"
    t["arms"]["interq"]["paired"]["bf16"] = paired_comparison({"a": True}, {"z": True})
    md = table_markdown(t, "t")
    assert "| no shared tasks |" in md and "p = two-sided, paired by task. Times" in md and "McNemar" not in md

    same = tmp_path / "same"
    _fake_sweep(same, outcomes, {"bf16": ("torch", True), "interq": ("torch", False)})
    md = table_markdown(sweep_table(same, ["bf16", "interq"], [0, 1], ["bf16"]), "t")
    assert "| rollout / learner |" in md and "| interq | w8a8_kv8 / w8a8 |" in md and "(torch)" not in md


def test_table_md_says_when_its_k3_by_turn_cell_leaves_turns_out(tmp_path):
    """table.md shows the first 8 turns' K3; a 12-turn run's cell read as if the run had 8 turns."""
    from agentq.trainer.sweep import sweep_table, table_markdown

    outcomes = {"bf16": {0: [("a", True)]}, "interq": {0: [("a", False)]}}
    _fake_sweep(tmp_path, outcomes, {"bf16": ("torch", True), "interq": ("torch", True)})
    d = tmp_path / "arms" / "interq" / "seed_0"
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.0, "k3": 1e-5,
                                                 "k3_by_turn": [(j + 1) * 1e-6 for j in range(12)]}) + "\n" +
                                     json.dumps({"step": 2, "eval/success_rate": 0.0}) + "\n")
    t = sweep_table(tmp_path, ["bf16", "interq"], [0], [])
    assert t["arms"]["interq"]["k3_by_turn"] == pytest.approx([(j + 1) * 1e-6 for j in range(12)])
    md = table_markdown(t, "t")
    assert "| 1e-06, 2e-06, 3e-06, 4e-06, 5e-06, 6e-06, 7e-06, 8e-06, … (12 turns) |" in md
    bf16 = next(line for line in md.splitlines() if line.startswith("| bf16 |"))
    assert "…" not in bf16          # no turn logged: an empty cell, nothing left out
    # without a reference among the arms there are no paired columns, and the caption does not explain them
    assert "b / c" not in md and "b / c = held-out tasks" in table_markdown(sweep_table(tmp_path, ["bf16", "interq"],
                                                                                        [0], ["bf16"]), "t")


def test_a_damaged_result_json_is_one_line_naming_it(tmp_path):
    """A finished arm's result.json is written whole; damaged from outside, the sweep's start (which
    now reads every finished arm's) said so by a JSONDecodeError traceback."""
    from agentq.config import ConfigError
    from agentq.trainer.sweep import RESULT, check_final_evals

    run = tmp_path / "arms" / "bf16" / "seed_0"
    run.mkdir(parents=True)
    for text in ('{"steps": 2', '[]', '{"steps": "2"}'):
        (run / RESULT).write_text(text)
        with pytest.raises(ConfigError, match=rf"{RESULT} is damaged .*delete it and resume the sweep"):
            check_final_evals(tmp_path, ["bf16"], [0])


# ---------------------------------------------------------------------- refused before any work
#: a sweep small enough that a check missing would run it quickly (the brief's S)
SMALL = ["trainer.steps=2", "trainer.tasks_per_step=2", "trainer.group_size=2", "trainer.minibatch_size=4",
         "trainer.eval_every=0", "sweep.eval_tasks=6", "sft.num_demos=8", "sft.epochs=1", "env.max_steps=5"]


def _refused(tmp_path, capsys, *args: str) -> str:
    """The one-line error of `agentq sweep <args> <SMALL>` (exit status 2), which made no folder."""
    out = tmp_path / "s"
    assert main(["sweep", *SMALL, *args, f"sweep.out_dir={out}"]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1]


PRESET_SAID = ("the presets set it, so it would change every arm and the arms would no longer be the presets the "
               "table names; to change an arm, define a preset of your own in conf/algo/ and name it in sweep.arms")


@pytest.mark.parametrize("override", ["algo.objective=tis", "algo.learner_quant=aligned", "algo.loss_agg=token_mean",
                                      "algo.objective_params.budget_B=2.0", "algo.kl_coef=0"])
def test_a_key_the_presets_set_is_refused_naming_it(tmp_path, capsys, override):
    """`algo.objective=tis` ran every arm as TIS under the table's bf16 / qat rows; `algo.learner_quant=aligned`
    gave the bf16 arm a W8A8 learner: any `algo.` key is every preset's."""
    said = _refused(tmp_path, capsys, "sweep.arms=[bf16,interq]", "sweep.seeds=[0]", override)
    assert said == f"agentq: {override}: {PRESET_SAID}"


def test_every_refused_override_is_named_in_one_line(tmp_path, capsys):
    said = _refused(tmp_path, capsys, "sweep.arms=[bf16,qat]", "sweep.seeds=[0]", "algo.objective=tis",
                    "rollout.quant=w8a8")
    assert said.startswith(f"agentq: algo.objective=tis: {PRESET_SAID}; rollout.quant=w8a8: each arm's preset sets")


def test_shared_settings_the_presets_do_not_set_are_taken(tmp_path, capsys):
    """trainer.*, env.*, sft.*, sweep.* and rollout keys other than its quant are every arm's alike:
    not refused (table_only stops the sweep at its missing folder, after the checks)."""
    said = _refused(tmp_path, capsys, "sweep.arms=[bf16,qat]", "sweep.seeds=[0]", "rollout.temperature=0.5",
                    "trainer.lr=2e-5", "sft.lr=1e-4", "sweep.table_only=true")
    assert said.startswith("agentq: sweep.table_only=true: sweep.out_dir=")


@pytest.mark.parametrize("args, said", [
    (["sweep.arms=[qat,qat]", "sweep.seeds=[3]"], "sweep.arms=['qat', 'qat'] repeats arm qat: each arm × seed runs "
     "once into arms/<arm>/seed_<seed>, a repeat would run it again there and count its episodes twice in the table; "
     "list each arm once"),
    (["sweep.arms=[bf16,qat]", "sweep.seeds=[3,1,3]"], "sweep.seeds=[3, 1, 3] repeats seed 3: each arm × seed runs "
     "once into arms/<arm>/seed_<seed>, a repeat would run it again there and count its episodes twice in the table; "
     "list each seed once"),
])
def test_a_repeated_arm_or_seed_is_refused_before_any_work(tmp_path, capsys, args, said):
    """`sweep.arms=[qat,qat] sweep.seeds=[3,3]` ran qat seed 3 four times into one folder and the table
    counted its episodes twice."""
    assert _refused(tmp_path, capsys, *args) == f"agentq: {said}"


def test_a_repeated_arm_and_seed_are_both_named(tmp_path, capsys):
    said = _refused(tmp_path, capsys, "sweep.arms=[qat,qat]", "sweep.seeds=[3,3]")
    assert said.startswith("agentq: sweep.arms=['qat', 'qat'] repeats arm qat: ")
    assert "; sweep.seeds=[3, 3] repeats seed 3: " in said


@pytest.mark.parametrize("arg, said", [
    ("sweep.eval_tasks=0", "sweep.eval_tasks=0 (int): must be a positive integer"),
    ("sweep.parallel=0", "sweep.parallel=0 (int): must be a positive integer"),
    ("sweep.arms=bf16", "sweep.arms='bf16' (str): must be a list of algo presets in brackets, e.g. "
                        "'sweep.arms=[bf16]'"),
    ("sweep.seeds=3", "sweep.seeds=3 (int): must be a list of integers in brackets, e.g. 'sweep.seeds=[3]'"),
    ("sweep.references=bf16", "sweep.references='bf16' (str): must be a list of arms in brackets, e.g. "
                              "'sweep.references=[bf16]'"),
])
def test_sweep_settings_are_checked_at_start_up(tmp_path, capsys, arg, said):
    """`sweep.eval_tasks=0` evaluated 0 episodes, ran every arm, then failed in the table (None * int);
    `sweep.arms=bf16` ran the arms b, f, 1, 6 ("Could not find 'algo/b'")."""
    assert _refused(tmp_path, capsys, "sweep.seeds=[0]" if "seeds" not in arg else "sweep.arms=[bf16]", arg) == \
        f"  {said}"


# ---------------------------------------------------------------------- a parallel arm that fails
@pytest.mark.parametrize("parallel", [1, 2])
def test_a_parallel_arms_failure_names_it_and_says_how_to_resume(tmp_path, monkeypatch, capsys, parallel):
    """With sweep.parallel=2, a file where an arm's run folder goes (or any arm's error) ended the sweep
    with a raw traceback naming no arm, without the resume command a Ctrl-C stop gives. With
    sweep.parallel=1 (the default) it ended with the error's line alone: no arm, count or command."""
    import shlex

    from agentq.trainer import pipeline, sweep
    from sweep_jobs import run_folder_only

    out = tmp_path / "s"

    def shared_sft(cfg, out):               # the SFT stage, and a file where ais seed 2's folder goes
        (out / "sft").mkdir()
        (out / "sft" / "sft_summary.json").write_text("{}")
        (out / "arms" / "ais").mkdir(parents=True)
        (out / "arms" / "ais" / "seed_2").touch()

    monkeypatch.setattr(sweep, "_shared_sft", shared_sft)
    monkeypatch.setattr(pipeline, "evaluate_checkpoint", lambda *a: None)
    monkeypatch.setattr(sweep, "run_arm", run_folder_only)
    args = ["sweep", "env=textworld_express", *SMALL, "sweep.arms=[bf16,ais]", "sweep.seeds=[2]",
            f"sweep.parallel={parallel}"]
    assert main([*args, f"sweep.out_dir={out}"]) == 1
    said = capsys.readouterr().err.strip().splitlines()[-1]
    again = shlex.join(["agentq", *args, f"sweep.out_dir={out}"])
    assert said.startswith("agentq: run stopped: sweep arm ais seed 2 failed: NotADirectoryError: ")
    assert said.endswith(f"; sweep folder {out}: 1 of 2 arm × seed runs finished; resume it with {again} (finished "
                         "runs are kept, an unfinished one starts over)")
    assert (out / "arms" / "bf16" / "seed_2" / "result.json").exists()          # the other arm's result kept


def test_a_dead_worker_names_its_arms(tmp_path):
    """A worker process that died (BrokenProcessPool) was a raw traceback naming no arm; the pool's other
    running job fails with it, and is named too."""
    from agentq.trainer.sweep import _run_jobs
    from agentq.utils.errors import RunAborted
    from sweep_jobs import run_dying

    jobs = [{"arm": arm, "seed": 0, "run_dir": str(tmp_path / f"j{i}")} for i, arm in enumerate(["die", "b", "c"])]
    # "die" dies only once b runs beside it. The pool may take seconds to notice the death on a loaded
    # machine (CI: over b's 3 s): b has then finished, and c, handed to the broken pool, never starts
    jobs[0]["wait_for"] = str(tmp_path / "j1.started")
    with pytest.raises(RunAborted) as stop:
        _run_jobs(jobs, parallel=2, run=run_dying)
    # the arms that did not finish are named: b beside it, or c handed to the broken pool (or die alone)
    assert str(stop.value) in [f"sweep arm{s} stopped: a worker process died (BrokenProcessPool: killed, e.g. for "
                               "memory), which ends every arm running in the pool"
                               for s in ("s die seed 0, b seed 0", "s die seed 0, c seed 0", " die seed 0")]
    assert "c seed 0" not in str(stop.value) or (tmp_path / "j1.done").exists()   # c only once b finished
    assert not (tmp_path / "j2.started").exists()        # nothing started after it


# ---------------------------------------------------------------------- step 0 under each arm's numerics
def test_each_arms_curve_starts_from_the_sft_evaluation_under_its_own_rollout_numerics(tmp_path, monkeypatch, capsys):
    """Step 0 of every curve was eval_sft/, made under the sweep's base rollout (w8a8_kv8), so the bf16
    arm's curve and AULC mixed numerics. Now the SFT checkpoint is evaluated once per distinct rollout
    numerics among the arms (the arm's composed config): bf16 starts from eval_sft_bf16/ (rollout quant
    none), interq and qat share eval_sft/; a resume redoes none; an old folder without eval_sft_bf16/
    falls back to eval_sft/ and says so; table_only without the sweep's overrides keeps its title."""
    from agentq.trainer import pipeline, sweep
    from sweep_jobs import run_finished

    out, calls = tmp_path / "s", []

    def shared_sft(cfg, out):
        (out / "sft").mkdir(exist_ok=True)
        (out / "sft" / "sft_summary.json").write_text("{}")

    def evaluate_checkpoint(cfg, checkpoint, folder, num_tasks, split):
        calls.append((str(cfg.rollout.quant), folder.name, int(cfg.seed), num_tasks, split))
        folder.mkdir()
        success = {"none": 0.75, "w8a8_kv8": 0.25}[str(cfg.rollout.quant)]
        (folder / "eval.json").write_text(json.dumps({"success_rate": success, "episodes": 4,
                                                      "rollout_quant": str(cfg.rollout.quant)}))

    monkeypatch.setattr(sweep, "_shared_sft", shared_sft)
    monkeypatch.setattr(pipeline, "evaluate_checkpoint", evaluate_checkpoint)
    monkeypatch.setattr(sweep, "run_arm", run_finished)
    picked = ["sweep.arms=[bf16,interq,qat]", "sweep.seeds=[3]"]
    args = ["sweep", "env=textworld_express", *SMALL, "sweep.eval_tasks=4", *picked, f"sweep.out_dir={out}"]
    assert main(args) == 0
    seed = calls[0][2]                     # the sweep's seed, not the arm's: only the numerics differ
    assert seed != 3
    assert calls == [("w8a8_kv8", "eval_sft", seed, 4, "dev"), ("none", "eval_sft_bf16", seed, 4, "dev")]
    t = json.loads((out / "table.json").read_text())
    assert (t["sft_success_rate"], t["sft_eval"], t["sft_rollout_quant"]) == (0.25, "eval_sft", "w8a8_kv8")
    for arm, folder, success in (("bf16", "eval_sft_bf16", 0.75), ("interq", "eval_sft", 0.25),
                                 ("qat", "eval_sft", 0.25)):
        r = t["arms"][arm]
        assert r["sft_eval"] == {"folder": folder, "rollout_quant": r["rollout_quant"], "success_rate": success,
                                 "episodes": 4, "own_numerics": True}
        assert r["curves"]["3"] == {"steps": [0, 1, 2], "success": [success, 0.25, 0.5]}
        assert r["aulc"] == aulc([0, 1, 2], [success, 0.25, 0.5])
    md = (out / "table.md").read_text()
    title = "textworld_express[coin]/dev, seeds [3], 2 RL steps × 4 episodes, learner of aligned arms: w8a8"
    assert md.startswith(f"**{title}.** After SFT: 25.0 % of 4 held-out episodes (w8a8_kv8 rollouts, eval_sft/). "
                         "Under bf16 rollouts (eval_sft_bf16/, step 0 of bf16): 75.0 % of 4. ")

    calls.clear()                          # a resume: both SFT evaluations are there, none is redone
    assert main(args) == 0 and calls == []
    # table_only without the sweep's overrides (another env, budget): the runs' own title
    (out / "table.md").unlink()
    assert main(["sweep", *picked, "sweep.table_only=true", f"sweep.out_dir={out}"]) == 0
    assert (out / "table.md").read_text() == md and calls == []

    # a sweep folder from before: eval_sft/ alone; bf16 falls back to it, saying so
    import shutil
    shutil.rmtree(out / "eval_sft_bf16")
    capsys.readouterr()
    assert main(["sweep", *picked, "sweep.table_only=true", f"sweep.out_dir={out}"]) == 0 and calls == []
    bf16 = json.loads((out / "table.json").read_text())["arms"]["bf16"]
    assert bf16["sft_eval"] == {"folder": "eval_sft", "rollout_quant": "w8a8_kv8", "success_rate": 0.25,
                                "episodes": 4, "own_numerics": False}
    assert bf16["curves"]["3"]["success"][0] == 0.25
    said = ("Step 0 of bf16 is eval_sft/'s, not under its own rollout numerics: this sweep folder has no SFT "
            "evaluation under them (made before there was one per numerics; resuming the sweep adds it).")
    assert said in (out / "table.md").read_text() and "eval_sft_bf16" not in (out / "table.md").read_text()
    assert said in " ".join(capsys.readouterr().err.split())


def test_step0_of_an_evaluation_that_records_no_numerics_is_not_called_the_arms_own(tmp_path):
    """An eval.json without rollout_quant (written before it was recorded): which numerics it ran under
    is not known, so no arm's step 0 is said to be under its own."""
    from agentq.trainer.sweep import BASE_SFT_EVAL, step0_eval

    (tmp_path / BASE_SFT_EVAL).mkdir()
    (tmp_path / BASE_SFT_EVAL / "eval.json").write_text(json.dumps({"success_rate": 0.5, "episodes": 4}))
    for quant in ("none", "w8a8_kv8"):
        assert step0_eval(tmp_path, quant) == {"folder": BASE_SFT_EVAL, "rollout_quant": None, "success_rate": 0.5,
                                               "episodes": 4, "own_numerics": False}
