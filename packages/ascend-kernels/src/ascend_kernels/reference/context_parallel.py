"""Context-parallel attention pieces (reference): attention that also returns its log-sum-exp, the log-sum-exp
merge of partial results, and the selection of each row's keys from an all-gathered K|V.

Under prefill context parallelism a rank's query chunk attends to keys from two places, the KV cached before this
step (paged) and this step's keys all-gathered from every rank (contiguous rows); each part is attended separately,
keeping every query row's log-sum-exp, and the parts are merged: out = sum_j exp(lse_j - lse) * out_j with
lse = log sum_j exp(lse_j). On the CPU each part runs torch's fused flash attention, which returns the log-sum-exp
itself; a chunk that continues a context is split the same way (keys before the chunk, all visible; the chunk's own
keys, causal) and merged, so no [queries, keys] mask is ever built. The paged part on float32 / bf16 / f16 host
tensors runs the tiled native loop instead, which keeps each row's log-sum-exp (`native_attention.paged_tiled`),
where every request has at least as many keys as queries.
"""

from __future__ import annotations

import itertools

import torch

from ascend_kernels.reference import native_attention


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 inputs (the float64 tests hold the ops to 1e-12)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _heads_major(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[n, kv_heads, d] -> [1, heads, n, d], each KV head repeated for the query heads that read it."""
    n, hkv, d = x.shape
    if hkv != heads:
        x = x[:, :, None, :].expand(n, hkv, heads // hkv, d).reshape(n, heads, d)
    return x.transpose(0, 1).unsqueeze(0)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool):
    """One block of attention with its log-sum-exp: q `[m, h, d]`, k/v `[n, hkv, d]`; causal is top-left (m == n).

    Returns out `[m, h, dv]` (q's dtype) and lse `[m, h]`.
    """
    m, h, _ = q.shape
    qh, kh, vh = q.transpose(0, 1).unsqueeze(0), _heads_major(k, h), _heads_major(v, h)
    if q.device.type == "cpu" and k.shape[2] == v.shape[2]:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qh, kh, vh, 0.0, causal, attn_mask=None, scale=scale)
    else:
        s = torch.matmul(qh.to(lse_dtype(q.dtype)), kh.to(lse_dtype(q.dtype)).transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(torch.ones(m, k.shape[0], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        out = torch.matmul(torch.exp(s - lse[..., None]).nan_to_num(0.0), vh.to(s.dtype))
    return out[0].transpose(0, 1).to(q.dtype), lse[0].transpose(0, 1).to(lse_dtype(q.dtype))


def merge_attention_states(outputs, lses, *, out=None):
    dtype = outputs[0].dtype
    acc = lse_dtype(dtype)
    stacked = torch.stack([lse.to(acc) for lse in lses])  # [S, T, H]
    total = torch.logsumexp(stacked, dim=0)
    # A row no part saw a key in has lse -inf everywhere: its weights are NaN, and its output stays 0.
    weights = torch.exp(stacked - total.unsqueeze(0)).nan_to_num(0.0)
    merged = sum(w.unsqueeze(-1) * o.to(acc) for w, o in zip(weights, outputs, strict=True))
    if out is None:
        return merged.to(dtype), total
    out.copy_(merged)
    return out, total


def _rows_attention(q, k, v, qs, ks, scale, causal, out, lse):
    """Row r's queries q[qs[r]:qs[r+1]] over keys k[ks[r]:ks[r+1]], bottom-right causal: into out and lse."""
    for r in range(len(qs) - 1):
        m, n = qs[r + 1] - qs[r], ks[r + 1] - ks[r]
        if m == 0 or n == 0:
            continue
        qr, kr, vr = q[qs[r]:qs[r + 1]], k[ks[r]:ks[r + 1]], v[ks[r]:ks[r + 1]]
        if not causal:
            o, s = _attend(qr, kr, vr, scale, False)
        elif n == m:
            o, s = _attend(qr, kr, vr, scale, True)
        else:
            # A chunk continuing a context: keys before it are all visible, its own keys causally.
            before = _attend(qr, kr[: n - m], vr[: n - m], scale, False)
            own = _attend(qr, kr[n - m:], vr[n - m:], scale, True)
            o, s = merge_attention_states([before[0], own[0]], [before[1], own[1]])
        out[qs[r]:qs[r + 1]] = o
        lse[qs[r]:qs[r + 1]] = s


def attention_with_lse(q, k, v, query_start_loc, kv_start_loc, *, scale, causal=True, out=None,
                       query_start_loc_host=None, kv_start_loc_host=None):
    t, h, _ = q.shape
    if out is None:
        out = q.new_zeros(t, h, v.shape[2])
    else:
        out.zero_()
    lse = torch.full((t, h), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
    # host-side schedule: the caller's host lists when given, else read back (the reference backend may sync)
    qs = query_start_loc_host if query_start_loc_host is not None else query_start_loc.tolist()
    ks = kv_start_loc_host if kv_start_loc_host is not None else kv_start_loc.tolist()
    _rows_attention(q, k, v, qs, ks, scale, causal, out, lse)
    return out, lse


def _paged_rows(cache: torch.Tensor, block_table: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Each row's first `lens[r]` cached tokens, rows one after the other: `[sum(lens), heads, dim]`."""
    bs = cache.shape[1]
    device = block_table.device
    lens = lens.long()
    row = torch.repeat_interleave(torch.arange(lens.shape[0], device=device), lens)
    pos = torch.arange(int(lens.sum()), device=device) - (torch.cumsum(lens, 0) - lens).repeat_interleave(lens)
    blocks = block_table.long()[row, torch.div(pos, bs, rounding_mode="floor")]
    return cache[blocks, pos % bs]


def _native_paged_with_lse(query, key_cache, value_cache, block_table, query_start_loc, seq_lens, scale, causal, out,
                           query_start_loc_host, seq_lens_host):
    """The tiled native loop's result (out, lse), or None when it does not take the call: it needs every request with
    queries to have at least as many keys (a rank's chunk with fewer cached keys than queries keeps the torch
    formulation, which skips or splits those)."""
    if query.dtype == torch.float64 or query.device.type != "cpu":
        return None
    starts = query_start_loc_host if query_start_loc_host is not None else query_start_loc.tolist()
    lens = seq_lens_host if seq_lens_host is not None else seq_lens.tolist()
    if any(n < starts[r + 1] - starts[r] for r, n in enumerate(lens[:len(starts) - 1])):
        return None
    t, h, _ = query.shape
    result = query.new_zeros(t, h, value_cache.shape[3]) if out is None else out.zero_()
    lse = torch.full((t, h), float("-inf"), dtype=torch.float32)
    if not native_attention.paged_tiled(query, key_cache, value_cache, block_table, list(starts), list(lens), scale,
                                        causal, None, None, result, lse):
        return None
    return result, lse


def paged_attention_with_lse(query, key_cache, value_cache, block_table, query_start_loc, seq_lens, *, scale,
                             causal=True, out=None, query_start_loc_host=None, seq_lens_host=None):
    native = _native_paged_with_lse(query, key_cache, value_cache, block_table, query_start_loc, seq_lens, scale,
                                    causal, out, query_start_loc_host, seq_lens_host)
    if native is not None:
        return native
    lens = seq_lens.long()
    starts = torch.zeros(lens.shape[0] + 1, dtype=torch.long, device=lens.device)
    torch.cumsum(lens, 0, out=starts[1:])
    k = _paged_rows(key_cache, block_table, lens)
    v = _paged_rows(value_cache, block_table, lens)
    starts_host = None if seq_lens_host is None else [0, *itertools.accumulate(seq_lens_host)]
    return attention_with_lse(query, k, v, query_start_loc, starts, scale=scale, causal=causal, out=out,
                              query_start_loc_host=query_start_loc_host, kv_start_loc_host=starts_host)


def gather_kv_rows(packed_kv, index, *, key_size):
    rows = packed_kv.index_select(0, index.long())
    return rows[..., :key_size], rows[..., key_size:]
