"""`agentq train` (2 steps) and `agentq eval` end to end on TextWorldExpress, as a user runs them."""
import json

import pytest

from agentq.cli import main
from conftest import run_cli, stop_rl_at_step, train_run

SMALL = ["env=textworld_express", "env.max_steps=3", "env.max_new_tokens=12", "trainer.tasks_per_step=2",
         "trainer.group_size=2", "trainer.eval_num_tasks=2", "env_pool.num_workers=1"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return train_run(tmp_path_factory, [*SMALL, "trainer.steps=2"])


def test_train_writes_the_run_folder(run_dir):
    assert (run_dir / "config.yaml").exists()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for key in ("reward_mean", "success_rate", "turns_mean", "loss", "kl", "tokens_per_s", "step_time_s",
                "k3", "k3_by_turn", "dlogp_abs_max", "int8_codes_changed", "kv_bytes_per_token", "alpha_median"):
        assert key in steps[-1], key
    assert steps[-1]["episodes"] == 4 and steps[-1]["turns_mean"] <= 3
    assert steps[-1]["dlogp_abs_max"] < 1e-4          # aligned learner vs W8A8-KV8 engine
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    ckpt = run_dir / "checkpoints" / "step_000002"
    assert (ckpt / "model.safetensors").exists() and (ckpt / "tokenizer.json").exists()
    assert (run_dir / "eval" / "step_000002" / "eval.json").exists()
    # transformers' own bars ("Loading weights", "Writing model shards" at each save) are off
    said = (run_dir.parent / "train.stderr").read_text()
    assert "Writing model shards" not in said and "Loading weights" not in said


def test_eval_on_held_out_split(run_dir, tmp_path):
    ckpt = run_dir / "checkpoints" / "step_000002"
    p = run_cli(["eval", f"checkpoint={ckpt}", *SMALL, "split=test", "eval.num_tasks=3", f"eval.out_dir={tmp_path}"])
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads((tmp_path / "eval.json").read_text())
    assert rep["split"] == "test" and rep["episodes"] == 3
    for key in ("success_rate", "score_mean", "turns_success_mean", "cap_rate"):
        assert key in rep
    eps = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    # 3 of the test split's tasks, a seeded sample (TWX "coin" has one task type), as the report says
    sel = rep["task_selection"]
    assert sel["method"] == "stratified" and sel["num_tasks"] == 3 and sel["per_type"]["coin"][0] == 3
    assert len({e["task_id"] for e in eps}) == 3 and all(e["task_id"].startswith("coin/") for e in eps)


def test_cli_errors_list_choices():
    p = run_cli(["train", "trainer.stepz=2"])
    assert p.returncode == 2 and "valid keys under trainer" in p.stderr
    p = run_cli(["fly"])
    assert p.returncode == 2 and "valid: ['pipeline', 'train', 'eval', 'sft'" in p.stderr


def test_version_prints_the_installed_version(capsys, monkeypatch):
    """`agentq --version` was "unknown command '--version'"."""
    from importlib.metadata import PackageNotFoundError, version

    from agentq import cli

    for arg in ("--version", "-V"):
        assert cli.main([arg]) == 0
        assert capsys.readouterr().out == f"agentq {version('agentq')}\n"

    def not_installed(name):
        raise PackageNotFoundError(name)
    monkeypatch.setattr("importlib.metadata.version", not_installed)
    monkeypatch.setattr("agentq.__version__", "9.9", raising=False)
    assert cli.main(["--version"]) == 0 and capsys.readouterr().out == "agentq 9.9\n"


def test_command_help_is_not_parsed_as_an_override():
    p = run_cli(["pipeline", "--help"])
    assert p.returncode == 0 and "agentq pipeline" in p.stdout and "section.key=value" in p.stdout


def test_each_command_has_its_own_help():
    from agentq.cli import HELP, main

    said = {}
    for cmd in HELP:
        p = run_cli([cmd, "--help"], timeout=120)
        assert p.returncode == 0 and p.stdout.startswith(f"agentq {cmd} [section.key=value ...]: "), p.stdout[:200]
        said[cmd] = p.stdout.splitlines()[0]
    assert len(set(said.values())) == len(HELP)       # every command printed the same text before
    assert "checkpoint=" in said["eval"] and "split=" in said["eval"]
    assert main(["config", "-h"]) == 0


def test_a_closed_pipe_is_no_traceback():
    """`agentq config | head`: the reader leaves before the config is written."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    p = subprocess.Popen([sys.executable, "-m", "agentq.cli", "config"], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env={**os.environ})
    p.stdout.close()                    # what `head` does once it has its lines
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 1 and "Traceback" not in err and "BrokenPipeError" not in err, err



def test_config_prints_the_root_a_pipeline_or_sweep_starts_from(capsys):
    """`agentq config` showed conf/config.yaml alone (trainer.steps 20, pipeline.eval_tasks 100), not
    what `agentq pipeline` (32, 200) or `agentq sweep` (12; its sweep.* keys unknown) run with."""
    import yaml

    from agentq.cli import main

    def printed(args):
        assert main(["config", *args]) == 0
        return yaml.safe_load(capsys.readouterr().out)

    plain, pipe = printed([]), printed(["pipeline", "pipeline.eval_tasks=50"])
    assert (plain["trainer"]["steps"], plain["pipeline"]["eval_tasks"]) == (20, 100) and "sweep" not in plain
    assert (pipe["trainer"]["steps"], pipe["pipeline"]["eval_tasks"]) == (32, 50)
    sweep = printed(["sweep", "sweep.parallel=2"])
    assert (sweep["trainer"]["steps"], sweep["sweep"]["parallel"], sweep["sweep"]["eval_tasks"]) == (12, 2, 100)


def test_config_with_resume_prints_what_a_resume_would_run(tmp_path, capsys):
    """`agentq config trainer.resume=<run>` printed the defaults (trainer.steps 20, model.path null),
    not the run's own config.yaml that `agentq train trainer.resume=<run>` continues with."""
    import yaml
    from omegaconf import OmegaConf

    from agentq.cli import main
    from agentq.config import load_config

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "config.yaml").write_text(OmegaConf.to_yaml(load_config(["trainer.steps=4", "trainer.tasks_per_step=2",
                                                                    "trainer.lr=3e-5"]), resolve=True))
    assert main(["config", f"trainer.resume={run}", "trainer.lr=2e-5"]) == 0
    t = yaml.safe_load(capsys.readouterr().out)["trainer"]
    assert (t["steps"], t["tasks_per_step"], t["lr"], t["resume"]) == (4, 2, 2e-5, str(run))
    assert main(["config", f"trainer.resume={tmp_path / 'nope'}"]) == 2          # as `agentq train` says
    assert "no such run folder" in capsys.readouterr().err


