"""A stand-in for `ascend_kernels.ops` until the kernels package lands (same signatures; pure torch).

Only `kernel_ops()` in `ascend_platform.facade` may return this module; delete it once `ascend_kernels.ops` exists.
"""

from __future__ import annotations

import torch


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    slots = slot_mapping[: key.shape[0]].long()
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[: keep.numel()][keep], value[: keep.numel()][keep]
    block_size = key_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    key_cache[blocks, offsets] = key[: slots.numel()].to(key_cache.dtype)
    value_cache[blocks, offsets] = value[: slots.numel()].to(value_cache.dtype)


def paged_attention(query, key_cache, value_cache, block_table, query_start_loc, seq_lens, *, scale,
                    causal=True, sliding_window=None, sinks=None, out=None):
    num_tokens, num_heads, head_size = query.shape
    num_kv_heads, block_size = key_cache.shape[2], key_cache.shape[1]
    out = torch.empty_like(query) if out is None else out
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for r in range(len(lens)):
        q0, q1, ctx = qsl[r], qsl[r + 1], lens[r]
        if q1 <= q0:
            continue
        nblk = (ctx + block_size - 1) // block_size
        blocks = block_table[r, :nblk].long()
        k = key_cache[blocks].reshape(-1, num_kv_heads, head_size)[:ctx]
        v = value_cache[blocks].reshape(-1, num_kv_heads, value_cache.shape[-1])[:ctx]
        q = query[q0:q1]
        if num_heads != num_kv_heads:
            k = k.repeat_interleave(num_heads // num_kv_heads, dim=1)
            v = v.repeat_interleave(num_heads // num_kv_heads, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
        q_pos = torch.arange(ctx - (q1 - q0), ctx).unsqueeze(1)
        k_pos = torch.arange(ctx).unsqueeze(0)
        mask = torch.zeros(q1 - q0, ctx, dtype=torch.bool)
        if causal:
            mask |= k_pos > q_pos
        if sliding_window is not None:
            mask |= k_pos <= q_pos - sliding_window
        scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", probs, v.float()).to(out.dtype)
    return out


def rms_norm(x, weight, eps, residual=None):
    if residual is not None:
        x = x + residual
        residual = x
    var = x.float().pow(2).mean(-1, keepdim=True)
    y = (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight
    return y if residual is None else (y, residual)


def silu_and_mul(x):
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


def get_backend() -> str:
    return "reference"
