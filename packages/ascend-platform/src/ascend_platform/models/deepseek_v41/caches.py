"""The cache layers of a DeepSeek V4.1 attention layer and the KV specs they declare.

Each is an `AttentionLayerBase` of its own in the forward context, so vLLM's planner sees four cache kinds:

- the sliding-window latent of every layer (`SlidingWindowMLASpec`, 32-token blocks, one 512-wide row per token);
- the compressed latent of a KV-source layer (`MLAAttentionSpec` with `tokens_per_state` 1 or 2), declared by the
  attention layer itself (`AscendDeepseekV41Attention.get_kv_cache_spec`);
- the index keys of a KV source that is also an index source (`MLAAttentionSpec` of 132-byte fp8 records: 128 fp8
  values then one float32 scale, `tokens_per_state` = the ratio);
- the compressor's ring of open-group rows of a ratio-2 KV source (`CircularBufferSpec`: one block per request,
  fp32 `[kv 512 | score 512]` rows, row `p % capacity` for position p).

Unlike vLLM's classes (whose SWA cache takes bf16 / fp8 only), the latent rows are kept in the model dtype: V4.1
forces no fp8 format, and the float32 test models then store exactly what they compute.
"""

from __future__ import annotations

import torch
from vllm.config import CacheConfig, VllmConfig, get_current_vllm_config
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.kv_cache_interface import CircularBufferSpec, KVCacheSpec, MLAAttentionSpec, SlidingWindowMLASpec

# vLLM's V4.1 sliding-window pages; any multiple of 32 would do for our ops.
SWA_BLOCK_SIZE = 32
# 128 fp8 key values then one float32 scale per record (vLLM's fp8 indexer cache, the V4 / V3.2 layout).
INDEX_HEAD_DIM = 128
INDEX_RECORD_BYTES = INDEX_HEAD_DIM + 4
# Plain-row pages (no packed record) align to 512 bytes, as vLLM's plain-row V4.1 backends ask.
PAGE_ALIGNMENT = 512


def _register(prefix: str, layer: torch.nn.Module) -> None:
    context = get_current_vllm_config().compilation_config.static_forward_context
    if prefix in context:
        raise ValueError(f"Duplicate layer name: {prefix}")
    context[prefix] = layer


class _CacheLayer(torch.nn.Module, AttentionLayerBase):
    backend_cls: type

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.kv_cache = torch.tensor([])
        _register(prefix, self)

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        self.kv_cache = kv_cache.squeeze(1)  # [blocks, heads=1, rows, width] -> [blocks, rows, width]

    def forward(self) -> None: ...

    def get_attn_backend(self) -> type:
        return self.backend_cls


class AscendV41SWACache(_CacheLayer):
    """One layer's sliding-window latent rows (RoPE'd `kv_norm(wkv x)`), in the model dtype."""

    def __init__(self, *, head_dim: int, window_size: int, dtype: torch.dtype, prefix: str, cache_config: CacheConfig,
                 backend_cls: type) -> None:
        super().__init__(prefix)
        self.head_dim, self.window_size, self.dtype = head_dim, window_size, dtype
        self.cache_config, self.backend_cls = cache_config, backend_cls
        self.block_size = SWA_BLOCK_SIZE

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec:
        return SlidingWindowMLASpec(block_size=self.block_size, num_kv_heads=1, max_tp_shards=1,
                                    head_size=self.head_dim, dtype=self.dtype, sliding_window=self.window_size,
                                    cache_dtype_str=self.cache_config.cache_dtype, alignment=PAGE_ALIGNMENT,
                                    model_version="deepseek_v4")


def compressed_latent_spec(vllm_config: VllmConfig, *, head_dim: int, dtype: torch.dtype, ratio: int) -> KVCacheSpec:
    """The compressed latent cache of a KV-source layer: one row per `ratio` tokens."""
    return MLAAttentionSpec(block_size=vllm_config.cache_config.block_size, num_kv_heads=1, head_size=head_dim,
                            dtype=dtype, tokens_per_state=ratio, cache_dtype_str=vllm_config.cache_config.cache_dtype,
                            alignment=PAGE_ALIGNMENT, model_version="deepseek_v4")


class AscendV41IndexerCache(_CacheLayer):
    """The fp8 index keys a KV-source index layer writes (one per compressed entry); later index sources of the same
    KV source read it."""

    def __init__(self, *, prefix: str, cache_config: CacheConfig, compress_ratio: int, backend_cls: type) -> None:
        super().__init__(prefix)
        self.cache_config, self.compress_ratio, self.backend_cls = cache_config, compress_ratio, backend_cls
        self.head_dim, self.dtype = INDEX_RECORD_BYTES, torch.uint8

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec:
        return MLAAttentionSpec(block_size=self.cache_config.block_size, num_kv_heads=1, head_size=self.head_dim,
                                dtype=self.dtype, tokens_per_state=self.compress_ratio, alignment=PAGE_ALIGNMENT)


class AscendV41CompressorStateCache(_CacheLayer):
    """A ratio-2 compressor's ring of fp32 `[kv | score]` rows: the open group's first row survives the step."""

    def __init__(self, *, state_dim: int, prefix: str, backend_cls: type) -> None:
        super().__init__(prefix)
        self.state_dim, self.dtype, self.backend_cls = state_dim, torch.float32, backend_cls
        # Drafts + bonus token + the previous row, as a power of two >= 8 (vLLM's capacity rule).
        rows_per_step = get_current_vllm_config().num_speculative_tokens + 2
        self.block_size = max(8, 1 << (rows_per_step - 1).bit_length())

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec:
        return CircularBufferSpec(block_size=self.block_size, num_kv_heads=1, head_size=self.state_dim, head_size_v=0,
                                  dtype=self.dtype)
