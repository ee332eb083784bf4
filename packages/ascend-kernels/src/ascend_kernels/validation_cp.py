"""Argument checks of the context-parallel ops (metadata only, as `ascend_kernels.validation`)."""

from __future__ import annotations

import torch

from ascend_kernels.validation import (
    check_paged_attention,
    fail,
    floating,
    number,
    same_device,
    start_offsets,
    tensor,
)
from ascend_kernels.validation import (
    index as index_tensor,
)


def _lse_dtype_ok(lse: torch.Tensor) -> bool:
    return lse.dtype in (torch.float32, torch.float64)


def check_merge_attention_states(outputs, lses, out) -> None:
    op = "merge_attention_states"
    if not isinstance(outputs, (list, tuple)) or not outputs:
        fail(op, "outputs", outputs, "a non-empty sequence of [num_tokens, num_heads, head_size] tensors")
    if not isinstance(lses, (list, tuple)) or len(lses) != len(outputs):
        fail(op, "lses", lses, f"a sequence of {len(outputs)} [num_tokens, num_heads] tensors (one per output)")
    first = outputs[0]
    tensor(op, "outputs[0]", first, 3, "[num_tokens, num_heads, head_size]")
    floating(op, "outputs[0]", first, "[num_tokens, num_heads, head_size]")
    t, h, _ = first.shape
    for i, (o, lse) in enumerate(zip(outputs, lses, strict=True)):
        if not isinstance(o, torch.Tensor) or o.shape != first.shape or o.dtype != first.dtype:
            fail(op, f"outputs[{i}]", o, f"{list(first.shape)} of dtype {first.dtype} (as outputs[0])")
        same_device(op, f"outputs[{i}]", o, first.device, "a tensor")
        if not isinstance(lse, torch.Tensor) or lse.shape != (t, h) or not _lse_dtype_ok(lse):
            fail(op, f"lses[{i}]", lse, f"[{t}, {h}] of dtype float32 or float64")
        same_device(op, f"lses[{i}]", lse, first.device, "a tensor")
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != first.shape):
        fail(op, "out", out, f"{list(first.shape)}")


def check_attention_with_lse(q, k, v, query_start_loc, kv_start_loc, scale, out) -> None:
    op = "attention_with_lse"
    tensor(op, "q", q, 3, "[num_tokens, num_heads, head_size]")
    floating(op, "q", q, "[num_tokens, num_heads, head_size]")
    t, h, d = q.shape
    dev, dtype = q.device, q.dtype
    tensor(op, "k", k, 3, f"[num_kv, num_kv_heads dividing {h}, {d}]")
    n, hkv, dk = k.shape
    if dk != d or hkv == 0 or h % hkv:
        fail(op, "k", k, f"[num_kv, num_kv_heads dividing {h}, {d}]")
    tensor(op, "v", v, 3, f"[{n}, {hkv}, head_size_v]")
    if v.shape[:2] != (n, hkv):
        fail(op, "v", v, f"[{n}, {hkv}, head_size_v]")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != dtype:
            fail(op, name, x, f"a tensor of dtype {dtype} (as q)")
        same_device(op, name, x, dev, "a tensor")
    start_offsets(op, "query_start_loc", query_start_loc, None, dev)
    start_offsets(op, "kv_start_loc", kv_start_loc, query_start_loc.shape[0] - 1, dev)
    number(op, "scale", scale, "a positive real number", positive=True)
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != (t, h, v.shape[2])
                            or out.dtype != dtype):
        fail(op, "out", out, f"[{t}, {h}, {v.shape[2]}] of dtype {dtype}")


def check_paged_attention_with_lse(query, key_cache, value_cache, block_table, query_start_loc, seq_lens, scale,
                                   out) -> None:
    check_paged_attention(query, key_cache, value_cache, block_table, query_start_loc, seq_lens, scale, None, None,
                          out)


def check_gather_kv_rows(packed_kv, index, key_size) -> None:
    op = "gather_kv_rows"
    tensor(op, "packed_kv", packed_kv, 3, "[num_gathered, num_kv_heads, key_size + value_size]")
    index_tensor(op, "index", index, 1, "[num_rows]")
    same_device(op, "index", index, packed_kv.device, "[num_rows]")
    if isinstance(key_size, bool) or not isinstance(key_size, int) or not 0 < key_size < packed_kv.shape[2]:
        fail(op, "key_size", key_size, f"an int in (0, {packed_kv.shape[2]})")
