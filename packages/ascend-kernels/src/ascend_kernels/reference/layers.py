"""Per-token layer ops (reference): rotary embedding, RMSNorm with fused residual add, SiLU-and-mul.

Arithmetic in float32, results in the input dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ascend_kernels.reference import native_layers


def _rotate_in_place(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, rotary_dim: int,
                     is_neox: bool) -> None:
    """Rotate each pair (x1, x2) of every head of x by the angle at its token: x1' = x1 cos - x2 sin, x2' = x2 cos +
    x1 sin; cos, sin float32 `[tokens, 1, rotary_dim // 2]`.

    On the two halves as views (neox: the first and second half, GPT-J: even and odd dims) with one half-size
    temporary: a swapped copy of the whole rotary part (flip or roll) cost more than the rotation itself.
    """
    heads = x if x.dim() == 3 else x.unflatten(-1, (-1, head_size))  # a view: writes land in x
    rot = heads if rotary_dim == head_size else heads[..., :rotary_dim]
    # float32 arithmetic (float64 kept), one rounding into a reduced-precision x's dtype
    work = rot if rot.dtype in (torch.float32, torch.float64) else rot.float()
    half = rotary_dim // 2
    x1, x2 = (work[..., :half], work[..., half:]) if is_neox else (work[..., 0::2], work[..., 1::2])
    x1_sin = x1 * sin
    x1.mul_(cos).addcmul_(x2, sin, value=-1.0)
    x2.mul_(cos).add_(x1_sin)
    if work is not rot:
        rot.copy_(work)


def _row_width(x: torch.Tensor, head_size: int) -> int | None:
    """Elements per token of `x` (`[tokens, heads * head]` or `[tokens, heads, head]`) when each token's are one
    contiguous run, else None."""
    if x.dim() == 2 and x.stride(1) == 1:
        return x.shape[1]
    if x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2] == head_size:
        return x.shape[1] * head_size
    return None


def _query_and_key(query: torch.Tensor, key: torch.Tensor | None, head_size: int) -> torch.Tensor | None:
    """One `[tokens, (q_heads + k_heads) * head]` view over query and key when each token's key directly follows
    its query in one buffer (a fused QKV projection's output split into views, as vLLM's attention layers pass
    them), else None: both are then rotated by one string of ops instead of two, which is what a small batch pays
    for (4 decode tokens, 2 + 2 heads of 32: 42-45 vs 32-35 us)."""
    if torch.compiler.is_compiling():  # a compiled graph fuses the two passes anyway; Dynamo cannot read storages
        return None
    if key is None or key.dtype != query.dtype or key.device != query.device or key.shape[0] != query.shape[0]:
        return None
    wq, wk = _row_width(query, head_size), _row_width(key, head_size)
    if wq is None or wk is None or query.stride(0) != key.stride(0) or query.stride(0) < wq + wk:
        return None
    if key.untyped_storage().data_ptr() != query.untyped_storage().data_ptr():
        return None
    if key.storage_offset() != query.storage_offset() + wq:
        return None
    return query.as_strided((query.shape[0], wq + wk), (query.stride(0), 1), query.storage_offset())


def rotary_embedding(positions, query, key, cos_sin_cache, *, head_size, rotary_dim, is_neox):
    if positions.shape[0] == 0:
        return query, key
    if native_layers.rotary_embedding(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox):
        return query, key
    rows = cos_sin_cache.index_select(0, positions.long())  # [tokens, rotary_dim]: cos half, then sin half
    if rows.dtype != torch.float32:
        rows = rows.float()
    cos, sin = rows[:, None, : rotary_dim // 2], rows[:, None, rotary_dim // 2 :]  # broadcast over heads
    both = _query_and_key(query, key, head_size)
    if both is not None:
        _rotate_in_place(both, cos, sin, head_size, rotary_dim, is_neox)
        return query, key
    _rotate_in_place(query, cos, sin, head_size, rotary_dim, is_neox)
    if key is not None:
        _rotate_in_place(key, cos, sin, head_size, rotary_dim, is_neox)
    return query, key


def rms_norm(x, weight, eps, residual=None):
    """Few full passes over the rows (each is an OpenMP region, and these rows are small): the mean square from one
    norm reduction, then the scaling and the weight as two multiplies, in place on a float32 copy where there is one.

    Reduced precision is brought to float32 by one plain conversion: torch's mixed-dtype elementwise ops (a bfloat16
    tensor times a float32 one, or written into a bfloat16 output) run ~2x slower than the conversion plus the
    float32 op (64 x 4,096 bfloat16, 1-2 threads: 105-130 vs 122-163 us).
    """
    native = native_layers.rms_norm(x, weight, eps, residual)
    if native is not None:
        return native
    h = x.float()  # x itself when float32
    if residual is not None:
        h = h.add_(residual) if h is not x else h + residual  # float32: a reduced-precision residual is exact
    norm = torch.linalg.vector_norm(h, dim=-1, keepdim=True)
    inv = norm.mul_(norm).mul_(1.0 / h.shape[-1]).add_(eps).rsqrt_()
    # h is returned (residual), or is the caller's x: scale a copy; else h is our float32 copy, scaled in place
    scaled = torch.mul(h, inv) if residual is not None or h is x else h.mul_(inv)
    out = scaled.mul_(weight)
    if out.dtype != x.dtype:
        out = out.to(x.dtype)
    if residual is None:
        return out
    return out, h.to(residual.dtype)


def silu_and_mul(x):
    native = native_layers.silu_and_mul(x)
    if native is not None:
        return native
    d = x.shape[-1] // 2
    return (F.silu(x[..., :d].float()) * x[..., d:].float()).to(x.dtype)
