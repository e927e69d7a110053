"""What a user of `agentq eval` reads and keeps: the output folder of each evaluation of a checkpoint,
what eval.json says about how the episodes were bounded, the numbers against episodes.jsonl, and the
warnings about what the checkpoint was trained on."""
from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agentq.cli import main
from agentq.config import load_config
from conftest import SHARED_SPLITS_ENV

SMALL = ["eval.num_tasks=3", "env_pool=inline", "env.max_steps=2", "env.max_new_tokens=8"]


def _episodes(folder):
    return [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines()]


def _wilson(k: float, n: float, z: float = 1.96) -> tuple[float, float]:
    centre, half = k / n + z * z / (2 * n), z * math.sqrt(k / n * (1 - k / n) / n + z * z / (4 * n * n))
    return max(0.0, (centre - half) / (1 + z * z / n)), min(1.0, (centre + half) / (1 + z * z / n))


def test_evaluations_under_other_numerics_or_decoding_keep_their_own_folders(tiny_model_dir, tmp_path, capsys):
    """The README's comparisons (rollout=bf16 against the quantized rollout, sampled against greedy)
    all wrote <checkpoint>/eval-<env>-<split>/: the second evaluation replaced the first's eval.json and
    episodes.jsonl without a word. Each now has its folder; eval.json records the step cap and context
    budget its episodes ran under, and its numbers are those of its episodes.jsonl."""
    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    base = "eval-textworld_express-test"
    runs = {f"{base}-steps2-tok8-n3": [],
            f"{base}-bf16-steps2-tok8-n3": ["rollout=bf16"],
            f"{base}-T1-x2-steps2-tok8-n3": ["eval.temperature=1", "eval.repeats=2"]}
    for args in runs.values():
        assert main(["eval", f"checkpoint={ckpt}", *SMALL, *args]) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert sorted(p.name for p in ckpt.glob("eval-*")) == sorted(runs)
    for name in runs:
        assert f"eval.json and episodes.jsonl in {ckpt / name}" in said
    reports = {name: json.loads((ckpt / name / "eval.json").read_text()) for name in runs}
    assert [(r["rollout_quant"], r["sampling"]["temperature"], r["episodes"]) for r in reports.values()] == [
        ("w8a8_kv8", 0.0, 3), ("none", 0.0, 3), ("w8a8_kv8", 1.0, 6)]
    assert all(r["limits"] == {"max_steps": 2, "max_context_tokens": 1536} for r in reports.values())
    assert "hit step cap" in said and "(cap 2 turns)" in said
    assert said.count("decoding │ greedy │") == 2 and "decoding │ sampled at T = 1; 2 episodes a task │" in said

    greedy = _episodes(ckpt / f"{base}-steps2-tok8-n3")
    k = sum(e["won"] for e in greedy)
    assert reports[f"{base}-steps2-tok8-n3"]["success_ci95"] == pytest.approx(_wilson(k, 3), abs=1e-12)
    # the sampled evaluation's numbers, recomputed from its episodes (3 tasks × 2 repeats)
    r, eps = reports[f"{base}-T1-x2-steps2-tok8-n3"], _episodes(ckpt / f"{base}-T1-x2-steps2-tok8-n3")
    assert [e["task_id"] for e in eps[::2]] == [e["task_id"] for e in eps[1::2]] and len({e["task_id"] for e in eps}) == 3
    won = [e for e in eps if e["won"]]
    assert r["success_rate"] == len(won) / 6
    assert r["turns_success_mean"] == (sum(e["turns"] for e in won) / len(won) if won else None)
    assert r["cap_rate"] == sum(e["end_reason"] == "step_cap" and not e["won"] for e in eps) / 6
    assert r["per_task_type"] == {"coin": {"episodes": 6, "success_rate": len(won) / 6,
                                           "score_mean": sum(e["score"] for e in eps) / 6}}


