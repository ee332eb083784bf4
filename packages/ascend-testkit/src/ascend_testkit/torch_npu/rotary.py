"""_npu_rotary_embedding (ATB RopeOperation as torch_npu exposes it): query and key rotated in place.

The form vllm-ascend calls: query/key `[tokens, heads * head_size]` (or `[tokens, heads, head_size]`), contiguous,
the whole head rotated (the cache's last dim is head_size: `cos | sin` halves), neox (halves) or GPT-J (interleaved)
pairing, and the cache in the query's dtype.
"""

from __future__ import annotations

import torch

from ascend_testkit.torch_npu.attention.refusals import refuse, require_contiguous, require_dtype

_OP = "_npu_rotary_embedding"


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, is_neox: bool) -> None:
    heads = x.view(x.shape[0], -1, head_size)
    if is_neox:
        a, b = heads[..., : head_size // 2], heads[..., head_size // 2:]
    else:
        a, b = heads[..., 0::2], heads[..., 1::2]
    fa, fb = a.float(), b.float()
    new_a, new_b = fa * cos - fb * sin, fb * cos + fa * sin
    a.copy_(new_a)
    b.copy_(new_b)


def _npu_rotary_embedding(*, positions, query, key, head_size, cos_sin_cache, is_neox_style):
    require_dtype(_OP, "positions", positions, (torch.int32, torch.int64))
    if positions.dim() != 1:
        refuse(_OP, f"positions must be 1-D [tokens], got shape {tuple(positions.shape)}")
    t = positions.shape[0]
    for name, x in (("query", query), ("key", key)):
        require_contiguous(_OP, name, x)
        require_dtype(_OP, name, x, (torch.float16, torch.bfloat16, torch.float32))
        if x.dim() not in (2, 3) or x.shape[0] != t or x[0].numel() % head_size:
            refuse(_OP, f"{name} must be [tokens={t}, heads * head_size={head_size}] (or 3-D), got {tuple(x.shape)}")
    if head_size % 2:
        refuse(_OP, f"head_size must be even, got {head_size}")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_size:
        refuse(_OP, f"cos_sin_cache must be [max_positions, head_size={head_size}] (the whole head rotates), "
               f"got {tuple(cos_sin_cache.shape)}")
    if cos_sin_cache.dtype != query.dtype:
        refuse(_OP, f"cos_sin_cache dtype must be the query's ({query.dtype}), got {cos_sin_cache.dtype}")
    if t == 0:
        return None
    if int(positions.max()) >= cos_sin_cache.shape[0] or int(positions.min()) < 0:
        refuse(_OP, f"positions must lie in [0, {cos_sin_cache.shape[0]}), got [{int(positions.min())}, "
               f"{int(positions.max())}]")
    cos, sin = cos_sin_cache.index_select(0, positions.long()).float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    _rotate(query, cos, sin, head_size, is_neox_style)
    _rotate(key, cos, sin, head_size, is_neox_style)
    return None
