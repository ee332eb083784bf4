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


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    if key.shape[0] == 0:
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
