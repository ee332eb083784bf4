"""Reference ops of DeepSeek V4's sparse indexer: the query's RoPE + fp8 quantization, the paged logits over the
indexer K cache and the top-k selection. Contracts in `ascend_kernels.ops_dsv4`."""

from __future__ import annotations

import torch

from ascend_kernels.reference.dsv4_layout import (
    FP8_MAX,
    SCALE_FLOOR,
    cos_sin,
    gptj_rope,
    pow2_scale_exponent,
    read_indexer,
    round_bf16,
    to_fp8,
)

_CHUNK_ELEMENTS = 1 << 22  # keys dequantized per chunk of rows (elements of `[rows, max_seq_len, head_dim]`)


def dsv4_indexer_q_rope_quant(positions, index_q, index_q_cos_sin_cache, index_q_fp8, index_weights,
                              index_weights_softmax_scale: float, index_weights_head_scale: float,
                              index_weights_out) -> None:
    n, d = positions.shape[0], index_q.shape[2]  # as upstream: the rows positions cover, later rows untouched
    rot = index_q_cos_sin_cache.shape[1]
    x = index_q[:n].float()
    cos, sin = cos_sin(index_q_cos_sin_cache, positions, torch.float32)
    # the rotated dims are rounded to bf16 (as the K side stores them); the nope dims are not
    rope = round_bf16(gptj_rope(x[..., d - rot:], cos.unsqueeze(1), sin.unsqueeze(1)))
    row = torch.cat((x[..., : d - rot], rope), dim=-1)
    exponent = pow2_scale_exponent(row.abs().amax(-1), FP8_MAX, SCALE_FLOOR, floor_first=True)
    scale = torch.exp2(exponent)  # [tokens, heads]: one per (token, head), folded into the weights
    values = to_fp8((row * (1.0 / scale).unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX), flush_subnormals=False)
    index_q_fp8[:n] = values.to(index_q_fp8.dtype)
    weights = index_weights[:n].float() * scale
    weights = weights * float(index_weights_softmax_scale)
    index_weights_out[:n] = weights * float(index_weights_head_scale)


def dsv4_fp8_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, block_size: int,
                              max_seq_len: int) -> torch.Tensor:
    b, _, d = q_fp8.shape
    logits = torch.full((b, max_seq_len), float("-inf"), dtype=torch.float32, device=q_fp8.device)
    if b == 0 or max_seq_len == 0:
        return logits
    positions = torch.arange(max_seq_len, device=q_fp8.device)
    lens = seq_lens.long().clamp(0, max_seq_len)
    step = max(1, _CHUNK_ELEMENTS // (max_seq_len * d))
    for start in range(0, b, step):
        end = min(b, start + step)
        valid = positions.unsqueeze(0) < lens[start:end].unsqueeze(1)  # [rows, L]
        rows, cols = valid.nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        pages = page_table[start:end].long()[rows, cols // block_size]
        values, scales = read_indexer(kvcache_fp8, block_size, pages * block_size + cols % block_size, d)
        q = q_fp8[start:end].float()[rows]  # [n, heads, d]
        dots = torch.einsum("nhd,nd->nh", q, values).clamp_min(0)
        score = (dots * weight[start:end].float()[rows]).sum(-1) * scales
        logits[start + rows, cols] = score
    return logits


def dsv4_topk_transform(scores, seq_lens, page_tables, out_page_indices, page_size: int,
                        out_raw_indices=None) -> None:
    b, length = scores.shape
    topk = out_page_indices.shape[1]
    if b == 0:
        return
    positions = torch.arange(length, device=scores.device)
    lens = seq_lens.long().clamp(0, length)
    masked = scores.float().masked_fill(positions.unsqueeze(0) >= lens.unsqueeze(1), float("-inf"))
    # a stable descending sort: among equal scores the lower position wins, as upstream's heap does
    order = torch.sort(masked, dim=1, descending=True, stable=True).indices[:, :topk]
    if order.shape[1] < topk:
        order = torch.cat((order, order.new_zeros(b, topk - order.shape[1])), dim=1)
    count = lens.clamp(max=topk)
    slot = torch.arange(topk, device=scores.device).unsqueeze(0)
    short = (lens <= topk).unsqueeze(1)  # a short row selects every position, whatever its scores
    order = torch.where(short, slot, order)
    taken = slot < count.unsqueeze(1)
    # selected positions in ascending order (upstream leaves a long row in heap order), then -1
    raw = torch.sort(torch.where(taken, order, length + topk), dim=1).values
    raw = torch.where(taken, raw, -1)
    safe = raw.clamp_min(0)
    if page_tables.shape[1]:
        physical = page_tables.long().gather(1, (safe // page_size).clamp(max=page_tables.shape[1] - 1))
    else:  # no pages: every row is empty
        physical = torch.zeros_like(safe)
    page_index = torch.where(taken, physical * page_size + safe % page_size, -1)
    out_page_indices.copy_(page_index.to(out_page_indices.dtype))
    if out_raw_indices is not None:
        out_raw_indices.copy_(raw.to(out_raw_indices.dtype))