def test_the_default_folder_name_says_what_differs_from_the_default_evaluation():
    from agentq.eval.evaluate import settings_suffix

    def suffix(*args):
        return settings_suffix(load_config(list(args)))
    assert suffix() == "" and suffix("rollout=w8a8_kv8", "eval.temperature=0", "rollout.top_p=0.5") == ""
    assert suffix("rollout=bf16") == "-bf16" and suffix("algo=bf16") == "-bf16"
    assert suffix("rollout.quant=w8a8_kv8_head") == "-w8a8_kv8_head"
    assert suffix("eval.temperature=0.7", "rollout.top_p=0.9", "rollout.top_k=5", "eval.repeats=3") == "-T0.7-top_p0.9-top_k5-x3"
    assert suffix("rollout=bf16", "eval.repeats=2") == "-bf16-x2"


def test_every_setting_that_changes_the_episodes_is_in_the_default_folder_name():
    """`seed`, the budgets, the task sample and the prompt were left out of the name: three evaluation
    seeds (or env.max_steps=2 against the default cap) wrote one folder, each replacing the one before.
    The default keeps today's name, and so does each env preset at its defaults."""
    from agentq.eval.evaluate import settings_suffix

    def suffix(*args):
        return settings_suffix(load_config(list(args)))
    for defaults in ([], ["seed=0", "env.max_steps=12", "eval.selection=first"], ["env=webshop"], ["env=alfworld"],
                     ["env.name=agentq/TextWorldExpress-v0"], ["env.kwargs.jvm_heap=2g", "env.kwargs.call_timeout_s=9"]):
        assert suffix(*defaults) == "", defaults
    assert suffix("seed=1") == "-seed1" and suffix("env.max_steps=2") == "-steps2"
    assert suffix("env.max_context_tokens=2048", "env.max_new_tokens=8") == "-ctx2048-tok8"
    assert suffix("eval.num_tasks=4") == "-n4" and suffix("eval.num_tasks=4", "eval.selection=first") == "-first4"
    assert suffix("rollout=bf16", "eval.temperature=1", "seed=2", "eval.num_tasks=4") == "-bf16-T1-seed2-n4"
    # the prompt, the task's env.kwargs and the agent loop's format and penalties: a hash of what differs
    assert suffix("env.prompt.system=Play.") == "-cfg054da7a4"
    assert suffix("env.prompt.system=Play.", "seed=3") == "-seed3-cfg054da7a4"
    hashed = {suffix(a) for a in ("env.prompt.system=Win.", "env.prompt.max_obs_chars=100", "env.kwargs.games=[mapreader]",
                                  "agent.invalid_action_penalty=0.1", "agent.action_tag=act")}
    assert len(hashed) == 5 and all(h.startswith("-cfg") and len(h) == 12 for h in hashed)
    # a preset sharing another's env.name is told against that one's defaults: never the coin game's name
    assert suffix("env=textworld_express_mapreader") == "-ctx2048-cfg84860cba"


def test_evaluations_under_another_seed_cap_or_prompt_keep_their_own_folders(tiny_model_dir, tmp_path, capsys):
    """Played: each setting its folder; a rerun with the same settings replaces its own, and says so."""
    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    small = ["eval.num_tasks=1", "env_pool=inline", "env.max_new_tokens=8", "eval.temperature=1"]
    runs = {"eval-textworld_express-test-T1-tok8-n1": [],
            "eval-textworld_express-test-T1-seed1-tok8-n1": ["seed=1"],
            "eval-textworld_express-test-T1-steps2-tok8-n1": ["env.max_steps=2"],
            "eval-textworld_express-test-T1-tok8-n1-cfg054da7a4": ["env.prompt.system=Play."]}
    for args in runs.values():
        assert main(["eval", f"checkpoint={ckpt}", *small, *args]) == 0
    assert sorted(p.name for p in ckpt.glob("eval-*")) == sorted(runs)
    assert "replaces" not in capsys.readouterr().err
    seeds = {name: json.loads((ckpt / name / "eval.json").read_text())["sampling"]["seed"] for name in runs}
    assert list(seeds.values()) == [1, 2, 1, 1]

    folder = ckpt / "eval-textworld_express-test-T1-seed1-tok8-n1"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime((folder / "eval.json").stat().st_mtime))
    assert main(["eval", f"checkpoint={ckpt}", *small, "seed=1"]) == 0
    assert (f"this evaluation replaces the earlier one with the same settings in {folder} (1 episodes, written "
            f"{when}); eval.out_dir=<another folder> keeps both") in " ".join(capsys.readouterr().err.split())
    assert sorted(p.name for p in ckpt.glob("eval-*")) == sorted(runs)


