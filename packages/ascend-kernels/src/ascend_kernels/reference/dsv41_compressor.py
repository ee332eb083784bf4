"""Reference ops of DeepSeek V4.1's compressor and its cache inserts: the ratio-1/2 pooling into a bf16 latent over a
fp32 circular-buffer state, the latent's RoPE + store into the compressed KV cache (plain rows, per-tensor fp8 rows,
or the paged MXFP8 / fp8_ds_mla byte records), and the index key's norm + RoPE + fp8 store.

Contracts in `ascend_kernels.ops_dsv41`; arithmetic (GPT-J RoPE, power-of-two fp8 scales) shared with V4 through
`ascend_kernels.reference.dsv4_layout`.
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
)

ROPE_DIM = 64  # V4.1's qk_rope_head_dim: the rotated tail of the latent and of the index key
# paged uint8 record widths (bytes per token) rope_quant_insert dispatches on, as upstream
MXFP8_RECORD = 528  # 512 fp8 values (rope dims included) then 16 UE8M0 scales, one per 32 values
DS_MLA_RECORD = 584  # V4's fp8_ds_mla: 448 fp8 nope + 64 bf16 rope (576 B) then 7 UE8M0 scales + 1 pad byte
_MX_BLOCK = 32
_DS_MLA_BLOCK = 64


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight.to(x.dtype)


def dsv41_save_compress_norm(kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
                             rms_norm_weight, rms_norm_eps: float, compress_ratio: int, latent_out) -> None:
    n = slot_mapping.shape[0]
    if n == 0:
        return
    d = rms_norm_weight.shape[0]
    ct = compute_dtype(kv_score.dtype)
    slots = slot_mapping.long()
    pos = positions[:n].long()
    raw = kv_score[:n].to(ct)
    if compress_ratio == 1:
        emit = slots >= 0
        pooled = raw[:, :d]
    else:
        cap = state_cache.shape[1]
        qsl = query_start_loc.long()
        req = token_to_req_indices[:n].long()
        idx = torch.arange(n, device=slots.device)
        first = qsl.index_select(0, req) == idx  # a chunk's first token pairs with its predecessor's ring row
        emit = (slots >= 0) & (pos % 2 == 1)
        prev = raw.roll(1, 0)
        ring_block = (slots // cap).clamp_min(0)
        ring = state_cache[ring_block, (pos - 1) % cap].to(ct)
        prev = torch.where(first.unsqueeze(-1), ring, prev)
        kv = torch.stack((prev[:, :d], raw[:, :d]))
        score = torch.stack((prev[:, d:2 * d], raw[:, d:2 * d]))
        pooled = (kv * torch.softmax(score, dim=0)).sum(0)
    latent = round_bf16(_rms_norm(pooled, rms_norm_weight, rms_norm_eps))
    keep = emit.nonzero().squeeze(-1)
    latent_out[keep] = latent.index_select(0, keep).to(latent_out.dtype)
    if compress_ratio == 2:
        # ring tail store, after every read above: each chunk's last `cap` rows (chunks whose first slot is valid)
        starts, ends = qsl[:-1].clamp(max=n), qsl[1:].clamp(max=n)
        tail = torch.zeros(n, dtype=torch.bool, device=slots.device)
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            if s < e and int(slots[s]) >= 0:
                tail[max(s, e - cap):e] = True
        tail &= slots >= 0
        rows = tail.nonzero().squeeze(-1)
        dst = slots.index_select(0, rows)
        state_cache[dst // cap, dst % cap] = kv_score[:n].index_select(0, rows)[:, :2 * d].to(state_cache.dtype)


def _group_rows(latent, positions, cos_sin_cache, slot_mapping, compress_ratio: int):
    """(slots, rotated float32 rows) of the tokens that close a group and have a slot: the last 64 dims rotated at
    the group's first position."""
    n = slot_mapping.shape[0]
    slots = slot_mapping.long()
    pos = positions[:n].long()
    keep = ((slots >= 0) & ((pos + 1) % compress_ratio == 0)).nonzero().squeeze(-1)
    ct = compute_dtype(latent.dtype)
    rows = latent[:n].index_select(0, keep).to(ct)
    group = pos.index_select(0, keep) // compress_ratio * compress_ratio
    c, s = cos_sin(cos_sin_cache, group, ct)
    rope = cos_sin_cache.shape[1]
    rows = torch.cat((rows[:, :-rope], gptj_rope(rows[:, -rope:], c, s)), dim=-1)
    return slots.index_select(0, keep), rows


