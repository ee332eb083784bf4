"""Reference ops of DeepSeek V4's attention: the query norm + RoPE with the sliding-window KV insert, sparse MLA over
window and compressed cache entries with an attention sink, and the output's inverse RoPE.

Contracts in `ascend_kernels.ops_dsv4`; byte layouts in `ascend_kernels.reference.dsv4_layout`.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference.dsv4_layout import (
    ROPE_DIM,
    compute_dtype,
    cos_sin,
    gptj_rope,
    read_ds_mla,
    round_bf16,
    write_ds_mla,
)

# Keys gathered per chunk of query tokens (elements of the `[tokens, keys, head_dim]` workspace): bounds a long
# prefill's memory the way the other reference attention ops do.
_CHUNK_ELEMENTS = 1 << 23


def _rms_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps)


def dsv4_qnorm_rope_kv_insert(q, kv, positions, swa_kv_cache_2d, slot_mapping, cos_sin_cache, q_head_padded: int,
                              eps: float, cache_block_size: int, *, apply_q_norm: bool = True) -> torch.Tensor:
    t, h, d = q.shape
    rope_dim = cos_sin_cache.shape[1]
    nope_dim = d - rope_dim
    ct = compute_dtype(q.dtype)
    cos, sin = cos_sin(cos_sin_cache, positions, ct)
    x = _rms_normalized(q.to(ct), eps) if apply_q_norm else q.to(ct)
    x = torch.cat((x[..., :nope_dim], gptj_rope(x[..., nope_dim:], cos.unsqueeze(1), sin.unsqueeze(1))), dim=-1)
    q_out = q.new_zeros(t, q_head_padded, d)
    q_out[:, :h] = x.to(q.dtype)

    slots = slot_mapping.long()
    keep = slots >= 0
    k = kv[: slots.shape[0]][keep].to(ct)
    c, s = cos_sin(cos_sin_cache, positions[: slots.shape[0]][keep], ct)
    # the whole rotated row goes through bf16 (nope before its fp8 quantization, rope as stored), as upstream
    k = round_bf16(torch.cat((k[:, :nope_dim], gptj_rope(k[:, nope_dim:], c, s)), dim=-1)).float()
    write_ds_mla(swa_kv_cache_2d, cache_block_size, slots[keep], k[:, :nope_dim], k[:, nope_dim:],
                 flush_subnormals=True)
    return q_out


def _gather_keys(cache_2d, slots, block_size: int, nope_dim: int, dtype: torch.dtype):
    """(keys `[t, K, head_dim]`, valid `[t, K]`): a slot is valid when in [0, rows * block_size); invalid keys are 0."""
    t, k = slots.shape
    slots = slots.long()
    valid = (slots >= 0) & (slots < cache_2d.shape[0] * block_size)
    # neighbouring tokens share most of their window and selection: dequantize each record once
    unique, inverse = torch.unique(torch.where(valid, slots, 0).flatten(), return_inverse=True)
    if cache_2d.dtype == torch.uint8:
        rows = read_ds_mla(cache_2d, block_size, unique, nope_dim, dtype)
    else:  # plain rows in a float dtype (DeepSeek V4.1's model-dtype caches)
        d = nope_dim + ROPE_DIM
        rows = cache_2d[:, : block_size * d].unflatten(1, (block_size, d))[unique // block_size, unique % block_size]
        rows = rows.to(dtype)
    keys = rows.index_select(0, inverse).view(t, k, -1)
    return torch.where(valid.unsqueeze(-1), keys, torch.zeros_like(keys)), valid


def dsv4_sparse_mla_with_kvcache(out, q, window_cache_2d, window_slots, window_block_size: int, compressed_cache_2d,
                                 compressed_slots, compressed_block_size: int, attn_sink, scale: float) -> None:
    t, h, d = q.shape
    nope_dim = d - ROPE_DIM
    ct = compute_dtype(q.dtype)
    sink = attn_sink.to(ct)
    num_keys = window_slots.shape[1] + compressed_slots.shape[1]
    step = max(1, _CHUNK_ELEMENTS // max(1, num_keys * d))
    for start in range(0, t, step):
        end = min(t, start + step)
        keys, valid = _gather_keys(window_cache_2d, window_slots[start:end], window_block_size, nope_dim, ct)
        if compressed_slots.shape[1]:
            ck, cv = _gather_keys(compressed_cache_2d, compressed_slots[start:end], compressed_block_size, nope_dim,
                                  ct)
            keys, valid = torch.cat((keys, ck), dim=1), torch.cat((valid, cv), dim=1)
        logits = torch.einsum("thd,tkd->thk", q[start:end].to(ct), keys) * scale
        logits = logits.masked_fill(~valid.unsqueeze(1), float("-inf"))
        lse = torch.logsumexp(logits, dim=-1)  # -inf for a token with no valid key
        seen = torch.isfinite(lse)
        weights = torch.exp(logits - torch.where(seen, lse, 0).unsqueeze(-1))
        # the sink is one more logit whose value is zero: it only rescales by 1 / (1 + exp(sink - lse))
        weights = weights * torch.sigmoid(lse - sink).unsqueeze(-1)
        result = torch.einsum("thk,tkd->thd", weights, keys)
        out[start:end] = torch.where(seen.unsqueeze(-1), result, torch.zeros_like(result)).to(out.dtype)


def dsv4_inverse_rope_o_proj(o, positions, cos_sin_cache, rope_dim: int) -> torch.Tensor:
    d = o.shape[2]
    ct = compute_dtype(o.dtype)
    x = o.to(ct)
    cos, sin = cos_sin(cos_sin_cache, positions, ct)
    rotated = gptj_rope(x[..., d - rope_dim:], cos.unsqueeze(1), sin.unsqueeze(1), inverse=True)
    return torch.cat((x[..., : d - rope_dim], rotated), dim=-1)
