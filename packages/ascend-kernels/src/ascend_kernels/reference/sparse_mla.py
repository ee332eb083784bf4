"""Reference ops of DeepSeek sparse attention (V3.2's SFA): the lightning indexer's key cache and top-k, and MLA
over only the selected tokens.

The indexer cache holds, per token, its key as float8_e4m3fn (`k_cache`) and one float32 scale per
`INDEXER_QUANT_BLOCK` elements (`scale_cache`, a power of two as DeepSeek's ue8m0 scales): the two views of the
`head_dim + head_dim // 128 * 4` bytes per state vLLM's `DeepseekV32IndexerCache` sizes. Positions, not slots,
name the selected tokens: the indexer returns each query's best key positions within its own request, and the
attention maps them to cache slots through the request's block table.
"""

from __future__ import annotations

import torch

INDEXER_QUANT_BLOCK = 128
_FP8 = torch.float8_e4m3fn
_FP8_MAX = 448.0
_SCALE_EPS = 1e-10


def quantize_fp8_groups(x: torch.Tensor, *, group_size: int, pow2_scales: bool) -> tuple[torch.Tensor, torch.Tensor]:
    groups = x.float().unflatten(-1, (-1, group_size))
    scale = groups.abs().amax(dim=-1).clamp_min(_SCALE_EPS) / _FP8_MAX
    if pow2_scales:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    values = (groups / scale.unsqueeze(-1)).clamp(-_FP8_MAX, _FP8_MAX).to(_FP8)
    return values.flatten(-2), scale


def quantize_indexer_keys(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k `[n, D]` -> (float8 values `[n, D]`, float32 scales `[n, D // 128]`): power-of-two scales per 128 elements,
    as the indexer's queries are quantized."""
    return quantize_fp8_groups(k, group_size=INDEXER_QUANT_BLOCK, pow2_scales=True)


def indexer_cache_write(k: torch.Tensor, k_cache: torch.Tensor, scale_cache: torch.Tensor,
                        slot_mapping: torch.Tensor) -> None:
    bs = k_cache.shape[1]
    slots = slot_mapping.flatten()[: k.shape[0]].long()
    keep = slots >= 0
    values, scales = quantize_indexer_keys(k[: slots.shape[0]][keep])
    slots = slots[keep]
    k_cache[slots // bs, slots % bs, 0] = values.to(k_cache.dtype)
    scale_cache[slots // bs, slots % bs, 0] = scales.to(scale_cache.dtype)


def _dequantized_keys(k_cache: torch.Tensor, scale_cache: torch.Tensor, blocks: torch.Tensor, n: int) -> torch.Tensor:
    """Positions 0..n-1 of one request (its blocks in order) as float32 `[n, head_dim]`."""
    d = k_cache.shape[3]
    values = k_cache[blocks, :, 0].reshape(-1, d)[:n].float()
    scales = scale_cache[blocks, :, 0].reshape(-1, scale_cache.shape[3])[:n].float()
    return (values.view(n, -1, INDEXER_QUANT_BLOCK) * scales.unsqueeze(-1)).view(n, d)


def _request_of_tokens(query_start_loc: torch.Tensor, num_tokens: int) -> torch.Tensor:
    starts = query_start_loc.long()
    tokens = torch.arange(num_tokens, device=starts.device)
    return torch.searchsorted(starts[1:], tokens, right=True)


def indexer_topk(q, weights, k_cache, scale_cache, block_table, query_start_loc, seq_lens, *, topk: int,
                 query_start_loc_host=None, seq_lens_host=None) -> torch.Tensor:
    t = q.shape[0]
    out = torch.full((t, topk), -1, dtype=torch.int32, device=q.device)
    bs = k_cache.shape[1]
    qsl = query_start_loc_host if query_start_loc_host is not None else query_start_loc.tolist()
    for r, seq_len in enumerate(seq_lens_host if seq_lens_host is not None else seq_lens.tolist()):
        start, end = qsl[r], qsl[r + 1]
        if end <= start or seq_len <= 0:
            continue
        m = end - start
        keys = _dequantized_keys(k_cache, scale_cache, block_table[r, : (seq_len + bs - 1) // bs].long(), seq_len)
        # score[i, j] = sum_h w[i, h] * relu(q[i, h] . k_j)
        scores = torch.einsum("ihd,jd->ihj", q[start:end].float(), keys).clamp_min(0)
        scores = torch.einsum("ih,ihj->ij", weights[start:end].float(), scores)
        positions = torch.arange(seq_len, device=q.device)
        visible = positions.unsqueeze(0) <= (seq_len - m + torch.arange(m, device=q.device)).unsqueeze(1)
        scores = scores.masked_fill(~visible, float("-inf"))
        k = min(topk, seq_len)
        best = scores.topk(k, dim=-1).indices
        picked = torch.gather(visible, 1, best)
        best = torch.where(picked, best, torch.full_like(best, -1))
        out[start:end, :k] = best.sort(dim=-1, descending=True).values.to(torch.int32)
    return out


def sparse_mla_attention(q_nope_absorbed, q_rope, latent_cache, rope_cache, block_table, query_start_loc,
                         topk_positions, *, scale: float, out=None, query_start_loc_host=None) -> torch.Tensor:
    t, h, rank = q_nope_absorbed.shape
    bs = latent_cache.shape[1]
    num_q = query_start_loc_host[-1] if query_start_loc_host is not None else int(query_start_loc[-1])
    result = q_nope_absorbed.new_zeros(t, h, rank) if out is None else out
    if num_q < t:
        result[num_q:].zero_()
    if num_q == 0:
        return result
    reqs = _request_of_tokens(query_start_loc, num_q)
    positions = topk_positions[:num_q].long()
    valid = positions >= 0
    safe = positions.clamp_min(0)
    blocks = block_table.long()[reqs.unsqueeze(1), safe // bs]
    offsets = safe % bs
    latent = latent_cache[blocks, offsets, 0].float()  # [num_q, K, rank]
    rope = rope_cache[blocks, offsets, 0].float()  # [num_q, K, rope]
    logits = (torch.einsum("thr,tkr->thk", q_nope_absorbed[:num_q].float(), latent)
              + torch.einsum("thp,tkp->thk", q_rope[:num_q].float(), rope)) * scale
    logits = logits.masked_fill(~valid.unsqueeze(1), float("-inf"))
    weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    result[:num_q] = torch.einsum("thk,tkr->thr", weights, latent).to(result.dtype)
    return result
