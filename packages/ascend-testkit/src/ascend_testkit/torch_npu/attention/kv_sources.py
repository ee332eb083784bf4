"""Where FIA reads each request's keys and values: dense tensors in the query's layout, or paged caches.

Page attention (block_table given) takes caches of [blocks, block_size, KV_N*D] for every layout, or
[blocks, KV_N, block_size, D] when the query is BNSD or TND; actual_seq_lengths_kv then holds per-batch lengths
(never cumulative, even for TND), and each request reads ceil(len / block_size) blocks from its block_table row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ascend_testkit.torch_npu.attention.layouts import Layout, to_canonical
from ascend_testkit.torch_npu.attention.refusals import (
    cumulative_lengths,
    per_batch_lengths,
    refuse,
    require_contiguous,
    require_dim,
    require_dtype,
    unmodelled,
)


@dataclass
class KvRequests:
    keys: list[torch.Tensor]  # per request [KV_N, kv_len, Dk]
    values: list[torch.Tensor]  # per request [KV_N, kv_len, Dv]
    key_ropes: list[torch.Tensor] | None  # per request [KV_N, kv_len, Dr]
    lengths: list[int]
    capacity: int  # the KV extent a full atten_mask must cover
    key_dim: int
    value_dim: int
    paged: bool
    paged_hidden: int | None  # KV_N * D of a (blocks, block_size, H) cache


def _same_except_last(op: str, name: str, tensor: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if tensor.dim() != ref.dim() or tensor.shape[:-1] != ref.shape[:-1]:
        refuse(op, f"{name} shape {tuple(tensor.shape)} must match {ref_name} {tuple(ref.shape)} except the last dim")


def unpaged_kv(op: str, layout: Layout, key: torch.Tensor, value: torch.Tensor, key_rope: torch.Tensor | None,
               num_kv_heads: int, batch: int, kv_lengths: list[int] | None, lengths_name: str) -> KvRequests:
    k = to_canonical(op, layout.query, "key", key, num_kv_heads)
    v = to_canonical(op, layout.query, "value", value, num_kv_heads)
    kr = None
    if key_rope is not None:
        _same_except_last(op, "key_rope", key_rope, "key", key)
        kr = to_canonical(op, layout.query, "key_rope", key_rope, num_kv_heads)
    if layout.token_major:
        if k.shape[:2] != v.shape[:2]:
            refuse(op, f"key {tuple(key.shape)} and value {tuple(value.shape)} must agree on T and N")
        if kv_lengths is None:
            refuse(op, f"{lengths_name} is required for input_layout {layout.name}")
        lengths = cumulative_lengths(op, lengths_name, kv_lengths, total=k.shape[0], exact=False)
        if len(lengths) != batch:
            refuse(op, f"{lengths_name} has {len(lengths)} elements but the query has {batch} batches")
        starts = [sum(lengths[:i]) for i in range(batch)]

        def rows(t: torch.Tensor, i: int) -> torch.Tensor:
            return t[starts[i]:starts[i] + lengths[i]].permute(1, 0, 2)
        capacity = max(lengths, default=0)
    else:
        if key.shape != value.shape:
            refuse(op, f"key {tuple(key.shape)} and value {tuple(value.shape)} must have the same shape")
        if k.shape[0] != batch:
            refuse(op, f"key has batch {k.shape[0]} but the query has {batch}")
        lengths = per_batch_lengths(op, lengths_name, kv_lengths, batch=batch, default=k.shape[2],
                                    capacity=k.shape[2])

        def rows(t: torch.Tensor, i: int) -> torch.Tensor:
            return t[i, :, :lengths[i]]
        capacity = k.shape[2]
    return KvRequests(
        keys=[rows(k, i) for i in range(batch)], values=[rows(v, i) for i in range(batch)],
        key_ropes=None if kr is None else [rows(kr, i) for i in range(batch)], lengths=lengths,
        capacity=capacity, key_dim=k.shape[-1], value_dim=v.shape[-1], paged=False, paged_hidden=None)


def _gather_blocks(cache: torch.Tensor, ids: torch.Tensor, length: int, num_kv_heads: int) -> torch.Tensor:
    picked = cache[ids]
    if cache.dim() == 3:  # [n, bs, KV_N * D] -> [KV_N, n * bs, D]
        n, bs, h = picked.shape
        flat = picked.reshape(n * bs, num_kv_heads, h // num_kv_heads).permute(1, 0, 2)
    else:  # [n, KV_N, bs, D] -> [KV_N, n * bs, D]
        n, heads, bs, d = picked.shape
        flat = picked.permute(1, 0, 2, 3).reshape(heads, n * bs, d)
    return flat[:, :length]


def paged_kv(op: str, layout: Layout, key: torch.Tensor, value: torch.Tensor, key_rope: torch.Tensor | None,
             block_table: torch.Tensor, block_size: int, num_kv_heads: int, batch: int,
             kv_lengths: list[int] | None, lengths_name: str) -> KvRequests:
    if key.dim() == 5:
        unmodelled(op, "key (NZ cache, 5-D)", tuple(key.shape))
    require_dim(op, "key", key, (3, 4))
    if key.dim() == 4 and layout.query not in ("BNSD", "TND"):
        refuse(op, f"a [blocks, KV_N, block_size, D] cache needs a BNSD or TND query, got input_layout "
               f"{layout.name} with key {tuple(key.shape)}; BSH/BSND take only [blocks, block_size, H]")
    if key.shape != value.shape:
        refuse(op, f"page attention needs key and value of one shape, got {tuple(key.shape)} and {tuple(value.shape)}")
    for name, tensor in (("key", key), ("value", value), ("key_rope", key_rope)):
        require_contiguous(op, name, tensor)
    cache_block_size = key.shape[1] if key.dim() == 3 else key.shape[2]
    if block_size != cache_block_size:
        refuse(op, f"block_size={block_size} but the cache {tuple(key.shape)} holds {cache_block_size} per block")
    if key.dim() == 3 and key.shape[2] % num_kv_heads:
        refuse(op, f"cache hidden size {key.shape[2]} is not a multiple of num_key_value_heads={num_kv_heads}")
    if key.dim() == 4 and key.shape[1] != num_kv_heads:
        refuse(op, f"cache {tuple(key.shape)} has {key.shape[1]} heads, num_key_value_heads={num_kv_heads}")
    if key_rope is not None:
        _same_except_last(op, "key_rope", key_rope, "key", key)
    require_dtype(op, "block_table", block_table, (torch.int32,))
    require_dim(op, "block_table", block_table, (2,))
    if block_table.shape[0] != batch:
        refuse(op, f"block_table has {block_table.shape[0]} rows but the query has {batch} batches")
    if kv_lengths is None:
        refuse(op, f"{lengths_name} is required with page attention (block_table given)")
    width = block_table.shape[1] * block_size
    if layout.token_major and len(kv_lengths) != batch:
        refuse(op, f"{lengths_name} (per-batch with page attention) has {len(kv_lengths)} elements, batch is {batch}")
    lengths = per_batch_lengths(op, lengths_name, kv_lengths, batch=batch, default=width, capacity=width)
    num_blocks = key.shape[0]
    keys, values, ropes = [], [], [] if key_rope is not None else None
    for i, length in enumerate(lengths):
        ids = block_table[i, :-(-length // block_size)].long()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
            refuse(op, f"block_table[{i}] = {ids.tolist()} points outside the {num_blocks} cache blocks")
        keys.append(_gather_blocks(key, ids, length, num_kv_heads))
        values.append(_gather_blocks(value, ids, length, num_kv_heads))
        if ropes is not None:
            ropes.append(_gather_blocks(key_rope, ids, length, num_kv_heads))
    head_dim = keys[0].shape[-1] if keys else key.shape[-1] // (num_kv_heads if key.dim() == 3 else 1)
    return KvRequests(keys=keys, values=values, key_ropes=ropes, lengths=lengths, capacity=width,
                      key_dim=head_dim, value_dim=head_dim, paged=True,
                      paged_hidden=key.shape[2] if key.dim() == 3 else None)
