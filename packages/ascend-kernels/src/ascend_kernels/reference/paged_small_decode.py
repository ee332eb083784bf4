"""A decode batch over small contexts as one fused attention call: the batch's pages gathered by one index_select
per cache, then torch's scaled_dot_product_attention under a length mask.

Where a decode step's keys and values are a few hundred KiB (a small model, short contexts) the op's time is torch
dispatch, not bytes: the general path (`attention.paged_attention`: chunks, KV-head groups, block matmuls, an
explicit mask and softmax) makes some 40 torch calls a step for what SDPA does in one. Measured with 2 threads, 4
decodes, block 32, a fragmented table, quiet machine (general path / this one, us; gathered K+V in brackets):
float32 2 q / 2 KV heads, head 32: ctx 64 300 / 82 (128 KiB), ctx 256 385 / 87 (512 KiB), ctx 1,024 552 / 199
(2 MiB); 8 q / 2 KV heads, head 64: ctx 64 312 / 133, ctx 256 521 / 175 (1 MiB); but 32 q / 8 KV heads, head 128:
ctx 64 556 / 908 (2 MiB), ctx 256 3,230 / 6,321 (8 MiB). bfloat16 gained at every size tried up to 16 MiB (e.g.
32 / 8 heads, ctx 1,024: 9,305 / 5,567) but lost at the kernel benchmark's 8 x 1,024 (24 / 28-35 ms). Hence one
bound for every dtype, below where either dtype lost.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Gathered K and V bytes of the whole batch up to which a decode batch takes this path.
SMALL_DECODE_BYTES = 1 << 20

_POSITIONS: dict[torch.device, torch.Tensor] = {}


def _positions(length: int, device: torch.device) -> torch.Tensor:
    """arange(length) on `device`, a view of a cached table that grows as longer contexts come."""
    table = _POSITIONS.get(device)
    if table is None or table.numel() < length:
        table = torch.arange(max(length, 4096), device=device)
        _POSITIONS[device] = table
    return table[:length]


def fits(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, qlens: list[int],
         lens: list[int], sinks) -> bool:
    """Whether a batch is a small decode this path computes as the general one does: one query token per request
    over a context of at least one key, no sink logits, K and V of one head size and the query's dtype, and the
    batch's gathered pages within SMALL_DECODE_BYTES."""
    if sinks is not None or not qlens or any(q != 1 for q in qlens) or min(lens) < 1:
        return False
    if not (query.dtype == key_cache.dtype == value_cache.dtype) or value_cache.shape[3] != key_cache.shape[3]:
        return False
    _, bs, hkv, d = key_cache.shape
    blocks = -(-max(lens) // bs)
    return len(lens) * blocks * bs * hkv * 2 * d * key_cache.element_size() <= SMALL_DECODE_BYTES


def attend_small_decode(query, key_cache, value_cache, table, seq_lens, lens: list[int], scale: float,
                        sliding_window: int | None, out: torch.Tensor) -> torch.Tensor:
    """Writes the decode of the first `len(lens)` query rows (one per request) into `out` and returns it.

    table: `[requests, >= blocks]` long block ids (clamped); seq_lens: the requests' context lengths on the device
    (the mask reads them there); lens: the same on the host. A request sees keys `[ctx - sliding_window, ctx)`.
    """
    r = len(lens)
    _, bs, hkv, d = key_cache.shape
    hq = query.shape[1]
    blocks = -(-max(lens) // bs)
    length = blocks * bs
    ids = table[:r, :blocks].reshape(-1)
    k = key_cache.index_select(0, ids).view(r, length, hkv, d).transpose(1, 2)
    v = value_cache.index_select(0, ids).view(r, length, hkv, d).transpose(1, 2)
    j = _positions(length, key_cache.device)
    ctx = seq_lens[:r, None]
    mask = j < ctx
    if sliding_window is not None:
        mask &= j >= ctx - sliding_window
    o = F.scaled_dot_product_attention(
        query[:r].reshape(r, hkv, hq // hkv, d), k, v, attn_mask=mask.view(r, 1, 1, length), scale=scale
    )
    out[:r].copy_(o.view(r, hq, d))
    return out
