"""Per-token layer ops (reference): rotary embedding, RMSNorm with fused residual add, SiLU-and-mul.

Arithmetic in float32, results in the input dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rotary_rows(cos_sin_cache: torch.Tensor, positions: torch.Tensor, is_neox: bool):
    """(C, S) float32 `[tokens, 1, rotary_dim]` for `positions` such that a head's rotated part is
    `x * C + swap(x) * S`, swap exchanging the two halves (neox) or the two members of each pair (GPT-J).

    Built from the looked-up rows only (a few ops on `[tokens, rotary_dim]`), not cached per cos/sin cache: a table
    kept by the cache's address could outlive it and be found again by a new cache at the same address.
    """
    cos, sin = cos_sin_cache.index_select(0, positions.long()).float().chunk(2, dim=-1)
    if is_neox:
        c, s = torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)
    else:
        c, s = torch.stack([cos, cos], dim=-1).flatten(-2), torch.stack([-sin, sin], dim=-1).flatten(-2)
    return c[:, None], s[:, None]  # broadcast over heads


def _rotate_in_place(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, head_size: int, rotary_dim: int, is_neox):
    heads = x if x.dim() == 3 else x.unflatten(-1, (-1, head_size))  # a view: writes land in x
    rot = heads[..., :rotary_dim]
    if is_neox:
        swapped = rot.unflatten(-1, (2, rotary_dim // 2)).flip(-2).flatten(-2)
    else:
        swapped = rot.unflatten(-1, (rotary_dim // 2, 2)).flip(-1).flatten(-2)
    if rot.dtype == torch.float32:
        rot.mul_(c).addcmul_(swapped, s)  # swapped is a copy: rot may change under it
    else:  # float32 arithmetic, one rounding into x's dtype
        rot.copy_(torch.mul(rot, c).addcmul_(swapped, s))


def rotary_embedding(positions, query, key, cos_sin_cache, *, head_size, rotary_dim, is_neox):
    if positions.shape[0] == 0:
        return query, key
    c, s = _rotary_rows(cos_sin_cache, positions, is_neox)
    _rotate_in_place(query, c, s, head_size, rotary_dim, is_neox)
    if key is not None:
        _rotate_in_place(key, c, s, head_size, rotary_dim, is_neox)
    return query, key


def rms_norm(x, weight, eps, residual=None):
    """Few full passes over the rows (each is an OpenMP region, and these rows are small): the mean square from one
    norm reduction, the scaling and the weight as two multiplies, the last writing the output dtype directly."""
    h = x.float()
    if residual is not None:
        h = h + residual  # float32: a reduced-precision residual is promoted exactly
    norm = torch.linalg.vector_norm(h, dim=-1, keepdim=True)
    inv = norm.square_().div_(h.shape[-1]).add_(eps).rsqrt_()
    scaled = torch.mul(h, inv)
    out = scaled.mul_(weight) if x.dtype == torch.float32 else torch.mul(scaled, weight, out=torch.empty_like(x))
    if residual is None:
        return out
    return out, h.to(residual.dtype)


def silu_and_mul(x):
    d = x.shape[-1] // 2
    return (F.silu(x[..., :d].float()) * x[..., d:].float()).to(x.dtype)
