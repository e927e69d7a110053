"""Bad config values fail at start-up with the key named, before any model or worker is built;
a truncated weight file is an error naming the file."""
import re
import shutil

import pytest

from agentq.config import ConfigError, load_config
from conftest import run_cli


@pytest.mark.parametrize("override, named", [
    ("trainer.steps=-1", "trainer.steps=-1 (int): must be a positive integer"),
    ("trainer.steps=abc", "trainer.steps='abc' (str): must be a positive integer"),
    ("trainer.group_size=0", "trainer.group_size=0"),
    ("rollout.top_p=1.5", "rollout.top_p=1.5 (float): must be a number in (0, 1]"),
    ("env_pool.call_timeout_s=0", "env_pool.call_timeout_s=0"),
    # a local Ray cluster of 0 CPUs was started, then no actor could be placed on it
    ("ray.num_cpus=0", "ray.num_cpus=0 (int): must be a positive integer or null"),
    ("ray.num_cpus=-2", "ray.num_cpus=-2 (int): must be a positive integer or null"),
    ("trainer.overwrite=maybe", "trainer.overwrite='maybe' (str): must be true or false"),
    ("trainer.pack_tokens=0", "trainer.pack_tokens=0 (int): must be a positive integer or null"),
    ("trainer.grad_input=fp8", "trainer.grad_input='fp8' (str): must be one of ['bf16', 'int8']"),
    ("rollout.run_ahead=sometimes", "rollout.run_ahead='sometimes' (str): must be true or false"),
    ("rollout.prefill_graph_max=-1", "rollout.prefill_graph_max=-1 (int): must be an integer >= 0"),
    # found at start-up, not at the first evaluation after training
    ("eval.selection=frist", "eval.selection='frist' (str): must be one of ['stratified', 'first']"),
    ("sft.val_fraction=1.0", "sft.val_fraction=1.0 (float): must be a number in [0, 1)"),
    ("sft.val_fraction=-0.1", "sft.val_fraction=-0.1 (float): must be a number in [0, 1)"),
    # clip_grad_norm_ to 0 would zero every gradient
    ("trainer.grad_clip=0", "trainer.grad_clip=0 (int): must be a number > 0"),
    # values that failed with a traceback once the model and workers were up, or were taken as given
    ("device=foo", "device='foo' (str): must be cpu, cuda, cuda:N or auto"),
    ("device=cuda:x", "device='cuda:x' (str): must be cpu, cuda, cuda:N or auto"),
    ("dtype=foo", "dtype='foo' (str): must be one of ['auto', 'float32', 'bfloat16', 'float16']"),
    ("cpu_int_gemm=foo", "cpu_int_gemm='foo' (str): must be one of ['auto', 'int_mm', 'fp32', 'fp64'] or null"),
    ("rollout.backend=foo", "rollout.backend='foo' (str): must be one of ['torch', 'vllm']"),
    ("rollout.quant=w4", "rollout.quant='w4' (str): must be one of ['kv8', 'none', 'w8a8'"),
    ("rollout.sampler=foo", "rollout.sampler='foo' (str): must be one of ['auto', 'generator', 'counter']"),
    ("rollout.top_k=abc", "rollout.top_k='abc' (str): must be an integer"),
    ("rollout.prefill_chunk=0", "rollout.prefill_chunk=0 (int): must be a positive integer"),
    ("algo.learner_quant=int3", "algo.learner_quant='int3' (str): must be one of ['aligned', 'kv8', 'none'"),
    ("algo.loss_agg=foo", "algo.loss_agg='foo' (str): must be one of ['token_mean', 'seq_mean']"),
    ("env_pool.type=foo", "env_pool.type='foo' (str): must be one of ['inline', 'process', 'ray']"),
    ("env.prompt.max_obs_chars=-1", "env.prompt.max_obs_chars=-1 (int): must be a positive integer"),
    ("env.prompt.max_obs_chars=0", "env.prompt.max_obs_chars=0 (int): must be a positive integer"),
    ("trainer.eval_num_tasks=0", "trainer.eval_num_tasks=0 (int): must be a positive integer"),
    ("trainer.betas=[2.0,0.9]", "trainer.betas=[2.0, 0.9] (ListConfig): must be a list of two numbers in [0, 1)"),
    ("trainer.betas=[0.9]", "trainer.betas=[0.9] (ListConfig): must be a list of two numbers in [0, 1)"),
    ("trainer.betas=0.9", "trainer.betas=0.9 (float): must be a list of two numbers in [0, 1)"),
    ("agent.action_tag=a.b", "agent.action_tag='a.b' (str): must be a tag name"),
])
def test_bad_values_name_their_key(override, named):
    with pytest.raises(ConfigError, match="invalid config value") as e:
        load_config([override])
    assert named in str(e.value)


