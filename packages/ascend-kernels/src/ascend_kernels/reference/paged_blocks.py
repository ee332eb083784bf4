"""Attention of one request's few query rows straight over its cache blocks: no gathered copy of the pages.

A decode (or speculative verify) reads every key and value once, so the bytes it moves decide its time. Gathering a
request's blocks into a workspace first writes and reads them all again (and the token-major planes of the device
KV layout need a second copy to turn head-major); here each block is a view of the cache, `[kv_heads, block_size,
head]` over the plane's own strides, and two batched matmuls per block (scores, then probabilities times values)
read it in place. The scores of all blocks meet in one small buffer for a single exact softmax.

Measured (1 thread, pinned, the benchmark's decode: 8 requests x 1,024 tokens, 32 q / 8 KV heads, head 128, block
128, token-major planes; load 12-20 from other jobs, so ratios only): float32 scores 14.4 ms (q @ K^T per block into
a per-block buffer; into strided slices of one buffer 19.2 ms, K @ q^T 56 ms), p @ V accumulated 19.1 ms, against
vLLM's CPU attention 24.3 ms for the whole op, where gathering K and V alone took 24.8 ms. bfloat16 (oneDNN): q @ K^T
67-70 ms but K @ q^T 13.3 ms, so the reduced precision takes the other orientation; its p @ V goes to one output per
block, summed in float32 (one rounding per block's share instead of one per accumulation step).
"""

from __future__ import annotations

import torch


def _runs(blocks: list[int], coalesce: bool) -> list[tuple[int, int, int]]:
    """(first key, first block, block count) of each run of consecutive block ids: a fresh cache hands a request
    consecutive blocks, and where each block's tokens directly follow the previous block's (`coalesce`) a run is
    one strided view, i.e. one matmul instead of one per block."""
    runs: list[tuple[int, int, int]] = []
    for j, b in enumerate(blocks):
        if coalesce and runs and runs[-1][1] + runs[-1][2] == b:
            first_key, first, count = runs[-1]
            runs[-1] = (first_key, first, count + 1)
        else:
            runs.append((j, b, 1))
    return runs


def attend_pages(q, key_cache, value_cache, blocks: list[int], scale: float, mask=None, visible: int | None = None):
    """Attention of `q [kv_heads, rows, head]` (the query heads sharing a KV head folded into rows) over the keys in
    `blocks` (block ids, in order) of `key_cache` / `value_cache` `[num_blocks, block_size, kv_heads, head]`.

    `mask` `[1, rows, len(blocks) * block_size]` bool (True: visible), or `visible`: only the first `visible` keys
    count (a decode's context), or neither: every key counts. Softmax in float32 (torch's CPU softmax computes in
    float32 for reduced precision and rounds once). Returns `[kv_heads, rows, head_v]` in the cache's dtype or, where
    a reduced precision's per-block shares were summed, in float32 (the caller's store rounds it once).
    """
    hkv, rows, _ = q.shape
    _, bs, _, dv = value_cache.shape
    nbk = len(blocks)
    dtype = key_cache.dtype
    if nbk == 0:
        return q.new_zeros(hkv, rows, dv, dtype=torch.float32 if dtype.is_floating_point else dtype)
    q = q.to(dtype) * scale
    runs = _runs(blocks, all(c.stride(0) == bs * c.stride(1) for c in (key_cache, value_cache)))

    def pages(cache: torch.Tensor, first: int, count: int) -> torch.Tensor:
        """`[kv_heads, count * block_size, head]` over blocks first.. of `cache`: a view (runs only where the
        blocks lie back to back)."""
        run = cache[first : first + count]
        return run.reshape(count * bs, *run.shape[2:]).transpose(0, 1)

    if dtype == torch.float32 or dtype == torch.float64:
        per_block = torch.empty(nbk, hkv, rows, bs, dtype=dtype, device=q.device)
        for j, first, count in runs:
            keys_t = pages(key_cache, first, count).transpose(1, 2)
            if count == 1:
                torch.bmm(q, keys_t, out=per_block[j])
            else:
                per_block[j : j + count].permute(1, 2, 0, 3).copy_(torch.bmm(q, keys_t).view(hkv, rows, count, bs))
        s = per_block.permute(1, 2, 0, 3).reshape(hkv, rows, nbk * bs)  # one small copy: keys in order
    else:
        # oneDNN's reduced-precision GEMM runs ~5x faster as K @ q^T over a strided block than as q @ K^T.
        q_t = q.transpose(1, 2).contiguous()
        s_t = torch.empty(hkv, nbk * bs, rows, dtype=dtype, device=q.device)
        for j, first, count in runs:
            torch.bmm(pages(key_cache, first, count), q_t, out=s_t[:, j * bs : (j + count) * bs])
        s = s_t.transpose(1, 2).contiguous()
    if mask is not None:
        s.masked_fill_(~mask, float("-inf"))
    elif visible is not None and visible < nbk * bs:
        s[..., visible:] = float("-inf")
    p = torch.softmax(s, dim=-1)
    if dtype == torch.float32 or dtype == torch.float64:
        o = torch.zeros(hkv, rows, dv, dtype=dtype, device=q.device)
        for j, first, count in runs:
            o.baddbmm_(p[:, :, j * bs : (j + count) * bs], pages(value_cache, first, count))
        return o
    parts = torch.empty(len(runs), hkv, rows, dv, dtype=dtype, device=q.device)
    for i, (j, first, count) in enumerate(runs):
        torch.bmm(p[:, :, j * bs : (j + count) * bs], pages(value_cache, first, count), out=parts[i])
    return parts.sum(dim=0, dtype=torch.float32) if len(runs) > 1 else parts[0]
