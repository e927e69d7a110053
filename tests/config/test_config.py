"""Every YAML in conf/ composes; every algo preset composes with every environment; bad keys and
bad choices fail with the valid ones listed."""
import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from agentq.config import ConfigError, load_config
from conftest import one_task_env

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUPS = {g.name: sorted(p.stem for p in g.glob("*.yaml")) for g in CONF.iterdir() if g.is_dir() and g.name != "__pycache__"}


def test_groups_exist():
    assert set(GROUPS) == {"env", "model", "rollout", "algo", "trainer", "env_pool", "placement"}
    assert {"bf16", "flashrl_tis", "ais", "qurl", "qat", "qat_tis", "qat_ais", "interq", "tbpo"} <= set(GROUPS["algo"])


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_yaml_composes(group, option):
    """Every value the option's file sets (read here with plain YAML) is the composed config's value
    (an interpolation `${a.b}`: the value of a.b)."""
    import yaml

    extra = ["model.path=/some/ckpt"] if (group, option) == ("model", "hf") else []
    cfg = load_config([f"{group}={option}", *extra])
    assert cfg[group] is not None
    text = (CONF / group / f"{option}.yaml").read_text()
    raw = yaml.safe_load(text) or {}
    raw.pop("defaults", None)
    package = "" if "@package _global_" in text else f"{group}."

    def leaves(d, pre):
        for k, v in d.items():
            yield from leaves(v, f"{pre}{k}.") if isinstance(v, dict) and v else [(f"{pre}{k}", v)]
    checked = 0
    for key, want in leaves(raw, package):
        if extra and key == "model.path":
            want = "/some/ckpt"
        elif isinstance(want, str) and want.startswith("${") and want.endswith("}"):
            want = OmegaConf.select(cfg, want[2:-1])
        got = OmegaConf.select(cfg, key)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        assert got == want, (key, got, want)
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("env", GROUPS["env"])
@pytest.mark.parametrize("algo", GROUPS["algo"])
def test_every_preset_composes_with_every_env(env, algo):
    from agentq.envs import REGISTRY

    cfg = load_config([f"env={env}", f"algo={algo}"])
    # a variant (textworld_express_mapreader) names the registry entry it configures
    assert cfg.env.name in REGISTRY and env.startswith(cfg.env.name) and cfg.algo.name == algo
    assert cfg.rollout.quant == ("none" if algo == "bf16" else "w8a8_kv8")
    assert cfg.algo.learner_quant in ("aligned", "none")
    from agentq.algos import make_objective

    make_objective(cfg.algo.objective, clip_eps=cfg.algo.clip_eps, dual_clip=cfg.algo.dual_clip,
                   kl_coef=cfg.algo.kl_coef, **(cfg.algo.objective_params or {}))


def test_env_configs_share_one_schema():
    base = set(load_config(["env=textworld_express"]).env.keys())
    for env in GROUPS["env"]:
        cfg = load_config([f"env={env}"])
        assert set(cfg.env.keys()) == base, env
        assert set(cfg.env.prompt.keys()) == {"system", "first_turn", "next_turn", "actions", "max_obs_chars"}, env
        assert cfg.env.eval_split != cfg.env.train_split
    # two configs of one env set the same constructor arguments (mapreader lacked the JVM's limits)
    kwargs: dict = {}
    for env in GROUPS["env"]:
        cfg = load_config([f"env={env}"])
        keys = kwargs.setdefault(cfg.env.name, set(cfg.env.kwargs.keys()))
        assert set(cfg.env.kwargs.keys()) == keys, (env, keys ^ set(cfg.env.kwargs.keys()))


def test_env_label_names_the_tasks_an_env_config_chooses():
    """Both TextWorldExpress configs are `name: textworld_express`; titles named them alike."""
    from agentq.config import env_label

    labels = {env: env_label(load_config([f"env={env}"]).env) for env in ("textworld_express", "textworld_express_mapreader",
                                                                           "alfworld", "scienceworld", "webshop")}
    assert labels == {"textworld_express": "textworld_express[coin]", "textworld_express_mapreader":
                      "textworld_express[mapreader]", "alfworld": "alfworld", "scienceworld": "scienceworld",
                      "webshop": "webshop"}
    assert env_label({"name": "alfworld", "kwargs": {"task_types": ["pick_and_place", "clean"]}}) == \
        "alfworld[pick_and_place, clean]"
    assert env_label({"name": "scienceworld", "kwargs": {"tasks": "boil"}}) == "scienceworld[boil]"
    assert env_label(None) == env_label({}) == "?"


def test_a_grpo_group_of_one_is_refused():
    """Every advantage of a group of one is 0 (docs/algorithms.md): `trainer.group_size=1` ran and
    logged loss 0.0000 at every step, training nothing but the KL term."""
    with pytest.raises(ConfigError, match=re.escape("trainer.group_size=1 (int): must be an integer >= 2 (a GRPO "
                                                    "group of one has advantage 0")):
        load_config(["trainer.group_size=1"])
    assert load_config(["trainer.group_size=2"]).trainer.group_size == 2


