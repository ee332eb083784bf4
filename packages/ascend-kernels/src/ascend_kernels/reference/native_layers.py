"""The reference's per-token layer ops on the native loops (`native/layers.c`), when the call suits them.

Each function returns None (or False) when it does not take the call, and the torch formulation in
`reference/layers.py` runs instead: no library (`native_build.status()` says why), a device other than the host,
a dtype other than float32 / bfloat16 / float16 (float64 keeps torch's arithmetic), rows that are not contiguous,
autograd recording, or tracing under torch.compile (fake tensors have no data; a graph fuses the torch ops anyway).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ascend_kernels.reference import native_build

DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_INDEX = (torch.int32, torch.int64)


def host_tensors(*tensors: torch.Tensor | None) -> bool:
    """Real host tensors of a dtype the loops read: not fake, meta or functional subclasses, nothing autograd
    would need to record."""
    if torch.compiler.is_compiling():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if type(t) not in _PLAIN or not t.is_cpu or t.dtype not in DTYPE_CODES or (grad and t.requires_grad):
            return False
    return True


def host_index(t: torch.Tensor) -> bool:
    """An int32 / int64 host tensor whose last dimension is contiguous (block tables, lengths, offsets, slots)."""
    return type(t) is torch.Tensor and t.is_cpu and t.dtype in _INDEX and t.stride(-1) == 1


def _done(op: str, rc: int, out_of_range: Callable[[int], str]) -> None:
    """Count a loop's call, or raise what its return code says: 1 + the index of the first out-of-range entry
    (nothing was written), or -1 when a scratch buffer could not be allocated."""
    if rc > 0:
        raise IndexError(f"{op}: {out_of_range(rc - 1)}")
    if rc < 0:
        raise MemoryError(f"{op}: the native loop could not allocate its scratch buffers")
    native_build.record(op)


def _rows(t: torch.Tensor, n: int) -> tuple[int, int] | None:
    """(rows, row stride in elements) of t seen as `[rows, n]` with contiguous rows, else None."""
    if t.shape[-1] != n or (n > 1 and t.stride(-1) != 1):
        return None
    if t.dim() == 1:
        return 1, n
    if t.dim() == 2:
        return t.shape[0], t.stride(0)
    return (t.numel() // n, n) if t.is_contiguous() else None


def _heads(x: torch.Tensor, head_size: int, tokens: int) -> tuple[int, int, int] | None:
    """(token stride, head stride, heads) of `[tokens, heads * head]` or `[tokens, heads, head]` with contiguous
    heads, else None. Shape and strides are read once (each torch accessor is ~0.2 us; this runs twice a layer)."""
    shape, stride = x.shape, x.stride()
    if len(shape) == 2 and shape[0] == tokens and stride[1] == 1 and shape[1] % head_size == 0:
        return stride[0], head_size, shape[1] // head_size
    if len(shape) == 3 and shape[0] == tokens and stride[2] == 1 and shape[2] == head_size:
        return stride[0], stride[1], shape[1]
    return None


def _empty_rows(x: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor of x's shape and dtype (`empty_like` is the cheaper call; it keeps a strided x's
    strides, so only a contiguous x takes it)."""
    return torch.empty_like(x) if x.is_contiguous() else torch.empty(x.shape, dtype=x.dtype)


def rms_norm(x, weight, eps, residual=None):
    """`reference.layers.rms_norm`'s result from one loop, or None when the loops do not take the call."""
    lib = native_build.library()
    if lib is None or x.numel() == 0 or not host_tensors(x, weight, residual):
        return None
    n = x.shape[-1]
    x_rows = _rows(x, n)
    if x_rows is None or weight.dim() != 1 or weight.shape[0] != n or (n > 1 and weight.stride(0) != 1):
        return None
    res_rows = None
    if residual is not None:
        res_rows = _rows(residual, n)  # the loops take one dtype for x and the residual (vLLM's layers pass one)
        if res_rows is None or res_rows[0] != x_rows[0] or residual.dtype != x.dtype:
            return None
    out = _empty_rows(x)
    h = None if residual is None else _empty_rows(x)
    rc = lib.ak_rms_norm(
        x.data_ptr(), x_rows[1], DTYPE_CODES[x.dtype],
        None if residual is None else residual.data_ptr(), 0 if res_rows is None else res_rows[1],
        weight.data_ptr(), DTYPE_CODES[weight.dtype], out.data_ptr(), n,
        None if h is None else h.data_ptr(), n, x_rows[0], n, float(eps), torch.get_num_threads(),
    )
    if rc != 0:
        raise MemoryError(f"rms_norm: the native loop could not allocate its {n}-element float32 weight")
    native_build.record("rms_norm")
    return out if residual is None else (out, h)