def test_a_task_count_that_plays_every_task_is_the_default_evaluations_folder(tiny_model_dir, tmp_path, capsys):
    """eval.num_tasks=10 of a 6-task split plays every task, the default evaluation's episodes, but wrote
    them to a -n10 folder of their own: the same evaluation in two folders. Only a sample smaller than
    the split is named."""
    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    six = ["env.kwargs.tasks_per_game=6", "env_pool=inline", "env.max_steps=2", "env.max_new_tokens=8"]
    assert main(["eval", f"checkpoint={ckpt}", *six]) == 0
    (plain,) = ckpt.glob("eval-*")
    assert plain.name.startswith("eval-textworld_express-test-steps2-tok8-cfg") and "-n" not in plain.name
    capsys.readouterr()
    assert main(["eval", f"checkpoint={ckpt}", *six, "eval.num_tasks=10"]) == 0
    assert list(ckpt.glob("eval-*")) == [plain]
    assert f"this evaluation replaces the earlier one with the same settings in {plain} (6 episodes" in " ".join(
        capsys.readouterr().err.split())
    assert json.loads((plain / "eval.json").read_text())["task_selection"]["method"] == "all"
    assert main(["eval", f"checkpoint={ckpt}", *six, "eval.num_tasks=4"]) == 0
    assert sorted(p.name for p in ckpt.glob("eval-*")) == sorted([plain.name, plain.name.replace("-cfg", "-n4-cfg")])


def test_the_table_says_how_the_evaluation_decoded():
    from agentq.eval.evaluate import decoding_text

    assert decoding_text({"temperature": 0.0, "top_p": 0.9, "top_k": 5, "repeats": 1}) == "greedy"
    assert decoding_text({"temperature": 0.7, "top_p": 0.9, "top_k": 5, "repeats": 3}) == (
        "sampled at T = 0.7, top_p 0.9, top_k 5; 3 episodes a task")
    assert decoding_text({"temperature": 1.0, "top_p": 1.0, "top_k": 0, "repeats": 1}) == "sampled at T = 1"


def test_another_environments_checkpoint_is_named_as_such(tiny_model_dir, tmp_path):
    """A checkpoint of another environment: inside its run the warning listed every env.kwargs and
    env.prompt key of both environments (env.name somewhere in the middle); copied out of its run (no
    config.yaml above it) it said nothing, though its agentq.json names the environment."""
    from agentq.eval.evaluate import trained_otherwise

    run = tmp_path / "run"
    ckpt = shutil.copytree(tiny_model_dir, run / "checkpoint")
    (run / "config.yaml").write_text(OmegaConf.to_yaml(load_config(["env=webshop"]), resolve=True))
    assert trained_otherwise(load_config([]), ckpt) == (run / "config.yaml", [
        "env.name: trained 'webshop', now 'textworld_express' (another environment: its env.kwargs and env.prompt "
        "differ too)"])

    copied = shutil.copytree(tiny_model_dir, tmp_path / "copied")
    (copied / "agentq.json").write_text(json.dumps({"step": 3, "env": "webshop", "algo": "interq"}))
    assert trained_otherwise(load_config([]), copied) == (copied / "agentq.json",
                                                          ["env.name: trained 'webshop', now 'textworld_express'"])
    assert trained_otherwise(load_config(["env=webshop"]), copied) == (None, [])
    (copied / "agentq.json").write_text("[1, 2]")           # not agentq's: nothing to say
    assert trained_otherwise(load_config([]), copied) == (None, [])


