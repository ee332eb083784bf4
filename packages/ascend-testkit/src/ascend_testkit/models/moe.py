"""Tiny random mixture-of-experts checkpoints built offline (Qwen3-MoE style), and a model with its own experts class.

- `cached_tiny_qwen3_moe(spec)`: a `Qwen3MoeForCausalLM` (standard attention, routed experts with softmax top-k and
  renormalised weights) with the tiny Llama's WordLevel tokenizer, so `prompt_of_length` prompts work unchanged;
  `route_skew` makes its routing favour the first half of the experts (a skewed load for EPLB to balance).
- `cached_tiny_glm_moe(spec)`: a `Glm4MoeForCausalLM`, the DeepSeek-V3 routing family (sigmoid, correction bias,
  grouped top-k, scaling factor) plus a shared expert and a dense first layer, on standard attention.
- `cached_tiny_cohere2_moe(spec)`: a `Cohere2MoeForCausalLM` with sigmoid expert selection, which vLLM routes
  through the model's own `custom_routing_function` (`token_choice_with_bias`), plus a shared expert.
- `cached_scaled_experts_moe(spec)`: the same weights re-saved for `ScaledExpertsQwen3MoeForCausalLM`
  (`ascend_testkit.models.scaled_experts`), whose `RoutedExperts` subclass multiplies each expert's down projection by
  a per-expert `scale` from the checkpoint while loading. The checkpoint stores `down_proj / scale`, so the model
  equals the plain Qwen3-MoE only when that loader runs: the observable effect of a model-defined loader.

Weights use a wide initializer (as the tiny Llama) so greedy choices are decided by the model, not float rounding.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import built_once, default_cache_dir
from ascend_testkit.models.word_tokenizer import save_word_tokenizer

SCALED_ARCH = "ScaledExpertsQwen3MoeForCausalLM"


@dataclass(frozen=True)
class TinyMoeSpec:
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 32
    moe_intermediate_size: int = 32
    num_experts: int = 8
    num_experts_per_tok: int = 2
    norm_topk_prob: bool = True
    vocab_size: int = 1000
    max_position_embeddings: int = 2048
    initializer_range: float = 0.5
    # > 0 skews routing towards the first half of the experts (an expert-parallel rank's worth with EP=2): hidden
    # dim 0 of every embedding row and the gate weight of those experts on dim 0 are raised by this much.
    route_skew: float = 0.0
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def build_tiny_qwen3_moe(path: str | os.PathLike, spec: TinyMoeSpec = TinyMoeSpec()) -> Path:
    """Write a random `Qwen3MoeForCausalLM` and the word tokenizer to `path`."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_word_tokenizer(path, spec.vocab_size)
    config = Qwen3MoeConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.moe_intermediate_size * 2,
        moe_intermediate_size=spec.moe_intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        num_experts=spec.num_experts,
        num_experts_per_tok=spec.num_experts_per_tok,
        norm_topk_prob=spec.norm_topk_prob,
        initializer_range=spec.initializer_range,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    config.head_dim = spec.head_dim
    torch.manual_seed(spec.seed)
    model = Qwen3MoeForCausalLM(config).to(torch.float32)
    if spec.route_skew:
        with torch.no_grad():
            model.model.embed_tokens.weight[:, 0] += spec.route_skew
            for layer in model.model.layers:
                layer.mlp.gate.weight[: spec.num_experts // 2, 0] += spec.route_skew
    model.save_pretrained(path, safe_serialization=True)
    return path


def cached_tiny_qwen3_moe(spec: TinyMoeSpec = TinyMoeSpec(), cache_dir: str | os.PathLike | None = None) -> Path:
    """The tiny Qwen3-MoE for `spec`, built once into the cache (the folder name carries the spec's hash)."""
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-qwen3-moe-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_qwen3_moe(tmp, spec))


@dataclass(frozen=True)
class TinyGlmMoeSpec:
    """A GLM-4.5-style MoE: DeepSeek-V3 routing (sigmoid scores, a correction bias steering selection, grouped top-k,
    routed_scaling_factor) and a shared expert, with standard attention (partial rotary); the first layer is dense."""

    hidden_size: int = 64
    num_layers: int = 3
    first_k_dense_replace: int = 1
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 32
    intermediate_size: int = 64
    moe_intermediate_size: int = 32
    n_routed_experts: int = 8
    n_shared_experts: int = 1
    num_experts_per_tok: int = 2
    n_group: int = 4
    topk_group: int = 2
    routed_scaling_factor: float = 2.5
    bias_scale: float = 0.1  # spread of the random e_score_correction_bias
    vocab_size: int = 1000
    max_position_embeddings: int = 2048
    initializer_range: float = 0.5
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def build_tiny_glm_moe(path: str | os.PathLike, spec: TinyGlmMoeSpec = TinyGlmMoeSpec()) -> Path:
    """Write a random `Glm4MoeForCausalLM` (non-zero correction biases) and the word tokenizer to `path`."""
    import torch
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_word_tokenizer(path, spec.vocab_size)
    config = Glm4MoeConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        moe_intermediate_size=spec.moe_intermediate_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings, n_routed_experts=spec.n_routed_experts,
        n_shared_experts=spec.n_shared_experts, num_experts_per_tok=spec.num_experts_per_tok, n_group=spec.n_group,
        topk_group=spec.topk_group, routed_scaling_factor=spec.routed_scaling_factor, norm_topk_prob=True,
        first_k_dense_replace=spec.first_k_dense_replace, initializer_range=spec.initializer_range,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    config.head_dim = spec.head_dim
    torch.manual_seed(spec.seed)
    model = Glm4MoeForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        for layer in model.model.layers[spec.first_k_dense_replace:]:
            bias = layer.mlp.gate.e_score_correction_bias
            bias.copy_(torch.randn(bias.shape) * spec.bias_scale)
    model.save_pretrained(path, safe_serialization=True)
    return path


