"""Tiny random DeepSeek V4.1 (text model) checkpoints, built offline for engine tests.

Written the way DeepSeek ships V4.1 and vLLM 0.32 loads it: config.json with `model_type` "deepseek_v41", the
text model nested under `text_config` (what vLLM's `DeepseekV41Config` flattens,
vllm/transformers_utils/configs/deepseek_v41.py), no `vision_config` (text only), architectures
["DeepseekV41ForCausalLM"]; tensors in DeepSeek's release names (`layers.N.attn.wq_a.weight`,
`layers.N.attn.compressor.wkv.weight`, `layers.N.attn.indexer.wk.weight`, `layers.N.engram.embed.weight`/`.scale`,
`embed.weight`, `head.weight`, ...), what vLLM's weights mapper `_make_deepseek_v4_weights_mapper` and
`DeepseekV4Model.load_weights` (vllm/models/deepseek_v41/nvidia/model.py:1450-1530, 1250-1370) accept.

Linear weights are unquantized float32 (no quantization_config). The engram tables are stored as V4.1 always stores
them (vllm/models/deepseek_v41/common/engram.py:1035-1080): float8_e4m3fn rows with one UE8M0 (float8_e8m0fnu) scale
per 32 columns; the engram `q_weight`/`k_weight` are bfloat16 (vLLM's parameters are bf16, engram.py:1565-1572), so
the checkpoint holds exactly what the engine computes with.

vLLM hard-codes the latent (`head_dim`) 512 with 64 rotary dims and the indexer key 128 wide; the rest is tiny. The
default six layers cover every V4.1 layer kind:

| layer | ratio | role |
|---|---|---|
| 0 | 0 | sliding window only; the first layer (broadcast-embedding mHC rule) |
| 1 | 0 | sliding window only, engram |
| 2 | 2 | KV source (compressor with gate) + index source owning the index keys (`wk`, `k_norm`) |
| 3 | 2 | reads layer 2's compressed cache and top-k |
| 4 | 1 | KV source (compressor without gate) + index source owning keys + candidate source, engram |
| 5 | 1 | index source reading layer 4's index keys, filtered by layer 4's candidate blocks |

Only one layer follows the last KV source: vLLM's decoder "SWA bounded replay" (on by default,
nvidia/model.py:869-905) runs the layers past the last KV source on the last `sliding_window` rows of a prefill,
which equals a full recompute only for one such layer.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import built_once, default_cache_dir
from ascend_testkit.models.word_tokenizer import save_word_tokenizer

ENGRAM_SCALE_BLOCK = 32  # columns per UE8M0 scale of an engram table row (engram.py:953)
FP8_MAX = 448.0


@dataclass(frozen=True)
class TinyDeepseekV41Spec:
    compress_ratios: tuple[int, ...] = (0, 0, 2, 2, 1, 1)
    """One per layer: 0 sliding window only, 1 one compressed entry per token, 2 one per two tokens."""
    kv_source_layer_ids: tuple[int, ...] = (2, 4)
    """Layers owning a compressor and compressed cache; a compressed layer reads the latest source at or below it."""
    index_source_layer_ids: tuple[int, ...] = (2, 4, 5)
    """Layers running an indexer; other compressed layers reuse the latest index source's top-k."""
    candidate_source_layer_id: int | None = 4
    """The indexer publishing candidate blocks for later index sources; None turns candidate filtering off
    (config: candidate_source_layer_id -1, candidate_topk_blocks 0, what vLLM treats as off)."""
    candidate_topk_blocks: int = 3
    candidate_block_size: int = 4
    """(candidate_topk_blocks - 1) * candidate_block_size >= index_topk keeps at least index_topk finite scores in
    every filtered row, so vLLM's top-k never has to pick a masked (-inf) entry."""
    engram_layer_ids: tuple[int, ...] = (1, 4)
    """Layers with an engram; () turns engram off. Engram on layer 0 is ignored by vLLM (nvidia/model.py:531)."""
    engram_max_ngram_size: int = 3
    engram_n_heads: int = 2
    engram_head_dim: int = 32
    engram_vocab_size: int = 64
    """Where the bucket primes start counting (each (n-gram, head) pair owns a distinct prime-sized range)."""
    engram_pad_token_id: int = 0
    engram_table_std: float = 1.0
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
    index_topk: int = 8
    """Compressed entries a query keeps: prompts past 8 tokens are sparse on ratio-1 layers, past 17 on ratio 2."""
    hc_mult: int = 2
    hc_sinkhorn_iters: int = 20
    n_routed_experts: int = 64
    num_experts_per_tok: int = 6
    n_shared_experts: int = 1
    moe_intermediate_size: int = 32
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    vocab_size: int = 1000
    max_position_embeddings: int = 2048
    initializer_range: float = 0.5
    """Std of every projection / embedding / mHC weight (as transformers' V4 initializes): 1.0 is too chaotic for a
    float32 engine to follow a float64 reference over long prompts, 0.5 is tame."""
    norm_jitter: float = 0.2
    """RMSNorm weights drawn from 1 +- jitter (uniform), so a norm applied with the wrong weight shows."""
    sink_std: float = 1.0
    seed: int = 0
    extra: dict = field(default_factory=dict)
    """Further text_config fields, as they would appear in config.json."""

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def num_layers(self) -> int:
        return len(self.compress_ratios)

    def validate(self) -> None:
        bad = [r for r in self.compress_ratios if r not in (0, 1, 2)]
        if bad:
            raise ValueError(f"compress_ratios entries must be 0, 1 or 2, got {bad}")
        n = self.num_layers
        for name in ("kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids"):
            if any(not 0 <= i < n for i in getattr(self, name)):
                raise ValueError(f"{name} must index layers 0..{n - 1}")
        for layer, ratio in enumerate(self.compress_ratios):
            if ratio == 0:
                continue
            kv = [s for s in self.kv_source_layer_ids if s <= layer]
            idx = [s for s in self.index_source_layer_ids if s <= layer]
            if not kv or not idx:
                raise ValueError(f"compressed layer {layer} has no KV / index source at or below it")
            if self.compress_ratios[max(kv)] != ratio or self.compress_ratios[max(idx)] != ratio:
                raise ValueError(f"layer {layer}: its KV / index source has another compress ratio")
        for s in (*self.kv_source_layer_ids, *self.index_source_layer_ids):
            if self.compress_ratios[s] == 0:
                raise ValueError(f"source layer {s} has compress ratio 0")
        if self.candidate_source_layer_id is not None:
            c = self.candidate_source_layer_id
            if c not in self.index_source_layer_ids:
                raise ValueError("candidate_source_layer_id must be an index source")
            if (self.candidate_topk_blocks - 1) * self.candidate_block_size < self.index_topk:
                # fewer finite scores than index_topk in a filtered row: vLLM's row top-k would then pick masked
                # entries, which the reference (and any sane engine) does not model
                raise ValueError("(candidate_topk_blocks - 1) * candidate_block_size must be >= index_topk")
            later = [s for s in self.index_source_layer_ids if s > c]
            if any(self.compress_ratios[s] != self.compress_ratios[c] for s in later):
                # vLLM's short-context shortcut is decided per ratio: a consumer of another ratio could read
                # candidates its source never wrote.
                raise ValueError("index sources after the candidate source must share its compress ratio")