def test_another_environments_checkpoint_without_an_env_on_the_command_line_is_refused(tiny_model_dir, tmp_path,
                                                                                        capsys):
    """`agentq eval checkpoint=<a plugin env's checkpoint>` without env= played the config's default
    environment and wrote a real-looking eval.json (a review's; only a warning said so). Refused now,
    naming the env config to give; a command line that chooses the env evaluates there, warned."""
    run = tmp_path / "run"
    ckpt = shutil.copytree(tiny_model_dir, run / "checkpoints" / "step_000001")
    (run / "config.yaml").write_text(OmegaConf.to_yaml(load_config(["env=webshop"]), resolve=True))
    assert main(["eval", f"checkpoint={ckpt}", *SMALL]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"agentq: checkpoint='{ckpt}' was trained on env.name='webshop' ({run / 'config.yaml'}), and this command "
        "line names no env: agentq eval would play 'textworld_express', the default. Give env=webshop to evaluate "
        "what it trained on, or env=<an env config> to evaluate it on another environment on purpose")
    assert not list(ckpt.glob("eval-*"))
    # a split of the run's env, which the default env lacks: the env is what to fix, not the split (the
    # split was listed first, and its refusal hid this one)
    assert main(["eval", f"checkpoint={ckpt}", "split=valid_unseen", *SMALL]) == 2
    assert "and this command line names no env" in capsys.readouterr().err.strip().splitlines()[-1]
    copied = shutil.copytree(tiny_model_dir, tmp_path / "copied")         # away from its run: its agentq.json
    (copied / "agentq.json").write_text(json.dumps({"step": 1, "env": "plugin_env:Game"}))
    assert main(["eval", f"checkpoint={copied}", *SMALL]) == 2
    assert "Give env=<the env config it trained with> (and the hydra.searchpath that finds it)" in capsys.readouterr().err
    # chosen on purpose: evaluated, with the warning
    assert main(["eval", f"checkpoint={copied}", "env=textworld_express", *SMALL,
                 f"eval.out_dir={tmp_path / 'ev'}"]) == 0
    assert "env.name: trained 'plugin_env:Game', now 'textworld_express'" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["env: [unclosed", "- a\n- list\n", "42", b"\xff\xfe", "", "{}", "env: null\n",
                                  "cut"])
def test_a_damaged_run_config_is_said_and_read_as_none(tiny_model_dir, tmp_path, capsys, text):
    """A run's config.yaml cut or garbled: `agentq eval` of its checkpoint died in a YAML traceback while
    only composing a warning. Now it warns that the file is damaged and falls back to agentq.json."""
    from agentq.eval.evaluate import trained_otherwise

    run = tmp_path / "run"
    ckpt = shutil.copytree(tiny_model_dir, run / "checkpoint")
    cfg_file = run / "config.yaml"
    if text == "cut":                       # a run's own file, cut inside its last section
        from agentq.trainer.run_dir import write_run_config
        whole = write_run_config(run, load_config(["env=webshop"])).read_text()
        text = whole[:whole.rindex("\n", 0, len(whole) - 40)]
    cfg_file.write_bytes(text if isinstance(text, bytes) else text.encode())
    (ckpt / "agentq.json").write_text(json.dumps({"step": 3, "env": "webshop", "algo": "interq"}))
    assert trained_otherwise(load_config([]), ckpt) == (ckpt / "agentq.json",
                                                        ["env.name: trained 'webshop', now 'textworld_express'"])
    err = capsys.readouterr().err
    assert f"{cfg_file} is damaged" in " ".join(err.split()) and "not compared" in err


