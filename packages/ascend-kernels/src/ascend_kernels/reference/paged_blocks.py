"""Attention of one request's few query rows straight over its cache blocks: no gathered copy of the pages.

A decode (or speculative verify) reads every key and value once, so the bytes it moves decide its time. Gathering a
request's blocks into a workspace first writes and reads them all again (and the token-major planes of the device
KV layout need a second copy to turn head-major); here each block is a view of the cache, `[kv_heads, block_size,
head]` over the plane's own strides, and two batched matmuls per block (scores, then probabilities times values)
read it in place. The scores of all blocks meet in one small buffer for a single exact softmax.

Measured (1 thread, pinned, the benchmark's decode: 8 requests x 1,024 tokens, 32 q / 8 KV heads, head 128, block
128, token-major planes; load 12-20 from other jobs, so ratios only): float32 scores 14.4 ms (q @ K^T per block into
a per-block buffer; into strided slices of one buffer 19.2 ms, K @ q^T 56 ms), p @ V accumulated 19.1 ms, against
vLLM's CPU attention 24.3 ms for the whole op, where gathering K and V alone took 24.8 ms. The whole op in
benchmarks/kernels.py (--threads 1, pinned): float32 4.51x -> 1.61x vLLM's. Reduced precision is NOT read in place:
oneDNN copies every strided operand of a bfloat16 matmul to a dense one first (and q @ K^T over a strided block ran
67-70 ms), so in place it came to 2.30x against the gathered pages' 1.77x; those keep `attention._attend_blocks`.
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
    count (a decode's context), or neither: every key counts. Float32 / float64 caches only (see the module
    docstring for why reduced precision keeps the gathered pages). Returns `[kv_heads, rows, head_v]` in the cache's
    dtype.
    """
    hkv, rows, _ = q.shape
    _, bs, _, dv = value_cache.shape
    nbk = len(blocks)
    dtype = key_cache.dtype
    if nbk == 0:
        return q.new_zeros(hkv, rows, dv, dtype=dtype)
    q = q.to(dtype) * scale
    runs = _runs(blocks, all(c.stride(0) == bs * c.stride(1) for c in (key_cache, value_cache)))

    def pages(cache: torch.Tensor, first: int, count: int) -> torch.Tensor:
        """`[kv_heads, count * block_size, head]` over blocks first.. of `cache`: a view (runs only where the
        blocks lie back to back)."""
        run = cache[first : first + count]
        return run.reshape(count * bs, *run.shape[2:]).transpose(0, 1)

    per_block = torch.empty(nbk, hkv, rows, bs, dtype=dtype, device=q.device)
    for j, first, count in runs:
        keys_t = pages(key_cache, first, count).transpose(1, 2)
        if count == 1:
            torch.bmm(q, keys_t, out=per_block[j])
        else:
            per_block[j : j + count].permute(1, 2, 0, 3).copy_(torch.bmm(q, keys_t).view(hkv, rows, count, bs))
    s = per_block.permute(1, 2, 0, 3).reshape(hkv, rows, nbk * bs)  # one small copy: keys in order
    if mask is not None:
        s.masked_fill_(~mask, float("-inf"))
    elif visible is not None and visible < nbk * bs:
        s[..., visible:] = float("-inf")
    p = torch.softmax(s, dim=-1)
    o = torch.zeros(hkv, rows, dv, dtype=dtype, device=q.device)
    for j, first, count in runs:
        o.baddbmm_(p[:, :, j * bs : (j + count) * bs], pages(value_cache, first, count))
    return o