def test_cli_override_of_rollout_wins_over_the_preset():
    assert load_config(["algo=qat", "rollout=bf16"]).rollout.quant == "none"
    assert load_config(["algo=bf16", "rollout=w8a8_kv8"]).rollout.quant == "w8a8_kv8"


def test_unknown_keys_and_choices_list_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer.stepz'; valid keys under trainer: \[.*'steps'"):
        load_config(["trainer.stepz=3"])
    with pytest.raises(ConfigError, match=r"Available options in 'env'"):
        load_config(["env=nethack"])
    with pytest.raises(ConfigError, match=r"valid keys under <root>"):
        load_config(["learning_rate=3"])


@pytest.mark.parametrize("override, where", [("+trainer.lerning_rate=1e-5", "trainer"), ("+trainer.foo=1", "trainer"),
                                             ("++trainer.foo=1", "trainer"), ("+foo=1", "<root>"),
                                             ("+env.prompt.footer=x", "env.prompt")])
def test_a_plus_override_that_adds_a_key_nothing_reads_is_refused(override, where):
    """Hydra's `+key=value` adds a key: outside the sections agentq hands on whole, nothing read it and
    the run went on without it, silently (the README says unknown keys fail)."""
    key = override.split("=", 1)[0].lstrip("+")
    with pytest.raises(ConfigError) as e:
        load_config([override])
    said = str(e.value)
    assert said.startswith(f"unknown config key {key!r}; valid keys under {where}: [") and "\n" not in said
    assert said.endswith("(`+` adds a key only under env.kwargs or algo.objective_params, whose keys agentq hands "
                         "on to the env class and the objective)")
    if where == "trainer":
        assert "'lr'" in said           # the key meant is in the list


def test_plus_adds_keys_where_agentq_hands_them_on():
    """env.kwargs (the env class's constructor arguments) and algo.objective_params (the objective's,
    e.g. a cap for a preset with none) take new keys; `++` still overrides a key that exists."""
    cfg = load_config(["+env.kwargs.render_mode=ansi", "algo=bf16", "algo.objective=tis",
                       "+algo.objective_params.is_cap=2.0", "++trainer.steps=3", "model=hf", "++model.path=/some/ckpt"])
    assert (cfg.env.kwargs.render_mode, cfg.algo.objective_params.is_cap, cfg.trainer.steps) == ("ansi", 2.0, 3)
    assert cfg.model.path == "/some/ckpt"


def test_an_unquoted_tilde_says_how_to_quote_it_and_a_quoted_one_is_expanded(monkeypatch):
    """`model.path=~/x` (the shell leaves a ~ after `key=` as it is) was Hydra's
    "LexerNoViableAltException: model.path=~/x ^"; quoted, ~ stayed a literal folder name."""
    with pytest.raises(ConfigError) as e:
        load_config(["model.path=~/x"])
    assert str(e.value) == ("'model.path=~/x': Hydra reads ~ in a value only inside quotes: write 'model.path=\"~/x\"' "
                            "(single quotes around the whole keep the shell from removing the double ones); agentq "
                            "expands a leading ~ in its path settings")
    from agentq.config import PATH_KEYS

    monkeypatch.setenv("HOME", "/home/someone")
    cfg = load_config([f'{key}="~/{key}"' for key in PATH_KEYS], config_name="sweep")
    assert [OmegaConf.select(cfg, key) for key in PATH_KEYS] == [f"/home/someone/{key}" for key in PATH_KEYS]
    assert load_config(['env.prompt.system="a ~ b"']).env.prompt.system == "a ~ b"     # only paths are expanded


def test_a_choice_that_does_not_exist_is_one_line_with_the_options():
    with pytest.raises(ConfigError) as e:
        load_config(["env=alfwrld"])
    assert "\n" not in str(e.value) and "Could not find 'env/alfwrld'" in str(e.value)
    # each built-in is listed; a user's conf/env/myenv.yaml (docs/adding-an-environment.md) may sit among them
    options = str(e.value).split("Available options in 'env': ", 1)[1]
    for name in ("alfworld", "scienceworld", "textworld_express", "textworld_express_mapreader", "webshop"):
        assert f"'{name}'" in options, name


