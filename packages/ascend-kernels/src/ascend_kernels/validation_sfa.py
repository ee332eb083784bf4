"""Argument checks of the sparse-attention (SFA) ops: the indexer cache write, its top-k and sparse MLA
(metadata only, as `ascend_kernels.validation`)."""

from __future__ import annotations

import torch

from ascend_kernels.validation import fail, floating, index, number, same_device, start_offsets, tensor

QUANT_BLOCK = 128


def _indexer_cache(op: str, k_cache, scale_cache, d: int, dev) -> None:
    dims = f"[num_blocks, block_size, 1, {d}] of dtype float8_e4m3fn"
    tensor(op, "k_cache", k_cache, 4, dims)
    if k_cache.dtype != torch.float8_e4m3fn or k_cache.shape[2:] != (1, d):
        fail(op, "k_cache", k_cache, dims)
    same_device(op, "k_cache", k_cache, dev, dims)
    dims = f"[{k_cache.shape[0]}, {k_cache.shape[1]}, 1, {d // QUANT_BLOCK}] of dtype float32"
    tensor(op, "scale_cache", scale_cache, 4, dims)
    if scale_cache.dtype != torch.float32 or scale_cache.shape != (*k_cache.shape[:3], d // QUANT_BLOCK):
        fail(op, "scale_cache", scale_cache, dims)
    same_device(op, "scale_cache", scale_cache, dev, dims)


def _head_dim(op: str, name: str, t: torch.Tensor) -> int:
    d = t.shape[-1]
    if d % QUANT_BLOCK:
        fail(op, name, t, f"a last dim that is a multiple of {QUANT_BLOCK} (one scale per {QUANT_BLOCK} elements)")
    return d


def check_quantize_fp8_groups(x, group_size) -> None:
    op = "quantize_fp8_groups"
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        fail(op, "x", x, "a tensor [..., D]")
    floating(op, "x", x, "[..., D]")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0 or x.shape[-1] % group_size:
        fail(op, "group_size", group_size, f"a positive int dividing the last dim {x.shape[-1]}")


def check_indexer_cache_write(k, k_cache, scale_cache, slot_mapping) -> None:
    op = "indexer_cache_write"
    tensor(op, "k", k, 2, "[num_tokens, head_dim]")
    floating(op, "k", k, "[num_tokens, head_dim]")
    _indexer_cache(op, k_cache, scale_cache, _head_dim(op, "k", k), k.device)
    index(op, "slot_mapping", slot_mapping, 1, f"[>= {k.shape[0]}]")
    if slot_mapping.shape[0] < k.shape[0]:
        fail(op, "slot_mapping", slot_mapping, f"[>= {k.shape[0]}] (one slot per token)")


def _requests(op: str, block_table, query_start_loc, seq_lens, dev) -> int:
    index(op, "block_table", block_table, 2, "[num_reqs, max_blocks]")
    same_device(op, "block_table", block_table, dev, "[num_reqs, max_blocks]")
    r = block_table.shape[0]
    start_offsets(op, "query_start_loc", query_start_loc, r, dev, what="num_reqs")
    if seq_lens is not None:
        index(op, "seq_lens", seq_lens, 1, f"[{r}]")
        if seq_lens.shape[0] != r:
            fail(op, "seq_lens", seq_lens, f"[{r}] (num_reqs) of dtype int32 or int64")
        same_device(op, "seq_lens", seq_lens, dev, f"[{r}]")
    return r


def check_indexer_topk(q, weights, k_cache, scale_cache, block_table, query_start_loc, seq_lens, topk) -> None:
    op = "indexer_topk"
    tensor(op, "q", q, 3, "[num_tokens, index_heads, head_dim]")
    floating(op, "q", q, "[num_tokens, index_heads, head_dim]")
    t, h, _ = q.shape
    _indexer_cache(op, k_cache, scale_cache, _head_dim(op, "q", q), q.device)
    tensor(op, "weights", weights, 2, f"[{t}, {h}]")
    if weights.shape != (t, h):
        fail(op, "weights", weights, f"[{t}, {h}] (one weight per query token and index head)")
    _requests(op, block_table, query_start_loc, seq_lens, q.device)
    if isinstance(topk, bool) or not isinstance(topk, int) or topk <= 0:
        fail(op, "topk", topk, "a positive int")


def check_sparse_mla_attention(q_nope_absorbed, q_rope, latent_cache, rope_cache, block_table, query_start_loc,
                               topk_positions, scale, out) -> None:
    op = "sparse_mla_attention"
    tensor(op, "q_nope_absorbed", q_nope_absorbed, 3, "[num_tokens, num_heads, kv_lora_rank]")
    floating(op, "q_nope_absorbed", q_nope_absorbed, "[num_tokens, num_heads, kv_lora_rank]")
    t, h, rank = q_nope_absorbed.shape
    tensor(op, "q_rope", q_rope, 3, f"[{t}, {h}, rope_dim]")
    if q_rope.shape[:2] != (t, h):
        fail(op, "q_rope", q_rope, f"[{t}, {h}, rope_dim]")
    for name, cache, last in (("latent_cache", latent_cache, rank), ("rope_cache", rope_cache, q_rope.shape[2])):
        tensor(op, name, cache, 4, f"[num_blocks, block_size, 1, {last}]")
        if cache.shape[2] != 1 or cache.shape[3] != last:
            fail(op, name, cache, f"[num_blocks, block_size, 1, {last}]")
        same_device(op, name, cache, q_nope_absorbed.device, "a cache")
    _requests(op, block_table, query_start_loc, None, q_nope_absorbed.device)
    index(op, "topk_positions", topk_positions, 2, f"[>= {t}, topk]")
    if topk_positions.shape[0] < t:  # by shape: query_start_loc's values may live on a device
        fail(op, "topk_positions", topk_positions, f"[>= {t}, topk] (one row per query token)")
    number(op, "scale", scale, "a positive real number", positive=True)
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != (t, h, rank)):
        fail(op, "out", out, f"[{t}, {h}, {rank}]")