@pytest.mark.parametrize("overrides, said", [
    (["env_pool=ray", "ray.num_cpus=0"], "ray.num_cpus=0 (int): must be a positive integer or null"),
    (["env_pool=ray", "env_pool.num_cpus=0"], "env_pool.num_cpus=0 (int): must be a positive integer or null"),
])
def test_a_bad_ray_cpu_count_is_named_once_where_it_was_set(overrides, said):
    """env_pool.num_cpus is ${ray.num_cpus}: a bad ray.num_cpus is named at ray.num_cpus alone, not twice."""
    with pytest.raises(ConfigError) as e:
        load_config(overrides)
    assert str(e.value) == f"invalid config value:\n  {said}"
    assert load_config(["env_pool=ray", "ray.num_cpus=2"]).env_pool.num_cpus == 2


def test_eval_selection_rule_lists_the_methods_selection_knows():
    from agentq.config_schema import RULES
    from agentq.eval.selection import METHODS

    assert RULES["eval.selection"]("none") == f"one of {list(METHODS)}"
    assert all(RULES["eval.selection"](m) is None for m in METHODS)
    assert RULES["sft.val_fraction"](0) is None and RULES["sft.val_fraction"](0.99) is None


@pytest.mark.parametrize("override", ["device=cpu", "device=cuda", "device=cuda:1", "device=auto", "cpu_int_gemm=FP32",
                                      "cpu_int_gemm=null", "rollout.top_k=5", "trainer.betas=[0,0.99]",
                                      "agent.action_tag=act_2-b", "algo.learner_quant=w8a8"])
def test_good_values_pass(override):
    import yaml
    from omegaconf import OmegaConf

    key, value = override.split("=", 1)
    got = OmegaConf.select(load_config([override]), key)
    # kept as given: the value as YAML reads it (FP32 stays 'FP32', null is None, [0,0.99] a list)
    assert (OmegaConf.to_container(got) if OmegaConf.is_config(got) else got) == yaml.safe_load(value)


def test_choice_rules_list_what_the_code_accepts():
    """The choices config_schema repeats (it may not import their modules) equal their sources."""
    from agentq import config_schema as s
    from agentq.agent.parser import ActionParser
    from agentq.algos.losses import LOSS_AGGS
    from agentq.kernels.cpu_gemm import PATHS
    from agentq.kernels.quant_spec import PRESETS
    from agentq.learner.lr_schedule import SCHEDULES
    from agentq.pool import POOL_TYPES
    from agentq.rollout.torch_engine.engine import SAMPLERS

    assert s.QUANT_PRESETS == tuple(sorted(PRESETS)) and s.CPU_INT_GEMM == ("auto", *PATHS)
    assert (s.LOSS_AGGS, s.POOL_TYPES, s.SAMPLERS, s.LR_SCHEDULES) == (LOSS_AGGS, POOL_TYPES, SAMPLERS, SCHEDULES)
    for tag in ("action", "act_2-b", "_x", "a.b", "2x", "a b", "", "<a>"):
        try:
            ActionParser(tag)
            parser_ok = True
        except ValueError:
            parser_ok = False
        assert (s.RULES["agent.action_tag"](tag) is None) == parser_ok, tag


@pytest.mark.parametrize("overrides, named", [
    (["trainer=3"], "Config group override must be a string or a list"),
    (["trainer.steps=${nope}"], "trainer.steps: Interpolation key 'nope' not found"),
])
def test_composition_errors_are_config_errors(overrides, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_config(overrides)


def test_every_problem_is_listed_at_once():
    with pytest.raises(ConfigError) as e:
        load_config(["trainer.steps=0", "env.max_steps=-3"])
    assert "trainer.steps=0" in str(e.value) and "env.max_steps=-3" in str(e.value)


def test_default_configs_pass():
    # the groups conf/config.yaml's defaults list names, and pipeline.yaml's own values on top of it
    cfg = load_config([])
    assert (cfg.env.name, cfg.rollout.quant, cfg.algo.name, cfg.env_pool.type, cfg.placement.mode) == \
        ("textworld_express", "w8a8_kv8", "interq", "process", "single")
    pipe = load_config([], config_name="pipeline")
    assert (pipe.sft.num_demos, pipe.sft.epochs, pipe.algo.loss_agg) == (64, 4, "seq_mean")
    assert pipe.env.name == cfg.env.name and pipe.algo.name == cfg.algo.name


def test_cli_rejects_before_building_anything(tmp_path):
    p = run_cli(["train", "trainer.steps=-1", f"trainer.out_dir={tmp_path / 'r'}"], timeout=120)
    assert p.returncode == 2 and "trainer.steps=-1" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, named", [
    (["config", "trainer=3"], "agentq: Config group override must be a string or a list. Got int"),
    (["config", "trainer.steps=${nope}"], "agentq: trainer.steps: Interpolation key 'nope' not found"),
    (["config", "device=foo"], "device='foo' (str): must be cpu, cuda, cuda:N or auto"),
])
def test_cli_names_composition_and_value_errors_in_one_line(args, named):
    p = run_cli(args, timeout=120)
    assert p.returncode == 2 and named in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]


