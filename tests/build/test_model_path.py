"""`model.path` names an HF checkpoint folder. The folder a command printed (an RL run's, an SFT run's,
a pipeline's) is not one: the error names the checkpoint inside it, as `checkpoint=` did already."""
from __future__ import annotations

import re

import pytest
import torch
from omegaconf import OmegaConf

from agentq import build
from agentq.config import ConfigError, load_config


def model_path_error(path) -> str:
    cfg = load_config([])
    OmegaConf.update(cfg, "model.path", str(path))
    with pytest.raises(ConfigError) as e:
        build.model_path(cfg)
    return str(e.value)


def make_checkpoint(folder):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "qwen3"}')


@pytest.mark.parametrize("inside, meant", [
    (["checkpoints/step_000002", "checkpoints/step_000010"], "checkpoints/step_000010"),    # agentq train
    (["checkpoint"], "checkpoint"),                                                        # agentq sft
    (["sft/checkpoint", "rl/checkpoints/step_000032"], "rl/checkpoints/step_000032"),      # agentq pipeline
])
def test_a_run_folder_as_model_path_names_the_checkpoint_inside(tmp_path, inside, meant):
    for sub in inside:
        make_checkpoint(tmp_path / "run" / sub)
    said = model_path_error(tmp_path / "run")
    assert f"model.path='{tmp_path / 'run'}' is not an HF checkpoint folder (no config.json); a run folder? its " \
           f"last checkpoint is model.path={tmp_path / 'run' / meant}" == said


def test_a_hub_id_is_not_downloaded():
    assert model_path_error("Qwen/Qwen3-0.6B").endswith(
        "; no such folder (model.path takes a local folder: nothing is downloaded)")


def test_a_checkpoint_is_taken(tmp_path):
    make_checkpoint(tmp_path / "ckpt")
    cfg = load_config([])
    OmegaConf.update(cfg, "model.path", str(tmp_path / "ckpt"))
    assert build.model_path(cfg) == str(tmp_path / "ckpt")