# each command's run, short, had the key not been refused (in tmp_path: the test's working directory)
SHORT = ["env_pool=inline", "env.max_steps=2", "env.max_new_tokens=8"]
RL = ["trainer.steps=1", "trainer.tasks_per_step=1", "trainer.group_size=2", "trainer.eval_num_tasks=1"]
QUICK = {"train": [*SHORT, *RL], "sft": [*SHORT, "sft.num_demos=2", "sft.epochs=1"], "eval": [*SHORT, "eval.num_tasks=1"],
         "pipeline": [*SHORT, *RL, "sft.num_demos=2", "sft.epochs=1", "pipeline.eval_tasks=1"]}


@pytest.mark.parametrize("cmd, arg, said", [
    ("train", "checkpoint=runs/p/sft/checkpoint",
     "checkpoint='runs/p/sft/checkpoint': agentq train does not read it (only agentq eval does); to train from a "
     "checkpoint's weights give model.path=runs/p/sft/checkpoint (trainer.resume=<run folder> continues an RL run "
     "from its latest checkpoint)"),
    ("train", "split=nosuch", "split='nosuch': agentq train does not read it (only agentq eval does); its held-out "
                              "evaluations play env.eval_split (training plays env.train_split)"),
    ("sft", "checkpoint=/nonexistent", "checkpoint='/nonexistent': agentq sft does not read it (only agentq eval "
                                       "does); to start from a checkpoint's weights give model.path=/nonexistent"),
    ("pipeline", "split=dev", "split='dev': agentq pipeline does not read it (only agentq eval does); "
                              "pipeline.eval_splits=[dev] names the held-out splits"),
    ("train", "eval.num_tasks=3", "eval.num_tasks=3: agentq train does not read it (only agentq eval does); "
                                  "trainer.eval_num_tasks=3 sets its held-out evaluations' tasks"),
    # the pipeline records pipeline.eval_tasks there, in its RL stage's config.yaml
    ("pipeline", "trainer.final_eval_tasks=50", "trainer.final_eval_tasks=50: agentq pipeline does not read it (only "
                                                "agentq train does); pipeline.eval_tasks=50 sets its evaluations' tasks"),
    ("pipeline", "trainer.out_dir=elsewhere", "trainer.out_dir='elsewhere': agentq pipeline does not read it (only "
                                              "agentq train does); its RL stage runs in <pipeline.out_dir>/rl"),
    ("eval", "logger=[wandb]", "logger=['wandb']: agentq eval does not read it (only agentq train, sft, pipeline and "
                               "sweep do); agentq eval logs no metrics (it writes eval.json and episodes.jsonl)"),
])
def test_a_key_the_command_does_not_read_is_refused_in_one_line(cmd, arg, said, tmp_path, monkeypatch, capsys):
    """`agentq train checkpoint=<SFT checkpoint>` trained from the base model (config.yaml: model.path
    null) while its config.yaml recorded the checkpoint; `train split=nosuch` and `sft
    checkpoint=/nonexistent` ran without a word."""
    monkeypatch.chdir(tmp_path)
    assert main([cmd, arg, *QUICK[cmd]]) == 2
    assert capsys.readouterr().err == f"agentq: {said}\n"
    assert list(tmp_path.iterdir()) == []           # nothing ran


