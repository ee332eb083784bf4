"""Tiny random DeepSeek-V2/V3/V3.2-style checkpoints (multi-head latent attention), built offline for engine tests.

The latent is DeepSeek's own (kv_lora_rank 512 + rope 64 = 576): vLLM's CPU MLA backend, the reference these
checkpoints are compared against, only compiles for that size. Everything else is small (hidden 64, 2 layers, 4
heads of 32 + 64 dims). Layers are dense by default; the MoE options (routed and shared experts, grouped top-k,
`first_k_dense_replace`) make a DeepSeek MoE model out of the same builder. Weights use a large initializer range
so each step's distribution is peaked and greedy tokens are decided by the model, not by rounding; the latent
norms keep the attention well scaled whatever the range. `model_type="deepseek_v32"` adds V3.2's lightning indexer
(sparse attention over the `index_topk` best keys per query; transformers' DeepseekV32Config).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import built_once, default_cache_dir
from ascend_testkit.models.word_tokenizer import save_word_tokenizer

ARCHITECTURES = {"deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
                 "deepseek_v32": "DeepseekV32ForCausalLM"}


@dataclass(frozen=True)
class TinyDeepseekSpec:
    model_type: str = "deepseek_v2"
    """"deepseek_v2", "deepseek_v3" (V3 adds noaux_tc routing with a score-correction bias) or "deepseek_v32"
    (V3 plus the lightning indexer of DeepSeek sparse attention; needs q_lora_rank)."""
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 64
    v_head_dim: int = 32
    intermediate_size: int = 128
    vocab_size: int = 1000
    max_position_embeddings: int = 2048
    initializer_range: float = 1.0
    seed: int = 0
    # MoE (n_routed_experts=None: every layer dense).
    n_routed_experts: int | None = None
    n_shared_experts: int | None = None
    """None keeps the config class's default (the field cannot be None in transformers' config)."""
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int = 32
    n_group: int | None = None
    topk_group: int | None = None
    first_k_dense_replace: int = 0
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    # DeepSeek V3.2's indexer (model_type "deepseek_v32" only): each query attends to its index_topk best keys.
    index_topk: int = 16
    index_n_heads: int = 4
    index_head_dim: int = 128
    """vLLM's indexer cache stores fp8 keys with one float32 scale per 128 elements: 128 is its smallest width."""

    def key(self) -> str:
        fields = asdict(self)
        if self.model_type != "deepseek_v32":  # the indexer fields leave earlier models' cached folders as they were
            fields = {k: v for k, v in fields.items() if not k.startswith("index_")}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]

    @property
    def latent_size(self) -> int:
        """Elements one token's KV takes per layer (the latent plus its rotary part)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def _config(spec: TinyDeepseekSpec):
    from transformers import DeepseekV2Config, DeepseekV3Config

    if spec.model_type not in ARCHITECTURES:
        raise ValueError(f"model_type must be one of {sorted(ARCHITECTURES)}, got {spec.model_type!r}")
    moe = spec.n_routed_experts is not None
    common = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_heads,
        q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank, qk_nope_head_dim=spec.qk_nope_head_dim,
        qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim,
        max_position_embeddings=spec.max_position_embeddings, initializer_range=spec.initializer_range,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
        moe_intermediate_size=spec.moe_intermediate_size,
        # Dense everywhere unless experts are asked for: every layer below first_k_dense_replace is dense.
        first_k_dense_replace=spec.first_k_dense_replace if moe else spec.num_layers,
        n_routed_experts=spec.n_routed_experts if moe else 1,
        n_shared_experts=spec.n_shared_experts if moe else None,
        num_experts_per_tok=spec.num_experts_per_tok if moe else 1,
        n_group=spec.n_group, topk_group=spec.topk_group, norm_topk_prob=spec.norm_topk_prob,
        routed_scaling_factor=spec.routed_scaling_factor,
    )
    if common["n_shared_experts"] is None:  # the configs are strict dataclasses: this field takes no None
        del common["n_shared_experts"]
    if spec.model_type == "deepseek_v32":
        return _v32_config(spec, common)
    if spec.model_type == "deepseek_v3":
        config = DeepseekV3Config(**common, rope_interleave=True)
        config.topk_method = "noaux_tc"
        config.scoring_func = "sigmoid"
    else:
        config = DeepseekV2Config(**common, topk_method="group_limited_greedy" if spec.n_group else "greedy")
    config.architectures = [ARCHITECTURES[spec.model_type]]
    config.dtype = "float32"
    return config


def _v32_config(spec: TinyDeepseekSpec, common: dict):
    from transformers import DeepseekV32Config

    if spec.q_lora_rank is None:
        raise ValueError("deepseek_v32 needs q_lora_rank: its indexer reads the query's low-rank projection")
    # The V3.2 config is a strict dataclass: unset grouping fields keep its defaults (dense layers ignore them).
    common = {k: v for k, v in common.items() if v is not None} | {
        "routed_scaling_factor": spec.routed_scaling_factor, "index_topk": spec.index_topk,
        "index_n_heads": spec.index_n_heads, "index_head_dim": spec.index_head_dim}
    config = DeepseekV32Config(**common)
    config.rope_interleave = True  # transformers' V3.2 rotates the main MLA rope interleaved; vLLM reads this flag
    config.topk_method = "noaux_tc"
    config.scoring_func = "sigmoid"
    config.architectures = [ARCHITECTURES[spec.model_type]]
    config.dtype = "float32"
    return config


def build_tiny_deepseek(path: str | os.PathLike, spec: TinyDeepseekSpec = TinyDeepseekSpec()) -> Path:
    """Write a DeepSeek-V2/V3/V3.2 causal LM with random weights and a WordLevel tokenizer (`w0 … wN`) to `path`."""
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_word_tokenizer(path, spec.vocab_size)
    config = _config(spec)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layernorm" in name or name.endswith("norm.weight"):
                param.fill_(1.0)  # norms at 1: the large init range would otherwise scale latents wildly
            elif "e_score_correction_bias" in name:
                param.zero_()
    model.save_pretrained(path, safe_serialization=True)
    return path


def cached_tiny_deepseek(spec: TinyDeepseekSpec = TinyDeepseekSpec(),
                         cache_dir: str | os.PathLike | None = None) -> Path:
    """The tiny model for `spec`, built once into the cache and reused (the folder name carries the spec's hash)."""
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-{spec.model_type}-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_deepseek(tmp, spec))