@pytest.mark.parametrize("arg, named", [
    ("--steps=3", "'--steps=3': agentq takes section.key=value overrides, not flags (e.g. steps=3"),
    ("-x", "'-x': agentq takes section.key=value overrides, not flags"),
    # Hydra's way to see the config (`--cfg job`) points at agentq's (`agentq config`)
    ("--cfg", "'--cfg': agentq takes section.key=value overrides, not Hydra's flags; `agentq config <overrides>` "
              "prints the composed config"),
    ("trainer.steps", "'trainer.steps' has no value: write trainer.steps=<value>"),
])
def test_an_argument_that_is_not_an_override_is_one_line(arg, named):
    """Hydra's parse error was three lines of grammar ("LexerNoViableAltException: -x" under a caret)."""
    with pytest.raises(ConfigError) as e:
        load_config([arg])
    assert named in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name, named", [
    ("nethack", "env.name='nethack': unknown environment 'nethack'; valid names: ['alfworld'"),
    ("no_such_module:Env", "env.name='no_such_module:Env': No module named 'no_such_module'"),
    ("gymnasium.envs.classic_control:CartPoleEnv", "is CartPoleEnv, not an agentq TextEnv subclass"),
])
def test_an_env_name_that_names_no_text_env_is_a_config_error(name, named):
    """Before, a bad env.name was a traceback from inside the first env's construction (the tiny
    model's corpus, the env workers), after the run folder was made."""
    with pytest.raises(ConfigError) as e:
        load_config([f"env.name={name}"])
    assert named in str(e.value)
    assert load_config(["env.name=agentq/TextWorldExpress-v0"]).env.name == "agentq/TextWorldExpress-v0"


def test_pipeline_config_overrides_the_base():
    base, pipe = load_config([]), load_config([], config_name="pipeline")
    assert pipe.trainer.group_size == 8 and pipe.eval.temperature == 1.0 and pipe.pipeline.eval_tasks == 200
    assert base.trainer.group_size == 4 and base.eval.temperature == 0.0
    assert set(pipe.keys()) == set(base.keys())
    assert load_config(["trainer.steps=3"], config_name="pipeline").trainer.steps == 3


def test_a_default_run_and_a_pipeline_checkpoint_on_the_way_and_a_sweep_at_the_end():
    """trainer.save_every was 0 (the final checkpoint only): Ctrl-C in step 19 of the default 20 left
    nothing for trainer.resume. Now every 5 steps, the last 2 kept, in `agentq train` and the pipeline's
    RL stage (which `agentq train trainer.resume=<pipeline>/rl` continues); a sweep starts an unfinished
    arm again from the SFT checkpoint, so its arms save only at the end."""
    train, pipe = load_config([]).trainer, load_config([], config_name="pipeline").trainer
    sweep = load_config([], config_name="sweep").trainer
    assert (train.steps, train.save_every, train.keep_checkpoints) == (20, 5, 2)
    assert (pipe.steps, pipe.save_every, pipe.keep_checkpoints) == (32, 5, 2)
    assert (sweep.save_every, sweep.keep_checkpoints) == (0, 2)


def test_tiny_model_cache_key_names_only_what_the_corpus_reads():
    from agentq.build import tiny_corpus_key

    base = tiny_corpus_key(load_config([]))
    assert tiny_corpus_key(load_config(["agent.invalid_action_penalty=0.5", "trainer.lr=1e-3"])) == base
    assert tiny_corpus_key(load_config(["env.prompt.system=Play."])) != base
    # the corpus plays env.train_split only: the pipeline's eval split must not swap the base model
    assert tiny_corpus_key(load_config(["env.eval_split=dev"])) == base
    assert tiny_corpus_key(load_config(["env.train_split=dev"])) != base
    assert tiny_corpus_key(load_config(["agent.action_tag=act"])) != base
    # how the env runs, not what it plays: a JVM heap or timeout, the reply budget, rebuilt the same model
    assert tiny_corpus_key(load_config(["env.kwargs.jvm_heap=2g", "env.kwargs.call_timeout_s=90",
                                        "env.max_new_tokens=31"])) == base
    assert tiny_corpus_key(load_config(["env.max_context_tokens=4096"])) != base      # the model's positions
    assert tiny_corpus_key(load_config(["env.max_steps=3"])) != base                  # the episodes played