def engram_primes(spec: TinyDeepseekV41Spec) -> list[list[list[int]]]:
    """[layer][n-gram][head] bucket sizes, in vLLM's order (distinct primes counted up from engram_vocab_size - 1,
    shared across layers: engram.py EngramLayout)."""
    from vllm.models.deepseek_v41.common.engram import find_next_prime

    seen: set[int] = set()
    out = []
    for _ in spec.engram_layer_ids:
        per_ngram = []
        for _ in range(spec.engram_max_ngram_size - 1):
            sizes, current = [], spec.engram_vocab_size - 1
            for _ in range(spec.engram_n_heads):
                current = find_next_prime(current, seen)
                seen.add(current)
                sizes.append(current)
            per_ngram.append(sizes)
        out.append(per_ngram)
    return out


def compressed_vocab_size(model_dir: str | os.PathLike) -> int:
    """engram_compressed_vocab_size as vLLM derives it from the checkpoint's tokenizer."""
    from transformers import AutoTokenizer
    from vllm.models.deepseek_v41.common.engram import build_compressed_token_map

    return build_compressed_token_map(AutoTokenizer.from_pretrained(model_dir))[1]


def _text_config(spec: TinyDeepseekV41Spec, compressed_vocab: int) -> dict:
    candidates_on = spec.candidate_source_layer_id is not None
    primes = engram_primes(spec)
    config = {
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size, "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads, "num_key_value_heads": 1, "head_dim": spec.head_dim,
        "qk_rope_head_dim": spec.qk_rope_head_dim, "q_lora_rank": spec.q_lora_rank, "o_groups": spec.o_groups,
        "o_lora_rank": spec.o_lora_rank, "sliding_window": spec.sliding_window,
        "compress_ratios": list(spec.compress_ratios), "kv_source_layer_ids": list(spec.kv_source_layer_ids),
        "index_source_layer_ids": list(spec.index_source_layer_ids),
        "candidate_source_layer_id": spec.candidate_source_layer_id if candidates_on else -1,
        "candidate_topk_blocks": spec.candidate_topk_blocks if candidates_on else 0,
        "candidate_block_size": spec.candidate_block_size if candidates_on else 0,
        "index_n_heads": spec.index_n_heads, "index_head_dim": spec.index_head_dim, "index_topk": spec.index_topk,
        "hc_mult": spec.hc_mult, "hc_eps": 1e-6, "hc_sinkhorn_iters": spec.hc_sinkhorn_iters,
        "n_routed_experts": spec.n_routed_experts, "num_experts_per_tok": spec.num_experts_per_tok,
        "n_shared_experts": spec.n_shared_experts, "moe_intermediate_size": spec.moe_intermediate_size,
        "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
        "routed_scaling_factor": spec.routed_scaling_factor, "swiglu_limit": spec.swiglu_limit,
        "num_hash_layers": 0, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": spec.rope_theta, "compress_rope_theta": spec.compress_rope_theta,
        # One flat dict: vLLM takes the theta from rope_theta / compress_rope_theta per layer kind and, with
        # rope_type "default", applies no YaRN anywhere (common/rope.py:9-53).
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta,
                            "partial_rotary_factor": spec.qk_rope_head_dim / spec.head_dim},
        "max_position_embeddings": spec.max_position_embeddings, "initializer_range": spec.initializer_range,
        "engram_layer_ids": list(spec.engram_layer_ids),
        "engram_num_embeddings": [sum(sum(p) for p in layer) for layer in primes],
        "engram_vocab_size": spec.engram_vocab_size, "engram_max_ngram_size": spec.engram_max_ngram_size,
        "engram_n_heads": spec.engram_n_heads, "engram_head_dim": spec.engram_head_dim,
        "engram_compressed_vocab_size": compressed_vocab, "engram_pad_token_id": spec.engram_pad_token_id,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
    }
    return config | spec.extra


