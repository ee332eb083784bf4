"""The Ascend attention backend for standard (non-MLA) decoder attention, built on `ascend_kernels`.

vLLM's attention layer calls `do_kv_cache_update` (write this step's keys and values into the paged cache) and then
`forward` (paged attention over each request's context). The per-layer key and value caches are the
`AttentionKV` views our allocator made; the runner hands them to each impl with `bind_ascend_kv`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.logger import init_logger
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)

from ascend_platform import usage
from ascend_platform.facade import kernel_ops

logger = init_logger(__name__)


class AscendAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @staticmethod
    def get_name() -> str:
        return "ASCEND"

    @staticmethod
    def get_impl_cls() -> type[AscendAttentionImpl]:
        return AscendAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[AscendAttentionMetadataBuilder]:
        return AscendAttentionMetadataBuilder

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


@dataclass
class AscendAttentionMetadata:
    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor  # int32 [num_reqs + 1]
    seq_lens: torch.Tensor  # int32 [num_reqs], context including this step's tokens
    block_table: torch.Tensor  # int32 [num_reqs, max_blocks]
    slot_mapping: torch.Tensor
    causal: bool = True


class AscendAttentionMetadataBuilder(AttentionMetadataBuilder[AscendAttentionMetadata]):
    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> AscendAttentionMetadata:
        m = common_attn_metadata
        if isinstance(m.causal, torch.Tensor):
            raise NotImplementedError("ASCEND attention does not support per-token (dynamic) causality")
        return AscendAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            max_query_len=m.max_query_len,
            query_start_loc=m.query_start_loc[: m.num_reqs + 1].to(torch.int32),
            seq_lens=m.seq_lens[: m.num_reqs].to(torch.int32),
            block_table=m.block_table_tensor[: m.num_reqs].to(torch.int32),
            slot_mapping=m.slot_mapping,
            causal=bool(m.causal),
        )


class AscendAttentionImpl(AttentionImpl[AscendAttentionMetadata]):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None = None, attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None, sinks: torch.Tensor | None = None) -> None:
        if alibi_slopes is not None:
            raise NotImplementedError("ASCEND attention: ALiBi slopes are not supported")
        if logits_soft_cap:
            raise NotImplementedError(f"ASCEND attention: logits_soft_cap={logits_soft_cap} is not supported")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.sinks = sinks
        self.kv = None  # AttentionKV from our allocator, set by the runner

    def bind_ascend_kv(self, kv) -> None:
        self.kv = kv

    def _caches(self, layer_name: str):
        if self.kv is None:
            raise RuntimeError(f"ASCEND attention layer {layer_name!r} has no KV cache bound by the Ascend runner")
        return self.kv.key, self.kv.value

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        key_cache, value_cache = self._caches(getattr(layer, "layer_name", "?"))
        with usage.timed("kernels.reshape_and_cache"):
            kernel_ops().reshape_and_cache(key, value, key_cache, value_cache, slot_mapping[: key.shape[0]])

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AscendAttentionMetadata | None, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("ASCEND attention: fused output quantization is not supported")
        if attn_metadata is None:  # profiling / dummy run without a KV cache
            return output
        n = attn_metadata.num_actual_tokens
        key_cache, value_cache = self._caches(getattr(layer, "layer_name", "?"))
        with usage.timed("kernels.paged_attention"):
            kernel_ops().paged_attention(
                query[:n], key_cache, value_cache, attn_metadata.block_table, attn_metadata.query_start_loc,
                attn_metadata.seq_lens, scale=self.scale, causal=attn_metadata.causal,
                sliding_window=self.sliding_window, sinks=self.sinks, out=output[:n])
        usage.count("attention.ascend.forward")
        return output


class Ascend310PAttentionBackend(AscendAttentionBackend):
    """The 310P inference card's backend: same contract, but its runner feeds it private per-layer KV buffers."""

    @staticmethod
    def get_name() -> str:
        return "ASCEND_310P"
