"""NPU binding of `vision_attention` (`ascend_kernels.ops_vision`), over torch_npu 2.13.0's

    npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, ..., SymInt[]? actual_seq_lengths=None,
        SymInt[]? actual_seq_lengths_kv=None, int num_heads=1, float scale=1.0, str input_layout="BSH",
        int num_key_value_heads=0, int sparse_mode=0, ...) -> (Tensor, Tensor)

in the TND layout: the packed sequences' cumulative ends as both the query and the key lengths, no mask, so each
sequence attends to itself only and in full. FIA's TND form without pages takes bfloat16 and head dims 128 or 192
only (torch_npu's docs); vision towers have others (Qwen2.5-VL: 80), so q, k and v are zero-padded up to 128 (or
192): the padded columns add nothing to q.k (the scale is passed, not derived from D) and come out of v as zero
columns, sliced off. Another dtype runs the reference on the device, counted in `npu_usage` with the reason.
"""

from __future__ import annotations

import itertools

import torch

from ascend_kernels import npu_usage
from ascend_kernels.npu_backend import _copy_rows, _host, _npu
from ascend_kernels.reference import vision as _ref

_TND_HEAD_DIMS = (128, 192)


def _padded(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.contiguous() if x.shape[-1] == dim else torch.nn.functional.pad(x, (0, dim - x.shape[-1]))


def vision_attention(q, k, v, cu_seqlens, *, scale, out=None, cu_seqlens_host=None):
    t, h, dv = q.shape[0], q.shape[1], v.shape[2]
    if q.dtype != torch.bfloat16:
        npu_usage.record_fallback("vision_attention", f"{q.dtype}: FIA's TND form without pages takes bfloat16 only")
        return _ref.vision_attention(q, k, v, cu_seqlens, scale=scale, out=out, cu_seqlens_host=cu_seqlens_host)
    width = max(q.shape[2], dv)
    if width > _TND_HEAD_DIMS[-1]:
        npu_usage.record_fallback("vision_attention", f"head dim {width}: FIA's TND form takes at most 192")
        return _ref.vision_attention(q, k, v, cu_seqlens, scale=scale, out=out, cu_seqlens_host=cu_seqlens_host)
    dim = next(d for d in _TND_HEAD_DIMS if d >= width)
    starts = _host(cu_seqlens_host, cu_seqlens)
    # TND's lengths are cumulative ends, strictly increasing: an empty sequence (a repeated offset) is dropped.
    ends = [hi for lo, hi in itertools.pairwise(starts) if hi > lo]
    if not ends:
        return _copy_rows(None, 0, t, h, dv, out, q)
    first, last = starts[0], ends[-1]
    result, _ = _npu().npu_fused_infer_attention_score(
        _padded(q[first:last], dim), _padded(k[first:last], dim), _padded(v[first:last], dim), num_heads=h,
        num_key_value_heads=k.shape[1], input_layout="TND", scale=scale,
        actual_seq_lengths=[e - first for e in ends], actual_seq_lengths_kv=[e - first for e in ends])
    if out is None:
        out = q.new_zeros(t, h, dv)
    else:
        out[:first].zero_()
        out[last:].zero_()
    out[first:last].copy_(result[..., :dv])
    return out
