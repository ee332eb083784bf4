"""Reference ops of DeepSeek V4's KV compressor: the partial-state write and the compress -> RMSNorm -> RoPE ->
fp8 store step, for the attention (fp8_ds_mla) and indexer caches.

The state cache `[num_blocks, block_size, 2 * state_width]` holds per token its kv projection then its score (plus
the position's learned bias `ape`); `state_width` is `head_dim` or, with overlapping windows, `2 * head_dim` (the
older block's half first). Contracts in `ascend_kernels.ops_dsv4`.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference.dsv4_layout import (
    FP8_MAX,
    SCALE_FLOOR,
    compute_dtype,
    cos_sin,
    gptj_rope,
    pow2_scale_exponent,
    round_bf16,
    to_fp8,
    write_ds_mla,
    write_indexer,
)


def dsv4_save_partial_states(kv, score, ape, positions, state_cache, slot_mapping) -> None:
    slots = slot_mapping.long()
    keep = (slots >= 0).nonzero().squeeze(1)
    if keep.numel() == 0:
        return
    ct = compute_dtype(state_cache.dtype)
    bias = ape.to(ct).index_select(0, positions.long().index_select(0, keep) % ape.shape[0])
    rows = torch.cat((kv.index_select(0, keep).to(ct), score.index_select(0, keep).to(ct) + bias), dim=1)
    s = slots.index_select(0, keep)
    bs = state_cache.shape[1]
    state_cache[s // bs, s % bs] = rows.to(state_cache.dtype)


def _pooled_and_normed(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight, rms_norm_eps: float,
                       compress_ratio: int):
    """The tokens that close a compression block and have a cache slot -> (their indices, RMS-normed pooled rows
    `[m, head_dim]` in the compute dtype)."""
    pos = positions.long()
    active = (((pos + 1) % compress_ratio) == 0) & (kv_slot_mapping.long() >= 0)
    idx = active.nonzero().squeeze(1)
    ct = compute_dtype(state_cache.dtype)
    d = rms_norm_weight.numel()
    if idx.numel() == 0:
        return idx, state_cache.new_zeros(0, d, dtype=ct)
    width = state_cache.shape[2] // 2
    slots = gather_slots.long().index_select(0, idx)  # [m, window]
    valid = slots >= 0
    safe = torch.where(valid, slots, 0)
    bs = state_cache.shape[1]
    rows = state_cache[safe // bs, safe % bs].to(ct)  # [m, window, 2 * width]
    # window entries from the closing block read the second head_dim half of an overlapping state
    later = (torch.arange(slots.shape[1], device=slots.device) >= compress_ratio).view(1, -1, 1)
    kv = torch.where(later, rows[..., d: 2 * d], rows[..., :d]) if width >= 2 * d else rows[..., :d]
    score = torch.where(later, rows[..., width + d: width + 2 * d], rows[..., width: width + d]) \
        if width >= 2 * d else rows[..., width: width + d]
    score = score.masked_fill(~valid.unsqueeze(-1), float("-inf"))
    kv = torch.where(valid.unsqueeze(-1), kv, torch.zeros_like(kv))
    pooled = (torch.softmax(score, dim=1) * kv).sum(dim=1)  # a softmax per channel over the window
    normed = pooled / torch.sqrt(pooled.square().mean(-1, keepdim=True) + rms_norm_eps)
    return idx, normed * rms_norm_weight.to(ct)


def _block_rope(normed, positions, idx, cos_sin_cache, compress_ratio: int):
    """RoPE of the last rope_dim dims at the compression block's first position."""
    pos = positions.long().index_select(0, idx)
    cos, sin = cos_sin(cos_sin_cache, (pos // compress_ratio) * compress_ratio, normed.dtype)
    return gptj_rope(normed[:, normed.shape[1] - cos_sin_cache.shape[1]:], cos, sin)


def dsv4_compress_norm_rope_store(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                  rms_norm_eps: float, cos_sin_cache, kv_cache_2d, kv_cache_block_size: int,
                                  compress_ratio: int) -> None:
    idx, normed = _pooled_and_normed(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                     rms_norm_eps, compress_ratio)
    if idx.numel() == 0:
        return
    nope_dim = normed.shape[1] - cos_sin_cache.shape[1]
    # nope is rounded to bf16 before its fp8 quantization; rope is rotated unrounded and stored as bf16
    nope = round_bf16(normed[:, :nope_dim]).float()
    rope = _block_rope(normed, positions, idx, cos_sin_cache, compress_ratio).float()
    slots = kv_slot_mapping.long().index_select(0, idx)
    write_ds_mla(kv_cache_2d, kv_cache_block_size, slots, nope, rope, flush_subnormals=False)


def dsv4_compress_norm_rope_store_indexer(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                          rms_norm_eps: float, cos_sin_cache, kv_cache_2d, kv_cache_block_size: int,
                                          compress_ratio: int) -> None:
    idx, normed = _pooled_and_normed(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                     rms_norm_eps, compress_ratio)
    if idx.numel() == 0:
        return
    nope_dim = normed.shape[1] - cos_sin_cache.shape[1]
    rope = _block_rope(normed, positions, idx, cos_sin_cache, compress_ratio)
    # the whole rotated row is rounded to bf16, then quantized as one block with a plain (not UE8M0) float32 scale
    row = round_bf16(torch.cat((normed[:, :nope_dim], rope), dim=1)).float()
    exponent = pow2_scale_exponent(row.abs().amax(-1), FP8_MAX, SCALE_FLOOR, floor_first=True)
    scale = torch.exp2(exponent)
    values = to_fp8((row * (1.0 / scale).unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX), flush_subnormals=False)
    slots = kv_slot_mapping.long().index_select(0, idx)
    write_indexer(kv_cache_2d, kv_cache_block_size, slots, values, scale)
