"""The ATB paged-cache movers: _npu_reshape_and_cache (scatter by slot, in place) and atb.npu_paged_cache_load.

Both address the caches as raw [blocks, block_size, heads, head_size] memory, so the caches (written in place or
read by block id) must be contiguous; a view into a shared K/V backing that strides over the other plane is refused.
ATB's docs give no skip value for slot_indices, so a negative slot (vLLM's PAD_SLOT_ID) is refused as out of range:
callers slice to the real tokens first.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ascend_testkit.torch_npu.attention.limits import CardLimits
from ascend_testkit.torch_npu.attention.refusals import (
    cumulative_lengths,
    refuse,
    require_contiguous,
    require_dim,
    require_dtype,
)


def _cache_dtypes(limits: CardLimits) -> tuple[torch.dtype, ...]:
    return (*limits.attention_dtypes, torch.int8)


def _check_pair(op: str, key_name: str, key: torch.Tensor, value_name: str, value: torch.Tensor) -> None:
    if key.dtype != value.dtype:
        refuse(op, f"{key_name} dtype {key.dtype} and {value_name} dtype {value.dtype} must be equal")


def make_cache_ops(limits: CardLimits) -> dict[str, Callable]:
    def _npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices):
        op = "_npu_reshape_and_cache"
        for name, tensor, dims in (("key", key, 3), ("value", value, 3), ("key_cache", key_cache, 4),
                                   ("value_cache", value_cache, 4), ("slot_indices", slot_indices, 1)):
            require_dim(op, name, tensor, (dims,))
        for name, tensor in (("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
            require_dtype(op, name, tensor, _cache_dtypes(limits))
            if tensor.dtype != key.dtype:
                refuse(op, f"key, value, key_cache and value_cache must share one dtype; {name} is {tensor.dtype}, "
                       f"key is {key.dtype}")
        require_dtype(op, "slot_indices", slot_indices, (torch.int32,))
        require_contiguous(op, "key_cache", key_cache)
        require_contiguous(op, "value_cache", value_cache)
        tokens = slot_indices.shape[0]
        if key.shape[0] != tokens or value.shape[0] != tokens:
            refuse(op, f"key {tuple(key.shape)}, value {tuple(value.shape)} and slot_indices ({tokens},) must have "
                   "one token count")
        if key_cache.shape[:2] != value_cache.shape[:2]:
            refuse(op, f"key_cache {tuple(key_cache.shape)} and value_cache {tuple(value_cache.shape)} must agree on "
                   "blocks and block_size")
        if key.shape[1:] != key_cache.shape[2:] or value.shape[1:] != value_cache.shape[2:]:
            refuse(op, f"key {tuple(key.shape)} / value {tuple(value.shape)} must be [tokens, heads, head_size] of "
                   f"key_cache {tuple(key_cache.shape)} / value_cache {tuple(value_cache.shape)}")
        capacity = key_cache.shape[0] * key_cache.shape[1]
        slots = slot_indices.long()
        if tokens and (int(slots.min()) < 0 or int(slots.max()) >= capacity):
            refuse(op, f"slot_indices must lie in [0, {capacity}), got min {int(slots.min())} max {int(slots.max())}")
        key_cache.view(capacity, *key_cache.shape[2:])[slots] = key
        value_cache.view(capacity, *value_cache.shape[2:])[slots] = value

    def npu_paged_cache_load(key_cache, value_cache, block_table, context_lens, *, seq_starts=None, cumsum=False,
                             key=None, value=None):
        op = "npu_paged_cache_load"
        for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
            require_dim(op, name, cache, (4,))
            require_dtype(op, name, cache, _cache_dtypes(limits))
            require_contiguous(op, name, cache)
            row_bytes = cache.shape[2] * cache.shape[3] * cache.element_size()
            if row_bytes % limits.cache_load_alignment_bytes:
                refuse(op, f"{name} heads * head_size must be {limits.cache_load_alignment_bytes}-byte aligned, got "
                       f"{cache.shape[2]} * {cache.shape[3]} * {cache.element_size()} bytes")
        _check_pair(op, "key_cache", key_cache, "value_cache", value_cache)
        if key_cache.shape[:3] != value_cache.shape[:3]:
            refuse(op, f"key_cache {tuple(key_cache.shape)} and value_cache {tuple(value_cache.shape)} must agree on "
                   "blocks, block_size and heads")
        for name, tensor, dims in (("block_table", block_table, 2), ("context_lens", context_lens, 1)):
            require_dim(op, name, tensor, (dims,))
            require_dtype(op, name, tensor, (torch.int32,))
        batch = block_table.shape[0]
        raw = context_lens.tolist()
        if cumsum:
            if len(raw) != batch + 1 or raw[0] != 0:
                refuse(op, f"cumsum=True needs context_lens of batch+1 = {batch + 1} cumulative values from 0, "
                       f"got {raw}")
            lengths = cumulative_lengths(op, "context_lens", raw[1:], total=None, exact=False)
        else:
            if len(raw) != batch:
                refuse(op, f"context_lens must have one length per block_table row ({batch}), got {raw}")
            lengths = raw
        if any(length < 0 for length in lengths):
            refuse(op, f"context_lens must be >= 0, got {raw}")
        starts = [0] * batch
        if seq_starts is not None:
            require_dtype(op, "seq_starts", seq_starts, (torch.int32,))
            starts = seq_starts.tolist()
            if len(starts) != batch or any(start < 0 for start in starts):
                refuse(op, f"seq_starts must hold {batch} offsets >= 0, got {starts}")
        block_size, num_blocks = key_cache.shape[1], key_cache.shape[0]
        width = block_table.shape[1] * block_size
        total = sum(lengths)
        heads = key_cache.shape[2]
        outputs = []
        for name, given, cache in (("key", key, key_cache), ("value", value, value_cache)):
            expected = (total, heads, cache.shape[3])
            if given is None:
                outputs.append(cache.new_empty(expected))
                continue
            require_contiguous(op, name, given)
            if tuple(given.shape) != expected or given.dtype != cache.dtype:
                refuse(op, f"{name} must be {expected} {cache.dtype} (sum(context_lens) tokens), got "
                       f"{tuple(given.shape)} {given.dtype}")
            outputs.append(given)
        row = 0
        for b, (length, start) in enumerate(zip(lengths, starts, strict=True)):
            if start + length > width:
                refuse(op, f"batch {b} reads positions [{start}, {start + length}) beyond its block_table row of "
                       f"{width} positions")
            positions = torch.arange(start, start + length)
            ids = block_table[b, positions // block_size].long()
            if length and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
                refuse(op, f"block_table[{b}] points outside the {num_blocks} cache blocks: {ids.unique().tolist()}")
            offsets = positions % block_size
            for out, cache in zip(outputs, (key_cache, value_cache), strict=True):
                out[row:row + length] = cache[ids, offsets]
            row += length
        return outputs[0], outputs[1]

    return {"_npu_reshape_and_cache": _npu_reshape_and_cache, "npu_paged_cache_load": npu_paged_cache_load}