def cached_tiny_glm_moe(spec: TinyGlmMoeSpec = TinyGlmMoeSpec(), cache_dir: str | os.PathLike | None = None) -> Path:
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-glm-moe-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_glm_moe(tmp, spec))


@dataclass(frozen=True)
class TinyCohere2MoeSpec:
    """A Command-A-style MoE: sigmoid top-k with renormalised weights (vLLM's `Cohere2Moe` hands its FusedMoE layer a
    custom routing function for it) and a shared expert summed in. Every layer is full attention, which Cohere2
    serves without rotary (NoPE), so no sliding window is involved."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 32
    intermediate_size: int = 32  # each routed expert's and (times num_shared_experts) the shared expert's
    num_experts: int = 8
    num_experts_per_tok: int = 2
    num_shared_experts: int = 1
    vocab_size: int = 1000
    max_position_embeddings: int = 2048
    initializer_range: float = 0.5
    logit_scale: float = 1.0
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def build_tiny_cohere2_moe(path: str | os.PathLike, spec: TinyCohere2MoeSpec = TinyCohere2MoeSpec()) -> Path:
    """Write a random `Cohere2MoeForCausalLM` (sigmoid expert selection) and the word tokenizer to `path`."""
    import torch
    from transformers import Cohere2MoeConfig, Cohere2MoeForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_word_tokenizer(path, spec.vocab_size)
    config = Cohere2MoeConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim, max_position_embeddings=spec.max_position_embeddings, num_experts=spec.num_experts,
        num_experts_per_tok=spec.num_experts_per_tok, num_shared_experts=spec.num_shared_experts,
        shared_expert_combination_strategy="sum", expert_selection_fn="sigmoid", norm_topk_prob=True,
        layer_types=["full_attention"] * spec.num_layers, mlp_layer_types=["sparse"] * spec.num_layers,
        sliding_window=None, initializer_range=spec.initializer_range, logit_scale=spec.logit_scale,
        rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
    )
    torch.manual_seed(spec.seed)
    Cohere2MoeForCausalLM(config).to(torch.float32).save_pretrained(path, safe_serialization=True)
    return path


def cached_tiny_cohere2_moe(spec: TinyCohere2MoeSpec = TinyCohere2MoeSpec(),
                            cache_dir: str | os.PathLike | None = None) -> Path:
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-cohere2-moe-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_cohere2_moe(tmp, spec))


def expert_scale(expert: int) -> float:
    """The per-expert scale of the scaled-experts checkpoint: powers of two, so dividing and multiplying is exact."""
    return float(2 ** (expert % 3 - 1))


def build_scaled_experts_moe(path: str | os.PathLike, source: str | os.PathLike) -> Path:
    """Re-save `source` (a tiny Qwen3-MoE) for `ScaledExpertsQwen3MoeForCausalLM`: each expert's `down_proj.weight`
    divided by `expert_scale(e)`, and that scale saved as `down_proj.scale` for the model's loader to apply."""
    import torch
    from safetensors.torch import load_file, save_file

    path, source = Path(path), Path(source)
    path.mkdir(parents=True, exist_ok=True)
    weights: dict[str, torch.Tensor] = {}
    for file in sorted(source.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    scaled: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        parts = name.split(".")
        if name.endswith(".down_proj.weight") and "experts" in parts:
            expert = int(parts[parts.index("experts") + 1])
            scale = expert_scale(expert)
            scaled[name] = tensor / scale
            scaled[name.removesuffix(".weight") + ".scale"] = torch.tensor([scale], dtype=tensor.dtype)
        else:
            scaled[name] = tensor
    save_file({k: v.contiguous() for k, v in scaled.items()}, str(path / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    config["architectures"] = [SCALED_ARCH]
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    for extra in source.iterdir():
        if extra.suffix != ".safetensors" and extra.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(extra, path / extra.name)
    return path


def cached_scaled_experts_moe(spec: TinyMoeSpec = TinyMoeSpec(), cache_dir: str | os.PathLike | None = None) -> Path:
    source = cached_tiny_qwen3_moe(spec, cache_dir)
    folder = source.with_name(source.name + "-scaled-experts")
    return built_once(folder, lambda tmp: build_scaled_experts_moe(tmp, source))
