"""Paged attention and MLA decode attention (reference), vectorised over requests.

Requests are processed in chunks of equal query length (decodes together, speculative-decode verifies together, each
long prefill alone) whose gathered K/V stays under `CHUNK_BYTES`. A chunk gathers its blocks with one `index_select`
per cache into a reused workspace (no per-call allocation of large temporaries, no Python loop per token) and folds
the query heads that share a KV head into rows (`[n, kv_heads, q_len * group, head]`). Few rows (decode, speculative
verify), sinks or a distinct V head size: scores and outputs are batched matmuls per (request, block, KV head) over
head-major gathered blocks, with an explicit float32 softmax. Many rows (prefill): torch's fused
scaled_dot_product_attention over the gathered sequence.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

# Gathered K+V bytes per chunk: big enough to batch a decode step, small enough to stay near the CPU caches.
CHUNK_BYTES = 8 << 20
# Up to this many query rows per KV head (q_len * heads per KV head) use the block-batched matmuls; more use SDPA.
SMALL_ROWS = 64

_WORKSPACE: dict[tuple, torch.Tensor] = {}


def _workspace(tag: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous scratch tensor of `shape`, reused across calls (large fresh allocations page-fault each time).

    Keyed by thread as well, so concurrent callers never share a buffer.
    """
    numel = 1
    for s in shape:
        numel *= s
    key = (tag, dtype, device, threading.get_ident())
    buf = _WORKSPACE.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype, device=device)
        _WORKSPACE[key] = buf
    return buf[:numel].view(shape)