def test_truncated_weight_file_is_named(tiny_model_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir, ckpt)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    p = run_cli(["eval", f"checkpoint={ckpt}", "eval.num_tasks=1", "env_pool=inline", f"eval.out_dir={tmp_path / 'e'}"],
                timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert f"weight file {weights} is damaged or truncated" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_checkpoint_without_weights_is_named(tiny_model_dir, tmp_path, capsys, command):
    """A folder with config.json and a tokenizer but no weight file (an interrupted copy) used to end
    in transformers' FileNotFoundError traceback once the model was built."""
    from agentq.cli import main

    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    (ckpt / "model.safetensors").unlink()
    key = "checkpoint" if command == "eval" else "model.path"
    out = tmp_path / "out"
    out_key = "eval.out_dir" if command == "eval" else "trainer.out_dir"     # each command refuses the other's
    assert main([command, f"{key}={ckpt}", "env_pool=inline", f"{out_key}={out}"]) == 2
    err = capsys.readouterr().err
    assert f"{ckpt} has a config.json but no weights" in err and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("overrides,data,named", [
    (["env=webshop", "env.kwargs.num_products=20"], None,
     "agentq: env=webshop: num_products must be at least 39 (one per product type), got 20"),
    # the held-out split's data is checked at the start: it was the final evaluation's traceback, after the run
    (["env=alfworld"], "/nowhere", "agentq: env.eval_split='valid_unseen': ALFWorld split 'valid_unseen' not found"),
])
def test_an_env_that_refuses_its_settings_stops_train_in_one_line(tiny_model_dir, tmp_path, capsys, monkeypatch,
                                                                  overrides, data, named):
    from agentq.cli import main

    if data:
        monkeypatch.setenv("ALFWORLD_DATA", data)
    out = tmp_path / "run"
    assert main(["train", *overrides, f"model.path={tiny_model_dir}", "env_pool=inline", "trainer.steps=1",
                 f"trainer.out_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert named in " ".join(err.split()) and "Traceback" not in err, err[-2000:]
    assert not out.exists()


@pytest.mark.parametrize("eval_every,listed", [(1, ["train", "test"]), (-1, ["train"])])
def test_the_held_out_split_is_listed_at_start_only_when_the_run_evaluates(tiny_model_dir, tmp_path, monkeypatch,
                                                                        eval_every, listed):
    """trainer.eval_every=-1 evaluates nothing: its held-out split (ALFWorld's valid_unseen needs the
    downloaded games) must not stop a run that trains on generated games. A run that evaluates lists
    it once, at the start (`build.split_tasks`): the trainer's own list and its evaluations' choice of
    tasks read that listing (ALFWorld's real splits were listed twice). Counted at the env's own listing, whoever asks for it."""
    from agentq.config import load_config
    from agentq.envs import TextEnv
    from agentq.trainer.rl import RLTrainer

    seen, list_tasks = [], TextEnv.list_tasks
    monkeypatch.setattr(TextEnv, "list_tasks", lambda env, split=None: seen.append(split) or list_tasks(env, split))
    cfg = load_config([f"model.path={tiny_model_dir}", "env_pool=inline", f"trainer.eval_every={eval_every}",
                       f"trainer.out_dir={tmp_path / 'run'}", "trainer.tasks_per_step=1", "trainer.group_size=2"])
    trainer = RLTrainer(cfg)
    trainer.pool.close()
    assert seen == listed
    if "test" in listed:          # the evaluations' choice of tasks reads that listing, not the env again
        from agentq.eval.evaluate import choose_eval_tasks

        assert len(choose_eval_tasks(cfg, trainer.eval_split, 3).tasks) == 3
        assert seen == listed


@pytest.mark.parametrize("command", ["train", "sft", "pipeline"])
def test_float16_is_refused_by_every_command_that_trains(tmp_path, capsys, command):
    """AdamW's eps (1e-8) rounds to 0 in float16: the learner's first step wrote NaN into every weight
    whose gradient was 0 (the next RL step's episodes all ended on NaN log-probs)."""
    import torch

    from agentq.cli import main

    p = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))       # the cause, as torch computes it
    opt = torch.optim.AdamW([p], lr=1e-6)
    p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.isnan(p).all()
    out = tmp_path / "out"
    out_key = {"train": "trainer.out_dir", "sft": "sft.out_dir", "pipeline": "pipeline.out_dir"}[command]
    assert main([command, "dtype=float16", f"{out_key}={out}", "env_pool=inline"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert ("agentq: dtype=float16: the learner's AdamW keeps float16 weights and moments, whose eps (1e-8) rounds to "
            "0 in float16" in err and "Traceback" not in err), err
    assert not out.exists()
