"""Paged KV writes by slot mapping (reference): `cache[slot // block_size, slot % block_size] = token`.

Indexing with (block, offset) pairs goes through the cache tensor's own strides, so strided views over a shared
backing are written in place without assuming contiguity.
"""

from __future__ import annotations

import torch


def _scatter(src: torch.Tensor, cache: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor) -> None:
    cache[blocks, offsets] = src.to(cache.dtype)


def _slots(slot_mapping: torch.Tensor, block_size: int, *sources: torch.Tensor):
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.all()):
        slots = slots[keep]
        sources = tuple(s[keep] for s in sources)
    return torch.div(slots, block_size, rounding_mode="floor"), slots % block_size, sources


def _token_rows(cache: torch.Tensor) -> torch.Tensor | None:
    """The cache as `[num_blocks * block_size, ...]`, one row per slot, when its blocks follow each other with no gap
    (a view: writes land in the cache), else None (paged planes beside other layers' bytes)."""
    if cache.stride(0) != cache.shape[1] * cache.stride(1):
        return None
    return cache.flatten(0, 1)


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    if key.shape[0] == 0:
        return
    key_rows, value_rows = _token_rows(key_cache), _token_rows(value_cache)
    if key_rows is not None and value_rows is not None:
        # One index_copy_ per cache by slot: no block / offset split, no two-index scatter (4 decode tokens:
        # 18 vs 29 us). Padded tokens (slot -1) are dropped first, which reads the slots once on the host.
        slots = slot_mapping.long()
        if int(slots.min()) < 0:
            keep = slots >= 0
            slots, key, value = slots[keep], key[keep], value[keep]
        key_rows.index_copy_(0, slots, key.to(key_cache.dtype))
        value_rows.index_copy_(0, slots, value.to(value_cache.dtype))
        return
    blocks, offsets, (key, value) = _slots(slot_mapping, key_cache.shape[1], key, value)
    _scatter(key, key_cache, blocks, offsets)
    _scatter(value, value_cache, blocks, offsets)


def reshape_and_cache_mla(latent, rope, latent_cache, rope_cache, slot_mapping) -> None:
    if latent.shape[0] == 0:
        return
    latent = latent.reshape(latent.shape[0], 1, latent.shape[-1])
    rope = rope.reshape(rope.shape[0], 1, rope.shape[-1])
    blocks, offsets, (latent, rope) = _slots(slot_mapping, latent_cache.shape[1], latent, rope)
    _scatter(latent, latent_cache, blocks, offsets)
    _scatter(rope, rope_cache, blocks, offsets)