def _ue8m0_quant(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x float `[n, d]` -> (fp8 bytes `[n, d]`, UE8M0 exponent bytes `[n, d // block]`): per block the scale
    `2^ceil(log2(max(amax, 1e-4) / 448))` (the Triton inserts floor amax first), values clamped, round to nearest."""
    tiles = x.float().unflatten(-1, (-1, block))
    exponent = pow2_scale_exponent(tiles.abs().amax(-1), FP8_MAX, SCALE_FLOOR, floor_first=True)
    scaled = (tiles * torch.exp2(-exponent).unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)
    values = to_fp8(scaled, flush_subnormals=False).view(torch.uint8).flatten(-2)
    return values, (exponent + 127).clamp(0, 255).to(torch.uint8)


def _page_records(cache: torch.Tensor, offset: int, width: int) -> torch.Tensor:
    """`[num_blocks, block_size, width]` byte records starting `offset` bytes into each page of a uint8 `[num_blocks,
    block_size, record]` cache (the page's values first, then its scales, as upstream lays a page out)."""
    nb, bs = cache.shape[0], cache.shape[1]
    return cache.as_strided((nb, bs, width), (cache.stride(0), width, 1), cache.storage_offset() + offset)


def dsv41_rope_quant_insert(latent, positions, cos_sin_cache, kv_cache, slot_mapping, compress_ratio: int,
                            fp8_scale=None) -> None:
    if slot_mapping.shape[0] == 0:
        return
    slots, rows = _group_rows(latent, positions, cos_sin_cache, slot_mapping, compress_ratio)
    if slots.numel() == 0:
        return
    bs = kv_cache.shape[1]
    block, entry = slots // bs, slots % bs
    if kv_cache.dtype == torch.uint8:
        d = rows.shape[1]
        if kv_cache.shape[-1] == MXFP8_RECORD:
            values, exponents = _ue8m0_quant(rows, _MX_BLOCK)
            _page_records(kv_cache, 0, d)[block, entry] = values
            _page_records(kv_cache, bs * d, d // _MX_BLOCK)[block, entry] = exponents
        else:  # DS_MLA_RECORD: the nope dims quantized from the latent as is, the rotated rope dims stored as bf16
            nope = d - ROPE_DIM
            values, exponents = _ue8m0_quant(rows[:, :nope], _DS_MLA_BLOCK)
            rope = rows[:, nope:].to(torch.bfloat16).contiguous().view(torch.uint8)
            _page_records(kv_cache, 0, nope + 2 * ROPE_DIM)[block, entry] = torch.cat((values, rope), dim=1)
            pad = torch.zeros_like(exponents[:, :1])
            _page_records(kv_cache, bs * (nope + 2 * ROPE_DIM), nope // _DS_MLA_BLOCK + 1)[block, entry] = \
                torch.cat((exponents, pad), dim=1)
        return
    if kv_cache.dtype == torch.float8_e4m3fn:
        # the bf16 row, divided by the per-tensor scale
        scaled = (round_bf16(rows.float()) * (1.0 / fp8_scale.float().reshape(()))).clamp(-FP8_MAX, FP8_MAX)
        kv_cache[block, entry] = to_fp8(scaled, flush_subnormals=False)
        return
    kv_cache[block, entry] = rows.to(kv_cache.dtype)


def dsv41_indexer_k_norm_rope_store(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps: float, k_cache,
                                    kv_slot_mapping, compress_ratio: int, use_fp4_cache: bool) -> None:
    n = kv_slot_mapping.shape[0]
    if n == 0:
        return
    ct = compute_dtype(k_pre.dtype)
    # k_norm, rounded through bf16 as upstream, then RoPE at the group's first position, rounded again
    normed = round_bf16(_rms_norm(k_pre[:n].to(ct), rms_norm_weight, rms_norm_eps))
    slots, rows = _group_rows(normed, positions, cos_sin_cache, kv_slot_mapping, compress_ratio)
    if slots.numel() == 0:
        return
    rows = round_bf16(rows.float())
    exponent = pow2_scale_exponent(rows.abs().amax(-1), FP8_MAX, SCALE_FLOOR, floor_first=True)
    scaled = (rows * torch.exp2(-exponent).unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)
    # the page layout of V4's indexer cache: block_size fp8 records, then block_size float32 scales
    d, bs = rows.shape[1], k_cache.shape[1]
    block, entry = slots // bs, slots % bs
    _page_records(k_cache, 0, d)[block, entry] = to_fp8(scaled, flush_subnormals=False).view(torch.uint8)
    _page_records(k_cache, bs * d, 4)[block, entry] = torch.exp2(exponent).contiguous().view(torch.uint8).view(-1, 4)
