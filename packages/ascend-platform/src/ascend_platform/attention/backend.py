"""The Ascend attention backend for standard (non-MLA) decoder attention, built on `ascend_kernels`.

vLLM's attention layer calls `do_kv_cache_update` (write this step's keys and values into the paged cache) and then
`forward` (paged attention over each request's context), handing both the layer's `kv_cache`: the tensor vLLM bound
to the layer, which our allocator built (`ascend_core.kv.allocate_kv_caches`). The backend declares that tensor:
vLLM plans each layer's pages in a layer-major layout (`supported_kv_cache_layouts`: LBNHC, or LBHNC when a KV connector
asks for it), and the backend declares the device layout its kernels take (`kv_cache_planes`: torch_npu's paged
caches are dense), so the allocator lays the layer's planned region out as a K plane then a V plane and binds
`[2, num_blocks, block_size, num_kv_heads, head_size]` (`get_kv_cache_shape`). The impl takes its key and value
caches from it at each call (`ascend_core.kv.views.attention_kv_of`) and holds no KV memory of its own, so after
sleep and wake-up it reads the re-allocated tensor vLLM re-bound to the layer.

A layer with an int8 KV cache (ModelSlim's C8: its quant method made the layer's KV spec int8 and left the layer's
static scales in `ascend_kv_quant`, `ascend_platform.quantization.kv_c8`) writes through `reshape_and_cache_quant`
and attends through `paged_attention_antiquant` with those scales; a float layer runs the float kernels.

The metadata builder turns the step's lengths into host lists once per step (`query_start_loc_host`,
`seq_lens_host`), so kernels that need lengths on the host never read them back from the device per layer.

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

from ascend_core.kv.views import attention_kv_of
from ascend_platform import usage
from ascend_platform.facade import kernel_ops
from ascend_platform.pcp import attention as pcp_attention
from ascend_platform.pcp.layout import PCPAttentionLayout

logger = init_logger(__name__)

# Layouts the impl reads, most preferred first: a block's states outermost ([block_size, num_kv_heads, C] per block,
# the order of torch_npu's paged caches); LBHNC is what our KV connectors ask for (a run of blocks is one transfer).
KV_CACHE_LAYOUTS = ("LBNHC", "LBHNC")


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

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple | None:
        from ascend_core.upstream import kv_cache_layouts

        return kv_cache_layouts(KV_CACHE_LAYOUTS)

    @classmethod
    def kv_cache_planes(cls, spec: Any) -> Any:
        """The device KV layout this backend's kernels take (torch_npu's paged caches): K and V as dense planes."""
        from ascend_core.kv.planes import attention_planes

        return attention_planes(spec)

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        """The shape of the tensor bound to a layer: its K plane, then its V plane, each a dense
        `[num_blocks, block_size, num_kv_heads, head_size]` cache (`kv_cache_planes`)."""
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
        """The order vLLM plans a layer's pages in (LBNHC, the preferred layout: block, state, head, content); the
        allocator then lays each planned layer region out as the K and V planes of `get_kv_cache_shape`."""
        return (0, 1, 3, 2, 4) if include_num_layers_dimension else (0, 2, 1, 3)


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
    # query_start_loc / seq_lens on the host, built once per step; None where a graph replays this metadata with
    # other lengths (kernels then read the tensors)
    query_start_loc_host: list[int] | None = None
    seq_lens_host: list[int] | None = None


def step_host_lengths(m: CommonAttentionMetadata, *, seq_lens_exact: bool) -> tuple[list[int], list[int]]:
    """The step's query start offsets and context lengths as host lists, once per step for every layer.

    The offsets come from vLLM's host copy. Its host `seq_lens_cpu_upper_bound` is exact outside speculative decoding
    (optional: read with getattr); otherwise the device lengths are read back here, once per step, not per layer.
    """
    n = m.num_reqs
    query_start_loc = m.query_start_loc_cpu[: n + 1].tolist()
    upper = getattr(m, "seq_lens_cpu_upper_bound", None)
    if seq_lens_exact and upper is not None:
        return query_start_loc, upper[:n].tolist()
    usage.count("attention.ascend.seq_lens_read_back")
    return query_start_loc, m.seq_lens[:n].tolist()


class AscendAttentionMetadataBuilder(AttentionMetadataBuilder[AscendAttentionMetadata]):
    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._pcp_manager: Any = None
        # vLLM's host copy of seq_lens is exact unless speculative decoding runs ahead of it
        self._host_seq_lens_exact = vllm_config.speculative_config is None

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
        query_start_loc_host, seq_lens_host = step_host_lengths(m, seq_lens_exact=self._host_seq_lens_exact)
        return AscendAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            max_query_len=m.max_query_len,
            query_start_loc=m.query_start_loc[: m.num_reqs + 1].to(torch.int32),
            seq_lens=m.seq_lens[: m.num_reqs].to(torch.int32),
            block_table=m.block_table_tensor[: m.num_reqs].to(torch.int32),
            slot_mapping=m.slot_mapping,
            causal=bool(m.causal),
            pcp=self._pcp_manager.attention_layout if self._pcp_manager is not None else None,
            query_start_loc_host=query_start_loc_host,
            seq_lens_host=seq_lens_host,
        )

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> AscendAttentionMetadata:
        """A captured graph replays this metadata with each step's lengths in the persistent tensors: no host lists."""
        metadata = super().build_for_cudagraph_capture(common_attn_metadata)
        metadata.query_start_loc_host = metadata.seq_lens_host = None
        return metadata


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
        self._pcp_kv: torch.Tensor | None = None  # this step's K/V gathered from every PCP rank (this layer)

    def _caches(self, layer, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Key and value views of the layer's KV tensor (views only: no KV memory is held past the call)."""
        if kv_cache.numel() == 0:
            raise RuntimeError(f"ASCEND attention layer {getattr(layer, 'layer_name', '?')!r} was handed no KV cache "
                               f"(shape {tuple(kv_cache.shape)}): the runner has not bound one, or it is asleep")
        kv = attention_kv_of(kv_cache, self.head_size)
        return kv.key, kv.value

    @staticmethod
    def _kv_quant(layer, key_cache: torch.Tensor) -> Any:
        """The layer's int8 KV quantization (None for a float cache); an int8 cache without scales, or scales over a
        float cache, is an error rather than bytes read as the wrong type."""
        quant = getattr(layer, "ascend_kv_quant", None)
        if (quant is not None) != (key_cache.dtype == torch.int8):
            raise RuntimeError(f"ASCEND attention layer {getattr(layer, 'layer_name', '?')!r}: KV cache of dtype "
                               f"{key_cache.dtype} and {'C8 scales' if quant is not None else 'no C8 scales'}")
        return quant

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        key_cache, value_cache = self._caches(layer, kv_cache)
        quant = self._kv_quant(layer, key_cache)
        if quant is not None:  # C8 (refused at start-up with PCP)
            kernel_ops().reshape_and_cache_quant(key, value, key_cache, value_cache, slot_mapping[: key.shape[0]],
                                                 quant.key_scale, quant.key_offset, quant.value_scale,
                                                 quant.value_offset)
            return
        if self.pcp_world_size > 1 and slot_mapping.shape[0] > key.shape[0]:
            # A partitioned step: the slot mapping covers every rank's tokens, which each rank's replica holds.
            self._pcp_kv = pcp_attention.all_gather_kv(key, value)
            pcp_attention.cache_gathered_kv(self._pcp_kv, key.shape[-1], key_cache, value_cache, slot_mapping)
            return
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
        key_cache, value_cache = self._caches(layer, kv_cache)
        gathered, self._pcp_kv = self._pcp_kv, None
        quant = self._kv_quant(layer, key_cache)
        if quant is not None:
            m = attn_metadata
            kernel_ops().paged_attention_antiquant(
                query[:n], key_cache, value_cache, m.block_table, m.query_start_loc, m.seq_lens,
                key_scale=quant.key_scale, key_offset=quant.key_offset, value_scale=quant.value_scale,
                value_offset=quant.value_offset, scale=self.scale, causal=m.causal,
                sliding_window=self.sliding_window, sinks=self.sinks, out=output[:n],
                query_start_loc_host=m.query_start_loc_host, seq_lens_host=m.seq_lens_host)
            usage.count("attention.ascend.forward")
            return output
        if attn_metadata.pcp is not None and gathered is not None:
            return self._forward_pcp(query, key_cache, value_cache, attn_metadata, gathered, output)
        kernel_ops().paged_attention(
            query[:n], key_cache, value_cache, attn_metadata.block_table, attn_metadata.query_start_loc,
            attn_metadata.seq_lens, scale=self.scale, causal=attn_metadata.causal,
            sliding_window=self.sliding_window, sinks=self.sinks, out=output[:n],
            query_start_loc_host=attn_metadata.query_start_loc_host, seq_lens_host=attn_metadata.seq_lens_host)
        usage.count("attention.ascend.forward")
        return output

    def _forward_pcp(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     m: AscendAttentionMetadata, gathered: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """Decode rows read the KV replica; prefill chunks attend to the cached context and the gathered step K/V."""
        layout = m.pcp
        assert layout is not None
        d, t0, n = layout.first_prefill_row, layout.prefill_token_start, m.num_actual_tokens
        if d:
            kernel_ops().paged_attention(
                query[:t0], key_cache, value_cache, m.block_table[:d], m.query_start_loc[: d + 1],
                m.seq_lens[:d], scale=self.scale, causal=m.causal, out=output[:t0],
                query_start_loc_host=None if m.query_start_loc_host is None else m.query_start_loc_host[: d + 1],
                seq_lens_host=None if m.seq_lens_host is None else m.seq_lens_host[:d])
        pcp_attention.chunk_attention(query[t0:n], gathered, query.shape[-1], key_cache, value_cache,
                                      m.block_table[d:], layout, scale=self.scale, out=output[t0:n])
        usage.count("attention.ascend.forward")
        return output


class Ascend310PAttentionBackend(AscendAttentionBackend):
    """The 310P inference card's backend: same contract, but its runner feeds it private per-layer KV buffers."""

    @staticmethod
    def get_name() -> str:
        return "ASCEND_310P"
