"""`agentq sft`'s output folder is guarded as an RL run folder is (one process at a time, an earlier
run refused unless trainer.overwrite=true), and a validation share that leaves nothing to train on
is a clear error, not a division by zero."""
import json

import pytest

from agentq.cli import main
from agentq.trainer.run_dir import RunDirError, claim_run_dir
from conftest import one_task_env

SMALL = ["sft.num_demos=2", "sft.epochs=1", "sft.batch_size=2", "env_pool=inline"]


def metrics_steps(folder):
    return [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_sft_folder_is_locked_and_not_mixed_with_an_earlier_run(tmp_path, capsys):
    out = tmp_path / "sft"
    assert main(["sft", f"sft.out_dir={out}", *SMALL]) == 0
    first = (out / "metrics.jsonl").read_text()
    assert metrics_steps(out) == [0, 1, 1]          # val loss before, the one step, the epoch row
    assert main(["sft", f"sft.out_dir={out}", *SMALL]) == 2
    assert "(sft.out_dir) already holds a run (metrics.jsonl, tb, checkpoint, sft_summary.json)" in \
        " ".join(capsys.readouterr().err.split())
    assert (out / "metrics.jsonl").read_text() == first
    from agentq.config import load_config
    from agentq.trainer.sft import sft

    lock = claim_run_dir(out, resume=True, overwrite=False, kind="sft")      # another process's run
    try:
        with pytest.raises(RunDirError, match="in use by another agentq process"):
            sft(load_config([f"sft.out_dir={out}", "trainer.overwrite=true", *SMALL]))
    finally:
        lock.close()
    assert main(["sft", f"sft.out_dir={out}", "trainer.overwrite=true", *SMALL]) == 0
    assert metrics_steps(out) == [0, 1, 1]          # the new run's rows only


def test_sft_records_its_config_as_an_rl_run_does(tmp_path):
    """An RL run writes its resolved config.yaml; an SFT checkpoint's settings were recorded nowhere."""
    from omegaconf import OmegaConf

    out = tmp_path / "sft"
    assert main(["sft", f"sft.out_dir={out}", "env.max_steps=9", *SMALL]) == 0
    saved = OmegaConf.load(out / "config.yaml")
    assert (saved.sft.num_demos, saved.env.max_steps, saved.sft.out_dir) == (2, 9, str(out))


def test_a_validation_share_that_leaves_no_training_demo_is_named(tmp_path, capsys):
    # 2 demos at 0.9: round(1.8) = 2 held out, none to train on
    assert main(["sft", f"sft.out_dir={tmp_path / 'sft'}", "sft.val_fraction=0.9", *SMALL]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "sft.val_fraction=0.9 leaves no demonstration to train on (2 usable, 2 held out for validation)" in said
    assert not (tmp_path / "sft" / "checkpoint").exists()


def _demo_file(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_demos_from_another_tokenizer_are_refused(tmp_path, tokenizer, tiny_model_dir, capsys):
    """sft.demos holds token ids: under another tokenizer they mean other text, so they are refused."""
    from agentq.config import ConfigError
    from agentq.trainer.sft import check_demo_tokens

    ids = tokenizer.encode("<action>take coin</action>", add_special_tokens=False)
    good = {"task_id": "coin/1", "input_ids": ids, "action_mask": [1] * len(ids), "text": tokenizer.decode(ids)}
    check_demo_tokens(_demo_file(tmp_path / "ok.jsonl", [good, good]), tokenizer)
    other = {**good, "input_ids": [i + 7 for i in ids]}            # the same text under another vocabulary
    bad = [("other.jsonl", [good, other], "record 2: its input_ids decode to other text"),
           ("noids.jsonl", [{**good, "input_ids": []}], "record 1 has no input_ids"),
           ("notext.jsonl", [{k: v for k, v in good.items() if k != "text"}], "record 1 has no text")]
    for name, records, said in bad:
        with pytest.raises(ConfigError, match=f"sft.demos='[^']*{name}': {said}"):
            check_demo_tokens(_demo_file(tmp_path / name, records), tokenizer)
    out = tmp_path / "sft"
    assert main(["sft", f"sft.out_dir={out}", f"sft.demos={tmp_path / 'other.jsonl'}", f"model.path={tiny_model_dir}",
                 *SMALL]) == 2
    assert "record 2: its input_ids decode to other text" in capsys.readouterr().err
    assert not (out / "checkpoint").exists()


def test_sft_logs_to_the_sinks_the_logger_setting_names(tmp_path):
    """`logger` decides SFT's sinks as it does the RL trainer's (metrics.jsonl always)."""
    out = tmp_path / "sft"
    assert main(["sft", f"sft.out_dir={out}", "logger=[jsonl]", *SMALL]) == 0
    assert metrics_steps(out) == [0, 1, 1] and not (out / "tb").exists()
    assert main(["sft", f"sft.out_dir={out}", "logger=[tensorboard]", "trainer.overwrite=true", *SMALL]) == 0
    assert list((out / "tb").glob("events.out.tfevents.*"))


def test_sft_says_where_its_checkpoint_went(tmp_path, monkeypatch, capsys):
    """An unnamed SFT folder is runs/sft-<env>-<time>: the command now names the checkpoint that
    `agentq train model.path=` takes (it printed only the losses)."""
    monkeypatch.chdir(tmp_path)
    assert main(["sft", *SMALL]) == 0
    (out,) = (tmp_path / "runs").glob("sft-textworld_express-*")
    ckpt = out.relative_to(tmp_path) / "checkpoint"
    assert f"; checkpoint {ckpt} (RL from it: agentq train model.path={ckpt})" in " ".join(capsys.readouterr().err.split())


def test_the_rl_command_sft_prints_trains_on_its_env(tmp_path, monkeypatch, capsys):
    """`agentq sft env=<a plugin's env> hydra.searchpath=[...]` ended with "RL from it: agentq train
    model.path=<ckpt>", which, run as printed, trained on the default env (TextWorldExpress) without a
    word. The command now repeats the SFT command line's env settings, quoted for a shell, and they
    compose the env the checkpoint was fitted to."""
    import shlex

    from omegaconf import OmegaConf

    from agentq.config import load_config

    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "my conf"            # a space: the searchpath override must be quoted
    (conf / "env").mkdir(parents=True)
    env = {**OmegaConf.to_container(load_config(["env=textworld_express_mapreader"]).env), "max_steps": 7}
    (conf / "env" / "mine.yaml").write_text(OmegaConf.to_yaml(env))
    mine = ["env=mine", f"hydra.searchpath=[file://{conf}]", "env.name=textworld_express"]
    assert main(["sft", *mine, "sft.out_dir=out", "seed=3", *SMALL]) == 0
    said = " ".join(capsys.readouterr().err.split())
    cmd = said.split("(RL from it: ", 1)[1].rsplit(")", 1)[0]
    assert cmd == f"agentq train model.path=out/checkpoint env=mine '{mine[1]}' env.name=textworld_express"
    args = shlex.split(cmd)
    assert args[:3] == ["agentq", "train", "model.path=out/checkpoint"] and args[3:] == mine
    assert OmegaConf.to_container(load_config(args[3:], command="train").env) == env


def test_the_rl_command_keeps_every_env_and_agent_setting():
    """Splits, prompts, limits and the action format shape what SFT fitted as much as the env class:
    every env.* / agent.* override (added, forced or removed) goes into the hint; the rest do not."""
    from agentq.trainer.sft import rl_command
    given = ["env=alfworld", "env.train_split=gen_train", "+env.kwargs.x=1", "~env.kwargs.y", "++env.max_steps=30",
             "agent.action_tag=act", "env.prompt.system=be brief", "trainer.lr=1e-5", "sft.epochs=2", "seed=3",
             "environment=x"]
    assert rl_command("ck", given) == ("agentq train model.path=ck env=alfworld env.train_split=gen_train "
                                       "+env.kwargs.x=1 '~env.kwargs.y' ++env.max_steps=30 agent.action_tag=act "
                                       "'env.prompt.system=be brief'")


class _AfterSFT(Exception):
    """Stops a pipeline or a sweep at its first evaluation, once its SFT stage is done."""


@pytest.mark.parametrize("cmd, out_key, args", [("pipeline", "pipeline.out_dir", ["pipeline.eval_splits=[dev]"]),
                                                ("sweep", "sweep.out_dir", ["sweep.arms=[bf16]", "sweep.seeds=[0]"])])
def test_the_sft_stage_of_a_pipeline_or_sweep_prints_no_rl_command(tmp_path, monkeypatch, capsys, cmd, out_key, args):
    """`agentq pipeline` and `agentq sweep` RL from their SFT checkpoint themselves: their SFT stage
    ended with "RL from it: agentq train model.path=<ckpt>", a command to run by hand that had none of
    the env settings of their command line (they passed SFT none) nor the pipeline's own settings. The
    stage's closing line names the checkpoint alone; `agentq sft` keeps its hint (the tests above)."""
    from agentq.trainer import pipeline

    def after_sft(*args, **kwargs):
        raise _AfterSFT

    monkeypatch.setattr(pipeline, "evaluate_checkpoint", after_sft)       # the sweep's SFT evaluation too
    out = tmp_path / "out"
    with pytest.raises(_AfterSFT):
        main([cmd, f"{out_key}={out}", "env=textworld_express", *args, *SMALL])
    said = " ".join(capsys.readouterr().err.split())
    assert (out / "sft" / "checkpoint" / "config.json").exists()
    assert f"; checkpoint {out / 'sft' / 'checkpoint'}" in said and "RL from it" not in said, said[-2000:]


def test_a_step_cap_below_the_experts_path_is_named(tmp_path, capsys):
    """mapreader's expert needs 4-6 turns: at env.max_steps=2 no demonstration is won. That was a
    traceback saying "check the env's expert"."""
    assert main(["sft", "env=textworld_express_mapreader", "env.max_steps=2", f"sft.out_dir={tmp_path / 'sft'}",
                 *SMALL]) == 1
    said = " ".join(capsys.readouterr().err.split())
    assert ("agentq: run stopped: no usable expert demonstrations: none of 2 expert episodes won within "
            "env.max_steps=2 turns") in said and "Traceback" not in said


NO_EXPERT = """
from agentq.envs import TaskStep, TextEnv
""" + one_task_env("NoExpert", ("train", "test"))


@pytest.mark.parametrize("cmd", ["sft", "pipeline"])
def test_an_env_without_an_expert_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys, cmd):
    """Without `_expert_action` every demonstration stopped at its first turn with a traceback saying
    "no expert action ...: make the env with expert=True", though SFT had made it so (the pipeline
    after building the tiny model). Now one line at start-up, and no run folder."""
    from omegaconf import OmegaConf

    from agentq.config import load_config

    (tmp_path / "no_expert_env.py").write_text(NO_EXPERT)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "conf" / "env").mkdir(parents=True)
    base = OmegaConf.to_container(load_config([]).env)
    (tmp_path / "conf" / "env" / "noexp.yaml").write_text(OmegaConf.to_yaml(
        {**base, "name": "no_expert_env:NoExpert", "kwargs": {}, "train_split": "train", "eval_split": "test"}))
    out = tmp_path / "out"
    where = ["sft.out_dir", *SMALL] if cmd == "sft" else ["pipeline.out_dir", "pipeline.eval_splits=null"]
    assert main([cmd, "env=noexp", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"{where[0]}={out}",
                 *where[1:]]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert said.endswith("agentq: env.name='no_expert_env:NoExpert': NoExpert has no expert (it does not implement "
                    "`_expert_action`), and SFT trains on expert demonstrations; implement it "
                    "(docs/adding-an-environment.md), or give sft.demos=<a demos.jsonl> (its format: "
                    "docs/adding-an-environment.md#demonstrations-without-an-expert-sftdemos)")
    assert not out.exists()


def test_the_demos_format_the_error_points_to_is_documented(tmp_path):
    """sft.demos=<a demos.jsonl> was the way out of an env without an expert, with its format nowhere:
    the section the error names lists every field a demos.jsonl record holds, and its example lines
    have them all and read back as demonstrations."""
    import re
    from pathlib import Path

    from agentq.agent.trajectory import Trajectory
    from agentq.eval.episodes import demo_record, read_trajectories

    doc = (Path(__file__).resolve().parents[2] / "docs" / "adding-an-environment.md").read_text()
    section = doc.split("\n## Demonstrations without an expert: `sft.demos`\n", 1)[1].split("\n## ", 1)[0]
    fields = demo_record(type("Tok", (), {"decode": staticmethod(lambda ids: "")}))(Trajectory(0, "t", "train"))
    for field in fields:
        assert f"`{field}`" in section, field
    (example,) = re.findall(r"```json\n(.*?)```", section, re.S)
    assert [set(json.loads(line)) for line in example.strip().splitlines()] == [set(fields)] * 2
    (tmp_path / "demos.jsonl").write_text(example)
    demos = read_trajectories(tmp_path / "demos.jsonl")
    assert all(t.won and len(t.action_mask) == len(t.seg_id) == len(t.input_ids) for t in demos)


def test_demonstrations_lost_to_errors_are_said_left_out_and_kept_in_demos_jsonl(tmp_path, capsys):
    """An expert episode whose env raised was kept (and, with sft.only_successful=false, trained on)
    without a word, and demos.jsonl dropped its error. Now it is warned about and left out, its error
    is in demos.jsonl, and SFT with every demonstration lost says so."""
    from agentq.agent.trajectory import Trajectory
    from agentq.config import load_config
    from agentq.eval.episodes import demo_record, read_trajectories, write_trajectories
    from agentq.trainer.run_dir import RunAborted
    from agentq.trainer.sft import usable_demos

    def demo(i, end, error=None):
        t = Trajectory(i, f"t{i}", "train")
        t.won, t.end_reason, t.error = end == "won", end, error
        return t

    demos = [demo(0, "won"), demo(1, "error", "ValueError: boom\nTraceback ..."), demo(2, "failed"),
             demo(3, "error", "EnvCrashedError: gone")]
    write_trajectories(tmp_path / "demos.jsonl", demos, demo_record(type("Tok", (), {"decode": lambda s, ids: ""})()))
    assert [t.error for t in read_trajectories(tmp_path / "demos.jsonl")] == [None, "ValueError: boom\nTraceback ...",
                                                                             None, "EnvCrashedError: gone"]
    capsys.readouterr()
    assert [t.task_id for t in usable_demos(load_config([]), demos)] == ["t0"]
    assert [t.task_id for t in usable_demos(load_config(["sft.only_successful=false"]), demos)] == ["t0", "t2"]
    said = " ".join(capsys.readouterr().err.split())
    assert ("warning: 2 of 4 expert episodes were lost to errors and are left out (each error under \"error\" in "
            "demos.jsonl); the first, task 't1': ValueError: boom") in said
    # the one that played out without winning is said too, where only the won are kept (it was silent)
    assert said.count("did not win") == 1 and ("warning: 1 of 4 expert episodes did not win (end reasons: failed 1) "
                                               "and are left out (sft.only_successful); SFT trains on 1") in said
    capped = [demo(4, "won"), demo(5, "step_cap"), demo(6, "step_cap"), demo(7, "context")]
    usable_demos(load_config(["env.max_steps=10"]), capped)
    assert ("warning: 3 of 4 expert episodes did not win (end reasons: step_cap 2, context 1) and are left out "
            "(sft.only_successful); SFT trains on 1; raise env.max_steps=10 if the expert needs more turns") in \
        " ".join(capsys.readouterr().err.split())
    with pytest.raises(RunAborted) as e:
        usable_demos(load_config([]), [demos[1], demos[3]])
    assert str(e.value) == ("no usable expert demonstrations: all 2 expert episodes were lost to errors "
                            "(the warning above)")


def test_sft_summary_json_is_replaced_whole(tmp_path, capsys, disk_full_at):
    """sft_summary.json was written in place: a full disk left half of it. Now no half file is left, and
    the OSError is one line."""
    out = tmp_path / "sft"
    cut = disk_full_at("sft_summary.json")
    assert main(["sft", f"sft.out_dir={out}", *SMALL]) == 2
    assert cut and capsys.readouterr().err.strip().splitlines()[-1] == "agentq: No space left on device"
    assert not list(out.glob("*sft_summary.json*"))


def test_a_logger_whose_package_is_missing_is_one_line_before_the_sft_folder(tmp_path, monkeypatch, capsys):
    """`agentq sft logger=[...,wandb]` without wandb: one line, no folder (as `agentq train`); it was a
    traceback once the sinks were built, after the demonstrations and the model."""
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)      # `import wandb` fails
    out = tmp_path / "sft"
    assert main(["sft", f"sft.out_dir={out}", "logger=[jsonl,wandb]", *SMALL]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1].startswith("agentq: logger includes 'wandb' but wandb")
    assert not out.exists()


def test_a_logs_last_sft_progress_line_shows_the_epochs_validation_loss(tmp_path, capsys):
    """Where the output is no terminal, the bar's last plain line (at 100 %) came before the epoch's
    validation pass and showed the loss measured before training (6.497 against the epoch's 4.964 in a
    review's log). Each epoch's last batch now measures it first."""
    out = tmp_path / "sft"
    assert main(["sft", f"sft.out_dir={out}", "sft.num_demos=4", "sft.epochs=2", "sft.batch_size=2",
                 "env_pool=inline"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith("SFT ") and line.endswith(" elapsed")]       # the plain lines, not rich's bar
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    epochs = [r["sft/val_loss"] for r in rows if "sft/epoch" in r]
    assert len(epochs) == 2 and lines, lines
    assert lines[-1].split(" val ")[1].split(",")[0] == f"{epochs[-1]:.3f}", (lines, epochs)
