"""Tiny random gated delta-net hybrid checkpoints built on the spot: linear-attention layers interleaved with gated
full attention. `build_tiny_qwen3_next`: Qwen3-Next, dense MLPs but in the last layer, a tiny mixture of experts
(vLLM's `Qwen3NextForCausalLM` refuses a model without one: "No Qwen3Next layer found"). `build_tiny_qwen3_5`: a dense
Qwen3.5 text model (`Qwen3_5ForCausalLM`). Both run vLLM's one gated delta-net layer (`QwenGatedDeltaNetAttention`:
Qwen3-Next with its interleaved q/k/v/z projection, Qwen3.5 with separate ones). Importing vLLM 0.32's `qwen3_5.py`
here needs `vision_language.allow_image_only_processor` first (see docs/hybrid_models.md).

vLLM's CPU build serves the gated delta-net layers only in bfloat16 and only with linear-attention head dims its
kernels take (128; 32 is refused), so the spec keeps 128-wide linear heads and saves bf16 weights. The layer
pattern mixes both kinds twice, so every engine step plans two KV cache groups (Mamba-style state and paged
attention) that share one page size. The word-level tokenizer (`w0 … wN`) makes a prompt of n words n tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import built_once, default_cache_dir
from ascend_testkit.models.word_tokenizer import save_word_tokenizer


@dataclass(frozen=True)
class TinyHybridSpec:
    hidden_size: int = 128
    layer_types: tuple[str, ...] = ("linear_attention", "full_attention", "linear_attention", "full_attention")
    # Wide attention pages (2 KiB a token) so vLLM's hybrid page alignment gives blocks of tens of tokens, not
    # hundreds: one page must hold a layer's whole GDN state (~131 KiB here, its recurrent state in float32).
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 256
    linear_num_key_heads: int = 1
    linear_num_value_heads: int = 2
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    intermediate_size: int = 256
    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    vocab_size: int = 1000
    max_position_embeddings: int = 2048
    # Peaked next-token distributions, so greedy choices are the model's and not bf16 rounding's.
    initializer_range: float = 2.0
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def _hybrid_config_kwargs(spec: TinyHybridSpec) -> dict:
    """What a Qwen3-Next and a Qwen3.5 text config take alike from the spec."""
    return dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=len(spec.layer_types),
        layer_types=list(spec.layer_types),
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        linear_num_key_heads=spec.linear_num_key_heads,
        linear_num_value_heads=spec.linear_num_value_heads,
        linear_key_head_dim=spec.linear_key_head_dim,
        linear_value_head_dim=spec.linear_value_head_dim,
        linear_conv_kernel_dim=spec.linear_conv_kernel_dim,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )


def _save_random(path: str | os.PathLike, spec: TinyHybridSpec, model_cls, config) -> Path:
    """Seeded random weights of `model_cls(config)` saved in bf16 with the word tokenizer into `path`."""
    import torch

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_word_tokenizer(path, spec.vocab_size)
    config.architectures = [model_cls.__name__]
    torch.manual_seed(spec.seed)
    random_gdn_model(model_cls, config).save_pretrained(path, safe_serialization=True)
    return path


def random_gdn_model(model_cls, config):
    """`model_cls(config)` (seed it first) in bf16 with random GDN gates: HF initialises A_log / dt_bias / norms to
    constants; random draws give every head its own decay and gate."""
    import torch

    model = model_cls(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                param.uniform_(-1.0, 1.0)
    return model.to(torch.bfloat16)


def build_tiny_qwen3_next(path: str | os.PathLike, spec: TinyHybridSpec = TinyHybridSpec()) -> Path:
    """Write a `Qwen3NextForCausalLM` (dense MLPs, experts in the last layer) with random bf16 weights and the word
    tokenizer to `path`."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = Qwen3NextConfig(
        **_hybrid_config_kwargs(spec),
        num_experts=spec.num_experts,
        num_experts_per_tok=spec.num_experts_per_tok,
        moe_intermediate_size=spec.moe_intermediate_size,
        shared_expert_intermediate_size=spec.moe_intermediate_size,
        mlp_only_layers=list(range(len(spec.layer_types) - 1)),
    )
    return _save_random(path, spec, Qwen3NextForCausalLM, config)


def cached_tiny_qwen3_next(spec: TinyHybridSpec = TinyHybridSpec(), cache_dir: str | os.PathLike | None = None) -> Path:
    """The tiny Qwen3-Next hybrid for `spec`, built once into the cache (the folder name carries the spec's hash)."""
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-qwen3-next-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_qwen3_next(tmp, spec))


def build_tiny_qwen3_5(path: str | os.PathLike, spec: TinyHybridSpec = TinyHybridSpec()) -> Path:
    """Write a dense `Qwen3_5ForCausalLM` (Qwen3.5's text model: gated delta-net layers with separate q/k/v, z, b and
    a projections, gated full attention with partial rotary, (1 + w) RMS norms, dense MLPs) with random bf16 weights
    and the word tokenizer to `path`. The spec's expert fields do not apply (the dense model has none)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    return _save_random(path, spec, Qwen3_5ForCausalLM, Qwen3_5TextConfig(**_hybrid_config_kwargs(spec)))


def cached_tiny_qwen3_5(spec: TinyHybridSpec = TinyHybridSpec(), cache_dir: str | os.PathLike | None = None) -> Path:
    """The tiny dense Qwen3.5 for `spec`, built once into the cache (the folder name carries the spec's hash)."""
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-qwen3_5-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_qwen3_5(tmp, spec))
