"""A tiny random Llama checkpoint built on the spot, so tests and demos run a real vLLM engine offline.

The weights use a large initializer range so each step's output distribution is peaked: greedy choices are then
decided by the model, not by float rounding, and two attention kernels agree token for token.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import built_once, default_cache_dir
from ascend_testkit.models.word_tokenizer import prompt_of_length as prompt_of_length
from ascend_testkit.models.word_tokenizer import save_word_tokenizer


@dataclass(frozen=True)
class TinyModelSpec:
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 128
    vocab_size: int = 1000
    max_position_embeddings: int = 2048
    initializer_range: float = 1.0
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def build_tiny_llama(path: str | os.PathLike, spec: TinyModelSpec = TinyModelSpec(),
                     save_tokenizer: Callable[[Path, int], None] = save_word_tokenizer) -> Path:
    """Write a `LlamaForCausalLM` with random weights and a tokenizer (by default the WordLevel `w0 … wN`) to
    `path`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_tokenizer(path, spec.vocab_size)

    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path, safe_serialization=True)
    return path


def cached_tiny_llama(spec: TinyModelSpec = TinyModelSpec(), cache_dir: str | os.PathLike | None = None) -> Path:
    """The tiny model for `spec`, built once into the cache and reused (the folder name carries the spec's hash)."""
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-llama-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_llama(tmp, spec))


def cached_char_llama(spec: TinyModelSpec | None = None, cache_dir: str | os.PathLike | None = None) -> Path:
    """A tiny Llama with the character tokenizer (`char_tokenizer`: tokens that are real strings, as structured
    output needs), built once into the cache."""
    from ascend_testkit.models.char_tokenizer import VOCAB_SIZE, save_char_tokenizer

    spec = spec or TinyModelSpec(vocab_size=VOCAB_SIZE)
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-char-llama-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_llama(tmp, spec, save_char_tokenizer))