def _gather_blocks(tag: str, cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """cache[blocks] (blocks: `[n, nbk]` long) head-major, as `[n * nbk, heads, block_size, dim]`.

    Reading through the cache's own strides (one `index_select` over a permuted view), so any strided layout works;
    the copy is contiguous per (block, head), which is what the batched matmuls want.
    """
    heads_major = cache.permute(0, 2, 1, 3)
    _, h, bs, d = heads_major.shape
    dst = _workspace(tag, (blocks.numel(), h, bs, d), cache.dtype, cache.device)
    torch.index_select(heads_major, 0, blocks.reshape(-1), out=dst)
    return dst


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


def _chunks(qlens: list[int], ctx_blocks: list[int], bytes_per_block: int) -> list[list[int]]:
    """Group request indices with equal q_len, each group's gathered bytes under CHUNK_BYTES (at least one)."""
    order = sorted((i for i, q in enumerate(qlens) if q > 0), key=lambda i: qlens[i])
    chunks: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        grown = max(cur_max, ctx_blocks[i])
        if cur and (qlens[i] != qlens[cur[0]] or grown * (len(cur) + 1) * bytes_per_block > CHUNK_BYTES):
            chunks.append(cur)
            cur, grown = [], ctx_blocks[i]
        cur.append(i)
        cur_max = grown
    if cur:
        chunks.append(cur)
    return chunks


def _attend_blocks(q, key_cache, value_cache, blocks, mask, scale, sink_rows):
    """Attention with one batched matmul per (request, block, kv head): no gathered sequence is ever re-laid out.

    q `[n, hkv, rows, d]`; blocks `[n, nbk]`; mask `[n, 1, rows, nbk * bs]` or None (everything visible); float32
    softmax, with per-row sink logits `[1, hkv, rows, 1]` joining the denominator when given. Scores are
    `q @ K^T` (rows x block), the orientation BLAS runs ~3x faster than `K @ q^T` for a handful of rows. Packed K|V
    caches are gathered in one pass; separate ones gather V only after the scores, so each gathered chunk is read
    back while it is still in the CPU caches.
    """
    n, hkv, rows, d = q.shape
    nbk = blocks.shape[1]
    bs = key_cache.shape[1]
    entries = n * nbk * hkv
    packed = _packed_kv(key_cache, value_cache)
    if packed is not None:
        # One pass over each token's K|V row: half the DRAM streams of two gathers.
        both = _gather_blocks("kv", packed, blocks).view(entries, bs, 2 * d)
        k_blocks, v_blocks = both[:, :, :d], both[:, :, d:]
        if k_blocks.dtype != torch.float32:
            # oneDNN's reduced-precision GEMM is ~8x slower on a strided K^T than a copy plus a dense one.
            k_blocks = _workspace("k_dense", (entries, bs, d), k_blocks.dtype, k_blocks.device).copy_(k_blocks)
    else:
        k_blocks = _gather_blocks("k", key_cache, blocks).view(entries, bs, d)  # [n * nbk * hkv, bs, d]
    q_rep = (q * scale).unsqueeze(1).expand(n, nbk, hkv, rows, d).reshape(entries, rows, d)
    s = torch.bmm(q_rep, k_blocks.transpose(1, 2))  # [entries, rows, bs]
    s = s.view(n, nbk, hkv, rows, bs).permute(0, 2, 3, 1, 4).float().reshape(n, hkv, rows, nbk * bs)
    if mask is not None:
        s.masked_fill_(~mask, float("-inf"))
    if sink_rows is None:
        p = torch.softmax(s, dim=-1)
    else:
        top = torch.maximum(s.amax(dim=-1, keepdim=True), sink_rows)
        e = torch.exp(s - top)
        p = e / (e.sum(dim=-1, keepdim=True) + torch.exp(sink_rows - top))
    p = p.to(q.dtype).view(n, hkv, rows, nbk, bs).permute(0, 3, 1, 2, 4).reshape(entries, rows, bs)
    if packed is None:
        v_blocks = _gather_blocks("v", value_cache, blocks).view(entries, bs, value_cache.shape[3])
    o = torch.bmm(p, v_blocks)
    return o.view(n, nbk, hkv, rows, -1).float().sum(dim=1)  # [n, hkv, rows, dv]


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
    qlens = [starts[i + 1] - starts[i] for i in range(r)]
    ctx_blocks = [-(-n // bs) for n in lens]
    per_block = bs * hkv * (d + dv) * key_cache.element_size()
    device = query.device
    table = block_table.long().clamp_(0, key_cache.shape[0] - 1)
    for idx in _chunks(qlens, ctx_blocks, per_block):
        n, m = len(idx), qlens[idx[0]]
        nbk = max(ctx_blocks[i] for i in idx)
        sel = torch.tensor(idx, device=device)
        blocks = table.index_select(0, sel)[:, :nbk]
        first = torch.tensor([starts[i] for i in idx], device=device)
        rows = (first[:, None] + torch.arange(m, device=device)).reshape(-1)  # token index of each (req, i)
        # [n*m, hq, d] -> [n, hkv, m*g, d]: the g query heads of a KV head become rows of one matrix.
        q = query.index_select(0, rows).view(n, m, hkv, g, d).permute(0, 2, 1, 3, 4).reshape(n, hkv, m * g, d)
        length = nbk * bs
        everything_visible = m == 1 and all(lens[i] == length for i in idx)
        everything_visible = everything_visible and (sliding_window is None or sliding_window >= length)
        mask = (
            None
            if everything_visible
            else _mask(seq_lens.index_select(0, sel).long(), m, g, length, causal, sliding_window)
        )
        if sinks is not None or dv != d or m * g <= SMALL_ROWS:
            sink_rows = None
            if sinks is not None:
                sink_rows = sinks.float().view(1, hkv, 1, g, 1).expand(1, hkv, m, g, 1).reshape(1, hkv, m * g, 1)
            o = _attend_blocks(q, key_cache, value_cache, blocks, mask, scale, sink_rows)
        else:  # long prefills: torch's fused attention tiles the [rows, keys] problem
            k = _gather_sequence("k", key_cache, blocks).transpose(1, 2)  # [n, hkv, L, d]
            v = _gather_sequence("v", value_cache, blocks).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        o = o.view(n, hkv, m, g, dv).permute(0, 2, 1, 3, 4).reshape(n * m, hq, dv)
        out.index_copy_(0, rows, o.to(out.dtype))
    return out


def _packed_mla(latent_cache: torch.Tensor, rope_cache: torch.Tensor) -> torch.Tensor | None:
    """`[num_blocks, block_size, 1, rank + rope]` over both caches when each token's rope row directly follows its
    latent row in one storage (the MLA cache vLLM hands a layer), else None."""
    r = latent_cache.shape[3]
    if (
        rope_cache.shape[:3] != latent_cache.shape[:3]
        or rope_cache.stride()[:3] != latent_cache.stride()[:3]
        or rope_cache.dtype != latent_cache.dtype
        or latent_cache.stride(3) != 1
        or rope_cache.stride(3) != 1
        or rope_cache.untyped_storage().data_ptr() != latent_cache.untyped_storage().data_ptr()
        or rope_cache.storage_offset() != latent_cache.storage_offset() + r
    ):
        return None
    nb, bs, h, _ = latent_cache.shape
    return latent_cache.as_strided((nb, bs, h, r + rope_cache.shape[3]), latent_cache.stride())


def mla_decode_attention(q_nope_absorbed, q_rope, latent_cache, rope_cache, block_table, seq_lens, *, scale, out=None):
    b, h, r = q_nope_absorbed.shape
    bs = latent_cache.shape[1]
    if out is None:
        out = q_nope_absorbed.new_zeros(b, h, r)
    if b == 0:
        return out
    lens = seq_lens.tolist()
    ctx_blocks = [-(-n // bs) for n in lens]
    per_block = bs * (r + rope_cache.shape[3]) * latent_cache.element_size()
    device = q_nope_absorbed.device
    table = block_table.long().clamp_(0, latent_cache.shape[0] - 1)
    packed = _packed_mla(latent_cache, rope_cache)
    # One query row per head over [latent | rope]: a single score matmul against the packed rows.
    q_all = torch.cat([q_nope_absorbed, q_rope], dim=-1).float() if packed is not None else None
    for idx in _chunks([1] * b, ctx_blocks, per_block):
        nbk = max(ctx_blocks[i] for i in idx)
        sel = torch.tensor(idx, device=device)
        blocks = table.index_select(0, sel)[:, :nbk]
        n = len(idx)
        if packed is not None:
            rows = _gather_blocks("latent_rope", packed, blocks).view(n, nbk * bs, -1).float()
            latent = rows[..., :r]
            s = torch.bmm(q_all.index_select(0, sel), rows.transpose(1, 2))
        else:
            latent = _gather_blocks("latent", latent_cache, blocks).view(n, nbk * bs, r).float()
            rope = _gather_blocks("rope", rope_cache, blocks).view(n, nbk * bs, -1).float()
            s = torch.bmm(q_nope_absorbed.index_select(0, sel).float(), latent.transpose(1, 2))
            s += torch.bmm(q_rope.index_select(0, sel).float(), rope.transpose(1, 2))
        s.mul_(scale)
        if not all(lens[i] == nbk * bs for i in idx):
            ctx = seq_lens.index_select(0, sel).long()
            s.masked_fill_(torch.arange(nbk * bs, device=device)[None, None, :] >= ctx[:, None, None], float("-inf"))
        p = torch.softmax(s, dim=-1)
        out.index_copy_(0, sel, torch.bmm(p, latent).to(out.dtype))
    return out