def rotary_embedding(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox) -> bool:
    """Rotate query and key in place by one loop; False (nothing written) when the loops do not take the call."""
    lib = native_build.library()
    if lib is None or positions.dim() != 1 or not positions.is_cpu or type(positions) not in _PLAIN:
        return False
    cache_strides = cos_sin_cache.stride()
    if not host_tensors(query, key, cos_sin_cache) or len(cache_strides) != 2 or cache_strides[1] != 1:
        return False
    tokens = positions.shape[0]
    q = _heads(query, head_size, tokens)
    if q is None:
        return False
    k = (0, 0, 0)
    if key is not None:
        k = _heads(key, head_size, tokens)
        if k is None or key.dtype != query.dtype:
            return False
    pos = positions if positions.dtype == torch.int64 and positions.is_contiguous() else positions.long().contiguous()
    rc = lib.ak_rotary(
        pos.data_ptr(), tokens, cos_sin_cache.data_ptr(), DTYPE_CODES[cos_sin_cache.dtype], cache_strides[0],
        cos_sin_cache.shape[0], query.data_ptr(), *q, None if key is None else key.data_ptr(), *k,
        DTYPE_CODES[query.dtype], rotary_dim, int(bool(is_neox)), torch.get_num_threads(),
    )
    _done("rotary_embedding", rc, lambda i: f"positions[{i}] = {int(pos[i])} is outside cos_sin_cache's "
                                            f"{cos_sin_cache.shape[0]} rows")
    return True


def silu_and_mul(x):
    """`reference.layers.silu_and_mul`'s result from one loop, or None when the loops do not take the call."""
    lib = native_build.library()
    if lib is None or x.numel() == 0 or not host_tensors(x):
        return None
    width = x.shape[-1]
    rows = _rows(x, width)
    if rows is None:
        return None
    d = width // 2
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype)
    lib.ak_silu_and_mul(x.data_ptr(), rows[1], DTYPE_CODES[x.dtype], out.data_ptr(), d, rows[0], d,
                        torch.get_num_threads())
    native_build.record("silu_and_mul")
    return out


def _token_heads(t: torch.Tensor) -> bool:
    return t.dim() == 3 and t.stride(2) == 1


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> bool:
    """`reference.cache_write.reshape_and_cache` by one loop; False (nothing written) when the loops do not take
    the call."""
    lib = native_build.library()
    if lib is None or key.shape[0] == 0 or not host_tensors(key, value, key_cache, value_cache):
        return False
    if slot_mapping.dim() != 1 or not host_index(slot_mapping):
        return False
    if key.dtype != value.dtype or key_cache.dtype != value_cache.dtype:
        return False
    if not all(_token_heads(t) for t in (key, value)) or key_cache.stride(3) != 1 or value_cache.stride(3) != 1:
        return False
    num_blocks, block_size, heads, d = key_cache.shape
    rc = lib.ak_cache_write(
        slot_mapping.data_ptr(), int(slot_mapping.dtype == torch.int64), key.shape[0],
        key.data_ptr(), key.stride(0), key.stride(1), value.data_ptr(), value.stride(0), value.stride(1),
        DTYPE_CODES[key.dtype], key_cache.data_ptr(), *key_cache.stride()[:3], value_cache.data_ptr(),
        *value_cache.stride()[:3], DTYPE_CODES[key_cache.dtype], heads, d, value_cache.shape[3], block_size,
        num_blocks, torch.get_num_threads(),
    )
    _done("reshape_and_cache", rc, lambda i: f"slot_mapping[{i}] = {int(slot_mapping[i])} is past the caches' "
                                             f"{num_blocks} x {block_size} slots")
    return True
