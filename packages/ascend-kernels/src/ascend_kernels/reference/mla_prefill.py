"""MLA prefill (reference): gather each request's latent context from the paged cache, and ragged causal attention
of up-projected queries/keys where the rotary key part is shared by every head.

The gather is one vectorised index over (block, row) pairs through the caches' own strides. The attention runs one
request at a time (prefills are few per step and long), each through torch's fused scaled_dot_product_attention
with the bottom-right causal mask of a chunk that continues a context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _token_index(block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int, total: int | None = None):
    """(block, row) of every context token of every request, requests one after the other (`total`: their sum, when
    the caller knows it on the host)."""
    device = block_table.device
    lens = seq_lens.long()
    if total is None:
        total = int(lens.sum())
    req = torch.repeat_interleave(torch.arange(lens.shape[0], device=device), lens, output_size=total)
    starts = torch.cumsum(lens, 0) - lens
    pos = torch.arange(total, device=device) - starts.repeat_interleave(lens, output_size=total)
    blocks = block_table.long()[req, torch.div(pos, block_size, rounding_mode="floor")]
    return blocks, pos % block_size


def gather_mla_cache(latent_cache, rope_cache, block_table, seq_lens, *, seq_lens_host=None):
    total = None if seq_lens_host is None else sum(seq_lens_host)
    blocks, rows = _token_index(block_table, seq_lens, latent_cache.shape[1], total)
    return latent_cache[blocks, rows, 0], rope_cache[blocks, rows, 0]


def _causal_from_bottom_right(m: int, n: int, device: torch.device) -> torch.Tensor:
    """`[m, n]` bool: query i (at position n - m + i) sees key j <= n - m + i."""
    return torch.arange(n, device=device)[None, :] <= (n - m + torch.arange(m, device=device))[:, None]


def mla_prefill_attention(q, k_nope, k_rope, v, query_start_loc, kv_start_loc, *, scale, out=None,
                          query_start_loc_host=None, kv_start_loc_host=None):
    t, h, _ = q.shape
    dn = k_nope.shape[2]
    dv = v.shape[2]
    if out is None:
        out = q.new_zeros(t, h, dv)
    # host-side schedule: the caller's host lists when given, else read back (the reference backend may sync)
    qs = query_start_loc_host if query_start_loc_host is not None else query_start_loc.tolist()
    ks = kv_start_loc_host if kv_start_loc_host is not None else kv_start_loc.tolist()
    if qs[-1] < t:
        out[qs[-1]:].zero_()
    k_rope = k_rope.reshape(k_rope.shape[0], -1)
    for r in range(len(qs) - 1):
        m, n = qs[r + 1] - qs[r], ks[r + 1] - ks[r]
        if m == 0:
            continue
        k = torch.empty(n, h, dn + k_rope.shape[1], dtype=q.dtype, device=q.device)
        k[:, :, :dn] = k_nope[ks[r]:ks[r + 1]]
        k[:, :, dn:] = k_rope[ks[r]:ks[r + 1], None, :]
        qr = q[qs[r]:qs[r + 1]].transpose(0, 1)  # [h, m, d]
        kr, vr = k.transpose(0, 1), v[ks[r]:ks[r + 1]].transpose(0, 1)
        if m == n:
            o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True, scale=scale)
        else:
            mask = _causal_from_bottom_right(m, n, q.device)
            o = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, scale=scale)
        out[qs[r]:qs[r + 1]] = o.transpose(0, 1).to(out.dtype)
    return out
