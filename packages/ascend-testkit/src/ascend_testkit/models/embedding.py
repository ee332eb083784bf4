"""Tiny random embedding checkpoints built on the spot: a decoder-based one (Qwen3, as Qwen3-Embedding ships) and an
encoder-only BERT, each with the sentence-transformers files that tell vLLM how to pool.

Qwen3-Embedding is a `Qwen3ForCausalLM` checkpoint whose `modules.json` names last-token pooling and a Normalize
module; vLLM, asked for `runner="pooling"`, turns it into an embedding model that pools the last token. The BERT one
is a `BertModel` (vLLM's `BertEmbeddingModel`, non-causal encoder-only attention) pooled by the mean of its tokens,
as sentence-transformers' BERT encoders are. Both ship the word-level tokenizer (`w0 … wN`, real strings, one
token per word, no specials added), so a prompt of n words is n tokens in either model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import built_once, default_cache_dir
from ascend_testkit.models.tiny_llama import TinyModelSpec
from ascend_testkit.models.word_tokenizer import save_word_tokenizer


@dataclass(frozen=True)
class TinyEmbeddingSpec(TinyModelSpec):
    """The tiny Llama's shape with an embedding model's defaults: positions for the prompts pooled here, and a
    smaller initializer range (pooled vectors, not greedy choices, are compared)."""

    max_position_embeddings: int = 512
    initializer_range: float = 0.5


def _save_sentence_transformers_pooling(path: Path, pooling_mode: str, hidden_size: int) -> None:
    """modules.json (Transformer, Pooling, Normalize) and 1_Pooling/config.json: vLLM reads the pooling type and
    whether to normalize from these (`get_pooling_config`)."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    modes = ("cls_token", "mean_tokens", "max_tokens", "lasttoken")
    pooling = {"word_embedding_dimension": hidden_size, **{f"pooling_mode_{m}": m == pooling_mode for m in modes}}
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (path / "2_Normalize").mkdir(exist_ok=True)


def build_tiny_qwen3_embedding(path: str | os.PathLike, spec: TinyEmbeddingSpec = TinyEmbeddingSpec()) -> Path:
    """A `Qwen3ForCausalLM` with random weights pooled by its last token, normalized (Qwen3-Embedding's layout)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_word_tokenizer(path, spec.vocab_size)
    config = Qwen3Config(
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
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    Qwen3ForCausalLM(config).save_pretrained(path, safe_serialization=True)
    _save_sentence_transformers_pooling(path, "lasttoken", spec.hidden_size)
    return path


def build_tiny_bert(path: str | os.PathLike, spec: TinyEmbeddingSpec = TinyEmbeddingSpec()) -> Path:
    """A `BertModel` (encoder-only, non-causal attention) with random weights, mean-pooled and normalized."""
    import torch
    from transformers import BertConfig, BertModel

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_word_tokenizer(path, spec.vocab_size)
    config = BertConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        type_vocab_size=2,
        pad_token_id=0,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    BertModel(config, add_pooling_layer=False).save_pretrained(path, safe_serialization=True)
    _save_sentence_transformers_pooling(path, "mean_tokens", spec.hidden_size)
    return path


def build_tiny_modernbert(path: str | os.PathLike, spec: TinyEmbeddingSpec = TinyEmbeddingSpec()) -> Path:
    """A `ModernBertModel`: encoder-only, its second layer local (sliding-window) attention, mean-pooled."""
    import torch
    from transformers import ModernBertConfig, ModernBertModel

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_word_tokenizer(path, spec.vocab_size)
    config = ModernBertConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        global_attn_every_n_layers=2,
        local_attention=16,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    ModernBertModel(config).save_pretrained(path, safe_serialization=True)
    _save_sentence_transformers_pooling(path, "mean_tokens", spec.hidden_size)
    return path


def cached_tiny_modernbert(
    spec: TinyEmbeddingSpec = TinyEmbeddingSpec(), cache_dir: str | os.PathLike | None = None
) -> Path:
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-modernbert-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_modernbert(tmp, spec))


def cached_tiny_qwen3_embedding(
    spec: TinyEmbeddingSpec = TinyEmbeddingSpec(), cache_dir: str | os.PathLike | None = None
) -> Path:
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-qwen3-embedding-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_qwen3_embedding(tmp, spec))


def cached_tiny_bert(spec: TinyEmbeddingSpec = TinyEmbeddingSpec(), cache_dir: str | os.PathLike | None = None) -> Path:
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-bert-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_bert(tmp, spec))
