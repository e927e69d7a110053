"""A tiny random-init Qwen3 model and a byte-level BPE tokenizer trained on environment text.

No weights can be downloaded where agentq's tests and default run execute, so they use a model
built here, deterministically from a seed and a text corpus, saved with `save_pretrained` like
any HF checkpoint. Real users set `model.path` to a local HF checkpoint instead.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: ChatML, the format of Qwen models: <|im_start|>{role}\n{content}<|im_end|>\n
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyModelConfig:
    vocab_size: int = 1024
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 4096
    seed: int = 0

    def key(self, corpus_key: str) -> str:
        blob = json.dumps({"cfg": asdict(self), "corpus": corpus_key, "v": 1}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("AGENTQ_CACHE", Path.home() / ".cache" / "agentq"))


def train_tokenizer(corpus: Iterable[str], vocab_size: int):
    """Byte-level BPE (no unknown tokens: any text encodes) wrapped as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_model(out_dir: str | Path, corpus: Iterable[str], cfg: TinyModelConfig = TinyModelConfig()) -> Path:
    """Train the tokenizer on `corpus`, random-init a Qwen3 of `cfg`, save both to `out_dir` (atomically)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out_dir = Path(out_dir)
    tok = train_tokenizer(corpus, cfg.vocab_size)
    vocab = ((len(tok) + 63) // 64) * 64          # a multiple of 64 (CPU int8 / vLLM kernels like it)
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.pad_token_id, bos_token_id=None,
        rms_norm_eps=1e-6, attention_bias=False)
    torch.manual_seed(cfg.seed)
    model = Qwen3ForCausalLM(config).float()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp"))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "agentq_tiny.json").write_text(json.dumps(asdict(cfg), indent=2))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir


def ensure_tiny_model(cfg: TinyModelConfig, corpus_key: str, corpus_fn) -> Path:
    """The cached tiny model for (cfg, corpus_key); built from `corpus_fn()` on first use."""
    path = cache_dir() / "models" / f"tiny-{cfg.key(corpus_key)}"
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    return build_tiny_model(path, corpus_fn(), cfg)
