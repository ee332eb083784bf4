"""Paged attention (reference), vectorised over requests.

Requests are processed in chunks of equal query length (decodes together, speculative-decode verifies together, each
long prefill alone, a long decode's KV heads in groups) whose gathered K/V stays under the threads' share of
`CHUNK_BYTES`. A chunk gathers its blocks into a reused workspace (no per-call allocation of large temporaries, no
Python loop per token) and folds the query heads that share a KV head into rows (`[n, kv_heads, q_len * group,
head]`). Few rows (decode, speculative verify), sinks or a distinct V head size: the pages are gathered head-major
(`[n, kv_heads, keys, head]`), so the scores are ONE batched matmul over every (request, KV head) of the chunk, then
one float32 softmax and one output matmul. Few ops per chunk matter as much as few bytes: with several intra-op
threads every torch op is an OpenMP region whose barrier waits for a descheduled thread on a loaded machine (the
previous per-(request, block, head) formulation needed about twice the ops, with re-layout copies of queries, scores
and probabilities, and ran ~2x slower at load ~8 on 2 cores). So the block-matmul chunks run on one intra-op thread
each, and the caller's N intra-op threads become N Python threads that share the chunks (`chunk_threads`: no barrier
per op, one wait per call). A reduced-precision cache on a CPU whose torch matmul only emulates that precision
(no oneDNN bfloat16/float16: AVX2) goes to torch's fused attention over the gathered pages, or with sinks is read
into float32 pages for the block matmuls (`_emulated_matmul`, `_attend_blocks`). Many rows
(prefill): torch's fused scaled_dot_product_attention over the gathered sequence, on the caller's intra-op threads.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading

import torch
import torch.nn.functional as F

from ascend_kernels.reference import native_attention, paged_small_decode
from ascend_kernels.reference.chunk_threads import run_chunks
from ascend_kernels.reference.paged_blocks import attend_pages as _attend_pages
from ascend_kernels.reference.paged_prefill import prefill_pieces

# Bytes per chunk (gathered K+V, plus the dense K copy reduced precision makes, see _attend_blocks): big enough to
# batch a decode step, small enough to stay near the CPU caches. One thread (CPU time, benchmarks/kernels.py decode
# shapes, gathered bytes): bfloat16 7.9 ms at 4 MiB vs 8.7 ms at 8 MiB, float32 equal (10.2-10.3 ms at 3-8 MiB),
# both worse at 1 MiB and at 16 MiB; i.e. one whole 1,024-token request per chunk (8 MiB float32, 6 MiB bfloat16).
CHUNK_BYTES = 8 << 20
# The budget is shared: with N threads each chunk gets CHUNK_BYTES / N, and a request over it is split into groups of
# KV heads. Measured (2 threads, the benchmark's decode, quiet machine, best of 10): whole-request chunks 7.7-8.4 ms
# float32 / 4.7 ms bfloat16; 4 KV heads (4 / 3 MiB) 5.5 / 4.2-4.3 ms; 2 heads 5.5 / 4.8-5.0 ms.
# Where the matmuls run in float32 over a reduced-precision cache, a block's pages (all KV heads, in the cache's
# dtype) at least this big are converted block by block straight into place (`_converting_reader`); smaller ones
# are gathered in the cache's dtype and converted after, since a copy per block costs a few us of dispatch.
# bfloat16 decode, 8 x 1,024 tokens, 2 threads, best of 10 interleaved with the gather + conversion (load ~4-5):
# block 128 (512 KiB) 30-34 vs 38-40 ms; block 16 (64 KiB) 18-20 vs 15-16 ms; 32 and 64 within the noise.
PAGE_COPY_MIN_BYTES = 256 << 10
# Up to this many query rows per KV head (q_len * heads per KV head) use the block-batched matmuls; more use SDPA.
SMALL_ROWS = 64
# Small contexts are gathered even where the pages could be read in place: at a few blocks per request the in-place
# path's per-request Python (a part, a softmax and two matmul loops each) costs more than copying the pages, and the
# gathered chunk is one batched matmul for the whole batch. Measured (float32, 1-2 threads, loaded machine, this file's
# decode): 4 requests x 64 tokens 1.7 ms in place / 0.6 ms gathered; 32 x 200 tokens (400 KiB each) 45-59 / 17-37 ms;
# 4 x 700 tokens (1.4 MiB each) 6.3-7.3 / 8.5-8.7 ms; 8 x 1,024 (8 MiB each) 7.5-12.2 / 18.7-23.5 ms.
# Gathered K and V bytes per request (on average over the batch) up to which to gather; ASCEND_KERNELS_GATHER_BYTES
# sets another (0: always in place), e.g. for an engine of a tiny model to run the path long contexts take.
GATHER_SMALL_BYTES = int(os.environ.get("ASCEND_KERNELS_GATHER_BYTES", 512 << 10))

_WORKSPACE: dict[tuple, torch.Tensor] = {}


@contextlib.contextmanager
def _one_intra_op_thread():
    """Run the enclosed torch ops on ONE intra-op thread, restoring the caller's count after.

    The block-matmul path is a string of small memory-bound ops, and with N intra-op threads each one is an OpenMP
    region whose end waits at a barrier for every thread: on a loaded machine a descheduled thread holds each
    barrier for a scheduler slice. Measured on the 2-core dev machine (benchmarks/kernels.py shapes: decode, 8 x
    1,024 tokens, interleaved best of 20, load 5-7): 2 threads 260-267 ms float32 / 97-316 ms bfloat16, one thread
    22-26 ms / 17-28 ms; quiet (load 0.2) the earlier formulation took 15.3 ms on 2 threads and 10.5-10.9 ms of CPU
    on one, so the second thread bought nothing there either. torch.set_num_threads is cheap (~0.1 us) but sets
    torch's process default too: a thread that starts its first parallel op inside this window takes that default.
    """
    previous = torch.get_num_threads()
    if previous == 1:
        yield
        return
    # torch._C's setter, not `torch.set_num_threads`: a CPU worker that bound its OpenMP threads replaces the latter
    # with a no-op that warns (vLLM's and our simulated worker), to stop callers resizing the bound pool for good.
    # This window shrinks the team and restores the same size: the pool's threads and their binding stay.
    torch._C.set_num_threads(1)
    try:
        yield
    finally:
        torch._C.set_num_threads(previous)


def _workspace(tag: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous scratch tensor of `shape`, reused across calls (large fresh allocations page-fault each time).

    Keyed by thread as well, so concurrent callers never share a buffer.
    """
    numel = math.prod(shape)
    key = (tag, dtype, device, threading.get_ident())
    buf = _WORKSPACE.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype, device=device)
        _WORKSPACE[key] = buf
    return buf[:numel].view(shape)


