"""Reference op of DeepSeek V4.1's sliding-window insert over plain rows: the query's GPT-J RoPE (V4.1 has no per-head
query norm) and the RoPE'd KV row stored in the cache's own float dtype. Contract in `ascend_kernels.ops_dsv41`.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference.dsv4_layout import compute_dtype, cos_sin, gptj_rope


def _roped(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, rope: int) -> torch.Tensor:
    return torch.cat((x[..., :-rope], gptj_rope(x[..., -rope:], c, s)), dim=-1)


def dsv41_q_rope_kv_insert(q, kv, positions, swa_kv_cache, slot_mapping, cos_sin_cache,
                           cache_block_size: int) -> torch.Tensor:
    t, _, d = q.shape
    rope = cos_sin_cache.shape[1]
    ct = compute_dtype(q.dtype)
    c, s = cos_sin(cos_sin_cache, positions[:t], ct)
    q_out = _roped(q.to(ct), c.unsqueeze(1), s.unsqueeze(1), rope).to(q.dtype)
    slots = slot_mapping.long()
    n = slots.shape[0]
    keep = (slots >= 0).nonzero().squeeze(-1)
    if keep.numel():
        c, s = cos_sin(cos_sin_cache, positions[:n].index_select(0, keep), ct)
        rows = _roped(kv[:n].index_select(0, keep).to(ct), c, s, rope)
        dst = slots.index_select(0, keep)
        cache = swa_kv_cache if swa_kv_cache.dim() == 3 else \
            swa_kv_cache[:, : cache_block_size * d].unflatten(1, (cache_block_size, d))
        cache[dst // cache_block_size, dst % cache_block_size] = rows.to(cache.dtype)
    return q_out
