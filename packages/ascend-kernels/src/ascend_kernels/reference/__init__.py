"""The pure-torch reference backend: readable, device-agnostic, and the simulated-NPU lane's kernels.

Every op follows the contract in `ascend_kernels.ops`; the tests hold each one against a naive formulation.
"""

# ruff: noqa: F401  (the package namespace is the backend: `reference.<op>` for every op)
from __future__ import annotations

from ascend_kernels.reference.attention import paged_attention
from ascend_kernels.reference.batch_prep import compute_slot_mapping
from ascend_kernels.reference.cache_write import reshape_and_cache, reshape_and_cache_mla
from ascend_kernels.reference.context_parallel import (
    attention_with_lse,
    gather_kv_rows,
    merge_attention_states,
    paged_attention_with_lse,
)
from ascend_kernels.reference.dsv4_attention import (
    dsv4_inverse_rope_o_proj,
    dsv4_qnorm_rope_kv_insert,
    dsv4_sparse_mla_with_kvcache,
)
from ascend_kernels.reference.dsv4_compressor import (
    dsv4_compress_norm_rope_store,
    dsv4_compress_norm_rope_store_indexer,
    dsv4_save_partial_states,
)
from ascend_kernels.reference.dsv4_hyper import dsv4_hc_head, dsv4_mhc_post, dsv4_mhc_pre
from ascend_kernels.reference.dsv4_indexer import (
    dsv4_fp8_paged_mqa_logits,
    dsv4_indexer_q_rope_quant,
    dsv4_topk_transform,
)
from ascend_kernels.reference.dsv41_attention import dsv41_q_rope_kv_insert
from ascend_kernels.reference.dsv41_compressor import (
    dsv41_indexer_k_norm_rope_store,
    dsv41_rope_quant_insert,
    dsv41_save_compress_norm,
)
from ascend_kernels.reference.dsv41_engram import (
    dsv41_engram_gate,
    dsv41_engram_hash,
    dsv41_engram_lookup,
    dsv41_engram_write_hash_cache,
)
from ascend_kernels.reference.dsv41_hyper import dsv41_hc_collapse, dsv41_mhc_pre_delayed
from ascend_kernels.reference.dsv41_indexer import dsv41_apply_candidate_mask, dsv41_select_candidate_blocks
from ascend_kernels.reference.gumbel import gumbel_sample
from ascend_kernels.reference.layers import rms_norm, rotary_embedding, silu_and_mul
from ascend_kernels.reference.logprobs import gather_logprobs, token_ranks
from ascend_kernels.reference.mla_decode import mla_decode_attention
from ascend_kernels.reference.mla_prefill import gather_mla_cache, mla_prefill_attention
from ascend_kernels.reference.moe import fused_moe, moe_gating_topk
from ascend_kernels.reference.rejection import rejection_sample
from ascend_kernels.reference.sampling import sample_greedy, top_k_top_p
from ascend_kernels.reference.sparse_mla import (
    indexer_cache_write,
    indexer_topk,
    quantize_fp8_groups,
    sparse_mla_attention,
)
from ascend_kernels.reference.vision import vision_attention


def __getattr__(name: str):
    # REFERENCE_OPS (op name -> function) is derived from the op declarations (`ascend_kernels.op_registry`).
    if name == "REFERENCE_OPS":
        from ascend_kernels.op_registry import reference_ops

        return reference_ops()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
