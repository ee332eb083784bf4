"""DeepSeek V4's lightning indexer step on `ascend_kernels`: score a query's complete compressed keys, keep the best.

V4's indexer keys are compressed (one per `ratio` tokens, written by the indexer's compressor into its own paged
cache); a token at position p may select among the (p + 1) // ratio complete ones. Every token is scored as its own
row (its own key count and its request's page table), prefill and decode alike, and leaves its `index_topk`
request-local key indices (-1 padded) in the model's shared `topk_indices_buffer`, which the layer's sparse attention
reads next. `AscendSparseAttnIndexer.forward_oot` sends compressed indexers here.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.forward_context import get_forward_context

from ascend_platform import usage
from ascend_platform.facade import kernel_ops


def dsv4_indexer_topk(layer: Any, q_quant: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Fill `layer.topk_indices_buffer` with each scheduled token's selection; returns the buffer."""
    buffer = layer.topk_indices_buffer
    metadata = get_forward_context().attn_metadata
    if not isinstance(metadata, dict) or layer.k_cache.prefix not in metadata:
        return buffer  # profiling / dummy run: no cache yet
    m = metadata[layer.k_cache.prefix]
    n, topk = m.num_actual_tokens, layer.topk_tokens
    buffer[: q_quant.shape[0]] = -1
    lens = m.compressed_lens[:n]
    max_len = int(lens.max()) if n else 0
    if max_len == 0:
        return buffer
    cache = layer.k_cache.kv_cache
    page_table = m.block_table[m.token_to_req_indices[:n].long()]
    ops = kernel_ops()
    logits = ops.dsv4_fp8_paged_mqa_logits(q_quant[:n], cache.view(cache.shape[0], -1), weights[:n], lens,
                                           page_table, cache.shape[1], max_len)
    pages = torch.empty((n, topk), dtype=torch.int32, device=q_quant.device)
    ops.dsv4_topk_transform(logits, lens, page_table, pages, cache.shape[1], buffer[:n, :topk])
    usage.count("attention.ascend_dsa.indexed_tokens", n)
    return buffer
