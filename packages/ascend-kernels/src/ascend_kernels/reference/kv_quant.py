"""Reference int8 KV cache kernels (ModelSlim's C8): quantize K/V into int8 paged caches, attend over them.

A layer's K and V each carry a static scale and zero point per channel (`[num_kv_heads * head_size]`, the cache's
heads and head dims flattened) or one for the whole tensor (`[1]`). Writing: `q = clamp(round(x * (1 / scale) +
offset), -128, 127)`, half to even, with the float32 reciprocal (what torch_npu's `npu_quantize` multiplies by:
dividing instead moves a value sitting on a rounding edge by one step), the product and sum taken exactly (float64),
so no value moves by the order of float32 roundings either. Reading: `(q - offset) * scale`, in the
query's dtype, then ordinary paged attention. Only the blocks a batch references are dequantized, into a scratch
paged cache numbered in the batch's order (`referenced_blocks`), so the KV memory itself stays int8.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference.attention import paged_attention
from ascend_kernels.reference.cache_write import reshape_and_cache

_INT8_MIN, _INT8_MAX = -128, 127


def quantize_channels(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    """int8 `[tokens, heads, dim]` from float `x` of that shape, with `[heads * dim]` (or `[1]`) scale and offset."""
    t, h, d = x.shape
    flat = x.reshape(t, h * d).double() * (1.0 / scale.float()).double()
    if offset is not None:
        flat = flat + offset.double()
    return torch.round(flat).clamp_(_INT8_MIN, _INT8_MAX).to(torch.int8).view(t, h, d)


def dequantize_channels(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None,
                        dtype: torch.dtype) -> torch.Tensor:
    """`(q - offset) * scale` over the last two dims of an int8 `[..., heads, dim]` tensor, in `dtype`."""
    shape = q.shape
    flat = q.reshape(*shape[:-2], shape[-2] * shape[-1]).float()
    if offset is not None:
        flat = flat - offset.float()
    return (flat * scale.float()).to(dtype).view(shape)


def reshape_and_cache_quant(key, value, key_cache, value_cache, slot_mapping, key_scale, key_offset, value_scale,
                            value_offset) -> None:
    reshape_and_cache(quantize_channels(key, key_scale, key_offset), quantize_channels(value, value_scale,
                      value_offset), key_cache, value_cache, slot_mapping)


def referenced_blocks(block_table: torch.Tensor, seq_lens: list[int],
                      block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The physical blocks each request's context spans, back to back (int64 `[n]`), and the block table that
    addresses them there (int32 `[num_reqs, max(1, most blocks of a request)]`, row r numbering its blocks from the
    first one it owns in that list)."""
    counts = [-(-int(n) // block_size) for n in seq_lens]
    dev = block_table.device
    width = max(counts, default=0) or 1
    table = torch.zeros(len(counts), width, dtype=torch.int32, device=dev)
    pieces, start = [], 0
    for r, count in enumerate(counts):
        if count:
            pieces.append(block_table[r, :count].long())
            table[r, :count] = torch.arange(start, start + count, dtype=torch.int32, device=dev)
            start += count
    ids = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long, device=dev)
    return ids, table


def paged_attention_antiquant(query, key_cache, value_cache, block_table, query_start_loc, seq_lens, *, key_scale,
                              key_offset=None, value_scale, value_offset=None, scale, causal=True,
                              sliding_window=None, sinks=None, out=None, query_start_loc_host=None,
                              seq_lens_host=None):
    lens = seq_lens_host if seq_lens_host is not None else seq_lens.tolist()
    ids, table = referenced_blocks(block_table, lens, key_cache.shape[1])
    keys = dequantize_channels(key_cache.index_select(0, ids), key_scale, key_offset, query.dtype)
    values = dequantize_channels(value_cache.index_select(0, ids), value_scale, value_offset, query.dtype)
    return paged_attention(query, keys, values, table, query_start_loc, seq_lens, scale=scale, causal=causal,
                           sliding_window=sliding_window, sinks=sinks, out=out,
                           query_start_loc_host=query_start_loc_host, seq_lens_host=list(lens))
