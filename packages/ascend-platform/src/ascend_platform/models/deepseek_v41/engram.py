"""DeepSeek V4.1's engram: n-gram hash lookups gated into the residual streams, on `ascend_kernels`.

Per engram layer, every position hashes the (compressed) ids of the n-grams ending there (n = 2..max_ngram, split
over heads into disjoint prime-sized bucket ranges), looks the buckets up in an fp8 table, projects the rows into one
key per residual stream plus a shared value, and adds the value to each stream scaled by a gate comparing the stream
with its key (vLLM's `models/deepseek_v41/common/engram.py`, whose device kernels are Triton). The layout, the
compressed token map and the hash multipliers are vLLM's device-neutral helpers; hashing, lookup and gate are
`dsv41_engram_*` ops.

The hash reads up to `max_ngram - 1` tokens before each chunk: the model runner hands them over per request as
`lookback_token_ids` (column j = position chunk_start - 1 - j, -1 where it does not know them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.models.deepseek_v41.common.engram import EngramLayout, build_compressed_token_map, compute_hash_multipliers

from ascend_platform import usage
from ascend_platform.facade import kernel_ops

# ue8m0 scales: one per 32 table columns (vLLM's ParallelEngramEmbedding block size).
SCALE_BLOCK = 32


def _table_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
    # ue8m0 scales arrive as float8_e8m0fnu; the raw exponent bytes are what the lookup reads (a numeric copy into
    # uint8 would turn 2^-7 into 0).
    if loaded_weight.dtype == torch.float8_e8m0fnu:
        loaded_weight = loaded_weight.view(torch.uint8)
    if loaded_weight.shape != param.shape:
        raise ValueError(f"engram table tensor of shape {tuple(loaded_weight.shape)} does not fit "
                         f"{tuple(param.shape)}")
    param.data.copy_(loaded_weight)


class AscendEngramTable(nn.Module):
    """One layer's hash table: fp8 e4m3 rows with a ue8m0 scale per 32 columns (whole table on every rank)."""

    def __init__(self, num_embeddings: int, dim: int) -> None:
        super().__init__()
        if dim % SCALE_BLOCK:
            raise ValueError(f"engram_head_dim must be a multiple of {SCALE_BLOCK}, got {dim}")
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim, dtype=torch.float8_e4m3fn), requires_grad=False)
        self.weight_scale_inv = nn.Parameter(torch.empty(num_embeddings, dim // SCALE_BLOCK, dtype=torch.uint8),
                                             requires_grad=False)
        for param in (self.weight, self.weight_scale_inv):
            param.weight_loader = _table_weight_loader  # type: ignore[attr-defined]

    def forward(self, hash_ids: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """[T, cols] bucket ids -> [T, cols, dim] dequantized rows."""
        out = torch.empty(*hash_ids.shape, self.weight.shape[1], dtype=out_dtype, device=hash_ids.device)
        return kernel_ops().dsv41_engram_lookup(self.weight, self.weight_scale_inv, hash_ids, out)


class AscendEngram(nn.Module):
    """The engram of one decoder layer; names match the checkpoint through vLLM's V4.1 weights mapper
    (`engram.embed.weight` -> `engram.embed_tokens.weight`, its `.scale` -> `.weight_scale_inv`)."""

    def __init__(self, config: Any, layout: EngramLayout, layer_hash_index: int, quant_config: Any,
                 prefix: str) -> None:
        super().__init__()
        self.layer_hash_index = layer_hash_index
        self.hidden_size = config.hidden_size
        self.hc_mult = config.hc_mult
        self.eps = config.rms_norm_eps
        self.embed_tokens = AscendEngramTable(layout.num_embeddings[layer_hash_index], layout.head_dim)
        self.wkv = ReplicatedLinear(layout.n_hash_cols * layout.head_dim, self.hidden_size * (self.hc_mult + 1),
                                    bias=False, quant_config=quant_config, return_bias=False, prefix=f"{prefix}.wkv")
        dtype = torch.get_default_dtype()
        self.q_weight = nn.Parameter(torch.empty(self.hc_mult, self.hidden_size, dtype=dtype), requires_grad=False)
        self.k_weight = nn.Parameter(torch.empty(self.hc_mult, self.hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, residual: torch.Tensor, hash_ids: torch.Tensor) -> torch.Tensor:
        """residual [T, hc, H], hash_ids [T, cols] -> residual with the gated n-gram value added to each stream."""
        rows = self.embed_tokens(hash_ids, residual.dtype)
        kv = self.wkv(rows.flatten(1))
        usage.count("dsv41.engram_layer_calls")
        return kernel_ops().dsv41_engram_gate(residual, kv, self.q_weight, self.k_weight, None, self.eps)


class AscendNgramHash(nn.Module):
    """Maps each scheduled position to its n-gram bucket ids, for every engram layer at once."""

    def __init__(self, vllm_config: Any, layout: EngramLayout) -> None:
        super().__init__()
        from transformers import AutoTokenizer

        model_config = vllm_config.model_config
        tokenizer = AutoTokenizer.from_pretrained(model_config.tokenizer,
                                                  trust_remote_code=model_config.trust_remote_code,
                                                  revision=model_config.tokenizer_revision)
        token_map, compressed_size = build_compressed_token_map(tokenizer)
        if compressed_size != layout.compressed_vocab_size:
            raise ValueError(f"DeepSeek V4.1 engram: the tokenizer compresses to {compressed_size} ids but the config "
                             f"says engram_compressed_vocab_size={layout.compressed_vocab_size}; every hash "
                             f"multiplier derives from it, so the tables would be read at the wrong buckets")
        self.lookback_depth = layout.max_ngram_size - 1
        self.pad_id = int(token_map[layout.pad_token_id])
        self.register_buffer("token_map", torch.tensor(token_map, dtype=torch.int32), persistent=False)
        self.register_buffer("multipliers", compute_hash_multipliers(layout.layer_ids, layout.max_ngram_size,
                                                                     compressed_size), persistent=False)
        self.register_buffer("primes", torch.tensor(layout.primes, dtype=torch.int64), persistent=False)
        self.register_buffer("offsets", layout.offsets.to(torch.int64), persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, query_start_loc: torch.Tensor,
                lookback_token_ids: torch.Tensor | None, history: HashHistory | None = None,
                block_table: torch.Tensor | None = None) -> torch.Tensor:
        """-> int32 [T, engram layers, (max_ngram - 1) * n_heads]. History before a chunk comes from
        `lookback_token_ids` (MRV2) or the slot-keyed `history` through the first layer's `block_table` (V1)."""
        cache = history.ids if history is not None else None
        block_size = history.block_size if history is not None else 1
        return kernel_ops().dsv41_engram_hash(input_ids, self.token_map, None, positions, block_table,
                                              query_start_loc, self.multipliers, self.primes, self.offsets,
                                              cache, lookback_token_ids, None, self.pad_id, block_size)


class HashHistory:
    """The V1 runner's history for the hash (it passes no `lookback_token_ids` here): every scheduled token's
    compressed id is kept in a side buffer at its first-layer sliding-window cache slot, as vLLM's `NgramHashState`
    does, and the hash reads the positions before a chunk back through that layer's block table. Those positions
    are inside the window (the hash looks back `max_ngram - 1` < `sliding_window` tokens), so their blocks are still
    the request's."""

    def __init__(self, swa_cache_layer: nn.Module) -> None:
        self.swa_cache_layer = swa_cache_layer
        self.ids: torch.Tensor | None = None
        self.block_size = 1
        self._bound_to: int | None = None

    def record(self, input_ids: torch.Tensor, token_map: torch.Tensor, swa_metadata: Any) -> None:
        kv_cache = self.swa_cache_layer.kv_cache
        self.block_size = int(swa_metadata.block_size)
        if self.ids is None or self._bound_to != kv_cache.data_ptr():
            # A new cache binding (the profile run binds a temporary one first): no history carries over.
            self.ids = torch.zeros(kv_cache.shape[0] * self.block_size, dtype=torch.int32, device=input_ids.device)
            self._bound_to = kv_cache.data_ptr()
        usage.count("dsv41.engram_slot_history_writes")
        kernel_ops().dsv41_engram_write_hash_cache(input_ids, token_map, None,
                                                   swa_metadata.slot_mapping[:input_ids.shape[0]], self.ids)
