"""Per-token layer ops (reference): rotary embedding, RMSNorm with fused residual add, SiLU-and-mul.

Arithmetic in float32, results in the input dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rotate_in_place(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, rotary_dim: int, is_neox):
    heads = x if x.dim() == 3 else x.unflatten(-1, (-1, head_size))  # a view: writes land in x
    rot = heads[..., :rotary_dim]
    if is_neox:
        half = rotary_dim // 2
        x1, x2 = rot[..., :half], rot[..., half:]
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    a, b = x1.float(), x2.float()
    new1 = a * cos - b * sin
    new2 = b * cos + a * sin
    x1.copy_(new1)
    x2.copy_(new2)


def rotary_embedding(positions, query, key, cos_sin_cache, *, head_size, rotary_dim, is_neox):
    if positions.shape[0] == 0:
        return query, key
    cos, sin = cos_sin_cache.index_select(0, positions.long()).float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    _rotate_in_place(query, cos, sin, head_size, rotary_dim, is_neox)
    if key is not None:
        _rotate_in_place(key, cos, sin, head_size, rotary_dim, is_neox)
    return query, key


def rms_norm(x, weight, eps, residual=None):
    h = x.float()
    if residual is not None:
        h = h + residual.float()
    out = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    out = out.to(x.dtype)
    if residual is None:
        return out
    return out, h.to(residual.dtype)


def silu_and_mul(x):
    d = x.shape[-1] // 2
    return (F.silu(x[..., :d].float()) * x[..., d:].float()).to(x.dtype)
