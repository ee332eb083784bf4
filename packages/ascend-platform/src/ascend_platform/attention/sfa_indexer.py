"""DeepSeek V3.2's lightning indexer on Ascend: the out-of-tree `SparseAttnIndexer` over `ascend_kernels` (V4's
compressed indexer goes to `dsv4_indexer`).

vLLM's `Indexer` module projects the indexer query (rotated, fp8-quantized per 128 elements with its scale folded
into the per-head weights) and key, then calls its `SparseAttnIndexer` custom op, whose in-tree forwards are CUDA,
ROCm, XPU or vLLM-CPU kernels. Ours writes the key into the indexer cache (`indexer_cache_write`), scores every
visible key per query (`indexer_topk`) and leaves each query's best `index_topk` positions in the model's shared
`topk_indices_buffer`, which `AscendSFAImpl` reads in the same layer.

The indexer-cache layers (`DeepseekV32IndexerCache`) name vLLM's CUDA indexer backend themselves; the
`sfa.indexer_cache_backend` patch makes them name `AscendSFAIndexerBackend`, and `sfa.indexer_query_quant` runs the
Indexer's query quantization on our kernels; both are applied once per process when the first Ascend indexer is
built (before the cache layers are asked for their backend and before any forward).
"""

from __future__ import annotations

import threading

import torch

from ascend_platform import usage
from ascend_platform.facade import kernel_ops

INDEXER_QUANT_BLOCK = 128

_lock = threading.Lock()
_state = {"registered": False, "backend_patch": None}


def indexer_views(kv_cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys float8 `[num_blocks, block_size, 1, head_dim]`, scales float32 `[..., 1, head_dim // 128]`) of the
    indexer cache vLLM binds (`[num_blocks, block_size, head_dim + head_dim // 128 * 4]` bytes per state, 1-byte
    dtype): strided views of the same bytes."""
    if kv_cache.dim() == 4:  # the allocator's [B, H=1, N, C]
        kv_cache = kv_cache[:, 0]
    scales = head_dim // INDEXER_QUANT_BLOCK
    if kv_cache.dim() != 3 or kv_cache.element_size() != 1 or kv_cache.shape[-1] != head_dim + 4 * scales:
        raise ValueError(f"indexer cache of shape {tuple(kv_cache.shape)} and dtype {kv_cache.dtype} does not hold "
                         f"{head_dim} fp8 key bytes + {scales} float32 scales per state")
    raw = kv_cache.view(torch.uint8)
    keys = raw[..., :head_dim].view(torch.float8_e4m3fn).unsqueeze(2)
    return keys, raw[..., head_dim:].view(torch.float32).unsqueeze(2)


def full_selections(query_start_loc: list[int], seq_lens: list[int], topk: int) -> int:
    """How many queries see at least `topk` keys (query i of m sits at position seq_len - m + i, so it sees
    seq_len - m + i + 1 keys)."""
    total = 0
    for r, seq_len in enumerate(seq_lens):
        m = query_start_loc[r + 1] - query_start_loc[r]
        first_full = max(topk - (seq_len - m + 1), 0)  # the first query index that sees topk keys
        total += max(m - first_full, 0)
    return total


def _ascend_indexer_backend(self):
    from ascend_platform.attention.sfa_backend import AscendSFAIndexerBackend

    return AscendSFAIndexerBackend


def _quantize_indexer_query(x: torch.Tensor, group_size: int, eps: float = 1e-10, dtype: torch.dtype | None = None,
                            column_major_scales: bool = False, tma_aligned_scales: bool = False,
                            out_q: torch.Tensor | None = None, use_ue8m0: bool | None = None):
    """vLLM's per_token_group_quant_fp8 as the Indexer calls it, on our kernels (see `sfa.indexer_query_quant`)."""
    if column_major_scales or tma_aligned_scales or out_q is not None or dtype not in (None, torch.float8_e4m3fn):
        raise NotImplementedError(
            f"Ascend indexer query quantization: row-major float8_e4m3fn only (got column_major_scales="
            f"{column_major_scales}, tma_aligned_scales={tma_aligned_scales}, out_q="
            f"{'set' if out_q is not None else None}, dtype={dtype})")
    return kernel_ops().quantize_fp8_groups(x, group_size=group_size, pow2_scales=bool(use_ue8m0))