def test_tiny_model_cache_key_follows_the_env_classs_source_file(tmp_path, monkeypatch):
    """A plugin author edits the env's text: the old key (its config alone) kept the old tokenizer."""
    import hashlib
    import json
    from pathlib import Path

    from agentq.build import env_code_digest, tiny_corpus_key

    src = "from agentq.envs import TaskStep, TextEnv\n" + one_task_env("Edited", ("train", "heldout"))
    (tmp_path / "edited_env.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config([])
    cfg.env.name, cfg.env.train_split, cfg.env.kwargs = "edited_env:Edited", "train", {}
    before = tiny_corpus_key(cfg)
    assert env_code_digest("edited_env:Edited") == hashlib.sha256(src.encode()).hexdigest()
    assert json.loads(before)["env_code"] == hashlib.sha256(src.encode()).hexdigest()
    (tmp_path / "edited_env.py").write_text(src.replace('"start"', '"a new room"'))
    assert tiny_corpus_key(cfg) != before
    twx = Path(__file__).parents[2] / "envs" / "textworld_express" / "env.py"
    assert env_code_digest("textworld_express") == hashlib.sha256(twx.read_bytes()).hexdigest()


def test_training_refuses_truncated_or_greedy_sampling_but_eval_may_use_it():
    from agentq.build import learner_temperature

    assert learner_temperature(load_config(["rollout.temperature=0.7"])) == 0.7
    with pytest.raises(ValueError, match="rollout.top_k=5"):
        learner_temperature(load_config(["rollout.top_k=5"]))
    with pytest.raises(ValueError, match="rollout.top_p=0.9"):
        learner_temperature(load_config(["rollout.top_p=0.9"]))
    with pytest.raises(ValueError, match="rollout.temperature=0"):
        learner_temperature(load_config(["rollout.temperature=0"]))
    # evaluation samples as it is told (eval.temperature, top-k / top-p): it builds no learner
    assert load_config(["eval.temperature=0.3", "rollout.top_k=5"]).eval.temperature == 0.3


def test_learner_quant_takes_a_partial_preset():
    from agentq.build import quant_specs

    rollout, learner = quant_specs(load_config(["algo=qat", "algo.learner_quant=w8a8"]))
    assert rollout.kv_quantized and learner.linear_quantized and not learner.kv_quantized
    assert quant_specs(load_config(["algo=qat"]))[1] == rollout
    # refused at start-up (config_schema), and by quant_specs for a config changed after it
    with pytest.raises(ConfigError, match=r"algo.learner_quant='int3' \(str\): must be one of \['aligned', 'kv8'"):
        load_config(["algo=qat", "algo.learner_quant=int3"])
    cfg = load_config(["algo=qat"])
    OmegaConf.update(cfg, "algo.learner_quant", "int3")
    with pytest.raises(ConfigError, match=r"algo.learner_quant='int3'; valid: \['aligned', 'kv8', 'none', 'w8a8'"):
        quant_specs(cfg)


def _changed(overrides: list[str], key: str, value):
    """A config that passed load_config, then changed (as a sweep or a test does): build checks again."""
    cfg = load_config(overrides)
    OmegaConf.update(cfg, key, value)
    return cfg


@pytest.mark.parametrize("key, value, named", [
    ("rollout.quant", "w4", "rollout.quant='w4'; valid: ['kv8', 'none'"),
    ("rollout.backend", "sglang", "rollout.backend='sglang'; valid: ['torch', 'vllm']"),
    ("env_pool.type", "foo", "env_pool.type='foo'; valid: ['inline', 'process', 'ray']"),
    ("model.path", "/nonexistent", "model.path='/nonexistent' is not an HF checkpoint folder (no config.json); "
                                   "no such folder (model.path takes a local folder: nothing is downloaded)"),
    ("dtype", "float8", "dtype='float8'; valid: ['float32', 'bfloat16', 'float16'] or auto"),
])
def test_build_raises_config_errors_naming_the_key(key, value, named):
    from agentq import build

    cfg = _changed([], key, value)
    call = {"rollout.quant": lambda: build.quant_specs(cfg), "env_pool.type": lambda: build.env_pool(cfg, "train", 1),
            "rollout.backend": lambda: build.make_backend(cfg, "/x", torch.device("cpu"), torch.float32, None),
            "model.path": lambda: build.model_path(cfg), "dtype": lambda: build.device_and_dtype(cfg)}[key]
    with pytest.raises(ConfigError, match=re.escape(named)):
        call()


def test_model_hf_without_a_path_is_named():
    from agentq import build

    with pytest.raises(ConfigError, match=r"model.path is not set"):
        build.model_path(load_config(["model=hf"]))


def test_model_hf_without_a_path_is_refused_before_the_cpu_gemm_probe_prints(capsys):
    """`agentq train model=hf` printed the CPU int8 GEMM probe's line, then refused the missing model.path."""
    from agentq.cli import main

    assert main(["train", "model=hf", "device=cpu", "cpu_int_gemm=auto"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "agentq: model.path is not set: give model.path=<HF checkpoint folder> (model=hf has no default)"]


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:7"])
def test_cuda_devices_are_checked_and_get_bf16(device, monkeypatch):
    from agentq import build

    cfg = load_config([f"device={device}"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=f"device={device} but no CUDA device is available"):
        build.device_and_dtype(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    if device == "cuda:7":
        with pytest.raises(ConfigError, match=r"device=cuda:7 but only 2 CUDA device\(s\) are visible"):
            build.device_and_dtype(cfg)
    else:
        assert build.device_and_dtype(cfg) == (torch.device(device), torch.bfloat16)


def test_drop_dotted_removes_nested_keys_and_skips_missing_sections():
    from agentq.config import drop_dotted

    tree = {"a": {"b": 1, "c": {"d": 2, "e": 3}}, "f": 4, "g": None}
    out = drop_dotted(tree, ("a.c.d", "f", "g.h", "x.y.z", "a.b.q"))
    assert out is tree
    assert tree == {"a": {"b": 1, "c": {"e": 3}}, "g": None}


def test_differing_settings_compares_shared_keys_within_sections():
    from agentq.config import differing_settings, in_sections

    assert in_sections("env.kwargs.games", ("env.kwargs",)) and in_sections("env.kwargs", ("env.kwargs",))
    assert not in_sections("env.kwargsx", ("env.kwargs",)) and not in_sections("env", ("env.kwargs",))
    assert in_sections("wandb.project", ("wandb.",)) and not in_sections("wandbx", ("wandb.",))
    saved = OmegaConf.create({"env": {"name": "a", "kwargs": {"games": ["coin"], "old": 1}, "max_steps": 5},
                              "trainer": {"lr": 1e-5, "out_dir": "x"}})
    now = OmegaConf.create({"env": {"name": "b", "kwargs": {"games": ["mapreader"]}, "max_steps": 9},
                            "trainer": {"lr": 2e-5, "out_dir": "y", "new": 3}})
    # one side only: env.kwargs.old (a `+` key an env reads: compared, as unset on the other side);
    # trainer.new (another agentq version's key: not compared)
    everything = [(k, repr(a), repr(b)) for k, a, b in differing_settings(saved, now, lambda k: True)]
    assert everything == [("env.kwargs.games", "['coin']", "['mapreader']"), ("env.kwargs.old", "1", "unset"),
                          ("env.max_steps", "5", "9"), ("env.name", "'a'", "'b'"), ("trainer.lr", "1e-05", "2e-05"),
                          ("trainer.out_dir", "'x'", "'y'")]
    assert [k for k, _, _ in differing_settings(saved, now, lambda k: in_sections(k, ("env.name", "env.kwargs")))] == [
        "env.kwargs.games", "env.kwargs.old", "env.name"]


REQUIRES_VOCAB = "from agentq.envs import TaskStep, TextEnv\n" + one_task_env("NeedsVocab", ("train", "heldout"), """
    def __init__(self, vocab, hint_every=2, **kw):
        self.level = kw.pop("level", 1)       # an argument taken from **kwargs: no signature names it
        super().__init__(**kw)
        self.vocab = vocab
""") + one_task_env("Closed", ("train", "heldout"), """
    def __init__(self, split=None, max_steps=None, expert=False, size=3):
        super().__init__(split=split, max_steps=max_steps, expert=expert)
""") + """
import gymnasium as gym
gym.register(id="vocab_ns/Vocab-v0", entry_point=NeedsVocab, kwargs={"vocab": 5})
"""


@pytest.mark.parametrize("overrides,named", [
    (["env.eval_split=validation"], "env.eval_split='validation': not a split of textworld_express; valid: "
                                    "['train', 'dev', 'test']"),
    (["env=alfworld", "env.train_split=train_seen"], "env.train_split='train_seen': not a split of alfworld"),
    (["+env.kwargs.gamez=[coin]"], "env.kwargs: TextWorldExpressEnv takes no argument ['gamez']; did you mean games "
                                   "for gamez?"),
    (["env=vocab"], "env.kwargs: NeedsVocab needs ['vocab'], which nothing sets"),
    # the default env's kwargs (TextWorldExpress's) given to another env's class
    (["env.name=vocab_env:NeedsVocab", "env.train_split=train", "env.eval_split=heldout"],
     "NeedsVocab needs ['vocab'], which nothing sets"),
    # an __init__ without **kwargs: an argument it does not name is certainly unknown
    (["env=vocab", "env.name=vocab_env:Closed", "+env.kwargs.sise=3"],
     "Closed takes no argument ['sise']; did you mean size for sise?"),
])
def test_env_splits_and_constructor_arguments_are_checked_before_anything_runs(tmp_path, monkeypatch, overrides,
                                                                              named):
    """A split the env does not have, or an argument its constructor does not take (or needs), was a
    traceback from the first env built, inside a worker (an eval_split one only at the final eval,
    after the whole run)."""
    (tmp_path / "vocab_env.py").write_text(REQUIRES_VOCAB)
    monkeypatch.syspath_prepend(str(tmp_path))
    conf = tmp_path / "conf" / "env"
    conf.mkdir(parents=True)          # the env's own config, as docs/adding-an-environment.md has it
    base = load_config(["env=textworld_express"]).env
    (conf / "vocab.yaml").write_text(OmegaConf.to_yaml({**OmegaConf.to_container(base), "name": "vocab_env:NeedsVocab",
                                                        "kwargs": {}, "train_split": "train", "eval_split": "heldout"}))
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    with pytest.raises(ConfigError) as e:
        load_config([*overrides, search])
    assert named in str(e.value)
    # the same env with its arguments right composes
    assert load_config(["env=vocab", "+env.kwargs.vocab=3", search]).env.kwargs.vocab == 3


def test_a_split_refusal_after_env_name_on_another_envs_config_says_the_splits_came_with_it(tmp_path, monkeypatch):
    """`env.name=my_env:MyEnv` alone keeps the default (TextWorldExpress) config's eval_split 'test', which the
    user never set: the refusal says where it came from and how to set the splits, as the kwargs refusal does;
    a split the user set on the env's own config is refused without it."""
    (tmp_path / "vocab_env.py").write_text(REQUIRES_VOCAB)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as e:
        load_config(["env.name=vocab_env:Closed"])
    assert str(e.value) == (
        "env.eval_split='test': not a split of vocab_env:Closed; valid: ['train', 'heldout'] (where env.name was "
        "set on another env's config, its splits reached this class: set env.train_split / env.eval_split to its "
        "splits, or pick your env's own config, env=<name>: a conf/env/<name>.yaml of its own, "
        "docs/adding-an-environment.md)")
    with pytest.raises(ConfigError) as e:
        load_config(["env.eval_split=validation"])
    assert str(e.value) == "env.eval_split='validation': not a split of textworld_express; valid: ['train', 'dev', 'test']"
    with pytest.raises(ConfigError) as e:       # the kwargs refusal's explanation is the same one
        load_config(["env.name=vocab_env:NeedsVocab", "env.train_split=train", "env.eval_split=heldout"])
    assert str(e.value) == (
        "env.kwargs: NeedsVocab needs ['vocab'], which nothing sets. env.kwargs come with the env= config (where "
        "env.name was set on another env's config, its kwargs reached this class: pick your env's own config, "
        "env=<name>: a conf/env/<name>.yaml of its own, docs/adding-an-environment.md)")


def test_an_argument_an_env_may_take_from_its_kwargs_is_a_warning_and_registration_kwargs_count(
        tmp_path, monkeypatch, capfd):
    """NeedsVocab takes `level` out of **kw itself: no signature names it, so the check warns instead of
    refusing (it builds fine). A required argument the Gymnasium registration fills in is not missing."""
    import agentq.envs as envs

    (tmp_path / "vocab_env.py").write_text(REQUIRES_VOCAB)
    monkeypatch.syspath_prepend(str(tmp_path))
    conf = tmp_path / "conf" / "env"
    conf.mkdir(parents=True)
    base = load_config(["env=textworld_express"]).env
    (conf / "vocab.yaml").write_text(OmegaConf.to_yaml({**OmegaConf.to_container(base), "name": "vocab_env:NeedsVocab",
                                                        "kwargs": {"vocab": 3}, "train_split": "train",
                                                        "eval_split": "heldout"}))
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    capfd.readouterr()
    assert load_config(["env=vocab", "+env.kwargs.level=2", search]).env.kwargs.level == 2
    said = " ".join(capfd.readouterr().err.split())
    assert ("warning: env.kwargs: NeedsVocab takes no argument ['level']" in said
            and "fine if your env takes it from **kwargs itself" in said), said
    assert envs.make("vocab_env:NeedsVocab", vocab=3, level=2).unwrapped.level == 2        # and it builds
    assert envs.kwargs_problem("vocab_env:vocab_ns/Vocab-v0", {"split": "train"}) is None   # vocab from register()
    assert envs.kwargs_problem("vocab_env:NeedsVocab", {"split": "train"}) == (
        "NeedsVocab needs ['vocab'], which nothing sets", True)


def test_a_key_a_newer_config_spells_out_at_its_default_is_no_difference():
    """mapreader's config gained jvm_heap / call_timeout_s at the env's own defaults: a run saved
    without them is the same run (a sweep resume was refused, eval warned); a value off the default,
    or a + key with no default, still counts."""
    from agentq import build
    from agentq.config import UNSET, differing_settings

    now = load_config(["env=textworld_express_mapreader", "algo=interq"])
    saved = OmegaConf.to_container(now)
    del saved["env"]["kwargs"]["jvm_heap"], saved["env"]["kwargs"]["call_timeout_s"]
    saved["algo"]["objective_params"].pop("budget_B")
    with_defaults = lambda k: build.setting_default(now, k)        # noqa: E731
    assert build.setting_default(now, "env.kwargs.jvm_heap") == "1g"
    assert build.setting_default(now, "env.kwargs.no_such") is UNSET
    assert differing_settings(OmegaConf.create(saved), now, lambda k: True, default=with_defaults) == []
    saved["env"]["kwargs"]["jvm_heap"] = "2g"
    saved["env"]["kwargs"]["extra"] = 1
    assert [(k, repr(a), repr(b)) for k, a, b in differing_settings(OmegaConf.create(saved), now, lambda k: True,
                                                                     default=with_defaults)] == [
        ("env.kwargs.extra", "1", "unset"), ("env.kwargs.jvm_heap", "'2g'", "'1g'")]


def test_an_env_config_with_a_key_missing_or_one_too_many_is_named(tmp_path):
    """A config of one's own without prompt.first_turn (or max_context_tokens, ...) composed, and the run
    then died in an omegaconf traceback inside the tiny model's build; a misspelt key (`max_step`) was
    ignored. Both are now one line naming the keys."""
    conf = tmp_path / "conf" / "env"
    conf.mkdir(parents=True)
    base = OmegaConf.to_container(load_config(["env=textworld_express"]).env)
    short = {k: v for k, v in base.items() if k not in ("kwargs", "max_context_tokens")}
    short["prompt"] = {k: v for k, v in base["prompt"].items() if k != "first_turn"}
    (conf / "short.yaml").write_text(OmegaConf.to_yaml(short))
    (conf / "extra.yaml").write_text(OmegaConf.to_yaml({**base, "max_step": 3,
                                                         "prompt": {**base["prompt"], "invalid": "x"}}))
    (conf / "whole.yaml").write_text(OmegaConf.to_yaml(base))
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    wanted = (". Every env config has the keys ['name', 'kwargs', 'max_steps', 'train_split', 'eval_split', "
              "'max_context_tokens', 'max_new_tokens', 'prompt'], with prompt's ['system', 'first_turn', 'next_turn', "
              "'actions', 'max_obs_chars'], as conf/env/textworld_express.yaml (docs/adding-an-environment.md)")
    with pytest.raises(ConfigError) as e:
        load_config(["env=short", search])
    assert str(e.value) == ("env=short: its config (env/short.yaml) lacks ['kwargs', 'max_context_tokens', "
                            "'prompt.first_turn']" + wanted)
    with pytest.raises(ConfigError) as e:
        load_config(["env=extra", search])
    assert str(e.value) == ("env=extra: its config (env/extra.yaml) has keys agentq does not read ['max_step', "
                            "'prompt.invalid']" + wanted)
    assert load_config(["env=whole", search]).env.max_context_tokens == base["max_context_tokens"]


@pytest.mark.parametrize("override, instead", [
    ("~trainer.steps", "set another value instead"), ("~trainer.steps=20", "set another value instead"),
    ("~eval", "set another value instead"), ("~env.kwargs", "set another value instead"),
    ("~env", "pick another option instead (env=<option>)"),
])
def test_removing_a_key_agentq_reads_is_one_line(override, instead):
    """Hydra's `~trainer.steps` composed, and the first read of the key was omegaconf's "Key 'steps'
    is not in struct", a traceback from deep inside the run."""
    key = override[1:].split("=", 1)[0]
    with pytest.raises(ConfigError) as e:
        load_config([override])
    assert str(e.value) == (f"{override!r}: {key} cannot be removed: agentq reads it (`~` removes a key only under "
                            f"env.kwargs or algo.objective_params); {instead} (`agentq config` prints every key)")


def test_setting_a_new_key_where_agentq_hands_keys_on_says_plus_adds_it():
    """`env.kwargs.foo=1` listed the keys there and stopped: the fix, Hydra's `+`, is named (where a
    key can be added at all: under env.kwargs and algo.objective_params)."""
    with pytest.raises(ConfigError) as e:
        load_config(["env.kwargs.foo=1"])
    assert str(e.value) == ("unknown config key 'env.kwargs.foo'; valid keys under env.kwargs: ['call_timeout_s', "
                            "'game_params', 'games', 'jvm_heap', 'tasks_per_game']; `+env.kwargs.foo=...` adds it "
                            "(agentq hands env.kwargs on to the env class)")
    # with algo.objective set on the command line, the preset's keys are not that objective's parameters
    with pytest.raises(ConfigError, match=r"; `\+algo.objective_params.bogus=...` adds it \(agentq hands "
                                          r"algo.objective_params on to the objective\)$"):
        load_config(["algo.objective=tis", "algo.objective_params.bogus=1"])
    with pytest.raises(ConfigError) as e:
        load_config(["trainer.stepz=1"])
    assert "adds it" not in str(e.value)                 # elsewhere a new key is a typo, not an argument


def test_a_parameter_the_presets_objective_lacks_names_the_presets_whose_objective_takes_it():
    """`algo=qat algo.objective_params.is_cap=3` said `+algo.objective_params.is_cap=...` adds it, and
    the objective (grpo) then refused the added key: each preset lists all its objective's parameters,
    so the error names the objective, its parameters and the presets that take the key instead."""
    with pytest.raises(ConfigError) as e:
        load_config(["algo=qat", "algo.objective_params.is_cap=3"])
    assert str(e.value) == ("unknown config key 'algo.objective_params.is_cap'; algo=qat's objective 'grpo' takes no "
                            "parameter is_cap (its parameters: []); presets whose objective takes is_cap: ['ais', "
                            "'flashrl_tis', 'qat_ais', 'qat_tis', 'qurl']")
    with pytest.raises(ConfigError) as e:
        load_config(["algo.objective_params.bogus=1"])
    assert str(e.value) == ("unknown config key 'algo.objective_params.bogus'; algo=interq's objective 'interq' takes "
                            "no parameter bogus (its parameters: ['budget_B', 'H_floor', 'budget_scope', "
                            "'prefix_inclusive', 'k3_max', 'renorm_retention', 'token_tis_cap']); no preset's "
                            "objective takes bogus")


def test_tilde_removes_a_key_where_agentq_hands_keys_on():
    """The env class and the objective take their own default for a key removed there; a key that is
    not there was Hydra's bare "Could not delete from config. 'env.kwargs.size' does not exist.", which
    named none of the keys there: now they are listed, as for a misspelt key."""
    assert "games" not in load_config(["~env.kwargs.games"]).env.kwargs
    assert "k3_max" not in load_config(["~algo.objective_params.k3_max"]).algo.objective_params
    with pytest.raises(ConfigError) as e:
        load_config(["~env.kwargs.size"])
    assert str(e.value) == ("unknown config key 'env.kwargs.size'; valid keys under env.kwargs: ['call_timeout_s', "
                            "'game_params', 'games', 'jvm_heap', 'tasks_per_game'] (`~` removes a key that is there)")
    with pytest.raises(ConfigError, match=r"^unknown config key 'trainer.stepz'; valid keys under trainer: \["):
        load_config(["~trainer.stepz"])
    # Hydra says "does not exist" of a key whose value is null, too
    with pytest.raises(ConfigError) as e:
        load_config(["~env.kwargs.tasks_per_game"])
    assert str(e.value) == ("'~env.kwargs.tasks_per_game': Hydra does not remove a key whose value is null, as "
                            "env.kwargs.tasks_per_game is; set the value you want instead "
                            "(env.kwargs.tasks_per_game=<value>)")


def test_run_folder_state_tells_a_run_in_progress_from_one_that_stopped(tmp_path):
    """The one reading behind "no checkpoint yet" (checkpoint=) and "no results yet" (`agentq report`):
    held by a process (its pid), stopped after writing its settings (which file), or neither."""
    import os

    from agentq.config import run_folder_state
    from agentq.utils.folder_lock import lock_folder

    assert run_folder_state(tmp_path / "nosuch") is None
    assert run_folder_state(tmp_path) is None                                  # an empty folder is no run
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "config.yaml").write_text("seed: 0\n")
    assert run_folder_state(tmp_path) == ("stopped", "sft/config.yaml")        # a pipeline stopped in SFT
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    assert run_folder_state(tmp_path) == ("stopped", "config.yaml")            # the run's own settings first
    held = lock_folder(tmp_path, lambda pid: AssertionError(pid))
    try:
        assert run_folder_state(tmp_path) == ("held", str(os.getpid()))        # in progress wins over settings
    finally:
        held.close()


def test_a_data_folder_from_an_environment_variable_is_written_into_env_kwargs(tmp_path, monkeypatch):
    """$WEBSHOP_DATA / $ALFWORLD_DATA behind a null data_dir were read by the env alone: config.yaml and
    an evaluation's folder name said nothing of them, so a real-catalog WebShop evaluation replaced a
    generated-catalog one. Composing now writes the folder the env would read into env.kwargs, absolute."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    assert load_config(["env=webshop"]).env.kwargs.data_dir is None              # the generated catalog
    assert load_config(["env=webshop", "env.kwargs=null"]).env.kwargs is None
    assert load_config(["env=webshop", "env.kwargs.data_dir=shop"]).env.kwargs.data_dir == str(tmp_path / "shop")
    monkeypatch.setenv("WEBSHOP_DATA", "real")
    assert load_config(["env=webshop"]).env.kwargs.data_dir == str(tmp_path / "real")
    assert OmegaConf.to_container(load_config(["env=webshop", "env.kwargs=null"]).env.kwargs) == {
        "data_dir": str(tmp_path / "real")}
    assert load_config(["env=webshop", "env.kwargs.data_dir=/given"]).env.kwargs.data_dir == "/given"
    assert load_config(["env=webshop"], pin_env=False).env.kwargs.data_dir is None    # the defaults as written

    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "games"))
    assert load_config(["env=alfworld"]).env.kwargs.data_dir == str(tmp_path / "games")
    # `import alfworld` sets $ALFWORLD_DATA to its own default: that value is no choice of the user's
    monkeypatch.setenv("ALFWORLD_DATA", str(Path("~/.cache/alfworld").expanduser()))
    assert load_config(["env=alfworld"]).env.kwargs.data_dir is None
    assert load_config(["env=alfworld"]).env.kwargs.cache_dir is None              # how it runs: left as it is


def test_an_env_classs_resolved_kwargs_that_raises_is_one_config_line(tmp_path, monkeypatch):
    src = "from agentq.envs import TaskStep, TextEnv\n" + one_task_env("Pinned", ("train", "heldout"), """
    def __init__(self, where=None, **kw):
        super().__init__(**kw)

    @classmethod
    def resolved_kwargs(cls, kwargs):
        if kwargs.get("where") == "bad":
            raise RuntimeError("no such place")
        return {"where": "/abs/" + str(kwargs.get("where"))} if kwargs.get("where") else []
""")
    (tmp_path / "pinned_env.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    base = ["env.name=pinned_env:Pinned", "env.train_split=train", "env.eval_split=heldout", "env.kwargs={}"]
    assert load_config([*base, "+env.kwargs.where=x"]).env.kwargs.where == "/abs/x"
    with pytest.raises(ConfigError, match=r"^env.kwargs: Pinned.resolved_kwargs raised RuntimeError: no such place$"):
        load_config([*base, "+env.kwargs.where=bad"])
    with pytest.raises(ConfigError, match=r"^env.kwargs: Pinned.resolved_kwargs returned a list, not a dict$"):
        load_config(base)