@pytest.mark.parametrize("cmd, args", [
    ("train", ["checkpoint=null", "eval.temperature=1.0", "eval.repeats=2"]),     # the default; the trainer's evals read these
    ("eval", ["checkpoint=/x", "split=dev", "eval.num_tasks=2"]),
    ("pipeline", ["sft.epochs=2", "eval.selection=first", "pipeline.eval_splits=[dev]"]),
    ("sweep", ["sft.epochs=2", "pipeline.eval_splits=[dev]", "sweep.eval_tasks=3"]),
    ("config", ["checkpoint=/x", "split=dev", "sft.epochs=2"]),           # it prints every key
])
def test_keys_a_command_reads_or_leaves_at_their_default_pass(cmd, args):
    from agentq.cli import CONFIG_OF
    from agentq.config import load_config

    load_config(args, config_name=CONFIG_OF.get(cmd, "config"), command=cmd)


def test_the_table_of_command_keys_names_real_keys_and_commands():
    """Each `READ_BY` entry and each `INSTEAD` key is a key of the composed config (sweep.yaml has
    every section) and names agentq's commands, so a renamed key does not leave the check blind."""
    from omegaconf import OmegaConf

    from agentq.cli import COMMANDS
    from agentq.config import load_config
    from agentq.config_schema import INSTEAD, READ_BY

    cfg = load_config([], config_name="sweep")
    for key in {*READ_BY, *(k for k, _ in INSTEAD)}:
        assert OmegaConf.select(cfg, key, default="absent") != "absent", key
    assert {c for readers in READ_BY.values() for c in readers} <= set(COMMANDS)
    assert {c for _, c in INSTEAD} - {None} <= set(COMMANDS)


@pytest.mark.parametrize("args", [["train", "~trainer.steps"], ["eval", "~eval", "checkpoint=/x"]])
def test_a_removed_key_is_one_line_not_a_traceback(args, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*args, *SHORT]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agentq: {args[1]!r}: {args[1][1:]} cannot be removed: ") and err.count("\n") == 1