def _fp8_rows(table, block: int):
    """An engram table as V4.1 stores it: e4m3 values with a power-of-two (UE8M0) scale per `block` columns."""
    import torch

    tiles = table.unflatten(-1, (-1, block))
    amax = tiles.abs().amax(-1, keepdim=True).clamp(min=1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)))
    values = (tiles / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return values.flatten(-2), scale.squeeze(-1).to(torch.float8_e8m0fnu)


def _tensors(spec: TinyDeepseekV41Spec) -> dict:
    import torch

    g = torch.Generator().manual_seed(spec.seed)
    std = spec.initializer_range

    def normal(*shape, scale=std):
        return torch.randn(*shape, generator=g) * scale

    def norm(n):
        return 1.0 + (torch.rand(n, generator=g) * 2 - 1) * spec.norm_jitter

    h, d, hc = spec.hidden_size, spec.head_dim, spec.hc_mult
    mix = (2 + hc) * hc
    t = {"embed.weight": normal(spec.vocab_size, h), "norm.weight": norm(h), "head.weight": normal(spec.vocab_size, h)}
    primes = engram_primes(spec)
    for layer, ratio in enumerate(spec.compress_ratios):
        p = f"layers.{layer}."
        t[p + "attn_norm.weight"] = norm(h)
        t[p + "ffn_norm.weight"] = norm(h)
        for kind in ("attn", "ffn"):
            t[p + f"hc_{kind}_fn"] = normal(mix, hc * h)
            t[p + f"hc_{kind}_base"] = torch.zeros(mix)
            t[p + f"hc_{kind}_scale"] = torch.ones(3)
        a = p + "attn."
        t[a + "attn_sink"] = normal(spec.num_heads, scale=spec.sink_std)
        t[a + "wq_a.weight"] = normal(spec.q_lora_rank, h)
        t[a + "q_norm.weight"] = norm(spec.q_lora_rank)
        t[a + "wq_b.weight"] = normal(spec.num_heads * d, spec.q_lora_rank)
        t[a + "wkv.weight"] = normal(d, h)
        t[a + "kv_norm.weight"] = norm(d)
        t[a + "wo_a.weight"] = normal(spec.o_groups * spec.o_lora_rank, spec.num_heads * d // spec.o_groups)
        t[a + "wo_b.weight"] = normal(h, spec.o_groups * spec.o_lora_rank)
        if layer in spec.kv_source_layer_ids:
            t[a + "compressor.wkv.weight"] = normal(d, h)
            if ratio > 1:
                t[a + "compressor.wgate.weight"] = normal(d, h)
            t[a + "compressor.norm.weight"] = norm(d)
        if layer in spec.index_source_layer_ids:
            t[a + "indexer.wq_b.weight"] = normal(spec.index_n_heads * spec.index_head_dim, spec.q_lora_rank)
            t[a + "indexer.weights_proj.weight"] = normal(spec.index_n_heads, h)
            if layer in spec.kv_source_layer_ids:
                t[a + "indexer.wk.weight"] = normal(spec.index_head_dim, d)
                t[a + "indexer.k_norm.weight"] = norm(spec.index_head_dim)
        f = p + "ffn."
        t[f + "gate.weight"] = normal(spec.n_routed_experts, h)
        t[f + "gate.bias"] = torch.zeros(spec.n_routed_experts)
        inter = spec.moe_intermediate_size
        for e in range(spec.n_routed_experts):
            t[f + f"experts.{e}.w1.weight"] = normal(inter, h)
            t[f + f"experts.{e}.w2.weight"] = normal(h, inter)
            t[f + f"experts.{e}.w3.weight"] = normal(inter, h)
        shared = inter * spec.n_shared_experts
        t[f + "shared_experts.w1.weight"] = normal(shared, h)
        t[f + "shared_experts.w2.weight"] = normal(h, shared)
        t[f + "shared_experts.w3.weight"] = normal(shared, h)
        if layer in spec.engram_layer_ids:
            e = p + "engram."
            rows = sum(sum(x) for x in primes[spec.engram_layer_ids.index(layer)])
            n_cols = (spec.engram_max_ngram_size - 1) * spec.engram_n_heads
            t[e + "embed.weight"], t[e + "embed.scale"] = _fp8_rows(
                normal(rows, spec.engram_head_dim, scale=spec.engram_table_std), ENGRAM_SCALE_BLOCK)
            t[e + "wkv.weight"] = normal(h * (hc + 1), n_cols * spec.engram_head_dim)
            t[e + "q_weight"] = torch.stack([norm(h) for _ in range(hc)]).to(torch.bfloat16)
            t[e + "k_weight"] = torch.stack([norm(h) for _ in range(hc)]).to(torch.bfloat16)
    return t


def build_tiny_deepseek_v41(path: str | os.PathLike, spec: TinyDeepseekV41Spec = TinyDeepseekV41Spec()) -> Path:
    """Write a DeepSeek V4.1 text model with random weights (DeepSeek's tensor names) and a WordLevel tokenizer."""
    from safetensors.torch import save_file

    spec.validate()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_word_tokenizer(path, spec.vocab_size)
    config = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "dtype": "float32",
              "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
              "text_config": _text_config(spec, compressed_vocab_size(path))}
    save_file({k: v.contiguous() for k, v in _tensors(spec).items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return path


def cached_tiny_deepseek_v41(spec: TinyDeepseekV41Spec | None = None, cache_dir: str | os.PathLike | None = None,
                             **overrides) -> Path:
    """The tiny V4.1 model for `spec` (or the default spec with `overrides`, e.g. `engram_layer_ids=()`,
    `candidate_source_layer_id=None`), built once into the cache (the folder name carries the spec's hash)."""
    from dataclasses import replace

    spec = replace(spec or TinyDeepseekV41Spec(), **overrides)
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-deepseek_v41-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_deepseek_v41(tmp, spec))


def spec_of(model_dir: str | os.PathLike) -> dict:
    """The text_config of a built checkpoint (what the reference reads)."""
    return json.loads(Path(model_dir, "config.json").read_text())["text_config"]