def _gather_blocks(tag: str, cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """cache[blocks] (blocks: `[n, nbk]` long) block-major, as `[n * nbk, heads, block_size, dim]`.

    Reading through the cache's own strides (one `index_select` over a permuted view), so any strided layout works.
    """
    heads_major = cache.permute(0, 2, 1, 3)
    _, h, bs, d = heads_major.shape
    dst = _workspace(tag, (blocks.numel(), h, bs, d), cache.dtype, cache.device)
    torch.index_select(heads_major, 0, blocks.reshape(-1), out=dst)
    return dst


def _page_rows(cache: torch.Tensor) -> tuple[torch.Tensor, int, int] | None:
    """The cache's storage as `[rows, block_size * width]`, one row per (block, head) page, with the row of block b,
    head h at `b * rows_per_block + h + first`, when every page is one contiguous run (the allocator's layout);
    returns (rows, rows_per_block, first), else None."""
    _, bs, h, w = cache.shape
    s0, s1, s2, s3 = cache.stride()
    unit = s2 if h > 1 else bs * w
    offset = cache.storage_offset()
    if s3 != 1 or s1 != w or unit < bs * w or s0 % unit or offset % unit:
        return None
    total = cache.untyped_storage().nbytes() // cache.element_size()
    rows = (total - bs * w) // unit + 1
    return cache.as_strided((rows, bs * w), (unit, 1), 0), s0 // unit, offset // unit


def _gather_pages(tag: str, cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """cache[blocks] (blocks: `[n, nbk]` long) head-major, as `[n, heads, nbk * block_size, width]`.

    The keys one (request, head) attends to become one uniformly strided matrix, so a single batched matmul covers a
    whole chunk with no re-layout of queries, scores or probabilities. Head-major pages take one `index_select` of
    whole (block, head) pages; token-major dense blocks an `index_select` of whole blocks and one copy to head-major;
    any other layout an advanced-index gather through its strides (~4x slower).
    """
    n, nbk = blocks.shape
    _, bs, h, w = cache.shape
    heads = torch.arange(h, device=cache.device)
    pages = _page_rows(cache)
    if pages is None and cache.stride(3) == 1 and cache.stride(2) == w and cache.stride(1) == h * w:
        # Token-major blocks, each one dense run (the device KV layout's planes): gather whole blocks, then turn them
        # head-major in one copy; 4-5x faster than the advanced-index gather (2 threads, 16 requests x 64 blocks of
        # [16, 8, 128]: float32 12.9 vs 51.6 ms, bfloat16 5.5 vs 26.1 ms).
        flat = _workspace(tag + "_tok", (n * nbk, bs, h, w), cache.dtype, cache.device)
        torch.index_select(cache, 0, blocks.reshape(-1), out=flat)
        dst = _workspace(tag, (n, h, nbk, bs, w), cache.dtype, cache.device)
        dst.copy_(flat.view(n, nbk, bs, h, w).permute(0, 3, 1, 2, 4))
        return dst.view(n, h, nbk * bs, w)
    if pages is None:
        return cache.permute(0, 2, 1, 3)[blocks[:, None, :], heads[None, :, None]].view(n, h, nbk * bs, w)
    rows, per_block, first = pages
    index = (blocks[:, None, :] * per_block + heads[None, :, None] + first).reshape(-1)
    dst = _workspace(tag, (index.numel(), bs * w), cache.dtype, cache.device)
    torch.index_select(rows, 0, index, out=dst)
    return dst.view(n, h, nbk * bs, w)


def _packed_kv(key_cache: torch.Tensor, value_cache: torch.Tensor) -> torch.Tensor | None:
    """`[num_blocks, block_size, heads, 2 * head]` over both caches when each token's V row directly follows its K
    row in one storage (how the allocator packs them), else None."""
    d = key_cache.shape[3]
    if (
        value_cache.shape != key_cache.shape
        or value_cache.stride() != key_cache.stride()
        or value_cache.dtype != key_cache.dtype
        or key_cache.stride(3) != 1
        or value_cache.untyped_storage().data_ptr() != key_cache.untyped_storage().data_ptr()
        or value_cache.storage_offset() != key_cache.storage_offset() + d
    ):
        return None
    nb, bs, h, _ = key_cache.shape
    s0, s1, s2, _ = key_cache.stride()
    return key_cache.as_strided((nb, bs, h, 2 * d), (s0, s1, s2, 1))


def _gather_sequence(tag: str, cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """cache[blocks] token-major, as `[n, nbk * block_size, heads, dim]` (the layout SDPA reads as a strided view)."""
    n, nbk = blocks.shape
    _, bs, h, d = cache.shape
    dst = _workspace(tag + "_seq", (n * nbk, bs, h, d), cache.dtype, cache.device)
    torch.index_select(cache, 0, blocks.reshape(-1), out=dst)
    return dst.view(n, nbk * bs, h, d)


def _chunks(qlens: list[int], ctx_blocks: list[int], bytes_per_block: int, limit: int) -> list[list[int]]:
    """Group request indices with equal q_len, each group's gathered bytes under `limit` (at least one request)."""
    order = sorted((i for i, q in enumerate(qlens) if q > 0), key=lambda i: qlens[i])
    chunks: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        grown = max(cur_max, ctx_blocks[i])
        if cur and (qlens[i] != qlens[cur[0]] or grown * (len(cur) + 1) * bytes_per_block > limit):
            chunks.append(cur)
            cur, grown = [], ctx_blocks[i]
        cur.append(i)
        cur_max = grown
    if cur:
        chunks.append(cur)
    return chunks


@functools.cache
def _emulated_matmul(dtype: torch.dtype) -> bool:
    """Whether torch's CPU matmul only emulates `dtype` (a reduced precision without oneDNN support: AVX2 CPUs).

    There a reduced-precision bmm is a slow per-matrix fallback, so the block matmuls never run in it (see
    `_attend_blocks`). Measured on the 2-core AVX2 dev machine (one thread, one request's 8 KV heads x 1,024 keys,
    head 128): bfloat16 p @ V 8.6 ms on the strided V / 3.5 ms dense, q @ K^T 1.4-1.5 ms; converting the gathered
    K|V to float32 0.33 ms, then both float32 matmuls 0.63 ms.
    """
    if dtype not in (torch.bfloat16, torch.float16):
        return False
    if not torch.backends.mkldnn.is_available():
        return True
    probe = (
        torch.ops.mkldnn._is_mkldnn_bf16_supported
        if dtype == torch.bfloat16
        else torch.ops.mkldnn._is_mkldnn_fp16_supported
    )
    return not probe()


def _matmul_dtype(cache: torch.Tensor) -> torch.dtype:
    """The dtype the block matmuls run in: the cache's, or float32 where the CPU only emulates it."""
    return torch.float32 if cache.device.type == "cpu" and _emulated_matmul(cache.dtype) else cache.dtype


def _converting_reader(key_cache: torch.Tensor, value_cache: torch.Tensor, table: torch.Tensor, dtype: torch.dtype):
    """`_page_reader` for a matmul dtype other than the cache's: the pages are gathered and converted in ONE pass,
    a `_foreach_copy_` (one call, a converting copy per block) of each block's `[heads, block_size, width]` pages
    into its keys' place in a `dtype` workspace.

    An index_select in the cache's dtype and a conversion after it would write and read the gathered pages once
    more. 1 thread, the benchmark's bfloat16 decode (8 requests x 8 blocks, whole requests; loaded machine, best /
    median of 20): 4.2 / 4.7 ms vs 6.2-7.0 / 7.5-8.2 ms for the gather + conversion; a `torch.cat` into the
    workspace converts each block into a temporary first (5.8-8.2 / 7.3-13 ms). The pages' strides are read as
    they are, so every layout takes it; the block ids go to the host (a few per request), the pages are views.
    """
    d = key_cache.shape[3]
    packed = _packed_kv(key_cache, value_cache)
    parts = [("kv_mm", packed)] if packed is not None else [("k_mm", key_cache), ("v_mm", value_cache)]
    parts = [(tag, cache.permute(0, 2, 1, 3)) for tag, cache in parts]  # [blocks, heads, block_size, width]

    def read_converted(rows, nbk: int, kv_heads: slice = slice(None)):
        ids = (table[rows, :nbk] if isinstance(rows, slice) else rows[:, :nbk]).tolist()
        gathered = []
        for tag, pages in parts:
            pages = pages[:, kv_heads]
            _, hh, bs, width = pages.shape
            dst = _workspace(tag, (len(ids), hh, nbk, bs, width), dtype, pages.device)
            for i, blocks in enumerate(ids):
                torch._foreach_copy_(dst[i].unbind(1), [pages[b] for b in blocks])
            gathered.append(dst.view(-1, nbk * bs, width))
        if packed is not None:
            return gathered[0][..., :d], gathered[0][..., d:]
        return gathered[0], gathered[1]

    return read_converted


def _page_reader(key_cache: torch.Tensor, value_cache: torch.Tensor, table: torch.Tensor, dtype: torch.dtype):
    """One call's gather of head-major pages: `read(blocks, nbk, kv_heads)` (blocks: `[n, >= nbk]` block ids, or a
    slice of `table`'s rows; kv_heads a slice of KV heads) -> (k, v) in `dtype`, each `[n * heads, nbk *
    block_size, head]` (one matrix per (request, KV head)).

    The allocator's packed K|V caches take ONE index_select of whole (block, head) K|V pages per chunk (half the
    DRAM streams of two gathers), with each block's first page row computed once per call; other layouts fall back
    to `_gather_pages`. A `dtype` other than the cache's takes `_converting_reader` for large blocks, else these
    gathers and a conversion of K and V after (see PAGE_COPY_MIN_BYTES).
    """
    if dtype != key_cache.dtype:
        _, bs, hkv, d = key_cache.shape
        if bs * hkv * (d + value_cache.shape[3]) * key_cache.element_size() >= PAGE_COPY_MIN_BYTES:
            return _converting_reader(key_cache, value_cache, table, dtype)
        read = _page_reader(key_cache, value_cache, table, key_cache.dtype)

        def read_then_convert(rows, nbk: int, kv_heads: slice = slice(None)):
            k, v = read(rows, nbk, kv_heads)
            return (
                _workspace("k_mm", k.shape, dtype, k.device).copy_(k),
                _workspace("v_mm", v.shape, dtype, v.device).copy_(v),
            )

        return read_then_convert
    d = key_cache.shape[3]
    packed = _packed_kv(key_cache, value_cache)
    pages = _page_rows(packed) if packed is not None else None
    if pages is None:

        def read_any(rows, nbk: int, kv_heads: slice = slice(None)):
            blocks = table[rows, :nbk] if isinstance(rows, slice) else rows[:, :nbk]
            if packed is not None:
                kv = _gather_pages("kv", packed[:, :, kv_heads], blocks).flatten(0, 1)
                return kv[..., :d], kv[..., d:]
            return (
                _gather_pages("k", key_cache[:, :, kv_heads], blocks).flatten(0, 1),
                _gather_pages("v", value_cache[:, :, kv_heads], blocks).flatten(0, 1),
            )

        return read_any
    page_rows, per_block, first = pages
    _, bs, hkv, _ = key_cache.shape
    heads = torch.arange(hkv, device=table.device)[:, None]
    page_ids = (table * per_block + first)[:, None, :] + heads  # [r, hkv, width]: page row of (request, head, j)

    def read_pages(rows, nbk: int, kv_heads: slice = slice(None)):
        if isinstance(rows, slice):
            index = page_ids[rows, kv_heads, :nbk].reshape(-1)
        else:
            index = ((rows[:, :nbk] * per_block + first)[:, None, :] + heads[kv_heads]).view(-1)
        dst = _workspace("kv", (index.numel(), bs * 2 * d), packed.dtype, packed.device)
        torch.index_select(page_rows, 0, index, out=dst)
        kv = dst.view(-1, nbk * bs, 2 * d)
        return kv[..., :d], kv[..., d:]

    return read_pages


def _attend_blocks(q, k, v, mask, scale, sink_rows):
    """Attention over head-major gathered pages: one batched matmul for the scores, one for the output.

    q `[n * hkv, rows, d]`; k, v `[n * hkv, keys, d]` / `[.., dv]`; mask `[n, 1, rows, keys]` or None (everything
    visible); softmax in float32, with per-row sink logits `[1, hkv, rows, 1]` joining the denominator when given.
    Three-dimensional operands throughout: the call count per chunk is what a decode step pays for (~2 us each).
    Scores are `q @ K^T` (rows x keys), the orientation BLAS runs ~3x faster than `K @ q^T` for a handful of rows.
    Reduced-precision scores go to softmax as they are: torch's CPU softmax computes in float32 internally and
    rounds once, which is what the float() -> softmax -> to() round trip did in three ops. k and v come in the
    matmul dtype (`_matmul_dtype`), which q is brought to. Returns `[n * hkv, rows, dv]` in that dtype.

    Pages in a reduced precision the CPU only emulates (the caller reads them so when there are no sinks) go through
    torch's fused attention instead, which converts tile by tile in cache: a float32 copy of every page for the
    matmuls doubles the bytes a chunk moves, which a loaded machine punishes most. 1 thread, the benchmark's
    bfloat16 decode, CPU time median of 30 (load 6-8): 16.5-17.5 vs 24.1-24.5 ms, in two later runs 14.5 vs 16.7
    and 13.1 vs 12.7 ms; 2 threads, best of 10: 23-33 vs 29-47 ms, lower in each of 5 interleaved trials.
    """
    if sink_rows is None and k.device.type == "cpu" and _emulated_matmul(k.dtype):
        # Four-dimensional operands: torch's fused CPU kernel takes only those (three fall back to its unfused math,
        # i.e. the emulated bmm: ~5x slower).
        n = mask.shape[0] if mask is not None else 1
        shape = (n, q.shape[0] // n, -1)
        o = F.scaled_dot_product_attention(
            q.view(*shape, q.shape[2]),
            k.view(*shape, k.shape[2]),
            v.view(*shape, v.shape[2]),
            attn_mask=mask,
            scale=scale,
        )
        return o.flatten(0, 1)
    if k.dtype != torch.float32 and not k.is_contiguous():
        # oneDNN's reduced-precision GEMM is ~2-8x slower on a strided K^T than a copy plus a dense one.
        k = _workspace("k_dense", k.shape, k.dtype, k.device).copy_(k)
    s = torch.bmm(q.to(k.dtype) * scale, k.transpose(1, 2))
    if mask is not None:  # [n * hkv, rows, keys] seen as [n, hkv, rows, keys]
        s.view(mask.shape[0], -1, *s.shape[1:]).masked_fill_(~mask, float("-inf"))
    if sink_rows is None:
        p = torch.softmax(s, dim=-1)
    else:
        s = s.float().view(-1, *sink_rows.shape[1:3], s.shape[2])
        top = torch.maximum(s.amax(dim=-1, keepdim=True), sink_rows)
        e = torch.exp(s - top)
        p = (e / (e.sum(dim=-1, keepdim=True) + torch.exp(sink_rows - top))).to(v.dtype).flatten(0, 1)
    return torch.bmm(p, v)


def _mask(ctx, m, g, length, causal, sliding_window):
    """`[n, 1, m * g, length]` bool: row (i, head-in-group) of request r may see key j (see the op's contract)."""
    device = ctx.device
    n = ctx.shape[0]
    pos = (ctx - m)[:, None] + torch.arange(m, device=device)  # [n, m]
    j = torch.arange(length, device=device)
    mask = j[None, None, :] < ctx[:, None, None]
    if causal:
        mask = mask & (j[None, None, :] <= pos[:, :, None])
    if sliding_window is not None:
        mask = mask & (j[None, None, :] > pos[:, :, None] - sliding_window)
    return mask[:, None, :, None, :].expand(n, 1, m, g, length).reshape(n, 1, m * g, length)


def _per_block_bytes(key_cache: torch.Tensor, value_cache: torch.Tensor, sinks) -> int:
    """Gathered bytes per block: the pages in the dtype they are read in (the matmul dtype, except that without sinks
    a precision the CPU only emulates goes to torch's fused attention as it is, see _attend_blocks), plus the dense K
    copy natively supported reduced precision makes."""
    _, bs, hkv, d = key_cache.shape
    read_dtype = key_cache.dtype if sinks is None else _matmul_dtype(key_cache)
    dense_k = read_dtype != torch.float32 and not _emulated_matmul(read_dtype)
    return bs * hkv * (d + value_cache.shape[3] + (d if dense_k else 0)) * read_dtype.itemsize


def _reads_in_place(key_cache: torch.Tensor, value_cache: torch.Tensor, sinks, ctx_blocks: list[int],
                    per_block: int, requests: int) -> bool:
    """Few rows without sinks over a float32 / float64 cache read the pages in place (`paged_blocks`), one request
    (or KV-head group) per part, unless the contexts are small enough to gather (see GATHER_SMALL_BYTES); reduced
    precision keeps the gathered pages (see paged_blocks for why)."""
    if sinks is not None or key_cache.dtype not in (torch.float32, torch.float64):
        return False
    return value_cache.dtype == key_cache.dtype and sum(ctx_blocks) * per_block > GATHER_SMALL_BYTES * requests


def _small_decode(query, key_cache, value_cache, starts: list[int], lens: list[int], sinks) -> bool:
    """Whether a batch takes `paged_small_decode`: a small decode batch whose pages the general path would gather."""
    qlens = [starts[i + 1] - starts[i] for i in range(len(lens))]
    if not paged_small_decode.fits(query, key_cache, value_cache, qlens, lens, sinks):
        return False
    bs = key_cache.shape[1]
    ctx_blocks = [-(-n // bs) for n in lens]
    per_block = _per_block_bytes(key_cache, value_cache, sinks)
    return not _reads_in_place(key_cache, value_cache, sinks, ctx_blocks, per_block, len(lens))


def paged_attention(
    query,
    key_cache,
    value_cache,
    block_table,
    query_start_loc,
    seq_lens,
    *,
    scale,
    causal=True,
    sliding_window=None,
    sinks=None,
    out=None,
    query_start_loc_host=None,
    seq_lens_host=None,
):
    t, hq, d = query.shape
    _, bs, hkv, _ = key_cache.shape
    dv = value_cache.shape[3]
    g = hq // hkv
    if out is None:
        out = query.new_zeros(t, hq, dv)
    r = block_table.shape[0]
    if r == 0 or t == 0:
        out.zero_()
        return out
    # host-side schedule: the caller's host lists when given, else read back (the reference backend may sync)
    starts = query_start_loc_host if query_start_loc_host is not None else query_start_loc.tolist()
    lens = seq_lens_host if seq_lens_host is not None else seq_lens.tolist()
    if starts[-1] < t:
        out[starts[-1] :].zero_()
    if native_attention.paged_decode(query, key_cache, value_cache, block_table, seq_lens, starts, lens, scale,
                                     sliding_window, sinks, out):
        return out
    if native_attention.paged_tiled(query, key_cache, value_cache, block_table, starts, lens, scale, causal,
                                    sliding_window, sinks, out):
        return out
    plan = paged_small_decode.step_plan(query, key_cache, value_cache, block_table, seq_lens, starts, lens,
                                        sliding_window, lambda: _small_decode(query, key_cache, value_cache, starts,
                                                                              lens, sinks))
    if plan is not None:
        return paged_small_decode.attend_small_decode(query, key_cache, value_cache, plan, scale, out)
    qlens = [starts[i + 1] - starts[i] for i in range(r)]
    ctx_blocks = [-(-n // bs) for n in lens]
    read_dtype = key_cache.dtype if sinks is None else _matmul_dtype(key_cache)  # see _per_block_bytes
    per_block = _per_block_bytes(key_cache, value_cache, sinks)
    device = query.device
    table = block_table.long().clamp(0, key_cache.shape[0] - 1)  # never in place: the caller's table may be long

    def by_blocks(m: int) -> bool:  # else torch's fused attention, which tiles a long prefill's [rows, keys] problem
        return sinks is not None or dv != d or m * g <= SMALL_ROWS

    in_place = _reads_in_place(key_cache, value_cache, sinks, ctx_blocks, per_block, r)
    table_host: list[list[int]] = []

    threads = torch.get_num_threads()
    limit = max(1, CHUNK_BYTES // max(1, threads))
    chunks = _chunks(qlens, ctx_blocks, per_block, limit)
    read = None
    if not in_place and any(by_blocks(qlens[idx[0]]) for idx in chunks):
        read = _page_reader(key_cache, value_cache, table, read_dtype)

    def head_groups(idx: list[int]) -> list[tuple[list[int], slice]]:
        """A chunk's (requests, KV heads) parts: a lone request over the budget is split into groups of KV heads.

        In place, every request is a part of its own (there is no gathered workspace to bound), split into KV-head
        groups when there are fewer requests than threads, so that every thread has a share.
        """
        if in_place and by_blocks(qlens[idx[0]]):
            groups = min(hkv, threads) if len(request_ids) < threads else 1
            size = -(-hkv // groups)
            return [([i], slice(h, min(h + size, hkv))) for i in idx for h in range(0, hkv, size)]
        if len(idx) > 1 or not by_blocks(qlens[idx[0]]) or ctx_blocks[idx[0]] * per_block <= limit:
            return [(idx, slice(None))]
        groups = min(hkv, -(-ctx_blocks[idx[0]] * per_block // limit))
        size = -(-hkv // groups)
        return [(idx, slice(h, min(h + size, hkv))) for h in range(0, hkv, size)]

    def attend(part: tuple[list[int], slice]) -> tuple[slice | torch.Tensor, slice, torch.Tensor]:
        """(token rows, query heads, their outputs `[rows, heads, dv]`) of one chunk of requests with equal q_len."""
        idx, kv_heads = part
        n, m = len(idx), qlens[idx[0]]
        nbk = max(ctx_blocks[i] for i in idx)
        length = nbk * bs
        h0, h1, _ = kv_heads.indices(hkv)
        hh = h1 - h0
        q_heads = slice(h0 * g, h1 * g)
        if idx[-1] - idx[0] == n - 1:  # consecutive requests (a decode batch): views instead of index ops
            sel = slice(idx[0], idx[-1] + 1)
            rows = slice(starts[idx[0]], starts[idx[-1] + 1])
            q = query[rows]
            ctx = seq_lens[sel]  # a view: free unless a mask reads it
            blocks = sel
        else:
            sel = torch.tensor(idx, device=device)
            first = torch.tensor([starts[i] for i in idx], device=device)
            rows = (first[:, None] + torch.arange(m, device=device)).reshape(-1)  # token index of each (req, i)
            q = query.index_select(0, rows)
            ctx = seq_lens.index_select(0, sel)
            blocks = table.index_select(0, sel)
        # [n*m, heads, d] -> [n * hh, m*g, d]: the g query heads of a KV head become rows of one matrix (a view for
        # decodes, m == 1, of a query whose tokens are contiguous).
        q = q.view(n, m, hkv, g, d)[:, :, kv_heads]
        q = q.reshape(n * hh, g, d) if m == 1 else q.transpose(1, 2).reshape(n * hh, m * g, d)
        everything_visible = m == 1 and all(lens[i] == length for i in idx)
        everything_visible = everything_visible and (sliding_window is None or sliding_window >= length)
        if in_place and by_blocks(m):
            if m == 1 and sliding_window is None:  # a decode sees its context: no mask tensor to build
                mask, visible = None, lens[idx[0]]
            else:
                mask, visible = (
                    None if everything_visible else _mask(ctx.long(), m, g, length, causal, sliding_window)[0],
                    None,
                )
            o = _attend_pages(
                q,
                key_cache[:, :, kv_heads],
                value_cache[:, :, kv_heads],
                table_host[idx[0]][:nbk],
                scale,
                mask,
                visible,
            )
            if m == 1:
                return rows, q_heads, o.view(n, hh * g, dv)
            return rows, q_heads, o.view(n, hh, m, g, dv).transpose(1, 2).reshape(n * m, hh * g, dv)
        mask = None if everything_visible else _mask(ctx.long(), m, g, length, causal, sliding_window)
        sink_rows = None
        if sinks is not None:
            sink_rows = sinks[q_heads].float().view(1, hh, 1, g, 1).expand(1, hh, m, g, 1).reshape(1, hh, m * g, 1)
        k, v = read(blocks, nbk, kv_heads)
        o = _attend_blocks(q, k, v, mask, scale, sink_rows)
        if m == 1:
            return rows, q_heads, o.view(n, hh * g, dv)
        return rows, q_heads, o.view(n, hh, m, g, dv).transpose(1, 2).reshape(n * m, hh * g, dv)

    def attend_long(idx: list[int]) -> None:
        """A chunk of long query runs (prefills) of equal length: torch's fused attention over the gathered keys, in
        pieces of query rows (`paged_prefill`), each piece stored as it comes."""
        n, m = len(idx), qlens[idx[0]]
        nbk = max(ctx_blocks[i] for i in idx)
        sel = torch.tensor(idx, device=device)
        blocks = table.index_select(0, sel)[:, :nbk]
        k = _gather_sequence("k", key_cache, blocks).transpose(1, 2)  # [n, hkv, L, d]
        v = _gather_sequence("v", value_cache, blocks).transpose(1, 2)
        if idx[-1] - idx[0] == n - 1:  # consecutive requests: the queries and outputs as views
            q = query[starts[idx[0]] : starts[idx[0]] + n * m].unflatten(0, (n, m))
            dst, rows = out[starts[idx[0]] : starts[idx[0]] + n * m].unflatten(0, (n, m)), None
        else:
            first = torch.tensor([starts[i] for i in idx], device=device)
            rows = first[:, None] + torch.arange(m, device=device)  # [n, m]: token index of each (request, i)
            q, dst = query.index_select(0, rows.reshape(-1)).unflatten(0, (n, m)), None
        ctx = seq_lens.index_select(0, sel).long()
        ranges, attend_piece = prefill_pieces(
            q.transpose(1, 2), k, v, ctx, [lens[i] for i in idx], scale, causal, sliding_window
        )

        def piece(i0_i1: tuple[int, int]) -> None:  # stores its own rows: the pieces' rows never overlap
            i0, i1 = i0_i1
            o = attend_piece(i0_i1).transpose(1, 2)  # [n, rows, hq, dv]
            if dst is not None:
                dst[:, i0:i1].copy_(o)
            else:
                out.index_copy_(0, rows[:, i0:i1].reshape(-1), o.reshape(-1, hq, dv).to(out.dtype))

        with _one_intra_op_thread():
            run_chunks(piece, ranges, threads)

    def store(rows: slice | torch.Tensor, q_heads: slice, o: torch.Tensor) -> None:
        if isinstance(rows, slice):
            out[rows, q_heads].copy_(o)
        else:
            out[:, q_heads].index_copy_(0, rows, o.to(out.dtype))

    request_ids = [i for idx in chunks if by_blocks(qlens[idx[0]]) for i in idx]
    if in_place and request_ids:
        table_host.extend(table.tolist())
    with _one_intra_op_thread():  # many small ops per chunk: see _one_intra_op_thread for why
        # The caller's intra-op threads become threads sharing whole chunks (see chunk_threads for why).
        parts = [part for idx in chunks if by_blocks(qlens[idx[0]]) for part in head_groups(idx)]
        for done in run_chunks(attend, parts, threads):
            store(*done)
    for idx in chunks:  # long prefills: few large fused ops, on the caller's intra-op threads
        if not by_blocks(qlens[idx[0]]):
            attend_long(idx)
    return out