def test_ctrl_c_in_train_is_one_line_saying_how_to_go_on(tmp_path, monkeypatch, capsys):
    """Ctrl-C printed a traceback through the engine (~60 lines) and exited 1. Now one line, exit 130,
    naming the run folder and the command that goes on from it, and that command works: a resume from
    the last checkpoint, or, before the first one (its config.yaml written), the folder started again."""
    from agentq.trainer import rl

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    train = rl.RLTrainer.train

    def stop_at_final_eval(self, *a):
        raise KeyboardInterrupt

    monkeypatch.setattr(rl.RLTrainer, "_final_eval", stop_at_final_eval)      # after step 1's checkpoint
    assert main(["train", *QUICK["train"], f"trainer.out_dir={run}"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1] == (
        f"agentq: interrupted: run folder {run}, last checkpoint step_000001; continue it with agentq train "
        f"trainer.resume={run}")
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert main(["train", f"trainer.resume={run}", "trainer.steps=2"]) == 0
    assert (run / "checkpoints" / "step_000002").is_dir()

    fresh = tmp_path / "fresh"

    def stop_at_once(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(rl.RLTrainer, "train", stop_at_once)
    assert main(["train", *QUICK["train"], f"trainer.out_dir={fresh}"]) == 130
    said = capsys.readouterr().err.splitlines()[-1]
    assert said == (f"agentq: interrupted: run folder {fresh} has no checkpoint yet; start it again with agentq train "
                    f"{' '.join(QUICK['train'])} trainer.out_dir={fresh} trainer.overwrite=true")
    monkeypatch.setattr(rl.RLTrainer, "train", train)
    assert main(["train", *QUICK["train"], f"trainer.out_dir={fresh}", "trainer.overwrite=true"]) == 0


def test_a_stopped_pipeline_says_where_it_stands_and_both_commands_it_gives_work(tmp_path, monkeypatch, capsys):
    """A Ctrl-C or a worker given up on inside `agentq pipeline` ended with the bare cause. Now the last
    line names the stage it stopped in and the commands that go on, and each of them runs: the RL
    stage's resume from its checkpoint, and the pipeline started over in its folder."""
    import shlex

    from agentq.trainer.run_dir import RunAborted

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "pipe"
    args = [*QUICK["pipeline"], "trainer.steps=2", "trainer.save_every=1"]
    stop_rl_at_step(monkeypatch, 2)
    assert main(["pipeline", *args, f"pipeline.out_dir={out}"]) == 130
    said = capsys.readouterr().err.splitlines()[-1]
    over = f"start it over with agentq pipeline {' '.join(args)} pipeline.out_dir={out} trainer.overwrite=true"
    assert said == (f"agentq: interrupted: pipeline folder {out} stopped in its RL stage, last checkpoint step_000001; "
                    f"continue that stage alone with agentq train trainer.resume={out / 'rl'} (no summary.json then), "
                    f"or {over}")
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    resume = said.split("continue that stage alone with ")[1].split(" (no summary")[0]
    assert main(shlex.split(resume)[1:]) == 0
    assert (out / "rl" / "checkpoints" / "step_000002").is_dir() and not (out / "summary.json").exists()

    stop_rl_at_step(monkeypatch, 1, RunAborted("env worker 0 gave up"))
    assert main(["pipeline", *args, f"pipeline.out_dir={out}", "trainer.overwrite=true"]) == 1
    said = capsys.readouterr().err.splitlines()[-1]     # no checkpoint of this start yet: only starting over
    assert said == f"agentq: run stopped: env worker 0 gave up; pipeline folder {out} stopped in its RL stage; {over}"
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(said.split("start it over with ")[1])[1:]) == 0
    assert json.loads((out / "summary.json").read_text())["rl_steps"] == 2


def test_where_a_pipeline_stopped_follows_its_folder(tmp_path):
    """`pipeline_stopped_text` at each stage, from the files the stages leave."""
    from agentq.trainer.pipeline import pipeline_stopped_text

    out = tmp_path / "p"
    assert pipeline_stopped_text(out, []) == ""                 # removed as left empty: nothing to go on from
    over = f"start it over with agentq pipeline seed=3 pipeline.out_dir={out} trainer.overwrite=true"
    stages = [("sft/config.yaml", "SFT"), ("sft/sft_summary.json", "evaluation after SFT"), ("rl/config.yaml", "RL"),
              ("rl/train_summary.json", "evaluation after RL")]
    for path, stage in stages:
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text("{}")
        # the command line's folder and overwrite are replaced, the rest repeated
        assert pipeline_stopped_text(out, ["seed=3", "pipeline.out_dir=x", "trainer.overwrite=false"]) == \
            f"pipeline folder {out} stopped in its {stage} stage; {over}"
    (out / "rl" / "train_summary.json").unlink()
    (out / "rl" / "checkpoints" / ".step_000004.old").mkdir(parents=True)     # a kill mid-commit: still restored
    assert pipeline_stopped_text(out, ["seed=3"]) == (
        f"pipeline folder {out} stopped in its RL stage, last checkpoint step_000004; continue that stage alone with "
        f"agentq train trainer.resume={out / 'rl'} (no summary.json then), or {over}")


def test_commands_that_run_tune_malloc_first_and_config_does_not(tmp_path, monkeypatch):
    """Every command that computes sets glibc's thresholds before its first large tensor
    (`agentq.utils.malloc_tuning`; a stand-in here, since mallopt would last for this pytest process)."""
    from agentq.utils import malloc_tuning

    calls = []
    monkeypatch.setattr(malloc_tuning, "tune_malloc", lambda: calls.append(1) or "off: test")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "~trainer.steps", *SHORT]) == 2       # refused at once, after the tuning
    assert calls == [1]
    assert main(["config", "env=webshop"]) == 0
    assert calls == [1]