def test_a_module_class_env_name_and_its_presets_name_are_one_environment(tiny_model_dir, tmp_path):
    """Trained as env.name=<module:Class>, evaluated under the preset naming the same class: the warning
    said "another environment: its env.kwargs and env.prompt differ too", though neither did."""
    from agentq.eval.evaluate import trained_otherwise
    from agentq.envs import env_class

    cls = env_class("webshop")
    entry = f"{cls.__module__}:{cls.__qualname__}"
    run = tmp_path / "run"
    ckpt = shutil.copytree(tiny_model_dir, run / "checkpoint")
    trained = load_config(["env=webshop", f"env.name={entry}"])
    (run / "config.yaml").write_text(OmegaConf.to_yaml(trained, resolve=True))
    assert trained_otherwise(load_config(["env=webshop"]), ckpt) == (run / "config.yaml", [])
    assert trained_otherwise(load_config(["env=webshop", "agent.action_tag=act"]), ckpt)[1] == [
        f"agent.action_tag: trained {trained.agent.action_tag!r}, now 'act'"]     # what else differs, still said
    gone = OmegaConf.to_container(trained, resolve=True)
    gone["env"]["name"] = "nosuch_env:Nope"             # a plugin not installed here: not known to be the same
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(gone)))
    assert trained_otherwise(load_config(["env=webshop"]), ckpt)[1] == [
        "env.name: trained 'nosuch_env:Nope', now 'webshop' (another environment: its env.kwargs and env.prompt "
        "differ too)"]
    (ckpt / "agentq.json").write_text(json.dumps({"env": entry}))
    copied = shutil.copytree(ckpt, tmp_path / "copied")
    assert trained_otherwise(load_config(["env=webshop"]), copied) == (None, [])


def test_how_an_environment_runs_is_no_other_task(tiny_model_dir, tmp_path):
    """env.kwargs.jvm_heap=2g (or a longer call timeout) at evaluation warned that the checkpoint
    "trained with other settings" and sent the user to the run's config; a task setting still warns."""
    from agentq.eval.evaluate import trained_otherwise

    run = tmp_path / "run"
    ckpt = shutil.copytree(tiny_model_dir, run / "checkpoints" / "step_000001")
    (run / "config.yaml").write_text(OmegaConf.to_yaml(load_config([]), resolve=True))
    assert trained_otherwise(load_config(["env.kwargs.jvm_heap=2g", "env.kwargs.call_timeout_s=120"]), ckpt) == (
        run / "config.yaml", [])
    assert trained_otherwise(load_config(["env.kwargs.games=[mapreader]"]), ckpt)[1] == [
        "env.kwargs.games: trained ['coin'], now ['mapreader']"]


def test_another_rollout_numerics_than_the_rl_run_sampled_with_is_said(tiny_model_dir, tmp_path, capsys):
    """`agentq eval checkpoint=<a bf16 run's step>` sampled from the command line's (default w8a8_kv8)
    engine without a word; an SFT checkpoint sampled nothing in training, so its rollout is not compared."""
    from agentq.eval.evaluate import trained_otherwise, warn_if_trained_otherwise

    run = tmp_path / "run"
    ckpt = shutil.copytree(tiny_model_dir, run / "checkpoints" / "step_000001")
    (run / "config.yaml").write_text(OmegaConf.to_yaml(load_config(["rollout=bf16", "algo=bf16"]), resolve=True))
    assert trained_otherwise(load_config([]), ckpt) == (run / "config.yaml", [
        "rollout.quant: trained 'none', now 'w8a8_kv8'"])
    assert trained_otherwise(load_config(["rollout.quant=none", "rollout.backend=vllm"]), ckpt)[1] == [
        "rollout.backend: trained 'torch', now 'vllm'"]
    assert trained_otherwise(load_config(["rollout.quant=none"]), ckpt) == (run / "config.yaml", [])
    # another environment is said alone, the rollout numerics with it
    assert trained_otherwise(load_config(["env=webshop"]), ckpt)[1] == [
        "env.name: trained 'textworld_express', now 'webshop' (another environment: its env.kwargs and env.prompt "
        "differ too)", "rollout.quant: trained 'none', now 'w8a8_kv8'"]
    warn_if_trained_otherwise(load_config([]), ckpt)
    assert " ".join(capsys.readouterr().err.split()) == (
        f"warning: this checkpoint's run ({run / 'config.yaml'}) trained with other settings than this evaluation's: "
        "rollout.quant: trained 'none', now 'w8a8_kv8'. Its episodes were sampled with other rollout numerics: this "
        "evaluation measures the checkpoint on another engine than it trained with. agentq eval reads conf/ and the "
        "command line, not the run's config: give the run's env= and keys to evaluate what it trained on")

    sft = shutil.copytree(tiny_model_dir, tmp_path / "sft" / "checkpoint")
    (sft.parent / "config.yaml").write_text(OmegaConf.to_yaml(load_config([]), resolve=True))
    assert trained_otherwise(load_config(["rollout=bf16"]), sft) == (sft.parent / "config.yaml", [])

    copied = shutil.copytree(ckpt, tmp_path / "copied")        # away from its run: its agentq.json says it
    (copied / "agentq.json").write_text(json.dumps({"step": 1, "env": "textworld_express", "algo": "bf16",
                                                    "rollout_quant": "none"}))
    assert trained_otherwise(load_config([]), copied) == (copied / "agentq.json", [
        "rollout.quant: trained 'none', now 'w8a8_kv8'"])
    assert trained_otherwise(load_config(["rollout.quant=none"]), copied) == (None, [])


