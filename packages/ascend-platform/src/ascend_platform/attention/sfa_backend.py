"""The Ascend SFA backend: DeepSeek V3.2's sparse MLA, each query attending only to the tokens its indexer picked.

vLLM's `MLAAttention` layer runs a sparse impl that has no dense prefill (`supports_dense_mha_prefill = False`) on the
MQA path for every token, prefill included: the query arrives with W_UK absorbed, and `forward_mqa` attends over the
latent cache at the positions the lightning indexer (`ascend_platform.attention.sfa_indexer`) wrote into the model's
shared `topk_indices_buffer` earlier in the same layer. The latent cache is MLA's (`kv_lora_rank` + rope per token),
written by `do_kv_cache_update` as in `AscendMLAImpl`. The indexer's own key-cache layers get
`AscendSFAIndexerBackend`, built by the same metadata builder: the indexer writes and scores keys with its layers'
block table and slots, and hands on positions (not slots), which the attention maps through its own block table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.logger import init_logger
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from ascend_platform import usage
from ascend_platform.attention.backend import step_host_lengths
from ascend_platform.attention.mla_backend import (
    MLA_BLOCK_MULTIPLE,
    MLA_KV_CACHE_DTYPES,
    AscendMLABackend,
    AscendMLAImpl,
)
from ascend_platform.facade import kernel_ops

logger = init_logger(__name__)


class AscendSFABackend(AscendMLABackend):
    @staticmethod
    def get_name() -> str:
        return "ASCEND_SFA"

    @staticmethod
    def get_impl_cls() -> type[AscendSFAImpl]:
        return AscendSFAImpl

    @staticmethod
    def get_builder_cls() -> type[AscendSFAMetadataBuilder]:
        return AscendSFAMetadataBuilder

    @classmethod
    def is_sparse(cls) -> bool:
        return True


class AscendSFAIndexerBackend(AttentionBackend):
    """What the indexer's key-cache layers (`DeepseekV32IndexerCache`) get instead of vLLM's CUDA indexer backend
    (see the `sfa.indexer_cache_backend` patch); the layer has no impl, only metadata and a cache."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list] = list(MLA_KV_CACHE_DTYPES)

    @staticmethod
    def get_name() -> str:
        return "ASCEND_SFA_INDEXER"

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(MLA_BLOCK_MULTIPLE)]

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("the SFA indexer cache has no attention impl: AscendSparseAttnIndexer reads it")

    @staticmethod
    def get_builder_cls() -> type[AscendSFAMetadataBuilder]:
        return AscendSFAMetadataBuilder


@dataclass
class AscendSFAMetadata:
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    num_actual_tokens: int
    query_start_loc: torch.Tensor  # int32 [num_reqs + 1]
    slot_mapping: torch.Tensor
    seq_lens: torch.Tensor  # int32 [num_reqs]: context including this step's tokens
    block_table: torch.Tensor  # int32 [num_reqs, max_blocks]
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    # query_start_loc / seq_lens on the host, built once per step for every layer's indexer and attention
    query_start_loc_host: list[int] | None = None
    seq_lens_host: list[int] | None = None
    # vLLM's MLA layer reads these: no dense prefill and no separate decode pass, every token takes the MQA path.
    prefill: None = None
    decode: None = None
    causal: bool = True


class AscendSFAMetadataBuilder(AttentionMetadataBuilder[AscendSFAMetadata]):
    reorder_batch_threshold: int = 1

    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._host_seq_lens_exact = vllm_config.speculative_config is None

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> AscendSFAMetadata:
        m = common_attn_metadata
        if isinstance(m.causal, torch.Tensor) or not m.causal:
            raise NotImplementedError("ASCEND_SFA serves causal decoder attention only")
        nd, npf, nd_tokens, _ = split_decodes_and_prefills(m, decode_threshold=self.reorder_batch_threshold)
        if nd and npf:
            usage.count("attention.ascend_sfa.mixed_batches")
        n = m.num_reqs
        qsl_host, seq_host = step_host_lengths(m, seq_lens_exact=self._host_seq_lens_exact)
        return AscendSFAMetadata(
            num_reqs=n, max_query_len=m.max_query_len, max_seq_len=m.max_seq_len,
            num_actual_tokens=m.num_actual_tokens, query_start_loc=m.query_start_loc[:n + 1].to(torch.int32),
            slot_mapping=m.slot_mapping, seq_lens=m.seq_lens[:n].to(torch.int32),
            block_table=m.block_table_tensor[:n].to(torch.int32), num_decodes=nd, num_decode_tokens=nd_tokens,
            num_prefills=npf, query_start_loc_host=qsl_host, seq_lens_host=seq_host)


class AscendSFAImpl(AscendMLAImpl):
    """MLA's latent cache and its writes (`AscendMLAImpl`), attention over the indexer's picks for every token."""

    is_sparse: ClassVar[bool] = True
    supports_dense_mha_prefill: bool = False
    backend_name: ClassVar[str] = "ASCEND_SFA"

    def __init__(self, *args: Any, **mla_args: Any) -> None:
        super().__init__(*args, **mla_args)
        topk_buffer = mla_args.get("topk_indices_buffer")
        if topk_buffer is None:
            raise ValueError("ASCEND_SFA needs the model's topk_indices_buffer (DeepSeek V3.2's indexer output)")
        self.topk_indices_buffer = topk_buffer

    def record_logical_topk_ready(self) -> None:
        """vLLM's MLA wrapper marks that this step's top-k positions are in the buffer; ours are read directly."""

    def forward_mqa(self, q, kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: AscendSFAMetadata, layer):
        q_nope, q_rope = q if isinstance(q, tuple) else q.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        kv = self._views(kv_c_and_k_pe_cache)
        m = attn_metadata
        out = kernel_ops().sparse_mla_attention(q_nope, q_rope, kv.latent, kv.rope, m.block_table,
                                                m.query_start_loc, self.topk_indices_buffer, scale=self.scale,
                                                query_start_loc_host=m.query_start_loc_host)
        usage.count("attention.ascend_sfa.decode_tokens", m.num_decode_tokens)
        usage.count("attention.ascend_sfa.prefill_tokens", m.num_actual_tokens - m.num_decode_tokens)
        return out, None

    def forward_mha(self, *args, **kwargs) -> None:
        raise NotImplementedError("ASCEND_SFA runs every token on the sparse MQA path (no dense MHA prefill)")