# ---------------------------------------------------------------------- a user's own checkpoint folder
def save_model(folder, config, tokenizer_from=None):
    """A random-init model of `config` saved as a user would (save_pretrained), with the tokenizer of
    the folder `tokenizer_from` beside it (none: no tokenizer files)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    if tokenizer_from is not None:
        AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(folder)
    return folder


def qwen3(tokenizer_dir, **kw):
    from transformers import AutoTokenizer, Qwen3Config

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    args = dict(vocab_size=((len(tok) + 63) // 64) * 64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.pad_token_id, bos_token_id=None)
    return Qwen3Config(**{**args, **kw})


def hf_cfg(path, *overrides):
    return load_config(["model=hf", f"model.path={path}", "device=cpu", *overrides])


def test_a_gpt2_checkpoint_is_refused_in_one_line_naming_its_architecture(tmp_path, tiny_model_dir, capsys):
    """model.path at a GPT-2 folder ended `agentq train` with a traceback from the aligned learner ("QuantSpec
    quantizes [...] but the model has no such linear layers"), and `agentq eval` with the engine's ValueError."""
    from transformers import GPT2Config

    from agentq.cli import main

    gpt2 = save_model(tmp_path / "gpt2", GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=512, bos_token_id=0, eos_token_id=0), tiny_model_dir)
    said = (f"model.path={str(gpt2)!r} is a model_type='gpt2' checkpoint (architectures ['GPT2LMHeadModel']); the "
            "torch rollout engine runs model_type ['llama', 'qwen2', 'qwen3'] (the Llama / Qwen2 / Qwen3 families): "
            "pick such a checkpoint, or rollout.backend=vllm for an architecture whose linears carry Llama's names "
            "(q/k/v/o_proj, gate/up/down_proj), which the aligned learner quantizes (docs/vllm.md)")
    with pytest.raises(ConfigError) as e:
        build.model_path(hf_cfg(gpt2))
    assert str(e.value) == said
    run = tmp_path / "run"
    assert main(["train", "model=hf", f"model.path={gpt2}", "algo=bf16", "trainer.steps=1", "env_pool=inline",
                 f"trainer.out_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert f"agentq: {said}" in " ".join(err.split()) and "Traceback" not in err
    assert not run.exists()
    with pytest.raises(ConfigError, match=r"^checkpoint='.*gpt2' is a model_type='gpt2' checkpoint"):
        build.make_backend(load_config([f"checkpoint={gpt2}"]), str(gpt2), torch.device("cpu"), torch.float32, None)


def test_a_non_silu_mlp_is_refused(tmp_path, tiny_model_dir):
    gelu = save_model(tmp_path / "gelu", qwen3(tiny_model_dir, hidden_act="gelu"), tiny_model_dir)
    with pytest.raises(ConfigError, match=re.escape(f"model.path={str(gelu)!r} has hidden_act='gelu' in its config.json; "
                                                    "the torch rollout engine runs SiLU MLPs only")):
        build.model_path(hf_cfg(gelu))


def test_a_folder_without_a_tokenizer_is_named(tmp_path, tiny_model_dir):
    """transformers gave such a folder an empty tokenizer (1 token) without a word; the run then failed
    with a traceback saying the tokenizer had no chat template."""
    from agentq.utils.checkpoint import CheckpointError

    bare = save_model(tmp_path / "bare", qwen3(tiny_model_dir))
    assert build.model_path(hf_cfg(bare)) == str(bare)          # the model itself is fine
    with pytest.raises(CheckpointError, match=re.escape(f"{bare} has no tokenizer (none of tokenizer.json, ")):
        build.load_tokenizer(str(bare))



@pytest.mark.parametrize("damage", ["truncated tokenizer.json", "tokenizer_config.json alone"])
def test_a_tokenizer_that_does_not_load_is_named(tmp_path, tiny_model_dir, damage):
    """Each was transformers' traceback (JSONDecodeError / ValueError) at the start of every command."""
    from transformers import AutoTokenizer

    from agentq.utils.checkpoint import CheckpointError

    folder = save_model(tmp_path / "m", qwen3(tiny_model_dir))
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    tj = folder / "tokenizer.json"
    if damage == "truncated tokenizer.json":
        tj.write_text(tj.read_text()[:1000])
    else:
        tj.unlink()
    with pytest.raises(CheckpointError, match=re.escape(f"{folder}: its tokenizer does not load (") + r"\w+: .+\); "
                                              r"save the model's tokenizer again beside its weights"):
        build.load_tokenizer(str(folder))

@pytest.mark.parametrize("damage, why", [
    ("truncated", "not JSON: Unterminated string starting at: line 3 column 5 (char 27)"),
    ("a list", "a JSON list, not an object")])
def test_a_damaged_config_json_is_named_not_the_tokenizer(tmp_path, tiny_model_dir, damage, why):
    """transformers reads config.json to pick the tokenizer's class: a truncated one was refused as
    "its tokenizer does not load", and the user repaired the wrong file."""
    from transformers import AutoTokenizer

    from agentq.utils.checkpoint import CheckpointError

    folder = save_model(tmp_path / "m", qwen3(tiny_model_dir))
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    config = folder / "config.json"
    config.write_bytes(config.read_bytes()[:30] if damage == "truncated" else b"[1, 2]")
    with pytest.raises(CheckpointError) as refused:
        build.load_tokenizer(str(folder))
    size = config.stat().st_size
    assert str(refused.value) == f"config file {config} is damaged or truncated ({size} bytes; {why})"


def test_a_tokenizer_without_a_chat_template_is_one_line(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    folder = save_model(tmp_path / "base", qwen3(tiny_model_dir))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = None
    tok.save_pretrained(folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ConfigError, match=re.escape(f"{folder}: the tokenizer has no chat_template; agentq needs one "
                                                    "to render turns (a base model's tokenizer may have none")):
        build.load_tokenizer(str(folder))


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(tmp_path, tiny_model_dir):
    """It failed mid-run, after the run folder was written: "context ids must be non-empty and in [0, 256)"."""
    from transformers import AutoTokenizer

    n = len(AutoTokenizer.from_pretrained(tiny_model_dir))
    small = save_model(tmp_path / "small", qwen3(tiny_model_dir, vocab_size=256), tiny_model_dir)
    assert n > 256
    with pytest.raises(ConfigError, match=re.escape(f"{small}: its tokenizer has {n} tokens but the model's "
                                                    "vocab_size is 256 (config.json)")):
        build.load_tokenizer(str(small))


@pytest.mark.parametrize("tied, dtype", [(True, "float32"), (False, "bfloat16")])
def test_a_qwen3_checkpoint_tied_or_not_in_either_dtype_is_taken(tmp_path, tiny_model_dir, tied, dtype):
    import json

    ok = save_model(tmp_path / "ok", qwen3(tiny_model_dir, tie_word_embeddings=tied, dtype=dtype), tiny_model_dir)
    saved = json.loads((ok / "config.json").read_text())
    assert (saved["tie_word_embeddings"], saved["dtype"]) == (tied, dtype)
    assert build.model_path(hf_cfg(ok)) == str(ok)
    tok = build.load_tokenizer(str(ok))
    assert tok.eos_token == "<|im_end|>"
    engine = build.make_backend(hf_cfg(ok), str(ok), torch.device("cpu"), torch.float32, tok, max_slots=1)
    assert engine.model.tied is tied
    assert engine.model.embed_tokens.weight.dtype == torch.float32        # the run's dtype, not the file's


def test_a_context_past_the_models_positions_is_said(tmp_path, tiny_model_dir, capsys):
    """A 256-position model ran TextWorldExpress's 1,536-token contexts without a word."""
    short = save_model(tmp_path / "short", qwen3(tiny_model_dir, max_position_embeddings=256), tiny_model_dir)
    tok = build.load_tokenizer(str(short))
    for ctx, warned in [(1536, True), (256, False)]:
        cfg = hf_cfg(short, f"env.max_context_tokens={ctx}")
        build.make_backend(cfg, str(short), torch.device("cpu"), torch.float32, tok, max_slots=1)
        said = " ".join(capsys.readouterr().err.split())
        assert (f"warning: env.max_context_tokens={ctx} is past the model's max_position_embeddings=256 "
                f"({short}/config.json)" in said) is warned



def test_the_tiny_model_built_for_an_env_covers_its_context_budget(monkeypatch):
    """The tiny model's 4,096 positions under WebShop's 6,144-token budget (ALFWorld's 12,288, ...) gave
    the warning above at every default run of those envs, about a label: the model is trained here."""
    from agentq.models import tiny

    built = []
    monkeypatch.setattr(tiny, "ensure_tiny_model", lambda tcfg, key, corpus: built.append(tcfg) or "tiny-x")
    for ctx in (6144, 1024):
        assert build.model_path(load_config([f"env.max_context_tokens={ctx}"])) == "tiny-x"
    assert [t.max_position_embeddings for t in built] == [6144, 4096]

# ---------------------------------------------------------------------- env.kwargs no constructor takes
def test_an_env_kwargs_key_no_constructor_takes_is_a_config_error_naming_it(tmp_path, monkeypatch):
    """An __init__ that hands **kw on may pop a key itself, so the config check only warns of a key no
    signature names (`test_config.py`); when none takes it, building the env was a TypeError traceback
    from inside gymnasium.make. A TypeError of another kind is an env bug and stays one."""
    from conftest import one_task_env

    src = "from agentq.envs import TaskStep, TextEnv\n" + one_task_env("Lenient", ("train", "heldout"), """
    def __init__(self, size=3, **kw):
        super().__init__(**kw)
        if size == 0:
            len(size)          # a bug of the env's own
""")
    (tmp_path / "lenient_env.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(["env.name=lenient_env:Lenient", "env.train_split=train", "env.eval_split=heldout"])
    cfg.env.kwargs = OmegaConf.create({"sise": 3})
    with pytest.raises(ConfigError, match=r"^env=lenient_env:Lenient: TextEnv\.__init__\(\) takes no argument 'sise', "
                                          r"which env\.kwargs\.sise gives it \(raised at registration\.py:\d+\)$"):
        build.make_env(cfg, "train")
    cfg.env.kwargs = OmegaConf.create({"size": 0})
    with pytest.raises(TypeError, match="has no len"):
        build.make_env(cfg, "train")
    cfg.env.kwargs = OmegaConf.create({"size": 4})
    assert build.make_env(cfg, "train").unwrapped.list_tasks("train") == ["a"]


# ---------------------------------------------------------------------- checkpoints the engine and learner would compute apart
def test_a_sliding_window_or_length_dependent_rope_is_refused(tmp_path, tiny_model_dir):
    """A Qwen2 folder with use_sliding_window ran with K3 3e-2 (neither the engine nor the learner has a
    window), one with RoPE type 'dynamic' with K3 1e-6 (the engine's tables are fixed); both without a
    word. Under vLLM too (it would run them; the aligned learner not). The static RoPE types are taken."""
    from transformers import Qwen2Config

    def qwen2(**kw):
        c = qwen3(tiny_model_dir).to_dict()
        c = {k: c[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads", "eos_token_id", "pad_token_id")}
        return Qwen2Config(**c, **kw)

    swa = save_model(tmp_path / "swa", qwen2(use_sliding_window=True, sliding_window=8, max_window_layers=0),
                     tiny_model_dir)
    with pytest.raises(ConfigError, match=re.escape(f"model.path={str(swa)!r} uses sliding-window attention")):
        build.model_path(hf_cfg(swa))
    # vLLM would run the window; the aligned learner would not
    with pytest.raises(ConfigError, match=re.escape(f"model.path={str(swa)!r} uses sliding-window attention (use_"
                                                    "sliding_window / layer_types in its config.json); the aligned "
                                                    "learner attends over the whole context")):
        build.model_path(hf_cfg(swa, "rollout.backend=vllm"))
    dyn = save_model(tmp_path / "dyn", qwen2(rope_scaling={"rope_type": "dynamic", "factor": 4.0}), tiny_model_dir)
    with pytest.raises(ConfigError, match=re.escape(f"model.path={str(dyn)!r} has RoPE type 'dynamic' in its "
                                                    "config.json; the torch rollout engine runs ['default', 'linear', "
                                                    "'yarn', 'llama3']")):
        build.model_path(hf_cfg(dyn))
    with pytest.raises(ConfigError, match=re.escape("config.json; the aligned learner runs ['default'")):
        build.model_path(hf_cfg(dyn, "rollout.backend=vllm"))
    lin = save_model(tmp_path / "lin", qwen2(rope_scaling={"rope_type": "linear", "factor": 2.0}), tiny_model_dir)
    assert build.model_path(hf_cfg(lin)) == str(lin)


def test_a_tied_config_over_a_different_head_is_refused(tmp_path, tiny_model_dir):
    """tie_word_embeddings true over weights with their own lm_head.weight: transformers keeps the two
    apart and the engine tied them (K3 6e-2, no word). The same file with the head equal to the
    embedding is taken."""
    import json

    from safetensors.torch import load_file, save_file

    folder = save_model(tmp_path / "m", qwen3(tiny_model_dir, tie_word_embeddings=False), tiny_model_dir)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    with pytest.raises(ConfigError, match=re.escape(
            f"model.path={str(folder)!r}: its config.json ties the LM head to the embedding (tie_word_embeddings: "
            "true) but its weights hold a different lm_head.weight")):
        build.model_path(hf_cfg(folder))
    with pytest.raises(ConfigError, match="but its weights hold a different lm_head.weight"):
        build.model_path(hf_cfg(folder, "rollout.backend=vllm"))
    weights = load_file(folder / "model.safetensors")
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    assert build.model_path(hf_cfg(folder)) == str(folder)


@pytest.mark.parametrize("edit, said", [
    ("no head", "its weights do not fit its config.json (weights missing for ['lm_head.weight'])"),
    ("fewer layers", "its weights do not fit its config.json (engine has no parameter for "
                     "'model.layers.1.input_layernorm.weight' (model_type=qwen3))"),
    ("wider MLP", "its weights do not fit its config.json (You set `ignore_mismatched_sizes` to `False`"),
])
def test_weights_that_do_not_fit_config_json_are_one_line(tmp_path, tiny_model_dir, capsys, edit, said):
    """A config.json edited after saving, or an untied model whose head is missing from its file: a
    KeyError from the engine's load or transformers' RuntimeError, as tracebacks. Now one line, and no
    run folder."""
    import json

    from safetensors.torch import load_file, save_file

    from agentq.cli import main

    folder = save_model(tmp_path / "m", qwen3(tiny_model_dir, num_hidden_layers=2), tiny_model_dir)
    cfg = json.loads((folder / "config.json").read_text())
    if edit == "no head":
        weights = load_file(folder / "model.safetensors")
        del weights["lm_head.weight"]
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    else:
        change = {"num_hidden_layers": 1, "layer_types": cfg["layer_types"][:1]} if edit == "fewer layers" \
            else {"intermediate_size": 2 * cfg["intermediate_size"]}
        (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    run = tmp_path / "run"
    assert main(["train", "model=hf", f"model.path={folder}", "trainer.steps=1", "env_pool=inline",
                 f"trainer.out_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert f"agentq: {folder}: {said}" in err and "Traceback" not in err
    assert not run.exists()


def test_a_chat_template_that_raises_on_a_system_message_is_one_line(tmp_path, tiny_model_dir):
    """Gemma / Mistral-style templates raise "System role not supported": a jinja2 traceback."""
    from transformers import AutoTokenizer

    folder = save_model(tmp_path / "m", qwen3(tiny_model_dir))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not "
                         "supported') }}{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok.save_pretrained(folder)
    with pytest.raises(ConfigError, match=re.escape(f"{folder}: its chat template refuses agentq's prompt, a system "
                                                    "message and user / assistant turns (TemplateError: System role "
                                                    "not supported)")):
        build.load_tokenizer(str(folder))


def test_a_config_json_given_as_model_path_names_its_folder(tmp_path, tiny_model_dir):
    assert model_path_error(tiny_model_dir / "config.json") == \
        f"model.path={str(tiny_model_dir / 'config.json')!r} is a file: give its folder, model.path={tiny_model_dir}"
