"""The Ascend attention backend for standard (non-MLA) decoder attention, built on `ascend_kernels`.

vLLM's attention layer calls `do_kv_cache_update` (write this step's keys and values into the paged cache) and then
`forward` (paged attention over each request's context). The per-layer key and value caches are the
`AttentionKV` views our allocator made; the runner hands them to each impl with `bind_ascend_kv`.

Prefill context parallel (PCP): the impl declares it (`supports_pcp`), all-gathers each step's K/V across the PCP
group into every rank's KV replica, and attends prefill chunks in parts merged by log-sum-exp
(`ascend_platform.pcp.attention`); the MRV2 runner binds its PCP manager to the builder, which attaches the step's
`PCPAttentionLayout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

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
from ascend_platform.pcp import attention as pcp_attention
from ascend_platform.pcp.layout import PCPAttentionLayout

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
    pcp: PCPAttentionLayout | None = None  # this rank's prefill chunks under PCP (None: every row reads the cache)


class AscendAttentionMetadataBuilder(AttentionMetadataBuilder[AscendAttentionMetadata]):
    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._pcp_manager: Any = None

    @classmethod
    def get_cudagraph_support(cls, vllm_config: Any, kv_cache_spec: Any) -> Any:
        from ascend_platform.graph.policy import attention_graph_support

        return attention_graph_support()

    def bind_pcp_manager(self, manager: Any) -> None:
        """The MRV2 runner's PCP manager, whose per-step `attention_layout` the metadata carries."""
        self._pcp_manager = manager

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
            pcp=self._pcp_manager.attention_layout if self._pcp_manager is not None else None,
        )


class AscendAttentionImpl(AttentionImpl[AscendAttentionMetadata]):
    supports_pcp: bool = True

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
        self._pcp_kv: torch.Tensor | None = None  # this step's K/V gathered from every PCP rank (this layer)

    def bind_ascend_kv(self, kv) -> None:
        self.kv = kv

    def _caches(self, layer_name: str):
        if self.kv is None:
            raise RuntimeError(f"ASCEND attention layer {layer_name!r} has no KV cache bound by the Ascend runner")
        return self.kv.key, self.kv.value

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        key_cache, value_cache = self._caches(getattr(layer, "layer_name", "?"))
        if self.pcp_world_size > 1 and slot_mapping.shape[0] > key.shape[0]:
            # A partitioned step: the slot mapping covers every rank's tokens, which each rank's replica holds.
            self._pcp_kv = pcp_attention.all_gather_kv(key, value)
            pcp_attention.cache_gathered_kv(self._pcp_kv, key.shape[-1], key_cache, value_cache, slot_mapping)
            return
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
        gathered, self._pcp_kv = self._pcp_kv, None
        if attn_metadata.pcp is not None and gathered is not None:
            return self._forward_pcp(query, key_cache, value_cache, attn_metadata, gathered, output)
        with usage.timed("kernels.paged_attention"):
            kernel_ops().paged_attention(
                query[:n], key_cache, value_cache, attn_metadata.block_table, attn_metadata.query_start_loc,
                attn_metadata.seq_lens, scale=self.scale, causal=attn_metadata.causal,
                sliding_window=self.sliding_window, sinks=self.sinks, out=output[:n])
        usage.count("attention.ascend.forward")
        return output

    def _forward_pcp(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     m: AscendAttentionMetadata, gathered: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """Decode rows read the KV replica; prefill chunks attend to the cached context and the gathered step K/V."""
        layout = m.pcp
        assert layout is not None
        d, t0, n = layout.first_prefill_row, layout.prefill_token_start, m.num_actual_tokens
        if d:
            with usage.timed("kernels.paged_attention"):
                kernel_ops().paged_attention(
                    query[:t0], key_cache, value_cache, m.block_table[:d], m.query_start_loc[: d + 1],
                    m.seq_lens[:d], scale=self.scale, causal=m.causal, out=output[:t0])
        pcp_attention.chunk_attention(query[t0:n], gathered, query.shape[-1], key_cache, value_cache,
                                      m.block_table[d:], layout, scale=self.scale, out=output[t0:n])
        usage.count("attention.ascend.forward")
        return output


class Ascend310PAttentionBackend(AscendAttentionBackend):
    """The 310P inference card's backend: same contract, but its runner feeds it private per-layer KV buffers."""

    @staticmethod
    def get_name() -> str:
        return "ASCEND_310P"