def test_evaluating_the_training_split_says_it_is_not_held_out(capsys):
    from agentq.eval.evaluate import warn_if_training_split

    warn_if_training_split(load_config([]), "test")
    assert capsys.readouterr().err == ""
    warn_if_training_split(load_config([]), "train")
    assert " ".join(capsys.readouterr().err.split()) == (
        "warning: split='train' is env.train_split, the split training draws its tasks from: this evaluation "
        "measures training tasks, not held-out ones (env.eval_split is 'test')")


@pytest.mark.parametrize("cls", ["Shared", "Apart"])
def test_evaluating_a_split_sharing_task_ids_with_training_says_so(tiny_model_dir, tmp_path, monkeypatch, capsys,
                                                                   cls):
    """`agentq train` warned of a held-out split sharing task ids with env.train_split (its start-up
    check); `agentq eval` of the same split said nothing. It says it in the same words, before the model
    is built; a disjoint split says nothing."""
    from agentq import build
    from agentq.config import ConfigError

    (tmp_path / "shared_split_env.py").write_text(SHARED_SPLITS_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "conf" / "env").mkdir(parents=True)
    base = OmegaConf.to_container(load_config([]).env)
    (tmp_path / "conf" / "env" / "shared.yaml").write_text(OmegaConf.to_yaml(
        {**base, "name": f"shared_split_env:{cls}", "kwargs": {}, "train_split": "train", "eval_split": "test"}))

    def stop(*args, **kwargs):
        raise ConfigError("stopped before the model was built")

    monkeypatch.setattr(build, "make_backend", stop)
    assert main(["eval", "env=shared", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "env_pool=inline",
                 f"checkpoint={tiny_model_dir}", f"eval.out_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "agentq: stopped before the model was built"
    said = " ".join(err.split())
    warning = ("warning: 2 of the 4 task ids of env.eval_split='test' are also ids of env.train_split='train': "
               "evaluations there measure tasks training draws from, not held-out ones (an env's _tasks gives each "
               "split its ids)")
    assert said.count(warning) == (cls == "Shared") and said.count("warning") == (cls == "Shared")


@pytest.mark.parametrize("inside_pipeline", [False, True])
def test_report_of_an_sft_folder_is_a_one_line_refusal(tmp_path, capsys, inside_pipeline):
    """`agentq report <an agentq sft folder>` wrote a page titled "<env> · interq · 0 steps" with every
    section empty (its metrics.jsonl holds SFT losses only)."""
    top = tmp_path / "pipe"
    sft = top / "sft" if inside_pipeline else tmp_path / "sft"
    (sft / "checkpoint").mkdir(parents=True)
    (sft / "metrics.jsonl").write_text(json.dumps({"step": 1, "time": 0.0, "sft/train_loss": 4.4}) + "\n")
    (sft / "sft_summary.json").write_text("{}")
    (sft / "config.yaml").write_text("env: {name: textworld_express}\nalgo: {name: interq}\n")
    if inside_pipeline:
        (top / "rl").mkdir()
        (top / "rl" / "metrics.jsonl").write_text("")
    assert main(["report", str(sft)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err == (f"agentq: {sft} is an `agentq sft` folder, not an RL run: agentq report renders an `agentq train` or "
                   "`agentq pipeline` folder" + (f" (its pipeline's: agentq report {top})" if inside_pipeline else "")
                   + f"; evaluate the SFT checkpoint with agentq eval checkpoint={sft / 'checkpoint'}")
    assert not (sft / "report.html").exists()


def test_an_evaluation_on_webshops_real_files_keeps_its_own_folder(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """$WEBSHOP_DATA used to be read by the env alone: an evaluation on WebShop's real catalog took the
    generated catalog's folder and replaced its results ("with the same settings"). The folder the env
    reads is now in env.kwargs (`pin_env_kwargs`): its own folder name, and eval.json says it."""
    fixture = Path(__file__).parents[1] / "envs" / "fixtures" / "webshop"
    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    small = ["env=webshop", "+env.kwargs.split_sizes={test: 2, dev: 1}", "eval.num_tasks=1", "env_pool=inline",
             "env.max_steps=2", "env.max_new_tokens=8"]
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    assert main(["eval", f"checkpoint={ckpt}", *small]) == 0
    monkeypatch.setenv("WEBSHOP_DATA", str(fixture))
    assert main(["eval", f"checkpoint={ckpt}", *small]) == 0
    assert "replaces" not in capsys.readouterr().err
    folders = sorted(ckpt.glob("eval-*"))
    assert len(folders) == 2
    kwargs = sorted((json.loads((f / "eval.json").read_text())["env_kwargs"] for f in folders), key=lambda k: k["data_dir"] is not None)
    assert [k["data_dir"] for k in kwargs] == [None, str(fixture)] and all(k["split_sizes"] == {"test": 2, "dev": 1}
                                                                         for k in kwargs)


def test_a_stopped_evaluation_says_the_earlier_one_is_kept_and_leaves_no_empty_folder(tiny_model_dir, tmp_path,
                                                                                        monkeypatch, capsys):
    """Ctrl-C after "this evaluation replaces the earlier one" kept the earlier eval.json and
    episodes.jsonl, but said only "interrupted"; and a first evaluation stopped so left its folder
    holding only the lock file. Now the line says what was kept, and a folder it made empty goes."""
    from agentq.eval import evaluate

    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    out = tmp_path / "ev"
    assert main(["eval", f"checkpoint={ckpt}", *SMALL, f"eval.out_dir={out}"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def stopped(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "evaluate_policy", stopped)
    capsys.readouterr()
    assert main(["eval", f"checkpoint={ckpt}", *SMALL, f"eval.out_dir={out}"]) == 130
    err = capsys.readouterr().err
    assert "this evaluation replaces the earlier one" in err
    assert err.splitlines()[-1] == f"agentq: interrupted: the earlier evaluation in {out} is kept as it was"
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name in before} == before
    fresh = tmp_path / "fresh" / "ev"
    assert main(["eval", f"checkpoint={ckpt}", *SMALL, f"eval.out_dir={fresh}"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "agentq: interrupted"
    assert not (tmp_path / "fresh").exists()


def stop_after_episodes(monkeypatch, out, n: int):
    """Make an evaluation into `out` stop (Ctrl-C) once `n` episodes are kept in its partial file.

    Returns:
        `PartialEpisodes.append` as it was, to put back.
    """
    from agentq.eval import partial

    append = partial.PartialEpisodes.append

    def stop_after(self, t):
        append(self, t)
        if sum(1 for _ in (out / partial.PARTIAL).open()) == n + 1:      # the fingerprint line and n episodes
            raise KeyboardInterrupt

    monkeypatch.setattr(partial.PartialEpisodes, "append", stop_after)
    return append


def test_a_stopped_evaluation_keeps_its_finished_episodes_and_the_same_command_plays_the_rest(
        tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Ctrl-C lost every finished episode of an `agentq eval` (a 134-game ALFWorld evaluation cannot be
    redone cheaply). Now each one is kept as it finishes; the same command takes them and plays the
    rest, and the result is the uninterrupted run's, byte for byte (seeds come from episode ids)."""
    from agentq.eval import partial

    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    args = ["eval", f"checkpoint={ckpt}", "eval.num_tasks=3", "eval.repeats=2", "eval.temperature=1.0",
            "env_pool=inline", "env.max_steps=3", "env.max_new_tokens=8", "trainer.max_concurrent=2"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main([*args, f"eval.out_dir={whole}"]) == 0
    append = stop_after_episodes(monkeypatch, cut, 3)
    capsys.readouterr()
    assert main([*args, f"eval.out_dir={cut}"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (f"agentq: interrupted: 3 finished episodes kept in "
                                                        f"{cut / partial.PARTIAL}: the same command plays the rest")
    assert not (cut / "eval.json").exists()
    monkeypatch.setattr(partial.PartialEpisodes, "append", append)
    # how the envs run is no other evaluation: the rest is played in a worker process (it started over)
    how = ["env_pool=process", "env_pool.num_workers=1"]
    assert main([*args, *how, f"eval.out_dir={cut}"]) == 0
    assert f"3 episodes of a stopped evaluation taken from {cut / partial.PARTIAL}; playing the rest" in \
        capsys.readouterr().err
    assert (cut / "episodes.jsonl").read_bytes() == (whole / "episodes.jsonl").read_bytes()
    a, b = (json.loads((d / "eval.json").read_text()) for d in (whole, cut))
    assert a["success_rate"] == b["success_rate"] and a["episodes"] == b["episodes"] == 6
    assert not (cut / partial.PARTIAL).exists()
    # a stopped evaluation of other settings is not taken up
    (cut / partial.PARTIAL).write_text(json.dumps({"fingerprint": "another"}) + "\n")
    assert main([*args, "eval.temperature=0.5", f"eval.out_dir={cut}"]) == 0
    assert ("a stopped evaluation of other settings, another checkpoint or other env code; starting over"
            in capsys.readouterr().err)


def test_a_stopped_evaluation_is_played_again_after_its_env_code_changed(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A user who stopped an evaluation to fix the env, then ran the same command, got the episodes
    played under the old code mixed with the new (a review's env made to win every episode: 8 old
    episodes of 2 turns and 12 new of 1, "100 %"). The env class's source file is in the stopped
    evaluation's fingerprint: an edit starts it over. (The digest of a file is tested on its own in
    tests/config; here it is patched, as an edit of textworld_express's file would change it.)"""
    from agentq import build
    from agentq.eval import partial

    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    out = tmp_path / "ev"
    args = ["eval", f"checkpoint={ckpt}", "eval.num_tasks=3", "env_pool=inline", "env.max_steps=2",
            "env.max_new_tokens=8", "trainer.max_concurrent=1", f"eval.out_dir={out}"]
    append = stop_after_episodes(monkeypatch, out, 2)
    assert main(args) == 130
    monkeypatch.setattr(partial.PartialEpisodes, "append", append)
    digest = build.env_code_digest
    monkeypatch.setattr(build, "env_code_digest", lambda name: "edited " + str(digest(name)))
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "other env code; starting over" in err and "of a stopped evaluation taken from" not in err
    assert json.loads((out / "eval.json").read_text())["episodes"] == 3


@pytest.mark.parametrize("theirs, writes", [("train", "train_summary.json"), ("pipeline", "summary.json"),
                                            ("sft", "sft_summary.json")])
def test_an_evaluation_into_another_commands_run_folder_is_refused(tiny_model_dir, tmp_path, capsys, theirs, writes):
    """`agentq eval eval.out_dir=<a train run's or a pipeline's folder>` wrote its eval.json and
    episodes.jsonl among that run's files; an evaluation's own folder is taken again as before."""
    run = tmp_path / "run"
    run.mkdir()
    (run / writes).write_text("{}")
    assert main(["eval", f"model.path={tiny_model_dir}", *SMALL, f"eval.out_dir={run}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"agentq: eval.out_dir='{run}' holds an `agentq {theirs}` run ({writes}), not an `agentq eval` one: "
        "pick another eval.out_dir")
    assert sorted(p.name for p in run.iterdir()) == [writes]