def test_the_command_line_ends_by_sigint_after_ctrl_c(tmp_path):
    """As the `agentq` command (argv from sys.argv) an interrupted run ends by SIGINT, as an uncaught
    Ctrl-C does, so a shell loop of runs stops at Ctrl-C too: exiting with status 130 told bash that
    the command had handled the signal, and the loop went on to its next run. `main([...])` (tests,
    other Python) returns 130. Ctrl-C here: SIGINT to the loop's process group, as a terminal sends it."""
    import os
    import signal
    import subprocess
    import sys

    # what waits for the interpreter's exit still runs (the vLLM backend's exported checkpoint, a
    # model's size, stayed in $TMPDIR: its weakref.finalize never ran when SIGINT ended the process)
    (tmp_path / "fake.py").write_text(
        "import shutil, sys, tempfile, time, weakref, agentq.cli as c\n"
        "class Backend: pass\n"
        "held = Backend()\n"
        "def run(argv):\n"
        "    work = tempfile.mkdtemp(dir='.')\n"
        "    weakref.finalize(held, shutil.rmtree, work, True)\n"
        "    try:\n"
        "        print('before', work, flush=True)\n"
        "        time.sleep(60)\n"
        "    except KeyboardInterrupt:\n"
        "        return c.INTERRUPTED\n"
        "c.run = run\n"
        "sys.argv = ['agentq', 'train']\n"
        "c.main()\n"
        "print('not reached', flush=True)\n")
    loop = subprocess.Popen(["bash", "-c", f"for i in 1 2; do {sys.executable} fake.py; done; echo finished"],
                            cwd=tmp_path, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        said, work = loop.stdout.readline().split()
        assert said == "before" and (tmp_path / work).is_dir()
        os.killpg(loop.pid, signal.SIGINT)
        rest, _ = loop.communicate(timeout=30)         # a loop that went on would sleep in its second run
    finally:
        if loop.poll() is None:
            os.killpg(loop.pid, signal.SIGKILL)
    assert rest == "" and loop.returncode == -signal.SIGINT, (rest, loop.returncode)
    assert not (tmp_path / work).exists()


@pytest.mark.parametrize("code", ["ENOSPC", "EROFS", "EACCES", "EDQUOT"])
def test_a_full_or_read_only_disk_is_one_line(code, monkeypatch, capsys):
    """An OSError of the disk (full, over quota, read-only, no permission) anywhere in a command
    (`append_jsonl`'s write of metrics.jsonl, a summary, ...) was a traceback: `agentq: <reason>: <file>`."""
    import errno
    import os

    import agentq.cli as cli

    err = getattr(errno, code)

    def full(cmd, cfg, overrides):
        raise OSError(err, os.strerror(err), "runs/x/metrics.jsonl")
    monkeypatch.setattr(cli, "dispatch", full)
    assert main(["config"]) == 2
    assert capsys.readouterr().err == f"agentq: {os.strerror(err)}: runs/x/metrics.jsonl\n"


def test_other_os_errors_and_run_file_errors(monkeypatch, capsys):
    """An unexpected OSError keeps its traceback; a damaged run file (`RunFileError`) is one line."""
    import errno

    import agentq.cli as cli
    from agentq.utils.errors import RunFileError

    def fails(error):
        def dispatch(cmd, cfg, overrides):
            raise error
        return dispatch
    monkeypatch.setattr(cli, "dispatch", fails(OSError(errno.EIO, "Input/output error")))
    with pytest.raises(OSError, match="Input/output error"):
        main(["config"])
    monkeypatch.setattr(cli, "dispatch", fails(RunFileError("runs/x/metrics.jsonl: line 2 is not JSON")))
    assert main(["config"]) == 2
    assert capsys.readouterr().err == "agentq: runs/x/metrics.jsonl: line 2 is not JSON\n"
