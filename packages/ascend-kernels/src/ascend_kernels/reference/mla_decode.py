"""MLA decode attention (reference), vectorised over requests: each chunk of requests gathers its latent | rope rows
once (one gather where the two caches are packed per token), then one score matmul, one float32 softmax and one
output matmul."""

from __future__ import annotations

import torch

from ascend_kernels.reference.attention import _chunks, _gather_blocks

# The MLA decode's chunks (its own measurements, at the former shared 8 MiB).
MLA_CHUNK_BYTES = 8 << 20


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


def mla_decode_attention(
    q_nope_absorbed, q_rope, latent_cache, rope_cache, block_table, seq_lens, *, scale, out=None, seq_lens_host=None
):
    b, h, r = q_nope_absorbed.shape
    bs = latent_cache.shape[1]
    if out is None:
        out = q_nope_absorbed.new_zeros(b, h, r)
    if b == 0:
        return out
    lens = seq_lens_host if seq_lens_host is not None else seq_lens.tolist()
    ctx_blocks = [-(-n // bs) for n in lens]
    per_block = bs * (r + rope_cache.shape[3]) * latent_cache.element_size()
    device = q_nope_absorbed.device
    table = block_table.long().clamp_(0, latent_cache.shape[0] - 1)
    packed = _packed_mla(latent_cache, rope_cache)
    # One query row per head over [latent | rope]: a single score matmul against the packed rows.
    q_all = torch.cat([q_nope_absorbed, q_rope], dim=-1).float() if packed is not None else None
    for idx in _chunks([1] * b, ctx_blocks, per_block, MLA_CHUNK_BYTES):
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
