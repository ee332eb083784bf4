"""Argument checks of the MLA prefill and sparse-attention ops (metadata only, as `ascend_kernels.validation`)."""

from __future__ import annotations

import torch

from ascend_kernels.validation import fail, floating, index, number, same_device, same_dtype, start_offsets, tensor


def _mla_cache(op: str, name: str, t: object, like: torch.Tensor | None, last: int | None) -> None:
    dims = f"[num_blocks, block_size, 1, {last if last is not None else 'dim'}]"
    tensor(op, name, t, 4, dims)
    if t.shape[2] != 1 or (last is not None and t.shape[3] != last):
        fail(op, name, t, dims)
    if like is not None:
        if t.shape[:2] != like.shape[:2]:
            fail(op, name, t, f"[{like.shape[0]}, {like.shape[1]}, 1, dim] (the latent cache's blocks)")
        same_dtype(op, name, t, like.dtype, dims)
        same_device(op, name, t, like.device, dims)


def _requests(op: str, block_table, seq_lens, dev: torch.device) -> None:
    index(op, "block_table", block_table, 2, "[num_reqs, max_blocks_per_req]")
    same_device(op, "block_table", block_table, dev, "[num_reqs, max_blocks_per_req]")
    r = block_table.shape[0]
    index(op, "seq_lens", seq_lens, 1, f"[{r}]")
    if seq_lens.shape[0] != r:
        fail(op, "seq_lens", seq_lens, f"[{r}] (num_reqs) of dtype int32 or int64")
    same_device(op, "seq_lens", seq_lens, dev, f"[{r}]")


def check_gather_mla_cache(latent_cache, rope_cache, block_table, seq_lens) -> None:
    op = "gather_mla_cache"
    _mla_cache(op, "latent_cache", latent_cache, None, None)
    _mla_cache(op, "rope_cache", rope_cache, latent_cache, None)
    _requests(op, block_table, seq_lens, latent_cache.device)


def check_mla_prefill_attention(q, k_nope, k_rope, v, query_start_loc, kv_start_loc, scale, out) -> None:
    op = "mla_prefill_attention"
    tensor(op, "q", q, 3, "[num_tokens, num_heads, qk_nope + rope_dim]")
    floating(op, "q", q, "[num_tokens, num_heads, qk_nope + rope_dim]")
    t, h, dq = q.shape
    dev, dtype = q.device, q.dtype
    tensor(op, "k_nope", k_nope, 3, f"[num_kv, {h}, qk_nope]")
    n, _, dn = k_nope.shape
    if k_nope.shape[1] != h or dn >= dq:
        fail(op, "k_nope", k_nope, f"[num_kv, {h}, qk_nope < {dq}]")
    rope = dq - dn
    if (not isinstance(k_rope, torch.Tensor) or k_rope.shape[0] != n or k_rope.shape[-1] != rope
            or k_rope.dim() not in (2, 3) or (k_rope.dim() == 3 and k_rope.shape[1] != 1)):
        fail(op, "k_rope", k_rope, f"[{n}, {rope}] or [{n}, 1, {rope}]")
    tensor(op, "v", v, 3, f"[{n}, {h}, v_head_dim]")
    if v.shape[:2] != (n, h):
        fail(op, "v", v, f"[{n}, {h}, v_head_dim]")
    for name, x in (("k_nope", k_nope), ("k_rope", k_rope), ("v", v)):
        same_dtype(op, name, x, dtype, "a tensor")
        same_device(op, name, x, dev, "a tensor")
    start_offsets(op, "query_start_loc", query_start_loc, None, dev, what="num_reqs")
    start_offsets(op, "kv_start_loc", kv_start_loc, query_start_loc.shape[0] - 1, dev, what="num_reqs")
    number(op, "scale", scale, "a positive real number", positive=True)
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != (t, h, v.shape[2])
                            or out.dtype != dtype):
        fail(op, "out", out, f"[{t}, {h}, {v.shape[2]}] of dtype {dtype}")