def _use_ascend_indexer_backend() -> None:
    from ascend_platform.patches.catalogue import REGISTRY

    with _lock:
        if _state["backend_patch"] is None:
            _state["backend_patch"] = (REGISTRY.apply("sfa.indexer_cache_backend", _ascend_indexer_backend),
                                       REGISTRY.apply("sfa.indexer_query_quant", _quantize_indexer_query))


def register_sparse_indexer() -> bool:
    """Register `AscendSparseAttnIndexer` with vLLM (once per process; False when already registered)."""
    with _lock:
        if _state["registered"]:
            return False
        _state["registered"] = True
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.custom_op import CustomOp
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    @CustomOp.register_oot(name="SparseAttnIndexer")
    class AscendSparseAttnIndexer(SparseAttnIndexer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            if self.use_fp4_cache or self.use_pcp or self.dcp_world_size > 1:
                raise NotImplementedError(
                    f"Ascend sparse indexer serves DeepSeek V3.2's and V4's fp8 indexers without context "
                    f"parallelism; got "
                    f"use_fp4_cache={self.use_fp4_cache}, compress_ratio={self.compress_ratio}, "
                    f"pcp={self.use_pcp}, dcp_world_size={self.dcp_world_size}")
            if self.quant_block_size != INDEXER_QUANT_BLOCK or self.head_dim % INDEXER_QUANT_BLOCK:
                raise NotImplementedError(f"Ascend sparse indexer: quant block {self.quant_block_size} / head_dim "
                                          f"{self.head_dim} (needs {INDEXER_QUANT_BLOCK} and a multiple of it)")
            if self.compress_ratio == 1:  # V3.2's cache layers; V4's name their Ascend backend themselves
                _use_ascend_indexer_backend()

        def forward_oot(self, hidden_states: torch.Tensor, q_quant, k: torch.Tensor | None,
                        weights: torch.Tensor) -> torch.Tensor:
            if self.compress_ratio > 1:  # DeepSeek V4: compressed keys, written by the indexer's compressor
                from ascend_platform.attention.dsv4_indexer import dsv4_indexer_topk

                return dsv4_indexer_topk(self, q_quant, weights)
            metadata = get_forward_context().attn_metadata
            if not isinstance(metadata, dict) or self.k_cache.prefix not in metadata:
                return self.topk_indices_buffer  # profiling / dummy run: no cache yet
            m = metadata[self.k_cache.prefix]
            n = m.num_actual_tokens
            keys, scales = indexer_views(self.k_cache.kv_cache, self.head_dim)
            ops = kernel_ops()
            if k is not None and not self.skip_k_cache_insert:
                ops.indexer_cache_write(k[:n], keys, scales, m.slot_mapping[:n])
            topk = ops.indexer_topk(q_quant[:n], weights[:n], keys, scales, m.block_table, m.query_start_loc,
                                    m.seq_lens, topk=self.topk_tokens, query_start_loc_host=m.query_start_loc_host,
                                    seq_lens_host=m.seq_lens_host)
            self.topk_indices_buffer[:n, : self.topk_tokens] = topk
            self.topk_indices_buffer[n: hidden_states.shape[0]] = -1
            usage.count("attention.ascend_sfa.indexed_tokens", n)
            # Queries whose selection is full: they saw index_topk keys or more (beyond that the rest are dropped).
            # Counted from the host lengths: reading the selection back would sync the device once per layer.
            usage.count("attention.ascend_sfa.full_selections",
                        full_selections(m.query_start_loc_host, m.seq_lens_host, self.topk_tokens))
            return self.topk_indices_buffer

    return True
