"""The attention backends of DeepSeek V4.1's four cache kinds on Ascend, with Triton-free metadata builders.

Every cache layer names its backend, and vLLM builds one metadata builder per KV cache group from it: the
sliding-window latent (`AscendDSAV41SWABackend`), the compressed latent of a KV source (`AscendDSAV41Backend`, the
attention layer itself), the index keys (`AscendDSAV41IndexerBackend`) and a ratio-2 compressor's ring
(`AscendDSAV41CompressorBackend`). vLLM's builders compute their tables with Triton kernels; ours fill what the
Ascend layer reads, in torch (`ascend_platform.models.deepseek_v4.slots`). The sliding-window and index-key
metadata are V4's (same fields, any ratio); the compressed latent and the ring are V4.1's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.models.deepseek_v41.compressor import CompressorBackend
from vllm.models.deepseek_v41.sparse_mla import DeepseekV4SparseMLABackend
from vllm.v1.attention.backend import AttentionMetadataBuilder, MultipleOf

from ascend_platform.models.deepseek_v4.backends import (
    AscendDSAIndexerBackend,
    AscendDSAIndexerMetadataBuilder,
    AscendDSASWABackend,
    AscendDSASWAMetadataBuilder,
)
from ascend_platform.models.deepseek_v4.slots import compressed_slot_mapping, requests_and_positions

# Our ops address rows by slot, whatever the page: a group's blocks are never split into kernel blocks.
_ANY_BLOCK = [MultipleOf(1)]


class AscendDSAV41SWABackend(AscendDSASWABackend):
    @staticmethod
    def get_name() -> str:
        return "ASCEND_DSA_V41_SWA"

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return list(_ANY_BLOCK)

    @staticmethod
    def get_builder_cls() -> type[AscendDSASWAMetadataBuilder]:
        return AscendDSASWAMetadataBuilder


@dataclass
class AscendDSAV41Metadata:
    """A compressed latent cache: where each token's completed entry goes, and each request's pages."""

    slot_mapping: torch.Tensor  # [tokens] int64: compressed row a token completes, -1 otherwise
    block_table: torch.Tensor  # [reqs, blocks]
    block_size: int  # compressed rows per block
    token_to_req_indices: torch.Tensor  # [tokens] int32
    num_actual_tokens: int
    max_seq_len: int


class AscendDSAV41MetadataBuilder(AttentionMetadataBuilder):
    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.compress_ratio = int(kv_cache_spec.tokens_per_state)
        if self.compress_ratio not in (1, 2):
            raise ValueError(f"DeepSeek V4.1 compressed caches have ratio 1 or 2, got {self.compress_ratio}")

    def build(self, common_prefix_len: int, common_attn_metadata: Any,
              fast_build: bool = False) -> AscendDSAV41Metadata:
        cm = common_attn_metadata
        requests, positions = requests_and_positions(cm)
        rows_per_block = int(self.kv_cache_spec.num_states)
        block_table = cm.block_table_tensor.clamp(min=0)
        return AscendDSAV41Metadata(
            slot_mapping=compressed_slot_mapping(positions, cm.slot_mapping, requests, block_table, rows_per_block,
                                                 self.compress_ratio),
            block_table=block_table, block_size=rows_per_block, token_to_req_indices=requests,
            num_actual_tokens=cm.num_actual_tokens, max_seq_len=cm.max_seq_len)


class AscendDSAV41Backend(DeepseekV4SparseMLABackend):
    supported_dtypes = [torch.float32, torch.bfloat16, torch.float16]

    @staticmethod
    def get_name() -> str:
        return "ASCEND_DSA_V41"

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return list(_ANY_BLOCK)

    @staticmethod
    def get_builder_cls() -> type[AscendDSAV41MetadataBuilder]:
        return AscendDSAV41MetadataBuilder


class AscendDSAV41IndexerBackend(AscendDSAIndexerBackend):
    @staticmethod
    def get_name() -> str:
        return "ASCEND_DSA_V41_INDEXER"

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return list(_ANY_BLOCK)

    @staticmethod
    def get_builder_cls() -> type[AscendDSAIndexerMetadataBuilder]:
        return AscendDSAIndexerMetadataBuilder


@dataclass
class AscendDSAV41RingMetadata:
    """A ratio-2 compressor's ring: each token's row (`block * capacity + position % capacity`, -1 for none), the
    batch's query starts and each token's request."""

    slot_mapping: torch.Tensor  # [tokens] int64
    query_start_loc: torch.Tensor  # [reqs + 1]
    token_to_req_indices: torch.Tensor  # [tokens] int32


class AscendDSAV41RingMetadataBuilder(AttentionMetadataBuilder):
    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.capacity = int(kv_cache_spec.block_size)

    def build(self, common_prefix_len: int, common_attn_metadata: Any,
              fast_build: bool = False) -> AscendDSAV41RingMetadata:
        cm = common_attn_metadata
        requests, positions = requests_and_positions(cm)
        n = cm.num_actual_tokens
        # One ring block per request; block 0 is the null block a padding / dummy request holds.
        blocks = cm.block_table_tensor[:, 0].to(torch.int64)[requests.long()]
        slots = blocks * self.capacity + positions % self.capacity
        valid = (blocks > 0) & (torch.arange(requests.numel(), device=slots.device) < n)
        return AscendDSAV41RingMetadata(slot_mapping=torch.where(valid, slots, torch.full_like(slots, -1)),
                                        query_start_loc=cm.query_start_loc, token_to_req_indices=requests)


class AscendDSAV41CompressorBackend(CompressorBackend):
    @staticmethod
    def get_name() -> str:
        return "ASCEND_DSA_V41_COMPRESSOR"

    @staticmethod
    def get_builder_cls() -> type[AscendDSAV41RingMetadataBuilder]:
        return AscendDSAV41RingMetadataBuilder
