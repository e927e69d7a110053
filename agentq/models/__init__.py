"""Model resolution: a local HF checkpoint (`model.path`) or the embedded tiny model."""
from .tiny import TinyModelConfig, build_tiny_model, ensure_tiny_model, train_tokenizer

__all__ = ["TinyModelConfig", "build_tiny_model", "ensure_tiny_model", "train_tokenizer"]
