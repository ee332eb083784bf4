"""The attention backends of DeepSeek V4's four cache kinds on Ascend, with Triton-free metadata builders.

A V4 layer registers up to four cache layers, each naming its backend (vLLM builds one metadata builder per KV cache
group from it): the sliding-window latent cache (`AscendDSASWABackend`), the compressed latent cache of a
compressed layer (`AscendDSABackend`, the layer itself; its registry name ASCEND_DSA is the selector's row), the
indexer's compressed key cache (`AscendDSAIndexerBackend`) and each compressor's state cache
(`AscendDSACompressorBackend`). vLLM's builders compute their slot and index tables with Triton kernels and plan for
CUDA kernels our ops never read; ours fill the fields the Ascend layer and indexer read, in torch (`slots`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.models.deepseek_v4.compressor import CompressorBackend, CompressorMetadata, CompressorMetadataBuilder
from vllm.models.deepseek_v4.cpu.cpu_mla import (
    DeepseekV4CPUFlashMLAMetadataBuilder,
    DeepseekV4CPUIndexerBackend,
    DeepseekV4CPUSparseBackend,
)
from vllm.models.deepseek_v4.sparse_mla import DeepseekV4FlashMLAMetadata
from vllm.v1.attention.backend import AttentionMetadataBuilder
from vllm.v1.attention.backends.mla.sparse_swa import (
    DeepseekSparseSWABackend,
    DeepseekSparseSWAMetadata,
    DeepseekSparseSWAMetadataBuilder,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from ascend_platform import usage
from ascend_platform.models.deepseek_v4.slots import compressed_slot_mapping, requests_and_positions, token_requests


class AscendDSAMetadataBuilder(DeepseekV4CPUFlashMLAMetadataBuilder):
    """The compressed latent cache of a compressed layer: its block table and the compressed states' slots."""

    def build(self, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False):
        cm = common_attn_metadata
        requests, positions = requests_and_positions(cm)
        slot_mapping = cm.slot_mapping
        if self.compress_ratio > 1:
            slot_mapping = compressed_slot_mapping(positions, cm.slot_mapping, requests, cm.block_table_tensor,
                                                   int(self.kv_cache_spec.num_states), self.compress_ratio)
        return DeepseekV4FlashMLAMetadata(
            num_reqs=cm.num_reqs, max_query_len=cm.max_query_len, max_seq_len=cm.max_seq_len,
            num_actual_tokens=cm.num_actual_tokens, query_start_loc=cm.query_start_loc, slot_mapping=slot_mapping,
            block_table=cm.block_table_tensor, req_id_per_token=requests, block_size=self.kv_cache_spec.block_size,
            topk_tokens=self.topk_tokens)


class AscendDSABackend(DeepseekV4CPUSparseBackend):
    @staticmethod
    def get_name() -> str:
        return "ASCEND_DSA"

    @staticmethod
    def get_builder_cls() -> type[AscendDSAMetadataBuilder]:
        return AscendDSAMetadataBuilder


class AscendDSASWAMetadataBuilder(DeepseekSparseSWAMetadataBuilder):
    """The sliding-window latent cache: every token's own slot, request, and the block table."""

    def build(self, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False,
              replay_start: torch.Tensor | None = None) -> DeepseekSparseSWAMetadata:
        cm = common_attn_metadata
        num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens = split_decodes_and_prefills(
            cm, decode_threshold=self.decode_threshold)
        _count_batch_kinds(cm, num_decodes, num_prefills)
        return DeepseekSparseSWAMetadata(
            block_table=cm.block_table_tensor, slot_mapping=cm.slot_mapping, block_size=self.block_size,
            seq_lens=cm.seq_lens, query_start_loc=cm.query_start_loc, query_start_loc_cpu=cm.query_start_loc_cpu,
            is_valid_token=cm.slot_mapping >= 0,
            token_to_req_indices=token_requests(cm.query_start_loc, cm.num_actual_tokens),
            num_decodes=num_decodes, num_prefills=num_prefills, num_decode_tokens=num_decode_tokens,
            num_prefill_tokens=num_prefill_tokens)


def _count_batch_kinds(cm: Any, num_decodes: int, num_prefills: int) -> None:
    """Usage counts an engine test reads: steps mixing decodes with prefills, and prefill (chunks) continuing a
    request's cached context (chunked prefill). Counted once per step: every V4 model has one SWA cache group."""
    if num_decodes and num_prefills:
        usage.count("attention.ascend_dsa.mixed_batches")
    if num_prefills:
        query_lens = cm.query_start_loc_cpu[1:] - cm.query_start_loc_cpu[:-1]
        context = cm.seq_lens.cpu() - query_lens
        usage.count_on_device("attention.ascend_dsa.context_prefills", context[num_decodes:] > 0)


class AscendDSASWABackend(DeepseekSparseSWABackend):
    @staticmethod
    def get_name() -> str:
        return "ASCEND_DSA_SWA"

    @staticmethod
    def get_builder_cls() -> type[AscendDSASWAMetadataBuilder]:
        return AscendDSASWAMetadataBuilder


@dataclass
class AscendDSAIndexerMetadata:
    """What the Ascend V4 indexer reads: per token its request, its count of complete compressed keys, and the
    compressed key slots it writes."""

    slot_mapping: torch.Tensor  # [tokens] compressed-key slot a token completes, -1 otherwise
    block_table: torch.Tensor  # [reqs, blocks] of the indexer cache
    block_size: int  # compressed keys per block
    token_to_req_indices: torch.Tensor  # [tokens]
    compressed_lens: torch.Tensor  # [tokens] int32: complete compressed keys a token may select from
    num_actual_tokens: int
    max_seq_len: int
    num_decode_tokens: int
    num_prefill_tokens: int


class AscendDSAIndexerMetadataBuilder(AttentionMetadataBuilder):
    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.compress_ratio = int(kv_cache_spec.tokens_per_state)

    def build(self, common_prefix_len: int, common_attn_metadata: Any,
              fast_build: bool = False) -> AscendDSAIndexerMetadata:
        cm = common_attn_metadata
        requests, positions = requests_and_positions(cm)
        _, _, num_decode_tokens, num_prefill_tokens = split_decodes_and_prefills(cm, decode_threshold=1)
        states_per_block = int(self.kv_cache_spec.num_states)
        return AscendDSAIndexerMetadata(
            slot_mapping=compressed_slot_mapping(positions, cm.slot_mapping, requests, cm.block_table_tensor,
                                                 states_per_block, self.compress_ratio),
            block_table=cm.block_table_tensor.clamp(min=0), block_size=states_per_block,
            token_to_req_indices=requests,
            compressed_lens=torch.div(positions + 1, self.compress_ratio, rounding_mode="floor").to(torch.int32),
            num_actual_tokens=cm.num_actual_tokens, max_seq_len=cm.max_seq_len,
            num_decode_tokens=num_decode_tokens, num_prefill_tokens=num_prefill_tokens)


class AscendDSAIndexerBackend(DeepseekV4CPUIndexerBackend):
    @staticmethod
    def get_name() -> str:
        return "ASCEND_DSA_INDEXER"

    @staticmethod
    def get_builder_cls() -> type[AscendDSAIndexerMetadataBuilder]:
        return AscendDSAIndexerMetadataBuilder


class AscendDSACompressorMetadataBuilder(CompressorMetadataBuilder):
    """A compressor's state cache: its own slots (one state row per token), block table and each token's request."""

    def build(self, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False) -> CompressorMetadata:
        cm = common_attn_metadata
        return CompressorMetadata(block_table=cm.block_table_tensor.clamp(min=0), slot_mapping=cm.slot_mapping,
                                  block_size=self.block_size,
                                  token_to_req_indices=token_requests(cm.query_start_loc, cm.num_actual_tokens))


class AscendDSACompressorBackend(CompressorBackend):
    @staticmethod
    def get_name() -> str:
        return "ASCEND_DSA_COMPRESSOR"

    @staticmethod
    def get_builder_cls() -> type[AscendDSACompressorMetadataBuilder]:
        return AscendDSACompressorMetadataBuilder
